//! Writes whose answer is lost after the write was applied: DynamoDB Local
//! behind the `LostAnswers` interceptor, which lets a request through and
//! replaces its answer with a 500, so the SDK sends the same conditional
//! write again and the re-send's condition fails on the item the first one
//! already changed. The code must read that as its own write (Applied), not
//! as somebody else's.

use aws_sdk_dynamodb::Client;
use order_core::aws::dynamo::DynamoStore;
use order_core::aws::lost_answers::LostAnswers;
use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::close_order::CloseOutcome;
use order_core::usecases::refunds::{process_refund, RefundOutcome, MAX_REFUND_TRIES};
use std::time::Duration;
use system_tests::fakes::{FixedChannel, FixedClock, RecordedReminders, ScriptedChannel};
use system_tests::fixtures::{self, open_order, paid_twice, record_attempt, T0};
use system_tests::{dynamodb_local, fresh_table};

/// The same table through a client that loses the answers of the next
/// `count` calls of `operation`.
async fn losing(store: &DynamoStore, operation: &str, count: usize) -> (DynamoStore, LostAnswers) {
    let lost = LostAnswers::next(operation, count);
    let base = dynamodb_local().await;
    let conf = base.config().to_builder().interceptor(lost.clone()).build();
    (DynamoStore::new(Client::from_conf(conf), store.table()), lost)
}

/// A channel that refuses every refund.
fn refusing() -> FixedChannel {
    FixedChannel::answering(ChannelPayment::Pending, ChannelPayment::Failed).refusing_refunds("card closed")
}

#[tokio::test]
async fn a_refund_give_up_whose_answer_is_lost_still_hands_the_refund_to_a_person() {
    let clock = FixedClock::at(T0);
    let store = fresh_table(&dynamodb_local().await).await;
    let order = open_order(&store, &clock).await;
    let (attempts, _, second) = paid_twice(&store, &clock, &order).await;
    assert_eq!(second, SettleResult::RefundPending);
    let refund = store.refund(&order.order_id, &attempts[1].payment_id).await.unwrap().unwrap();
    for i in 0..MAX_REFUND_TRIES - 1 {
        let now = store.refund(&refund.order_id, &refund.payment_id).await.unwrap().unwrap();
        let at = Timestamp::from_unix_millis(T0 + i64::from(i));
        assert_eq!(store.update_refund(&now, now.status, None, Some("declined"), at).await.unwrap(), Cas::Applied);
    }
    // The last try's give-up write is applied and its answer lost.
    let (losing_store, lost) = losing(&store, "UpdateItem", 1).await;
    let out = process_refund(&losing_store, &refusing(), &clock, &refund.order_id, &refund.payment_id).await.unwrap();
    assert_eq!(lost.lost(), 1, "the give-up's answer was lost and the SDK sent it again");
    let now = store.refund(&refund.order_id, &refund.payment_id).await.unwrap().unwrap();
    assert_eq!(now.status, RefundStatus::RefundFailed);
    assert!(
        matches!(out, RefundOutcome::GiveUp(_)),
        "its own give-up, read back as somebody else's, would write no dead letter: {out:?}"
    );
    // The state the alarm counts: the refund waits for a person until one
    // resolves it, whatever happened to the give-up's answer.
    let waiting = store.failed_refunds().await.unwrap();
    assert_eq!(waiting, [(refund.order_id.clone(), refund.payment_id.clone())]);
    let at = Timestamp::from_unix_millis(T0 + 100);
    assert_eq!(store.resolve_failed_refund(&now, "ops", "refunded by hand, re_1", at).await.unwrap(), Cas::Applied);
    assert!(store.failed_refunds().await.unwrap().is_empty(), "resolved: the alarm's count drops to 0");
    let resolved = store.refund(&refund.order_id, &refund.payment_id).await.unwrap().unwrap();
    assert_eq!(resolved.status, RefundStatus::RefundFailed, "a resolution records, it does not rewrite the outcome");
    assert_eq!(store.resolve_failed_refund(&resolved, "ops", "again", at).await.unwrap(), Cas::Rejected);
}

