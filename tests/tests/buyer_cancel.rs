//! The buyer's cancel on the real store (DynamoDB Local), with the clock,
//! the channel and the reminders faked: the cancel request's conditions, a
//! payment start refused after it, and the cancel use case at each state
//! and channel answer (it is the close use case, due at once).

use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::cancel_order::{cancel_order, CancelOutcome};
use order_core::usecases::release_order::release_order;
use order_core::usecases::UseCaseError;
use std::time::Duration;
use system_tests::fixtures::{self, one_line, T0};

const WINDOW_MS: i64 = 60_000;

type World = fixtures::World;

async fn world() -> World {
    World::new(&["A"], 10).await.ordering(Duration::from_millis(WINDOW_MS as u64), one_line("u1", "A", 3, 100))
}

fn code(e: UseCaseError) -> &'static str {
    e.code()
}

#[tokio::test]
async fn a_cancel_request_is_recorded_once_only_on_an_open_order_inside_its_window() {
    let w = world().await;
    let o = w.order().await;
    let now = Timestamp::from_unix_millis(T0 + 1_000);
    // A stale version is refused.
    let mut stale = o.clone();
    stale.version += 7;
    assert_eq!(w.store.request_cancel(&stale, now).await.unwrap(), Cas::Rejected);
    // At or past expire_at it is refused: the window's end decides then.
    assert_eq!(w.store.request_cancel(&o, o.expire_at).await.unwrap(), Cas::Rejected);
    assert_eq!(w.store.request_cancel(&o, now).await.unwrap(), Cas::Applied);
    let asked = w.now_order(&o).await;
    assert_eq!(asked.cancel_requested_at, Some(now));
    assert_eq!(asked.version, o.version + 1);
    assert_eq!(asked.due_at(), now);
    // Once only, even with the new version.
    assert_eq!(w.store.request_cancel(&asked, now).await.unwrap(), Cas::Rejected);
    // Never on a final order.
    let other = w.order().await;
    w.clock.set(T0 + WINDOW_MS);
    assert_eq!(
        w.closer().close(&other.order_id, "t").await.unwrap(),
        order_core::usecases::close_order::CloseOutcome::Closed
    );
    let closed = w.now_order(&other).await;
    assert_eq!(w.store.request_cancel(&closed, now).await.unwrap(), Cas::Rejected);
}

#[tokio::test]
async fn no_payment_attempt_starts_on_an_order_its_buyer_asked_to_cancel() {
    let w = world().await;
    let o = w.order().await;
    assert_eq!(w.store.request_cancel(&o, Timestamp::from_unix_millis(T0 + 1)).await.unwrap(), Cas::Applied);
    let asked = w.now_order(&o).await;
    let a = system_tests::fixtures::processing_attempt(&asked, w.clock.now());
    assert!(matches!(w.store.record_attempt(&asked, &a).await.unwrap(), AttemptResult::NotPayable(_)));
    assert_eq!(w.now_order(&o).await.payment_attempts, 0);
}

#[tokio::test]
async fn a_cancel_closes_an_unpaid_order_at_once_and_a_repeat_changes_nothing() {
    let w = world().await;
    let o = w.order().await;
    w.clock.set(T0 + 5_000);
    let c = cancel_order(&w.closer(), &o.user_id, &o.order_id, None).await.unwrap();
    assert_eq!(c.outcome, CancelOutcome::Closed);
    let closed = c.record.order.clone();
    assert_eq!(closed.status, OrderStatus::Closed);
    assert_eq!(closed.close_reason(), CloseReason::BuyerCancelled);
    assert_eq!(closed.cancel_requested_at, Some(Timestamp::from_unix_millis(T0 + 5_000)));
    let entry = closed.history.iter().find(|h| h.to == OrderStatus::Closed).unwrap();
    assert_eq!(entry.cause, "cancelled by the buyer, no payment attempt");
    assert!(entry.at < closed.expire_at, "closed before its window ended");
    // The release is any close's: every unit back, once.
    let r = release_order(&w.store, &w.clock, &o.order_id).await.unwrap();
    assert_eq!(r.moved, 1);
    assert_eq!(w.available("A").await, 10);
    // Again: the same answer, no write.
    let again = cancel_order(&w.closer(), &o.user_id, &o.order_id, None).await.unwrap();
    assert_eq!(again.outcome, CancelOutcome::Closed);
    assert_eq!(w.now_order(&o).await, closed);
    // And the window's end later changes nothing either.
    w.clock.set(T0 + WINDOW_MS + 1);
    assert_eq!(
        w.closer().close(&o.order_id, "t").await.unwrap(),
        order_core::usecases::close_order::CloseOutcome::AlreadyFinal(OrderStatus::Closed)
    );
    assert_eq!(w.now_order(&o).await, closed);
}

