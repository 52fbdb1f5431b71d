//! Store tests on DynamoDB Local (AWS's own engine): every conditional write
//! and transaction of the order store, including the refusals — a failed
//! condition changes nothing and comes back as a typed answer.

use order_core::aws::dynamo::{keys, DynamoStore};
use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::create_order::CreateOrder;
use order_core::usecases::queries::{self, StockChange, StockRequest};
use serde_json::json;
use std::time::Duration;
use system_tests::fakes::FixedClock;
use system_tests::fixtures::{self, eur, pending_order, ChangedAfterRead};
use system_tests::CreateAsNamed;
use system_tests::{dynamodb_local, fresh_table};

const T0: i64 = 1_800_000_000_000;
const WINDOW: Duration = Duration::from_secs(1800);

async fn store() -> DynamoStore {
    fresh_table(&dynamodb_local().await).await
}

fn creator(store: &DynamoStore, clock: &FixedClock) -> CreateOrder<DynamoStore> {
    fixtures::creator(store, clock, WINDOW, "window-1800s")
}

fn sku(s: &str) -> Sku {
    Sku::parse(s).unwrap()
}

/// An operator's change of a SKU through its use case: the SKU after it,
/// or the refusal's code.
async fn operator(store: &DynamoStore, s: &str, change: StockChange) -> Result<Stock, String> {
    let req = StockRequest { change, key: None, by: "tests".into() };
    queries::put_stock(store, &SystemClock, &RandomIds, &sku(s), req)
        .await
        .map(|done| done.stock)
        .map_err(|e| e.code().to_owned())
}

async fn create(store: &DynamoStore, clock: &FixedClock, key: &str, body: serde_json::Value) -> Result<Order, String> {
    creator(store, clock)
        .execute_as_named(Some(key), body.to_string().as_bytes())
        .await
        .map(|c| c.order)
        .map_err(|e| e.code().to_owned())
}

async fn stock(store: &DynamoStore, s: &str) -> (i64, i64) {
    let st = store.stock(&sku(s)).await.unwrap().unwrap();
    (st.available, st.reserved)
}

async fn item_count(store: &DynamoStore) -> usize {
    store.client().scan().table_name(store.table()).send().await.unwrap().count as usize
}

fn body(user: &str, lines: &[(&str, u32)], coupon: Option<&str>) -> serde_json::Value {
    let items: Vec<_> = lines.iter().map(|(s, q)| json!({"sku": s, "qty": q, "unit_price": 250})).collect();
    let mut b = json!({"user_id": user, "currency": "EUR", "items": items});
    if let Some(c) = coupon {
        b["coupon_id"] = json!(c);
    }
    b
}

async fn coupon(store: &DynamoStore, id: &str, user: &str, valid_until_ms: i64) {
    let c = system_tests::fixtures::available_coupon(id, user, Timestamp::from_unix_millis(valid_until_ms));
    assert_eq!(store.put_coupon(&c).await.unwrap(), PutCoupon::Stored);
}

#[tokio::test]
async fn create_order_writes_order_reservations_coupon_lock_and_stock_in_one_transaction() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    system_tests::fixtures::seed_stock(&store, &sku("A"), 5, &eur(250)).await.unwrap();
    system_tests::fixtures::seed_stock(&store, &sku("B"), 1, &eur(250)).await.unwrap();
    coupon(&store, "C1", "u1", T0 + 86_400_000).await;

    let order = create(&store, &clock, "k1", body("u1", &[("A", 2), ("B", 1)], Some("C1"))).await.unwrap();
    assert_eq!(order.expire_at, Timestamp::from_unix_millis(T0).plus(WINDOW));
    assert_eq!(order.amount_total, 750);

    let rec = store.order_record(&order.order_id).await.unwrap().unwrap();
    assert_eq!(rec.order.status, OrderStatus::PendingPayment);
    assert_eq!(rec.order.expiry_rule_version, "window-1800s");
    assert_eq!(rec.reservations.len(), 2);
    assert!(rec.reservations.iter().all(|r| r.status == ReservationStatus::Reserved));
    assert_eq!(rec.coupon_lock.unwrap().status, CouponLockStatus::Locked);
    assert_eq!(stock(&store, "A").await, (3, 2));
    assert_eq!(stock(&store, "B").await, (0, 1));
    let c = store.coupon(&CouponId::parse("C1").unwrap()).await.unwrap().unwrap();
    assert_eq!((c.state, c.locked_by), (CouponState::Locked, Some(order.order_id.clone())));
}

