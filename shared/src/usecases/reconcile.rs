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

/// The kinds that need no channel data.
pub const LOCAL_KINDS: [&str; 1] = ["reservation_released_on_paid_order"];

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
    /// False when no channel ledger was available: only local checks ran.
    pub channel_checked: bool,
    pub payments_checked: usize,
    /// Orders whose refunds are still REFUND_PENDING: the funds identity is
    /// checked once they drain.
    pub refunds_pending: usize,
    pub counts: BTreeMap<&'static str, usize>,
    pub discrepancies: Vec<Discrepancy>,
}

/// Compares the local records with the channel's ledger. Without a ledger
/// (no channel configured) only the checks that need no channel data run.
pub fn reconcile(records: &[OrderRecord], ledger: Option<&[LedgerEntry]>) -> Report {
    let channel_checked = ledger.is_some();
    let ledger = ledger.unwrap_or_default();
    let by_payment: HashMap<&str, &LedgerEntry> = ledger.iter().map(|e| (e.payment_id.as_str(), e)).collect();
    let mut out = Vec::new();
    let mut push = |kind, order: &OrderId, payment: Option<&PaymentId>, detail: String| {
        out.push(Discrepancy { kind, order_id: order.to_string(), payment_id: payment.map(|p| p.to_string()), detail })
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
                    push(
                        "amount_mismatch",
                        &o.order_id,
                        Some(&p.payment_id),
                        format!("channel {} {}, attempt {} {}", e.amount, e.currency, p.amount, p.currency),
                    );
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
                        "channel_success_order_unpaid",
                        &o.order_id,
                        Some(&p.payment_id),
                        format!("channel says paid, order is {}", o.status.as_str()),
                    ),
                    OrderStatus::Closed | OrderStatus::Paid if !is_the_payment && refund.is_none() => push(
                        "success_after_close_without_refund",
                        &o.order_id,
                        Some(&p.payment_id),
                        format!("money taken for a {} order without a refund", o.status.as_str()),
                    ),
                    _ => {}
                }
            }
            if let Some(f) = refund {
                let channel_refunded = entry.is_some_and(|e| e.refund_id.is_some());
                match (f.status, channel_refunded) {
                    (RefundStatus::Refunded, false) => push(
                        "refund_state_mismatch",
                        &o.order_id,
                        Some(&p.payment_id),
                        "refund REFUNDED locally, not at the channel".into(),
                    ),
                    (RefundStatus::RefundPending | RefundStatus::RefundFailed, true) => push(
                        "refund_state_mismatch",
                        &o.order_id,
                        Some(&p.payment_id),
                        format!("refund {} locally, refunded at the channel", f.status.as_str()),
                    ),
                    (RefundStatus::RefundPending, false) => pending_refund = true,
                    _ => {}
                }
            } else if entry.is_some_and(|e| e.refund_id.is_some()) {
                push(
                    "refund_state_mismatch",
                    &o.order_id,
                    Some(&p.payment_id),
                    "refunded at the channel with no local refund".into(),
                );
            }
        }
        if o.status == OrderStatus::Paid {
            let paid_by = o.paid_by.as_ref();
            let ok =
                paid_by.and_then(|p| by_payment.get(p.as_str())).is_some_and(|e| e.status == PaymentStatus::Succeeded);
            if !ok {
                push(
                    "order_paid_without_channel_success",
                    &o.order_id,
                    paid_by,
                    "order PAID but the channel has no success for its payment".into(),
                );
            }
            for res in r.reservations.iter().filter(|x| x.status == ReservationStatus::Released) {
                push(
                    "reservation_released_on_paid_order",
                    &o.order_id,
                    None,
                    format!("reservation of {} RELEASED on a PAID order", res.sku),
                );
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
                push(
                    "funds_identity_violation",
                    &o.order_id,
                    None,
                    format!(
                        "{} order: paid {paid} − refunded {refunded} = {net}, expected {expected}",
                        o.status.as_str()
                    ),
                );
            }
        }
    }
    // Money at the channel for an order we do not know at all.
    for e in ledger {
        if e.status == PaymentStatus::Succeeded && !known_orders.contains_key(e.order_id.as_str()) {
            push(
                "channel_success_order_unpaid",
                &e.order_id,
                Some(&e.payment_id),
                "channel success for an unknown order".into(),
            );
        }
    }
    if !channel_checked {
        out.retain(|d| LOCAL_KINDS.contains(&d.kind));
    }
    let mut counts: BTreeMap<&'static str, usize> = KINDS.iter().map(|k| (*k, 0)).collect();
    for d in &out {
        *counts.entry(d.kind).or_default() += 1;
    }
    Report {
        orders_checked: records.len(),
        payments_checked,
        refunds_pending,
        channel_checked,
        counts,
        discrepancies: out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::sandbox::Faults;
    use crate::store::{PaymentAttempt, Refund, Reservation};

    fn order(id: &str, status: OrderStatus, paid_by: Option<&str>) -> Order {
        Order {
            order_id: OrderId::parse(id).unwrap(),
            user_id: UserId::parse("u").unwrap(),
            status,
            version: 3,
            currency: Currency::parse("EUR").unwrap(),
            items: vec![],
            amount_total: 500,
            coupon_id: None,
            created_at: Timestamp::from_unix_millis(0),
            expire_at: Timestamp::from_unix_millis(1),
            expiry_rule_version: "v".into(),
            payment_attempts: 1,
            closing: None,
            paid_by: paid_by.map(|p| PaymentId::parse(p).unwrap()),
            history: vec![],
            checks: vec![],
        }
    }

    fn attempt(order: &str, pay: &str, status: PaymentStatus) -> PaymentAttempt {
        PaymentAttempt {
            payment_id: PaymentId::parse(pay).unwrap(),
            order_id: OrderId::parse(order).unwrap(),
            channel: ChannelName::parse("sandbox").unwrap(),
            amount: 500,
            currency: Currency::parse("EUR").unwrap(),
            status,
            channel_txn_id: None,
            created_at: Timestamp::from_unix_millis(0),
            evidence: vec![],
        }
    }

    fn ledger(order: &str, pay: &str, status: PaymentStatus, refunded: bool) -> LedgerEntry {
        LedgerEntry {
            payment_id: PaymentId::parse(pay).unwrap(),
            order_id: OrderId::parse(order).unwrap(),
            merchant_id: "m".into(),
            amount: 500,
            currency: Currency::parse("EUR").unwrap(),
            status,
            channel_txn_id: Some(format!("t-{pay}")),
            refund_id: refunded.then(|| format!("r-{pay}")),
            refunded_amount: if refunded { 500 } else { 0 },
            faults: Faults::default(),
        }
    }

    fn refund(order: &str, pay: &str, status: RefundStatus) -> Refund {
        Refund {
            payment_id: PaymentId::parse(pay).unwrap(),
            order_id: OrderId::parse(order).unwrap(),
            channel: ChannelName::parse("sandbox").unwrap(),
            amount: 500,
            currency: Currency::parse("EUR").unwrap(),
            status,
            reason: "late".into(),
            tries: 0,
            created_at: Timestamp::from_unix_millis(0),
            refunded_at: None,
            channel_refund_id: None,
            last_error: None,
            notification: "n".into(),
        }
    }

    fn record(o: Order, payments: Vec<PaymentAttempt>, refunds: Vec<Refund>, released: bool) -> OrderRecord {
        let reservations = vec![Reservation {
            sku: Sku::parse("A").unwrap(),
            qty: 1,
            status: if released { ReservationStatus::Released } else { ReservationStatus::Confirmed },
        }];
        OrderRecord { order: o, reservations, coupon_lock: None, payments, refunds }
    }

    #[test]
    fn clean_paid_and_refunded_late_orders_report_nothing() {
        let records = vec![
            record(
                order("o1", OrderStatus::Paid, Some("p1")),
                vec![attempt("o1", "p1", PaymentStatus::Succeeded)],
                vec![],
                false,
            ),
            record(
                order("o2", OrderStatus::Closed, None),
                vec![attempt("o2", "p2", PaymentStatus::Succeeded)],
                vec![refund("o2", "p2", RefundStatus::Refunded)],
                true,
            ),
            record(
                order("o3", OrderStatus::Closed, None),
                vec![attempt("o3", "p3", PaymentStatus::Failed)],
                vec![],
                true,
            ),
        ];
        let ledger = vec![
            ledger("o1", "p1", PaymentStatus::Succeeded, false),
            ledger("o2", "p2", PaymentStatus::Succeeded, true),
            ledger("o3", "p3", PaymentStatus::Failed, false),
        ];
        let report = reconcile(&records, Some(&ledger));
        assert_eq!(report.discrepancies, vec![], "{report:?}");
        assert_eq!((report.orders_checked, report.payments_checked), (3, 3));
    }

    #[test]
    fn each_kind_is_reported() {
        let mut mismatched = ledger("o3", "p3", PaymentStatus::Succeeded, false);
        mismatched.amount = 499;
        let records = vec![
            record(
                order("o1", OrderStatus::PendingPayment, None),
                vec![attempt("o1", "p1", PaymentStatus::Processing)],
                vec![],
                false,
            ),
            record(
                order("o2", OrderStatus::Paid, Some("p2")),
                vec![attempt("o2", "p2", PaymentStatus::Succeeded)],
                vec![],
                false,
            ),
            record(
                order("o3", OrderStatus::Paid, Some("p3")),
                vec![attempt("o3", "p3", PaymentStatus::Succeeded)],
                vec![],
                false,
            ),
            record(
                order("o4", OrderStatus::Closed, None),
                vec![attempt("o4", "p4", PaymentStatus::Succeeded)],
                vec![],
                true,
            ),
            record(
                order("o5", OrderStatus::Closed, None),
                vec![attempt("o5", "p5", PaymentStatus::Succeeded)],
                vec![refund("o5", "p5", RefundStatus::Refunded)],
                true,
            ),
            record(
                order("o6", OrderStatus::Paid, Some("p6")),
                vec![attempt("o6", "p6", PaymentStatus::Succeeded)],
                vec![],
                true,
            ),
        ];
        let ledger = vec![
            ledger("o1", "p1", PaymentStatus::Succeeded, false),
            ledger("o2", "p2", PaymentStatus::Processing, false),
            mismatched,
            ledger("o4", "p4", PaymentStatus::Succeeded, false),
            ledger("o5", "p5", PaymentStatus::Succeeded, false),
            ledger("o6", "p6", PaymentStatus::Succeeded, false),
        ];
        let report = reconcile(&records, Some(&ledger));
        let has = |kind: &str, order: &str| report.discrepancies.iter().any(|d| d.kind == kind && d.order_id == order);
        assert!(has("channel_success_order_unpaid", "o1"));
        assert!(has("order_paid_without_channel_success", "o2"));
        assert!(has("amount_mismatch", "o3"));
        assert!(has("success_after_close_without_refund", "o4"));
        assert!(has("funds_identity_violation", "o4"));
        assert!(has("refund_state_mismatch", "o5"));
        assert!(has("reservation_released_on_paid_order", "o6"));
        for kind in KINDS {
            assert!(report.counts[kind] >= 1, "{kind}: {report:?}");
        }
        // Without the channel's ledger, only what the records alone show.
        let local = reconcile(&records, None);
        assert!(!local.channel_checked);
        let kinds: Vec<&str> = local.discrepancies.iter().map(|d| d.kind).collect();
        assert_eq!(kinds, ["reservation_released_on_paid_order"]);
    }

    #[test]
    fn a_pending_refund_defers_the_funds_identity() {
        let records = vec![record(
            order("o1", OrderStatus::Closed, None),
            vec![attempt("o1", "p1", PaymentStatus::Succeeded)],
            vec![refund("o1", "p1", RefundStatus::RefundPending)],
            true,
        )];
        let report = reconcile(&records, Some(&[ledger("o1", "p1", PaymentStatus::Succeeded, false)]));
        assert_eq!(report.discrepancies, vec![]);
        assert_eq!(report.refunds_pending, 1);
    }
}
