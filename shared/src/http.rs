//! The one place where results become HTTP responses.

use crate::error::{ApiError, Kind};
use lambda_http::{Body, Response};
use serde_json::{json, Value};
use tracing::error;

pub fn json_response(status: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::Text(body.to_string()))
        .expect("valid response")
}

/// Refusals carry their code and message; internal errors are logged once,
/// with their cause chain, and the client sees only a generic message.
pub fn error_response(err: &ApiError) -> Response<Body> {
    let mut retry_after = None;
    let (status, message) = match err {
        ApiError::Refused { kind, message, .. } => {
            let status = match kind {
                Kind::BadRequest => 400,
                Kind::Unauthorized => 401,
                Kind::Forbidden => 403,
                Kind::NotFound => 404,
                Kind::Conflict => 409,
                Kind::PayloadTooLarge => 413,
                Kind::Unprocessable => 422,
                Kind::TryLater { retry_after_secs } => {
                    retry_after = Some(retry_after_secs);
                    503
                }
            };
            (status, message.clone())
        }
        ApiError::Internal(cause) => {
            let mut chain = cause.to_string();
            let mut src = std::error::Error::source(cause);
            while let Some(s) = src {
                chain.push_str(": ");
                chain.push_str(&s.to_string());
                src = s.source();
            }
            error!(error = %chain, "internal error");
            (500, "internal error; the request may be retried".to_owned())
        }
    };
    let mut resp = json_response(status, &json!({"error": {"code": err.code(), "message": message}}));
    if let Some(secs) = retry_after {
        resp.headers_mut().insert("retry-after", secs.to_string().parse().expect("digits are a valid header"));
    }
    resp
}

/// `Ok((status, body))` or the error, as a response.
pub fn respond(result: Result<(u16, Value), ApiError>) -> Response<Body> {
    match result {
        Ok((status, body)) => json_response(status, &body),
        Err(e) => error_response(&e),
    }
}