#[tokio::test]
async fn out_of_stock_on_any_line_writes_nothing_and_names_the_sku() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    system_tests::fixtures::seed_stock(&store, &sku("A"), 5, &eur(250)).await.unwrap();
    system_tests::fixtures::seed_stock(&store, &sku("B"), 1, &eur(250)).await.unwrap();
    coupon(&store, "C1", "u1", T0 + 86_400_000).await;
    let before = item_count(&store).await;

    let (order, claim) = {
        let c = creator(&store, &clock);
        let req = order_core::usecases::create_order::CreateOrderRequest::parse(
            &UserId::parse("u1").unwrap(),
            body("u1", &[("A", 2), ("B", 2)], Some("C1")).to_string().as_bytes(),
        )
        .unwrap();
        let o = pending_order(
            OrderId::parse("ord_x").unwrap(),
            req.user_id.clone(),
            req.currency.clone(),
            req.items.iter().map(|l| OrderLine { sku: l.sku.clone(), qty: l.qty, unit_price: 250 }).collect(),
            req.coupon_id.clone(),
            c.clock.now(),
            WINDOW,
        );
        let claim = IdempotencyClaim {
            user_id: req.user_id,
            key: IdempotencyKey::parse("k").unwrap(),
            request_hash: "h".into(),
        };
        (o, claim)
    };
    assert_eq!(store.create_order(&order, &Caps::default(), &claim).await.unwrap(), CreateResult::OutOfStock(sku("B")));
    assert_eq!(item_count(&store).await, before, "nothing written");
    assert_eq!(stock(&store, "A").await, (5, 0));
    let c = store.coupon(&CouponId::parse("C1").unwrap()).await.unwrap().unwrap();
    assert_eq!(c.state, CouponState::Available);

    // Unknown SKUs are out of stock too.
    assert_eq!(create(&store, &clock, "k2", body("u1", &[("NOPE", 1)], None)).await, Err("out_of_stock".into()));
    assert_eq!(item_count(&store).await, before);
}

#[tokio::test]
async fn a_coupon_of_another_user_expired_or_locked_is_refused_and_nothing_is_written() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    system_tests::fixtures::seed_stock(&store, &sku("A"), 10, &eur(250)).await.unwrap();
    coupon(&store, "MINE", "u1", T0 + 86_400_000).await;
    coupon(&store, "OLD", "u1", T0 - 1).await;
    let before = item_count(&store).await;
    for (key, user, c) in [("k1", "u2", "MINE"), ("k2", "u1", "OLD"), ("k3", "u1", "MISSING")] {
        assert_eq!(
            create(&store, &clock, key, body(user, &[("A", 1)], Some(c))).await,
            Err("coupon_unavailable".into())
        );
    }
    assert_eq!(item_count(&store).await, before);
    assert_eq!(stock(&store, "A").await, (10, 0));

    create(&store, &clock, "k4", body("u1", &[("A", 1)], Some("MINE"))).await.unwrap();
    assert_eq!(
        create(&store, &clock, "k5", body("u1", &[("A", 1)], Some("MINE"))).await,
        Err("coupon_unavailable".into())
    );
    assert_eq!(stock(&store, "A").await, (9, 1));
}

#[tokio::test]
async fn an_idempotency_key_replays_the_same_order_and_refuses_a_different_body() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    system_tests::fixtures::seed_stock(&store, &sku("A"), 10, &eur(250)).await.unwrap();
    let uc = creator(&store, &clock);
    let b = body("u1", &[("A", 1)], None).to_string();
    let first = uc.execute_as_named(Some("key-1"), b.as_bytes()).await.unwrap();
    let again = uc.execute_as_named(Some("key-1"), b.as_bytes()).await.unwrap();
    assert!(!first.replayed && again.replayed);
    assert_eq!(first.order.order_id, again.order.order_id);
    assert_eq!(stock(&store, "A").await, (9, 1), "the replay reserved nothing");

    let other = body("u1", &[("A", 2)], None).to_string();
    let err = uc.execute_as_named(Some("key-1"), other.as_bytes()).await.unwrap_err();
    assert_eq!(err.code(), "idempotency_key_reused");
    assert_eq!(stock(&store, "A").await, (9, 1));
    // Keys are per user: another user's same key is a new order.
    let b2 = body("u2", &[("A", 1)], None).to_string();
    assert!(!uc.execute_as_named(Some("key-1"), b2.as_bytes()).await.unwrap().replayed);
}

async fn open_order(store: &DynamoStore, clock: &FixedClock) -> Order {
    // Seeded by the first order of a test; later ones find it.
    match system_tests::fixtures::seed_stock(store, &sku("A"), 100, &eur(250)).await {
        Err(e) if e.code() == "stock_exists" => {}
        seeded => drop(seeded.unwrap()),
    }
    create(store, clock, &format!("k{}", rand::random::<u32>()), body("u1", &[("A", 2)], None)).await.unwrap()
}

