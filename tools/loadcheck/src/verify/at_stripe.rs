//! The Stripe side of the check: for each Stripe attempt of the run's
//! orders, its PaymentIntent and every refund of its charge, read back
//! from the Stripe server (`GET /v1/payment_intents/{id}`, `GET
//! /v1/refunds?charge=`). Read as raw JSON, like the rest of the check,
//! and not through the channel's own code (`shared/src/stripe/`), so that
//! a mistake there cannot hide a violation here.
//!
//! What Stripe says becomes the channel's rows of the check ([`ledger_rows`],
//! what the sandbox's ledger is for the sandbox), so the PAID order's
//! success, the funds identity and the refunds are judged on Stripe's own
//! figures by the same invariants. Two more are Stripe's ([`check`]): the
//! intent's state against the order's outcome (`stripe_intent_state`), and
//! the refunds at Stripe per charge (`stripe_refunds`).

use super::OrderRecords;
use crate::stack::Stack;
use crate::stripe::{charge_of, StripeApi};
use futures_util::{stream, StreamExt, TryStreamExt};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Instant;

/// One Stripe attempt as found at Stripe.
#[derive(Debug, Clone)]
pub struct StripeFact {
    pub order_id: String,
    pub payment_id: String,
    /// The attempt's `channel_ref` (none: never opened at Stripe).
    pub intent_id: Option<String>,
    /// The intent as retrieved; `None`: Stripe has no such intent.
    pub intent: Option<Value>,
    /// Every refund of the intent's charge at Stripe.
    pub refunds: Vec<Value>,
}

