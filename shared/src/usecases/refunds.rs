//! The refund worker (seed 003 §05): REFUND_PENDING → REFUNDED through the
//! channel with an idempotency key, retried with exponential backoff a
//! bounded number of times, then REFUND_FAILED, the dead-letter queue and an
//! alarm for a person.

use crate::domain::*;
use crate::metrics;
use crate::ports::{Clock, PaymentChannel, RefundResult, Unavailable};
use crate::store::{Cas, PaymentStore, Refund};
use std::time::Duration;
use tracing::{error, info, instrument, warn};

/// Tries before a refund is handed to a person.
pub const MAX_REFUND_TRIES: u32 = 5;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundOutcome {
    Refunded,
    /// Already REFUNDED: nothing to do.
    AlreadyDone,
    NotFound,
    /// Failed this time; try again after the backoff.
    RetryAfter(Duration),
    /// Out of tries: the caller hands the refund to a person (dead-letter
    /// queue) and then records it with [`mark_refund_failed`].
    GiveUp(Box<Refund>),
}

/// The refund's idempotency key at the channel: one per payment, so any
/// number of tries moves the money back once.
pub fn refund_key(payment_id: &PaymentId) -> String {
    format!("refund-{payment_id}")
}

/// Delay before the next try after `failed` failed tries: 10 s, 20 s,
/// 40 s … capped at 15 minutes.
pub fn backoff(failed: u32) -> Duration {
    Duration::from_secs(10u64.saturating_mul(1 << failed.saturating_sub(1).min(10)).min(900))
}

/// One try of one refund. A REFUND_FAILED refund that comes back (an
/// operator redrove it from the dead-letter queue) gets one more try: the
/// channel's idempotency key makes that safe even if an earlier try did
/// reach the channel.
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
    if refund.status == RefundStatus::Refunded {
        return Ok(RefundOutcome::AlreadyDone);
    }
    let answer = channel.refund(payment_id, refund.amount, &refund_key(payment_id)).await;
    let now = clock.now();
    let failure = match answer {
        Ok(RefundResult::Refunded { channel_refund_id }) => {
            // Rejected means another try recorded it first; the channel
            // refunded once either way (same key).
            if store.update_refund(&refund, RefundStatus::Refunded, Some(&channel_refund_id), None, now).await?
                == Cas::Applied
            {
                info!(channel_refund_id = %channel_refund_id, "refunded");
                metrics::count("RefundCompleted", 1);
            }
            return Ok(RefundOutcome::Refunded);
        }
        Ok(RefundResult::Failed(why)) => why,
        Err(e) => e.to_string(),
    };
    if store.update_refund(&refund, refund.status, None, Some(&failure), now).await? == Cas::Rejected {
        // Someone else moved it meanwhile; the next delivery sees how.
        return Ok(RefundOutcome::RetryAfter(backoff(1)));
    }
    let tries = refund.tries + 1;
    if tries >= MAX_REFUND_TRIES || refund.status == RefundStatus::RefundFailed {
        error!(tries, error = %failure, "refund out of automatic tries: needs a person");
        let refund = Refund { tries, last_error: Some(failure), ..refund };
        return Ok(RefundOutcome::GiveUp(Box::new(refund)));
    }
    warn!(tries, error = %failure, "refund try failed; will retry");
    metrics::count("RefundRetry", 1);
    Ok(RefundOutcome::RetryAfter(backoff(tries)))
}

/// Records that a refund was handed to a person. Called after its message
/// reached the dead-letter queue, so a crash in between leaves the refund
/// PENDING (and retried), never FAILED without a dead letter.
pub async fn mark_refund_failed<S: PaymentStore>(
    store: &S,
    clock: &dyn Clock,
    refund: &Refund,
) -> Result<(), Unavailable> {
    if refund.status == RefundStatus::RefundPending
        && store.update_refund(refund, RefundStatus::RefundFailed, None, None, clock.now()).await? == Cas::Applied
    {
        metrics::count("RefundGaveUp", 1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_secs(10));
        assert_eq!(backoff(2), Duration::from_secs(20));
        assert_eq!(backoff(4), Duration::from_secs(80));
        assert_eq!(backoff(30), Duration::from_secs(900));
    }
}