#[tokio::test]
async fn close_unpaid_applies_only_to_a_due_pending_order_at_its_version() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    let order = open_order(&store, &clock).await;
    let due = order.expire_at;

    assert_eq!(
        store.close_unpaid(&order, due.minus(Duration::from_millis(1))).await.unwrap(),
        Cas::Rejected,
        "not yet due"
    );
    let stale = Order { version: order.version + 1, ..order.clone() };
    assert_eq!(store.close_unpaid(&stale, due).await.unwrap(), Cas::Rejected, "wrong version");
    let unchanged = store.order(&order.order_id).await.unwrap().unwrap();
    assert_eq!(
        (unchanged.status, unchanged.version),
        (OrderStatus::PendingPayment, order.version),
        "refusals change nothing"
    );

    assert_eq!(store.close_unpaid(&order, due).await.unwrap(), Cas::Applied);
    let closed = store.order(&order.order_id).await.unwrap().unwrap();
    assert_eq!((closed.status, closed.version), (OrderStatus::Closed, order.version + 1));
    assert_eq!(closed.history.last().unwrap().to, OrderStatus::Closed);
    assert_eq!(store.close_unpaid(&order, due).await.unwrap(), Cas::Rejected, "a second close changes nothing");
    assert_eq!(store.order(&order.order_id).await.unwrap().unwrap(), closed);
}

#[tokio::test]
async fn the_due_index_holds_open_orders_only() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    let order = open_order(&store, &clock).await;
    let shard = keys::due_shard(&order.order_id, store.shards().count);
    let due_count = || async {
        store
            .client()
            .query()
            .table_name(store.table())
            .index_name("due-index")
            .key_condition_expression("due_shard = :s AND due_at <= :now")
            .expression_attribute_values(":s", order_core::aws::dynamo::s(shard.clone()))
            .expression_attribute_values(":now", order_core::aws::dynamo::s(order.expire_at.to_string()))
            .send()
            .await
            .unwrap()
            .count
    };
    assert_eq!(due_count().await, 1);
    store.close_unpaid(&order, order.expire_at).await.unwrap();
    assert_eq!(due_count().await, 0, "a final order leaves the due index");
}

#[tokio::test]
async fn closing_is_claimed_once_guarded_by_lease_and_resumed_after_it_expires() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    let mut order = open_order(&store, &clock).await;
    // Pretend a payment attempt exists: bump attempts through the real write.
    let attempt = attempt_for(&order, T0 + 1000);
    assert_eq!(store.record_attempt(&order, &attempt).await.unwrap(), AttemptResult::Recorded);
    order = store.order(&order.order_id).await.unwrap().unwrap();
    assert_eq!(order.payment_attempts, 1);
    let due = order.expire_at;
    assert_eq!(store.close_unpaid(&order, due).await.unwrap(), Cas::Rejected, "attempts forbid the one-write close");

    let lease = |owner: &str, until: Timestamp| ClosingLease {
        started_at: due,
        owner: owner.into(),
        lease_until: until,
        resumes: 0,
    };
    let l1 = lease("w1", due.plus(Duration::from_secs(60)));
    assert_eq!(store.begin_closing(&order, &l1, due).await.unwrap(), Cas::Applied);
    assert_eq!(
        store.begin_closing(&order, &lease("w2", due), due).await.unwrap(),
        Cas::Rejected,
        "one claim per version"
    );
    let closing = store.order(&order.order_id).await.unwrap().unwrap();
    assert_eq!(closing.status, OrderStatus::Closing);
    let l2 = lease("w2", due.plus(Duration::from_secs(200)));
    assert_eq!(
        store.begin_closing(&closing, &l2, due.plus(Duration::from_secs(30))).await.unwrap(),
        Cas::Rejected,
        "lease is live"
    );
    assert_eq!(
        store.begin_closing(&closing, &l2, due.plus(Duration::from_secs(60))).await.unwrap(),
        Cas::Applied,
        "lease expired: resumed"
    );
    let resumed = store.order(&order.order_id).await.unwrap().unwrap();
    assert_eq!(resumed.status, OrderStatus::Closing, "resumed, never reopened");
    assert_eq!(resumed.closing.as_ref().unwrap().owner, "w2");

    // The first closer's close now fails: its version and lease are gone.
    assert_eq!(store.close_after_check(&closing, due, "test").await.unwrap(), Cas::Rejected);
    assert_eq!(store.close_after_check(&resumed, due, "test").await.unwrap(), Cas::Applied);
    assert_eq!(store.order(&order.order_id).await.unwrap().unwrap().status, OrderStatus::Closed);
}

fn attempt_for(order: &Order, at_ms: i64) -> PaymentAttempt {
    system_tests::fixtures::processing_attempt(order, Timestamp::from_unix_millis(at_ms))
}

