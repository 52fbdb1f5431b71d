//! Reconciliation by day and shard on DynamoDB Local, with the real
//! DynamoDB adapters and the sandbox channel's ledger: every kind planted
//! on a day is found by that day's run and no other; a piece that keeps
//! failing is named missing; the merged report does not depend on the
//! order of the pieces; and a day's run reads the same items whatever the
//! table holds from other days.
//!
//! The queue between coordinator and worker is played by the test: each
//! piece message goes through the worker's own handler
//! (`handlers::reconcile_day::piece_message`), redelivered on failure up to
//! the queue's `maxReceiveCount`, as SQS does.

use order_core::aws::dynamo::{keys, n, s, DueShards, DynamoStore};
use order_core::aws::queue::PieceMessage;
use order_core::aws::sandbox::{Faults, LedgerEntry, SandboxChannel};
use order_core::domain::*;
use order_core::handlers::reconcile_day::piece_message;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::reconcile::{Bounds, DiscrepancyKind};
use order_core::usecases::reconcile_day::{day_report, DayPorts, DayReport, DayRun, RECONCILE_SHARDS};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use system_tests::fakes::FixedClock;
use system_tests::fixtures::{self, eur};
use system_tests::CreateAsNamed;
use system_tests::{dynamodb_local, fresh_sandbox_ledger_table, fresh_table};

/// The day under test, and the run's time: three hours after it ended, as
/// the daily schedule runs (every bound has passed for the whole day).
const DAY: &str = "2027-01-10";
const SHARDS: u32 = 4;
/// ReconcilePieceQueue's `maxReceiveCount` in template.yaml (checked there
/// by tests/tests/template_reconcile_day.rs).
const MAX_RECEIVES: u32 = 3;

fn day() -> Day {
    Day::parse(DAY).unwrap()
}

fn run_time() -> Timestamp {
    day().end().plus(Duration::from_secs(3 * 3600))
}

struct World {
    store: DynamoStore,
    ledger: SandboxChannel,
    ledger_table: String,
}

impl World {
    async fn new() -> Self {
        let client = dynamodb_local().await;
        let store = fresh_table(&client).await.with_shards(DueShards { count: SHARDS, sweep_count: SHARDS });
        let ledger_table = fresh_sandbox_ledger_table(&client).await;
        let ledger = SandboxChannel::new(client, ledger_table.clone());
        for sku in ["A", "B"] {
            system_tests::fixtures::seed_stock(&store, &Sku::parse(sku).unwrap(), 1000, &eur(100)).await.unwrap();
        }
        Self { store, ledger, ledger_table }
    }

    /// An order created at `at` with a one-minute window, optionally with
    /// a coupon of its own.
    async fn order(&self, at: Timestamp, coupon: bool) -> Order {
        let create = fixtures::creator(&self.store, &FixedClock::at(at.unix_millis()), Duration::from_secs(60), "t");
        let mut body =
            json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "A", "qty": 2, "unit_price": 100}]});
        if coupon {
            let id = format!("C{}", rand::random::<u32>());
            let c = system_tests::fixtures::available_coupon(&id, "u1", at.plus(Duration::from_secs(86_400)));
            self.store.put_coupon(&c).await.unwrap();
            body["coupon_id"] = json!(id);
        }
        let key = format!("k{}", rand::random::<u64>());
        create.execute_as_named(Some(&key), body.to_string().as_bytes()).await.unwrap().order
    }

    async fn fresh(&self, o: &Order) -> Order {
        self.store.order(&o.order_id).await.unwrap().unwrap()
    }

    async fn attempt(&self, order: &Order, at: Timestamp) -> PaymentAttempt {
        let a = system_tests::fixtures::processing_attempt(order, at);
        assert_eq!(self.store.record_attempt(order, &a).await.unwrap(), AttemptResult::Recorded);
        a
    }

    /// The channel's row of a payment: `status`, opened when the attempt
    /// was, `amount` as given, refunded or not.
    async fn line(&self, a: &PaymentAttempt, status: PaymentStatus, amount: i64, refunded: bool) {
        let entry = LedgerEntry {
            payment_id: a.payment_id.clone(),
            order_id: a.order_id.clone(),
            merchant_id: "m".into(),
            amount,
            currency: a.currency.clone(),
            status,
            channel_txn_id: Some(format!("tx_{}", a.payment_id)),
            refund_id: refunded.then(|| format!("re_{}", a.payment_id)),
            refunded_amount: if refunded { amount } else { 0 },
            faults: Faults::default(),
            created_at: Some(a.created_at),
        };
        let item = serde_dynamo::to_item(&entry).unwrap();
        self.store.client().put_item().table_name(&self.ledger_table).set_item(Some(item)).send().await.unwrap();
    }

    /// An order paid at `at` through attempt `a` (the settle that confirms
    /// its stock never runs).
    async fn paid(&self, at: Timestamp) -> (Order, PaymentAttempt) {
        let o = self.order(at, false).await;
        let a = self.attempt(&o, at).await;
        let o = self.fresh(&o).await;
        let ev = Evidence { at, source: "t".into(), status: PaymentStatus::Succeeded, detail: None };
        assert_eq!(
            self.store.settle_success(&o, &a, &format!("tx_{}", a.payment_id), ev, None, "").await.unwrap(),
            SettleResult::Paid
        );
        (self.fresh(&o).await, a)
    }

    /// An order with a payment attempt, closed by the closer at `at`.
    async fn closed_after_check(&self, at: Timestamp) -> (Order, PaymentAttempt) {
        let o = self.order(at.minus(Duration::from_secs(120)), false).await;
        let a = self.attempt(&o, at.minus(Duration::from_secs(100))).await;
        let o = self.fresh(&o).await;
        let lease = ClosingLease { started_at: at, owner: "w".into(), lease_until: at, resumes: 0 };
        assert_eq!(self.store.begin_closing(&o, &lease, at).await.unwrap(), Cas::Applied);
        let closing = self.fresh(&o).await;
        assert_eq!(self.store.close_after_check(&closing, at, "t").await.unwrap(), Cas::Applied);
        (self.fresh(&o).await, a)
    }

    /// A success recorded after the close at `at`: a REFUND_PENDING refund.
    async fn late_success(&self, closed: &Order, a: &PaymentAttempt, at: Timestamp) -> Refund {
        let ev = Evidence { at, source: "t".into(), status: PaymentStatus::Succeeded, detail: None };
        let r = self.store.settle_success(closed, a, &format!("tx_{}", a.payment_id), ev, None, "n").await.unwrap();
        assert_eq!(r, SettleResult::RefundPending);
        self.store.refund(&closed.order_id, &a.payment_id).await.unwrap().unwrap()
    }

    fn ports(&self) -> DayPorts<'_, DynamoStore, SandboxChannel> {
        DayPorts { index: &self.store, channel: Some(&self.ledger), bounds: Bounds::default(), shards: SHARDS }
    }
}

