//! POST /orders: validate, price the lines from the catalog, then one
//! transaction that writes the order, its reservations and coupon lock,
//! and the idempotency key.
//!
//! The buyer never sets a price. Each line's `unit_price` is the catalog's
//! at create, fixed on the order like `expire_at`; a `unit_price` in the
//! request is only the price the buyer was shown, checked against the
//! catalog. The catalog is read before the transaction (the amount must be
//! known to write the order) and the transaction is conditional on the
//! prices read, so a price change in between cancels it: an order is never
//! written at a price the catalog did not have at that moment.

use crate::domain::money::{line_total, MAX_AMOUNT};
use crate::domain::*;
use crate::ports::{Clock, IdGen, Unavailable};
use crate::store::{Caps, CreateResult, IdempotencyClaim, OrderStore, Stock};
use crate::usecases::UseCaseError;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::time::Duration;
use tracing::{info, instrument};

/// Upper bounds that keep one order inside one DynamoDB transaction
/// (100 items: key + order + 2 per line + 2 for the coupon, and 2 for each
/// buyer counter: a limited line, the points, the open-order slot; an
/// order that would pass 100 is refused as `order_too_large`).
pub const MAX_LINES: usize = 40;
pub const MAX_QTY: u64 = 1000;
/// Items one DynamoDB transaction takes.
pub const MAX_TRANSACTION_ITEMS: usize = 100;
/// Points one order may spend.
pub const MAX_POINTS: u64 = 1_000_000_000;

/// One line as the buyer sent it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestLine {
    pub sku: Sku,
    pub qty: u32,
    /// The price the buyer was shown, if the client sent it: a guard
    /// against a catalog change in between, never the price charged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit_price: Option<i64>,
}

/// The request after validation. Its JSON form is the canonical body the
/// idempotency hash is taken over, so formatting differences between two
/// retries of the same request do not count as a different body. It holds
/// what the buyer sent, not the catalog's prices: a retry of the same
/// request hashes the same whatever the catalog says by then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CreateOrderRequest {
    pub user_id: UserId,
    pub currency: Currency,
    pub items: Vec<RequestLine>,
    pub coupon_id: Option<CouponId>,
    /// Loyalty points to spend (one per minor unit); 0 when the body has
    /// none, and left out of the hash then, so a request made before
    /// points existed hashes as it did.
    #[serde(skip_serializing_if = "is_zero")]
    pub points: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl CreateOrderRequest {
    /// Lines are hashed sorted by SKU (a SKU appears once per order), so
    /// a retry that lists the same lines in another order is the same
    /// request.
    pub fn request_hash(&self) -> String {
        let mut canonical = self.clone();
        canonical.items.sort_by(|a, b| a.sku.cmp(&b.sku));
        hex::encode(Sha256::digest(serde_json::to_vec(&canonical).expect("serialisable")))
    }

    /// The order's lines at the catalog's prices as read in `catalog`, or
    /// the refusal of the first line (in request order) that cannot be
    /// priced: a SKU that does not exist (409 `out_of_stock`, as the
    /// transaction would answer), one without a price (409 `not_for_sale`),
    /// one priced in another currency (409 `currency_mismatch`), or one
    /// whose price is not the one the buyer was shown (409 `price_changed`).
    pub fn price_lines(&self, catalog: &[Stock]) -> Result<Vec<OrderLine>, UseCaseError> {
        self.items
            .iter()
            .map(|line| {
                let sku = &line.sku;
                let stock = catalog.iter().find(|s| &s.sku == sku).ok_or_else(|| {
                    UseCaseError::conflict("out_of_stock", format!("sku {sku} does not exist; remove the line"))
                })?;
                let price = stock.catalog_price().ok_or_else(|| {
                    UseCaseError::conflict(
                        "not_for_sale",
                        format!("sku {sku} has no price in the catalog yet; remove the line"),
                    )
                })?;
                if price.currency != self.currency {
                    return Err(UseCaseError::conflict(
                        "currency_mismatch",
                        format!(
                            "sku {sku} is sold in {}, not {}; order it in {} (one currency per order)",
                            price.currency, self.currency, price.currency
                        ),
                    ));
                }
                if line.unit_price.is_some_and(|shown| shown != price.amount) {
                    return Err(price_changed(sku, Some(&price), line.unit_price));
                }
                Ok(OrderLine { sku: sku.clone(), qty: line.qty, unit_price: price.amount })
            })
            .collect()
    }
}

