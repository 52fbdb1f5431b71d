//! The backstop on the real store (DynamoDB Local): the due index's open
//! and effects entries, the sweep (what it finds, what it costs, where it
//! stops and goes on), shard-count changes, one reminder chain per order,
//! the close run's time budget, lazy expiry, the operator's force-check,
//! and payment-window rules fixed at create.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue as Av;
use order_core::aws::dynamo::{keys, DueShards, DynamoStore};
use order_core::domain::*;
use order_core::handlers::requests::{force_check, get_order};
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::close_order::{CloseOrder, CloseOutcome};
use order_core::usecases::order_reads::Reader;
use order_core::usecases::release_order::{release_order, settle_order};
use order_core::usecases::sweep::{sweep, SweepConfig};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use system_tests::fakes::*;
use system_tests::fixtures::{self, fresh_key, one_line, T0};
use system_tests::CreateAsNamed;
use system_tests::{dynamodb_local, fresh_table};
const WINDOW: Duration = Duration::from_secs(60);

/// What the sweep asked for, in order.
#[derive(Clone, Default)]
struct RecordedRedrive(Arc<Mutex<Vec<String>>>);

impl RecordedRedrive {
    fn calls(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

#[async_trait]
impl Redrive for RecordedRedrive {
    async fn close(&self, ids: &[OrderId]) -> Result<(), Unavailable> {
        self.0.lock().unwrap().extend(ids.iter().map(|id| format!("close {id}")));
        Ok(())
    }
    async fn effects(&self, effects: &[PendingEffect]) -> Result<(), Unavailable> {
        self.0.lock().unwrap().extend(effects.iter().map(|e| match e {
            PendingEffect::Order(id) => format!("effects {id}"),
            PendingEffect::Refund(o, p) => format!("refund {o} {p}"),
        }));
        Ok(())
    }
}

system_tests::world_of!(World);

impl World {
    async fn new() -> Self {
        Self::with_store(fresh_table(&dynamodb_local().await).await).await
    }

    async fn with_store(store: DynamoStore) -> Self {
        Self(fixtures::World::on_store(store, ScriptedChannel::default(), &["A"], 1_000).await)
    }

    async fn order(&self) -> Order {
        fixtures::create(&self.creator(WINDOW, "w60"), &fresh_key(), &one_line("u1", "A", 1, 100)).await
    }

    async fn sweep(&self, cfg: &SweepConfig) -> (SweepReport, Vec<String>) {
        let redrive = RecordedRedrive::default();
        let report = sweep(&self.store, &redrive, &self.clock, cfg).await.unwrap();
        (report, redrive.calls())
    }

    /// The raw index entry of an order's item: `(due_shard, due_at)`.
    async fn index_entry(&self, id: &OrderId) -> Option<(String, String)> {
        let item = fixtures::raw_item(&self.store, keys::order(id), keys::ORDER_SK).await.unwrap();
        let get = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
        Some((get("due_shard")?, get("due_at")?))
    }
}

use order_core::usecases::sweep::SweepReport;

fn cfg() -> SweepConfig {
    SweepConfig { grace: Duration::from_secs(5), ..SweepConfig::default() }
}

#[tokio::test]
async fn the_sweep_reminds_only_orders_past_due_plus_grace_and_writes_no_status() {
    let w = World::new().await;
    let due = w.order().await;
    w.clock.set(T0 + 30_000);
    let later = w.order().await; // expires at T0 + 90 s
    w.clock.set(T0 + 60_000 + 4_000); // `due` is 4 s overdue: within the grace
    let (r, calls) = w.sweep(&cfg()).await;
    assert!(calls.is_empty(), "{calls:?}");
    assert_eq!(r.queries as usize, r.shards, "one query per shard when nothing is due");
    w.clock.set(T0 + 60_000 + 6_000);
    let (r, calls) = w.sweep(&cfg()).await;
    assert_eq!(calls, vec![format!("close {}", due.order_id)]);
    assert_eq!(r.open_found, 1);
    assert_eq!(r.oldest_open_overdue, Duration::from_secs(6));
    for o in [&due, &later] {
        assert_eq!(w.store.order(&o.order_id).await.unwrap().unwrap().status, OrderStatus::PendingPayment);
    }
}

#[tokio::test]
async fn a_final_order_moves_to_the_effects_shard_until_its_release_or_settle_is_done() {
    let w = World::new().await;
    let closed = w.order().await;
    let paid = w.order().await;
    let a = w.attempt(&paid).await;
    let shards = w.store.shards().count;
    assert_eq!(w.index_entry(&closed.order_id).await.unwrap().0, keys::due_shard(&closed.order_id, shards));

    w.clock.set(T0 + 60_000);
    assert_eq!(w.closer().close(&closed.order_id, "t").await.unwrap(), CloseOutcome::Closed);
    let paid_now = w.store.order(&paid.order_id).await.unwrap().unwrap();
    let ev =
        Evidence { at: w.clock.now(), source: "notification".into(), status: PaymentStatus::Succeeded, detail: None };
    assert_eq!(w.store.settle_success(&paid_now, &a, "tx1", ev, None, "").await.unwrap(), SettleResult::Paid);
    for o in [&closed, &paid] {
        let (shard, _) = w.index_entry(&o.order_id).await.expect("final with effects pending: in the index");
        assert_eq!(shard, keys::effects_shard(&o.order_id, shards));
    }
    // Before the effects grace nothing is re-driven; after it, both are.
    let (_, calls) = w.sweep(&cfg()).await;
    assert!(calls.is_empty(), "{calls:?}");
    w.clock.set(T0 + 60_000 + 121_000);
    let (r, mut calls) = w.sweep(&cfg()).await;
    calls.sort();
    let mut want = vec![format!("effects {}", closed.order_id), format!("effects {}", paid.order_id)];
    want.sort();
    assert_eq!(calls, want);
    assert_eq!(r.effects_found, 2);

    release_order(&w.store, &w.clock, &closed.order_id).await.unwrap();
    settle_order(&w.store, &RecordedWakeUps::default(), &w.channel, &w.clock, &paid.order_id).await.unwrap();
    for o in [&closed, &paid] {
        assert_eq!(w.index_entry(&o.order_id).await, None, "effects done: out of the index");
    }
    let (r, calls) = w.sweep(&cfg()).await;
    assert!(calls.is_empty() && r.found() == 0, "{calls:?}");
}

#[tokio::test]
async fn a_run_out_of_time_stores_its_cursors_and_the_next_run_goes_on_from_there() {
    let store = fresh_table(&dynamodb_local().await).await.with_shards(DueShards { count: 1, sweep_count: 1 });
    let w = World::with_store(store).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        w.clock.set(T0 + i * 1_000);
        ids.push(w.order().await.order_id);
    }
    w.clock.set(T0 + 120_000);
    // Page of 2 and no time at all: each run handles one entry (a run
    // always moves), stores where it stopped, and the next goes on.
    let tight = SweepConfig { page: 2, budget: Duration::ZERO, ..cfg() };
    for (i, id) in ids.iter().enumerate() {
        let (r, calls) = w.sweep(&tight).await;
        assert_eq!(calls, vec![format!("close {id}")], "run {i}: oldest first, continued, not restarted");
        let last = i == ids.len() - 1;
        assert_eq!(r.unfinished.is_empty(), last, "run {i}: {:?}", r.unfinished);
    }
    // Each was reminded, so the next runs leave it to its reminder until
    // `remind_again_after`; still open then, all are found again from the top.
    let (_, calls) = w.sweep(&cfg()).await;
    assert!(calls.is_empty(), "reminded again before remind_again_after: {calls:?}");
    w.clock.set(T0 + 120_000 + (cfg().remind_again_after + cfg().grace).as_millis() as i64 + 1_000);
    let (_, calls) = w.sweep(&cfg()).await;
    assert_eq!(calls.len(), 5, "still open, so all found again from the top");
}

#[tokio::test]
async fn a_reminded_order_is_left_to_its_reminder_until_remind_again_after_then_reminded_again() {
    let w = World::new().await;
    let o = w.order().await; // expires at T0 + 60 s
    w.clock.set(T0 + 60_000 + 6_000);
    let (r, calls) = w.sweep(&cfg()).await;
    assert_eq!(calls, vec![format!("close {}", o.order_id)]);
    assert_eq!(r.snoozed, 1);
    let until = w.clock.now().plus(cfg().remind_again_after);
    let (shard, due_at) = w.index_entry(&o.order_id).await.unwrap();
    assert_eq!(shard, keys::due_shard(&o.order_id, w.store.shards().count), "still an open entry");
    assert_eq!(due_at, until.to_string(), "moved ahead by remind_again_after");
    // A run a minute later (a backlog still holds the reminder) sends none.
    w.clock.set(T0 + 60_000 + 66_000);
    let (r, calls) = w.sweep(&cfg()).await;
    assert!(calls.is_empty() && r.open_found == 0, "{calls:?}");
    // Its reminder lost and the order still open: found again once the time is up.
    w.clock.set(until.unix_millis() + cfg().grace.as_millis() as i64 + 1_000);
    let (_, calls) = w.sweep(&cfg()).await;
    assert_eq!(calls, vec![format!("close {}", o.order_id)]);
    assert_eq!(
        w.store.order(&o.order_id).await.unwrap().unwrap().status,
        OrderStatus::PendingPayment,
        "no status written"
    );
}

/// Ten minutes of one-minute sweep runs whose reminders are all taken and
/// leave the order open; the largest oldest-overdue figure reported and how
/// many runs reminded it.
async fn sweep_an_order_nobody_closes(w: &World, o: &Order) -> (Duration, u32) {
    let (mut worst, mut reminded) = (Duration::ZERO, 0);
    let start = w.clock.now().unix_millis();
    for minute in 1..=10 {
        w.clock.set(start + minute * 60_000);
        let (r, calls) = w.sweep(&cfg()).await;
        if calls.contains(&format!("close {}", o.order_id)) {
            reminded += 1;
            worst = worst.max(r.oldest_open_overdue);
        }
    }
    assert!(!w.store.order(&o.order_id).await.unwrap().unwrap().status.is_final());
    (worst, reminded)
}

#[tokio::test]
async fn an_order_reminded_but_left_open_shows_its_full_overdue_time_to_the_alarm() {
    // The OverdueOpenOrder alarm (default 150 s) is the net for a close path
    // that takes the sweep's reminders and leaves the order open. The
    // entry's due time restarts with each snooze, so the figure must count
    // from the due time the order's own writes gave it: `expire_at` while
    // PENDING_PAYMENT, the lease's end while CLOSING.
    const ALARM: Duration = Duration::from_secs(150);
    let w = World::new().await;
    let pending = w.order().await; // expires at T0 + 60 s
    w.clock.set(T0 + 60_000);
    let (worst, reminded) = sweep_an_order_nobody_closes(&w, &pending).await;
    assert!(reminded >= 2, "reminded again after remind_again_after: {reminded}");
    assert!(worst > ALARM, "PENDING_PAYMENT nine minutes past expire_at, yet the figure peaks at {worst:?}");

    // A closer claims CLOSING and dies: nothing but the sweep brings it back.
    let w = World::new().await;
    let closing = w.order().await;
    w.clock.set(T0 + 60_000);
    let lease = ClosingLease {
        started_at: w.clock.now(),
        owner: "died".into(),
        lease_until: w.clock.now().plus(Duration::from_secs(30)),
        resumes: 0,
    };
    assert_eq!(w.store.begin_closing(&closing, &lease, w.clock.now()).await.unwrap(), Cas::Applied);
    let (worst, reminded) = sweep_an_order_nobody_closes(&w, &closing).await;
    assert!(reminded >= 2, "reminded again after remind_again_after: {reminded}");
    assert!(worst > ALARM, "CLOSING eight minutes past its lease, yet the figure peaks at {worst:?}");
}

#[tokio::test]
async fn a_snooze_never_moves_an_entry_that_changed_after_the_sweep_read_it() {
    let w = World::new().await;
    let closed = w.order().await;
    let leased = w.order().await;
    let attempt = w.attempt(&leased).await;
    w.channel.answer(&attempt.payment_id, None); // the channel times out: the closer holds it
    w.clock.set(T0 + 60_000 + 6_000);
    let shard = keys::due_shard(&closed.order_id, w.store.shards().count);
    let read_then = |id: OrderId| {
        let w = &w;
        async move {
            let shard = keys::due_shard(&id, w.store.shards().count);
            let page = w.store.due_page(&shard, w.clock.now(), 100, None).await.unwrap();
            page.entries.into_iter().find(|e| e.item == DueItem::Open(id.clone())).expect("found by the sweep")
        }
    };
    let stale_closed = read_then(closed.order_id.clone()).await;
    let stale_leased = read_then(leased.order_id.clone()).await;
    // Meanwhile: one order closes (its entry moves to the effects part), the
    // other's closer holds it CLOSING (its entry becomes the lease's end).
    assert_eq!(w.closer().close(&closed.order_id, "t").await.unwrap(), CloseOutcome::Closed);
    let _ = w.closer().close(&leased.order_id, "t").await.unwrap();
    let before = [w.index_entry(&closed.order_id).await, w.index_entry(&leased.order_id).await];
    let until = w.clock.now().plus(Duration::from_secs(180));
    assert_eq!(w.store.snooze(&shard, &stale_closed, until).await.unwrap(), None);
    let leased_shard = keys::due_shard(&leased.order_id, w.store.shards().count);
    assert_eq!(w.store.snooze(&leased_shard, &stale_leased, until).await.unwrap(), None);
    let after = [w.index_entry(&closed.order_id).await, w.index_entry(&leased.order_id).await];
    assert_eq!(before, after, "the close's and the lease's own entries stand");
}

#[tokio::test]
async fn lowering_the_shard_count_strands_nothing_while_the_sweep_covers_the_old_count() {
    let table = fresh_table(&dynamodb_local().await).await;
    let old = World::with_store(table.clone().with_shards(DueShards { count: 8, sweep_count: 8 })).await;
    let mut ids: Vec<OrderId> = Vec::new();
    for _ in 0..24 {
        ids.push(old.order().await.order_id);
    }
    let spread: std::collections::HashSet<_> = ids.iter().map(|id| keys::shard_of(id, 8)).collect();
    assert!(spread.iter().any(|s| *s >= 2), "some orders sit in shards 2..8");
    old.clock.set(T0 + 120_000);

    // Redeployed with 2 write shards; the sweep still covers 8.
    let new =
        World(fixtures::World { store: table.clone().with_shards(DueShards { count: 2, sweep_count: 8 }), ..old.0 });
    let (_, calls) = new.sweep(&cfg()).await;
    assert_eq!(calls.len(), 24, "every order written under the old count is found");
    // Lowering both at once would have stranded the orders in shards 2..8.
    let wrong = World(fixtures::World { store: table.with_shards(DueShards { count: 2, sweep_count: 2 }), ..new.0 });
    let (_, calls) = wrong.sweep(&cfg()).await;
    assert!(calls.len() < 24, "the documented mistake is real: {} of 24 found", calls.len());
}

#[test]
fn a_burst_with_one_expire_at_spreads_over_every_shard() {
    let ids = RandomIds;
    let now = Timestamp::from_unix_millis(T0);
    let mut per_shard = HashMap::new();
    for _ in 0..16_000 {
        let id = OrderId::parse(ids.new_id("ord", now)).unwrap();
        *per_shard.entry(keys::shard_of(&id, 16)).or_insert(0u32) += 1;
    }
    assert_eq!(per_shard.len(), 16);
    let (min, max) = (per_shard.values().min().unwrap(), per_shard.values().max().unwrap());
    // 1,000 expected per shard; a hot partition would be far outside this.
    assert!(*min > 850 && *max < 1150, "per-shard counts {per_shard:?}");
}

#[tokio::test]
async fn a_sweep_over_ten_thousand_closed_orders_reads_only_what_is_due() {
    let w = World::new().await;
    // 10,000 final orders as the store leaves them once their effects are
    // done (out of the index), written in batches, plus 50 open ones not due.
    let mut items = Vec::new();
    for i in 0..10_000 {
        let mut item = HashMap::new();
        item.insert("pk".to_string(), Av::S(format!("ORDER#ord_closed{i:05}")));
        item.insert("sk".to_string(), Av::S("ORDER".into()));
        item.insert("entity".to_string(), Av::S("ORDER".into()));
        item.insert("status".to_string(), Av::S("CLOSED".into()));
        item.insert("expire_at".to_string(), Av::S("2020-01-01T00:00:00.000Z".into()));
        items.push(item);
    }
    system_tests::batch_put(&w.store, items).await;
    for _ in 0..50 {
        w.order().await;
    }
    let (r, calls) = w.sweep(&cfg()).await;
    assert!(calls.is_empty());
    assert_eq!(r.queries as usize, r.shards, "one query per shard");
    assert_eq!(r.items_read, 0, "nothing due: no item read, whatever the table holds");
    println!(
        "sweep over 10,000 closed + 50 open orders, none due: {} queries, {} items read, {} RCU",
        r.queries, r.items_read, r.consumed_capacity
    );
}

#[tokio::test]
async fn duplicate_reminders_for_a_held_order_leave_one_reminder_chain() {
    let w = World::new().await;
    let o = w.order().await;
    let a = w.attempt(&o).await;
    w.channel.answer(&a.payment_id, None); // the channel times out: held
    w.clock.set(T0 + 60_000);
    let first = w.closer().close(&o.order_id, "r1").await.unwrap();
    assert!(matches!(first, CloseOutcome::RemindedLater { why: "payment state unknown", .. }), "{first:?}");
    // Three duplicates (the schedule, the sweep, a redelivery) arrive
    // before the held order's own reminder is due: each ends.
    for owner in ["r2", "r3", "r4"] {
        w.clock.set(T0 + 61_000);
        assert_eq!(w.closer().close(&o.order_id, owner).await.unwrap(), CloseOutcome::LeftToLeaseHolder);
    }
    assert_eq!(w.reminders.0.lock().unwrap().len(), 1, "one chain: only the holder's reminder is queued");
    // The chain's reminder resumes, holds again, and queues exactly one more.
    w.clock.set(T0 + 65_000);
    let again = w.closer().close(&o.order_id, "r1b").await.unwrap();
    assert!(matches!(again, CloseOutcome::RemindedLater { .. }), "{again:?}");
    assert_eq!(w.reminders.0.lock().unwrap().len(), 2);
    let rec = w.store.order(&o.order_id).await.unwrap().unwrap();
    assert_eq!(rec.status, OrderStatus::Closing, "never released while unknown");
    // The held order is due for the sweep when its hold ends, not before.
    let (shard, due_at) = w.index_entry(&o.order_id).await.unwrap();
    assert!(shard.starts_with("OPEN#"));
    assert_eq!(due_at, rec.closing.unwrap().lease_until.to_string());
}

#[tokio::test]
async fn a_close_run_out_of_time_holds_the_order_keeps_its_lease_and_sends_its_reminder() {
    let w = World::new().await;
    let o = w.order().await;
    let a = w.attempt(&o).await;
    w.channel.answer(&a.payment_id, Some(ChannelPayment::Failed));
    w.clock.set(T0 + 60_000);
    let closer = CloseOrder { budget: Duration::ZERO, ..w.closer() };
    let out = closer.close(&o.order_id, "slow").await.unwrap();
    assert!(matches!(out, CloseOutcome::RemindedLater { why: "payment state unknown", .. }), "{out:?}");
    let held = w.store.order(&o.order_id).await.unwrap().unwrap();
    assert_eq!(held.status, OrderStatus::Closing);
    assert_eq!(held.closing.unwrap().owner, "slow", "the lease is kept by the run that held");
    assert_eq!(w.reminders.0.lock().unwrap().len(), 1);
    // With time, the next run finds the attempt failed and closes.
    w.clock.set(T0 + 66_000);
    assert_eq!(w.closer().close(&o.order_id, "next").await.unwrap(), CloseOutcome::Closed);
}

#[tokio::test]
async fn reading_an_overdue_order_says_so_and_sends_one_reminder_without_writing_its_status() {
    let w = World::new().await;
    let o = w.order().await;
    let view = get_order(&w.store, &w.reminders, &w.clock, o.order_id.as_str(), &Reader::Buyer(o.user_id.clone()))
        .await
        .unwrap();
    assert_eq!(view["expired_awaiting_close"], false);
    w.clock.set(T0 + 61_000);
    for _ in 0..3 {
        let view = get_order(&w.store, &w.reminders, &w.clock, o.order_id.as_str(), &Reader::Buyer(o.user_id.clone()))
            .await
            .unwrap();
        assert_eq!(view["expired_awaiting_close"], true);
        assert_eq!(view["status"], "PENDING_PAYMENT");
    }
    assert_eq!(w.reminders.0.lock().unwrap().len(), 1, "one reminder however often it is read");
    let after = w.store.order(&o.order_id).await.unwrap().unwrap();
    assert_eq!((after.status, after.version), (o.status, o.version), "no status or version write on a read");
    w.clock.set(T0 + 125_000);
    get_order(&w.store, &w.reminders, &w.clock, o.order_id.as_str(), &Reader::Buyer(o.user_id.clone())).await.unwrap();
    assert_eq!(w.reminders.0.lock().unwrap().len(), 2, "a minute later, one more");
}

#[tokio::test]
async fn a_force_check_runs_the_close_use_case_and_records_who_asked_and_what_it_found() {
    let w = World::new().await;
    let o = w.order().await;
    w.clock.set(T0 + 30_000);
    let early = force_check(&w.closer(), o.order_id.as_str(), "arn:aws:iam::1:user/ops").await.unwrap();
    assert_eq!((early["found"].as_str(), early["outcome"].as_str()), (Some("PENDING_PAYMENT"), Some("reminded_later")));
    w.clock.set(T0 + 61_000);
    let v = force_check(&w.closer(), o.order_id.as_str(), "arn:aws:iam::1:user/ops").await.unwrap();
    assert_eq!(v["outcome"], "closed");
    assert_eq!(v["status"], "CLOSED");
    w.clock.set(T0 + 62_000);
    let again = force_check(&w.closer(), o.order_id.as_str(), "arn:aws:iam::1:role/oncall").await.unwrap();
    assert_eq!((again["found"].as_str(), again["outcome"].as_str()), (Some("CLOSED"), Some("already_final")));
    let order = w.store.order_record(&o.order_id).await.unwrap().unwrap().order;
    let who: Vec<_> = order.checks.iter().map(|c| (c.by.as_str(), c.outcome.as_str())).collect();
    assert_eq!(
        who,
        [
            ("arn:aws:iam::1:user/ops", "reminded_later"),
            ("arn:aws:iam::1:user/ops", "closed"),
            ("arn:aws:iam::1:role/oncall", "already_final")
        ]
    );
    assert_eq!(order.history.iter().filter(|h| h.to == OrderStatus::Closed).count(), 1);
    let err = force_check(&w.closer(), "ord_nope", "x").await.unwrap_err();
    assert!(
        matches!(err, order_core::error::ApiError::Refused { kind: order_core::error::Kind::NotFound, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_new_payment_window_leaves_existing_orders_expire_at_and_rule_alone() {
    let w = World::new().await;
    let body = json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "A", "qty": 1, "unit_price": 100}]});
    let before =
        w.creator(WINDOW, "window-60s").execute_as_named(Some("k1"), body.to_string().as_bytes()).await.unwrap().order;
    // "Redeployed" with a ten-minute window.
    let redeployed = w.creator(Duration::from_secs(600), "window-600s");
    let after = redeployed.execute_as_named(Some("k2"), body.to_string().as_bytes()).await.unwrap().order;
    let stored = w.store.order(&before.order_id).await.unwrap().unwrap();
    assert_eq!(stored.expire_at, Timestamp::from_unix_millis(T0 + 60_000));
    assert_eq!(stored.expiry_rule_version, "window-60s");
    assert_eq!(after.expire_at, Timestamp::from_unix_millis(T0 + 600_000));
    assert_eq!(after.expiry_rule_version, "window-600s");
    // The old order still closes at its own expiry, whatever the config says now.
    w.clock.set(T0 + 60_000);
    assert_eq!(w.closer().close(&before.order_id, "t").await.unwrap(), CloseOutcome::Closed);
    assert!(matches!(w.closer().close(&after.order_id, "t").await.unwrap(), CloseOutcome::RemindedLater { .. }));
}

#[tokio::test]
async fn a_coupon_lock_another_release_already_ended_counts_as_done_not_as_a_breach() {
    let w = World::new().await;
    let coupon = system_tests::fixtures::available_coupon("C-RULE", "u1", Timestamp::from_unix_millis(T0 + 86_400_000));
    w.store.put_coupon(&coupon).await.unwrap();
    let body = json!({"user_id": "u1", "currency": "EUR", "coupon_id": "C-RULE",
                      "items": [{"sku": "A", "qty": 1, "unit_price": 100}]});
    let o = w.creator(WINDOW, "w60").execute_as_named(Some("kc"), body.to_string().as_bytes()).await.unwrap().order;
    w.clock.set(T0 + 60_000);
    assert_eq!(w.closer().close(&o.order_id, "t").await.unwrap(), CloseOutcome::Closed);
    // A first release returned the coupon and died before the rest; then an
    // operator re-wrote the (now AVAILABLE) coupon as non-returnable.
    let first = w
        .store
        .end_coupon_lock(&o.order_id, &coupon.coupon_id, CouponLockStatus::Available, "returned", w.clock.now())
        .await
        .unwrap();
    assert_eq!(first, Ok(Step::Moved(CouponLockStatus::Available)));
    w.store.put_coupon(&Coupon { returnable: false, ..coupon.clone() }).await.unwrap();
    let report = release_order(&w.store, &w.clock, &o.order_id).await.unwrap();
    assert_eq!(report.refused, 0, "{report:?}");
    assert_eq!(w.index_entry(&o.order_id).await, None, "effects done: out of the index, not re-driven forever");
    assert_eq!(w.store.coupon(&coupon.coupon_id).await.unwrap().unwrap().state, CouponState::Available);
}

/// The FX entries of final orders whose effects were handed on are moved
/// ahead by `hand_off_again_after` (the effects queue's visibility
/// timeout), so the runs in between hand nothing on again; the figure the
/// pending-effect alarm watches still counts from the due time the final
/// write gave the entry (`closed_at` / `paid_at` + the effects grace); and
/// a move of an entry read before the effects were done is refused, as
/// for open orders.
#[tokio::test]
async fn an_effects_entry_handed_on_is_left_to_its_message_and_a_stale_move_of_it_is_refused() {
    let w = World::new().await;
    let closed = w.order().await;
    let paid = w.order().await;
    let a = w.attempt(&paid).await;
    w.clock.set(T0 + 60_000);
    assert_eq!(w.closer().close(&closed.order_id, "t").await.unwrap(), CloseOutcome::Closed);
    let paid_now = w.store.order(&paid.order_id).await.unwrap().unwrap();
    let ev = Evidence { at: w.clock.now(), source: "n".into(), status: PaymentStatus::Succeeded, detail: None };
    assert_eq!(w.store.settle_success(&paid_now, &a, "tx1", ev, None, "").await.unwrap(), SettleResult::Paid);
    let own_due = w.clock.now().plus(order_core::aws::dynamo::DEFAULT_EFFECTS_GRACE);

    w.clock.set(own_due.unix_millis() + 1_000);
    let (r, calls) = w.sweep(&cfg()).await;
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(r.effects_snoozed, 2);
    let until = w.clock.now().plus(cfg().hand_off_again_after);
    for o in [&closed, &paid] {
        let (shard, due_at) = w.index_entry(&o.order_id).await.unwrap();
        assert_eq!(shard, keys::effects_shard(&o.order_id, w.store.shards().count), "still an effects entry");
        assert_eq!(due_at, until.to_string(), "moved ahead by hand_off_again_after");
    }
    // Runs while the messages are queued or in flight hand nothing on.
    for minute in 1..=2 {
        w.clock.set(own_due.unix_millis() + 1_000 + minute * 60_000);
        let (r, calls) = w.sweep(&cfg()).await;
        assert!(calls.is_empty() && r.found() == 0, "minute {minute}: {calls:?}");
    }
    // Still pending once the time is up: handed on again, its age counted
    // from the final write's due time, not from the snooze.
    w.clock.set(until.unix_millis() + 1_000);
    let (r, calls) = w.sweep(&cfg()).await;
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(r.oldest_effect_overdue, own_due.until(w.clock.now()), "{r:?}");

    // A run reads the closed order's entry; its release is done meanwhile
    // (the entry removed); the run's move is refused and adds no entry.
    w.clock.set(w.clock.now().unix_millis() + cfg().hand_off_again_after.as_millis() as i64 + 1_000);
    let shard = keys::effects_shard(&closed.order_id, w.store.shards().count);
    let page = w.store.due_page(&shard, w.clock.now(), 100, None).await.unwrap();
    let stale = page.entries.into_iter().find(|e| e.item == DueItem::OrderEffects(closed.order_id.clone())).unwrap();
    release_order(&w.store, &w.clock, &closed.order_id).await.unwrap();
    assert_eq!(w.index_entry(&closed.order_id).await, None, "effects done: out of the index");
    let later = w.clock.now().plus(Duration::from_secs(180));
    assert_eq!(w.store.snooze(&shard, &stale, later).await.unwrap(), None, "refused");
    assert_eq!(w.index_entry(&closed.order_id).await, None, "the stale move did not bring it back");
}