/// One of each kind, every one on `on` (orders created, made final, paid
/// at the channel there). Returns the order ids planted.
async fn plant_every_kind(w: &World, on: Day) -> BTreeSet<String> {
    let at = |h: u64| on.start().plus(Duration::from_secs(h * 3600));
    let mut ids = BTreeSet::new();
    // reservation_held_on_closed_order + coupon_locked_on_closed_order.
    let o = w.order(at(8), true).await;
    assert_eq!(w.store.close_unpaid(&o, o.expire_at).await.unwrap(), Cas::Applied);
    ids.insert(o.order_id.to_string());
    // reservation_unconfirmed_on_paid_order, clean at the channel.
    let (o, a) = w.paid(at(9)).await;
    w.line(&a, PaymentStatus::Succeeded, a.amount, false).await;
    ids.insert(o.order_id.to_string());
    // order_paid_without_channel_success.
    let (o, a) = w.paid(at(10)).await;
    w.line(&a, PaymentStatus::Processing, a.amount, false).await;
    ids.insert(o.order_id.to_string());
    // amount_mismatch.
    let (o, a) = w.paid(at(11)).await;
    w.line(&a, PaymentStatus::Succeeded, a.amount - 1, false).await;
    ids.insert(o.order_id.to_string());
    // reservation_released_on_paid_order.
    let (o, a) = w.paid(at(12)).await;
    w.line(&a, PaymentStatus::Succeeded, a.amount, false).await;
    let record = w.store.order_record(&o.order_id).await.unwrap().unwrap();
    let released = w.store.release_reservation(&o.order_id, &record.reservations[0], at(12)).await.unwrap();
    assert!(released.is_ok(), "{released:?}");
    ids.insert(o.order_id.to_string());
    // success_after_close_without_refund + funds_identity_violation.
    let (o, a) = w.closed_after_check(at(13)).await;
    w.line(&a, PaymentStatus::Succeeded, a.amount, false).await;
    ids.insert(o.order_id.to_string());
    // refund_state_mismatch: REFUNDED here, not at the channel.
    let (o, a) = w.closed_after_check(at(14)).await;
    let refund = w.late_success(&o, &a, at(14)).await;
    let done = w.store.update_refund(&refund, RefundStatus::Refunded, Some("re_x"), None, at(14)).await.unwrap();
    assert_eq!(done, Cas::Applied);
    w.line(&a, PaymentStatus::Succeeded, a.amount, false).await;
    ids.insert(o.order_id.to_string());
    // refund_pending_stale: pending since 15:00, stale from 15:15.
    let (o, a) = w.closed_after_check(at(15)).await;
    w.late_success(&o, &a, at(15)).await;
    w.line(&a, PaymentStatus::Succeeded, a.amount, false).await;
    ids.insert(o.order_id.to_string());
    // channel_success_order_unpaid (+ order_open_past_expiry: still open).
    let o = w.order(at(16), false).await;
    let a = w.attempt(&o, at(16)).await;
    w.line(&a, PaymentStatus::Succeeded, a.amount, false).await;
    ids.insert(o.order_id.to_string());
    // channel_success_order_unpaid: an order the table never had.
    let ghost = OrderId::parse(format!("ord_ghost_{on}")).unwrap();
    let ghost_attempt = PaymentAttempt { order_id: ghost.clone(), ..a.clone() };
    let ghost_attempt =
        PaymentAttempt { payment_id: PaymentId::parse(format!("pay_ghost_{on}")).unwrap(), ..ghost_attempt };
    w.line(&ghost_attempt, PaymentStatus::Succeeded, 500, false).await;
    ids.insert(ghost.to_string());
    // undecodable_record: a row of an order final that day.
    let o = w.order(at(17), false).await;
    assert_eq!(w.store.close_unpaid(&o, o.expire_at).await.unwrap(), Cas::Applied);
    let bad = w.store.client().put_item().table_name(w.store.table());
    bad.item("pk", s(keys::order(&o.order_id)))
        .item("sk", s("PAY#pay_bad"))
        .item("entity", s("PAYMENT"))
        .item("status", s("HALF_PAID"))
        .send()
        .await
        .unwrap();
    ids.insert(o.order_id.to_string());
    ids
}

