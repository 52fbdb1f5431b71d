//! The refund worker (seed 003 §05): REFUND_PENDING → REFUNDED through the
//! channel with an idempotency key, retried with exponential backoff a
//! bounded number of times, then REFUND_FAILED, the dead-letter queue and an
//! alarm for a person.

use crate::domain::*;
use crate::metrics;
use crate::ports::{Clock, PaymentChannel, RefundResult, Unavailable};
use crate::store::{Cas, PaymentStore};
use std::time::Duration;
use tracing::{error, info, instrument, warn};

/// Tries before a refund is handed to a person.
pub const MAX_REFUND_TRIES: u32 = 5;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundOutcome {
    Refunded,
    /// Already REFUNDED or REFUND_FAILED: nothing to do.
    AlreadyDone,
    NotFound,
    /// Failed this time; try again after the backoff.
    RetryAfter(Duration),
    /// Out of tries: REFUND_FAILED, alarmed.
    GaveUp,
}

/// The refund's idempotency key at the channel: one per payment, so any
/// number of tries moves the money back once.
pub fn refund_key(payment_id: &PaymentId) -> String {
    format!("refund-{payment_id}")
}

/// 10 s, 20 s, 40 s … capped at 15 minutes (the SQS visibility limit is
/// far higher, but a refund should not wait longer between tries).
pub fn backoff(tries: u32) -> Duration {
    Duration::from_secs(10u64.saturating_mul(1 << tries.min(10)).min(900))
}

#[instrument(skip_all, fields(order_id = %order_id, payment_id = %payment_id))]
pub async fn process_refund<S: PaymentStore, C: PaymentChannel>(
    store: &S,
    channel: &C,
    clock: &dyn Clock,
    order_id: &OrderId,
    payment_id: &PaymentId,
) -> Result<RefundOutcome, Unavailable> {
    let Some(refund) = store.refund(order_id, payment_id).await? else {
        warn!("refund message for a refund that does not exist");
        return Ok(RefundOutcome::NotFound);
    };
    if refund.status != RefundStatus::RefundPending {
        return Ok(RefundOutcome::AlreadyDone);
    }
    let answer = channel.refund(payment_id, refund.amount, &refund_key(payment_id)).await;
    let now = clock.now();
    let failure = match answer {
        Ok(RefundResult::Refunded { channel_refund_id }) => {
            // A lost race with another try is fine: the channel refunded
            // once (same key) and the other try recorded it.
            let cas = store.update_refund(&refund, RefundStatus::Refunded, Some(&channel_refund_id), None, now).await?;
            info!(channel_refund_id = %channel_refund_id, cas = ?cas, "refunded");
            metrics::count("RefundCompleted", 1);
            return Ok(RefundOutcome::Refunded);
        }
        Ok(RefundResult::Failed(why)) => why,
        Err(e) => e.to_string(),
    };
    let tries = refund.tries + 1;
    if tries >= MAX_REFUND_TRIES {
        store.update_refund(&refund, RefundStatus::RefundFailed, None, Some(&failure), now).await?;
        error!(tries, error = %failure, "refund failed for good: needs a person");
        metrics::count("RefundGaveUp", 1);
        return Ok(RefundOutcome::GaveUp);
    }
    if store.update_refund(&refund, RefundStatus::RefundPending, None, Some(&failure), now).await? == Cas::Rejected {
        return Ok(RefundOutcome::AlreadyDone);
    }
    warn!(tries, error = %failure, "refund try failed; will retry");
    metrics::count("RefundRetry", 1);
    Ok(RefundOutcome::RetryAfter(backoff(tries)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_secs(10));
        assert_eq!(backoff(1), Duration::from_secs(20));
        assert_eq!(backoff(3), Duration::from_secs(80));
        assert_eq!(backoff(30), Duration::from_secs(900));
    }
}
