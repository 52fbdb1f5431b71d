//! Refunds in the effects backstop
//! (docs/data-model.md#the-due-index-gsi-due-index-open-orders-and-pending-effects):
//! a REFUND_PENDING refund is in the due index under its order's `FX#`
//! shard, a re-drive pushes it forward, and the write that leaves
//! REFUND_PENDING takes it out. On DynamoDB Local.

use order_core::aws::dynamo::{keys, s, DynamoStore};
use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::refunds::{process_refund, RefundOutcome, MAX_REFUND_TRIES, REFUND_REDRIVE_AFTER};
use std::time::Duration;
use system_tests::fakes::{FixedChannel, FixedClock, ScriptedChannel};
use system_tests::fixtures::{self, open_order, record_attempt, T0};
use system_tests::{dynamodb_local, fresh_table};

/// A REFUND_PENDING refund created at `clock`'s time: the order closed
/// and a success for its payment arrived afterwards.
async fn late_refund(clock: &FixedClock) -> (DynamoStore, Refund) {
    let store = fresh_table(&dynamodb_local().await).await;
    let order = open_order(&store, clock).await;
    let a = record_attempt(&store, &order, clock.now()).await;
    let order = store.order(&order.order_id).await.unwrap().unwrap();
    let closed = fixtures::close_at_expiry(&store, &order).await;
    clock.set(order.expire_at.unix_millis() + 5_000);
    let ev = Evidence { at: clock.now(), source: "late".into(), status: PaymentStatus::Succeeded, detail: None };
    assert_eq!(store.settle_success(&closed, &a, "tx-late", ev, None, "n").await.unwrap(), SettleResult::RefundPending);
    let refund = store.refund(&order.order_id, &a.payment_id).await.unwrap().unwrap();
    assert_eq!(refund.order_version, closed.version, "the refund names the order version it was decided on");
    (store, refund)
}

/// The `due_at` of the refund's entry in its `FX#` shard, if it is there.
async fn backstop_entry(store: &DynamoStore, refund: &Refund) -> Option<String> {
    let shard = keys::effects_shard(&refund.order_id, store.shards().count);
    let out = store
        .client()
        .query()
        .table_name(store.table())
        .index_name("due-index")
        .key_condition_expression("due_shard = :s AND due_at <= :end")
        .expression_attribute_values(":s", s(shard))
        .expression_attribute_values(":end", s("9999-12-31T23:59:59.999Z"))
        .send()
        .await
        .unwrap();
    let sk = keys::refund_sk(&refund.payment_id);
    out.items
        .unwrap_or_default()
        .into_iter()
        .find(|i| i.get("sk").and_then(|v| v.as_s().ok()) == Some(&sk))
        .map(|i| i["due_at"].as_s().unwrap().clone())
}

/// A channel that knows no payment and declines every refund.
fn declining() -> FixedChannel {
    FixedChannel::answering(ChannelPayment::NotFound, ChannelPayment::NotFound).refusing_refunds("declined")
}

#[tokio::test]
async fn a_pending_refund_is_in_the_backstop_moves_on_redrive_and_leaves_when_refunded() {
    let clock = FixedClock::at(T0);
    let (store, refund) = late_refund(&clock).await;
    let created = refund.created_at;
    assert_eq!(
        backstop_entry(&store, &refund).await,
        Some(created.plus(REFUND_REDRIVE_AFTER).to_string()),
        "created REFUND_PENDING, due one retry budget later"
    );

    let redrive_at = created.plus(REFUND_REDRIVE_AFTER).plus(Duration::from_secs(30));
    assert_eq!(store.redrive_refund(&refund, redrive_at).await.unwrap(), Cas::Applied);
    assert_eq!(
        backstop_entry(&store, &refund).await,
        Some(redrive_at.plus(REFUND_REDRIVE_AFTER).to_string()),
        "a re-drive pushes it forward by the budget"
    );

    let channel = ScriptedChannel::default();
    let out = process_refund(&store, &channel, &clock, &refund.order_id, &refund.payment_id).await.unwrap();
    assert_eq!(out, RefundOutcome::Refunded);
    assert_eq!(backstop_entry(&store, &refund).await, None, "REFUNDED leaves the index in the same write");
    assert_eq!(store.redrive_refund(&refund, redrive_at).await.unwrap(), Cas::Rejected, "nothing to re-drive");
    assert_eq!(backstop_entry(&store, &refund).await, None);
}

#[tokio::test]
async fn a_refund_that_gives_up_leaves_the_backstop_and_failed_tries_keep_it_in() {
    let clock = FixedClock::at(T0);
    let (store, refund) = late_refund(&clock).await;
    let due = backstop_entry(&store, &refund).await;
    assert!(due.is_some());
    let declining = declining();
    for _ in 1..MAX_REFUND_TRIES {
        let out = process_refund(&store, &declining, &clock, &refund.order_id, &refund.payment_id).await;
        assert!(matches!(out.unwrap(), RefundOutcome::RetryAfter(_)));
        assert_eq!(backstop_entry(&store, &refund).await, due, "a counted try stays PENDING, stays in");
    }
    let out = process_refund(&store, &declining, &clock, &refund.order_id, &refund.payment_id).await;
    assert!(matches!(out.unwrap(), RefundOutcome::GiveUp(_)));
    let failed = store.refund(&refund.order_id, &refund.payment_id).await.unwrap().unwrap();
    assert_eq!(failed.status, RefundStatus::RefundFailed);
    assert_eq!(backstop_entry(&store, &refund).await, None, "REFUND_FAILED is a person's, not the sweep's");
    assert_eq!(store.redrive_refund(&failed, clock.now()).await.unwrap(), Cas::Rejected);
}