/// 409 `price_changed`: the catalog's price of `sku` is not the one the
/// request was shown (`shown`), or changed while the order was written.
fn price_changed(sku: &Sku, now: Option<&Price>, shown: Option<i64>) -> UseCaseError {
    let now = match now {
        Some(p) => format!("is now {p}"),
        None => "is no longer set".to_owned(),
    };
    let was = match shown {
        Some(s) => format!(", not the {s} the buyer was shown"),
        None => " while the order was being placed".to_owned(),
    };
    UseCaseError::conflict(
        "price_changed",
        format!("the catalog price of sku {sku} {now}{was}; show the buyer the current price and send the order again"),
    )
}

/// The sum of the lines, within [`MAX_AMOUNT`].
pub fn amount_total(lines: &[OrderLine]) -> Result<i64, UseCaseError> {
    lines.iter().try_fold(0i64, |acc, l| {
        let t =
            line_total(l.qty, l.unit_price).map_err(|e| UseCaseError::invalid(format!("sku {}: {}", l.sku, e.0)))?;
        acc.checked_add(t)
            .filter(|t| *t <= MAX_AMOUNT)
            .ok_or_else(|| UseCaseError::invalid("the order total is too large"))
    })
}

/// What the client gets back, new or replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    pub order: Order,
    /// True when the idempotency key was seen before with the same body.
    pub replayed: bool,
}

pub struct CreateOrder<S> {
    pub store: S,
    pub clock: Box<dyn Clock>,
    pub ids: Box<dyn IdGen>,
    /// The payment window; fixed onto each order as `expire_at`.
    pub window: Duration,
    pub expiry_rule_version: String,
    /// At most this many open orders per buyer (`MAX_OPEN_ORDERS_PER_BUYER`;
    /// `None`: no cap).
    pub open_order_cap: Option<u32>,
}

/// The caps `order` is created under: the stack's open-order cap and the
/// purchase limits of its SKUs as the catalog read gave them; or the
/// refusal when a line alone passes its SKU's limit, or the order would
/// not fit one transaction.
pub fn caps_for(order: &Order, catalog: &[Stock], open_order_cap: Option<u32>) -> Result<Caps, UseCaseError> {
    // A cap of 0 is no cap, as the stack parameter says.
    let mut caps = Caps { open_orders: open_order_cap.filter(|c| *c > 0), ..Caps::default() };
    for line in &order.items {
        let Some(limit) = catalog.iter().find(|s| s.sku == line.sku).and_then(|s| s.purchase_limit) else { continue };
        if line.qty > limit {
            return Err(limit_reached(&line.sku, limit));
        }
        caps.purchase_limits.insert(line.sku.clone(), limit);
    }
    // Key and order, then per holding its counter's update and its record,
    // then the coupon and its lock.
    let items = 2 + 2 * caps.holdings(order).len() + 2 * usize::from(order.coupon_id.is_some());
    if items > MAX_TRANSACTION_ITEMS {
        return Err(UseCaseError::conflict(
            "order_too_large",
            format!(
                "with its purchase limits this order needs {items} writes, more than one transaction takes \
                 ({MAX_TRANSACTION_ITEMS}); split it into two orders"
            ),
        ));
    }
    Ok(caps)
}

fn limit_reached(sku: &Sku, limit: u32) -> UseCaseError {
    UseCaseError::conflict(
        "purchase_limit_reached",
        format!(
            "sku {sku} is limited to {limit} per buyer, counting open and paid orders; lower the quantity \
             (or pay or cancel an open order of it)"
        ),
    )
}