#[tokio::test]
async fn another_buyers_order_is_not_found_and_nothing_is_written() {
    let w = world().await;
    let o = w.order().await;
    let before = w.now_order(&o).await;
    let stranger = UserId::parse("u2").unwrap();
    let e = cancel_order(&w.closer(), &stranger, &o.order_id, None).await.unwrap_err();
    assert_eq!(code(e), "not_found");
    assert_eq!(w.now_order(&o).await, before);
    let missing = OrderId::parse("ord_missing").unwrap();
    assert_eq!(code(cancel_order(&w.closer(), &o.user_id, &missing, None).await.unwrap_err()), "not_found");
}

#[tokio::test]
async fn a_paid_order_answers_order_paid_and_a_payment_found_by_the_cancel_wins() {
    let w = world().await;
    // Paid before the cancel.
    let (o, a) = w.with_attempt(&w.order().await).await;
    let ev =
        Evidence { at: w.clock.now(), source: "notification".into(), status: PaymentStatus::Succeeded, detail: None };
    assert_eq!(w.store.settle_success(&o, &a, "tx-1", ev, None, "").await.unwrap(), SettleResult::Paid);
    let paid = w.now_order(&o).await;
    assert_eq!(code(cancel_order(&w.closer(), &o.user_id, &o.order_id, None).await.unwrap_err()), "order_paid");
    assert_eq!(w.now_order(&o).await, paid);

    // Paid at the channel, not yet told: the cancel's close asks, and the
    // success wins.
    let (o, a) = w.with_attempt(&w.order().await).await;
    w.channel.answer(
        &a.payment_id,
        Some(ChannelPayment::Succeeded { channel_txn_id: "tx-2".into(), amount: a.amount, currency: "EUR".into() }),
    );
    assert_eq!(code(cancel_order(&w.closer(), &o.user_id, &o.order_id, None).await.unwrap_err()), "order_paid");
    let after = w.store.order_record(&o.order_id).await.unwrap().unwrap();
    assert_eq!(after.order.status, OrderStatus::Paid);
    assert_eq!(after.order.paid_by, Some(a.payment_id.clone()));
    assert!(after.reservations.iter().all(|r| r.status == ReservationStatus::Reserved), "nothing released");
    assert_eq!(w.available("A").await, 4, "both paid orders' stock still held, none returned");
}

#[tokio::test]
async fn an_unknown_payment_state_holds_a_cancelled_order_and_releases_nothing() {
    let w = world().await;
    let (o, a) = w.with_attempt(&w.order().await).await;
    w.channel.answer(&a.payment_id, None); // the channel times out
    w.clock.set(T0 + 2_000);
    let c = cancel_order(&w.closer(), &o.user_id, &o.order_id, None).await.unwrap();
    assert_eq!(c.outcome, CancelOutcome::Closing);
    assert_eq!(c.record.order.status, OrderStatus::Closing);
    assert!(c.record.reservations.iter().all(|r| r.status == ReservationStatus::Reserved), "nothing released");
    assert_eq!(w.available("A").await, 7);
    // A repeated cancel while held answers the same and decides nothing.
    let again = cancel_order(&w.closer(), &o.user_id, &o.order_id, None).await.unwrap();
    assert_eq!(again.outcome, CancelOutcome::Closing);
    // The channel answers (the held order's own reminder): unpaid → CLOSED as cancelled.
    w.channel.answer(&a.payment_id, Some(ChannelPayment::Failed));
    w.clock.set(T0 + 60_000 - 1);
    assert_eq!(
        w.closer().close(&o.order_id, "t").await.unwrap(),
        order_core::usecases::close_order::CloseOutcome::Closed
    );
    let closed = w.now_order(&o).await;
    assert_eq!(closed.close_reason(), CloseReason::BuyerCancelled);
    let entry = closed.history.iter().find(|h| h.to == OrderStatus::Closed).unwrap();
    assert_eq!(entry.cause, "cancelled by the buyer; every payment attempt confirmed unpaid");
}

#[tokio::test]
async fn a_closing_order_whose_window_ended_answers_order_closing() {
    let w = world().await;
    let (o, a) = w.with_attempt(&w.order().await).await;
    w.channel.answer(&a.payment_id, None);
    w.clock.set(T0 + WINDOW_MS + 1);
    w.closer().close(&o.order_id, "t").await.unwrap();
    let held = w.now_order(&o).await;
    assert_eq!(held.status, OrderStatus::Closing);
    let e = cancel_order(&w.closer(), &o.user_id, &o.order_id, None).await.unwrap_err();
    assert_eq!(code(e), "order_closing");
    assert_eq!(w.now_order(&o).await, held);
}

#[tokio::test]
async fn a_cancel_after_the_window_ended_closes_the_order_as_expired() {
    let w = world().await;
    let o = w.order().await;
    w.clock.set(T0 + WINDOW_MS + 500);
    let c = cancel_order(&w.closer(), &o.user_id, &o.order_id, None).await.unwrap();
    assert_eq!(c.outcome, CancelOutcome::Closed);
    assert_eq!(c.record.order.cancel_requested_at, None);
    assert_eq!(c.record.order.close_reason(), CloseReason::Expired);
}