/// A SKU whose `reserved` was raised by hand: both stock kinds (its
/// counters no longer add up to `supplied`, and nothing holds the unit).
async fn plant_catalog_kinds(w: &World) {
    let z = Sku::parse("Z").unwrap();
    system_tests::fixtures::seed_stock(&w.store, &z, 10, &eur(100)).await.unwrap();
    w.store
        .client()
        .update_item()
        .table_name(w.store.table())
        .key("pk", s(keys::sku(&z)))
        .key("sk", s(keys::STOCK_SK))
        .update_expression("SET reserved = reserved + :one")
        .expression_attribute_values(":one", n(1))
        .send()
        .await
        .unwrap();
    // points_balance_mismatch: 5 points held that no order holds.
    let user = UserId::parse("points-planted").unwrap();
    let req = order_core::usecases::points::CreditRequest {
        user_id: user.clone(),
        currency: Currency::parse("EUR").unwrap(),
        key: IdempotencyKey::parse("planted").unwrap(),
        delta: 100,
        reason: "test".into(),
        by: "ops".into(),
    };
    order_core::usecases::points::credit_points(&w.store, &FixedClock::at(run_time().unix_millis()), req)
        .await
        .unwrap();
    w.store
        .client()
        .update_item()
        .table_name(w.store.table())
        .key("pk", s(keys::buyer(&user)))
        .key("sk", s(keys::POINTS_SK))
        .update_expression("SET held = held + :five")
        .expression_attribute_values(":five", n(5))
        .send()
        .await
        .unwrap();
}

/// Starts a run of `day` and delivers its piece messages, in `order`, to
/// the worker's handler through `ports`; a failed delivery is delivered
/// again up to [`MAX_RECEIVES`] times. Returns the run and the report.
async fn run_day<I: DayIndex>(
    w: &World,
    ports: &DayPorts<'_, I, SandboxChannel>,
    day: Day,
    reverse: bool,
) -> (DayRun, DayReport) {
    // Each run a millisecond after the one before: the latest run of a
    // day is the one with the latest start.
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let started = run_time().plus(Duration::from_millis(RUNS.fetch_add(1, Ordering::SeqCst)));
    let run = DayRun::new(day, SHARDS, started, rand::random());
    assert_eq!(w.store.start_run(&run).await.unwrap(), Cas::Applied);
    let mut pieces = run.pieces.clone();
    if reverse {
        pieces.reverse();
    }
    for piece in pieces {
        let body = serde_json::to_string(&PieceMessage { day, run_id: run.run_id.clone(), piece }).unwrap();
        for _ in 0..MAX_RECEIVES {
            if piece_message(ports, &w.store, &body, run_time()).await.is_ok() {
                break;
            }
        }
    }
    let report = day_report(&w.store, day, Some(&run.run_id)).await.unwrap().expect("the run's report");
    (run, report)
}

fn orders_named(report: &DayReport) -> BTreeSet<String> {
    report.discrepancies.iter().filter(|d| !d.order_id.is_empty()).map(|d| d.order_id.clone()).collect()
}

fn kinds(report: &DayReport) -> BTreeSet<&'static str> {
    report.discrepancies.iter().map(|d| d.kind.as_str()).collect()
}