#[tokio::test]
async fn a_payment_attempt_is_refused_after_expiry_and_on_a_final_order() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    let order = open_order(&store, &clock).await;
    let late = attempt_for(&order, order.expire_at.unix_millis());
    assert!(matches!(store.record_attempt(&order, &late).await.unwrap(), AttemptResult::NotPayable(_)));
    assert!(store.attempt(&late.payment_id).await.unwrap().is_none(), "nothing written");
    store.close_unpaid(&order, order.expire_at).await.unwrap();
    let closed = store.order(&order.order_id).await.unwrap().unwrap();
    let a = attempt_for(&closed, T0);
    assert!(
        matches!(store.record_attempt(&closed, &a).await.unwrap(), AttemptResult::NotPayable(o) if o.status == OrderStatus::Closed)
    );
}

#[tokio::test]
async fn a_reservation_is_released_once_and_a_confirmed_one_never() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    let order = open_order(&store, &clock).await;
    let rec = store.order_record(&order.order_id).await.unwrap().unwrap();
    let r = &rec.reservations[0];
    assert_eq!(stock(&store, "A").await, (98, 2));
    let now = Timestamp::from_unix_millis(T0);
    assert_eq!(
        store.release_reservation(&order.order_id, r, now).await.unwrap(),
        Ok(Step::Moved(ReservationStatus::Released))
    );
    assert_eq!(stock(&store, "A").await, (100, 0));
    assert_eq!(store.release_reservation(&order.order_id, r, now).await.unwrap(), Ok(Step::AlreadyThere));
    assert_eq!(stock(&store, "A").await, (100, 0), "a duplicate adds nothing");
    assert!(store.confirm_reservation(&order.order_id, r, now).await.unwrap().is_err(), "released stock is not sold");

    let other = open_order(&store, &clock).await;
    let r2 = store.order_record(&other.order_id).await.unwrap().unwrap().reservations[0].clone();
    assert_eq!(
        store.confirm_reservation(&other.order_id, &r2, now).await.unwrap(),
        Ok(Step::Moved(ReservationStatus::Confirmed))
    );
    assert_eq!(stock(&store, "A").await, (98, 0));
    assert!(
        store.release_reservation(&other.order_id, &r2, now).await.unwrap().is_err(),
        "confirmed is never released"
    );
    assert_eq!(stock(&store, "A").await, (98, 0));
}

#[tokio::test]
async fn a_coupon_lock_ends_once_available_or_expired_with_its_reason() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    system_tests::fixtures::seed_stock(&store, &sku("A"), 10, &eur(250)).await.unwrap();
    coupon(&store, "C1", "u1", T0 + 86_400_000).await;
    let order = create(&store, &clock, "k", body("u1", &[("A", 1)], Some("C1"))).await.unwrap();
    let cid = CouponId::parse("C1").unwrap();
    let now = Timestamp::from_unix_millis(T0);
    assert_eq!(
        store
            .put_coupon(&Coupon {
                coupon_id: cid.clone(),
                user_id: UserId::parse("u9").unwrap(),
                valid_until: now,
                state: CouponState::Available,
                locked_by: None,
                reason: None,
                returnable: true
            })
            .await
            .unwrap(),
        PutCoupon::Locked,
        "a locked coupon cannot be overwritten"
    );
    assert_eq!(
        store.end_coupon_lock(&order.order_id, &cid, CouponLockStatus::Expired, "validity passed", now).await.unwrap(),
        Ok(Step::Moved(CouponLockStatus::Expired))
    );
    assert_eq!(
        store.end_coupon_lock(&order.order_id, &cid, CouponLockStatus::Available, "again", now).await.unwrap(),
        Ok(Step::AlreadyThere)
    );
    let c = store.coupon(&cid).await.unwrap().unwrap();
    assert_eq!((c.state, c.reason.as_deref(), c.locked_by), (CouponState::Expired, Some("validity passed"), None));
    let lock = store.order_record(&order.order_id).await.unwrap().unwrap().coupon_lock.unwrap();
    assert_eq!(lock.status, CouponLockStatus::Expired);
    assert!(store.end_coupon_lock(&order.order_id, &cid, CouponLockStatus::Used, "paid", now).await.unwrap().is_err());
}

fn evidence(ms: i64) -> Evidence {
    Evidence {
        at: Timestamp::from_unix_millis(ms),
        source: "test".into(),
        status: PaymentStatus::Succeeded,
        detail: None,
    }
}

fn notification(id: &str) -> Notification {
    Notification { channel: ChannelName::parse("sandbox").unwrap(), notify_id: id.into() }
}

