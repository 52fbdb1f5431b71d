//! The sweep under a backlog: how many calls one run has in flight however
//! large the backlog of due orders or pending effects (fakes, no DynamoDB;
//! effects handed on ten to a call), a pending effect handed off once per
//! visibility timeout rather than once per run, a stored cursor the service
//! rejects or of the wrong shape dropped and the shard swept from the top
//! (DynamoDB Local), and 10,000 due orders drained by the sweep alone, with
//! no wake-up at all (DynamoDB Local, the production client settings; it
//! prints each run's duration). The drain runs alone (nextest's
//! `ten_thousand` filter), best on a fresh DynamoDB Local: one already
//! holding many earlier runs' tables, on a busy machine, took 205 s to plant
//! the orders instead of 5–11 s.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue as Av;
use order_core::aws::dynamo::{keys, DueShards, DynamoStore};
use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::close_order::{CloseOrder, CloseOutcome};
use order_core::usecases::create_order::CreateOrder;
use order_core::usecases::sweep::{sweep, SweepConfig};
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use system_tests::fakes::*;
use system_tests::fixtures::{self, eur};
use system_tests::CreateAsNamed;
use system_tests::{dynamodb_local, fresh_table};

const T0: i64 = 1_800_000_000_000;
const WINDOW: Duration = Duration::from_secs(60);