#[tokio::test]
async fn a_failed_refund_that_later_succeeds_leaves_the_failed_refunds() {
    let clock = FixedClock::at(T0);
    let store = fresh_table(&dynamodb_local().await).await;
    let order = open_order(&store, &clock).await;
    let (attempts, _, _) = paid_twice(&store, &clock, &order).await;
    let pending = store.refund(&order.order_id, &attempts[1].payment_id).await.unwrap().unwrap();
    let at = clock.now();
    assert_eq!(
        store.update_refund(&pending, RefundStatus::RefundFailed, None, Some("x"), at).await.unwrap(),
        Cas::Applied
    );
    assert_eq!(store.failed_refunds().await.unwrap().len(), 1);
    // An operator redrove it from the dead-letter queue and it went through.
    let failed = store.refund(&order.order_id, &attempts[1].payment_id).await.unwrap().unwrap();
    assert_eq!(
        store.update_refund(&failed, RefundStatus::Refunded, Some("re_1"), None, at).await.unwrap(),
        Cas::Applied
    );
    assert!(store.failed_refunds().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_close_whose_answer_is_lost_is_its_own_and_counted_closed_by_the_run_that_wrote_it() {
    let clock = FixedClock::at(T0);
    let store = fresh_table(&dynamodb_local().await).await;
    let order = open_order(&store, &clock).await;
    clock.set(order.expire_at.unix_millis() + 1);
    let (losing_store, lost) = losing(&store, "UpdateItem", 1).await;
    let out = fixtures::closer(&losing_store, ScriptedChannel::default(), RecordedReminders::default(), &clock)
        .close(&order.order_id, "closer-1")
        .await
        .unwrap();
    assert_eq!(lost.lost(), 1);
    assert!(matches!(out, CloseOutcome::Closed), "its own close, not one found done by someone else: {out:?}");
    assert_eq!(store.order(&order.order_id).await.unwrap().unwrap().status, OrderStatus::Closed);
}

#[tokio::test]
async fn a_begin_closing_whose_answer_is_lost_still_closes_the_order_in_the_same_run() {
    let clock = FixedClock::at(T0);
    let store = fresh_table(&dynamodb_local().await).await;
    let order = open_order(&store, &clock).await;
    let a = record_attempt(&store, &order, clock.now()).await;
    let channel = ScriptedChannel::default();
    channel.answer(&a.payment_id, Some(ChannelPayment::Failed));
    clock.set(order.expire_at.unix_millis() + 1);
    // The first write of the run is the claim of CLOSING.
    let (losing_store, lost) = losing(&store, "UpdateItem", 1).await;
    let out = fixtures::closer(&losing_store, channel, RecordedReminders::default(), &clock)
        .close(&order.order_id, "closer-1")
        .await
        .unwrap();
    assert_eq!(lost.lost(), 1);
    assert!(matches!(out, CloseOutcome::Closed), "closed by its own chain, not a lease and a sweep later: {out:?}");
    assert_eq!(store.order(&order.order_id).await.unwrap().unwrap().status, OrderStatus::Closed);
}

#[tokio::test]
async fn hold_closing_and_an_early_reminder_whose_answers_are_lost_are_read_as_applied() {
    let clock = FixedClock::at(T0);
    let store = fresh_table(&dynamodb_local().await).await;
    let order = open_order(&store, &clock).await;
    let (losing_store, lost) = losing(&store, "UpdateItem", 2).await;
    // An early wake-up notes when to look again.
    let until = order.expire_at;
    assert_eq!(losing_store.note_early_reminder(&order, until, clock.now()).await.unwrap(), Cas::Applied);
    // A closer holding CLOSING for an unknown payment pushes its lease on.
    clock.set(order.expire_at.unix_millis() + 1);
    let order = store.order(&order.order_id).await.unwrap().unwrap();
    let lease = ClosingLease {
        owner: "closer-1".into(),
        started_at: clock.now(),
        lease_until: clock.now().plus(Duration::from_secs(30)),
        resumes: 0,
    };
    assert_eq!(store.begin_closing(&order, &lease, clock.now()).await.unwrap(), Cas::Applied);
    let closing = store.order(&order.order_id).await.unwrap().unwrap();
    let later = clock.now().plus(Duration::from_secs(60));
    assert_eq!(losing_store.hold_closing(&closing, later).await.unwrap(), Cas::Applied);
    assert_eq!(lost.lost(), 2);
    let held = store.order(&order.order_id).await.unwrap().unwrap();
    assert_eq!(held.closing.unwrap().lease_until, later);
    // Somebody else's write is still told apart: the same hold again, on the
    // order as read before the first, is refused.
    assert_eq!(store.hold_closing(&closing, later).await.unwrap(), Cas::Rejected);
}
