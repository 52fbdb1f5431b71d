//! Release and settle (docs/design.md#holdings): what happens to the
//! resources an order holds once it is final. Both run from the table stream,
//! so a duplicate or replayed record is normal; idempotency comes from each
//! reservation's and lock's own state, never from counting messages.

use crate::domain::*;
use crate::metrics;
use crate::ports::{Clock, PaymentChannel, Unavailable, WakeUpScheduler};
use crate::store::{Evidence, OrderRecord, OrderStore, PaymentStore};
use crate::usecases::close_order::{channel_verdict, within, Verdict};
use crate::usecases::payments::REFUND_NOTICE;
use std::time::Duration;
use tracing::{error, info, instrument, warn};

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ResourceReport {
    /// Reservations or locks moved by this run.
    pub moved: u32,
    /// Already in the target state: a duplicate delivery.
    pub already: u32,
    /// Refused by the state machine — an invariant breach, alarmed.
    pub refused: u32,
}

/// The states a coupon lock is left in by a release (by whichever rule).
const RELEASED_LOCK_STATES: [&str; 3] = ["AVAILABLE", "EXPIRED", "VOID"];

/// The order closed: every RESERVED reservation goes back to stock, the
/// coupon lock ends AVAILABLE, EXPIRED if the coupon's own validity passed
/// in the meantime, or VOID if the coupon is not returnable by its rule.
#[instrument(skip_all, fields(order_id = %order_id))]
pub async fn release_order<S: OrderStore>(
    store: &S,
    clock: &dyn Clock,
    order_id: &OrderId,
) -> Result<ResourceReport, Unavailable> {
    let mut report = ResourceReport::default();
    let Some(record) = store.order_record(order_id).await? else {
        warn!("release for an order that does not exist");
        return Ok(report);
    };
    if record.order.status != OrderStatus::Closed {
        // The stream filter only delivers transitions into CLOSED; anything
        // else means the record is not what it claims to be. Never release.
        error!(status = record.order.status.as_str(), "release requested for an order that is not CLOSED");
        metrics::RELEASE_REFUSED.count(1);
        report.refused += 1;
        return Ok(report);
    }
    for r in &record.reservations {
        match store.release_reservation(order_id, r, clock.now()).await? {
            Ok(Step::Moved(_)) => {
                report.moved += 1;
                info!(holding = %r.label(), "reservation released, its counter given back");
            }
            Ok(Step::AlreadyThere) => report.already += 1,
            Err(refused) => {
                report.refused += 1;
                error!(holding = %r.label(), %refused, "invariant breach: a CONFIRMED reservation on a CLOSED order was not released");
                metrics::CONFIRMED_RESERVATION_ON_CLOSED_ORDER.count(1);
            }
        }
    }
    if let Some(lock) = &record.coupon_lock {
        let now = clock.now();
        let coupon = store.coupon(&lock.coupon_id).await?;
        let (to, reason) = match coupon {
            // The coupon's own rule wins over its validity: a non-returnable
            // coupon is spent by being locked, whatever became of the order.
            Some(c) if !c.returnable => {
                (CouponLockStatus::Void, "order closed unpaid; the coupon is not returnable by its rule, so it is void")
            }
            Some(c) if c.valid_until > now => (CouponLockStatus::Available, "order closed unpaid; coupon returned"),
            _ => (CouponLockStatus::Expired, "order closed unpaid after the coupon's validity ended"),
        };
        let res = match store.end_coupon_lock(order_id, &lock.coupon_id, to, reason, now).await? {
            // Another release ended the lock already (perhaps by another
            // rule, if the coupon was re-written in between): done, not a
            // breach. Only USED on a CLOSED order is refused for real.
            Err(refused) if RELEASED_LOCK_STATES.contains(&refused.from) => Ok(Step::AlreadyThere),
            other => other,
        };
        tally(&mut report, res, "coupon lock");
    }
    metrics::RESERVATIONS_RELEASED.count(u64::from(report.moved));
    effects_settled(store, order_id, OrderStatus::Closed, &report).await?;
    info!(order_id = %order_id, outcome = "released", moved = report.moved, already = report.already, refused = report.refused, "release done");
    Ok(report)
}