/// Reads every Stripe attempt of `orders` back from the stack's Stripe
/// server, at most `concurrency` calls at a time. `Err` when the run has
/// Stripe attempts and the server cannot be asked: the check cannot judge
/// them, which is no pass.
pub async fn read(
    stack: &Stack,
    orders: &BTreeMap<String, OrderRecords>,
    concurrency: usize,
) -> Result<Vec<StripeFact>, String> {
    let attempts: Vec<(String, String, Option<String>)> = orders
        .iter()
        .flat_map(|(id, r)| r.payments.iter().filter(|p| p["channel"] == "stripe").map(move |p| (id, p)))
        .map(|(id, p)| {
            let pid = p["payment_id"].as_str().unwrap_or_default().to_owned();
            (id.clone(), pid, p["channel_ref"].as_str().map(str::to_owned))
        })
        .collect();
    if attempts.is_empty() {
        return Ok(Vec::new());
    }
    let api = StripeApi::from_stack(stack, concurrency).ok_or(format!(
        "{} payment attempts of the run are Stripe's, and the stack names no Stripe server (STRIPE_SECRET_KEY)",
        attempts.len()
    ))?;
    let started = Instant::now();
    println!("stripe check: reading {} attempts' intents and refunds at {}", attempts.len(), api.base_url());
    let api = &api;
    let facts: Vec<StripeFact> = stream::iter(attempts)
        .map(|(order_id, payment_id, intent_id)| async move {
            let intent = match &intent_id {
                Some(pi) => api.intent(pi).await?,
                None => None,
            };
            let refunds = match intent.as_ref().and_then(charge_of) {
                Some(charge) => api.refunds_of(charge).await?,
                None => Vec::new(),
            };
            Ok::<_, String>(StripeFact { order_id, payment_id, intent_id, intent, refunds })
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect()
        .await?;
    println!("stripe check: read in {:.1} s: {}", started.elapsed().as_secs_f64(), api.progress());
    Ok(facts)
}

/// Stripe's figures as channel rows (`payment_id`, `order_id`, `status`
/// SUCCEEDED / FAILED / PROCESSING, `amount`, `currency`,
/// `refunded_amount`), under the attempt's own ids: an intent naming other
/// ids is `stripe_intent_state`'s finding.
pub fn ledger_rows(facts: &[StripeFact]) -> Vec<Value> {
    facts
        .iter()
        .filter_map(|f| {
            let pi = f.intent.as_ref()?;
            let status = match pi["status"].as_str() {
                Some("succeeded") => "SUCCEEDED",
                Some("canceled") => "FAILED",
                _ => "PROCESSING",
            };
            let received = pi["amount_received"].as_i64().filter(|a| *a > 0);
            let refunded: i64 =
                f.refunds.iter().filter(|r| r["status"] == "succeeded").filter_map(|r| r["amount"].as_i64()).sum();
            Some(json!({
                "payment_id": f.payment_id, "order_id": f.order_id, "status": status,
                "amount": received.or(pi["amount"].as_i64()),
                "currency": pi["currency"].as_str().map(str::to_ascii_uppercase),
                "refunded_amount": refunded,
            }))
        })
        .collect()
}

/// The two Stripe invariants over every fact read.
pub fn check(
    orders: &BTreeMap<String, OrderRecords>,
    facts: &[StripeFact],
    flag: &mut impl FnMut(&'static str, &str, String),
    counts: &mut BTreeMap<String, i64>,
    skipped: &mut BTreeMap<&'static str, String>,
) {
    if facts.is_empty() {
        for inv in ["stripe_intent_state", "stripe_refunds"] {
            skipped.insert(inv, "no order of the run has a Stripe attempt".into());
        }
        return;
    }
    for f in facts {
        let Some(r) = orders.get(&f.order_id) else { continue };
        let Some(order) = &r.order else { continue };
        let attempt = r.payments.iter().find(|p| p["payment_id"] == f.payment_id.as_str());
        let Some(attempt) = attempt else { continue };
        *counts.entry("stripe.attempts".into()).or_default() += 1;
        let paying = order["status"] == "PAID" && order["paid_by"] == f.payment_id.as_str();
        intent_state(f, order, attempt, paying, flag, counts);
        refunds_at_stripe(f, r, paying, flag, counts);
    }
}

/// `stripe_intent_state`: the intent exists, carries the attempt's ids and
/// amount, and is `succeeded` iff its success paid the order or was
/// refunded, `canceled` otherwise; none is left payable on a final order.
fn intent_state(
    f: &StripeFact,
    order: &Value,
    attempt: &Value,
    paying: bool,
    flag: &mut impl FnMut(&'static str, &str, String),
    counts: &mut BTreeMap<String, i64>,
) {
    const INV: &str = "stripe_intent_state";
    let (id, pid, ours) = (f.order_id.as_str(), f.payment_id.as_str(), attempt["status"].as_str().unwrap_or("?"));
    let Some(intent_id) = &f.intent_id else {
        if ours == "SUCCEEDED" {
            flag(INV, id, format!("attempt {pid} is SUCCEEDED and names no intent"));
        }
        *counts.entry("stripe.unopened".into()).or_default() += 1;
        return;
    };
    let Some(pi) = &f.intent else {
        return flag(INV, id, format!("attempt {pid}: Stripe has no intent {intent_id}"));
    };
    let status = pi["status"].as_str().unwrap_or("?");
    *counts.entry(format!("stripe.intent.{status}")).or_default() += 1;
    let meta = &pi["metadata"];
    if meta["payment_id"] != pid || meta["order_id"] != id {
        flag(INV, id, format!("intent {intent_id} of attempt {pid} carries metadata {meta}"));
    }
    let currency = pi["currency"].as_str().map(str::to_ascii_uppercase);
    if pi["amount"] != attempt["amount"] || currency.as_deref() != attempt["currency"].as_str() {
        flag(
            INV,
            id,
            format!(
                "intent {intent_id} is for {} {:?}, attempt {pid} for {} {}",
                pi["amount"], currency, attempt["amount"], attempt["currency"]
            ),
        );
    }
    let refunded = f.refunds.iter().any(|r| r["status"] == "succeeded");
    let order_status = order["status"].as_str().unwrap_or("?");
    match status {
        "succeeded" => {
            if ours != "SUCCEEDED" {
                flag(INV, id, format!("intent {intent_id} succeeded at Stripe; attempt {pid} is {ours}"));
            }
            let txn = attempt["channel_txn_id"].as_str();
            if txn.is_some() && txn != charge_of(pi) {
                flag(INV, id, format!("attempt {pid} names charge {txn:?}, the intent's is {:?}", charge_of(pi)));
            }
            if !paying && !refunded {
                flag(
                    INV,
                    id,
                    format!("intent {intent_id} succeeded; it neither paid the {order_status} order nor was refunded"),
                );
            }
        }
        "canceled" if paying => flag(INV, id, format!("the order is PAID by {pid}, whose intent Stripe has canceled")),
        "canceled" if ours == "SUCCEEDED" => flag(INV, id, format!("attempt {pid} is SUCCEEDED, its intent canceled")),
        "canceled" => {}
        _ if matches!(order_status, "PAID" | "CLOSED") => {
            flag(INV, id, format!("intent {intent_id} is still {status} at Stripe, payable on a {order_status} order"))
        }
        _ => {}
    }
}

/// `stripe_refunds`: a charge has at most one refund, succeeded, for the
/// whole amount, naming its payment, and the one our refund record names;
/// the paying charge has none.
fn refunds_at_stripe(
    f: &StripeFact,
    r: &OrderRecords,
    paying: bool,
    flag: &mut impl FnMut(&'static str, &str, String),
    counts: &mut BTreeMap<String, i64>,
) {
    const INV: &str = "stripe_refunds";
    let (id, pid) = (f.order_id.as_str(), f.payment_id.as_str());
    let Some(pi) = &f.intent else { return };
    let charge = charge_of(pi).unwrap_or("?");
    *counts.entry("stripe.refunds".into()).or_default() += f.refunds.len() as i64;
    if f.refunds.len() > 1 {
        flag(INV, id, format!("charge {charge} of {pid} has {} refunds at Stripe", f.refunds.len()));
    }
    if paying && !f.refunds.is_empty() {
        flag(INV, id, format!("charge {charge} paid the order and was refunded at Stripe"));
    }
    for refund in &f.refunds {
        let rid = refund["id"].as_str().unwrap_or("?");
        if refund["status"] != "succeeded" || refund["amount"] != pi["amount"] {
            flag(
                INV,
                id,
                format!(
                    "refund {rid} of {charge}: {} for {}, the intent was {}",
                    refund["status"], refund["amount"], pi["amount"]
                ),
            );
        }
        if refund["metadata"]["payment_id"].as_str().is_some_and(|p| p != pid) {
            flag(INV, id, format!("refund {rid} of {charge} names payment {}", refund["metadata"]["payment_id"]));
        }
    }
    let ours = r.refunds.iter().find(|x| x["payment_id"] == pid).and_then(|x| x["channel_refund_id"].as_str());
    if let Some(ours) = ours {
        if !f.refunds.iter().any(|x| x["id"] == ours) {
            flag(INV, id, format!("our refund of {pid} names {ours}, which is not a refund of {charge} at Stripe"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{broken, clean};
    use super::super::{check as check_all, OrderRecords};
    use super::*;

    /// The clean run plus `card`: PAID through Stripe (pi_1/ch_1), with a
    /// first intent pi_0 declined and cancelled when the second opened;
    /// and `lost`: CLOSED, paid at Stripe afterwards (pi_2/ch_2), refunded
    /// once.
    fn with_stripe() -> (super::super::Records, super::super::Scope) {
        let (mut r, mut scope) = clean();
        let history = |to: &str| {
            json!([{"at": "2026-11-30T10:00:00Z", "to": "PENDING_PAYMENT"},
                   {"at": "2026-11-30T10:00:05Z", "from": "PENDING_PAYMENT", "to": to}])
        };
        let order = |status: &str, paid_by: Option<&str>| {
            json!({"status": status, "expire_at": "2026-11-30T10:00:20.000Z", "amount_total": 700, "currency": "EUR",
                "items": [{"sku": "B", "qty": 1, "unit_price": 700}], "paid_by": paid_by, "history": history(status)})
        };
        let attempt = |pid: &str, status: &str, pi: &str, txn: Option<&str>| {
            json!({"payment_id": pid, "status": status, "amount": 700, "currency": "EUR", "channel": "stripe",
                "channel_ref": pi, "channel_txn_id": txn})
        };
        r.orders.insert(
            "card".into(),
            OrderRecords {
                order: Some(order("PAID", Some("p11"))),
                reservations: vec![json!({"sku": "B", "qty": 1, "status": "CONFIRMED"})],
                payments: vec![
                    attempt("p10", "FAILED", "pi_0", None),
                    attempt("p11", "SUCCEEDED", "pi_1", Some("ch_1")),
                ],
                ..Default::default()
            },
        );
        r.orders.insert(
            "lost".into(),
            OrderRecords {
                order: Some(order("CLOSED", None)),
                reservations: vec![json!({"sku": "B", "qty": 1, "status": "RELEASED"})],
                payments: vec![attempt("p12", "SUCCEEDED", "pi_2", Some("ch_2"))],
                refunds: vec![
                    json!({"payment_id": "p12", "status": "REFUNDED", "amount": 700, "channel_refund_id": "re_2"}),
                ],
                ..Default::default()
            },
        );
        r.stocks.insert("B".into(), Some(json!({"available": 4, "reserved": 0, "sold": 1})));
        scope.orders.extend(["card".to_owned(), "lost".to_owned()]);
        let intent = |pi: &str, status: &str, order: &str, pid: &str, charge: Option<&str>| {
            json!({"id": pi, "status": status, "amount": 700, "currency": "eur",
                "metadata": {"order_id": order, "payment_id": pid},
                "latest_charge": charge.map(|c| json!({"id": c, "object": "charge"}))})
        };
        let fact = |order: &str, pid: &str, pi: Value, refunds: Vec<Value>| StripeFact {
            order_id: order.into(),
            payment_id: pid.into(),
            intent_id: pi["id"].as_str().map(str::to_owned),
            intent: Some(pi),
            refunds,
        };
        r.stripe = vec![
            fact("card", "p10", intent("pi_0", "canceled", "card", "p10", Some("ch_0")), vec![]),
            fact("card", "p11", intent("pi_1", "succeeded", "card", "p11", Some("ch_1")), vec![]),
            fact(
                "lost",
                "p12",
                intent("pi_2", "succeeded", "lost", "p12", Some("ch_2")),
                vec![json!({"id": "re_2", "status": "succeeded", "amount": 700, "charge": "ch_2",
                    "metadata": {"payment_id": "p12"}})],
            ),
        ];
        (r, scope)
    }

    #[test]
    fn stripes_figures_stand_for_the_channel_and_a_clean_run_breaks_nothing() {
        let (r, scope) = with_stripe();
        assert_eq!(broken(&r, &scope), Vec::<&str>::new());
        let v = check_all(&r, &scope, super::super::tests::now());
        assert_eq!(v.counts["stripe.attempts"], 3);
        assert_eq!(v.counts["stripe.intent.succeeded"], 2);
        assert_eq!(v.counts["stripe.refunds"], 1);
        // Without Stripe's rows the PAID order has no success to show.
        let (mut r, scope) = with_stripe();
        r.stripe.clear();
        assert!(broken(&r, &scope).contains(&"paid_without_success"));
        assert!(check_all(&r, &scope, super::super::tests::now()).skipped.contains_key("stripe_refunds"));
    }

    #[test]
    fn a_refund_at_stripe_of_the_paying_charge_or_a_second_one_is_caught() {
        // Refunded behind the system's back: the order keeps goods it
        // gave the money back for.
        let (mut r, scope) = with_stripe();
        r.stripe[1].refunds.push(json!({"id": "re_x", "status": "succeeded", "amount": 700, "metadata": {}}));
        assert_eq!(broken(&r, &scope), ["funds_identity", "stripe_refunds"]);
        // A late success refunded twice.
        let (mut r, scope) = with_stripe();
        let mut again = r.stripe[2].refunds[0].clone();
        again["id"] = json!("re_3");
        r.stripe[2].refunds.push(again);
        assert!(broken(&r, &scope).contains(&"stripe_refunds"));
        // Our record names a refund Stripe does not have.
        let (mut r, scope) = with_stripe();
        r.orders.get_mut("lost").unwrap().refunds[0]["channel_refund_id"] = json!("re_elsewhere");
        assert_eq!(broken(&r, &scope), ["stripe_refunds"]);
    }

    #[test]
    fn an_intent_left_payable_unrefunded_foreign_or_missing_is_caught() {
        // The superseded intent was never cancelled: still payable.
        let (mut r, scope) = with_stripe();
        r.stripe[0].intent.as_mut().unwrap()["status"] = json!("requires_payment_method");
        assert_eq!(broken(&r, &scope), ["stripe_intent_state"]);
        // The late success never refunded, at Stripe or here.
        let (mut r, scope) = with_stripe();
        r.stripe[2].refunds.clear();
        r.orders.get_mut("lost").unwrap().refunds.clear();
        let found = broken(&r, &scope);
        assert!(found.contains(&"stripe_intent_state") && found.contains(&"success_unaccounted"), "{found:?}");
        // The intent names another order.
        let (mut r, scope) = with_stripe();
        r.stripe[1].intent.as_mut().unwrap()["metadata"]["order_id"] = json!("someone-elses");
        assert_eq!(broken(&r, &scope), ["stripe_intent_state"]);
        // Stripe has no such intent: no success to show either.
        let (mut r, scope) = with_stripe();
        r.stripe[1].intent = None;
        assert_eq!(broken(&r, &scope), ["funds_identity", "paid_without_success", "stripe_intent_state"]);
        // PAID by an intent Stripe cancelled.
        let (mut r, scope) = with_stripe();
        r.stripe[1].intent.as_mut().unwrap()["status"] = json!("canceled");
        let found = broken(&r, &scope);
        assert!(found.contains(&"stripe_intent_state") && found.contains(&"paid_without_success"), "{found:?}");
    }
}
