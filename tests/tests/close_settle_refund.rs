//! Use cases on the real store (DynamoDB Local) with the clock, the channel,
//! the reminders and the scheduler faked: the close decision at every
//! instant and channel answer, release and settle, refunds.

use order_core::aws::dynamo::DynamoStore;
use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::close_order::CloseOutcome;
use order_core::usecases::refunds::{process_refund, RefundOutcome, MAX_REFUND_TRIES};
use order_core::usecases::release_order::{release_order, settle_order};
use std::time::Duration;
use system_tests::fakes::*;
use system_tests::fixtures::{self, one_line, T0};

const WINDOW_MS: i64 = 60_000;

type World = fixtures::World;

async fn world() -> World {
    World::new(&["A"], 10).await.ordering(Duration::from_millis(WINDOW_MS as u64), one_line("u1", "A", 3, 100))
}

#[tokio::test]
async fn an_early_wake_up_is_put_back_for_the_remaining_time_and_closes_nothing() {
    let w = world().await;
    let o = w.order().await;
    w.clock.set(T0 + WINDOW_MS - 4_000);
    let out = w.closer().close(&o.order_id, "t").await.unwrap();
    assert_eq!(out, CloseOutcome::RemindedLater { after: Duration::from_secs(4), why: "not yet due" });
    assert_eq!(w.reminders.0.lock().unwrap().as_slice(), &[(o.order_id.clone(), Duration::from_secs(4))]);
    assert_eq!(w.status(&o).await, OrderStatus::PendingPayment);
}

#[tokio::test]
async fn a_due_unpaid_order_closes_once_and_a_duplicate_wake_up_changes_nothing() {
    let w = world().await;
    let o = w.order().await;
    w.clock.set(T0 + WINDOW_MS);
    assert_eq!(w.closer().close(&o.order_id, "t").await.unwrap(), CloseOutcome::Closed);
    let closed = w.store.order(&o.order_id).await.unwrap().unwrap();
    assert_eq!(w.closer().close(&o.order_id, "t").await.unwrap(), CloseOutcome::AlreadyFinal(OrderStatus::Closed));
    assert_eq!(w.store.order(&o.order_id).await.unwrap().unwrap(), closed, "no write on the duplicate");
    let missing = OrderId::parse("ord_missing").unwrap();
    assert_eq!(w.closer().close(&missing, "t").await.unwrap(), CloseOutcome::NotFound);
}

#[tokio::test]
async fn two_closers_racing_close_once() {
    let w = world().await;
    let o = w.order().await;
    w.clock.set(T0 + WINDOW_MS);
    let (c1, c2) = (w.closer(), w.closer());
    let (a, b) = tokio::join!(c1.close(&o.order_id, "a"), c2.close(&o.order_id, "b"));
    let outcomes = [a.unwrap(), b.unwrap()];
    assert_eq!(outcomes.iter().filter(|o| **o == CloseOutcome::Closed).count(), 1, "{outcomes:?}");
    assert!(outcomes.contains(&CloseOutcome::AlreadyFinal(OrderStatus::Closed)));
}

#[tokio::test]
async fn closing_finds_the_channel_paid_and_converges_to_paid_releasing_nothing() {
    let w = world().await;
    let (o, a) = w.with_attempt(&w.order().await).await;
    w.channel.answer(
        &a.payment_id,
        Some(ChannelPayment::Succeeded { channel_txn_id: "tx1".into(), amount: a.amount, currency: "EUR".into() }),
    );
    w.clock.set(T0 + WINDOW_MS + 1);
    assert_eq!(w.closer().close(&o.order_id, "t").await.unwrap(), CloseOutcome::Paid);
    let rec = w.store.order_record(&o.order_id).await.unwrap().unwrap();
    assert_eq!(rec.order.status, OrderStatus::Paid);
    assert_eq!(rec.payments[0].status, PaymentStatus::Succeeded);
    assert!(rec.order.history.iter().any(|h| h.to == OrderStatus::Closing), "went through CLOSING");
    let report = release_order(&w.store, &w.clock, &o.order_id).await.unwrap();
    assert_eq!((report.moved, report.refused), (0, 1), "a PAID order is never released");
    assert_eq!(w.available("A").await, 7);
}

