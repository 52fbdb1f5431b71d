//! The heads-up before expiry on the real store (DynamoDB Local), with the
//! clock faked: which orders a pass notices, that each is noticed once
//! (passes repeated or at once, a write sent again after its answer was
//! lost), that the notice leaves the order's version
//! (a close that read the order before it still applies), and the orders
//! that never get one (a short window, final, closing, cancel asked, past
//! `expire_at`).

use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::expiring_soon::{notice_expiring_soon, NoticeConfig, NoticeReport};
use std::time::Duration;
use system_tests::fakes::*;
use system_tests::fixtures::{self, one_line, T0};

const LEAD: Duration = Duration::from_secs(60);

system_tests::world_of!(World);

impl World {
    async fn new() -> Self {
        Self(fixtures::World::new(&["A"], 100).await)
    }

    fn at(&self, seconds_after_t0: i64) {
        self.clock.set(T0 + seconds_after_t0 * 1000);
    }

    /// An order created now with a window of `window_s` seconds.
    async fn order(&self, window_s: u64) -> Order {
        self.create(Duration::from_secs(window_s), &one_line("u1", "A", 1, 100)).await
    }

    async fn pass(&self) -> NoticeReport {
        let cfg = NoticeConfig { lead: LEAD, ..NoticeConfig::default() };
        notice_expiring_soon(&self.store, &self.clock, &cfg).await
    }
}

#[tokio::test]
async fn a_pass_notices_an_order_about_the_lead_before_expiry_once_and_keeps_its_version() {
    let w = World::new().await;
    let o = w.order(600).await;
    // 200 s before expiry: more than the lead and one period ahead.
    w.at(400);
    let r = w.pass().await;
    assert_eq!((r.seen, r.noticed), (0, 0), "{r:?}");
    // 120 s before: the first pass that looks at it notices it.
    w.at(480);
    let r = w.pass().await;
    assert_eq!((r.seen, r.noticed, r.refused, r.failed), (1, 1, 0, 0), "{r:?}");
    let noticed = w.now_order(&o).await;
    assert_eq!(noticed.expiring_soon_at, Some(w.clock.now()));
    assert_eq!((noticed.version, noticed.status), (o.version, OrderStatus::PendingPayment), "not a state change");
    // The next pass looks again and is refused: never a second notice.
    w.at(540);
    let r = w.pass().await;
    assert_eq!((r.seen, r.noticed, r.refused), (1, 0, 1), "{r:?}");
    assert_eq!(w.now_order(&o).await.expiring_soon_at, noticed.expiring_soon_at);
}

#[tokio::test]
async fn a_close_that_read_the_order_before_its_notice_still_applies() {
    let w = World::new().await;
    let o = w.order(600).await;
    w.at(480);
    assert_eq!(w.pass().await.noticed, 1);
    w.at(600);
    // `o` is the order as read before the notice: same version, so the
    // close's compare-and-swap is not refused by the reminder.
    assert_eq!(w.store.close_unpaid(&o, w.clock.now()).await.unwrap(), Cas::Applied);
    let closed = w.now_order(&o).await;
    assert_eq!(closed.status, OrderStatus::Closed);
    assert!(closed.expiring_soon_at.is_some(), "the notice stays on the record");
}

#[tokio::test]
async fn two_passes_at_once_notice_each_order_once() {
    let w = World::new().await;
    let mut orders = Vec::new();
    for _ in 0..12 {
        orders.push(w.order(600).await);
    }
    w.at(500);
    // The second run's clock a millisecond on: a run that finds its own
    // notice (same time) takes it for its own lost answer.
    let later = FixedClock::at(T0 + 500_001);
    let cfg = NoticeConfig { lead: LEAD, ..NoticeConfig::default() };
    let (a, b) = tokio::join!(w.pass(), notice_expiring_soon(&w.store, &later, &cfg));
    assert_eq!(a.noticed + b.noticed, 12, "{a:?} {b:?}");
    assert_eq!(a.refused + b.refused, 12, "each order's second write refused: {a:?} {b:?}");
    for o in &orders {
        assert!(w.now_order(o).await.expiring_soon_at.is_some());
    }
}

