//! Operators' stock changes on DynamoDB Local: each is applied once per
//! idempotency key, even when its answer is lost and the request is sent
//! again (by the SDK, or by the operator after a 5xx); each leaves an audit
//! record; and reconciliation checks every SKU's counts against its
//! records.

use aws_sdk_dynamodb::config::interceptors::BeforeDeserializationInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::Client;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use order_core::aws::dynamo::{keys, n, s, DynamoStore};
use order_core::aws::lost_answers::LostAnswers;
use order_core::domain::catalog::with_supply;
use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::queries::{self, StockChange, StockChanged, StockRequest};
use order_core::usecases::reconcile::{reconcile, Bounds};
use order_core::usecases::UseCaseError;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use system_tests::fakes::FixedClock;
use system_tests::fixtures::{self, eur};
use system_tests::CreateAsNamed;
use system_tests::{dynamodb_local, fresh_table};

const T0: i64 = 1_800_000_000_000;

fn sku(v: &str) -> Sku {
    Sku::parse(v).unwrap()
}

/// Each change a millisecond after the one before, as the server's clock
/// would have it.
async fn change(store: &DynamoStore, s: &str, c: StockChange, key: Option<&str>) -> Result<StockChanged, UseCaseError> {
    static TICK: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
    let at = FixedClock::at(T0 + TICK.fetch_add(1, Ordering::SeqCst));
    let req = StockRequest { change: c, key: key.map(|k| IdempotencyKey::parse(k).unwrap()), by: "ops@example".into() };
    queries::put_stock(store, &at, &RandomIds, &sku(s), req).await
}

async fn seeded(available: i64) -> DynamoStore {
    let store = fresh_table(&dynamodb_local().await).await;
    change(&store, "A", StockChange::Seed { available, price: eur(100) }, Some("seed-a")).await.unwrap();
    store
}

/// The same table through a client that loses the answers of the next
/// `count` calls of each operation named.
async fn losing(store: &DynamoStore, operations: &[&str], count: usize) -> (DynamoStore, Vec<LostAnswers>) {
    let lost: Vec<LostAnswers> = operations.iter().map(|op| LostAnswers::next(*op, count)).collect();
    let base = dynamodb_local().await;
    let mut conf = base.config().to_builder();
    for l in &lost {
        conf = conf.interceptor(l.clone());
    }
    (DynamoStore::new(Client::from_conf(conf.build()), store.table()), lost)
}

async fn available(store: &DynamoStore, s: &str) -> i64 {
    store.stock(&sku(s)).await.unwrap().unwrap().available
}

fn report_kinds(store_snapshot: &TableSnapshot) -> Vec<(String, String)> {
    let r = reconcile(store_snapshot, None, &Bounds::default(), Timestamp::from_unix_millis(T0));
    r.discrepancies
        .iter()
        .filter(|d| d.kind == "stock_supply_mismatch")
        .map(|d| (d.key.clone().unwrap_or_default(), d.detail.clone()))
        .collect()
}

fn report_details(snapshot: &TableSnapshot) -> Vec<String> {
    report_kinds(snapshot).into_iter().map(|(k, d)| format!("{k}: {d}")).collect()
}

#[tokio::test]
async fn a_stock_adjust_whose_answer_is_lost_is_applied_once() {
    let store = seeded(10).await;
    // The write reaches the table, its answer does not: the SDK sends the
    // same request again (the old adjust was an UpdateItem; it is now one
    // transaction with its audit record).
    let (lossy, lost) = losing(&store, &["UpdateItem", "TransactWriteItems"], 1).await;
    let done = change(&lossy, "A", StockChange::Adjust(5), Some("restock-1")).await.unwrap();
    assert_eq!(lost.iter().map(LostAnswers::lost).sum::<usize>(), 1, "one answer was lost");
    assert_eq!(available(&store, "A").await, 15, "applied once, not twice");
    assert_eq!(done.stock.available, 15);
    let history = store.stock_changes(&sku("A")).await.unwrap();
    assert_eq!(history.len(), 2, "the seed and one adjustment: {history:?}");
}

