//! HTTP API helpers: routing keys, path parameters, headers.

use crate::domain::UserId;
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

/// The largest request body any route takes (a 40-line order is about
/// 3 KB). Larger bodies are refused with 413 before any parsing.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// The largest Stripe event the webhook takes. Stripe sets no documented
/// limit and a PaymentIntent event is a few KB, but one with long metadata
/// or an older API version's embedded charges can pass 16 KiB, and an event
/// refused with 413 would be retried by Stripe for days and never land.
/// The signature is checked over the raw bytes before anything is parsed.
pub const MAX_PROVIDER_EVENT_BYTES: usize = 64 * 1024;

pub fn body_bytes(req: &Request) -> &[u8] {
    req.body().as_ref()
}

/// `Err(413)` when the body is over [`MAX_BODY_BYTES`]: every HTTP entry
/// point checks this first, so an oversized body costs no JSON parsing, no
/// read and no write.
pub fn within_body_limit(req: &Request) -> Result<(), ApiError> {
    within_limit(req, MAX_BODY_BYTES)
}

/// `Err(413)` when the body is over `limit` bytes.
pub fn within_limit(req: &Request, limit: usize) -> Result<(), ApiError> {
    if body_bytes(req).len() > limit {
        return Err(ApiError::too_large(limit));
    }
    Ok(())
}

/// The caller's address as API Gateway saw it (`requestContext.http.sourceIp`):
/// the TCP peer, never a header the caller wrote.
pub fn source_ip(req: &Request) -> Option<&str> {
    match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx.http.source_ip.as_deref(),
        _ => None,
    }
}

/// The buyer behind a request to a buyer route: the subject (`sub`) of the
/// bearer token the API's JWT authorizer verified before the function ran.
/// Never the body: whoever holds a token acts for its subject only.
///
/// Fault drills only (a dev stack with `FAULT_INJECTION=on`, see
/// [`crate::faults`]): a Cognito user whose user name names a fault
/// (`fault-…`) acts as that name, so a drill can pick which orders it hits.
pub fn buyer(req: &Request) -> Result<UserId, ApiError> {
    let claims = match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => {
            ctx.authorizer.as_ref().and_then(|a| a.jwt.as_ref()).map(|j| &j.claims)
        }
        _ => None,
    };
    // API Gateway answers 401 before the function runs when the token is
    // missing or invalid; no claims here means the route has no authorizer.
    let unauthenticated = || {
        ApiError::unauthorized(
            "unauthenticated",
            "this route needs a bearer token (Authorization: Bearer <access token>)",
        )
    };
    let claims = claims.ok_or_else(unauthenticated)?;
    let name = claims.get("username").or_else(|| claims.get("cognito:username"));
    if let Some(drill) = name.filter(|n| crate::faults::active().is_drill_user(n)) {
        return UserId::parse(drill.as_str()).map_err(|e| ApiError::invalid(e.0));
    }
    let sub = claims.get("sub").filter(|s| !s.is_empty()).ok_or_else(unauthenticated)?;
    // A subject that is not a valid id (an external issuer's odd format)
    // is refused rather than mangled into someone else's id.
    UserId::parse(sub.as_str()).map_err(|e| {
        ApiError::unauthorized(
            "unsupported_subject",
            format!("the token's subject is not usable as a user id: {}", e.0),
        )
    })
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