/// The order was paid: reservations become CONFIRMED (the stock is sold),
/// the coupon is USED, the wake-up is cancelled (a reminder that fires
/// anyway finds PAID and is acknowledged), and the order's other payments
/// still open at the channel are closed there, so the buyer cannot be
/// charged twice; one that succeeded meanwhile is recorded and refunded.
pub async fn settle_order<S, W, C>(
    store: &S,
    wakeups: &W,
    channel: &C,
    clock: &dyn Clock,
    order_id: &OrderId,
) -> Result<ResourceReport, Unavailable>
where
    S: OrderStore + PaymentStore,
    W: WakeUpScheduler,
    C: PaymentChannel,
{
    settle_order_until(store, wakeups, channel, clock, order_id, None).await
}

/// As [`settle_order`], with the channel's questions cut off at `until`
/// (this message's share of the invocation, see
/// `handlers::batch::each_sqs_message_within`). An attempt not closed at
/// the channel by then is left as it is (unknown, never taken as unpaid)
/// and the settle fails, so that its message comes back and the next
/// delivery closes what is left; everything before it is idempotent.
#[instrument(skip_all, fields(order_id = %order_id))]
pub async fn settle_order_until<S, W, C>(
    store: &S,
    wakeups: &W,
    channel: &C,
    clock: &dyn Clock,
    order_id: &OrderId,
    until: Option<std::time::Instant>,
) -> Result<ResourceReport, Unavailable>
where
    S: OrderStore + PaymentStore,
    W: WakeUpScheduler,
    C: PaymentChannel,
{
    let mut report = ResourceReport::default();
    let Some(record) = store.order_record(order_id).await? else {
        warn!("settle for an order that does not exist");
        return Ok(report);
    };
    if record.order.status != OrderStatus::Paid {
        error!(status = record.order.status.as_str(), "settle requested for an order that is not PAID");
        report.refused += 1;
        return Ok(report);
    }
    for r in &record.reservations {
        let res = store.confirm_reservation(order_id, r, clock.now()).await?;
        if let Err(refused) = &res {
            error!(holding = %r.label(), %refused, "invariant breach: reservation released while the order is PAID");
            metrics::RELEASED_RESERVATION_ON_PAID_ORDER.count(1);
        }
        tally(&mut report, res, "reservation");
    }
    if let Some(lock) = &record.coupon_lock {
        let res =
            store.end_coupon_lock(order_id, &lock.coupon_id, CouponLockStatus::Used, "order paid", clock.now()).await?;
        tally(&mut report, res, "coupon lock");
    }
    effects_settled(store, order_id, OrderStatus::Paid, &report).await?;
    wakeups.cancel_wake_up(order_id).await?;
    close_other_payments(store, channel, clock, &record, until).await?;
    info!(order_id = %order_id, outcome = "settled", moved = report.moved, already = report.already, refused = report.refused, "settle done");
    Ok(report)
}