/// Counts the calls in flight (index queries, snoozes, close reminders)
/// and remembers the most there ever were at once.
#[derive(Clone, Default)]
struct InFlight {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

impl InFlight {
    async fn during<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        let out = f.await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        out
    }
    fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

/// A [`DueIndex`] that counts the calls made through it.
struct Counted<I> {
    inner: I,
    in_flight: InFlight,
}

#[async_trait]
impl<I: DueIndex> DueIndex for Counted<I> {
    fn shards(&self) -> Vec<String> {
        self.inner.shards()
    }
    fn is_open_shard(&self, shard: &str) -> bool {
        self.inner.is_open_shard(shard)
    }
    async fn due_page(
        &self,
        shard: &str,
        cutoff: Timestamp,
        limit: u32,
        start: Option<DueCursor>,
    ) -> Result<DuePage, DuePageError> {
        self.in_flight.during(self.inner.due_page(shard, cutoff, limit, start)).await
    }
    async fn snooze(&self, shard: &str, entry: &DueEntry, until: Timestamp) -> Result<Option<Timestamp>, Unavailable> {
        self.in_flight.during(self.inner.snooze(shard, entry, until)).await
    }
    async fn sweep_cursors(&self) -> Result<SweepCursors, Unavailable> {
        self.inner.sweep_cursors().await
    }
    async fn save_sweep_cursors(&self, cursors: &SweepCursors) -> Result<Cas, Unavailable> {
        self.inner.save_sweep_cursors(cursors).await
    }
}

/// A redrive that records every close reminder and every pending effect
/// handed on (one call stands for one `SendMessageBatch`) and counts it in
/// flight.
#[derive(Clone, Default)]
struct Reminded {
    ids: Arc<Mutex<Vec<OrderId>>>,
    /// The size of each hand-off of pending effects.
    handed_off: Arc<Mutex<Vec<usize>>>,
    in_flight: InFlight,
    /// How long one reminder call takes (a round trip to SQS).
    latency: Duration,
}

impl Reminded {
    fn take(&self) -> Vec<OrderId> {
        std::mem::take(&mut *self.ids.lock().unwrap())
    }
}

#[async_trait]
impl Redrive for Reminded {
    async fn close(&self, ids: &[OrderId]) -> Result<(), Unavailable> {
        self.in_flight
            .during(async {
                tokio::time::sleep(self.latency).await;
                self.ids.lock().unwrap().extend(ids.iter().cloned());
            })
            .await;
        Ok(())
    }
    async fn effects(&self, effects: &[PendingEffect]) -> Result<(), Unavailable> {
        self.in_flight
            .during(async {
                tokio::time::sleep(self.latency).await;
                self.handed_off.lock().unwrap().push(effects.len());
            })
            .await;
        Ok(())
    }
}

/// The due index in memory: 16 open and 16 effects shards, each answering
/// after a millisecond (a round trip), snoozes moving entries ahead.
#[derive(Default)]
struct MemoryIndex {
    /// shard → entries (order, due time), in key order.
    shards: Mutex<BTreeMap<String, Vec<(OrderId, Timestamp)>>>,
    cursors: Mutex<SweepCursors>,
}

const ROUND_TRIP: Duration = Duration::from_millis(1);

#[async_trait]
impl DueIndex for MemoryIndex {
    fn shards(&self) -> Vec<String> {
        (0..16).map(|i| format!("OPEN#{i}")).chain((0..16).map(|i| format!("FX#{i}"))).collect()
    }
    fn is_open_shard(&self, shard: &str) -> bool {
        shard.starts_with("OPEN#")
    }
    async fn due_page(
        &self,
        shard: &str,
        cutoff: Timestamp,
        limit: u32,
        start: Option<DueCursor>,
    ) -> Result<DuePage, DuePageError> {
        tokio::time::sleep(ROUND_TRIP).await;
        let after: usize = start.as_ref().and_then(|c| c.get("i")).map_or(0, |i| i.parse::<usize>().unwrap() + 1);
        let shards = self.shards.lock().unwrap();
        let entries: Vec<DueEntry> = shards
            .get(shard)
            .map(|v| v.as_slice())
            .unwrap_or_default()
            .iter()
            .enumerate()
            .skip(after)
            .filter(|(_, (_, due))| *due <= cutoff)
            .take(limit as usize)
            .map(|(i, (id, due))| DueEntry {
                item: if shard.starts_with("FX#") {
                    DueItem::OrderEffects(id.clone())
                } else {
                    DueItem::Open(id.clone())
                },
                due_at: *due,
                key: BTreeMap::from([("i".to_string(), i.to_string()), ("due".to_string(), due.to_string())]),
            })
            .collect();
        let next = (entries.len() == limit as usize).then(|| entries.last().unwrap().key.clone());
        Ok(DuePage { entries, next, consumed_capacity: 0.0 })
    }
    async fn snooze(&self, shard: &str, entry: &DueEntry, until: Timestamp) -> Result<Option<Timestamp>, Unavailable> {
        tokio::time::sleep(ROUND_TRIP).await;
        let i: usize = entry.key["i"].parse().unwrap();
        let mut shards = self.shards.lock().unwrap();
        let slot = &mut shards.get_mut(shard).unwrap()[i];
        if slot.1 != entry.due_at {
            return Ok(None);
        }
        slot.1 = until;
        Ok(Some(entry.due_at))
    }
    async fn sweep_cursors(&self) -> Result<SweepCursors, Unavailable> {
        Ok(self.cursors.lock().unwrap().clone())
    }
    async fn save_sweep_cursors(&self, cursors: &SweepCursors) -> Result<Cas, Unavailable> {
        let mut stored = self.cursors.lock().unwrap();
        if stored.version != cursors.version {
            return Ok(Cas::Rejected);
        }
        *stored = SweepCursors { version: cursors.version + 1, shards: cursors.shards.clone() };
        Ok(Cas::Applied)
    }
}

/// The most calls one run may have in flight: its shards at once, each
/// with at most its own number of calls at once.
fn bound(cfg: &SweepConfig) -> usize {
    cfg.shards_at_once * cfg.calls_per_shard
}

#[tokio::test]
async fn a_large_backlog_never_has_more_calls_in_flight_than_the_bound() {
    let index = MemoryIndex::default();
    let due = Timestamp::from_unix_millis(T0);
    {
        let mut shards = index.shards.lock().unwrap();
        for i in 0..10_000 {
            let id = OrderId::parse(format!("ord_backlog{i:05}")).unwrap();
            shards.entry(format!("OPEN#{}", i % 16)).or_default().push((id, due));
        }
    }
    let in_flight = InFlight::default();
    let index = Counted { inner: index, in_flight: in_flight.clone() };
    let redrive = Reminded { in_flight: in_flight.clone(), latency: ROUND_TRIP, ..Default::default() };
    let clock = FixedClock::at(T0 + 120_000);
    let cfg = SweepConfig::default();
    let report = sweep(&index, &redrive, &clock, &cfg).await.unwrap();
    let reminded: HashSet<OrderId> = redrive.take().into_iter().collect();
    assert_eq!(reminded.len(), 10_000, "every due order reminded");
    assert_eq!(report.open_found, 10_000);
    assert_eq!(report.snoozed, 10_000, "and left to its reminder");
    assert!(
        in_flight.max() <= bound(&cfg),
        "{} calls in flight at once; the bound is {} ({} shards × {} calls)",
        in_flight.max(),
        bound(&cfg),
        cfg.shards_at_once,
        cfg.calls_per_shard
    );
    println!("10,000 due entries: at most {} calls in flight (bound {})", in_flight.max(), bound(&cfg));
}

/// Issue 17: the sweep hands pending effects to the effects queue, ten to
/// a call, instead of running each release or settle in its own run; a
/// backlog of 5,000 costs the run 500 quick calls, within the same bound.
#[tokio::test]
async fn a_backlog_of_pending_effects_is_handed_on_ten_to_a_call_within_the_bound() {
    let index = MemoryIndex::default();
    let due = Timestamp::from_unix_millis(T0);
    {
        let mut shards = index.shards.lock().unwrap();
        for i in 0..5_000 {
            let id = OrderId::parse(format!("ord_effects{i:05}")).unwrap();
            shards.entry(format!("FX#{}", i % 16)).or_default().push((id, due));
        }
    }
    let in_flight = InFlight::default();
    let index = Counted { inner: index, in_flight: in_flight.clone() };
    let redrive = Reminded { in_flight: in_flight.clone(), latency: ROUND_TRIP, ..Default::default() };
    let clock = FixedClock::at(T0 + 120_000);
    let cfg = SweepConfig::default();
    let started = Instant::now();
    let report = sweep(&index, &redrive, &clock, &cfg).await.unwrap();
    let took = started.elapsed();
    let calls = redrive.handed_off.lock().unwrap().clone();
    assert_eq!(report.effects_found, 5_000);
    assert_eq!(calls.iter().sum::<usize>(), 5_000, "every pending effect handed on once");
    assert!(calls.iter().all(|n| *n <= 10), "at most ten to a call: {calls:?}");
    // Batches are cut per page: 16 shards × 4 pages, at most one short
    // batch per page.
    assert!(calls.len() <= 500 + 16 * 4, "{} calls for 5,000 effects", calls.len());
    assert!(report.unfinished.is_empty() && report.failures == 0, "{report:?}");
    assert!(in_flight.max() <= bound(&cfg), "{} calls in flight; the bound is {}", in_flight.max(), bound(&cfg));
    println!(
        "5,000 pending effects handed on in {took:?}: {} calls, at most {} in flight",
        calls.len(),
        in_flight.max()
    );
}

// ---- DynamoDB Local

fn creator(store: &DynamoStore, clock: &dyn Clock) -> CreateOrder<DynamoStore> {
    fixtures::creator(store, &FixedClock::at(clock.now().unix_millis()), WINDOW, "w60")
}

async fn order_at(store: &DynamoStore, clock: &dyn Clock) -> Order {
    let body = json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "A", "qty": 1, "unit_price": 100}]});
    let key = format!("k{}", rand::random::<u64>());
    creator(store, clock).execute_as_named(Some(&key), body.to_string().as_bytes()).await.unwrap().order
}

