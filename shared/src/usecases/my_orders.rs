//! `GET /orders`: the buyer's own orders, newest first, a page at a time.
//! A `Query` of the buyer's partition of the buyer index (never a Scan, never
//! an offset); the page's position is the index key it ended on, which the
//! API hands out as an opaque cursor bound to the buyer and the filter.

use crate::domain::*;
use crate::ports::Clock;
use crate::store::{BuyerOrders, DueCursor, OrderSummary};
use crate::usecases::UseCaseError;

/// What the buyer asked for: an optional status, a page size, and where
/// the previous page ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub status: Option<OrderStatus>,
    pub limit: u32,
    pub after: Option<DueCursor>,
}

/// One line of the list, with what the buyer needs to act now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedOrder {
    pub summary: OrderSummary,
    /// Whole seconds until `expire_at` while the order can still be paid
    /// (PENDING_PAYMENT, window open, no cancel asked); `None` otherwise.
    pub seconds_left: Option<u64>,
    /// Past `expire_at` and not final yet: show it as expired.
    pub expired_awaiting_close: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderList {
    pub orders: Vec<ListedOrder>,
    pub next: Option<DueCursor>,
}

/// A page of `buyer`'s orders. The cursor must be one this buyer was given
/// (its key names the buyer's partition): another buyer's is refused.
pub async fn list_orders<S: BuyerOrders>(
    store: &S,
    clock: &dyn Clock,
    buyer: &UserId,
    query: ListQuery,
) -> Result<OrderList, UseCaseError> {
    if let Some(after) = &query.after {
        if after.get("user_id").map(String::as_str) != Some(buyer.as_str()) {
            return Err(UseCaseError::invalid("cursor was not issued to this buyer; start again without one"));
        }
    }
    let page = store.buyer_orders(buyer, query.status, query.limit, query.after).await?;
    let now = clock.now();
    let orders = page
        .orders
        .into_iter()
        .map(|o| {
            let open = o.status == OrderStatus::PendingPayment && o.cancel_requested_at.is_none();
            let seconds_left = (open && now < o.expire_at).then(|| now.until(o.expire_at).as_secs());
            let expired_awaiting_close = !o.status.is_final() && o.expire_at <= now;
            ListedOrder { summary: o, seconds_left, expired_awaiting_close }
        })
        .collect();
    Ok(OrderList { orders, next: page.next })
}