#[tokio::test]
async fn an_unknown_payment_state_holds_the_order_in_closing_and_releases_nothing() {
    let w = world().await;
    let (o, a) = w.with_attempt(&w.order().await).await;
    w.channel.answer(&a.payment_id, None); // the channel times out
    w.clock.set(T0 + WINDOW_MS + 1);
    let out = w.closer().close(&o.order_id, "t").await.unwrap();
    assert_eq!(out, CloseOutcome::RemindedLater { after: Duration::from_secs(5), why: "payment state unknown" });
    let rec = w.store.order_record(&o.order_id).await.unwrap().unwrap();
    assert_eq!(rec.order.status, OrderStatus::Closing);
    assert_eq!(rec.payments[0].status, PaymentStatus::Unknown);
    assert!(!rec.payments[0].evidence.is_empty(), "the failed query is on record");
    assert_eq!(release_order(&w.store, &w.clock, &o.order_id).await.unwrap().moved, 0);
    assert_eq!(w.available("A").await, 7);
    // A payment for a CLOSING order is still accepted: the success wins.
    let closing = w.store.order(&o.order_id).await.unwrap().unwrap();
    let ev =
        Evidence { at: w.clock.now(), source: "notification".into(), status: PaymentStatus::Succeeded, detail: None };
    assert_eq!(w.store.settle_success(&closing, &a, "tx", ev, None, "").await.unwrap(), SettleResult::Paid);
    w.clock.set(T0 + WINDOW_MS + 60_000);
    assert_eq!(w.closer().close(&o.order_id, "t").await.unwrap(), CloseOutcome::AlreadyFinal(OrderStatus::Paid));
}

#[tokio::test]
async fn a_confirmed_unpaid_order_closes_and_its_stock_and_coupon_return_once() {
    let w = world().await;
    let valid = system_tests::fixtures::available_coupon("C1", "u1", Timestamp::from_unix_millis(T0 + 10 * WINDOW_MS));
    w.store.put_coupon(&valid).await.unwrap();
    let (o, a) = w.with_attempt(&w.order_with_coupon(Some("C1")).await).await;
    w.channel.answer(&a.payment_id, Some(ChannelPayment::Failed));
    w.clock.set(T0 + WINDOW_MS);
    assert_eq!(w.closer().close(&o.order_id, "t").await.unwrap(), CloseOutcome::Closed);
    assert_eq!(w.available("A").await, 7, "closing alone releases nothing; the stream does");
    let r1 = release_order(&w.store, &w.clock, &o.order_id).await.unwrap();
    let r2 = release_order(&w.store, &w.clock, &o.order_id).await.unwrap();
    assert_eq!((r1.moved, r1.already), (2, 0), "reservation and coupon lock");
    assert_eq!((r2.moved, r2.already), (0, 2), "a duplicate record moves nothing");
    assert_eq!(w.available("A").await, 10);
    let c = w.store.coupon(&valid.coupon_id).await.unwrap().unwrap();
    assert_eq!(c.state, CouponState::Available);
}

#[tokio::test]
async fn a_coupon_whose_validity_passed_is_released_as_expired() {
    let w = world().await;
    let c = system_tests::fixtures::available_coupon("SHORT", "u1", Timestamp::from_unix_millis(T0 + 1000));
    w.store.put_coupon(&c).await.unwrap();
    let o = w.order_with_coupon(Some("SHORT")).await;
    w.clock.set(T0 + WINDOW_MS);
    w.closer().close(&o.order_id, "t").await.unwrap();
    release_order(&w.store, &w.clock, &o.order_id).await.unwrap();
    let after = w.store.coupon(&c.coupon_id).await.unwrap().unwrap();
    assert_eq!(after.state, CouponState::Expired);
    assert!(after.reason.unwrap().contains("validity"));
}

