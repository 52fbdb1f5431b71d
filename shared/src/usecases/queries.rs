//! Operator reads and writes of the catalog: stock counts, prices and
//! coupons. Typed in, typed out; the HTTP forms are in
//! [`crate::handlers::requests`].

use crate::domain::catalog::{self, StockRefusal};
use crate::domain::*;
use crate::ports::{Clock, IdGen};
use crate::store::{Coupon, OrderStore, PutCoupon, Stock, StockLedger, StockWritten};
use crate::usecases::UseCaseError;
use tracing::{info, warn};

/// Upper bound of an operator's stock count or adjustment.
pub const MAX_STOCK: i64 = 1_000_000_000;

pub use crate::domain::catalog::StockChange;

/// How long a change keeps being planned again while the SKU moves
/// between the read and the write in a way its condition cares about (a
/// swap's count changed, stock was reserved), or while another first change
/// of a SKU seeded before changes were recorded wins. Each round plans again
/// from the SKU as the failed write saw it (no read), after a short random
/// pause. Well inside the order API's 10 s: past it the answer is 409
/// `stock_busy`, and the same request may be sent again.
const STOCK_CHANGE_BUDGET: std::time::Duration = std::time::Duration::from_secs(6);

/// Who asks for a stock change, and under which key.
#[derive(Debug, Clone)]
pub struct StockRequest {
    pub change: StockChange,
    /// The request's `Idempotency-Key`; one is made when it has none, so
    /// that the SDK's own re-sends are still applied once (an operator's
    /// retry is not, without a key: the docs say to send one).
    pub key: Option<IdempotencyKey>,
    /// The caller's identity, for the audit record.
    pub by: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StockChanged {
    pub stock: Stock,
    /// The key was used before with the same change: nothing was written.
    pub replayed: bool,
}

/// PUT /admin/skus/{sku}. A live SKU's count is only changed relative to
/// what the operator saw (`if_available`) or by an amount (`adjust`), never
/// overwritten: orders reserve and release stock concurrently, and a blind
/// set would silently create or destroy units. A price change touches only
/// the price: open orders keep theirs, and the counts are left alone.
/// Every change is written with its audit record, once per key
/// ([`crate::domain::catalog`]).
pub async fn put_stock<S: OrderStore + StockLedger>(
    store: &S,
    clock: &dyn Clock,
    ids: &dyn IdGen,
    sku: &Sku,
    req: StockRequest,
) -> Result<StockChanged, UseCaseError> {
    let now = clock.now();
    let key = match req.key {
        Some(k) => k,
        None => IdempotencyKey::parse(ids.new_id("auto", now)).expect("generated ids are valid keys"),
    };
    if let Some(done) = store.stock_change(sku, &key).await? {
        return replay(store, sku, &req.change, &done).await;
    }
    let asked = catalog::Requested { key, by: req.by, at: now };
    let mut current = store.stock(sku).await?;
    let started = std::time::Instant::now();
    let mut rounds = 0u32;
    while started.elapsed() < STOCK_CHANGE_BUDGET {
        rounds += 1;
        let planned = catalog::plan(sku, &req.change, current.as_ref(), &asked).map_err(|r| refusal(sku, r))?;
        match store.change_stock(&planned).await? {
            StockWritten::Applied => {
                info!(%sku, delta = planned.delta, by = %planned.by, key = %planned.key, "stock changed");
                let stock = store.stock(sku).await?.ok_or_else(|| UseCaseError::not_found(format!("sku {sku}")))?;
                return Ok(StockChanged { stock, replayed: false });
            }
            StockWritten::KeyUsed(done) => return replay(store, sku, &req.change, &done).await,
            StockWritten::Moved(now) => {
                current = now;
                let pause = rand::random::<u64>() % 20;
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
        }
    }
    warn!(%sku, rounds, "stock change not written: other changes of the sku kept winning");
    Err(UseCaseError::conflict(
        "stock_busy",
        format!(
            "sku {sku} is being changed by other requests right now; send the same request again (same \
             Idempotency-Key) in a moment"
        ),
    ))
}

/// The answer to a key used before: the SKU as it is now, or a refusal
/// when the key came with another change.
async fn replay<S: OrderStore>(
    store: &S,
    sku: &Sku,
    change: &StockChange,
    done: &StockChangeRecord,
) -> Result<StockChanged, UseCaseError> {
    if done.request != change.canonical() {
        return Err(UseCaseError::conflict(
            "idempotency_key_reused",
            format!(
                "this Idempotency-Key was already used for another change of sku {sku} ({}); use a new key",
                done.request
            ),
        ));
    }
    info!(%sku, key = %done.key, "idempotent replay of a stock change");
    let stock = store.stock(sku).await?.ok_or_else(|| UseCaseError::not_found(format!("sku {sku}")))?;
    Ok(StockChanged { stock, replayed: true })
}

fn refusal(sku: &Sku, r: StockRefusal) -> UseCaseError {
    match r {
        StockRefusal::Exists { available, reserved } => UseCaseError::conflict(
            "stock_exists",
            format!(
                "sku {sku} already exists (available {available}, reserved {reserved}); send if_available with the \
                 count you read, or adjust with a relative change (price with currency changes its price)"
            ),
        ),
        StockRefusal::Changed { available, expected } => UseCaseError::conflict(
            "stock_changed",
            format!("available is {available}, not the {expected} the request expected; read it again and retry"),
        ),
        StockRefusal::Insufficient { available, delta } => UseCaseError::conflict(
            "insufficient_stock",
            format!("available is {available}; adjusting by {delta} would make it negative"),
        ),
        StockRefusal::Missing => UseCaseError::not_found(format!(
            "sku {sku} (seed it with {{\"available\": N, \"price\": P, \"currency\": \"EUR\"}})"
        )),
    }
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
