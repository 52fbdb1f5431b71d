//! Payment attempts and refunds (docs/design.md#states). The order says
//! how the deal ended; the payment attempt says what the channel did
//! with the money. They are related but never merged.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PaymentStatus {
    /// Started; the channel has not told us the outcome.
    Processing,
    /// The channel could not be asked or did not know (timeout, error).
    /// Never treated as "unpaid".
    Unknown,
    Succeeded,
    Failed,
}

impl PaymentStatus {
    pub const ALL: [Self; 4] = [Self::Processing, Self::Unknown, Self::Succeeded, Self::Failed];

    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "PROCESSING",
            Self::Unknown => "UNKNOWN",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
        }
    }
}

/// How many payment attempts one order may have. Each new attempt closes
/// the previous one at the channel, and the close path asks the channel
/// about every attempt not yet settled, so this bound is what keeps a close
/// (and its lease) short whatever a client does.
pub const MAX_PAYMENT_ATTEMPTS: u32 = 5;

/// Whether a channel fact may be recorded over the local status. A verified
/// success is always recorded — money that moved must never be lost, even
/// if an earlier query found nothing (it then leads to PAID or a refund).
/// Otherwise a settled attempt keeps its outcome.
pub fn may_record(from: PaymentStatus, to: PaymentStatus) -> bool {
    to == PaymentStatus::Succeeded || !from.is_final() || from == to
}

/// The statuses an attempt may be in for `to` to be recorded over it (the
/// store's write condition): every status [`may_record`] allows, except
/// recording a non-success over itself, which would only repeat evidence.
pub fn recordable_from(to: PaymentStatus) -> Vec<PaymentStatus> {
    PaymentStatus::ALL
        .into_iter()
        .filter(|s| may_record(*s, to) && (*s != to || to == PaymentStatus::Succeeded))
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RefundStatus {
    RefundPending,
    Refunded,
    /// Out of automatic retries: on the dead-letter queue, for a person.
    RefundFailed,
}

impl RefundStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RefundPending => "REFUND_PENDING",
            Self::Refunded => "REFUNDED",
            Self::RefundFailed => "REFUND_FAILED",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PaymentStatus::*;

    #[test]
    fn write_conditions_follow_may_record() {
        assert_eq!(recordable_from(Succeeded), vec![Processing, Unknown, Succeeded, Failed]);
        assert_eq!(recordable_from(Failed), vec![Processing, Unknown]);
        assert_eq!(recordable_from(Unknown), vec![Processing]);
    }

    #[test]
    fn settled_attempts_keep_their_outcome_but_a_success_is_always_recorded() {
        for from in [Processing, Unknown, Succeeded, Failed] {
            for to in [Processing, Unknown, Succeeded, Failed] {
                let want = to == Succeeded || matches!(from, Processing | Unknown) || from == to;
                assert_eq!(may_record(from, to), want, "{from:?} -> {to:?}");
            }
        }
    }
}