#[tokio::test]
async fn a_stored_cursor_the_service_rejects_is_dropped_and_the_shard_swept_from_the_top() {
    let store = fresh_table(&dynamodb_local().await).await.with_shards(DueShards { count: 1, sweep_count: 1 });
    system_tests::fixtures::seed_stock(&store, &Sku::parse("A").unwrap(), 100, &eur(100)).await.unwrap();
    let clock = FixedClock::at(T0 - 30_000);
    let early = order_at(&store, &clock).await; // due T0 + 30 s
    clock.set(T0);
    let mut later = Vec::new();
    for i in 0..4 {
        clock.set(T0 + i * 1_000);
        later.push(order_at(&store, &clock).await.order_id); // due T0 + 60 s …
    }
    // Two runs at T0 + 120 s with the grace at 5 s (cutoff T0 + 115 s), each
    // out of time after one entry: the second stores a cursor at the first
    // of the later orders (due T0 + 60 s).
    clock.set(T0 + 120_000);
    let tight = SweepConfig { grace: Duration::from_secs(5), page: 2, budget: Duration::ZERO, ..Default::default() };
    let redrive = Reminded::default();
    sweep(&store, &redrive, &clock, &tight).await.unwrap();
    sweep(&store, &redrive, &clock, &tight).await.unwrap();
    assert_eq!(redrive.take(), vec![early.order_id.clone(), later[0].clone()]);
    let stored = store.sweep_cursors().await.unwrap();
    let cursor = stored.shards.get("OPEN#0").cloned().expect("a cursor stored for the unfinished shard");
    // A new order due before the cursor (a closer that gave it a short
    // lease, say), and the operator raises SweepGraceSeconds to 75 s: the
    // cutoff (T0 + 45 s) is now before the cursor's due time (T0 + 60 s).
    clock.set(T0 - 20_000);
    let new = order_at(&store, &clock).await; // due T0 + 40 s
    clock.set(T0 + 120_000);
    let raised = SweepConfig { grace: Duration::from_secs(75), ..Default::default() };
    let (err_before, rejected) = match store.due_page("OPEN#0", clock.now().minus(raised.grace), 10, Some(cursor)).await
    {
        Err(DuePageError::CursorRejected(e)) => (e.to_string(), true),
        Err(e) => (e.to_string(), false),
        Ok(_) => (String::new(), false),
    };
    println!("the stored cursor under the raised grace: {err_before}");
    assert!(rejected, "the service is expected to reject the cursor: {err_before:?}");
    let report =
        sweep(&store, &redrive, &clock, &raised).await.expect("the run succeeds: the rejected cursor is dropped");
    assert_eq!(report.cursors_reset, 1);
    assert_eq!(redrive.take(), vec![new.order_id.clone()], "the shard swept again from the top");
    assert!(store.sweep_cursors().await.unwrap().shards.is_empty(), "the rejected cursor is not kept");
    assert!(sweep(&store, &redrive, &clock, &raised).await.is_ok(), "and the next run succeeds too");
}

