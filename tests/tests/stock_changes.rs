//! Operators' stock changes on DynamoDB Local: each is applied once per
//! idempotency key, even when its answer is lost and the request is sent
//! again (by the SDK, or by the operator after a 5xx); each leaves an audit
//! record; and reconciliation checks every SKU's counts against its
//! records.

use aws_sdk_dynamodb::Client;
use order_core::aws::dynamo::{keys, n, s, DynamoStore};
use order_core::aws::lost_answers::LostAnswers;
use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::create_order::CreateOrder;
use order_core::usecases::queries::{self, StockChange, StockChanged, StockRequest};
use order_core::usecases::reconcile::{reconcile, Bounds};
use order_core::usecases::UseCaseError;
use serde_json::json;
use std::time::Duration;
use system_tests::fakes::FixedClock;
use system_tests::fixtures::eur;
use system_tests::CreateAsNamed;
use system_tests::{dynamodb_local, fresh_table};

const T0: i64 = 1_800_000_000_000;

fn sku(v: &str) -> Sku {
    Sku::parse(v).unwrap()
}

async fn change(store: &DynamoStore, s: &str, c: StockChange, key: Option<&str>) -> Result<StockChanged, UseCaseError> {
    let req = StockRequest { change: c, key: key.map(|k| IdempotencyKey::parse(k).unwrap()), by: "ops@example".into() };
    queries::put_stock(store, &FixedClock::at(T0), &RandomIds, &sku(s), req).await
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
    let create = CreateOrder {
        store: store.clone(),
        clock: Box::new(clock.clone()),
        ids: Box::new(RandomIds),
        window: Duration::from_secs(60),
        expiry_rule_version: "t".into(),
    };
    let body = json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "A", "qty": 4, "unit_price": 100}]});
    create.execute_as_named(Some("o1"), body.to_string().as_bytes()).await.unwrap();
    change(&store, "A", StockChange::Adjust(-2), Some("damaged")).await.unwrap();
    change(&store, "A", StockChange::Swap { available: 10, expected: 4 }, Some("recount")).await.unwrap();
    change(&store, "A", StockChange::Reprice(eur(120)), Some("price-up")).await.unwrap();

    let history = store.stock_changes(&sku("A")).await.unwrap();
    let rows: Vec<_> = history
        .iter()
        .map(|c| (c.seq, c.kind, c.delta, c.supplied_before, c.supplied_after, c.available_before, c.available_after))
        .collect();
    assert_eq!(
        rows,
        [
            (1, StockChangeKind::Seed, 10, 0, 10, Some(0), Some(10)),
            (2, StockChangeKind::Adjust, -2, 10, 8, None, None),
            (3, StockChangeKind::Swap, 6, 8, 14, Some(4), Some(10)),
            (4, StockChangeKind::Reprice, 0, 14, 14, None, None),
        ]
    );
    assert!(history.iter().all(|c| c.by == "ops@example" && c.at == Timestamp::from_unix_millis(T0)));
    assert_eq!(history[3].price, Some(eur(120)));
    let stock = store.stock(&sku("A")).await.unwrap().unwrap();
    assert_eq!((stock.available, stock.reserved, stock.supplied, stock.changes), (10, 4, 14, 4));
    assert!(report_kinds(&store.scan_snapshot().await.unwrap()).is_empty(), "the counts agree with the records");
}

#[tokio::test]
async fn concurrent_changes_of_one_sku_are_each_applied_once_in_sequence() {
    let store = seeded(100).await;
    let results = futures::future::join_all((0..8).map(|i| {
        let store = store.clone();
        async move { change(&store, "A", StockChange::Adjust(1), Some(&format!("c{i}"))).await }
    }))
    .await;
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(available(&store, "A").await, 108);
    let seqs: Vec<u64> = store.stock_changes(&sku("A")).await.unwrap().iter().map(|c| c.seq).collect();
    assert_eq!(seqs, (1..=9).collect::<Vec<_>>());
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
    assert_eq!((history[0].seq, history[0].supplied_before, history[0].supplied_after), (1, 10, 12));
    assert!(history[0].key.as_str().starts_with("auto_"), "a key made for the request: {}", history[0].key);
    assert!(report_kinds(&store.scan_snapshot().await.unwrap()).is_empty());
}
