//! The order's entities as the store keeps them: the order with what it
//! holds (reservations, coupon lock, payment attempts, refunds), the stock
//! of a SKU and a coupon. Plain data; the state machines that move them are
//! in the sibling modules, the writes that persist them behind
//! [`crate::store`]'s ports.

use super::*;
use serde::{Deserialize, Serialize};

/// One thing an open order holds (docs/design.md#holdings: one reservation
/// per `order_id + resource_type + resource_key`): units of a SKU's stock,
/// units of the buyer's purchase limit of a SKU, the buyer's loyalty
/// points, or one of the buyer's open-order slots. Every kind moves
/// through the same state machine ([`super::reservation`]): held at
/// create, released when the order closes, confirmed when it is paid,
/// each exactly once; only the counter each kind moves differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// Records written before holdings had kinds are stock.
    #[serde(default)]
    pub resource_type: ResourceType,
    /// What is held, per kind: the SKU (stock), `<user_id>#<sku>`
    /// (purchase limit), `<user_id>` (points, open-order slot). `#` never
    /// occurs in an id, so the key splits back unambiguously.
    #[serde(alias = "sku")]
    pub resource_key: String,
    /// Units, points, or 1 for a slot.
    pub qty: u32,
    pub status: ReservationStatus,
}

impl Reservation {
    pub fn stock(sku: &Sku, qty: u32) -> Self {
        Self::held(ResourceType::Stock, sku.to_string(), qty)
    }
    pub fn purchase_limit(user: &UserId, sku: &Sku, qty: u32) -> Self {
        Self::held(ResourceType::PurchaseLimit, format!("{user}#{sku}"), qty)
    }
    pub fn points(user: &UserId, points: u32) -> Self {
        Self::held(ResourceType::Points, user.to_string(), points)
    }
    pub fn open_order_slot(user: &UserId) -> Self {
        Self::held(ResourceType::OpenOrders, user.to_string(), 1)
    }
    fn held(resource_type: ResourceType, resource_key: String, qty: u32) -> Self {
        Self { resource_type, resource_key, qty, status: ReservationStatus::Reserved }
    }

    /// The SKU a stock or purchase-limit holding is of.
    pub fn sku(&self) -> Option<Sku> {
        match self.resource_type {
            ResourceType::Stock => Sku::parse(self.resource_key.as_str()).ok(),
            ResourceType::PurchaseLimit => self.resource_key.split_once('#').and_then(|(_, s)| Sku::parse(s).ok()),
            ResourceType::Points | ResourceType::OpenOrders => None,
        }
    }

    /// The buyer a purchase-limit, points or slot holding is counted
    /// against (stock is the shop's, not a buyer's).
    pub fn user(&self) -> Option<UserId> {
        match self.resource_type {
            ResourceType::Stock => None,
            ResourceType::PurchaseLimit => self.resource_key.split_once('#').and_then(|(u, _)| UserId::parse(u).ok()),
            ResourceType::Points | ResourceType::OpenOrders => UserId::parse(self.resource_key.as_str()).ok(),
        }
    }

    /// The holding's sort key under its order: `RES#<TYPE>#<key>`.
    pub fn sort_key(&self) -> String {
        format!("RES#{}#{}", self.resource_type.as_str(), self.resource_key)
    }

    /// How the holding reads to a person: `2×A`, `2×A of the buyer's
    /// limit`, `500 points`, `an open-order slot`.
    pub fn label(&self) -> String {
        match self.resource_type {
            ResourceType::Stock => format!("{}×{}", self.qty, self.resource_key),
            ResourceType::PurchaseLimit => {
                let sku = self.sku().map_or_else(|| self.resource_key.clone(), |s| s.to_string());
                format!("{}×{sku} of the buyer's purchase limit", self.qty)
            }
            ResourceType::Points => format!("{} points", self.qty),
            ResourceType::OpenOrders => "an open-order slot".to_owned(),
        }
    }
}

/// The kinds of holding. Adding one: a variant here, its counter's key and
/// its release/confirm updates in the store's `move_reservation`, where
/// create takes it, and its balance check in reconciliation
/// (docs/extending.md, "A holding kind").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ResourceType {
    /// Units of a SKU's stock (`SKU#<sku>` / `STOCK`).
    #[default]
    Stock,
    /// Units counted against the buyer's per-SKU purchase limit
    /// (`BUYER#<user>` / `LIMIT#<sku>`); kept when paid (bought), returned
    /// when closed.
    PurchaseLimit,
    /// The buyer's loyalty points (`BUYER#<user>` / `POINTS`): spent when
    /// paid, returned when closed.
    Points,
    /// One of the buyer's open orders (`BUYER#<user>` / `OPEN_ORDERS`):
    /// given back whichever way the order ends.
    OpenOrders,
}

impl ResourceType {
    pub const ALL: [Self; 4] = [Self::Stock, Self::PurchaseLimit, Self::Points, Self::OpenOrders];
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stock => "STOCK",
            Self::PurchaseLimit => "PURCHASE_LIMIT",
            Self::Points => "POINTS",
            Self::OpenOrders => "OPEN_ORDERS",
        }
    }
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
    /// At most this many units per buyer, open and paid orders together;
    /// `None`: no limit. Set by an operator's audited change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purchase_limit: Option<u32>,
    /// What expiry rules may match besides the SKU itself
    /// ([`super::expiry_rules`]): its category and campaign tags, set by an
    /// operator's audited `classify` change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<super::expiry_rules::Label>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<super::expiry_rules::Label>,
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
    /// The coupon's rule (docs/design.md#coupon-rule): a returnable coupon
    /// goes back to its owner when the order closes unpaid; a non-returnable
    /// one (e.g. a one-shot promotion) ends VOID. Coupons written before the
    /// field existed are returnable.
    #[serde(default = "returnable_by_default")]
    pub returnable: bool,
}

fn returnable_by_default() -> bool {
    true
}