/// The amount the buyer pays: the lines' total less the points, which
/// must leave at least one minor unit to pay (a payment of 0 is not one
/// any channel takes).
pub fn amount_after_points(lines_total: i64, points: u32) -> Result<i64, UseCaseError> {
    let left = lines_total - i64::from(points);
    // An order without points keeps whatever total its lines give (a free
    // order of SKUs priced 0 is one).
    if points > 0 && left < 1 {
        return Err(UseCaseError::conflict(
            "points_exceed_total",
            format!(
                "{points} points would pay the whole total of {lines_total}; spend at most {} points on this order",
                (lines_total - 1).max(0)
            ),
        ));
    }
    Ok(left)
}

impl<S: OrderStore> CreateOrder<S> {
    /// Places `req` under the buyer's idempotency `key`: the order, or the
    /// order the key was first used for.
    #[instrument(skip_all, fields(idempotency_key = key.as_str()))]
    pub async fn execute(&self, key: IdempotencyKey, req: CreateOrderRequest) -> Result<Created, UseCaseError> {
        let claim = IdempotencyClaim { user_id: req.user_id.clone(), key, request_hash: req.request_hash() };
        // The catalog as read prices the order; the transaction below is
        // conditional on those prices, so it never writes stale ones.
        let skus: Vec<Sku> = req.items.iter().map(|l| l.sku.clone()).collect();
        let catalog = self.store.stocks(&skus).await?;
        let priced = req
            .price_lines(&catalog)
            .and_then(|lines| Ok((amount_after_points(amount_total(&lines)?, req.points)?, lines)));
        let (amount_total, items) = match priced {
            Ok(priced) => priced,
            Err(refusal) => return self.refuse_unless_claimed(&claim, refusal).await,
        };
        let now = self.clock.now();
        let (window, expiry_rule_version) = self.window_of(&items, &catalog).await?;
        let order = self.new_order(&req, now, amount_total, items, window, expiry_rule_version);
        let caps = match caps_for(&order, &catalog, self.open_order_cap) {
            Ok(caps) => caps,
            Err(refusal) => return self.refuse_unless_claimed(&claim, refusal).await,
        };
        match self.store.create_order(&order, &caps, &claim).await? {
            CreateResult::Created => {
                info!(order_id = %order.order_id, expire_at = %order.expire_at, amount = order.amount_total, trigger = "api", outcome = "created", "order created");
                crate::metrics::ORDER_CREATED.count(1);
                Ok(Created { order, replayed: false })
            }
            CreateResult::Replay { order_id, same_request } => self.replay(&order_id, same_request).await,
            CreateResult::OutOfStock(sku) => Err(UseCaseError::conflict(
                "out_of_stock",
                format!("not enough stock for sku {sku} (or no such sku); lower the quantity or remove the line"),
            )),
            CreateResult::PriceChanged { sku, now } => {
                let shown = req.items.iter().find(|l| l.sku == sku).and_then(|l| l.unit_price);
                Err(price_changed(&sku, now.as_ref(), shown))
            }
            CreateResult::CouponUnavailable => Err(UseCaseError::conflict(
                "coupon_unavailable",
                "the coupon does not exist, belongs to another user, is expired or is in use; order without coupon_id",
            )),
            CreateResult::PurchaseLimitReached { sku, limit } => Err(limit_reached(&sku, limit)),
            CreateResult::NotEnoughPoints => Err(UseCaseError::conflict(
                "not_enough_points",
                format!(
                    "the buyer's points balance is below the {} points asked (points held by open orders are \
                     not spendable until they close); spend fewer points",
                    order.points
                ),
            )),
            CreateResult::PointsCurrencyMismatch { currency } => Err(UseCaseError::conflict(
                "points_currency_mismatch",
                format!(
                    "the buyer's points are worth minor units of {currency}, and this order is in {}; spend them on \
                     an order in {currency}, or order without points",
                    order.currency
                ),
            )),
            CreateResult::PurchaseLimitChanged(sku) => Err(UseCaseError::conflict(
                "purchase_limit_changed",
                format!("the purchase limit of sku {sku} changed while the order was placed; send the order again"),
            )),
            CreateResult::OpenOrderCapReached { cap } => Err(UseCaseError::conflict(
                "open_order_cap_reached",
                format!("the buyer already has {cap} open orders, the most allowed; pay or cancel one first"),
            )),
        }
    }