#[tokio::test]
async fn a_stored_cursor_of_the_wrong_shape_is_dropped_rather_than_failing_every_run() {
    let store = fresh_table(&dynamodb_local().await).await.with_shards(DueShards { count: 1, sweep_count: 1 });
    system_tests::fixtures::seed_stock(&store, &Sku::parse("A").unwrap(), 100, &eur(100)).await.unwrap();
    let clock = FixedClock::at(T0);
    let o = order_at(&store, &clock).await;
    // A cursor missing a key attribute (written by an older layout, or by hand).
    let bad =
        BTreeMap::from([("pk".to_string(), keys::order(&o.order_id)), ("due_shard".to_string(), "OPEN#0".into())]);
    let cursors = SweepCursors { version: 0, shards: BTreeMap::from([("OPEN#0".to_string(), bad)]) };
    assert_eq!(store.save_sweep_cursors(&cursors).await.unwrap(), Cas::Applied);
    clock.set(T0 + 120_000);
    let redrive = Reminded::default();
    let cfg = SweepConfig { grace: Duration::from_secs(5), ..Default::default() };
    let report = sweep(&store, &redrive, &clock, &cfg).await.expect("the run succeeds: the rejected cursor is dropped");
    assert_eq!(report.cursors_reset, 1);
    assert_eq!(redrive.take(), vec![o.order_id.clone()]);
    assert!(store.sweep_cursors().await.unwrap().shards.is_empty());
}