#[tokio::test]
async fn a_days_run_finds_every_kind_planted_that_day_and_nothing_of_the_day_before() {
    let w = World::new().await;
    let today = plant_every_kind(&w, day()).await;
    let yesterday = plant_every_kind(&w, day().previous()).await;
    plant_catalog_kinds(&w).await;
    let (_, report) = run_day(&w, &w.ports(), day(), false).await;
    assert!(report.complete, "{:?}", report.pieces_missing);
    let all: BTreeSet<&str> = DiscrepancyKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(kinds(&report), all, "every kind is found on its day: {:#?}", report.discrepancies);
    let named = orders_named(&report);
    assert!(named.is_subset(&today), "only the day's orders: {:?}", named.difference(&today).collect::<Vec<_>>());
    assert!(named.is_disjoint(&yesterday));
    assert_eq!(named, today, "every order planted that day is named");
    // And the day before finds its own, none of this day's.
    let (_, before) = run_day(&w, &w.ports(), day().previous(), false).await;
    assert_eq!(orders_named(&before), yesterday);
    assert_eq!(kinds(&before), all);
}

/// A day index whose reads of one partition fail a number of times.
struct FailingPart<'a> {
    inner: &'a DynamoStore,
    part: String,
    failures_left: AtomicU32,
}

#[async_trait::async_trait]
impl DayIndex for FailingPart<'_> {
    async fn reconcile_page(&self, part: &str, limit: u32, start: Option<DueCursor>) -> Result<IndexPage, Unavailable> {
        if part == self.part && self.failures_left.load(Ordering::SeqCst) > 0 {
            self.failures_left.fetch_sub(1, Ordering::SeqCst);
            return Err(Unavailable::new("query an index partition", "injected: throttled"));
        }
        self.inner.reconcile_page(part, limit, start).await
    }
    async fn in_flight_page(
        &self,
        shard: &str,
        limit: u32,
        start: Option<DueCursor>,
    ) -> Result<IndexPage, Unavailable> {
        self.inner.in_flight_page(shard, limit, start).await
    }
    async fn order_records(&self, orders: &[OrderId]) -> Result<RecordsRead, Unavailable> {
        self.inner.order_records(orders).await
    }
    async fn catalog_entry(&self, sku: &Sku) -> Result<CatalogEntry, Unavailable> {
        self.inner.catalog_entry(sku).await
    }
    async fn points_entry(&self, user: &UserId) -> Result<PointsEntry, Unavailable> {
        self.inner.points_entry(user).await
    }
}

#[tokio::test]
async fn a_failing_piece_is_retried_and_once_out_of_receives_is_reported_missing() {
    let w = World::new().await;
    let today = plant_every_kind(&w, day()).await;
    // The failing partition is one that holds a planted order (ids are
    // random, so a fixed partition is sometimes empty), and the piece that
    // reads it is the one the report must name.
    let planted = OrderId::parse(today.iter().next().unwrap()).unwrap();
    let part = keys::day_part(&planted, day().start());
    let piece = format!("shard-{}", keys::shard_of(&planted, RECONCILE_SHARDS) % SHARDS);
    let flaky =
        |failures: u32| FailingPart { inner: &w.store, part: part.clone(), failures_left: AtomicU32::new(failures) };
    // Two failures, then it goes through on the third receive.
    let index = flaky(MAX_RECEIVES - 1);
    let ports = DayPorts { index: &index, channel: Some(&w.ledger), bounds: Bounds::default(), shards: SHARDS };
    let (_, retried) = run_day(&w, &ports, day(), false).await;
    assert!(retried.complete, "{:?}", retried.pieces_missing);
    assert_eq!(orders_named(&retried), today);
    // Failing on every receive: the message goes to the DLQ, the report
    // names the piece, and the stock comparison waits for it.
    let index = flaky(u32::MAX);
    let ports = DayPorts { index: &index, channel: Some(&w.ledger), bounds: Bounds::default(), shards: SHARDS };
    let (run, broken) = run_day(&w, &ports, day(), false).await;
    assert!(!broken.complete);
    assert_eq!(broken.pieces_missing, std::slice::from_ref(&piece));
    assert!(broken.stock_reserved_checked, "the catalog piece compares the stock without the shards");
    assert!(orders_named(&broken).is_subset(&today));
    assert!(!orders_named(&broken).contains(planted.as_str()), "the failing piece's orders are not in it");
    assert_eq!(w.store.save_report(&broken).await.unwrap(), Cas::Applied, "no complete report was stored");
    // The latest run of the day is the one shown.
    let shown = day_report(&w.store, day(), None).await.unwrap().unwrap();
    assert_eq!(shown.run_id, run.run_id);
    assert_eq!(shown.pieces_missing, [piece]);
}