#[tokio::test]
async fn a_success_pays_an_open_order_once_and_a_replayed_notification_is_a_duplicate() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    let order = open_order(&store, &clock).await;
    let a = attempt_for(&order, T0 + 1);
    store.record_attempt(&order, &a).await.unwrap();
    let order = store.order(&order.order_id).await.unwrap().unwrap();
    let r = store.settle_success(&order, &a, "txn-1", evidence(T0 + 2), Some(&notification("n1")), "").await.unwrap();
    assert_eq!(r, SettleResult::Paid);
    let paid = store.order(&order.order_id).await.unwrap().unwrap();
    assert_eq!((paid.status, paid.paid_by.clone()), (OrderStatus::Paid, Some(a.payment_id.clone())));
    assert_eq!(
        store.settle_success(&paid, &a, "txn-1", evidence(T0 + 3), Some(&notification("n1")), "").await.unwrap(),
        SettleResult::Duplicate
    );
    assert_eq!(
        store.settle_success(&paid, &a, "txn-1", evidence(T0 + 3), Some(&notification("n2")), "").await.unwrap(),
        SettleResult::Duplicate,
        "another notification of the same success"
    );
    // Stale view (decided on PENDING_PAYMENT): the transaction refuses, and
    // the attempt already holds this very success: a duplicate, whatever
    // the caller thought the order was.
    assert_eq!(
        store.settle_success(&order, &a, "txn-1", evidence(T0 + 3), Some(&notification("n3")), "").await.unwrap(),
        SettleResult::Duplicate
    );
    assert_eq!(store.order(&order.order_id).await.unwrap().unwrap(), paid, "nothing changed");
}

#[tokio::test]
async fn a_success_after_close_creates_exactly_one_refund_even_when_delivered_concurrently() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    let order = open_order(&store, &clock).await;
    let a = attempt_for(&order, T0 + 1);
    store.record_attempt(&order, &a).await.unwrap();
    let order = store.order(&order.order_id).await.unwrap().unwrap();
    let lease = ClosingLease {
        started_at: order.expire_at,
        owner: "w".into(),
        lease_until: order.expire_at.plus(Duration::from_secs(60)),
        resumes: 0,
    };
    store.begin_closing(&order, &lease, order.expire_at).await.unwrap();
    let closing = store.order(&order.order_id).await.unwrap().unwrap();
    store.close_after_check(&closing, order.expire_at, "test").await.unwrap();
    let closed = store.order(&order.order_id).await.unwrap().unwrap();

    let results = futures::future::join_all((0..3).map(|i| {
        let (store, closed, a) = (store.clone(), closed.clone(), a.clone());
        async move {
            store
                .settle_success(
                    &closed,
                    &a,
                    "txn-9",
                    evidence(T0 + 5),
                    Some(&notification(&format!("late-{i}"))),
                    "notice",
                )
                .await
                .unwrap()
        }
    }))
    .await;
    // One delivery creates the refund; the others find the same success
    // already recorded with it: duplicates.
    assert_eq!(results.iter().filter(|r| **r == SettleResult::RefundPending).count(), 1, "{results:?}");
    assert!(results.iter().all(|r| matches!(r, SettleResult::RefundPending | SettleResult::Duplicate)), "{results:?}");
    let rec = store.order_record(&order.order_id).await.unwrap().unwrap();
    assert_eq!(rec.order.status, OrderStatus::Closed, "never revived");
    assert_eq!(rec.refunds.len(), 1);
    assert_eq!(rec.refunds[0].status, RefundStatus::RefundPending);
    assert_eq!(rec.refunds[0].amount, a.amount);
    assert_eq!(rec.payments[0].status, PaymentStatus::Succeeded);
}

#[tokio::test]
async fn a_channel_transaction_id_binds_to_one_payment() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    let o1 = open_order(&store, &clock).await;
    let a1 = attempt_for(&o1, T0 + 1);
    store.record_attempt(&o1, &a1).await.unwrap();
    let o1 = store.order(&o1.order_id).await.unwrap().unwrap();
    store.settle_success(&o1, &a1, "dup-txn", evidence(T0 + 2), None, "").await.unwrap();
    let o2 = open_order(&store, &clock).await;
    let a2 = attempt_for(&o2, T0 + 1);
    store.record_attempt(&o2, &a2).await.unwrap();
    let o2 = store.order(&o2.order_id).await.unwrap().unwrap();
    assert_eq!(
        store.settle_success(&o2, &a2, "dup-txn", evidence(T0 + 3), None, "").await.unwrap(),
        SettleResult::TxnIdTaken
    );
    assert_eq!(store.order(&o2.order_id).await.unwrap().unwrap(), o2, "nothing changed");
    // The same payment reported again under another transaction id.
    let paid = store.order(&o1.order_id).await.unwrap().unwrap();
    assert_eq!(
        store.settle_success(&paid, &a1, "other-txn", evidence(T0 + 4), None, "").await.unwrap(),
        SettleResult::TxnIdTaken
    );
    let rec = store.order_record(&o1.order_id).await.unwrap().unwrap();
    assert_eq!(rec.payments[0].channel_txn_id.as_deref(), Some("dup-txn"), "the first transaction id stays");
}

