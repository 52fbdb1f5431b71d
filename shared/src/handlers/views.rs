//! Typed answers of the use cases as the JSON the HTTP routes send. The
//! only place an order, a stock row, a coupon or a payment attempt is
//! shaped for a client; the OpenAPI examples show these shapes.

use crate::domain::*;
use crate::usecases::close_order::CloseOutcome;
use crate::usecases::force_check::ForceCheck;
use crate::usecases::my_orders::OrderList;
use crate::usecases::order_reads::{Held, OrderRead};
use crate::usecases::payments::PaymentStarted;
use serde_json::{json, Value};

/// The buyer's view of an order.
pub fn order_view(r: &OrderRecord) -> Value {
    let o = &r.order;
    let items: Vec<Value> = o
        .items
        .iter()
        .map(|l| {
            let reservation = r
                .reservations
                .iter()
                .find(|res| res.resource_type == ResourceType::Stock && res.sku().as_ref() == Some(&l.sku))
                .map(|res| res.status);
            json!({"sku": l.sku, "qty": l.qty, "unit_price": l.unit_price, "reservation": reservation})
        })
        .collect();
    let mut v = json!({
        "order_id": o.order_id,
        "status": o.status,
        "created_at": o.created_at,
        "expire_at": o.expire_at,
        "expiry_rule_version": o.expiry_rule_version,
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
    if o.points > 0 {
        v["points"] = json!(o.points);
    }
    if let Some(at) = o.cancel_requested_at {
        v["cancel_requested_at"] = json!(at);
    }
    if o.status == OrderStatus::Closed {
        v["close_reason"] = json!(o.close_reason());
    }
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
    if let Some(at) = o.expiring_soon_at {
        // When the heads-up pass noticed it (OrderExpiringSoon published).
        v["expiring_soon_at"] = json!(at);
    }
    v["history"] = json!(o.history);
    v["checks"] = json!(o.checks);
    v["reservations"] = r.reservations.iter().map(|r| holding_view(r, None)).collect();
    v["coupon_lock"] = json!(r.coupon_lock);
    v["payments"] = json!(r.payments);
    v["refunds"] = json!(r.refunds);
    v
}

/// `POST /orders/{id}/cancel`: the buyer's view of the order as the cancel
/// left it.
pub fn cancelled(r: &OrderRecord, now: Timestamp) -> Value {
    let mut v = order_view(r);
    v["expired_awaiting_close"] = json!(!r.order.status.is_final() && now >= r.order.expire_at);
    v
}

/// `GET /orders`: a page of the buyer's orders.
pub fn order_list(list: &OrderList, next_cursor: Option<String>) -> Value {
    let orders: Vec<Value> = list
        .orders
        .iter()
        .map(|l| {
            let o = &l.summary;
            let mut v = json!({
                "order_id": o.order_id, "status": o.status, "created_at": o.created_at,
                "expire_at": o.expire_at, "amount_total": o.amount_total, "currency": o.currency,
                "seconds_left": l.seconds_left, "expired_awaiting_close": l.expired_awaiting_close,
            });
            if let Some(at) = o.cancel_requested_at {
                v["cancel_requested_at"] = json!(at);
            }
            if o.status == OrderStatus::Closed {
                v["close_reason"] = json!(CloseReason::of(o.cancel_requested_at));
            }
            v
        })
        .collect();
    let mut v = json!({ "orders": orders });
    if let Some(c) = next_cursor {
        v["next_cursor"] = json!(c);
    }
    v
}

/// A SKU's stock row and catalog price.
pub fn stock(s: &Stock) -> Value {
    let mut v = json!({
        "sku": s.sku, "available": s.available, "reserved": s.reserved, "sold": s.sold,
        "price": s.price, "currency": s.currency,
    });
    if let Some(limit) = s.purchase_limit {
        v["purchase_limit"] = json!(limit);
    }
    if let Some(category) = &s.category {
        v["category"] = json!(category);
    }
    if !s.tags.is_empty() {
        v["tags"] = json!(s.tags);
    }
    v
}

/// A coupon as the operator routes show it.
pub fn coupon(c: &Coupon) -> Value {
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

/// `GET /orders/{id}` (the buyer's view) or `GET /admin/orders/{id}` (the
/// operator's, with what the order still holds).
pub fn order_read(read: &OrderRead) -> Value {
    let mut view = match &read.held {
        Some(_) => admin_order_view(&read.record),
        None => order_view(&read.record),
    };
    view["expired_awaiting_close"] = json!(read.expired_awaiting_close);
    if let Some(held) = &read.held {
        view["held"] = held_view(held);
    }
    view
}

/// One holding as the admin view shows it: its kind and key, the SKU when
/// it is of one, the quantity (units, points, or 1 slot) and its status.
pub fn holding_view(r: &Reservation, since: Option<&Timestamp>) -> Value {
    let mut v = json!({
        "resource_type": r.resource_type,
        "resource_key": r.resource_key,
        "qty": r.qty,
        "status": r.status,
    });
    if let Some(sku) = r.sku() {
        v["sku"] = json!(sku);
    }
    if let Some(since) = since {
        v["since"] = json!(since);
    }
    v
}

/// A published version of the expiry rules.
pub fn expiry_rules(set: &crate::domain::expiry_rules::ExpiryRuleSet) -> Value {
    use crate::domain::expiry_rules::RuleTarget;
    let rules: Vec<Value> = set
        .rules
        .iter()
        .map(|r| match &r.applies_to {
            RuleTarget::Sku(s) => json!({"sku": s, "window_seconds": r.window_seconds}),
            RuleTarget::Category(c) => json!({"category": c, "window_seconds": r.window_seconds}),
            RuleTarget::Tag(t) => json!({"tag": t, "window_seconds": r.window_seconds}),
        })
        .collect();
    json!({
        "version": set.version,
        "expiry_rule_version": set.version_name(),
        "default_seconds": set.default_seconds,
        "rules": rules,
        "published_at": set.published_at,
        "published_by": set.published_by,
    })
}

/// A buyer's points balance.
pub fn points_balance(b: &crate::domain::points::PointsBalance) -> Value {
    json!({
        "user_id": b.user_id,
        "currency": b.currency,
        "available": b.available,
        "held": b.held,
        "spent": b.spent,
        "credited": b.credited,
        "changes": b.changes,
    })
}

/// A buyer's points balance with its audited credits, oldest first.
pub fn points(v: &crate::usecases::points::PointsView) -> Value {
    let mut out = points_balance(&v.balance);
    out["credits"] = v
        .credits
        .iter()
        .map(|c| json!({"key": c.key, "credit": c.delta, "reason": c.reason, "by": c.by, "at": c.at}))
        .collect();
    out
}

fn held_view(h: &Held) -> Value {
    let reservations: Vec<Value> = h.reservations.iter().map(|(r, since)| holding_view(r, Some(since))).collect();
    let coupon = h.coupon.as_ref().map(|(coupon_id, since)| json!({"coupon_id": coupon_id, "since": since}));
    let refunds_pending: Vec<Value> = h
        .refunds_pending
        .iter()
        .map(|(payment_id, since, tries)| json!({"payment_id": payment_id, "since": since, "tries": tries}))
        .collect();
    json!({
        "reservations": reservations,
        "coupon": coupon,
        "refunds_pending": refunds_pending,
        "effects_pending": h.effects_pending,
        "effects_pending_since": h.effects_pending_since,
        "effects_pending_seconds": h.effects_pending_seconds,
    })
}

/// A payment attempt as the buyer sees it.
pub fn payment_attempt(a: &PaymentAttempt) -> Value {
    json!({
        "payment_id": a.payment_id, "order_id": a.order_id, "channel": a.channel,
        "amount": a.amount, "currency": a.currency, "status": a.status,
    })
}

/// What payment entry answers: the attempt, and for a channel the buyer
/// confirms with its own libraries (Stripe.js, the mobile SDKs), the
/// intent's `client_secret` with the stack's publishable key.
pub fn checkout(s: &PaymentStarted, publishable_key: Option<&str>) -> Value {
    let mut v = payment_attempt(&s.attempt);
    if let Some(secret) = &s.client_secret {
        v["client_secret"] = json!(secret);
        if let Some(pk) = publishable_key {
            v["publishable_key"] = json!(pk);
        }
    }
    v
}

/// What an operator's check found and did.
pub fn force_check(c: &ForceCheck) -> Value {
    let mut v = json!({
        "order_id": c.order_id,
        "found": c.check.found,
        "outcome": c.check.outcome,
        "status": c.check.status,
        "checked_at": c.check.at,
        "checked_by": c.check.by,
    });
    if let CloseOutcome::RemindedLater { after, why } = &c.outcome {
        v["retry_after_seconds"] = json!(after.as_secs());
        v["why"] = json!(why);
    }
    v
}

/// The order as `POST /orders` answers it (new or replayed).
pub fn created_order(o: &Order) -> Value {
    let mut v = json!({
        "order_id": o.order_id, "status": o.status, "expire_at": o.expire_at,
        "expiry_rule_version": o.expiry_rule_version,
        "amount_total": o.amount_total, "currency": o.currency, "items": o.items,
    });
    if o.points > 0 {
        v["points"] = json!(o.points);
    }
    v
}