#[tokio::test]
async fn the_report_is_the_same_whatever_order_the_pieces_ran_in() {
    let w = World::new().await;
    plant_every_kind(&w, day()).await;
    plant_catalog_kinds(&w).await;
    let (_, forward) = run_day(&w, &w.ports(), day(), false).await;
    let (_, backward) = run_day(&w, &w.ports(), day(), true).await;
    assert!(forward.complete && backward.complete);
    assert_eq!(forward.discrepancies, backward.discrepancies);
    assert_eq!(forward.counts, backward.counts);
    assert_eq!(
        (forward.orders_checked, forward.payments_checked, forward.stocks_checked),
        (backward.orders_checked, backward.payments_checked, backward.stocks_checked)
    );
}

/// `count` orders made final on the 30 days before the day under test,
/// written directly (their index entries as the final writes leave them).
pub async fn plant_older_final_orders(store: &DynamoStore, count: usize, offset: usize) {
    let items: Vec<_> = (offset..offset + count)
        .map(|i| {
            let id = OrderId::parse(format!("ord_old_{i:07}")).unwrap();
            let at = day().start().minus(Duration::from_secs(86_400 * (1 + (i as u64 % 30)) - 3600));
            let mut item = std::collections::HashMap::new();
            item.insert("pk".to_owned(), s(keys::order(&id)));
            item.insert("sk".to_owned(), s(keys::ORDER_SK));
            item.insert("entity".to_owned(), s("ORDER"));
            item.insert("status".to_owned(), s("CLOSED"));
            item.insert("recon_part".to_owned(), s(keys::day_part(&id, at)));
            item.insert("recon_at".to_owned(), s(at.to_string()));
            item
        })
        .collect();
    system_tests::batch_put(store, items).await;
}

#[tokio::test]
async fn a_days_run_reads_the_same_items_over_a_thousand_or_ten_thousand_older_orders() {
    let w = World::new().await;
    plant_every_kind(&w, day()).await;
    plant_older_final_orders(&w.store, 1_000, 0).await;
    let (_, small) = run_day(&w, &w.ports(), day(), false).await;
    plant_older_final_orders(&w.store, 9_000, 1_000).await;
    let (_, large) = run_day(&w, &w.ports(), day(), false).await;
    assert!(small.complete && large.complete);
    assert!(small.cost.items > 0 && small.cost.capacity_units > 0.0, "{:?}", small.cost);
    assert_eq!(small.cost, large.cost, "the day's reads do not grow with other days' orders");
    assert_eq!(small.discrepancies, large.discrepancies);
}

/// `target/<profile>/orderctl`, beside the `deps/` folder this test runs
/// from (`cargo build -p orderctl`; infra/test.sh builds it).
fn orderctl_path() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps/<test>");
    let bin = profile_dir.join("orderctl");
    assert!(bin.is_file(), "{} is missing: run `cargo build -p orderctl`", bin.display());
    bin
}

/// `orderctl --json reconcile --day DAY --show` on the test's table.
fn orderctl_show(w: &World) -> (Option<i32>, serde_json::Value) {
    let env_file = std::env::temp_dir().join(format!("reconcile-day-{}.env", rand::random::<u64>()));
    std::fs::write(&env_file, format!("ORDERS_TABLE_NAME={}\n", w.store.table())).unwrap();
    let out = std::process::Command::new(orderctl_path())
        .args(["--env-file", env_file.to_str().unwrap(), "--json", "reconcile", "--day", DAY, "--show"])
        .env("AWS_ENDPOINT_URL", std::env::var("DYNAMODB_LOCAL_ENDPOINT").unwrap())
        .env("AWS_REGION", system_tests::REGION)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .output()
        .expect("run orderctl");
    let _ = std::fs::remove_file(env_file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), report)
}

#[tokio::test]
async fn orderctl_shows_the_days_latest_run_and_names_its_missing_pieces() {
    let w = World::new().await;
    plant_every_kind(&w, day()).await;
    let (_, complete) = run_day(&w, &w.ports(), day(), false).await;
    let (code, shown) = orderctl_show(&w);
    assert_eq!(code, Some(3), "discrepancies found: {shown}");
    assert_eq!(shown["run_id"], complete.run_id.as_str());
    assert_eq!(shown["counts"]["amount_mismatch"], 1);
    // A later run with a piece that never reports is the one shown, and
    // its missing piece is an error.
    let index = FailingPart { inner: &w.store, part: format!("{DAY}#2"), failures_left: AtomicU32::new(u32::MAX) };
    let ports = DayPorts { index: &index, channel: Some(&w.ledger), bounds: Bounds::default(), shards: SHARDS };
    let (broken, _) = run_day(&w, &ports, day(), false).await;
    let (code, shown) = orderctl_show(&w);
    assert_eq!(code, Some(1), "{shown}");
    assert_eq!(shown["run_id"], broken.run_id.as_str());
    assert_eq!(shown["pieces_missing"], json!(["shard-2"]));
}

