//! Refunds in the effects backstop (infra/data-model.md, "The due index"):
//! a REFUND_PENDING refund is in the due index under its order's `FX#`
//! shard, a re-drive pushes it forward, and the write that leaves
//! REFUND_PENDING takes it out. On DynamoDB Local.

use order_core::aws::dynamo::{keys, s, DynamoStore};
use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::create_order::CreateOrder;
use order_core::usecases::refunds::{process_refund, RefundOutcome, MAX_REFUND_TRIES, REFUND_REDRIVE_AFTER};
use serde_json::json;
use std::time::Duration;
use system_tests::fakes::{FixedClock, ScriptedChannel};
use system_tests::fixtures::eur;
use system_tests::CreateAsNamed;
use system_tests::{dynamodb_local, fresh_table};

const T0: i64 = 1_800_000_000_000;

/// A REFUND_PENDING refund created at `clock`'s time: the order closed
/// and a success for its payment arrived afterwards.
async fn late_refund(clock: &FixedClock) -> (DynamoStore, Refund) {
    let store = fresh_table(&dynamodb_local().await).await;
    system_tests::fixtures::seed_stock(&store, &Sku::parse("A").unwrap(), 10, &eur(100)).await.unwrap();
    let create = CreateOrder {
        store: store.clone(),
        clock: Box::new(clock.clone()),
        ids: Box::new(RandomIds),
        window: Duration::from_secs(60),
        expiry_rule_version: "t".into(),
        open_order_cap: None,
    };
    let body = json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "A", "qty": 1, "unit_price": 100}]});
    let order = create.execute_as_named(Some("k1"), body.to_string().as_bytes()).await.unwrap().order;
    let a = system_tests::fixtures::processing_attempt(&order, clock.now());
    assert_eq!(store.record_attempt(&order, &a).await.unwrap(), AttemptResult::Recorded);
    let order = store.order(&order.order_id).await.unwrap().unwrap();
    let lease =
        ClosingLease { started_at: order.expire_at, owner: "w".into(), lease_until: order.expire_at, resumes: 0 };
    assert_eq!(store.begin_closing(&order, &lease, order.expire_at).await.unwrap(), Cas::Applied);
    let closing = store.order(&order.order_id).await.unwrap().unwrap();
    assert_eq!(store.close_after_check(&closing, order.expire_at, "t").await.unwrap(), Cas::Applied);
    let closed = store.order(&order.order_id).await.unwrap().unwrap();
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

struct DecliningChannel;
#[async_trait::async_trait]
impl PaymentChannel for DecliningChannel {
    async fn open(&self, _: &PaymentAttempt, _: &str) -> Result<OpenedPayment, Unavailable> {
        Ok(OpenedPayment::default())
    }
    async fn query(&self, _: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        Ok(ChannelPayment::NotFound)
    }
    async fn cancel(&self, _: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        Ok(ChannelPayment::NotFound)
    }
    async fn refund(&self, _: &PaymentAttempt, _: i64, _: &str) -> Result<RefundResult, Unavailable> {
        Ok(RefundResult::Failed("declined".into()))
    }
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
    for _ in 1..MAX_REFUND_TRIES {
        let out = process_refund(&store, &DecliningChannel, &clock, &refund.order_id, &refund.payment_id).await;
        assert!(matches!(out.unwrap(), RefundOutcome::RetryAfter(_)));
        assert_eq!(backstop_entry(&store, &refund).await, due, "a counted try stays PENDING, stays in");
    }
    let out = process_refund(&store, &DecliningChannel, &clock, &refund.order_id, &refund.payment_id).await;
    assert!(matches!(out.unwrap(), RefundOutcome::GiveUp(_)));
    let failed = store.refund(&refund.order_id, &refund.payment_id).await.unwrap().unwrap();
    assert_eq!(failed.status, RefundStatus::RefundFailed);
    assert_eq!(backstop_entry(&store, &refund).await, None, "REFUND_FAILED is a person's, not the sweep's");
    assert_eq!(store.redrive_refund(&failed, clock.now()).await.unwrap(), Cas::Rejected);
}