#[tokio::test]
async fn a_lease_that_expires_mid_close_is_resumed_from_closing() {
    let w = world().await;
    let (o, a) = w.with_attempt(&w.order().await).await;
    // A closer claims CLOSING and dies before deciding.
    let due = o.expire_at;
    let lease = ClosingLease {
        started_at: due,
        owner: "dead".into(),
        lease_until: due.plus(Duration::from_secs(30)),
        resumes: 0,
    };
    assert_eq!(w.store.begin_closing(&o, &lease, due).await.unwrap(), Cas::Applied);
    w.channel.answer(&a.payment_id, Some(ChannelPayment::NotFound));
    w.clock.set(due.unix_millis() + 10_000);
    let held = w.closer().close(&o.order_id, "next").await.unwrap();
    assert_eq!(held, CloseOutcome::LeftToLeaseHolder, "a live lease is left to its holder");
    w.clock.set(due.unix_millis() + 30_000);
    assert_eq!(w.closer().close(&o.order_id, "next").await.unwrap(), CloseOutcome::Closed);
    let rec = w.store.order_record(&o.order_id).await.unwrap().unwrap();
    let lease = rec.order.closing.clone().unwrap();
    assert_eq!((lease.owner.as_str(), lease.resumes), ("next", 1), "taken over once");
    assert!(
        rec.order.history.iter().all(|h| h.to != OrderStatus::PendingPayment || h.from.is_none()),
        "never reopened"
    );
}

#[tokio::test]
async fn settling_a_paid_order_confirms_stock_uses_the_coupon_and_cancels_the_wake_up() {
    let w = world().await;
    let c = system_tests::fixtures::available_coupon("C2", "u1", Timestamp::from_unix_millis(T0 + 10 * WINDOW_MS));
    w.store.put_coupon(&c).await.unwrap();
    let (o, a) = w.with_attempt(&w.order_with_coupon(Some("C2")).await).await;
    let ev = Evidence { at: w.clock.now(), source: "n".into(), status: PaymentStatus::Succeeded, detail: None };
    w.store.settle_success(&o, &a, "tx-settle", ev, None, "").await.unwrap();
    let wakeups = RecordedWakeUps::default();
    let r = settle_order(&w.store, &wakeups, &w.channel, &w.clock, &o.order_id).await.unwrap();
    assert_eq!((r.moved, r.refused), (2, 0));
    let again = settle_order(&w.store, &wakeups, &w.channel, &w.clock, &o.order_id).await.unwrap();
    assert_eq!((again.moved, again.already), (0, 2));
    let stock = w.store.stock(&Sku::parse("A").unwrap()).await.unwrap().unwrap();
    assert_eq!((stock.available, stock.reserved), (7, 0), "sold, not returned");
    assert_eq!(w.store.coupon(&c.coupon_id).await.unwrap().unwrap().state, CouponState::Used);
    assert_eq!(wakeups.0.lock().unwrap().iter().filter(|e| e.starts_with("cancel")).count(), 2);
}

/// A channel that knows no payment and declines every refund.
fn declining() -> FixedChannel {
    FixedChannel::answering(ChannelPayment::NotFound, ChannelPayment::NotFound).refusing_refunds("declined")
}