/// Starts a run of `day` at `started` and delivers each piece message to
/// the worker's handler as of `now` (redelivered on failure up to
/// [`MAX_RECEIVES`] times) through `ports`, storing through `runs`.
async fn run_day_with<I: DayIndex, R: DayRuns>(
    w: &World,
    ports: &DayPorts<'_, I, SandboxChannel>,
    runs: &R,
    run: DayRun,
    now: Timestamp,
) -> DayReport {
    assert_eq!(w.store.start_run(&run).await.unwrap(), Cas::Applied);
    for piece in run.pieces.clone() {
        let body = serde_json::to_string(&PieceMessage { day: run.day, run_id: run.run_id.clone(), piece }).unwrap();
        for _ in 0..MAX_RECEIVES {
            if piece_message(ports, runs, &body, now).await.is_ok() {
                break;
            }
        }
    }
    day_report(&w.store, run.day, Some(&run.run_id)).await.unwrap().expect("the run's report")
}

/// `refund_state_mismatch` belongs to the day the refund became final. A
/// refund that ends two days after its payment was opened (retries, a
/// give-up redriven later) is read on its day, when its payment lies
/// before the day's statement window [D - 1 day, D + 1 day): the piece
/// reads the channel for that earlier window too, instead of counting the
/// order as outside the statement. The run of the order's own day, at its
/// scheduled time, saw the refund still pending.
#[tokio::test]
async fn a_refund_recorded_refunded_days_after_its_payment_is_checked_against_the_channel_on_its_day() {
    let w = World::new().await;
    let order_day = day().previous().previous();
    let at = order_day.start().plus(Duration::from_secs(14 * 3600));
    let (o, a) = w.closed_after_check(at).await;
    let refund = w.late_success(&o, &a, at).await;
    // The channel took the money and never refunded it.
    w.line(&a, PaymentStatus::Succeeded, a.amount, false).await;
    // The order's own day, run by the schedule at 03:00 the next day: the
    // refund is still pending then.
    let scheduled = order_day.end().plus(Duration::from_secs(3 * 3600));
    let early = run_day_with(&w, &w.ports(), &w.store, DayRun::new(order_day, SHARDS, scheduled, 1), scheduled).await;
    assert!(early.complete);
    let mismatch_for = |r: &DayReport| {
        r.discrepancies.iter().any(|d| d.kind == "refund_state_mismatch" && d.order_id == o.order_id.to_string())
    };
    assert!(!mismatch_for(&early), "not yet a mismatch while the refund is pending: {:#?}", early.discrepancies);
    // Two days later the refund is recorded REFUNDED here, but the channel
    // still has no refund: the refund's day must report the mismatch.
    let ended = day().start().plus(Duration::from_secs(10 * 3600));
    let done = w.store.update_refund(&refund, RefundStatus::Refunded, Some("re_never"), None, ended).await.unwrap();
    assert_eq!(done, Cas::Applied);
    let report = run_day_with(&w, &w.ports(), &w.store, DayRun::new(day(), SHARDS, run_time(), 2), run_time()).await;
    assert!(report.complete, "{:?}", report.pieces_missing);
    assert!(
        mismatch_for(&report),
        "the refund's day must compare it with the channel; got {:#?} (orders outside the statement: {})",
        report.discrepancies,
        report.orders_outside_statement
    );
}

/// Day runs whose storing of the merged report fails a number of times
/// (a throttle, a timeout of the function after the part was stored).
struct FailingReport<'a> {
    inner: &'a DynamoStore,
    failures_left: AtomicU32,
}

#[async_trait::async_trait]
impl DayRuns for FailingReport<'_> {
    async fn start_run(&self, run: &DayRun) -> Result<Cas, Unavailable> {
        self.inner.start_run(run).await
    }
    async fn day_run(&self, day: Day, run_id: Option<&str>) -> Result<Option<DayRun>, Unavailable> {
        self.inner.day_run(day, run_id).await
    }
    async fn save_part(&self, part: &order_core::usecases::reconcile_day::PartialReport) -> Result<Cas, Unavailable> {
        self.inner.save_part(part).await
    }
    async fn parts(
        &self,
        day: Day,
        run_id: &str,
    ) -> Result<Vec<order_core::usecases::reconcile_day::PartialReport>, Unavailable> {
        self.inner.parts(day, run_id).await
    }
    async fn save_report(&self, report: &DayReport) -> Result<Cas, Unavailable> {
        if self.failures_left.load(Ordering::SeqCst) > 0 {
            self.failures_left.fetch_sub(1, Ordering::SeqCst);
            return Err(Unavailable::new("save the day's report", "injected: throttled"));
        }
        self.inner.save_report(report).await
    }
}

