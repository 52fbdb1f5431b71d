//! Use cases: one per trigger, generic over the ports. Each is the whole
//! business decision for its trigger; handlers only decode and encode.

pub mod cancel_order;
pub mod channel_events;
pub mod close_order;
pub mod create_order;
pub mod expiring_soon;
pub mod expiry_rules;
pub mod force_check;
pub mod my_orders;
pub mod order_reads;
pub mod payments;
pub mod pending_effects;
pub mod points;
pub mod queries;
pub mod reconcile;
pub mod reconcile_day;
pub mod refunds;
pub mod release_order;
pub mod schedule_wakeup;
pub mod sweep;

use crate::ports::Unavailable;

/// Why a use case did not do what it was asked. The use cases decide
/// *that* a request is refused and say why; the one place that maps this to
/// HTTP ([`crate::error::ApiError`]'s `From`, then
/// [`crate::http::error_response`]) decides the status code.
#[derive(Debug, thiserror::Error)]
pub enum UseCaseError {
    /// The input breaks a rule the caller can fix (400 `invalid_request`).
    #[error("{0}")]
    Invalid(String),
    /// `what` does not exist, or is not the caller's to see (404).
    #[error("{0} does not exist")]
    NotFound(String),
    /// The request is valid but the current state refuses it (409).
    #[error("{code}: {message}")]
    Conflict { code: &'static str, message: String },
    /// The request contradicts the records it names (422).
    #[error("{code}: {message}")]
    Unprocessable { code: &'static str, message: String },
    /// The request ran out of its time before an outside system (the
    /// payment channel) answered: nothing is concluded from the silence, and
    /// the caller is told to retry after `retry_after` (503 + `Retry-After`).
    #[error("{code}: {message}")]
    TryLater { code: &'static str, message: String, retry_after: std::time::Duration },
    /// An outside system did not answer; never shown to clients.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
}

impl UseCaseError {
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::Invalid(message.into())
    }
    pub fn not_found(what: impl std::fmt::Display) -> Self {
        Self::NotFound(what.to_string())
    }
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::Conflict { code, message: message.into() }
    }
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Self::Unprocessable { code, message: message.into() }
    }
    pub fn try_later(code: &'static str, message: impl Into<String>, retry_after: std::time::Duration) -> Self {
        Self::TryLater { code, message: message.into(), retry_after }
    }
    /// The refusal's code, as clients see it.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "invalid_request",
            Self::NotFound(_) => "not_found",
            Self::Conflict { code, .. } | Self::Unprocessable { code, .. } | Self::TryLater { code, .. } => code,
            Self::Unavailable(_) => "internal_error",
        }
    }
}