#[tokio::test]
async fn an_operator_retry_with_the_same_key_is_answered_without_a_second_change() {
    let store = seeded(10).await;
    let first = change(&store, "A", StockChange::Adjust(-3), Some("shrink-7")).await.unwrap();
    assert!(!first.replayed);
    let again = change(&store, "A", StockChange::Adjust(-3), Some("shrink-7")).await.unwrap();
    assert!(again.replayed, "the second send is a replay");
    assert_eq!(available(&store, "A").await, 7);
    // The same key with another change is refused and changes nothing.
    let err = change(&store, "A", StockChange::Adjust(-4), Some("shrink-7")).await.unwrap_err();
    assert_eq!(err.code(), "idempotency_key_reused");
    assert!(err.to_string().contains("adjust -3"), "names the change the key was used for: {err}");
    assert_eq!(available(&store, "A").await, 7);
    assert_eq!(store.stock_changes(&sku("A")).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_replayed_swap_is_answered_as_done_even_after_the_count_moved_on() {
    let store = seeded(10).await;
    change(&store, "A", StockChange::Swap { available: 20, expected: 10 }, Some("count-2026")).await.unwrap();
    change(&store, "A", StockChange::Adjust(1), Some("later")).await.unwrap();
    // `if_available: 10` is no longer true, but this key's swap was made.
    let again = change(&store, "A", StockChange::Swap { available: 20, expected: 10 }, Some("count-2026")).await;
    assert!(again.unwrap().replayed);
    assert_eq!(available(&store, "A").await, 21);
}

#[tokio::test]
async fn each_change_leaves_a_record_of_who_when_the_delta_and_the_supply_before_and_after() {
    let store = seeded(10).await;
    let clock = FixedClock::at(T0);
    // An order moves units from available to reserved: the supply stays.
    let create = fixtures::creator(&store, &clock, Duration::from_secs(60), "t");
    let body = json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "A", "qty": 4, "unit_price": 100}]});
    create.execute_as_named(Some("o1"), body.to_string().as_bytes()).await.unwrap();
    change(&store, "A", StockChange::Adjust(-2), Some("damaged")).await.unwrap();
    change(&store, "A", StockChange::Swap { available: 10, expected: 4 }, Some("recount")).await.unwrap();
    change(&store, "A", StockChange::Reprice(eur(120)), Some("price-up")).await.unwrap();

    let history = store.stock_changes(&sku("A")).await.unwrap();
    let rows: Vec<_> = with_supply(&history)
        .into_iter()
        .map(|(before, after, c)| (c.kind, c.delta, before, after, c.available_before, c.available_after))
        .collect();
    assert_eq!(
        rows,
        [
            (StockChangeKind::Seed, 10, 0, 10, Some(0), Some(10)),
            (StockChangeKind::Adjust, -2, 10, 8, None, None),
            (StockChangeKind::Swap, 6, 8, 14, Some(4), Some(10)),
            (StockChangeKind::Reprice, 0, 14, 14, None, None),
        ]
    );
    assert!(history.iter().all(|c| c.by == "ops@example" && c.at >= Timestamp::from_unix_millis(T0)));
    assert_eq!(history.iter().find(|c| c.kind == StockChangeKind::Reprice).unwrap().price, Some(eur(120)));
    let stock = store.stock(&sku("A")).await.unwrap().unwrap();
    assert_eq!((stock.available, stock.reserved, stock.supplied, stock.changes), (10, 4, 14, 4));
    assert!(report_kinds(&store.scan_snapshot().await.unwrap()).is_empty(), "the counts agree with the records");
}

#[tokio::test]
async fn concurrent_changes_of_one_sku_are_each_applied_once() {
    let store = seeded(100).await;
    // Ten adjustments and ten price changes at once, as an operator's
    // script might send them.
    let results = futures::future::join_all((0..20).map(|i| {
        let store = store.clone();
        let c = if i % 2 == 0 { StockChange::Adjust(1) } else { StockChange::Reprice(eur(100 + i)) };
        async move { change(&store, "A", c, Some(&format!("c{i}"))).await }
    }))
    .await;
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(available(&store, "A").await, 110);
    let history = store.stock_changes(&sku("A")).await.unwrap();
    assert_eq!(history.len(), 21, "the seed and twenty changes, each recorded once");
    let stock = store.stock(&sku("A")).await.unwrap().unwrap();
    assert_eq!((stock.supplied, stock.changes), (110, 21));
    assert!(report_kinds(&store.scan_snapshot().await.unwrap()).is_empty());
}