/// The last piece stores its part, then fails to store the merged report;
/// SQS delivers it again. The redelivery finds its part stored
/// (`PartStored::AlreadyStored`) and returns without merging, so the
/// day's REPORT is never stored and its metrics (`Discrepancy.*`,
/// `ReconcileCompleted`) are never emitted although every piece reported.
#[tokio::test]
async fn the_days_report_is_stored_when_the_last_piece_is_redelivered_after_its_merge_failed() {
    let w = World::new().await;
    plant_every_kind(&w, day()).await;
    let runs = FailingReport { inner: &w.store, failures_left: AtomicU32::new(1) };
    let run = DayRun::new(day(), SHARDS, run_time(), 3);
    let report = run_day_with(&w, &w.ports(), &runs, run, run_time()).await;
    assert!(report.complete, "every piece reported: {:?}", report.pieces_missing);
    assert_eq!(runs.failures_left.load(Ordering::SeqCst), 0, "the first merge's store failed");
    assert_eq!(
        w.store.save_report(&report).await.unwrap(),
        Cas::Rejected,
        "the merged report must have been stored by the redelivery"
    );
}

/// docs/data-model.md#the-due-index-gsi-due-index-open-orders-and-pending-effects
/// lets an operator lower `DueIndexShardsSweep` once the due index's old
/// entries are gone (a payment window plus the effects grace). The reconcile
/// index's entries never leave: an order made final on D under 16 shards must
/// still be read by a run with the lowered count (8 pieces).
#[tokio::test]
async fn an_order_final_before_the_shard_count_was_lowered_is_read_by_its_days_run() {
    let w = World::new().await;
    let before = w.store.clone().with_shards(DueShards { count: 16, sweep_count: 16 });
    let at = day().start().plus(Duration::from_secs(8 * 3600));
    // An order in one of the shards the lowered count drops, closed
    // unpaid with its stock still held (reservation_held_on_closed_order).
    let o = loop {
        let o = w.order(at, false).await;
        if o.order_id.shard(16) >= 8 {
            break o;
        }
    };
    assert_eq!(before.close_unpaid(&o, o.expire_at).await.unwrap(), Cas::Applied);
    // Later that day the count is lowered to 8, the due index drained.
    let after = w.store.clone().with_shards(DueShards { count: 8, sweep_count: 8 });
    let ports = DayPorts { index: &after, channel: Some(&w.ledger), bounds: Bounds::default(), shards: 8 };
    let report = run_day_with(&w, &ports, &after, DayRun::new(day(), 8, run_time(), 4), run_time()).await;
    assert!(report.complete, "{:?}", report.pieces_missing);
    assert!(
        orders_named(&report).contains(&o.order_id.to_string()),
        "the order closed on {DAY} with its stock held is not in its day's report: {:#?}",
        report.discrepancies
    );
}

/// `STATEMENT_LOOKBACK` is one day, but `PaymentWindowSeconds` has no
/// maximum: with a window over a day, a payment opened on D-2 and
/// succeeding on D (a different amount at the channel) lies outside D's
/// statement, and D-2's piece sees the line while the order is not final.
/// D's piece reads the earlier window for it and reports the mismatch.
#[tokio::test]
async fn a_paid_order_whose_payment_was_opened_two_days_earlier_is_compared_with_the_channel() {
    let w = World::new().await;
    let opened = day().previous().previous().start().plus(Duration::from_secs(12 * 3600));
    let o = w.order(opened, false).await;
    let a = w.attempt(&o, opened).await;
    let o = w.fresh(&o).await;
    let paid_at = day().start().plus(Duration::from_secs(10 * 3600));
    let ev = Evidence { at: paid_at, source: "t".into(), status: PaymentStatus::Succeeded, detail: None };
    let settled = w.store.settle_success(&o, &a, &format!("tx_{}", a.payment_id), ev, None, "").await.unwrap();
    assert_eq!(settled, SettleResult::Paid);
    w.line(&a, PaymentStatus::Succeeded, a.amount - 1, false).await;
    let mut named = Vec::new();
    for (i, d) in [day().previous().previous(), day().previous(), day()].into_iter().enumerate() {
        let run = DayRun::new(d, SHARDS, run_time().plus(Duration::from_millis(i as u64)), 10 + i as u32);
        let report = run_day_with(&w, &w.ports(), &w.store, run, run_time()).await;
        assert!(report.complete);
        named.extend(
            report
                .discrepancies
                .iter()
                .filter(|x| x.kind == "amount_mismatch" && x.order_id == o.order_id.to_string())
                .map(|_| d),
        );
    }
    assert!(
        !named.is_empty(),
        "the channel took {} for a payment of {}: no day run reports it",
        a.amount - 1,
        a.amount
    );
}

