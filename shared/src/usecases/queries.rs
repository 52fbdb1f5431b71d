//! Reads and operator seeding: order views, stock and coupons.

use crate::domain::*;
use crate::error::{json_object, ApiError};
use crate::store::{Cas, Coupon, OrderRecord, OrderStore, PutCoupon};
use serde_json::{json, Value};

/// The buyer's view of an order.
pub fn order_view(r: &OrderRecord) -> Value {
    let o = &r.order;
    let items: Vec<Value> = o
        .items
        .iter()
        .map(|l| {
            let reservation = r.reservations.iter().find(|res| res.sku == l.sku).map(|res| res.status);
            json!({"sku": l.sku, "qty": l.qty, "unit_price": l.unit_price, "reservation": reservation})
        })
        .collect();
    let mut v = json!({
        "order_id": o.order_id,
        "status": o.status,
        "created_at": o.created_at,
        "expire_at": o.expire_at,
        "amount_total": o.amount_total,
        "currency": o.currency,
        "items": items,
        "payments": r.payments.iter().map(|p| json!({
            "payment_id": p.payment_id, "channel": p.channel, "amount": p.amount,
            "currency": p.currency, "status": p.status,
        })).collect::<Vec<_>>(),
        "refunds": r.refunds.iter().map(|f| json!({
            "payment_id": f.payment_id, "amount": f.amount, "currency": f.currency,
            "status": f.status, "notification": f.notification,
        })).collect::<Vec<_>>(),
    });
    if let Some(lock) = &r.coupon_lock {
        let mut c = json!({"coupon_id": lock.coupon_id, "state": lock.status});
        if let Some(reason) = &lock.reason {
            c["reason"] = json!(reason);
        }
        v["coupon"] = c;
    }
    v
}

/// The operator's view: everything, including the audit trail, the closing
/// lease, every attempt with the channel evidence seen, and refunds.
pub fn admin_order_view(r: &OrderRecord) -> Value {
    let mut v = order_view(r);
    let o = &r.order;
    v["user_id"] = json!(o.user_id);
    v["version"] = json!(o.version);
    v["expiry_rule_version"] = json!(o.expiry_rule_version);
    v["payment_attempts"] = json!(o.payment_attempts);
    v["closing"] = json!(o.closing);
    v["paid_by"] = json!(o.paid_by);
    v["history"] = json!(o.history);
    v["checks"] = json!(o.checks);
    v["reservations"] = json!(r.reservations);
    v["coupon_lock"] = json!(r.coupon_lock);
    v["payments"] = json!(r.payments);
    v["refunds"] = json!(r.refunds);
    v
}

fn stock_view(s: &crate::store::Stock) -> Value {
    json!({
        "sku": s.sku, "available": s.available, "reserved": s.reserved, "sold": s.sold,
        "price": s.price, "currency": s.currency,
    })
}

/// Upper bound of an operator's stock count or adjustment.
const MAX_STOCK: i64 = 1_000_000_000;

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

impl StockChange {
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let obj = json_object(body)?;
        let known = ["available", "if_available", "adjust", "price", "currency"];
        if let Some(k) = obj.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(ApiError::invalid(format!("{k} is not a known field")));
        }
        let int = |name: &str, range: std::ops::RangeInclusive<i64>| -> Result<Option<i64>, ApiError> {
            match obj.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_i64().filter(|a| range.contains(a)).map(Some).ok_or_else(|| {
                    ApiError::invalid(format!("{name} must be an integer from {} to {}", range.start(), range.end()))
                }),
            }
        };
        let available = int("available", 0..=MAX_STOCK)?;
        let expected = int("if_available", 0..=MAX_STOCK)?;
        let adjust = int("adjust", -MAX_STOCK..=MAX_STOCK)?;
        let amount = int("price", 0..=money::MAX_AMOUNT)?;
        let currency = match obj.get("currency") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => Some(Currency::parse(c.clone()).map_err(|e| ApiError::invalid(e.0))?),
            Some(_) => return Err(ApiError::invalid("currency must be a string (ISO 4217, e.g. \"EUR\")")),
        };
        let price = match (amount, currency) {
            (Some(a), Some(c)) => Some(Price::new(a, c).map_err(|e| ApiError::invalid(e.0))?),
            (Some(_), None) => return Err(ApiError::invalid("currency is required with price")),
            (None, Some(_)) => return Err(ApiError::invalid("price is required with currency")),
            (None, None) => None,
        };
        match (available, expected, adjust, price) {
            (Some(available), None, None, Some(price)) => Ok(Self::Seed { available, price }),
            (Some(_), None, None, None) => Err(ApiError::invalid(
                "price and currency are required with available to seed a new SKU (a live SKU's count changes \
                 with if_available or adjust)",
            )),
            (Some(available), Some(expected), None, None) => Ok(Self::Swap { available, expected }),
            (None, None, Some(0), None) => Err(ApiError::invalid("adjust must not be 0")),
            (None, None, Some(d), None) => Ok(Self::Adjust(d)),
            (None, None, None, Some(price)) => Ok(Self::Reprice(price)),
            (_, Some(_), _, Some(_)) | (_, _, Some(_), Some(_)) => Err(ApiError::invalid(
                "price and currency change a live SKU on their own, not with if_available or adjust",
            )),
            (None, Some(_), None, None) => Err(ApiError::invalid("if_available needs available")),
            (None, None, None, None) => Err(ApiError::invalid(
                "send available with price and currency (a new SKU), available with if_available, adjust, or \
                 price with currency",
            )),
            _ => Err(ApiError::invalid("send either available (with optional if_available) or adjust, not both")),
        }
    }
}