#[tokio::test]
async fn reconciliation_reports_a_delta_applied_without_its_record() {
    let store = seeded(10).await;
    change(&store, "A", StockChange::Adjust(5), Some("restock")).await.unwrap();
    // The old adjust, re-sent after a lost answer: the delta once more,
    // with no record of it.
    store
        .client()
        .update_item()
        .table_name(store.table())
        .key("pk", s(keys::sku(&sku("A"))))
        .key("sk", s(keys::STOCK_SK))
        .update_expression("SET available = available + :d")
        .expression_attribute_values(":d", n(5))
        .send()
        .await
        .unwrap();
    let found = report_kinds(&store.scan_snapshot().await.unwrap());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "SKU#A/STOCK");
    assert!(found[0].1.contains("= 20, not the supplied 15"), "{found:?}");
}

#[tokio::test]
async fn a_request_without_a_key_still_leaves_a_record_and_a_sku_seeded_before_records_can_be_changed() {
    let store = fresh_table(&dynamodb_local().await).await;
    // A stock row written before changes were audited (no supplied, no changes).
    store
        .client()
        .put_item()
        .table_name(store.table())
        .item("pk", s(keys::sku(&sku("OLD"))))
        .item("sk", s(keys::STOCK_SK))
        .item("entity", s("STOCK"))
        .item("sku", s("OLD"))
        .item("available", n(6))
        .item("reserved", n(1))
        .item("sold", n(3))
        .send()
        .await
        .unwrap();
    assert!(report_kinds(&store.scan_snapshot().await.unwrap()).is_empty(), "nothing to compare yet");
    let done = change(&store, "OLD", StockChange::Adjust(2), None).await.unwrap();
    assert_eq!(done.stock.available, 8);
    let history = store.stock_changes(&sku("OLD")).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!((history[0].baseline, history[0].delta), (Some(10), 2), "the history starts at its counts");
    assert!(history[0].key.as_str().starts_with("auto_"), "a key made for the request: {}", history[0].key);
    assert!(report_kinds(&store.scan_snapshot().await.unwrap()).is_empty());
}

/// Runs `action` (on its own thread and runtime, with its own client) the
/// first time a Scan's answer arrives, i.e. between the scan's first and
/// second page: what any operator change does when it lands while the
/// daily reconciliation is reading the table.
#[derive(Debug, Clone)]
struct BetweenScanPages {
    table: String,
    fired: Arc<AtomicUsize>,
    pages: Arc<AtomicUsize>,
}

impl Intercept for BetweenScanPages {
    fn name(&self) -> &'static str {
        "BetweenScanPages"
    }

    fn read_before_deserialization(
        &self,
        _: &BeforeDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if cfg.load::<Metadata>().map(|m| m.name()) != Some("Scan") {
            return Ok(());
        }
        self.pages.fetch_add(1, Ordering::SeqCst);
        if self.fired.fetch_add(1, Ordering::SeqCst) == 0 {
            let table = self.table.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async move {
                    let store = DynamoStore::new(dynamodb_local().await, table);
                    change(&store, "A", StockChange::Adjust(5), Some("restock-during-reconcile")).await.unwrap();
                });
            })
            .join()
            .unwrap();
        }
        Ok(())
    }
}

