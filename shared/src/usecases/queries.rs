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
    json!({"sku": s.sku, "available": s.available, "reserved": s.reserved})
}

pub async fn put_stock<S: OrderStore>(store: &S, sku: &str, body: &[u8]) -> Result<Value, ApiError> {
    let sku = Sku::parse(sku).map_err(|e| ApiError::invalid(e.0))?;
    let obj = json_object(body)?;
    let count = |name: &str| -> Result<Option<i64>, ApiError> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_i64()
                .filter(|a| (0..=1_000_000_000).contains(a))
                .map(Some)
                .ok_or_else(|| ApiError::invalid(format!("{name} must be an integer from 0 to 1000000000"))),
        }
    };
    let available = count("available")?.ok_or_else(|| ApiError::invalid("available is required"))?;
    let expected = count("if_available")?;
    if store.put_stock(&sku, available, expected).await? == Cas::Rejected {
        let now = store.stock(&sku).await?.map(|s| s.available).unwrap_or(0);
        return Err(ApiError::conflict(
            "stock_changed",
            format!(
                "available is {now}, not the {} the request expected; read it again and retry",
                expected.unwrap_or(0)
            ),
        ));
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
    let coupon =
        Coupon { coupon_id, user_id, valid_until, state: CouponState::Available, locked_by: None, reason: None };
    match store.put_coupon(&coupon).await? {
        PutCoupon::Stored => Ok(coupon_view(&coupon)),
        PutCoupon::Locked => Err(ApiError::conflict(
            "coupon_locked",
            "the coupon is locked by an open order; try again once that order is paid or closed",
        )),
    }
}

pub async fn get_coupon<S: OrderStore>(store: &S, coupon_id: &str) -> Result<Value, ApiError> {
    let id = CouponId::parse(coupon_id).map_err(|_| ApiError::not_found(format!("coupon {coupon_id}")))?;
    let c = store.coupon(&id).await?.ok_or_else(|| ApiError::not_found(format!("coupon {coupon_id}")))?;
    Ok(coupon_view(&c))
}