#[tokio::test]
async fn no_notice_for_a_short_window_a_paid_a_closed_a_closing_or_a_cancelled_order() {
    let w = World::new().await;
    let open = w.order(600).await;
    let paid = w.order(600).await;
    let closed = w.order(600).await;
    let closing = w.order(600).await;
    let cancelled = w.order(600).await;
    w.at(500);
    // A 100 s window is under twice the 60 s lead.
    let short = w.order(100).await;
    // Paid before its heads-up: a status the notice's condition refuses.
    let a = system_tests::fixtures::processing_attempt(&paid, w.clock.now());
    assert_eq!(w.store.record_attempt(&paid, &a).await.unwrap(), AttemptResult::Recorded);
    let ev =
        Evidence { at: w.clock.now(), source: "notification".into(), status: PaymentStatus::Succeeded, detail: None };
    let settled = w.store.settle_success(&w.now_order(&paid).await, &a, "tx1", ev, None, "").await.unwrap();
    assert_eq!(settled, SettleResult::Paid);
    // Cancelled by the buyer (due at once): one left asked, one closed, one
    // being closed.
    for o in [&cancelled, &closed, &closing] {
        assert_eq!(w.store.request_cancel(o, w.clock.now()).await.unwrap(), Cas::Applied);
    }
    assert_eq!(w.store.close_unpaid(&w.now_order(&closed).await, w.clock.now()).await.unwrap(), Cas::Applied);
    let lease = ClosingLease {
        started_at: w.clock.now(),
        owner: "closer".into(),
        lease_until: w.clock.now().plus(Duration::from_secs(30)),
        resumes: 0,
    };
    let asked = w.now_order(&closing).await;
    assert_eq!(w.store.begin_closing(&asked, &lease, w.clock.now()).await.unwrap(), Cas::Applied);
    w.at(520);
    let r = w.pass().await;
    assert_eq!(r.noticed, 1, "{r:?}");
    assert!(w.now_order(&open).await.expiring_soon_at.is_some());
    for o in [&paid, &closed, &closing, &cancelled, &short] {
        assert_eq!(w.now_order(o).await.expiring_soon_at, None, "{}", o.order_id);
    }
    // Asked directly, the store refuses the paid one too (the pass never
    // sees it: a final order leaves the open shards).
    let latest = paid.expire_at.minus(LEAD * 2);
    let now = w.clock.now();
    assert_eq!(w.store.notice_expiring_soon(&paid.order_id, paid.expire_at, latest, now).await.unwrap(), Cas::Rejected);
}

#[tokio::test]
async fn the_store_refuses_a_notice_at_or_after_expiry_or_for_another_expire_at() {
    let w = World::new().await;
    let o = w.order(600).await;
    let latest_created = o.expire_at.minus(LEAD * 2);
    let refused = w.store.notice_expiring_soon(&o.order_id, o.expire_at, latest_created, o.expire_at).await.unwrap();
    assert_eq!(refused, Cas::Rejected, "at expiry a notice says nothing true");
    let other = o.expire_at.plus(Duration::from_secs(1));
    let now = o.expire_at.minus(LEAD);
    assert_eq!(w.store.notice_expiring_soon(&o.order_id, other, latest_created, now).await.unwrap(), Cas::Rejected);
    let missing = OrderId::parse("ord_missing").unwrap();
    assert_eq!(w.store.notice_expiring_soon(&missing, o.expire_at, latest_created, now).await.unwrap(), Cas::Rejected);
    assert_eq!(w.now_order(&o).await.expiring_soon_at, None);
    assert_eq!(
        w.store.notice_expiring_soon(&o.order_id, o.expire_at, latest_created, now).await.unwrap(),
        Cas::Applied
    );
}

#[tokio::test]
async fn a_zero_lead_notices_nothing() {
    let w = World::new().await;
    let o = w.order(600).await;
    w.at(500);
    let cfg = NoticeConfig { lead: Duration::ZERO, ..NoticeConfig::default() };
    let r = notice_expiring_soon(&w.store, &w.clock, &cfg).await;
    assert_eq!(r, NoticeReport::default());
    assert_eq!(w.now_order(&o).await.expiring_soon_at, None);
}

#[tokio::test]
async fn a_notice_sent_again_after_its_answer_was_lost_is_its_own_not_a_second() {
    let w = World::new().await;
    let o = w.order(600).await;
    let latest_created = o.expire_at.minus(LEAD * 2);
    let now = o.expire_at.minus(LEAD);
    let notice = |at: Timestamp| w.store.notice_expiring_soon(&o.order_id, o.expire_at, latest_created, at);
    assert_eq!(notice(now).await.unwrap(), Cas::Applied);
    // The SDK sends the same request again: the stored notice is this
    // write's own, so it counts as applied; nothing is written twice.
    assert_eq!(notice(now).await.unwrap(), Cas::Applied);
    let later = now.plus(Duration::from_millis(1));
    assert_eq!(notice(later).await.unwrap(), Cas::Rejected, "another run's write is refused");
    assert_eq!(w.now_order(&o).await.expiring_soon_at, Some(now));
}