/// PUT /admin/skus/{sku}. A live SKU's count is only changed relative to
/// what the operator saw (`if_available`) or by an amount (`adjust`), never
/// overwritten: orders reserve and release stock concurrently, and a blind
/// set would silently create or destroy units. A price change touches only
/// the price: open orders keep theirs, and the counts are left alone.
pub async fn put_stock<S: OrderStore>(store: &S, sku: &str, body: &[u8]) -> Result<Value, ApiError> {
    let sku = Sku::parse(sku).map_err(|e| ApiError::invalid(e.0))?;
    let change = StockChange::parse(body)?;
    let applied = match &change {
        StockChange::Seed { available, price } => store.seed_stock(&sku, *available, price).await?,
        StockChange::Swap { available, expected } => store.swap_stock(&sku, *available, *expected).await?,
        StockChange::Adjust(d) => store.adjust_stock(&sku, *d).await?,
        StockChange::Reprice(price) => store.set_price(&sku, price).await?,
    };
    if applied == Cas::Rejected {
        // The write changed nothing; this read only explains why.
        let now = store.stock(&sku).await?;
        return Err(match (change, now) {
            (StockChange::Seed { .. }, Some(s)) => ApiError::conflict(
                "stock_exists",
                format!(
                    "sku {sku} already exists (available {}, reserved {}); send if_available with the count you \
                     read, or adjust with a relative change (price with currency changes its price)",
                    s.available, s.reserved
                ),
            ),
            (StockChange::Swap { expected, .. }, Some(s)) => ApiError::conflict(
                "stock_changed",
                format!(
                    "available is {}, not the {expected} the request expected; read it again and retry",
                    s.available
                ),
            ),
            (StockChange::Adjust(d), Some(s)) => ApiError::conflict(
                "insufficient_stock",
                format!("available is {}; adjusting by {d} would make it negative", s.available),
            ),
            // The only condition of a price change is that the SKU exists.
            (StockChange::Reprice(_), Some(_)) => {
                ApiError::Internal(crate::ports::Unavailable::new("set price", "refused on an existing sku"))
            }
            (_, None) => ApiError::not_found(format!(
                "sku {sku} (seed it with {{\"available\": N, \"price\": P, \"currency\": \"EUR\"}})"
            )),
        });
    }
    let stock = store.stock(&sku).await?.ok_or_else(|| ApiError::not_found(format!("sku {sku}")))?;
    Ok(stock_view(&stock))
}

pub async fn get_stock<S: OrderStore>(store: &S, sku: &str) -> Result<Value, ApiError> {
    let sku = Sku::parse(sku).map_err(|_| ApiError::not_found(format!("sku {sku}")))?;
    let stock = store.stock(&sku).await?.ok_or_else(|| ApiError::not_found(format!("sku {sku}")))?;
    Ok(stock_view(&stock))
}

fn coupon_view(c: &Coupon) -> Value {
    let mut v = json!({"coupon_id": c.coupon_id, "state": c.state, "user_id": c.user_id, "valid_until": c.valid_until});
    if let Some(r) = &c.reason {
        v["reason"] = json!(r);
    }
    if let Some(o) = &c.locked_by {
        v["locked_by"] = json!(o);
    }
    v["returnable"] = json!(c.returnable);
    v
}