#[tokio::test]
async fn a_refund_moves_once_from_pending() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    let order = open_order(&store, &clock).await;
    let a = attempt_for(&order, T0 + 1);
    store.record_attempt(&order, &a).await.unwrap();
    let order = store.order(&order.order_id).await.unwrap().unwrap();
    // Two attempts on the same order (the buyer paid twice).
    let b = attempt_for(&order, T0 + 2);
    assert_eq!(store.record_attempt(&order, &b).await.unwrap(), AttemptResult::Recorded);
    let order = store.order(&order.order_id).await.unwrap().unwrap();
    assert_eq!(store.settle_success(&order, &a, "t1", evidence(T0 + 2), None, "").await.unwrap(), SettleResult::Paid);
    let paid = store.order(&order.order_id).await.unwrap().unwrap();
    // The second success on a PAID order is refunded.
    assert_eq!(
        store.settle_success(&paid, &b, "t2", evidence(T0 + 4), None, "n").await.unwrap(),
        SettleResult::RefundPending
    );
    let refund = store.refund(&order.order_id, &b.payment_id).await.unwrap().unwrap();
    let now = Timestamp::from_unix_millis(T0 + 5);
    assert_eq!(
        store.update_refund(&refund, RefundStatus::RefundPending, None, Some("boom"), now).await.unwrap(),
        Cas::Applied
    );
    assert_eq!(store.refund(&order.order_id, &b.payment_id).await.unwrap().unwrap().tries, 1);
    assert_eq!(
        store.update_refund(&refund, RefundStatus::Refunded, Some("r1"), None, now).await.unwrap(),
        Cas::Applied
    );
    assert_eq!(
        store.update_refund(&refund, RefundStatus::Refunded, Some("r2"), None, now).await.unwrap(),
        Cas::Rejected
    );
    let done = store.refund(&order.order_id, &b.payment_id).await.unwrap().unwrap();
    assert_eq!((done.status, done.channel_refund_id.as_deref()), (RefundStatus::Refunded, Some("r1")));
}

#[tokio::test]
async fn an_expected_stock_count_makes_the_update_a_compare_and_swap() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    system_tests::fixtures::seed_stock(&store, &sku("S"), 5, &eur(250)).await.unwrap();
    // An order reserves a unit after the operator read "5".
    create(&store, &clock, "s1", body("u", &[("S", 1)], None)).await.unwrap();
    assert_eq!(
        operator(&store, "S", StockChange::Swap { available: 15, expected: 5 }).await.unwrap_err(),
        "stock_changed"
    );
    assert_eq!(stock(&store, "S").await, (4, 1), "the stale restock changed nothing");
    operator(&store, "S", StockChange::Swap { available: 14, expected: 4 }).await.unwrap();
    assert_eq!(stock(&store, "S").await, (14, 1), "reserved is never touched");
}

#[tokio::test]
async fn concurrent_orders_on_one_sku_never_oversell() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    system_tests::fixtures::seed_stock(&store, &sku("HOT"), 10, &eur(250)).await.unwrap();
    let results = futures::future::join_all((0..20).map(|i| {
        let (store, clock) = (store.clone(), clock.clone());
        async move { create(&store, &clock, &format!("c{i}"), body(&format!("u{i}"), &[("HOT", 1)], None)).await }
    }))
    .await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let out = results.iter().filter(|r| r.as_ref().err().map(String::as_str) == Some("out_of_stock")).count();
    assert_eq!((ok, out), (10, 10), "{results:?}");
    assert_eq!(stock(&store, "HOT").await, (0, 10));
}

// ------------------------------------------------------------ catalog prices

fn unguarded(user: &str, lines: &[(&str, u32)]) -> serde_json::Value {
    let items: Vec<_> = lines.iter().map(|(s, q)| json!({"sku": s, "qty": q})).collect();
    json!({"user_id": user, "currency": "EUR", "items": items})
}

#[tokio::test]
async fn an_order_takes_the_catalog_price_and_keeps_it_when_the_catalog_changes() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    system_tests::fixtures::seed_stock(&store, &sku("A"), 10, &eur(250)).await.unwrap();
    system_tests::fixtures::seed_stock(&store, &sku("B"), 10, &eur(1299)).await.unwrap();

    // No price in the request: the catalog's is used.
    let first = create(&store, &clock, "p1", unguarded("u1", &[("A", 2), ("B", 1)])).await.unwrap();
    let prices: Vec<_> = first.items.iter().map(|l| (l.sku.as_str(), l.unit_price)).collect();
    assert_eq!(prices, [("A", 250), ("B", 1299)]);
    assert_eq!(first.amount_total, 1799);

    operator(&store, "A", StockChange::Reprice(eur(300))).await.unwrap();
    assert_eq!(stock(&store, "A").await, (8, 2), "a price change leaves the counts alone");
    let kept = store.order_record(&first.order_id).await.unwrap().unwrap().order;
    assert_eq!(
        (&kept.items, kept.amount_total, kept.version),
        (&first.items, 1799, 1),
        "the open order keeps its prices and amount"
    );

    let second = create(&store, &clock, "p2", unguarded("u1", &[("A", 1)])).await.unwrap();
    assert_eq!((second.items[0].unit_price, second.amount_total), (300, 300));
}

