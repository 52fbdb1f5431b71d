//! The edges of the buyer holdings (purchase limits, points, the
//! open-order cap) on DynamoDB Local: a free order, a limit changed while a
//! create is in flight, a cap of 0, a holding written before kinds existed,
//! the 100-write transaction bound, replays and debits racing creates, and
//! the full read of an order whose points are not released yet.

use aws_sdk_dynamodb::types::AttributeValue as Av;
use order_core::aws::dynamo::{keys, DynamoStore};
use order_core::domain::*;
use order_core::error::ApiError;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::close_order::CloseOutcome;
use order_core::usecases::create_order::CreateOrder;
use order_core::usecases::points::{credit_points, CreditRequest};
use order_core::usecases::queries::{put_stock, StockRequest};
use order_core::usecases::reconcile::{reconcile, Bounds};
use order_core::usecases::release_order::release_order;
use serde_json::{json, Value};
use std::time::Duration;
use system_tests::fakes::*;
use system_tests::fixtures::{self, eur, ChangedAfterRead};
use system_tests::CreateAsNamed;
use system_tests::{dynamodb_local, fresh_table};

const T0: i64 = 1_800_000_000_000;
const WINDOW_MS: i64 = 60_000;
const BUYER: &str = "attacker";

fn sku_(s: &str) -> Sku {
    Sku::parse(s).unwrap()
}
fn buyer() -> UserId {
    UserId::parse(BUYER).unwrap()
}

async fn store_with(skus: &[(&str, i64)]) -> DynamoStore {
    let store = fresh_table(&dynamodb_local().await).await;
    for (s, price) in skus {
        system_tests::fixtures::seed_stock(&store, &sku_(s), 100, &eur(*price)).await.unwrap();
    }
    store
}

fn creator<S: OrderStore>(store: S, clock: &FixedClock, cap: Option<u32>) -> CreateOrder<S> {
    CreateOrder {
        store,
        clock: Box::new(clock.clone()),
        ids: Box::new(RandomIds),
        window: Duration::from_millis(WINDOW_MS as u64),
        expiry_rule_version: "t".into(),
        open_order_cap: cap,
    }
}

async fn create_with<S: OrderStore + Send + Sync>(
    uc: &CreateOrder<S>,
    key: &str,
    body: &Value,
) -> Result<Order, ApiError> {
    uc.execute_as_named(Some(key), body.to_string().as_bytes()).await.map(|c| c.order)
}

async fn limit(store: &DynamoStore, s: &str, n: u32) {
    let req = StockRequest { change: StockChange::Limit(n), key: None, by: "ops".into() };
    put_stock(store, &SystemClock, &RandomIds, &sku_(s), req).await.unwrap();
}

async fn credit(store: &DynamoStore, delta: i64, key: &str) -> Result<(), ApiError> {
    let req = CreditRequest {
        user_id: buyer(),
        currency: Currency::parse("EUR").unwrap(),
        key: IdempotencyKey::parse(key).unwrap(),
        delta,
        reason: "r".into(),
        by: "ops".into(),
    };
    credit_points(store, &SystemClock, req).await.map(|_| ()).map_err(ApiError::from)
}

async fn counter(store: &DynamoStore, sk: &str, attr: &str) -> Option<i64> {
    let item = store.get_item(keys::buyer(&buyer()), sk).await.unwrap()?;
    item.get(attr).map(|v| v.as_n().unwrap().parse().unwrap())
}

fn body(sku: &str, qty: u32, points: Option<u32>) -> Value {
    let mut b = json!({"user_id": BUYER, "currency": "EUR", "items": [{"sku": sku, "qty": qty}]});
    if let Some(p) = points {
        b["points"] = json!(p);
    }
    b
}

async fn close_and_release(store: &DynamoStore, clock: &FixedClock, o: &Order) {
    let at = clock.now();
    clock.set(o.expire_at.unix_millis());
    let closer = fixtures::closer(store, ScriptedChannel::default(), RecordedReminders::default(), clock);
    assert_eq!(closer.close(&o.order_id, "t").await.unwrap(), CloseOutcome::Closed);
    release_order(store, clock, &o.order_id).await.unwrap();
    clock.set(at.unix_millis());
}

// ---------------------------------------------------------------------------
// Findings
// ---------------------------------------------------------------------------

/// A zero-total order (a SKU priced 0) spends no points: it is created,
/// not refused as `points_exceed_total`.
#[tokio::test]
async fn a_free_order_without_points_is_created() {
    let store = store_with(&[("FREE", 0)]).await;
    let clock = FixedClock::at(T0);
    let r = create_with(&creator(store.clone(), &clock, None), "k-free", &body("FREE", 1, None)).await;
    assert!(
        r.is_ok(),
        "a free order without points was refused: {:?}",
        r.map_err(|e| (e.code().to_owned(), e.to_string()))
    );
}

