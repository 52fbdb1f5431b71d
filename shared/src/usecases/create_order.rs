//! POST /orders: validate, then one transaction that writes the order, its
//! reservations and coupon lock, and the idempotency key.

use crate::domain::money::line_total;
use crate::domain::*;
use crate::error::{json_object, ApiError};
use crate::ports::{Clock, IdGen};
use crate::store::{CreateResult, IdempotencyClaim, OrderStore};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::time::Duration;
use tracing::{info, instrument};

/// Upper bounds that keep one order inside one DynamoDB transaction
/// (100 items: key + order + 2 per line + 2 for the coupon).
pub const MAX_LINES: usize = 40;
pub const MAX_QTY: u64 = 1000;

/// The request after validation. Its JSON form is the canonical body the
/// idempotency hash is taken over, so formatting differences between two
/// retries of the same request do not count as a different body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CreateOrderRequest {
    pub user_id: UserId,
    pub currency: Currency,
    pub items: Vec<OrderLine>,
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
        let mut items: Vec<OrderLine> = Vec::with_capacity(raw_items.len());
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
            let unit_price = line.get("unit_price").and_then(Value::as_i64).filter(|p| *p >= 0).ok_or_else(|| {
                ApiError::invalid(format!("{at}unit_price must be a non-negative integer in minor units"))
            })?;
            if items.iter().any(|l| l.sku == sku) {
                return Err(ApiError::invalid(format!(
                    "{at}sku repeats an earlier line; put the quantity on one line"
                )));
            }
            line_total(qty as u32, unit_price).map_err(|e| ApiError::invalid(format!("{at}{}", e.0)))?;
            items.push(OrderLine { sku, qty: qty as u32, unit_price });
        }
        let req = Self { user_id, currency, items, coupon_id };
        req.amount_total()?;
        Ok(req)
    }

    pub fn amount_total(&self) -> Result<i64, ApiError> {
        self.items.iter().try_fold(0i64, |acc, l| {
            let t = line_total(l.qty, l.unit_price).map_err(|e| ApiError::invalid(e.0))?;
            acc.checked_add(t)
                .filter(|t| *t <= money::MAX_AMOUNT)
                .ok_or_else(|| ApiError::invalid("the order total is too large"))
        })
    }

    /// Lines are hashed sorted by SKU (a SKU appears once per order), so
    /// a retry that lists the same lines in another order is the same
    /// request.
    pub fn request_hash(&self) -> String {
        let mut canonical = self.clone();
        canonical.items.sort_by(|a, b| a.sku.cmp(&b.sku));
        hex::encode(Sha256::digest(serde_json::to_vec(&canonical).expect("serialisable")))
    }
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
        let now = self.clock.now();
        let order = Order {
            order_id: OrderId::parse(self.ids.new_id("ord", now)).expect("generated ids are valid"),
            user_id: req.user_id.clone(),
            status: OrderStatus::PendingPayment,
            version: 1,
            currency: req.currency.clone(),
            amount_total: req.amount_total()?,
            items: req.items.clone(),
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
        let claim = IdempotencyClaim { user_id: req.user_id.clone(), key, request_hash: req.request_hash() };
        match self.store.create_order(&order, &claim).await? {
            CreateResult::Created => {
                info!(order_id = %order.order_id, expire_at = %order.expire_at, amount = order.amount_total, "order created");
                Ok(Created { order, replayed: false })
            }
            CreateResult::Replay { order_id, same_request: true } => {
                let order = self.store.order(&order_id).await?.ok_or_else(|| {
                    crate::ports::Unavailable::new("idempotent replay", "order of the key is missing")
                })?;
                info!(order_id = %order.order_id, "idempotent replay");
                Ok(Created { order, replayed: true })
            }
            CreateResult::Replay { .. } => Err(ApiError::conflict(
                "idempotency_key_reused",
                "this Idempotency-Key was already used with a different request body; use a new key for a new order",
            )),
            CreateResult::OutOfStock(sku) => Err(ApiError::conflict(
                "out_of_stock",
                format!("not enough stock for sku {sku} (or no such sku); lower the quantity or remove the line"),
            )),
            CreateResult::CouponUnavailable => Err(ApiError::conflict(
                "coupon_unavailable",
                "the coupon does not exist, belongs to another user, is expired or is in use; order without coupon_id",
            )),
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
        assert!(err(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":1}],"x":1}"#)
            .contains("x is not a known field"));
        assert!(err(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":1},{"sku":"a","qty":1,"unit_price":1}]}"#)
            .contains("items[1].sku"));
    }

    #[test]
    fn the_hash_ignores_formatting_but_not_content() {
        let a = CreateOrderRequest::parse(
            &u(),
            br#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":5}]}"#,
        )
        .unwrap();
        let b = CreateOrderRequest::parse(
            &u(),
            b"{ \"items\": [ {\"unit_price\":5, \"qty\":1, \"sku\":\"a\"} ], \"currency\":\"EUR\", \"user_id\":\"u\" }",
        )
        .unwrap();
        let c = CreateOrderRequest::parse(
            &u(),
            br#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":2,"unit_price":5}]}"#,
        )
        .unwrap();
        assert_eq!(a.request_hash(), b.request_hash());
        assert_ne!(a.request_hash(), c.request_hash());
        assert_eq!(c.amount_total().unwrap(), 10);
    }

    #[test]
    fn the_hash_does_not_depend_on_the_order_of_the_lines() {
        let ab = CreateOrderRequest::parse(
            &u(),
            br#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":5},{"sku":"b","qty":2,"unit_price":7}]}"#,
        )
        .unwrap();
        let ba = CreateOrderRequest::parse(
            &u(),
            br#"{"user_id":"u","currency":"EUR","items":[{"sku":"b","qty":2,"unit_price":7},{"sku":"a","qty":1,"unit_price":5}]}"#,
        )
        .unwrap();
        let other = CreateOrderRequest::parse(
            &u(),
            br#"{"user_id":"u","currency":"EUR","items":[{"sku":"b","qty":1,"unit_price":7},{"sku":"a","qty":2,"unit_price":5}]}"#,
        )
        .unwrap();
        assert_eq!(ab.request_hash(), ba.request_hash());
        assert_ne!(ab.request_hash(), other.request_hash());
    }
}
