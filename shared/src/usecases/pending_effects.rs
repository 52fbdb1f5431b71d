//! The effects backstop's consumer (issue 17): one pending effect the sweep
//! handed to the effects queue, run through the same idempotent use cases
//! as the normal path. The message only names the effect; everything is
//! decided from the records as they are now:
//!
//! - an order's effects: release if the order is CLOSED, settle if PAID
//!   ([`drive_effects_until`]); each reservation and the coupon lock move by
//!   their own conditional writes, so a second delivery finds them moved
//!   and adds nothing, and the order leaves the due index's effects shard
//!   once every one of them is settled;
//! - a refund: handed back to the refund worker, which owns its tries,
//!   backoff and give-up, once per retry budget. The budget is pushed by a
//!   write conditional on the refund being REFUND_PENDING and still due,
//!   so a second delivery of the same re-drive queues nothing; a push
//!   whose send failed is undone, so the redelivery sends.
//!
//! A failure is returned: the message comes back after the queue's
//! visibility timeout and, after `maxReceiveCount` receives, lands in the
//! effects queue's DLQ (alarmed). Meanwhile the index entry stays due, so
//! the next sweep hands the effect on again.

use crate::domain::*;
use crate::error::error_chain;
use crate::ports::{Clock, PaymentChannel, PendingEffect, RefundRequests, Unavailable, WakeUpScheduler};
use crate::store::{Cas, OrderStore, PaymentStore};
use crate::usecases::release_order::{drive_effects_until, ResourceReport};
use tracing::{info, instrument, warn};

/// What one delivery did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectDriven {
    /// Release or settle ran; the report says what moved (nothing, for a
    /// duplicate).
    Resources(ResourceReport),
    /// The refund went back to the refund worker.
    RefundRequested,
    /// Nothing to do: the refund is gone, done, or another delivery of
    /// this re-drive queued it already.
    RefundNotDue,
}

/// The ports one effect may need: the store, and for a settle the wake-up
/// scheduler and the channel; for a refund the refund worker's queue.
pub struct EffectPorts<'a, S, W, C, R> {
    pub store: &'a S,
    pub wakeups: &'a W,
    pub channel: &'a C,
    pub refunds: &'a R,
    pub clock: &'a dyn Clock,
}

#[instrument(skip_all, fields(order_id = %effect.order_id(), trigger = "sweep"))]
pub async fn drive_pending_effect<S, W, C, R>(
    ports: &EffectPorts<'_, S, W, C, R>,
    effect: &PendingEffect,
    until: Option<std::time::Instant>,
) -> Result<EffectDriven, Unavailable>
where
    S: OrderStore + PaymentStore,
    W: WakeUpScheduler,
    C: PaymentChannel,
    R: RefundRequests,
{
    match effect {
        PendingEffect::Order(order_id) => {
            drive_effects_until(ports.store, ports.wakeups, ports.channel, ports.clock, order_id, until)
                .await
                .map(EffectDriven::Resources)
        }
        PendingEffect::Refund(order_id, payment_id) => {
            redrive_refund(ports.store, ports.refunds, ports.clock, order_id, payment_id).await
        }
    }
}

/// A REFUND_PENDING refund past its budget goes back to the refund worker,
/// once per budget. The budget is pushed first, by a write conditional on
/// the refund still being due, so that of two deliveries of the same
/// re-drive only one sends (sending first would queue the refund once per
/// delivery). If the send then fails, the push is undone (conditional on
/// the budget still being the one pushed) before this message fails, so
/// that its redelivery finds the refund due and sends it; without the undo
/// the redelivery found it "not due" and nothing was queued until the
/// pushed budget (15 min) had passed.
async fn redrive_refund<S: PaymentStore, R: RefundRequests>(
    store: &S,
    refunds: &R,
    clock: &dyn Clock,
    order_id: &OrderId,
    payment_id: &PaymentId,
) -> Result<EffectDriven, Unavailable> {
    let Some(refund) = store.refund(order_id, payment_id).await? else {
        info!(%payment_id, outcome = "refund_missing", "re-driven refund does not exist; nothing to do");
        return Ok(EffectDriven::RefundNotDue);
    };
    let now = clock.now();
    if refund.status != RefundStatus::RefundPending || store.redrive_refund(&refund, now).await? == Cas::Rejected {
        info!(%payment_id, status = refund.status.as_str(), outcome = "refund_not_due", "refund done or already re-driven; nothing to do");
        return Ok(EffectDriven::RefundNotDue);
    }
    if let Err(e) = refunds.request_refund(order_id, payment_id).await {
        match store.undo_refund_redrive(&refund, now).await {
            Ok(undone) => {
                info!(%payment_id, ?undone, "refund request failed; its budget handed back for the redelivery")
            }
            // The message fails either way; the sweep hands the refund on
            // again once the pushed budget has passed.
            Err(undo) => {
                warn!(%payment_id, error = %error_chain(&undo), "refund request failed and its budget stays pushed")
            }
        }
        return Err(e);
    }
    info!(%payment_id, outcome = "refund_requested", "pending refund handed back to the refund worker");
    Ok(EffectDriven::RefundRequested)
}