    /// The order `req` places at `now`, priced at `amount_total` for its
    /// priced `items`, open for `window` as the rule `expiry_rule_version`
    /// gave it.
    fn new_order(
        &self,
        req: &CreateOrderRequest,
        now: Timestamp,
        amount_total: i64,
        items: Vec<OrderLine>,
        window: Duration,
        expiry_rule_version: String,
    ) -> Order {
        Order {
            order_id: OrderId::parse(self.ids.new_id("ord", now)).expect("generated ids are valid"),
            user_id: req.user_id.clone(),
            status: OrderStatus::PendingPayment,
            version: 1,
            currency: req.currency.clone(),
            amount_total,
            points: req.points,
            items,
            coupon_id: req.coupon_id.clone(),
            created_at: now,
            expire_at: now.plus(window),
            expiry_rule_version,
            cancel_requested_at: None,
            expiring_soon_at: None,
            payment_attempts: 0,
            closing: None,
            paid_by: None,
            history: vec![],
            checks: vec![],
        }
    }

    /// The order's payment window and the rule version that gave it: the
    /// expiry rules in force, matched against the lines' SKUs and the
    /// catalog's categories and tags of them (`domain::expiry_rules`); the
    /// stack's window and version when no rules were ever published.
    async fn window_of(&self, items: &[OrderLine], catalog: &[Stock]) -> Result<(Duration, String), Unavailable> {
        use crate::domain::expiry_rules::{window_for, LineFacts};
        let Some(rules) = self.store.current_expiry_rules().await? else {
            return Ok((self.window, self.expiry_rule_version.clone()));
        };
        let facts: Vec<LineFacts<'_>> = items
            .iter()
            .map(|l| {
                let stock = catalog.iter().find(|s| s.sku == l.sku);
                LineFacts {
                    sku: &l.sku,
                    category: stock.and_then(|s| s.category.as_ref()),
                    tags: stock.map_or(&[], |s| s.tags.as_slice()),
                }
            })
            .collect();
        Ok((window_for(Some(&rules), &facts, self.window), rules.version_name()))
    }

    /// The answer to a key used before: the order as it is now, or a
    /// refusal when the key came with another body.
    async fn replay(&self, order_id: &OrderId, same_request: bool) -> Result<Created, UseCaseError> {
        if !same_request {
            return Err(UseCaseError::conflict(
                "idempotency_key_reused",
                "this Idempotency-Key was already used with a different request body; use a new key for a new order",
            ));
        }
        let order = self
            .store
            .order(order_id)
            .await?
            .ok_or_else(|| Unavailable::new("idempotent replay", "order of the key is missing"))?;
        info!(order_id = %order.order_id, "idempotent replay");
        Ok(Created { order, replayed: true })
    }

    /// A request refused on what the catalog read says may still be the
    /// retry of one that was accepted before the catalog changed (a new
    /// price, the buyer's guard now stale): that retry must get its order
    /// back, not a refusal that invites a second order. The key's record
    /// decides; nothing is written either way.
    async fn refuse_unless_claimed(
        &self,
        claim: &IdempotencyClaim,
        refusal: UseCaseError,
    ) -> Result<Created, UseCaseError> {
        match self.store.claimed_order(&claim.user_id, &claim.key).await? {
            Some(c) => self.replay(&c.order_id, c.request_hash == claim.request_hash).await,
            None => Err(refusal),
        }
    }
}
