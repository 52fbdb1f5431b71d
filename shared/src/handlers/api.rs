//! HTTP API helpers: routing keys, path parameters, headers.

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