/// The create transaction is conditional on the purchase limit it read: a
/// limit lowered after the read refuses the create (409
/// `purchase_limit_changed`, nothing held) instead of letting it pass.
#[tokio::test]
async fn a_limit_lowered_between_the_catalog_read_and_the_write_refuses_the_create() {
    let store = store_with(&[("A", 100)]).await;
    let clock = FixedClock::at(T0);
    limit(&store, "A", 5).await;
    create_with(&creator(store.clone(), &clock, None), "k1", &body("A", 2, None)).await.unwrap();
    assert_eq!(counter(&store, "LIMIT#A", "used").await, Some(2));
    // The operator lowers the limit to 2 while the next create is in flight.
    let lowered = ChangedAfterRead::new(store.clone(), |s| Box::pin(async move { limit(&s, "A", 2).await }));
    let racing = creator(lowered, &clock, None);
    let r = create_with(&racing, "k2", &body("A", 2, None)).await;
    let now_limit = store.stock(&sku_("A")).await.unwrap().unwrap().purchase_limit;
    let used = counter(&store, "LIMIT#A", "used").await.unwrap();
    assert_eq!(now_limit, Some(2));
    assert_eq!(r.as_ref().map(|_| "created").unwrap_or_else(|e| e.code()), "purchase_limit_changed");
    assert_eq!(store.stock(&sku_("A")).await.unwrap().unwrap().reserved, 2, "the refused create held no stock");
    assert!(
        used <= 2,
        "an order written after the limit became 2 was accepted ({:?}); the buyer now holds {used} units",
        r.map(|o| o.order_id)
    );
}

/// An open-order cap of 0 is no cap (as `MaxOpenOrdersPerBuyer` says),
/// whoever builds the use case: orders are created and hold no slot.
#[tokio::test]
async fn an_open_order_cap_of_zero_is_no_cap() {
    let store = store_with(&[("A", 100)]).await;
    let clock = FixedClock::at(T0);
    for k in ["k0", "k1"] {
        let o = create_with(&creator(store.clone(), &clock, Some(0)), k, &body("A", 1, None)).await.unwrap();
        let held = store.order_record(&o.order_id).await.unwrap().unwrap().reservations;
        assert!(held.iter().all(|r| r.resource_type != ResourceType::OpenOrders), "{held:?}");
    }
    assert_eq!(counter(&store, "OPEN_ORDERS", "open").await, None);
}

// ---------------------------------------------------------------------------
// Checks that held
// ---------------------------------------------------------------------------

/// A reservation item as the code before the change wrote it (`sku`, no
/// `resource_type`) is released by the new code, once.
#[tokio::test]
async fn a_pre_change_stock_reservation_is_released_once() {
    let store = store_with(&[("A", 100)]).await;
    let clock = FixedClock::at(T0);
    let o = create_with(&creator(store.clone(), &clock, None), "k", &body("A", 3, None)).await.unwrap();
    // Rewrite the holding in the old shape.
    let sk = keys::stock_reservation_sk(&sku_("A"));
    store
        .client()
        .put_item()
        .table_name(store.table())
        .item("pk", Av::S(keys::order(&o.order_id)))
        .item("sk", Av::S(sk.clone()))
        .item("entity", Av::S("RESERVATION".into()))
        .item("sku", Av::S("A".into()))
        .item("qty", Av::N("3".into()))
        .item("status", Av::S("RESERVED".into()))
        .item("version", Av::N("1".into()))
        .item("reserved_at", Av::S(o.created_at.to_string()))
        .send()
        .await
        .unwrap();
    let rec = store.order_record(&o.order_id).await.unwrap().unwrap();
    assert_eq!(rec.reservations, vec![Reservation::stock(&sku_("A"), 3)]);
    close_and_release(&store, &clock, &o).await;
    release_order(&store, &clock, &o.order_id).await.unwrap();
    let s = store.stock(&sku_("A")).await.unwrap().unwrap();
    assert_eq!((s.available, s.reserved), (100, 0));
}