#[tokio::test]
async fn refunds_complete_once_and_give_up_after_bounded_tries() {
    let w = world().await;
    let (o, a) = w.with_attempt(&w.order().await).await;
    // Close for real, then let a late success arrive.
    w.clock.set(T0 + WINDOW_MS);
    let lease = ClosingLease { started_at: o.expire_at, owner: "w".into(), lease_until: o.expire_at, resumes: 0 };
    w.store.begin_closing(&o, &lease, o.expire_at).await.unwrap();
    let closing = w.store.order(&o.order_id).await.unwrap().unwrap();
    w.store.close_after_check(&closing, w.clock.now(), "t").await.unwrap();
    let closed = w.store.order(&o.order_id).await.unwrap().unwrap();
    let ev = Evidence { at: w.clock.now(), source: "n".into(), status: PaymentStatus::Succeeded, detail: None };
    assert_eq!(
        w.store.settle_success(&closed, &a, "tx-late", ev, None, "notice").await.unwrap(),
        SettleResult::RefundPending
    );

    let declining = declining();
    for i in 1..MAX_REFUND_TRIES {
        let out = process_refund(&w.store, &declining, &w.clock, &o.order_id, &a.payment_id).await.unwrap();
        assert!(matches!(out, RefundOutcome::RetryAfter(_)), "try {i}: {out:?}");
    }
    let RefundOutcome::GiveUp(refund) =
        process_refund(&w.store, &declining, &w.clock, &o.order_id, &a.payment_id).await.unwrap()
    else {
        panic!("expected to give up after {MAX_REFUND_TRIES} tries");
    };
    assert_eq!(refund.tries, MAX_REFUND_TRIES);
    // The give-up is recorded by the write that counted the last try, so
    // only the delivery whose write applied sends the dead letter.
    let failed = w.store.refund(&o.order_id, &a.payment_id).await.unwrap().unwrap();
    assert_eq!((failed.status, failed.tries), (RefundStatus::RefundFailed, MAX_REFUND_TRIES));
    // An operator redrives it; the channel works now: REFUND_FAILED → REFUNDED.
    assert_eq!(
        process_refund(&w.store, &w.channel, &w.clock, &o.order_id, &a.payment_id).await.unwrap(),
        RefundOutcome::Refunded
    );
    assert_eq!(w.store.refund(&o.order_id, &a.payment_id).await.unwrap().unwrap().status, RefundStatus::Refunded);
    assert_eq!(
        process_refund(&w.store, &w.channel, &w.clock, &o.order_id, &a.payment_id).await.unwrap(),
        RefundOutcome::AlreadyDone
    );
    assert_eq!(w.channel.refunds.lock().unwrap().len(), 1, "the working channel was called once");
}

#[tokio::test]
async fn a_duplicate_success_for_the_paying_payment_creates_no_refund() {
    let w = world().await;
    let (o, a) = w.with_attempt(&w.order().await).await;
    let ev = Evidence { at: w.clock.now(), source: "n".into(), status: PaymentStatus::Succeeded, detail: None };
    w.store.settle_success(&o, &a, "tx-a", ev.clone(), None, "").await.unwrap();
    let paid = w.store.order(&o.order_id).await.unwrap().unwrap();
    assert_eq!(w.store.settle_success(&paid, &a, "tx-a", ev, None, "").await.unwrap(), SettleResult::Duplicate);
    assert!(w.store.refund(&o.order_id, &a.payment_id).await.unwrap().is_none());
    assert_eq!(
        process_refund(&w.store, &w.channel, &w.clock, &o.order_id, &a.payment_id).await.unwrap(),
        RefundOutcome::NotFound
    );
    assert!(w.channel.refunds.lock().unwrap().is_empty(), "the channel was never asked to refund");
}

#[tokio::test]
async fn a_refund_goes_to_the_channel_once_under_its_idempotency_key() {
    let w = world().await;
    let (o, a) = w.with_attempt(&w.order().await).await;
    let (o, b) = w.with_attempt(&o).await;
    let ev = Evidence { at: w.clock.now(), source: "n".into(), status: PaymentStatus::Succeeded, detail: None };
    w.store.settle_success(&o, &a, "tx-a", ev.clone(), None, "").await.unwrap();
    let paid = w.store.order(&o.order_id).await.unwrap().unwrap();
    assert_eq!(w.store.settle_success(&paid, &b, "tx-b", ev, None, "n").await.unwrap(), SettleResult::RefundPending);
    for _ in 0..3 {
        process_refund(&w.store, &w.channel, &w.clock, &o.order_id, &b.payment_id).await.unwrap();
    }
    let calls = w.channel.refunds.lock().unwrap().clone();
    assert_eq!(calls, vec![(b.payment_id.clone(), format!("refund-{}", b.payment_id))], "one call, keyed by payment");
    let refund = w.store.refund(&o.order_id, &b.payment_id).await.unwrap().unwrap();
    assert_eq!(
        (refund.status, refund.channel_refund_id),
        (RefundStatus::Refunded, Some(format!("r-{}", b.payment_id)))
    );
}

