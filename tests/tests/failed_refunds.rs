//! Refunds given up on (REFUND_FAILED) on DynamoDB Local: a person's
//! resolution is final (a redrive of the dead-letter queue never refunds a
//! resolved refund again), reconciles cleanly against the channel, and
//! works for refunds given up on before the failed refunds' partition.

use order_core::aws::dynamo::{keys, n, s, DynamoStore};
use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::reconcile::{reconcile, Bounds};
use order_core::usecases::refunds::{process_refund, RefundOutcome};
use std::sync::atomic::Ordering;
use system_tests::fakes::{FixedChannel, FixedClock};
use system_tests::fixtures::{open_order, paid_twice, T0};
use system_tests::{dynamodb_local, fresh_table};

/// A channel whose refunds go through, counting them.
fn accepting() -> FixedChannel {
    FixedChannel::answering(ChannelPayment::Pending, ChannelPayment::Failed)
}

/// A paid order with a second, late success: one REFUND_PENDING refund.
async fn pending_refund(store: &DynamoStore, clock: &FixedClock) -> Refund {
    let order = open_order(store, clock).await;
    let (attempts, _, second) = paid_twice(store, clock, &order).await;
    assert_eq!(second, SettleResult::RefundPending);
    store.refund(&order.order_id, &attempts[1].payment_id).await.unwrap().unwrap()
}

/// The runbook's two ways out of RefundsFailedAlarm do
/// not compose: refund A is refunded by hand and resolved (`orderctl
/// refunds resolve`), refund B's cause is fixed and `orderctl redrive
/// refund-dlq` is run — which moves every message of the DLQ, A's too.
/// `process_refund` only stops at REFUNDED, so the resolved A goes to the
/// channel again under its key: a second refund of the same payment (the
/// hand refund was not made under that key). Had the channel refused, A
/// would be back in FAILED#REFUND with the alarm, `resolved_by` still set.
#[tokio::test]
async fn a_resolved_failed_refund_that_comes_back_from_the_dlq_is_not_refunded_again() {
    let clock = FixedClock::at(T0);
    let store = fresh_table(&dynamodb_local().await).await;
    let pending = pending_refund(&store, &clock).await;
    let now = clock.now();
    assert_eq!(
        store.update_refund(&pending, RefundStatus::RefundFailed, None, Some("card closed"), now).await.unwrap(),
        Cas::Applied
    );
    let failed = store.refund(&pending.order_id, &pending.payment_id).await.unwrap().unwrap();
    assert_eq!(
        store.resolve_failed_refund(&failed, "ops", "refunded by hand, re_manual_1", now).await.unwrap(),
        Cas::Applied
    );
    // The dead letter of A, redriven with B's.
    let channel = accepting();
    let out = process_refund(&store, &channel, &clock, &pending.order_id, &pending.payment_id).await.unwrap();
    assert_eq!(
        channel.refunds.load(Ordering::SeqCst),
        0,
        "a refund a person resolved (refunded by hand) was sent to the channel again: {out:?}"
    );
    assert!(!matches!(out, RefundOutcome::Refunded));
}

/// A refund given up on before give-ups were kept in `FAILED#REFUND` (the
/// old write took it out of the index) is not listed, but a person can
/// still resolve it, and it is never tried again afterwards.
#[tokio::test]
async fn a_refund_given_up_before_the_failed_refunds_partition_can_still_be_resolved() {
    let clock = FixedClock::at(T0);
    let store = fresh_table(&dynamodb_local().await).await;
    let pending = pending_refund(&store, &clock).await;
    // What the old give-up wrote: REFUND_FAILED, out of the index.
    store
        .client()
        .update_item()
        .table_name(store.table())
        .key("pk", s(keys::order(&pending.order_id)))
        .key("sk", s(keys::refund_sk(&pending.payment_id)))
        .update_expression("SET #status = :failed, tries = :t REMOVE due_shard, due_at")
        .expression_attribute_names("#status", "status")
        .expression_attribute_values(":failed", s(RefundStatus::RefundFailed.as_str()))
        .expression_attribute_values(":t", n(5))
        .send()
        .await
        .unwrap();
    let failed = store.refund(&pending.order_id, &pending.payment_id).await.unwrap().unwrap();
    assert_eq!(
        store.resolve_failed_refund(&failed, "ops", "refunded by hand", clock.now()).await.unwrap(),
        Cas::Applied
    );
    let channel = accepting();
    process_refund(&store, &channel, &clock, &pending.order_id, &pending.payment_id).await.unwrap();
    assert_eq!(channel.refunds.load(Ordering::SeqCst), 0);
}

/// A person resolves a REFUND_FAILED refund the runbook's
/// way ("refund by hand at the provider, then resolve"): the refund stays
/// REFUND_FAILED by design, so every later reconciliation against the
/// channel's statement (which now shows the payment refunded) reports
/// `refund_state_mismatch` — a permanent alarm for a case that was dealt
/// with, and the final state cannot be reconciled from the records (the
/// resolution is not read by reconcile at all).
#[tokio::test]
async fn a_refund_resolved_by_hand_reconciles_cleanly_against_the_channel() {
    let clock = FixedClock::at(T0);
    let store = fresh_table(&dynamodb_local().await).await;
    let pending = pending_refund(&store, &clock).await;
    let now = clock.now();
    store.update_refund(&pending, RefundStatus::RefundFailed, None, Some("card closed"), now).await.unwrap();
    let failed = store.refund(&pending.order_id, &pending.payment_id).await.unwrap().unwrap();
    assert_eq!(
        store.resolve_failed_refund(&failed, "ops", "refunded by hand, re_manual_1", now).await.unwrap(),
        Cas::Applied
    );

    let snapshot = store.scan_snapshot().await.unwrap();
    let record = snapshot.orders.iter().find(|r| r.order.order_id == pending.order_id).unwrap();
    // The channel's ledger: both payments succeeded, the late one refunded by hand.
    let lines = record
        .payments
        .iter()
        .map(|p| StatementLine {
            payment_id: p.payment_id.clone(),
            order_id: p.order_id.clone(),
            amount: p.amount,
            currency: p.currency.clone(),
            status: PaymentStatus::Succeeded,
            refund_id: (p.payment_id == pending.payment_id).then(|| "re_manual_1".to_owned()),
            refunded_amount: if p.payment_id == pending.payment_id { p.amount } else { 0 },
            created_at: None,
        })
        .collect();
    let statement = Statement { since: None, until: None, lines };
    let report = reconcile(&snapshot, Some(&statement), &Bounds::default(), clock.now());
    let found: Vec<String> = report.discrepancies.iter().map(|d| format!("{}: {}", d.kind, d.detail)).collect();
    assert!(found.is_empty(), "a refund dealt with by a person is reported every run: {found:?}");
}
