//! HTTP API helpers: routing keys, path parameters, headers.

use crate::error::ApiError;
use lambda_http::request::RequestContext;
use lambda_http::{Request, RequestExt};

/// The route that matched, e.g. `GET /orders/{order_id}`, from the request
/// context API Gateway fills in (an empty string when there is none, which
/// no handler matches).
pub fn route_key(req: &Request) -> String {
    match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx.route_key.clone().unwrap_or_default(),
        _ => String::new(),
    }
}

pub fn path_param(req: &Request, name: &str) -> String {
    req.path_parameters().first(name).unwrap_or_default().to_owned()
}

pub fn header<'a>(req: &'a Request, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// The `Idempotency-Key` header: `Ok(None)` when it is missing, an error
/// naming the header when it is there but not visible ASCII (which
/// `header` would report as missing).
pub fn idempotency_key(req: &Request) -> Result<Option<&str>, ApiError> {
    match req.headers().get("idempotency-key") {
        None => Ok(None),
        Some(v) => v.to_str().map(Some).map_err(|_| {
            ApiError::invalid("the Idempotency-Key header must be 1 to 128 ASCII characters of [A-Za-z0-9-_.:]")
        }),
    }
}

pub fn body_bytes(req: &Request) -> &[u8] {
    req.body().as_ref()
}

/// Who called an AWS_IAM route: the caller's IAM ARN from the request
/// context (API Gateway fills it in after verifying the signature), else
/// the access key or account, else a marker that says none was given.
pub fn caller_identity(req: &Request) -> String {
    if let Some(RequestContext::ApiGatewayV2(ctx)) = req.request_context_ref() {
        if let Some(iam) = ctx.authorizer.as_ref().and_then(|a| a.iam.as_ref()) {
            let candidates = [&iam.user_arn, &iam.caller_id, &iam.access_key, &iam.account_id];
            if let Some(who) = candidates.into_iter().flatten().find(|s| !s.is_empty()) {
                return who.clone();
            }
        }
    }
    "unknown (no IAM identity in the request context)".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lambda_http::http::HeaderValue;
    use lambda_http::Body;

    fn with_key(v: Option<HeaderValue>) -> Request {
        let mut b = lambda_http::http::Request::builder();
        if let Some(v) = v {
            b = b.header("Idempotency-Key", v);
        }
        b.body(Body::Empty).unwrap()
    }

    #[test]
    fn a_non_ascii_idempotency_key_is_invalid_not_missing() {
        let bad = with_key(Some(HeaderValue::from_bytes("clé-1".as_bytes()).unwrap()));
        match idempotency_key(&bad) {
            Err(ApiError::Refused { code, message, .. }) => {
                assert_eq!(code, "invalid_request");
                assert!(message.contains("Idempotency-Key"), "{message}");
                assert!(!message.contains("required"), "{message}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(idempotency_key(&with_key(None)).unwrap(), None);
        assert_eq!(idempotency_key(&with_key(Some(HeaderValue::from_static("k-1")))).unwrap(), Some("k-1"));
    }
}
