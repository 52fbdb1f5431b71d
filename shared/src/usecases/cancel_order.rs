//! `POST /orders/{order_id}/cancel`: the buyer gives up an unpaid order
//! before its window ends, so that its stock and coupon go back now rather
//! than at `expire_at`.
//!
//! A cancel is not a second way to close. It records that the buyer asked
//! (one conditional write, which makes the order due at once and stops new
//! payment attempts), then runs the same close use case as every wake-up.
//! So everything a close guarantees holds for a cancel too: a payment that
//! succeeded wins (the order turns PAID and the cancel answers 409
//! `order_paid`), an unknown payment state holds the order in CLOSING with
//! nothing released, and the release, the coupon rule and `OrderClosed`
//! (reason `BUYER_CANCELLED`) are those of any close. If this run cannot
//! finish the close, the order is due in the index from the moment of the
//! request, so the sweep finishes it.

use crate::domain::*;
use crate::ports::{CloseReminders, PaymentChannel};
use crate::store::{Cas, OrderStore, PaymentStore};
use crate::usecases::close_order::CloseOrder;
use crate::usecases::UseCaseError;
use tracing::{info, instrument};

/// Where the order stands after a cancel.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// CLOSED: by this cancel, an earlier one, or its window's end (the
    /// record's close reason says which).
    Closed,
    /// The order has a payment attempt whose outcome the channel has not
    /// confirmed yet: it is CLOSING, nothing is released, and it ends
    /// CLOSED (or PAID, if that payment succeeded) without another request.
    Closing,
}

#[derive(Debug, Clone)]
pub struct Cancelled {
    pub outcome: CancelOutcome,
    /// The order with everything it holds, as it is after the cancel.
    pub record: OrderRecord,
}

/// Cancels `buyer`'s order `order_id`. Another buyer's order is answered as
/// missing. `until` cuts the channel's questions off (the API invocation's
/// deadline less its margin), as for an operator's check.
#[instrument(skip_all, fields(order_id = %order_id))]
pub async fn cancel_order<S, C, Q>(
    closer: &CloseOrder<S, C, Q>,
    buyer: &UserId,
    order_id: &OrderId,
    until: Option<std::time::Instant>,
) -> Result<Cancelled, UseCaseError>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
    Q: CloseReminders,
{
    let not_found = || UseCaseError::not_found(format!("order {order_id}"));
    // A refused request (the order moved: a payment attempt, a close) is
    // decided again on the order as it now is.
    for _ in 0..5 {
        let order = closer.store.order(order_id).await?.filter(|o| o.user_id == *buyer).ok_or_else(not_found)?;
        let now = closer.clock.now();
        match order.status {
            OrderStatus::Paid => return Err(paid()),
            OrderStatus::Closed => return answer(closer, order_id).await,
            // Closing because its window ended, not because its buyer asked:
            // the close is already deciding, and a cancel cannot change what
            // it decides.
            OrderStatus::Closing if order.cancel_requested_at.is_none() => {
                return Err(UseCaseError::conflict(
                    "order_closing",
                    format!(
                        "the payment window ended at {} and the order is being closed; GET /orders/{order_id} shows the outcome",
                        order.expire_at
                    ),
                ))
            }
            OrderStatus::PendingPayment if order.cancel_requested_at.is_none() && now < order.expire_at => {
                if closer.store.request_cancel(&order, now).await? == Cas::Rejected {
                    continue;
                }
                info!(trigger = "buyer", "buyer asked to cancel");
                crate::metrics::ORDER_CANCEL_REQUESTED.count(1);
            }
            // Asked before (a repeated cancel, or one whose close was held),
            // or past its window: due either way, the close decides.
            OrderStatus::PendingPayment | OrderStatus::Closing => {}
        }
        closer.close_until(order_id, &format!("buyer:{buyer}"), until).await?;
        return answer(closer, order_id).await;
    }
    Err(UseCaseError::conflict(
        "order_busy",
        "the order is being changed by other requests; retry the cancel in a moment",
    ))
}

fn paid() -> UseCaseError {
    UseCaseError::conflict(
        "order_paid",
        "the order is paid and can no longer be cancelled; ask the shop for a return or refund",
    )
}

/// The order as it is now, as the cancel's answer.
async fn answer<S, C, Q>(closer: &CloseOrder<S, C, Q>, order_id: &OrderId) -> Result<Cancelled, UseCaseError>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
    Q: CloseReminders,
{
    let record = closer
        .store
        .order_record(order_id)
        .await?
        .ok_or_else(|| UseCaseError::not_found(format!("order {order_id}")))?;
    match record.order.status {
        OrderStatus::Paid => Err(paid()),
        OrderStatus::Closed => Ok(Cancelled { outcome: CancelOutcome::Closed, record }),
        OrderStatus::Closing => Ok(Cancelled { outcome: CancelOutcome::Closing, record }),
        // The close did not get to run its write (other requests kept
        // changing the order): the cancel is recorded and the order is due,
        // so the sweep closes it; the buyer may retry to see it closed.
        OrderStatus::PendingPayment => Err(UseCaseError::conflict(
            "order_busy",
            "the cancel is recorded but the order is being changed by other requests; retry the cancel in a moment",
        )),
    }
}
