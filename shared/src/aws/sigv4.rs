//! SigV4 request signing for the few HTTP calls made without an SDK client
//! (`orderctl`'s CloudFormation, Lambda and Logs calls and the stack's
//! IAM-authorised admin routes; the test suite's and `loadcheck`'s calls to
//! the same), so there is one signer and not one per tool. The signing is
//! the `aws-sigv4` crate's, the one the SDK itself signs with; this only
//! turns a request's parts into the headers to add.

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use std::time::SystemTime;

/// Why a request could not be signed (a malformed URL or header).
pub type SigningError = Box<dyn std::error::Error + Send + Sync>;

/// One request to sign: what the signature covers.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    pub url: &'a str,
    /// The headers the request will be sent with (they are signed too).
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

/// The headers (`authorization`, `x-amz-date`, and `x-amz-security-token`
/// for temporary credentials) that sign `request` for `service` in
/// `region` at `time`; send them beside the request's own headers.
pub fn signing_headers(
    credentials: &Credentials,
    region: &str,
    service: &str,
    request: Request<'_>,
    time: SystemTime,
) -> Result<Vec<(String, String)>, SigningError> {
    let identity = credentials.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(time)
        .settings(SigningSettings::default())
        .build()?
        .into();
    let signable = SignableRequest::new(
        request.method,
        request.url,
        request.headers.iter().copied(),
        SignableBody::Bytes(request.body),
    )?;
    let (instructions, _) = sign(signable, &params)?.into_parts();
    Ok(instructions.headers().map(|(k, v)| (k.to_owned(), v.to_owned())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn a_request_is_signed_for_its_service_region_and_day() {
        let creds = Credentials::new("AKIDEXAMPLE", "secret", None, None, "test");
        let req = Request {
            method: "POST",
            url: "http://127.0.0.1:4566/2015-03-31/functions/f/invocations",
            headers: &[("content-type", "application/json")],
            body: b"{}",
        };
        // 2026-11-30T10:00:00Z
        let hs = signing_headers(&creds, "us-east-1", "lambda", req, at(1_796_032_800)).unwrap();
        let get = |k: &str| hs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let auth = get("authorization").expect("an authorization header");
        assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261130/us-east-1/lambda/aws4_request"));
        assert!(auth.contains("SignedHeaders=content-type;host;x-amz-date"), "{auth}");
        assert_eq!(get("x-amz-date"), Some("20261130T100000Z"));
        assert_eq!(get("x-amz-security-token"), None);
        // Deterministic for the same inputs; another body, another signature.
        assert_eq!(signing_headers(&creds, "us-east-1", "lambda", req, at(1_796_032_800)).unwrap(), hs);
        let other = Request { body: b"{\"x\":1}", ..req };
        assert_ne!(signing_headers(&creds, "us-east-1", "lambda", other, at(1_796_032_800)).unwrap(), hs);
    }

    #[test]
    fn temporary_credentials_send_their_session_token() {
        let creds = Credentials::new("ASIA", "secret", Some("session".into()), None, "test");
        let req = Request { method: "GET", url: "https://example.com/admin/orders/x", headers: &[], body: b"" };
        let hs = signing_headers(&creds, "eu-west-1", "execute-api", req, SystemTime::now()).unwrap();
        assert!(hs.contains(&("x-amz-security-token".to_owned(), "session".to_owned())), "{hs:?}");
    }

    #[test]
    fn a_malformed_url_is_an_error_not_a_panic() {
        let creds = Credentials::new("a", "b", None, None, "test");
        let req = Request { method: "GET", url: "not a url", headers: &[], body: b"" };
        assert!(signing_headers(&creds, "us-east-1", "lambda", req, SystemTime::now()).is_err());
    }
}
