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
use crate::error::{json_object, ApiError};
use crate::ports::{Clock, IdGen, Unavailable};
use crate::store::{CreateResult, IdempotencyClaim, OrderStore, Stock};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::time::Duration;
use tracing::{info, instrument};

/// Upper bounds that keep one order inside one DynamoDB transaction
/// (100 items: key + order + 2 per line + 2 for the coupon).
pub const MAX_LINES: usize = 40;
pub const MAX_QTY: u64 = 1000;

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
}

fn field<'a>(obj: &'a serde_json::Map<String, Value>, name: &str) -> Result<&'a Value, ApiError> {
    obj.get(name).ok_or_else(|| ApiError::invalid(format!("{name} is required")))
}

fn string_field(obj: &serde_json::Map<String, Value>, name: &str) -> Result<String, ApiError> {
    field(obj, name)?.as_str().map(str::to_owned).ok_or_else(|| ApiError::invalid(format!("{name} must be a string")))
}

fn reject_unknown(obj: &serde_json::Map<String, Value>, known: &[&str], at: &str) -> Result<(), ApiError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(ApiError::invalid(format!("{at}{k} is not a known field"))),
        None => Ok(()),
    }
}

impl CreateOrderRequest {
    /// Parses and validates a request body of `buyer` (the authenticated
    /// caller); every error names the field. A `user_id` in the body is
    /// accepted for older clients and ignored: the order is always the
    /// caller's.
    pub fn parse(buyer: &UserId, body: &[u8]) -> Result<Self, ApiError> {
        let obj = &json_object(body)?;
        reject_unknown(obj, &["user_id", "currency", "items", "coupon_id"], "")?;
        let user_id = buyer.clone();
        let currency = Currency::parse(string_field(obj, "currency")?).map_err(|e| ApiError::invalid(e.0))?;
        let coupon_id = match obj.get("coupon_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => Some(CouponId::parse(c.clone()).map_err(|e| ApiError::invalid(e.0))?),
            Some(_) => return Err(ApiError::invalid("coupon_id must be a string")),
        };
        let raw_items = field(obj, "items")?.as_array().ok_or_else(|| ApiError::invalid("items must be an array"))?;
        if raw_items.is_empty() || raw_items.len() > MAX_LINES {
            return Err(ApiError::invalid(format!("items must hold 1 to {MAX_LINES} lines")));
        }
        let mut items: Vec<RequestLine> = Vec::with_capacity(raw_items.len());
        for (i, raw) in raw_items.iter().enumerate() {
            let at = format!("items[{i}].");
            let line = raw.as_object().ok_or_else(|| ApiError::invalid(format!("items[{i}] must be an object")))?;
            reject_unknown(line, &["sku", "qty", "unit_price"], &at)?;
            let sku = Sku::parse(
                string_field(line, "sku").map_err(|_| ApiError::invalid(format!("{at}sku must be a string")))?,
            )
            .map_err(|e| ApiError::invalid(format!("{at}{}", e.0)))?;
            let qty = line
                .get("qty")
                .and_then(Value::as_u64)
                .filter(|q| (1..=MAX_QTY).contains(q))
                .ok_or_else(|| ApiError::invalid(format!("{at}qty must be an integer from 1 to {MAX_QTY}")))?;
            let unit_price = match line.get("unit_price") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_i64().filter(|p| (0..=MAX_AMOUNT).contains(p)).ok_or_else(|| {
                    ApiError::invalid(format!(
                        "{at}unit_price (optional: the price the buyer was shown) must be an integer from 0 to \
                         {MAX_AMOUNT} in minor units"
                    ))
                })?),
            };
            if items.iter().any(|l| l.sku == sku) {
                return Err(ApiError::invalid(format!(
                    "{at}sku repeats an earlier line; put the quantity on one line"
                )));
            }
            if let Some(p) = unit_price {
                line_total(qty as u32, p).map_err(|e| ApiError::invalid(format!("{at}{}", e.0)))?;
            }
            items.push(RequestLine { sku, qty: qty as u32, unit_price });
        }
        Ok(Self { user_id, currency, items, coupon_id })
    }

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
    pub fn price_lines(&self, catalog: &[Stock]) -> Result<Vec<OrderLine>, ApiError> {
        self.items
            .iter()
            .map(|line| {
                let sku = &line.sku;
                let stock = catalog.iter().find(|s| &s.sku == sku).ok_or_else(|| {
                    ApiError::conflict("out_of_stock", format!("sku {sku} does not exist; remove the line"))
                })?;
                let price = stock.catalog_price().ok_or_else(|| {
                    ApiError::conflict(
                        "not_for_sale",
                        format!("sku {sku} has no price in the catalog yet; remove the line"),
                    )
                })?;
                if price.currency != self.currency {
                    return Err(ApiError::conflict(
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
fn price_changed(sku: &Sku, now: Option<&Price>, shown: Option<i64>) -> ApiError {
    let now = match now {
        Some(p) => format!("is now {p}"),
        None => "is no longer set".to_owned(),
    };
    let was = match shown {
        Some(s) => format!(", not the {s} the buyer was shown"),
        None => " while the order was being placed".to_owned(),
    };
    ApiError::conflict(
        "price_changed",
        format!("the catalog price of sku {sku} {now}{was}; show the buyer the current price and send the order again"),
    )
}

/// The sum of the lines, within [`MAX_AMOUNT`].
pub fn amount_total(lines: &[OrderLine]) -> Result<i64, ApiError> {
    lines.iter().try_fold(0i64, |acc, l| {
        let t = line_total(l.qty, l.unit_price).map_err(|e| ApiError::invalid(format!("sku {}: {}", l.sku, e.0)))?;
        acc.checked_add(t).filter(|t| *t <= MAX_AMOUNT).ok_or_else(|| ApiError::invalid("the order total is too large"))
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
}

impl<S: OrderStore> CreateOrder<S> {
    #[instrument(skip_all, fields(idempotency_key = idempotency_key.unwrap_or("")))]
    pub async fn execute(
        &self,
        buyer: &UserId,
        idempotency_key: Option<&str>,
        body: &[u8],
    ) -> Result<Created, ApiError> {
        let key = match idempotency_key {
            None => return Err(ApiError::invalid("the Idempotency-Key header is required")),
            Some(k) => IdempotencyKey::parse(k).map_err(|e| ApiError::invalid(e.0))?,
        };
        let req = CreateOrderRequest::parse(buyer, body)?;
        let claim = IdempotencyClaim { user_id: req.user_id.clone(), key, request_hash: req.request_hash() };
        // The catalog as read prices the order; the transaction below is
        // conditional on those prices, so it never writes stale ones.
        let skus: Vec<Sku> = req.items.iter().map(|l| l.sku.clone()).collect();
        let catalog = self.store.stocks(&skus).await?;
        let priced = req.price_lines(&catalog).and_then(|lines| Ok((amount_total(&lines)?, lines)));
        let (amount_total, items) = match priced {
            Ok(priced) => priced,
            Err(refusal) => return self.refuse_unless_claimed(&claim, refusal).await,
        };
        let now = self.clock.now();
        let order = Order {
            order_id: OrderId::parse(self.ids.new_id("ord", now)).expect("generated ids are valid"),
            user_id: req.user_id.clone(),
            status: OrderStatus::PendingPayment,
            version: 1,
            currency: req.currency.clone(),
            amount_total,
            items,
            coupon_id: req.coupon_id.clone(),
            created_at: now,
            expire_at: now.plus(self.window),
            expiry_rule_version: self.expiry_rule_version.clone(),
            payment_attempts: 0,
            closing: None,
            paid_by: None,
            history: vec![],
            checks: vec![],
        };
        match self.store.create_order(&order, &claim).await? {
            CreateResult::Created => {
                info!(order_id = %order.order_id, expire_at = %order.expire_at, amount = order.amount_total, trigger = "api", outcome = "created", "order created");
                crate::metrics::ORDER_CREATED.count(1);
                Ok(Created { order, replayed: false })
            }
            CreateResult::Replay { order_id, same_request } => self.replay(&order_id, same_request).await,
            CreateResult::OutOfStock(sku) => Err(ApiError::conflict(
                "out_of_stock",
                format!("not enough stock for sku {sku} (or no such sku); lower the quantity or remove the line"),
            )),
            CreateResult::PriceChanged { sku, now } => {
                let shown = req.items.iter().find(|l| l.sku == sku).and_then(|l| l.unit_price);
                Err(price_changed(&sku, now.as_ref(), shown))
            }
            CreateResult::CouponUnavailable => Err(ApiError::conflict(
                "coupon_unavailable",
                "the coupon does not exist, belongs to another user, is expired or is in use; order without coupon_id",
            )),
        }
    }

    /// The answer to a key used before: the order as it is now, or a
    /// refusal when the key came with another body.
    async fn replay(&self, order_id: &OrderId, same_request: bool) -> Result<Created, ApiError> {
        if !same_request {
            return Err(ApiError::conflict(
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
    async fn refuse_unless_claimed(&self, claim: &IdempotencyClaim, refusal: ApiError) -> Result<Created, ApiError> {
        match self.store.claimed_order(&claim.user_id, &claim.key).await? {
            Some(c) => self.replay(&c.order_id, c.request_hash == claim.request_hash).await,
            None => Err(refusal),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u() -> UserId {
        UserId::parse("u").unwrap()
    }

    fn err(body: &str) -> String {
        match CreateOrderRequest::parse(&u(), body.as_bytes()) {
            Err(ApiError::Refused { message, .. }) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn req(body: &str) -> CreateOrderRequest {
        CreateOrderRequest::parse(&u(), body.as_bytes()).unwrap()
    }

    fn stock(sku: &str, price: Option<(i64, &str)>) -> Stock {
        Stock {
            sku: Sku::parse(sku).unwrap(),
            available: 10,
            reserved: 0,
            sold: 0,
            price: price.map(|p| p.0),
            currency: price.map(|p| Currency::parse(p.1).unwrap()),
        }
    }

    fn refusal(r: Result<Vec<OrderLine>, ApiError>) -> (&'static str, String) {
        match r {
            Err(ApiError::Refused { code, message, .. }) => (code, message),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn validation_errors_name_the_field() {
        assert!(err("{").contains("not valid JSON"));
        assert!(err(r#"{"currency":"EUR","items":[]}"#).contains("items"));
        assert!(err(r#"{"user_id":"u","currency":"eur","items":[]}"#).contains("currency"));
        assert!(err(r#"{"user_id":"u","currency":"EUR","items":[]}"#).contains("items"));
        assert!(err(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":0,"unit_price":1}]}"#)
            .contains("items[0].qty"));
        assert!(err(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":1.5}]}"#)
            .contains("items[0].unit_price"));
        assert!(err(r#"{"currency":"EUR","items":[{"sku":"a","qty":1},{"sku":"b","qty":1,"unit_price":-1}]}"#)
            .contains("items[1].unit_price"));
        assert!(err(r#"{"currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":"12.99"}]}"#)
            .contains("items[0].unit_price"));
        assert!(err(r#"{"currency":"EUR","items":[{"sku":"a","qty":1000,"unit_price":1000000000000}]}"#)
            .contains("items[0].line total"));
        assert!(err(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":1}],"x":1}"#)
            .contains("x is not a known field"));
        assert!(err(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":1},{"sku":"a","qty":1,"unit_price":1}]}"#)
            .contains("items[1].sku"));
    }

    #[test]
    fn the_unit_price_is_an_optional_guard() {
        let r = req(
            r#"{"currency":"EUR","items":[{"sku":"a","qty":1},{"sku":"b","qty":2,"unit_price":7},{"sku":"c","qty":1,"unit_price":null}]}"#,
        );
        let guards: Vec<_> = r.items.iter().map(|l| l.unit_price).collect();
        assert_eq!(guards, [None, Some(7), None]);
    }

    #[test]
    fn lines_take_the_catalog_price_and_a_guard_must_match_it() {
        let catalog = [stock("a", Some((500, "EUR"))), stock("b", Some((700, "EUR")))];
        let lines = req(r#"{"currency":"EUR","items":[{"sku":"a","qty":2},{"sku":"b","qty":1,"unit_price":700}]}"#)
            .price_lines(&catalog)
            .unwrap();
        assert_eq!(
            lines.iter().map(|l| (l.sku.as_str(), l.qty, l.unit_price)).collect::<Vec<_>>(),
            [("a", 2, 500), ("b", 1, 700)]
        );
        assert_eq!(amount_total(&lines).unwrap(), 1700);
        // A buyer-sent 0 is a guard like any other: it does not set the price.
        let (code, message) =
            refusal(req(r#"{"currency":"EUR","items":[{"sku":"b","qty":1,"unit_price":0}]}"#).price_lines(&catalog));
        assert_eq!(code, "price_changed");
        assert!(message.contains("sku b") && message.contains("700 EUR") && message.contains("not the 0"), "{message}");
    }

    #[test]
    fn a_sku_that_cannot_be_priced_is_refused_with_its_reason() {
        let catalog = [stock("eur", Some((500, "EUR"))), stock("usd", Some((500, "USD"))), stock("none", None)];
        let code = |body: &str| refusal(req(body).price_lines(&catalog));
        let (c, m) = code(r#"{"currency":"EUR","items":[{"sku":"eur","qty":1},{"sku":"usd","qty":1}]}"#);
        assert_eq!(c, "currency_mismatch");
        assert!(m.contains("sku usd") && m.contains("USD"), "{m}");
        let (c, m) = code(r#"{"currency":"EUR","items":[{"sku":"none","qty":1}]}"#);
        assert_eq!(c, "not_for_sale");
        assert!(m.contains("sku none"), "{m}");
        let (c, m) = code(r#"{"currency":"EUR","items":[{"sku":"gone","qty":1}]}"#);
        assert_eq!(c, "out_of_stock");
        assert!(m.contains("sku gone"), "{m}");
    }

    #[test]
    fn the_hash_ignores_formatting_but_not_content() {
        let a = req(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":5}]}"#);
        let b = req(
            "{ \"items\": [ {\"unit_price\":5, \"qty\":1, \"sku\":\"a\"} ], \"currency\":\"EUR\", \"user_id\":\"u\" }",
        );
        let c = req(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":2,"unit_price":5}]}"#);
        let no_guard = req(r#"{"currency":"EUR","items":[{"sku":"a","qty":1}]}"#);
        let null_guard = req(r#"{"currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":null}]}"#);
        assert_eq!(a.request_hash(), b.request_hash());
        assert_ne!(a.request_hash(), c.request_hash());
        assert_ne!(a.request_hash(), no_guard.request_hash());
        assert_eq!(no_guard.request_hash(), null_guard.request_hash());
    }

    #[test]
    fn the_hash_does_not_depend_on_the_order_of_the_lines() {
        let ab = req(
            r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":5},{"sku":"b","qty":2,"unit_price":7}]}"#,
        );
        let ba = req(
            r#"{"user_id":"u","currency":"EUR","items":[{"sku":"b","qty":2,"unit_price":7},{"sku":"a","qty":1,"unit_price":5}]}"#,
        );
        let other = req(
            r#"{"user_id":"u","currency":"EUR","items":[{"sku":"b","qty":1,"unit_price":7},{"sku":"a","qty":2,"unit_price":5}]}"#,
        );
        assert_eq!(ab.request_hash(), ba.request_hash());
        assert_ne!(ab.request_hash(), other.request_hash());
    }
}
