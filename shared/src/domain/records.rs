//! The order's entities as the store keeps them: the order with what it
//! holds (reservations, coupon lock, payment attempts, refunds), the stock
//! of a SKU and a coupon. Plain data; the state machines that move them are
//! in the sibling modules, the writes that persist them behind
//! [`crate::store`]'s ports.

use super::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub sku: Sku,
    pub qty: u32,
    pub status: ReservationStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CouponLock {
    pub coupon_id: CouponId,
    pub status: CouponLockStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What the close path or a notification saw of a payment at the channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    pub at: Timestamp,
    pub source: String,
    pub status: PaymentStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentAttempt {
    pub payment_id: PaymentId,
    pub order_id: OrderId,
    pub channel: ChannelName,
    pub amount: i64,
    pub currency: Currency,
    pub status: PaymentStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_txn_id: Option<String>,
    /// The channel's own id of this payment (a Stripe PaymentIntent's
    /// `pi_…`), recorded once the channel opened it; `None` for channels
    /// that key payments by our `payment_id` (the sandbox), and for an
    /// attempt whose opening never got an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_ref: Option<String>,
    pub created_at: Timestamp,
    #[serde(default)]
    pub evidence: Vec<Evidence>,
}

/// Everything an order owns, read in one query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRecord {
    pub order: Order,
    pub reservations: Vec<Reservation>,
    pub coupon_lock: Option<CouponLock>,
    pub payments: Vec<PaymentAttempt>,
    pub refunds: Vec<Refund>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stock {
    pub sku: Sku,
    pub available: i64,
    pub reserved: i64,
    /// Sold by paid orders (written by the first confirmation).
    #[serde(default)]
    pub sold: i64,
    /// The catalog price of one unit, in minor units of `currency`. Set
    /// with the SKU (both or neither); a SKU seeded before prices lived in
    /// the catalog has none and cannot be ordered until an operator sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<Currency>,
    /// `available + reserved + sold` as the operators' changes set it
    /// (orders only move units between the three): reconciliation checks
    /// the counts and the audit records against it ([`super::catalog`]).
    #[serde(default)]
    pub supplied: i64,
    /// The sequence number of the last operator change (0: none recorded,
    /// a SKU seeded before changes were audited).
    #[serde(default)]
    pub changes: u64,
}

impl Stock {
    /// The catalog price, when the SKU has one.
    pub fn catalog_price(&self) -> Option<Price> {
        Some(Price { amount: self.price?, currency: self.currency.clone()? })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coupon {
    pub coupon_id: CouponId,
    pub user_id: UserId,
    pub valid_until: Timestamp,
    pub state: CouponState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locked_by: Option<OrderId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The coupon's rule (seed 000 §8.2): a returnable coupon goes back to
    /// its owner when the order closes unpaid; a non-returnable one (e.g. a
    /// one-shot promotion) ends VOID. Coupons written before the field
    /// existed are returnable.
    #[serde(default = "returnable_by_default")]
    pub returnable: bool,
}

fn returnable_by_default() -> bool {
    true
}
