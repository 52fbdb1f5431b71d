//! Reading an order, with lazy expiry (seed 002 §3.3): a buyer who looks at
//! an order whose window has passed is told so at once, even if its close
//! has not happened yet, and the read nudges the closer with one reminder.
//! The read never writes a status: closing is the close use case's job.

use crate::domain::*;
use crate::error::ApiError;
use crate::ports::{Clock, CloseReminders};
use crate::store::{Cas, OrderStore};
use crate::usecases::queries::{admin_order_view, order_view};
use serde_json::{json, Value};
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

/// `GET /orders/{id}` (buyer) and `GET /admin/orders/{id}` (operator).
pub async fn get_order<S: OrderStore, Q: CloseReminders>(
    store: &S,
    reminders: &Q,
    clock: &dyn Clock,
    id: &str,
    reader: &Reader,
) -> Result<Value, ApiError> {
    let not_found = || ApiError::not_found(format!("order {id}"));
    let order_id = OrderId::parse(id).map_err(|_| not_found())?;
    let record = store.order_record(&order_id).await?.ok_or_else(not_found)?;
    let admin = match reader {
        // Another buyer's order answers exactly like a missing one, so ids
        // cannot be probed; and the read nudges nothing.
        Reader::Buyer(user) if *user != record.order.user_id => return Err(not_found()),
        Reader::Buyer(_) => false,
        Reader::Operator => true,
    };
    let now = clock.now();
    let mut view = if admin { admin_order_view(&record) } else { order_view(&record) };
    let order = &record.order;
    let overdue = !order.status.is_final() && order.expire_at <= now;
    // What the buyer can show: the window is over, the order is being
    // closed (or, if a payment is found meanwhile, paid).
    view["expired_awaiting_close"] = json!(overdue);
    if overdue && order.status == OrderStatus::PendingPayment && !admin {
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
    if admin {
        view["held"] = held_view(&record, now);
    }
    Ok(view)
}

/// What the order still holds and since when: reservations not yet
/// released or confirmed and a coupon lock not yet ended (all taken at
/// create), and since when the order has been final with them pending.
fn held_view(r: &crate::store::OrderRecord, now: Timestamp) -> Value {
    let o = &r.order;
    let reservations: Vec<Value> = r
        .reservations
        .iter()
        .filter(|res| res.status == ReservationStatus::Reserved)
        .map(|res| json!({"sku": res.sku, "qty": res.qty, "since": o.created_at}))
        .collect();
    let coupon = r
        .coupon_lock
        .as_ref()
        .filter(|l| l.status == CouponLockStatus::Locked)
        .map(|l| json!({"coupon_id": l.coupon_id, "since": o.created_at}));
    let pending_refunds: Vec<Value> = r
        .refunds
        .iter()
        .filter(|f| f.status == RefundStatus::RefundPending)
        .map(|f| json!({"payment_id": f.payment_id, "since": f.created_at, "tries": f.tries}))
        .collect();
    let final_since = o.status.is_final().then(|| o.history.last().map(|h| h.at)).flatten();
    let effects_pending = o.status.is_final() && (!reservations.is_empty() || coupon.is_some());
    json!({
        "reservations": reservations,
        "coupon": coupon,
        "refunds_pending": pending_refunds,
        "effects_pending": effects_pending,
        "effects_pending_since": if effects_pending { json!(final_since) } else { Value::Null },
        "effects_pending_seconds": if effects_pending {
            json!(final_since.map(|t| t.until(now).as_secs()))
        } else {
            Value::Null
        },
    })
}