/// `stock_reserved_mismatch` compares each SKU's `reserved` with the
/// RESERVED units of the orders in flight. Were they read by different
/// pieces at different times (a retried piece comes back 30 minutes
/// later), an order placed between them (the schedule runs at 03:00 while
/// the shop sells) would be a unit counted by the catalog and held by no
/// order read: a mismatch although the stock is consistent.
#[tokio::test]
async fn an_order_placed_while_a_day_run_is_in_flight_is_not_a_stock_mismatch() {
    let w = World::new().await;
    let run = DayRun::new(day(), SHARDS, run_time(), 30);
    assert_eq!(w.store.start_run(&run).await.unwrap(), Cas::Applied);
    let ports = w.ports();
    for piece in run.pieces.iter().filter(|p| p.starts_with("shard-")).cloned().chain(["catalog".to_owned()]) {
        if piece == "catalog" {
            // A customer orders two units of A while the catalog piece waits.
            w.order(run_time(), false).await;
        }
        let body = serde_json::to_string(&PieceMessage { day: run.day, run_id: run.run_id.clone(), piece }).unwrap();
        piece_message(&ports, &w.store, &body, run_time()).await.unwrap();
    }
    let report = day_report(&w.store, day(), Some(&run.run_id)).await.unwrap().unwrap();
    assert!(report.complete && report.stock_reserved_checked);
    assert_eq!(
        report.counts.get("stock_reserved_mismatch").copied().unwrap_or(0),
        0,
        "the stock is consistent: {:#?}",
        report.discrepancies
    );
}

/// Credits `points` to `user` (an audited credit) and places an order of
/// `user` at `at` spending `spend` of them.
async fn order_with_points(w: &World, user: &str, points: i64, spend: u32, at: Timestamp) -> Order {
    let req = order_core::usecases::points::CreditRequest {
        user_id: UserId::parse(user).unwrap(),
        currency: Currency::parse("EUR").unwrap(),
        key: IdempotencyKey::parse(format!("credit-{}", rand::random::<u32>())).unwrap(),
        delta: points,
        reason: "test".into(),
        by: "ops".into(),
    };
    order_core::usecases::points::credit_points(&w.store, &FixedClock::at(at.unix_millis()), req).await.unwrap();
    let create = fixtures::creator(&w.store, &FixedClock::at(at.unix_millis()), Duration::from_secs(60), "t");
    let body = json!({"user_id": user, "currency": "EUR", "items": [{"sku": "A", "qty": 2}], "points": spend});
    let key = format!("k{}", rand::random::<u64>());
    create.execute_as_named(Some(&key), body.to_string().as_bytes()).await.unwrap().order
}

#[tokio::test]
async fn a_points_balance_that_disagrees_with_its_open_orders_or_its_credits_is_reported() {
    let w = World::new().await;
    let at = day().start().plus(Duration::from_secs(3600));
    // Consistent: 150 of 500 held by an open order.
    order_with_points(&w, "points-ok", 500, 150, at).await;
    // Planted: the balance says 40 more held than its open order holds.
    order_with_points(&w, "points-held", 500, 100, at).await;
    // Planted: 70 points that no audited credit gave.
    order_with_points(&w, "points-credited", 300, 50, at).await;
    let edit = |user: &str, expr: &str, v: i64| {
        w.store
            .client()
            .update_item()
            .table_name(w.store.table())
            .key("pk", s(keys::buyer(&UserId::parse(user).unwrap())))
            .key("sk", s(keys::POINTS_SK))
            .update_expression(expr.to_owned())
            .expression_attribute_values(":v", n(v))
            .send()
    };
    edit("points-held", "SET held = held + :v, available = available - :v", 40).await.unwrap();
    edit("points-credited", "SET available = available + :v, credited = credited + :v", 70).await.unwrap();

    let (_, report) = run_day(&w, &w.ports(), day(), false).await;
    let found: Vec<_> = report.discrepancies.iter().filter(|d| d.kind == "points_balance_mismatch").collect();
    let keys: BTreeSet<&str> = found.iter().map(|d| d.key.as_deref().unwrap()).collect();
    assert_eq!(keys, BTreeSet::from(["BUYER#points-held/POINTS", "BUYER#points-credited/POINTS"]), "{found:?}");
    let held = found.iter().find(|d| d.key.as_deref() == Some("BUYER#points-held/POINTS")).unwrap();
    assert!(held.detail.contains("held 140, the open orders hold 100"), "{}", held.detail);
    let credited = found.iter().find(|d| d.key.as_deref() == Some("BUYER#points-credited/POINTS")).unwrap();
    assert!(credited.detail.contains("add up to 300"), "{}", credited.detail);

    // The full read finds the same two.
    let full = order_core::usecases::reconcile::reconcile(
        &w.store.scan_snapshot().await.unwrap(),
        None,
        &Bounds::default(),
        run_time(),
    );
    let full_keys: BTreeSet<String> = full
        .discrepancies
        .iter()
        .filter(|d| d.kind == "points_balance_mismatch")
        .map(|d| d.key.clone().unwrap())
        .collect();
    assert_eq!(full_keys, keys.iter().map(|k| k.to_string()).collect(), "{:?}", full.discrepancies);
}