#[tokio::test]
async fn an_abandoned_payment_is_closed_at_the_channel_and_the_order_closes() {
    let w = world().await;
    let (o, a) = w.with_attempt(&w.order().await).await;
    w.channel.answer(&a.payment_id, Some(ChannelPayment::Pending));
    w.clock.set(T0 + WINDOW_MS);
    assert_eq!(w.closer().close(&o.order_id, "t").await.unwrap(), CloseOutcome::Closed);
    let rec = w.store.order_record(&o.order_id).await.unwrap().unwrap();
    assert_eq!(rec.payments[0].status, PaymentStatus::Failed);
}

#[tokio::test]
async fn not_found_at_the_channel_counts_as_unpaid_only_after_the_grace_period() {
    let w = world().await;
    let (o, _a) = w.with_attempt(&w.order().await).await;
    // The attempt was made at T0 and the window is 60 s: at expiry the
    // attempt is older than the 10 s grace, so "not found" is believed.
    w.clock.set(T0 + WINDOW_MS);
    assert_eq!(w.closer().close(&o.order_id, "t").await.unwrap(), CloseOutcome::Closed);

    // An attempt made 5 s before expiry is too young to be believed.
    let w2 = world().await;
    let o2 = w2.order().await;
    w2.clock.set(T0 + WINDOW_MS - 5_000);
    let (o2, _) = w2.with_attempt(&o2).await;
    w2.clock.set(o2.expire_at.unix_millis());
    let held = w2.closer().close(&o2.order_id, "t").await.unwrap();
    assert!(matches!(held, CloseOutcome::RemindedLater { why: "payment state unknown", .. }), "{held:?}");
    assert_eq!(w2.status(&o2).await, OrderStatus::Closing);
    w2.clock.set(o2.expire_at.unix_millis() + 5_000);
    assert_eq!(w2.closer().close(&o2.order_id, "t").await.unwrap(), CloseOutcome::Closed);
}

#[tokio::test]
async fn every_success_the_closer_finds_is_kept_one_pays_and_the_other_is_refunded() {
    let w = world().await;
    let o = w.order().await;
    let (o, a) = w.with_attempt(&o).await;
    let (o, b) = w.with_attempt(&o).await;
    for p in [&a, &b] {
        w.channel.answer(
            &p.payment_id,
            Some(ChannelPayment::Succeeded {
                channel_txn_id: format!("tx-{}", p.payment_id),
                amount: p.amount,
                currency: "EUR".into(),
            }),
        );
    }
    w.clock.set(T0 + WINDOW_MS);
    assert_eq!(w.closer().close(&o.order_id, "t").await.unwrap(), CloseOutcome::Paid);
    let rec = w.store.order_record(&o.order_id).await.unwrap().unwrap();
    assert_eq!(rec.order.status, OrderStatus::Paid);
    assert!(rec.payments.iter().all(|p| p.status == PaymentStatus::Succeeded));
    assert_eq!(rec.refunds.len(), 1, "the second payment is refunded");
    assert_ne!(Some(&rec.refunds[0].payment_id), rec.order.paid_by.as_ref());
}

/// A channel whose answer about `slow` arrives only after another payment's
/// notification has made the order PAID.
struct RacingChannel {
    store: DynamoStore,
    slow: PaymentAttempt,
    fast: PaymentAttempt,
}

