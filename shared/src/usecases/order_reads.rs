//! Reading an order, with lazy expiry (docs/design.md#lazy-expiry): a buyer
//! who looks at an order whose window has passed is told so at once, even if
//! its close has not happened yet, and the read nudges the closer with one
//! reminder.
//! The read never writes a status: closing is the close use case's job.

use crate::domain::*;
use crate::ports::{Clock, CloseReminders};
use crate::store::{Cas, OrderRecord, OrderStore};
use crate::usecases::UseCaseError;
use std::time::Duration;
use tracing::{info, warn};

/// At most one lazy reminder per order per this long, however often it is read.
pub const LAZY_REMINDER_EVERY: Duration = Duration::from_secs(60);

/// Who is reading an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reader {
    /// An authenticated buyer: sees only their own orders.
    Buyer(UserId),
    /// An operator on the IAM-signed admin route: sees every order, in full.
    Operator,
}

/// An order as its reader may see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRead {
    pub record: OrderRecord,
    /// The window is over and the order is not final yet: what the buyer
    /// can show (the order is being closed, or, if a payment is found
    /// meanwhile, paid).
    pub expired_awaiting_close: bool,
    /// What the order still holds: for operators only.
    pub held: Option<Held>,
}

/// What an order still holds and since when: reservations not yet released
/// or confirmed and a coupon lock not yet ended (all taken at create),
/// pending refunds, and since when the order has been final with effects
/// pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Each holding still RESERVED, with since when.
    pub reservations: Vec<(Reservation, Timestamp)>,
    /// The coupon still LOCKED, and since when.
    pub coupon: Option<(CouponId, Timestamp)>,
    /// `(payment_id, since, tries)` of each refund still REFUND_PENDING.
    pub refunds_pending: Vec<(PaymentId, Timestamp, u32)>,
    /// Final, with stock or a coupon not yet settled.
    pub effects_pending: bool,
    /// When the order became final, while its effects are pending.
    pub effects_pending_since: Option<Timestamp>,
    pub effects_pending_seconds: Option<u64>,
}

/// `GET /orders/{id}` (buyer) and `GET /admin/orders/{id}` (operator).
pub async fn get_order<S: OrderStore, Q: CloseReminders>(
    store: &S,
    reminders: &Q,
    clock: &dyn Clock,
    order_id: &OrderId,
    reader: &Reader,
) -> Result<OrderRead, UseCaseError> {
    let not_found = || UseCaseError::not_found(format!("order {order_id}"));
    let record = store.order_record(order_id).await?.ok_or_else(not_found)?;
    let admin = match reader {
        // Another buyer's order answers exactly like a missing one, so ids
        // cannot be probed; and the read nudges nothing.
        Reader::Buyer(user) if *user != record.order.user_id => return Err(not_found()),
        Reader::Buyer(_) => false,
        Reader::Operator => true,
    };
    let now = clock.now();
    let order = &record.order;
    let overdue = !order.status.is_final() && order.expire_at <= now;
    // Due: past its window, or its buyer asked to cancel and the close has
    // not happened yet (the cancel's own close failed midway).
    let due = order.status == OrderStatus::PendingPayment && order.due_at() <= now;
    if due && !admin {
        // A CLOSING order already has a closer (and the sweep behind it); an
        // operator's look changes nothing (the force-check is the route
        // that acts).
        match store.note_lazy_reminder(order, now, LAZY_REMINDER_EVERY).await {
            Ok(Cas::Applied) => match reminders.remind_later(&order.order_id, Duration::ZERO).await {
                Ok(()) => {
                    info!(order_id = %order.order_id, trigger = "lazy", outcome = "reminder_sent", "overdue order read: close reminder sent")
                }
                Err(e) => {
                    warn!(order_id = %order.order_id, error = %e, "lazy close reminder not sent; the sweep covers it")
                }
            },
            Ok(Cas::Rejected) => {}
            // The read itself succeeded; a failed nudge is not the buyer's error.
            Err(e) => warn!(order_id = %order.order_id, error = %e, "lazy reminder not noted; the sweep covers it"),
        }
    }
    let held = admin.then(|| held(&record, now));
    Ok(OrderRead { record, expired_awaiting_close: overdue, held })
}

fn held(r: &OrderRecord, now: Timestamp) -> Held {
    let o = &r.order;
    let reservations: Vec<_> = r
        .reservations
        .iter()
        .filter(|res| res.status == ReservationStatus::Reserved)
        .map(|res| (res.clone(), o.created_at))
        .collect();
    let coupon = r
        .coupon_lock
        .as_ref()
        .filter(|l| l.status == CouponLockStatus::Locked)
        .map(|l| (l.coupon_id.clone(), o.created_at));
    let refunds_pending = r
        .refunds
        .iter()
        .filter(|f| f.status == RefundStatus::RefundPending)
        .map(|f| (f.payment_id.clone(), f.created_at, f.tries))
        .collect();
    let final_since = o.status.is_final().then(|| o.history.last().map(|h| h.at)).flatten();
    let effects_pending = o.status.is_final() && (!reservations.is_empty() || coupon.is_some());
    let effects_pending_since = if effects_pending { final_since } else { None };
    Held {
        reservations,
        coupon,
        refunds_pending,
        effects_pending,
        effects_pending_since,
        effects_pending_seconds: effects_pending_since.map(|t| t.until(now).as_secs()),
    }
}