/// The SKU's audit records (`CHANGE#…`) sort before its
/// stock row (`STOCK`) in the same partition, and a Scan is not a
/// snapshot: when a page ends between them (forced here with filler rows
/// in the partition; on a real table any 1 MB page boundary can fall
/// there, more likely the longer a SKU's history grows) and an operator's
/// change commits before the next page is read, the records are read
/// before the change and the stock row after it. Nothing was wrong, yet
/// `stock_supply_mismatch` (a paging alarm, "invariant breach" runbook)
/// fires.
#[tokio::test]
async fn a_stock_change_during_the_reconciliation_scan_is_not_reported_as_a_supply_mismatch() {
    let store = fresh_table(&dynamodb_local().await).await;
    change(&store, "A", StockChange::Seed { available: 10, price: eur(100) }, Some("seed-a")).await.unwrap();
    // Rows of the SKU's partition between CHANGE#… and STOCK that the
    // reconciliation's filter drops but whose size ends the first page.
    let pad = "x".repeat(380 * 1024);
    for i in 0..3 {
        store
            .client()
            .put_item()
            .table_name(store.table())
            .item("pk", s(keys::sku(&sku("A"))))
            .item("sk", s(format!("PAD#{i}")))
            .item("pad", s(&pad))
            .send()
            .await
            .unwrap();
    }
    let probe = BetweenScanPages { table: store.table().to_owned(), fired: Arc::default(), pages: Arc::default() };
    let base = dynamodb_local().await;
    let conf = base.config().to_builder().interceptor(probe.clone()).build();
    let reading = DynamoStore::new(Client::from_conf(conf), store.table());
    let snapshot = reading.scan_snapshot().await.unwrap();
    assert!(probe.pages.load(Ordering::SeqCst) >= 2, "the scan took more than one page");

    // The table is consistent: read again now, nothing disagrees.
    assert!(report_details(&store.scan_snapshot().await.unwrap()).is_empty(), "the table itself is consistent");
    let found = report_details(&snapshot);
    assert!(found.is_empty(), "a change that landed mid-scan is reported as a supply mismatch: {found:?}");
}

/// The SDK's re-send of the lost
/// TransactWriteItems carries the same ClientRequestToken, which DynamoDB
/// (and DynamoDB Local) answer as the original success, so the request
/// reads its own change as Applied, not as a KeyUsed replay.
#[tokio::test]
async fn a_first_stock_change_whose_answer_is_lost_is_not_answered_as_a_replay() {
    let store = fresh_table(&dynamodb_local().await).await;
    change(&store, "A", StockChange::Seed { available: 10, price: eur(100) }, Some("seed-a")).await.unwrap();
    let lost = LostAnswers::next("TransactWriteItems", 1);
    let base = dynamodb_local().await;
    let conf = base.config().to_builder().interceptor(lost.clone()).build();
    let lossy = DynamoStore::new(Client::from_conf(conf), store.table());
    let done = change(&lossy, "A", StockChange::Adjust(5), Some("restock-1")).await.unwrap();
    assert_eq!(lost.lost(), 1);
    assert_eq!(done.stock.available, 15, "applied once");
    assert!(!done.replayed, "this request made the change; it is not a replay of an earlier one");
}

/// Orders never touch `supplied`/`changes`,
/// and every order write keeps available + reserved + sold, so a stock
/// change racing orders on the same SKU leaves the audit consistent.
#[tokio::test]
async fn stock_changes_racing_orders_on_the_same_sku_keep_the_supply_identity() {
    let store = fresh_table(&dynamodb_local().await).await;
    change(&store, "A", StockChange::Seed { available: 1000, price: eur(100) }, Some("seed-a")).await.unwrap();
    let clock = FixedClock::at(T0);
    let orders = (0..12).map(|i| {
        let create = fixtures::creator(&store, &clock, Duration::from_secs(60), "t");
        async move {
            let body =
                json!({"user_id": format!("u{i}"), "currency": "EUR", "items": [{"sku": "A", "qty": 3, "unit_price": 100}]});
            create.execute_as_named(Some(&format!("o{i}")), body.to_string().as_bytes()).await.map(|_| ())
        }
    });
    let changes = (0..6).map(|i| {
        let store = store.clone();
        async move {
            let c = if i % 2 == 0 { StockChange::Adjust(7) } else { StockChange::Adjust(-2) };
            change(&store, "A", c, Some(&format!("k{i}"))).await.map(|_| ())
        }
    });
    let (o, c) = futures::future::join(futures::future::join_all(orders), futures::future::join_all(changes)).await;
    assert!(c.iter().all(|r| r.is_ok()), "{c:?}");
    let created = o.iter().filter(|r| r.is_ok()).count() as i64;
    let stock = store.stock(&sku("A")).await.unwrap().unwrap();
    assert_eq!(stock.reserved, 3 * created);
    assert_eq!(stock.supplied, 1000 + 3 * 7 - 3 * 2);
    assert_eq!(stock.available + stock.reserved + stock.sold, stock.supplied);
    assert!(report_details(&store.scan_snapshot().await.unwrap()).is_empty());
}
