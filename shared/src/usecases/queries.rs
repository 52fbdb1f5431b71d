//! Operator reads and writes of the catalog: stock counts, prices and
//! coupons. Typed in, typed out; the HTTP forms are in
//! [`crate::handlers::requests`].

use crate::domain::*;
use crate::store::{Cas, Coupon, OrderStore, PutCoupon, Stock};
use crate::usecases::UseCaseError;

/// Upper bound of an operator's stock count or adjustment.
pub const MAX_STOCK: i64 = 1_000_000_000;

/// What `PUT /admin/skus/{sku}` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StockChange {
    /// `{"available": N, "price": P, "currency": C}`: seed a SKU that does
    /// not exist yet, with its catalog price.
    Seed { available: i64, price: Price },
    /// `{"available": N, "if_available": M}`: compare-and-swap.
    Swap { available: i64, expected: i64 },
    /// `{"adjust": D}`: add D (may be negative) if the result stays >= 0.
    Adjust(i64),
    /// `{"price": P, "currency": C}`: a live SKU's new catalog price. Open
    /// orders keep the price they were created with.
    Reprice(Price),
}

/// PUT /admin/skus/{sku}. A live SKU's count is only changed relative to
/// what the operator saw (`if_available`) or by an amount (`adjust`), never
/// overwritten: orders reserve and release stock concurrently, and a blind
/// set would silently create or destroy units. A price change touches only
/// the price: open orders keep theirs, and the counts are left alone.
pub async fn put_stock<S: OrderStore>(store: &S, sku: &Sku, change: StockChange) -> Result<Stock, UseCaseError> {
    let applied = match &change {
        StockChange::Seed { available, price } => store.seed_stock(sku, *available, price).await?,
        StockChange::Swap { available, expected } => store.swap_stock(sku, *available, *expected).await?,
        StockChange::Adjust(d) => store.adjust_stock(sku, *d).await?,
        StockChange::Reprice(price) => store.set_price(sku, price).await?,
    };
    if applied == Cas::Rejected {
        // The write changed nothing; this read only explains why.
        let now = store.stock(sku).await?;
        return Err(match (change, now) {
            (StockChange::Seed { .. }, Some(s)) => UseCaseError::conflict(
                "stock_exists",
                format!(
                    "sku {sku} already exists (available {}, reserved {}); send if_available with the count you \
                     read, or adjust with a relative change (price with currency changes its price)",
                    s.available, s.reserved
                ),
            ),
            (StockChange::Swap { expected, .. }, Some(s)) => UseCaseError::conflict(
                "stock_changed",
                format!(
                    "available is {}, not the {expected} the request expected; read it again and retry",
                    s.available
                ),
            ),
            (StockChange::Adjust(d), Some(s)) => UseCaseError::conflict(
                "insufficient_stock",
                format!("available is {}; adjusting by {d} would make it negative", s.available),
            ),
            // The only condition of a price change is that the SKU exists.
            (StockChange::Reprice(_), Some(_)) => {
                UseCaseError::Unavailable(crate::ports::Unavailable::new("set price", "refused on an existing sku"))
            }
            (_, None) => UseCaseError::not_found(format!(
                "sku {sku} (seed it with {{\"available\": N, \"price\": P, \"currency\": \"EUR\"}})"
            )),
        });
    }
    store.stock(sku).await?.ok_or_else(|| UseCaseError::not_found(format!("sku {sku}")))
}

/// GET /admin/skus/{sku}.
pub async fn get_stock<S: OrderStore>(store: &S, sku: &Sku) -> Result<Stock, UseCaseError> {
    store.stock(sku).await?.ok_or_else(|| UseCaseError::not_found(format!("sku {sku}")))
}

/// What `PUT /admin/coupons/{coupon_id}` issues: a coupon for one user,
/// AVAILABLE until `valid_until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCoupon {
    pub coupon_id: CouponId,
    pub user_id: UserId,
    pub valid_until: Timestamp,
    /// Whether it goes back to its owner when an order holding it closes
    /// unpaid (see [`Coupon::returnable`]).
    pub returnable: bool,
}

/// PUT /admin/coupons/{coupon_id}: issues (or re-issues) a coupon, never
/// over one locked by an order or one that has its outcome.
pub async fn put_coupon<S: OrderStore>(store: &S, new: NewCoupon) -> Result<Coupon, UseCaseError> {
    let NewCoupon { coupon_id, user_id, valid_until, returnable } = new;
    let coupon = Coupon {
        coupon_id,
        user_id,
        valid_until,
        state: CouponState::Available,
        locked_by: None,
        reason: None,
        returnable,
    };
    match store.put_coupon(&coupon).await? {
        PutCoupon::Stored => Ok(coupon),
        PutCoupon::Locked => Err(UseCaseError::conflict(
            "coupon_locked",
            "the coupon is locked by an open order; try again once that order is paid or closed",
        )),
        PutCoupon::Final(state) => Err(UseCaseError::conflict(
            "coupon_final",
            format!("the coupon is {} and keeps that outcome; issue a new coupon_id instead", state.as_str()),
        )),
    }
}

/// GET /admin/coupons/{coupon_id}.
pub async fn get_coupon<S: OrderStore>(store: &S, coupon_id: &CouponId) -> Result<Coupon, UseCaseError> {
    store.coupon(coupon_id).await?.ok_or_else(|| UseCaseError::not_found(format!("coupon {coupon_id}")))
}
