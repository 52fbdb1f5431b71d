//! The errors a caller can see. Every HTTP entry point returns `ApiError`
//! (use cases return [`UseCaseError`], turned into `ApiError` here); the one
//! place that turns it into HTTP is [`crate::http::error_response`].

use crate::ports::Unavailable;
use crate::usecases::UseCaseError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    Conflict,
    PayloadTooLarge,
    Unprocessable,
    /// Out of time waiting for an outside system: 503 with `Retry-After`
    /// (whole seconds).
    TryLater {
        retry_after_secs: u64,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A business refusal: the client can act on `code` and `message`.
    #[error("{code}: {message}")]
    Refused { kind: Kind, code: &'static str, message: String },
    /// Something outside failed; logged with its cause, shown as a generic 500.
    #[error(transparent)]
    Internal(#[from] Unavailable),
}

impl ApiError {
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::Refused { kind: Kind::BadRequest, code: "invalid_request", message: message.into() }
    }
    pub fn not_found(what: impl std::fmt::Display) -> Self {
        Self::Refused { kind: Kind::NotFound, code: "not_found", message: format!("{what} does not exist") }
    }
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::Refused { kind: Kind::Conflict, code, message: message.into() }
    }
    pub fn unauthorized(code: &'static str, message: impl Into<String>) -> Self {
        Self::Refused { kind: Kind::Unauthorized, code, message: message.into() }
    }
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::Refused { kind: Kind::Forbidden, code, message: message.into() }
    }
    pub fn too_large(limit: usize) -> Self {
        Self::Refused {
            kind: Kind::PayloadTooLarge,
            code: "payload_too_large",
            message: format!("the request body is larger than {limit} bytes"),
        }
    }
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Self::Refused { kind: Kind::Unprocessable, code, message: message.into() }
    }
    pub fn try_later(code: &'static str, message: impl Into<String>, retry_after: std::time::Duration) -> Self {
        let retry_after_secs = retry_after.as_secs().max(1);
        Self::Refused { kind: Kind::TryLater { retry_after_secs }, code, message: message.into() }
    }
    pub fn code(&self) -> &'static str {
        match self {
            Self::Refused { code, .. } => code,
            Self::Internal(_) => "internal_error",
        }
    }
}

impl From<UseCaseError> for ApiError {
    fn from(e: UseCaseError) -> Self {
        match e {
            UseCaseError::Invalid(message) => Self::invalid(message),
            UseCaseError::NotFound(what) => Self::not_found(what),
            UseCaseError::Conflict { code, message } => Self::conflict(code, message),
            UseCaseError::Unprocessable { code, message } => Self::unprocessable(code, message),
            UseCaseError::TryLater { code, message, retry_after } => Self::try_later(code, message, retry_after),
            UseCaseError::Unavailable(cause) => Self::Internal(cause),
        }
    }
}

/// A request body that must be a JSON object; the error says which rule it broke.
pub fn json_object(body: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::invalid("body must be a JSON object")),
        Err(e) => Err(ApiError::invalid(format!("body is not valid JSON: {e}"))),
    }
}

/// `error: cause: cause …`: an error with its whole source chain, for logs
/// and for stored fields such as a refund's `last_error`, where the
/// outermost message alone (often "service error") says too little.
///
/// ```
/// let e = order_core::ports::Unavailable::new("read refund", std::io::Error::other("timed out"));
/// assert_eq!(order_core::error::error_chain(&e), "read refund: timed out");
/// ```
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        // Wrappers such as `Unavailable` already print their source.
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