#[async_trait::async_trait]
impl PaymentChannel for RacingChannel {
    async fn open(&self, _: &PaymentAttempt, _: &str) -> Result<OpenedPayment, Unavailable> {
        Ok(OpenedPayment::default())
    }
    async fn query(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        let p = &a.payment_id;
        if *p == self.fast.payment_id {
            return Ok(ChannelPayment::Pending);
        }
        let order = self.store.order(&self.fast.order_id).await?.unwrap();
        let ev = Evidence {
            at: order.expire_at,
            source: "notification".into(),
            status: PaymentStatus::Succeeded,
            detail: None,
        };
        assert_eq!(self.store.settle_success(&order, &self.fast, "tx-fast", ev, None, "").await?, SettleResult::Paid);
        Ok(ChannelPayment::Succeeded {
            channel_txn_id: "tx-slow".into(),
            amount: self.slow.amount,
            currency: "EUR".into(),
        })
    }
    async fn cancel(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        self.query(a).await
    }
    async fn refund(&self, _: &PaymentAttempt, _: i64, _: &str) -> Result<RefundResult, Unavailable> {
        unreachable!()
    }
}

#[tokio::test]
async fn a_success_confirmed_while_another_payment_wins_is_refunded_not_dropped() {
    let w = world().await;
    let o = w.order().await;
    let (o, slow) = w.with_attempt(&o).await;
    let (o, fast) = w.with_attempt(&o).await;
    w.clock.set(T0 + WINDOW_MS);
    let racing = RacingChannel { store: w.store.clone(), slow: slow.clone(), fast: fast.clone() };
    let closer = fixtures::closer(&w.store, racing, w.reminders.clone(), &w.clock);
    assert_eq!(closer.close(&o.order_id, "t").await.unwrap(), CloseOutcome::AlreadyFinal(OrderStatus::Paid));
    let rec = w.store.order_record(&o.order_id).await.unwrap().unwrap();
    assert_eq!(rec.order.paid_by.as_ref(), Some(&fast.payment_id));
    assert_eq!(rec.refunds.len(), 1);
    assert_eq!(rec.refunds[0].payment_id, slow.payment_id, "the slower success is refunded");
}

#[tokio::test]
async fn once_paid_the_orders_other_payments_are_closed_at_the_channel_or_refunded() {
    let w = world().await;
    let o = w.order().await;
    let (o, paying) = w.with_attempt(&o).await;
    let (o, abandoned) = w.with_attempt(&o).await;
    let (o, also_paid) = w.with_attempt(&o).await;
    w.channel.answer(&abandoned.payment_id, Some(ChannelPayment::Pending));
    w.channel.answer(
        &also_paid.payment_id,
        Some(ChannelPayment::Succeeded {
            channel_txn_id: "tx-2".into(),
            amount: also_paid.amount,
            currency: "EUR".into(),
        }),
    );
    let ev = Evidence { at: w.clock.now(), source: "n".into(), status: PaymentStatus::Succeeded, detail: None };
    assert_eq!(w.store.settle_success(&o, &paying, "tx-1", ev, None, "").await.unwrap(), SettleResult::Paid);
    settle_order(&w.store, &RecordedWakeUps::default(), &w.channel, &w.clock, &o.order_id).await.unwrap();

    let rec = w.store.order_record(&o.order_id).await.unwrap().unwrap();
    let status = |p: &PaymentAttempt| rec.payments.iter().find(|x| x.payment_id == p.payment_id).unwrap().status;
    assert_eq!(rec.order.status, OrderStatus::Paid);
    assert_eq!(status(&paying), PaymentStatus::Succeeded);
    assert_eq!(status(&abandoned), PaymentStatus::Failed, "closed at the channel");
    assert_eq!(status(&also_paid), PaymentStatus::Succeeded);
    assert_eq!(rec.refunds.len(), 1);
    assert_eq!(rec.refunds[0].payment_id, also_paid.payment_id, "the second success is refunded");
}
