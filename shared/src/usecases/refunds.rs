//! The refund worker (docs/design.md#refunds): REFUND_PENDING → REFUNDED
//! through the channel with an idempotency key, retried with exponential
//! backoff a bounded number of times, then REFUND_FAILED, the dead-letter
//! queue and an alarm for a person.
//!
//! A refund may be driven by several deliveries at once (a redelivered
//! stream record, a duplicate queue message, the backstop's re-drive). The
//! refund record decides between them: every try is counted by a write
//! conditional on the count read, so one try is counted once and only the
//! delivery whose write applied goes on; the channel's idempotency key
//! makes the extra channel calls harmless.

use crate::domain::*;
use crate::error::error_chain;
use crate::metrics;
use crate::ports::{Clock, PaymentChannel, RefundResult, Unavailable};
use crate::store::{Cas, PaymentStore, Refund};
use std::time::Duration;
use tracing::{error, info, instrument, warn};

/// Tries before a refund is handed to a person.
pub const MAX_REFUND_TRIES: u32 = 5;

/// How long a REFUND_PENDING refund may sit before the backstop (the sweep
/// over the due index) sends it to the refund queue again. Longer than the
/// worker's own retry budget (10 + 20 + 40 + 80 s between the five tries),
/// so that a refund whose queue message is alive is never re-driven beside
/// it; reconciliation calls a pending refund older than this stale.
pub const REFUND_REDRIVE_AFTER: Duration = Duration::from_secs(15 * 60);

/// How often recording REFUNDED follows a status that moved under it. The
/// status moves at most twice (PENDING → FAILED, then → REFUNDED), so a
/// third rejection means something outside this model is writing.
const RECORD_REFUNDED_ROUNDS: usize = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundOutcome {
    Refunded,
    /// Already REFUNDED: nothing to do.
    AlreadyDone,
    NotFound,
    /// Failed this time; try again after the backoff.
    RetryAfter(Duration),
    /// The channel accepted the refund and has not finished it: asked
    /// again after this long, without counting a failed try. A refund that
    /// stays pending stays REFUND_PENDING, which the backstop re-drives and
    /// the pending-effects alarm reports.
    ChannelPending(Duration),
    /// Another delivery of the same refund counted this try first (a
    /// duplicate stream record, queue message or re-drive). That delivery
    /// carries the refund on; this one stops without counting, retrying or
    /// writing a dead letter.
    Superseded,
    /// Out of tries, and this delivery's write recorded the give-up
    /// (REFUND_FAILED): the caller hands the refund to a person (dead-letter
    /// queue). Only the one delivery whose write applied sees this.
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

/// How long after a refund the channel called pending it is asked again.
pub const PENDING_FOLLOW_UP: Duration = Duration::from_secs(60);

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
    if let Some(by) = &refund.resolved_by {
        // A person dealt with it (refunded by hand, or found it not owed):
        // its dead letter coming back with a redrive of the queue must not
        // move money a second time.
        info!(resolved_by = %by, "refund resolved by a person; not tried again");
        return Ok(RefundOutcome::AlreadyDone);
    }
    let Some(attempt) = store.attempt(payment_id).await? else {
        return Err(Unavailable::new("refund", format!("the payment attempt {payment_id} of the refund is missing")));
    };
    let failure = match channel.refund(&attempt, refund.amount, &refund_key(payment_id)).await {
        Ok(RefundResult::Refunded { channel_refund_id }) => {
            return record_refunded(store, refund, &channel_refund_id, clock.now()).await;
        }
        Ok(RefundResult::Pending { channel_refund_id }) => {
            info!(channel_refund_id, "refund pending at the channel; asking again later");
            metrics::REFUND_CHANNEL_PENDING.count(1);
            return Ok(RefundOutcome::ChannelPending(PENDING_FOLLOW_UP));
        }
        Ok(RefundResult::Failed(why)) => why,
        // The whole cause chain goes into `last_error`, not just the context.
        Err(e) => error_chain(&e),
    };
    count_failed_try(store, refund, failure, clock.now()).await
}