#[tokio::test]
async fn a_price_the_buyer_was_shown_that_is_not_the_catalog_price_is_refused_and_writes_nothing() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    system_tests::fixtures::seed_stock(&store, &sku("A"), 10, &eur(300)).await.unwrap();
    let before = item_count(&store).await;

    // `body` sends 250 as the price shown; the catalog says 300.
    let guarded = body("u1", &[("A", 1)], None);
    let err = creator(&store, &clock).execute_as_named(Some("g1"), guarded.to_string().as_bytes()).await.unwrap_err();
    assert_eq!(err.code(), "price_changed");
    let message = err.to_string();
    assert!(message.contains("sku A") && message.contains("300 EUR") && message.contains("250"), "{message}");
    assert_eq!(item_count(&store).await, before, "nothing written, the key is still free");
    assert_eq!(stock(&store, "A").await, (10, 0));

    // The buyer is shown the new price; the same key now creates the order.
    operator(&store, "A", StockChange::Reprice(eur(250))).await.unwrap();
    let order = create(&store, &clock, "g1", guarded).await.unwrap();
    assert_eq!(order.amount_total, 250);
}

#[tokio::test]
async fn a_sku_in_another_currency_or_without_a_price_is_refused_and_writes_nothing() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    let usd = Price::new(250, Currency::parse("USD").unwrap()).unwrap();
    system_tests::fixtures::seed_stock(&store, &sku("A"), 10, &eur(250)).await.unwrap();
    system_tests::fixtures::seed_stock(&store, &sku("US"), 10, &usd).await.unwrap();
    // A stock row written before prices lived in the catalog.
    store
        .client()
        .put_item()
        .table_name(store.table())
        .set_item(Some(
            [
                ("pk", aws_sdk_dynamodb::types::AttributeValue::S(keys::sku(&sku("OLD")))),
                ("sk", aws_sdk_dynamodb::types::AttributeValue::S(keys::STOCK_SK.into())),
                ("entity", aws_sdk_dynamodb::types::AttributeValue::S("STOCK".into())),
                ("sku", aws_sdk_dynamodb::types::AttributeValue::S("OLD".into())),
                ("available", aws_sdk_dynamodb::types::AttributeValue::N("10".into())),
                ("reserved", aws_sdk_dynamodb::types::AttributeValue::N("0".into())),
                ("sold", aws_sdk_dynamodb::types::AttributeValue::N("0".into())),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        ))
        .send()
        .await
        .unwrap();
    let before = item_count(&store).await;
    assert_eq!(
        create(&store, &clock, "c1", unguarded("u1", &[("A", 1), ("US", 1)])).await,
        Err("currency_mismatch".into())
    );
    assert_eq!(create(&store, &clock, "c2", unguarded("u1", &[("OLD", 1)])).await, Err("not_for_sale".into()));
    assert_eq!(create(&store, &clock, "c3", unguarded("u1", &[("NOPE", 1)])).await, Err("out_of_stock".into()));
    assert_eq!(item_count(&store).await, before);
    assert_eq!((stock(&store, "A").await, stock(&store, "OLD").await), ((10, 0), (10, 0)));

    // Once priced, the old SKU sells.
    operator(&store, "OLD", StockChange::Reprice(eur(40))).await.unwrap();
    assert_eq!(create(&store, &clock, "c2", unguarded("u1", &[("OLD", 1)])).await.unwrap().amount_total, 40);
}

