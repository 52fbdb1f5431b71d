//! HTTP API helpers: routing keys, path parameters, headers.

use lambda_http::request::RequestContext;
use lambda_http::{Request, RequestExt};

/// The route that matched, e.g. `GET /orders/{order_id}`. API Gateway puts
/// it in the request context; when it is missing (some emulators), it is
/// rebuilt from the method and the path shape.
pub fn route_key(req: &Request) -> String {
    if let Some(RequestContext::ApiGatewayV2(ctx)) = req.request_context_ref() {
        if let Some(k) = ctx.route_key.as_deref().filter(|k| *k != "$default") {
            return k.to_owned();
        }
    }
    format!("{} {}", req.method(), req.uri().path())
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