/// A channel's notice that a refund changed (Stripe's `refund.updated`):
/// asks the channel (the same idempotent call finds the refund made under
/// the key, and never makes a second one) and records REFUNDED if it is.
/// Anything else is left to the refund worker's own tries, so a failure
/// is counted, and handed to a person, in one place only.
#[instrument(skip_all, fields(order_id = %order_id, payment_id = %payment_id))]
pub async fn follow_up_refund<S: PaymentStore, C: PaymentChannel>(
    store: &S,
    channel: &C,
    clock: &dyn Clock,
    order_id: &OrderId,
    payment_id: &PaymentId,
) -> Result<RefundOutcome, Unavailable> {
    let Some(refund) = store.refund(order_id, payment_id).await? else {
        return Ok(RefundOutcome::NotFound);
    };
    if refund.status == RefundStatus::Refunded {
        return Ok(RefundOutcome::AlreadyDone);
    }
    let Some(attempt) = store.attempt(payment_id).await? else {
        return Ok(RefundOutcome::NotFound);
    };
    match channel.refund(&attempt, refund.amount, &refund_key(payment_id)).await? {
        RefundResult::Refunded { channel_refund_id } => {
            record_refunded(store, refund, &channel_refund_id, clock.now()).await
        }
        RefundResult::Pending { .. } => Ok(RefundOutcome::ChannelPending(PENDING_FOLLOW_UP)),
        RefundResult::Failed(_) => Ok(RefundOutcome::Superseded),
    }
}

/// The channel refunded: that is the truth, whatever this delivery read.
/// When the status moved meanwhile (another delivery counted a failure or
/// gave up), REFUNDED is recorded over the status found now; only a
/// REFUNDED found means someone recorded it first.
async fn record_refunded<S: PaymentStore>(
    store: &S,
    mut refund: Refund,
    channel_refund_id: &str,
    now: Timestamp,
) -> Result<RefundOutcome, Unavailable> {
    for _ in 0..RECORD_REFUNDED_ROUNDS {
        if store.update_refund(&refund, RefundStatus::Refunded, Some(channel_refund_id), None, now).await?
            == Cas::Applied
        {
            info!(order_id = %refund.order_id, payment_id = %refund.payment_id, outcome = "refunded", channel_refund_id, from = refund.status.as_str(), "refunded");
            metrics::REFUND_COMPLETED.count(1);
            return Ok(RefundOutcome::Refunded);
        }
        refund = match store.refund(&refund.order_id, &refund.payment_id).await? {
            Some(r) if r.status == RefundStatus::Refunded => return Ok(RefundOutcome::Refunded),
            Some(r) => r,
            None => return Err(Unavailable::new("record refund", "the refund record disappeared")),
        };
    }
    Err(Unavailable::new("record refund", "the refund's status kept changing; the next delivery records it"))
}

/// Counts a failed try with a write conditional on the count read, and
/// gives up in that same write once the budget is spent. A rejected write
/// means another delivery got there first; this one steps aside.
async fn count_failed_try<S: PaymentStore>(
    store: &S,
    refund: Refund,
    failure: String,
    now: Timestamp,
) -> Result<RefundOutcome, Unavailable> {
    let tries = refund.tries + 1;
    let give_up = tries >= MAX_REFUND_TRIES || refund.status == RefundStatus::RefundFailed;
    let to = if give_up { RefundStatus::RefundFailed } else { refund.status };
    if store.update_refund(&refund, to, None, Some(&failure), now).await? == Cas::Rejected {
        info!(tries = refund.tries, "another delivery of this refund counted the try first; stepping aside");
        metrics::REFUND_DUPLICATE_DELIVERY.count(1);
        return Ok(RefundOutcome::Superseded);
    }
    if give_up {
        error!(order_id = %refund.order_id, payment_id = %refund.payment_id, outcome = "gave_up", tries, error = %failure, "refund out of automatic tries: needs a person");
        metrics::REFUND_GAVE_UP.count(1);
        let refund = Refund { tries, status: RefundStatus::RefundFailed, last_error: Some(failure), ..refund };
        return Ok(RefundOutcome::GiveUp(Box::new(refund)));
    }
    warn!(order_id = %refund.order_id, payment_id = %refund.payment_id, outcome = "retry", tries, error = %failure, "refund try failed; will retry");
    metrics::REFUND_RETRY.count(1);
    Ok(RefundOutcome::RetryAfter(backoff(tries)))
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