/// Server time, shifted by what the test has let pass.
#[derive(Clone, Default)]
struct ShiftedClock(Arc<AtomicI64>);

impl ShiftedClock {
    fn pass(&self, d: Duration) {
        self.0.fetch_add(d.as_millis() as i64, Ordering::SeqCst);
    }
}

impl Clock for ShiftedClock {
    fn now(&self) -> Timestamp {
        SystemClock.now().plus(Duration::from_millis(self.0.load(Ordering::SeqCst) as u64))
    }
}

/// A DynamoDB client on DynamoDB Local with the functions' own settings
/// (connect, attempt and operation timeouts, standard retries).
async fn production_client() -> aws_sdk_dynamodb::Client {
    let endpoint = std::env::var("DYNAMODB_LOCAL_ENDPOINT").expect("DYNAMODB_LOCAL_ENDPOINT");
    let loader = order_core::aws::with_client_defaults(aws_config::defaults(aws_config::BehaviorVersion::latest()))
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(aws_credential_types::Credentials::new("test", "test", None, None, "tests"));
    aws_sdk_dynamodb::Client::new(&loader.load().await)
}

/// `count` open orders due at `due`, as `create` writes them (copies of one
/// created order under new ids and their own shards), written in batches.
async fn plant_open_orders(store: &DynamoStore, template: &Order, count: usize) -> Vec<OrderId> {
    let item = store
        .client()
        .get_item()
        .table_name(store.table())
        .key("pk", Av::S(keys::order(&template.order_id)))
        .key("sk", Av::S(keys::ORDER_SK.into()))
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    let ids: Vec<OrderId> = (0..count).map(|i| OrderId::parse(format!("ord_drain{i:05}")).unwrap()).collect();
    let copies = ids
        .iter()
        .map(|id| {
            let mut copy = item.clone();
            copy.insert("pk".into(), Av::S(keys::order(id)));
            copy.insert("order_id".into(), Av::S(id.to_string()));
            copy.insert("due_shard".into(), Av::S(keys::due_shard(id, store.shards().count)));
            copy
        })
        .collect();
    system_tests::batch_put(store, copies).await;
    ids
}

/// The close queue's consumer: the real close use case, in-process, on
/// every reminder the sweep sent (16 at once, as the close function's
/// concurrent batches would). How many it closed.
async fn close_all(store: &DynamoStore, clock: &ShiftedClock, ids: Vec<OrderId>) -> usize {
    use futures_util::StreamExt;
    let closer = CloseOrder {
        not_found_grace: Duration::from_secs(30),
        ..fixtures::closer(store, ScriptedChannel::default(), RecordedReminders::default(), clock)
    };
    let closer = &closer;
    futures_util::stream::iter(ids)
        .map(|id| async move { closer.close(&id, "drain-test").await.unwrap() })
        .buffer_unordered(16)
        .filter(|o| futures_util::future::ready(*o == CloseOutcome::Closed))
        .count()
        .await
}