pub async fn put_coupon<S: OrderStore>(store: &S, coupon_id: &str, body: &[u8]) -> Result<Value, ApiError> {
    let coupon_id = CouponId::parse(coupon_id).map_err(|e| ApiError::invalid(e.0))?;
    let obj = json_object(body)?;
    let user_id = obj
        .get("user_id")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("user_id is required and must be a string"))
        .and_then(|u| UserId::parse(u).map_err(|e| ApiError::invalid(e.0)))?;
    let valid_until = obj
        .get("valid_until")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("valid_until is required (RFC 3339, e.g. 2030-01-01T00:00:00Z)"))
        .and_then(|t| Timestamp::parse(t).map_err(|e| ApiError::invalid(format!("valid_until: {e}"))))?;
    let returnable = match obj.get("returnable") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid("returnable must be true or false")),
    };
    if let Some(k) = obj.keys().find(|k| !["user_id", "valid_until", "returnable"].contains(&k.as_str())) {
        return Err(ApiError::invalid(format!("{k} is not a known field")));
    }
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
        PutCoupon::Stored => Ok(coupon_view(&coupon)),
        PutCoupon::Locked => Err(ApiError::conflict(
            "coupon_locked",
            "the coupon is locked by an open order; try again once that order is paid or closed",
        )),
        PutCoupon::Final(state) => Err(ApiError::conflict(
            "coupon_final",
            format!(
                "the coupon is {} and keeps that outcome; issue a new coupon_id instead",
                serde_json::to_value(state).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
            ),
        )),
    }
}

pub async fn get_coupon<S: OrderStore>(store: &S, coupon_id: &str) -> Result<Value, ApiError> {
    let id = CouponId::parse(coupon_id).map_err(|_| ApiError::not_found(format!("coupon {coupon_id}")))?;
    let c = store.coupon(&id).await?.ok_or_else(|| ApiError::not_found(format!("coupon {coupon_id}")))?;
    Ok(coupon_view(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eur(amount: i64) -> Price {
        Price::new(amount, Currency::parse("EUR").unwrap()).unwrap()
    }

    fn err(body: &str) -> String {
        match StockChange::parse(body.as_bytes()) {
            Err(ApiError::Refused { code: "invalid_request", message, .. }) => message,
            other => panic!("expected invalid_request, got {other:?}"),
        }
    }

    #[test]
    fn the_stock_forms_parse() {
        let parse = |b: &str| StockChange::parse(b.as_bytes()).unwrap();
        assert_eq!(
            parse(r#"{"available": 5, "price": 1299, "currency": "EUR"}"#),
            StockChange::Seed { available: 5, price: eur(1299) }
        );
        assert_eq!(parse(r#"{"available": 5, "if_available": 3}"#), StockChange::Swap { available: 5, expected: 3 });
        assert_eq!(parse(r#"{"adjust": -2}"#), StockChange::Adjust(-2));
        assert_eq!(parse(r#"{"price": 0, "currency": "EUR"}"#), StockChange::Reprice(eur(0)));
    }

    #[test]
    fn every_refused_stock_form_names_its_field() {
        assert!(err(r#"{"available": 5}"#).contains("price and currency are required"));
        assert!(err(r#"{"available": 5, "price": 1}"#).contains("currency is required"));
        assert!(err(r#"{"currency": "EUR"}"#).contains("price is required"));
        assert!(err(r#"{"price": -1, "currency": "EUR"}"#).starts_with("price must be an integer"));
        assert!(err(r#"{"price": 12.5, "currency": "EUR"}"#).starts_with("price must be an integer"));
        assert!(err(r#"{"price": "1299", "currency": "EUR"}"#).starts_with("price must be an integer"));
        assert!(err(r#"{"price": 1000000000001, "currency": "EUR"}"#).starts_with("price must be an integer"));
        assert!(err(r#"{"price": 1, "currency": "eur"}"#).starts_with("currency must be"));
        assert!(err(r#"{"price": 1, "currency": 978}"#).starts_with("currency must be"));
        assert!(err(r#"{"price": 1, "currency": "EUR", "adjust": 1}"#).contains("not with if_available or adjust"));
        assert!(err(r#"{"price": 1, "currency": "EUR", "available": 1, "if_available": 0}"#)
            .contains("not with if_available or adjust"));
        assert!(err(r#"{"price": 1, "currency": "EUR", "cost": 1}"#).starts_with("cost is not a known field"));
        assert!(err(r#"{"available": -1, "price": 1, "currency": "EUR"}"#).starts_with("available must be"));
        assert!(err(r#"{"if_available": 1}"#).contains("if_available needs available"));
        assert!(err(r#"{"adjust": 0}"#).starts_with("adjust must not be 0"));
        assert!(err("{}").contains("price with currency"));
    }
}
