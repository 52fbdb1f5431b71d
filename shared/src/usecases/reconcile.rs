//! Reconciliation (seed 000 §12, seed 003 §06): cross-checks orders,
//! payment attempts, refunds and reservations against the channel's own
//! ledger, and reports every discrepancy by kind. It only reads.

use crate::aws::sandbox::LedgerEntry;
use crate::domain::*;
use crate::store::OrderRecord;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// Every kind of discrepancy the report can hold.
pub const KINDS: [&str; 7] = [
    "channel_success_order_unpaid",
    "order_paid_without_channel_success",
    "amount_mismatch",
    "success_after_close_without_refund",
    "refund_state_mismatch",
    "reservation_released_on_paid_order",
    "funds_identity_violation",
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Discrepancy {
    pub kind: &'static str,
    pub order_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_id: Option<String>,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub orders_checked: usize,
    pub payments_checked: usize,
    /// Orders whose refunds are still REFUND_PENDING: the funds identity is
    /// checked once they drain.
    pub refunds_pending: usize,
    pub counts: BTreeMap<&'static str, usize>,
    pub discrepancies: Vec<Discrepancy>,
}

/// Compares the local records with the channel's ledger.
pub fn reconcile(records: &[OrderRecord], ledger: &[LedgerEntry]) -> Report {
    let by_payment: HashMap<&str, &LedgerEntry> = ledger.iter().map(|e| (e.payment_id.as_str(), e)).collect();
    let mut out = Vec::new();
    let mut push = |kind, order: &OrderId, payment: Option<&PaymentId>, detail: String| {
        out.push(Discrepancy {
            kind,
            order_id: order.to_string(),
            payment_id: payment.map(|p| p.to_string()),
            detail,
        })
    };
    let mut payments_checked = 0;
    let mut refunds_pending = 0;
    let known_orders: HashMap<&str, &OrderRecord> = records.iter().map(|r| (r.order.order_id.as_str(), r)).collect();

    for r in records {
        let o = &r.order;
        let (mut paid, mut refunded) = (0i64, 0i64);
        let mut pending_refund = false;
        for p in &r.payments {
            payments_checked += 1;
            let entry = by_payment.get(p.payment_id.as_str()).copied();
            let refund = r.refunds.iter().find(|f| f.payment_id == p.payment_id);
            let channel_success = entry.is_some_and(|e| e.status == PaymentStatus::Succeeded);
            if let Some(e) = entry {
                if e.amount != p.amount || e.currency != p.currency {
                    push("amount_mismatch", &o.order_id, Some(&p.payment_id),
                        format!("channel {} {}, attempt {} {}", e.amount, e.currency, p.amount, p.currency));
                }
                if channel_success {
                    paid += e.amount;
                }
                refunded += e.refunded_amount;
            }
            if channel_success {
                let is_the_payment = o.paid_by.as_ref() == Some(&p.payment_id);
                match o.status {
                    OrderStatus::PendingPayment | OrderStatus::Closing => push(
                        "channel_success_order_unpaid", &o.order_id, Some(&p.payment_id),
                        format!("channel says paid, order is {}", o.status.as_str())),
                    OrderStatus::Closed | OrderStatus::Paid if !is_the_payment && refund.is_none() => push(
                        "success_after_close_without_refund", &o.order_id, Some(&p.payment_id),
                        format!("money taken for a {} order without a refund", o.status.as_str())),
                    _ => {}
                }
            }
            if let Some(f) = refund {
                let channel_refunded = entry.is_some_and(|e| e.refund_id.is_some());
                match (f.status, channel_refunded) {
                    (RefundStatus::Refunded, false) => push("refund_state_mismatch", &o.order_id, Some(&p.payment_id),
                        "refund REFUNDED locally, not at the channel".into()),
                    (RefundStatus::RefundPending | RefundStatus::RefundFailed, true) => push("refund_state_mismatch", &o.order_id, Some(&p.payment_id),
                        format!("refund {} locally, refunded at the channel", f.status.as_str())),
                    (RefundStatus::RefundPending, false) => pending_refund = true,
                    _ => {}
                }
            } else if entry.is_some_and(|e| e.refund_id.is_some()) {
                push("refund_state_mismatch", &o.order_id, Some(&p.payment_id), "refunded at the channel with no local refund".into());
            }
        }
        if o.status == OrderStatus::Paid {
            let paid_by = o.paid_by.as_ref();
            let ok = paid_by
                .and_then(|p| by_payment.get(p.as_str()))
                .is_some_and(|e| e.status == PaymentStatus::Succeeded);
            if !ok {
                push("order_paid_without_channel_success", &o.order_id, paid_by,
                    "order PAID but the channel has no success for its payment".into());
            }
            for res in r.reservations.iter().filter(|x| x.status == ReservationStatus::Released) {
                push("reservation_released_on_paid_order", &o.order_id, None,
                    format!("reservation of {} RELEASED on a PAID order", res.sku));
            }
        }
        if pending_refund {
            refunds_pending += 1;
            continue;
        }
        // The funds identity (seed 003 §06): closed ⇒ paid − refunded = 0;
        // paid ⇒ paid − refunded = the order amount.
        let net = paid - refunded;
        let expected = match o.status {
            OrderStatus::Closed => Some(0),
            OrderStatus::Paid => Some(o.amount_total),
            _ => None,
        };
        if let Some(expected) = expected {
            if net != expected {
                push("funds_identity_violation", &o.order_id, None,
                    format!("{} order: paid {paid} − refunded {refunded} = {net}, expected {expected}", o.status.as_str()));
            }
        }
    }
    // Money at the channel for an order we do not know at all.
    for e in ledger {
        if e.status == PaymentStatus::Succeeded && !known_orders.contains_key(e.order_id.as_str()) {
            push("channel_success_order_unpaid", &e.order_id, Some(&e.payment_id), "channel success for an unknown order".into());
        }
    }
    let mut counts: BTreeMap<&'static str, usize> = KINDS.iter().map(|k| (*k, 0)).collect();
    for d in &out {
        *counts.entry(d.kind).or_default() += 1;
    }
    Report { orders_checked: records.len(), payments_checked, refunds_pending, counts, discrepancies: out }
}