#[tokio::test]
async fn the_create_transaction_is_conditional_on_the_catalog_price_of_each_line() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    system_tests::fixtures::seed_stock(&store, &sku("A"), 5, &eur(250)).await.unwrap();
    system_tests::fixtures::seed_stock(&store, &sku("B"), 1, &eur(250)).await.unwrap();
    let before = item_count(&store).await;
    let order_with = |lines: Vec<(&str, u32, i64)>, currency: &str| {
        pending_order(
            OrderId::parse(format!("ord_{}", rand::random::<u32>())).unwrap(),
            UserId::parse("u1").unwrap(),
            Currency::parse(currency).unwrap(),
            lines.iter().map(|(s, q, p)| OrderLine { sku: sku(s), qty: *q, unit_price: *p }).collect(),
            None,
            clock.now(),
            WINDOW,
        )
    };
    let claim = |k: &str| IdempotencyClaim {
        user_id: UserId::parse("u1").unwrap(),
        key: IdempotencyKey::parse(k).unwrap(),
        request_hash: "h".into(),
    };
    // A line priced otherwise than the catalog (as when the price changed
    // after the use case read it): cancelled, and told apart from stock.
    assert_eq!(
        store
            .create_order(&order_with(vec![("A", 1, 250), ("B", 1, 200)], "EUR"), &Caps::default(), &claim("t1"))
            .await
            .unwrap(),
        CreateResult::PriceChanged { sku: sku("B"), now: Some(eur(250)) }
    );
    // Another currency is a price change too.
    assert_eq!(
        store.create_order(&order_with(vec![("A", 1, 250)], "USD"), &Caps::default(), &claim("t2")).await.unwrap(),
        CreateResult::PriceChanged { sku: sku("A"), now: Some(eur(250)) }
    );
    // Too few units at a changed price: the price is what the buyer must see first.
    assert_eq!(
        store.create_order(&order_with(vec![("B", 2, 200)], "EUR"), &Caps::default(), &claim("t3")).await.unwrap(),
        CreateResult::PriceChanged { sku: sku("B"), now: Some(eur(250)) }
    );
    // At the catalog price, too few units is out of stock, as before.
    assert_eq!(
        store.create_order(&order_with(vec![("B", 2, 250)], "EUR"), &Caps::default(), &claim("t4")).await.unwrap(),
        CreateResult::OutOfStock(sku("B"))
    );
    assert_eq!(item_count(&store).await, before, "nothing written");
    assert_eq!((stock(&store, "A").await, stock(&store, "B").await), ((5, 0), (1, 0)));
}

#[tokio::test]
async fn a_price_change_between_the_catalog_read_and_the_write_refuses_the_order_and_writes_nothing() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    system_tests::fixtures::seed_stock(&store, &sku("A"), 5, &eur(250)).await.unwrap();
    system_tests::fixtures::seed_stock(&store, &sku("B"), 5, &eur(100)).await.unwrap();
    let before = item_count(&store).await;
    let racing = CreateOrder {
        store: ChangedAfterRead::new(store.clone(), |s| {
            Box::pin(async move {
                operator(&s, "B", StockChange::Reprice(eur(120))).await.expect("repriced");
            })
        }),
        clock: Box::new(clock.clone()),
        ids: Box::new(RandomIds),
        window: WINDOW,
        expiry_rule_version: "window-1800s".into(),
        open_order_cap: None,
    };
    let b = unguarded("u1", &[("A", 1), ("B", 2)]).to_string();
    let err = racing.execute_as_named(Some("r1"), b.as_bytes()).await.unwrap_err();
    assert_eq!(err.code(), "price_changed");
    assert!(err.to_string().contains("sku B") && err.to_string().contains("120 EUR"), "{err}");
    // The one new item is the price change's own audit record.
    assert_eq!(item_count(&store).await, before + 1, "nothing written by the order");
    assert_eq!((stock(&store, "A").await, stock(&store, "B").await), ((5, 0), (5, 0)));

    // Sent again, the order is priced from the catalog as it is now.
    let order = create(&store, &clock, "r1", unguarded("u1", &[("A", 1), ("B", 2)])).await.unwrap();
    assert_eq!(order.amount_total, 250 + 2 * 120);
}

#[tokio::test]
async fn a_retry_after_a_price_change_replays_the_order_instead_of_refusing_it() {
    let store = store().await;
    let clock = FixedClock::at(T0);
    system_tests::fixtures::seed_stock(&store, &sku("A"), 5, &eur(250)).await.unwrap();
    // The buyer was shown 250; the order is created, the answer is lost.
    let first = create(&store, &clock, "lost", body("u1", &[("A", 1)], None)).await.unwrap();
    operator(&store, "A", StockChange::Reprice(eur(300))).await.unwrap();
    // The client retries the same request: its guard is stale now, but it
    // gets its order back rather than a refusal that would lead to a second.
    let b = body("u1", &[("A", 1)], None).to_string();
    let again = creator(&store, &clock).execute_as_named(Some("lost"), b.as_bytes()).await.unwrap();
    assert!(again.replayed);
    assert_eq!((&again.order.order_id, &again.order.items), (&first.order_id, &first.items));
    // Another body under that key is still refused as such.
    assert_eq!(
        create(&store, &clock, "lost", body("u1", &[("A", 2)], None)).await,
        Err("idempotency_key_reused".into())
    );
    assert_eq!(stock(&store, "A").await, (4, 1));
}