#[tokio::test]
async fn ten_thousand_due_orders_are_drained_by_the_sweep_alone_within_its_bounds() {
    let planter = fresh_table(&dynamodb_local().await).await;
    system_tests::fixtures::seed_stock(&planter, &Sku::parse("A").unwrap(), 10, &eur(100)).await.unwrap();
    // The sweep and the closer on a client with the functions' timeouts.
    let store = DynamoStore::new(production_client().await, planter.table());
    let clock = ShiftedClock::default();
    // One order created ten minutes ago (due nine minutes ago) and 9,999
    // copies of it: a burst of orders whose wake-ups all went missing.
    let created_at = FixedClock::at(clock.now().unix_millis() - 600_000);
    let template = order_at(&planter, &created_at).await;
    let started = Instant::now();
    let mut ids = plant_open_orders(&planter, &template, 9_999).await;
    ids.push(template.order_id.clone());
    println!("planted 10,000 due open orders in {:?}", started.elapsed());

    let in_flight = InFlight::default();
    let index = Counted { inner: store.clone(), in_flight: in_flight.clone() };
    let redrive = Reminded { in_flight: in_flight.clone(), ..Default::default() };
    // The template's settings (SWEEP_BUDGET_SECONDS 40, SWEEP_PAGE_SIZE 100).
    let cfg = SweepConfig::default();
    let mut reminded = HashSet::new();
    let (mut closed, mut runs, mut durations) = (0, 0, Vec::new());
    loop {
        runs += 1;
        assert!(runs <= 20, "not drained after 20 runs: {closed} closed");
        let t = Instant::now();
        let report = sweep(&index, &redrive, &clock, &cfg).await.expect("a run never fails under the backlog");
        let took = t.elapsed();
        durations.push(took);
        let sent = redrive.take();
        println!(
            "run {runs}: {took:?}, {} open found, {} snoozed, {} effects found, {} queries, {} unfinished shards",
            report.open_found,
            report.snoozed,
            report.effects_found,
            report.queries,
            report.unfinished.len()
        );
        if report.open_found == 0 && report.unfinished.is_empty() {
            break;
        }
        reminded.extend(sent.iter().cloned());
        let t = Instant::now();
        closed += close_all(&store, &clock, sent).await;
        println!("  close consumer: {closed} closed so far ({:?})", t.elapsed());
        // The next run comes a sweep period later.
        clock.pass(Duration::from_secs(60));
    }
    // Even once every snooze has run out, nothing open is left to find.
    clock.pass(cfg.remind_again_after + cfg.grace);
    let last = sweep(&index, &redrive, &clock, &cfg).await.unwrap();
    assert_eq!(last.open_found, 0, "an open order left in the index");
    assert_eq!(reminded.len(), 10_000, "every due order reminded");
    assert!(ids.iter().all(|id| reminded.contains(id)));
    assert_eq!(closed, 10_000, "and closed by its reminder");
    assert!(
        in_flight.max() <= bound(&cfg),
        "{} calls in flight at once; the bound is {}",
        in_flight.max(),
        bound(&cfg)
    );
    println!(
        "10,000 due orders drained by the sweep alone: {} runs, {:?} (at most {} calls in flight, bound {})",
        durations.len(),
        durations,
        in_flight.max(),
        bound(&cfg)
    );
}

/// A pending effect handed to the effects queue is not handed on again by
/// the runs while its first message is still queued or in flight: its
/// entry is moved ahead by `hand_off_again_after` (the queue's visibility
/// timeout), as a reminded open order's is. 100 pending effects the
/// consumer has not drained yet and three runs a minute apart used to send
/// 300 messages; a run once that time is up hands each on again.
#[tokio::test]
async fn a_pending_effect_is_handed_off_once_per_visibility_timeout_not_once_per_run() {
    let index = MemoryIndex::default();
    let due = Timestamp::from_unix_millis(T0);
    {
        let mut shards = index.shards.lock().unwrap();
        for i in 0..100 {
            let id = OrderId::parse(format!("ord_fx{i:03}")).unwrap();
            shards.entry(format!("FX#{}", i % 16)).or_default().push((id, due));
        }
    }
    let redrive = Reminded::default();
    let cfg = SweepConfig::default();
    let handed = || redrive.handed_off.lock().unwrap().iter().sum::<usize>();
    for run in 0..3 {
        let clock = FixedClock::at(T0 + 1_000 + run * 60_000);
        sweep(&index, &redrive, &clock, &cfg).await.unwrap();
    }
    assert_eq!(handed(), 100, "each effect handed on once within the queue's visibility timeout");
    let clock = FixedClock::at(T0 + 1_000 + cfg.hand_off_again_after.as_millis() as i64 + 1_000);
    sweep(&index, &redrive, &clock, &cfg).await.unwrap();
    assert_eq!(handed(), 200, "still pending once the time is up: handed on again");
}
