//! SigV4-signed HTTP calls for the few AWS APIs `orderctl` needs beyond the
//! workspace's SDK crates: CloudFormation DescribeStacks, Lambda Invoke,
//! CloudWatch Logs FilterLogEvents, and the stack's IAM-authorised admin
//! routes (`execute-api`). Credentials and region come from the same
//! [`SdkConfig`] as the SDK clients (the usual chain), so a profile, SSO or
//! a role works the same for both. The signature is the domain crate's
//! signer ([`order_core::aws::sigv4`]), shared with the test suite.

use crate::error::{CliError, Result};
use aws_config::SdkConfig;
use aws_credential_types::provider::ProvideCredentials;
use order_core::aws::sigv4;
use std::time::Duration;

pub struct Signed {
    http: reqwest::Client,
    sdk: SdkConfig,
    region: String,
}

impl Signed {
    pub fn new(sdk: &SdkConfig) -> Result<Self> {
        let region = sdk.region().map(|r| r.to_string()).ok_or_else(|| {
            CliError::new("no AWS region configured", "set AWS_REGION (or a region in your AWS profile)")
        })?;
        // Reconciliation scans the whole table inside its invocation: the
        // function's own timeout (5 minutes) bounds it, not this client.
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(900))
            .build()
            .map_err(|e| CliError::aws("building the HTTP client", e))?;
        Ok(Self { http, sdk: sdk.clone(), region })
    }

    /// The service's endpoint: `AWS_ENDPOINT_URL` when set (the local
    /// emulator serves every service there), else the regional endpoint.
    pub fn endpoint(&self, service: &str) -> String {
        match self.sdk.endpoint_url() {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => format!("https://{service}.{}.amazonaws.com", self.region),
        }
    }

    /// Signs and sends one request; answers the status and the body text.
    pub async fn send(
        &self,
        service: &str,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<(u16, String)> {
        let (status, _, text) = self.send_full(service, method, url, headers, body).await?;
        Ok((status, text))
    }

    /// As [`Signed::send`], with the response headers.
    pub async fn send_full(
        &self,
        service: &str,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<(u16, reqwest::header::HeaderMap, String)> {
        let provider = self.sdk.credentials_provider().ok_or_else(|| {
            CliError::new("no AWS credentials provider", "configure credentials (env, profile, SSO or role)")
        })?;
        let credentials = provider.provide_credentials().await.map_err(|e| {
            CliError::new(
                format!("no AWS credentials: {}", crate::error::chain(&e)),
                "configure credentials (AWS_PROFILE, `aws sso login`, or AWS_ACCESS_KEY_ID/…); the local stack \
                 takes any",
            )
        })?;
        let request = sigv4::Request { method, url, headers, body: &body };
        let signature =
            sigv4::signing_headers(&credentials, &self.region, service, request, std::time::SystemTime::now())
                .map_err(|e| CliError::aws("signing a request", &*e))?;
        let method: reqwest::Method =
            method.parse().map_err(|_| CliError::new(format!("bad HTTP method {method}"), ""))?;
        let mut req = self.http.request(method, url).body(body);
        for (k, v) in headers.iter().copied().chain(signature.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
            req = req.header(k, v);
        }
        let resp = req.send().await.map_err(|e| {
            CliError::new(
                format!("{service} at {url}: {}", crate::error::chain(&e)),
                "check the network, AWS_ENDPOINT_URL, and for the local stack that it is up (`infra/local.sh status`)",
            )
        })?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.map_err(|e| CliError::aws("reading an answer", e))?;
        Ok((status, headers, text))
    }
}

/// Percent-encodes a form value (everything but RFC 3986's unreserved set).
pub fn form_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn form_values_are_percent_encoded() {
        assert_eq!(super::form_encode("order-expiry"), "order-expiry");
        assert_eq!(super::form_encode("arn:aws:cloudformation:x/y z"), "arn%3Aaws%3Acloudformation%3Ax%2Fy%20z");
    }
}