/// Exactly 100 writes (40 lines, 6 of them limited, coupon, points, slot)
/// fit one transaction on the engine; 7 limited lines are order_too_large.
#[tokio::test]
async fn the_order_too_large_boundary_is_exact() {
    let names: Vec<String> = (0..40).map(|i| format!("S{i:02}")).collect();
    let skus: Vec<(&str, i64)> = names.iter().map(|n| (n.as_str(), 100)).collect();
    let store = store_with(&skus).await;
    let clock = FixedClock::at(T0);
    for n in names.iter().take(7) {
        limit(&store, n, 10).await;
    }
    credit(&store, 1000, "c1").await.unwrap();
    let far = Timestamp::from_unix_millis(T0 + 86_400_000);
    store.put_coupon(&system_tests::fixtures::available_coupon("cp1", BUYER, far)).await.unwrap();
    let lines = |skip: usize| -> Vec<Value> { names.iter().skip(skip).map(|n| json!({"sku": n, "qty": 1})).collect() };
    let b = |skip| json!({"user_id": BUYER, "currency": "EUR", "items": lines(skip), "coupon_id": "cp1", "points": 10});
    let uc = creator(store.clone(), &clock, Some(5));
    let too_large = create_with(&uc, "k-7", &b(0)).await.unwrap_err();
    assert_eq!(too_large.code(), "order_too_large", "{too_large}");
    // Lift one of the seven limits: 2 + 2*40 + 2*6 + 2 (coupon) + 2 (points) + 2 (slot) = 100.
    limit(&store, "S00", 0).await;
    let o = create_with(&uc, "k-6", &b(0)).await.expect("100 writes fit one transaction");
    assert_eq!(store.order_record(&o.order_id).await.unwrap().unwrap().reservations.len(), 40 + 6 + 1 + 1);
}

/// A replay of a create that spends points holds them once; the key with
/// other points is refused and holds nothing more.
#[tokio::test]
async fn a_replayed_create_with_points_holds_them_once() {
    let store = store_with(&[("A", 1000)]).await;
    let clock = FixedClock::at(T0);
    credit(&store, 1000, "c").await.unwrap();
    let uc = creator(store.clone(), &clock, Some(3));
    let first = create_with(&uc, "same", &body("A", 1, Some(300))).await.unwrap();
    let again = create_with(&uc, "same", &body("A", 1, Some(300))).await.unwrap();
    assert_eq!(first.order_id, again.order_id);
    let other = create_with(&uc, "same", &body("A", 1, Some(301))).await.unwrap_err();
    assert_eq!(other.code(), "idempotency_key_reused");
    let too_many = create_with(&uc, "same", &body("A", 1, Some(5000))).await.unwrap_err();
    assert_eq!(too_many.code(), "idempotency_key_reused");
    assert_eq!(counter(&store, "POINTS", "held").await, Some(300));
    assert_eq!(counter(&store, "POINTS", "available").await, Some(700));
    assert_eq!(counter(&store, "OPEN_ORDERS", "open").await, Some(1));
}

/// Debits racing creates that spend points never take the balance below
/// zero, and the balance still adds up.
#[tokio::test]
async fn debits_racing_creates_never_overdraw() {
    let store = store_with(&[("A", 1000)]).await;
    let clock = FixedClock::at(T0);
    credit(&store, 1000, "c").await.unwrap();
    let uc = creator(store.clone(), &clock, None);
    let creates = futures::future::join_all((0..8).map(|i| {
        let uc = &uc;
        async move { create_with(uc, &format!("k{i}"), &body("A", 1, Some(200))).await.is_ok() }
    }));
    let debits = futures::future::join_all((0..4).map(|i| {
        let store = store.clone();
        async move { credit(&store, -200, &format!("d{i}")).await.is_ok() }
    }));
    let (c, d) = futures::join!(creates, debits);
    let (c, d) = (c.iter().filter(|x| **x).count() as i64, d.iter().filter(|x| **x).count() as i64);
    assert_eq!(c + d, 5, "1000 points cover five of 200");
    let b = store.points_balance(&buyer()).await.unwrap().unwrap();
    let credits = store.points_credits(&buyer()).await.unwrap();
    assert!(b.available >= 0);
    assert!(order_core::domain::points::audit_disagreements(&b, &credits).is_empty());
}

/// The full read: a closed order whose POINTS holding is still RESERVED
/// (release not run yet) is no mismatch, and the buyer counters (limit,
/// slot) are not undecodable rows.
#[tokio::test]
async fn the_full_read_with_a_closed_unreleased_points_order() {
    let store = store_with(&[("A", 1000)]).await;
    let clock = FixedClock::at(T0);
    limit(&store, "A", 10).await;
    credit(&store, 500, "c").await.unwrap();
    let o = create_with(&creator(store.clone(), &clock, Some(3)), "k", &body("A", 1, Some(100))).await.unwrap();
    clock.set(o.expire_at.unix_millis());
    let closer = fixtures::closer(&store, ScriptedChannel::default(), RecordedReminders::default(), &clock);
    assert_eq!(closer.close(&o.order_id, "t").await.unwrap(), CloseOutcome::Closed);
    let snap = store.scan_snapshot().await.unwrap();
    assert!(snap.undecodable.is_empty(), "{:?}", snap.undecodable);
    let report = reconcile(&snap, None, &Bounds::default(), clock.now());
    let kinds: Vec<_> = report.discrepancies.iter().map(|d| (d.kind, d.detail.clone())).collect();
    assert!(kinds.iter().all(|(k, _)| *k != "points_balance_mismatch"), "{kinds:?}");
}