/// Closes, at the channel, every attempt of a PAID order other than the one
/// that paid it. Best effort per attempt: one the channel cannot close now
/// stays as it is (its notification, if it is ever paid, leads to a refund;
/// reconciliation finds it otherwise). A store failure is returned so that
/// the stream record is retried. So is running out of `until`: the
/// attempts not closed by then are left open (unknown) and the message
/// comes back for them.
async fn close_other_payments<S: PaymentStore, C: PaymentChannel>(
    store: &S,
    channel: &C,
    clock: &dyn Clock,
    record: &OrderRecord,
    until: Option<std::time::Instant>,
) -> Result<(), Unavailable> {
    let order = &record.order;
    let open = record.payments.iter().filter(|p| order.paid_by.as_ref() != Some(&p.payment_id) && !p.status.is_final());
    let mut out_of_time = 0;
    let channel = &crate::faults::channel_for(channel, order.user_id.as_str());
    for p in open {
        let now = clock.now();
        // The order is PAID: no stock is at stake, so "not found" can be
        // believed at once; a late success still becomes a refund.
        let Some(verdict) = within(until, channel_verdict(channel, p, now, Duration::ZERO)).await else {
            metrics::CLOSE_BUDGET_SPENT.count(1);
            warn!(payment_id = %p.payment_id, "another payment not closed: out of this message's time");
            out_of_time += 1;
            continue;
        };
        match verdict {
            Verdict::Paid { channel_txn_id, detail } => {
                let evidence = channel_close(now, PaymentStatus::Succeeded, detail);
                let r = store.settle_success(order, p, &channel_txn_id, evidence, None, REFUND_NOTICE).await?;
                warn!(payment_id = %p.payment_id, result = ?r, "a second payment succeeded: refund");
                metrics::LATE_PAYMENT_REFUND.count(1);
            }
            Verdict::Unpaid(detail) => {
                let evidence = channel_close(now, PaymentStatus::Failed, detail);
                store.record_payment_fact(p, PaymentStatus::Failed, evidence, None).await?;
            }
            Verdict::Unknown(why) => warn!(payment_id = %p.payment_id, why = %why, "another payment left open"),
        }
    }
    if out_of_time > 0 {
        return Err(Unavailable::new(
            "settle",
            format!("{out_of_time} other payments not closed at the channel within this message's time; handed back"),
        ));
    }
    Ok(())
}

/// What closing a payment at the channel found out about it.
fn channel_close(at: Timestamp, status: PaymentStatus, detail: String) -> Evidence {
    Evidence { at, source: "channel_close".into(), status, detail: Some(detail) }
}

/// Every reservation and the lock reached their end: the order leaves the
/// effects part of the due index. A refusal (an invariant breach, alarmed)
/// keeps it there, so the backstop and the admin view keep showing it.
async fn effects_settled<S: OrderStore>(
    store: &S,
    order_id: &OrderId,
    status: OrderStatus,
    report: &ResourceReport,
) -> Result<(), Unavailable> {
    if report.refused == 0 {
        store.effects_done(order_id, status).await?;
    }
    Ok(())
}

/// The backstop's re-drive of a final order whose effects are still
/// pending: the same release or settle the stream would have run. Anything
/// else (an order not final) is left alone: only a final order has effects.
pub async fn drive_effects<S, W, C>(
    store: &S,
    wakeups: &W,
    channel: &C,
    clock: &dyn Clock,
    order_id: &OrderId,
) -> Result<ResourceReport, Unavailable>
where
    S: OrderStore + PaymentStore,
    W: WakeUpScheduler,
    C: PaymentChannel,
{
    drive_effects_until(store, wakeups, channel, clock, order_id, None).await
}

/// As [`drive_effects`], a settle's channel questions cut off at `until`
/// (the effects-queue message's share of its invocation).
#[instrument(skip_all, fields(order_id = %order_id, trigger = "sweep"))]
pub async fn drive_effects_until<S, W, C>(
    store: &S,
    wakeups: &W,
    channel: &C,
    clock: &dyn Clock,
    order_id: &OrderId,
    until: Option<std::time::Instant>,
) -> Result<ResourceReport, Unavailable>
where
    S: OrderStore + PaymentStore,
    W: WakeUpScheduler,
    C: PaymentChannel,
{
    let order = store.order(order_id).await?;
    if let Some(why) = order.as_ref().and_then(|o| crate::faults::active().release_fails(o, clock.now())) {
        return Err(Unavailable::new("release order", why));
    }
    match order.map(|o| o.status) {
        Some(OrderStatus::Closed) => release_order(store, clock, order_id).await,
        Some(OrderStatus::Paid) => settle_order_until(store, wakeups, channel, clock, order_id, until).await,
        other => {
            warn!(status = ?other, "effects re-drive for an order that is not final; nothing done");
            Ok(ResourceReport::default())
        }
    }
}

fn tally<S>(report: &mut ResourceReport, res: Result<Step<S>, Refused>, what: &str) {
    match res {
        Ok(Step::Moved(_)) => report.moved += 1,
        Ok(Step::AlreadyThere) => report.already += 1,
        Err(refused) => {
            report.refused += 1;
            error!(what, %refused, "refused resource transition");
        }
    }
}
