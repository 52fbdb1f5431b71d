//! The operator routes, payment entry and the webhook on DynamoDB Local: an operator write
//! never overrides a coupon's outcome or a live stock count, payment entry is
//! idempotent and bounded and answers contention with 409, and a provider
//! resending the same success cannot grow the payment item.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue as Av;
use order_core::aws::dynamo::{keys, DynamoStore};
use order_core::domain::payment::MAX_PAYMENT_ATTEMPTS;
use order_core::domain::*;
use order_core::error::ApiError;
use order_core::handlers::requests::{self, get_order, payment_notification, start_payment};
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::order_reads::Reader;
use order_core::usecases::payments::{PaymentStarted, StartPayment};
use order_core::usecases::release_order::{release_order, settle_order};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use system_tests::fakes::{FixedClock, RecordedWakeUps};
use system_tests::fixtures::{self, eur};
use system_tests::CreateAsNamed;
use system_tests::{dynamodb_local, fresh_table};

const T0: i64 = 1_800_000_000_000;
const WINDOW_MS: i64 = 60_000;
const MERCHANT: &str = "merchant-test";

/// A payment channel with a ledger: `open` makes a payment PROCESSING,
/// `cancel` closes a processing one (FAILED); the test can mark one paid.
#[derive(Clone, Default)]
struct Ledger {
    state: Arc<Mutex<HashMap<PaymentId, ChannelPayment>>>,
    opened: Arc<Mutex<Vec<PaymentId>>>,
    cancelled: Arc<Mutex<Vec<PaymentId>>>,
}

impl Ledger {
    fn pay(&self, p: &PaymentId, txn: &str, amount: i64) {
        self.state.lock().unwrap().insert(
            p.clone(),
            ChannelPayment::Succeeded { channel_txn_id: txn.into(), amount, currency: "EUR".into() },
        );
    }
    fn distinct_opened(&self) -> usize {
        let mut v = self.opened.lock().unwrap().clone();
        v.sort();
        v.dedup();
        v.len()
    }
}

#[async_trait]
impl PaymentChannel for Ledger {
    async fn open(&self, a: &PaymentAttempt, _: &str) -> Result<OpenedPayment, Unavailable> {
        self.opened.lock().unwrap().push(a.payment_id.clone());
        self.state.lock().unwrap().entry(a.payment_id.clone()).or_insert(ChannelPayment::Pending);
        Ok(OpenedPayment::default())
    }
    async fn query(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        let p = &a.payment_id;
        Ok(self.state.lock().unwrap().get(p).cloned().unwrap_or(ChannelPayment::NotFound))
    }
    async fn cancel(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        let p = &a.payment_id;
        self.cancelled.lock().unwrap().push(p.clone());
        let mut st = self.state.lock().unwrap();
        let entry = st.entry(p.clone()).or_insert(ChannelPayment::NotFound);
        if *entry == ChannelPayment::Pending {
            *entry = ChannelPayment::Failed;
        }
        Ok(entry.clone())
    }
    async fn refund(&self, a: &PaymentAttempt, _: i64, _: &str) -> Result<RefundResult, Unavailable> {
        let p = &a.payment_id;
        Ok(RefundResult::Refunded { channel_refund_id: format!("r-{p}") })
    }
}

struct World {
    store: DynamoStore,
    clock: FixedClock,
    channel: Ledger,
}

impl World {
    async fn new() -> Self {
        let store = fresh_table(&dynamodb_local().await).await;
        system_tests::fixtures::seed_stock(&store, &sku("A"), 10, &eur(100)).await.unwrap();
        Self { store, clock: FixedClock::at(T0), channel: Ledger::default() }
    }

    async fn order(&self, coupon: Option<&str>) -> Result<Order, ApiError> {
        let uc = fixtures::creator(&self.store, &self.clock, Duration::from_millis(WINDOW_MS as u64), "t");
        let mut body =
            json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "A", "qty": 2, "unit_price": 100}]});
        if let Some(c) = coupon {
            body["coupon_id"] = json!(c);
        }
        uc.execute_as_named(Some(&format!("k{}", rand::random::<u64>())), body.to_string().as_bytes())
            .await
            .map(|c| c.order)
    }

    fn payments(&self) -> StartPayment<'_, DynamoStore, Ledger> {
        StartPayment {
            store: &self.store,
            channel: Some(&self.channel),
            clock: &self.clock,
            ids: &RandomIds,
            merchant_id: MERCHANT,
            not_found_grace: Duration::from_secs(10),
            until: None,
        }
    }

    async fn pay(&self, o: &Order, key: &str) -> Result<PaymentStarted, ApiError> {
        start_payment(&self.payments(), &o.user_id, o.order_id.as_str(), Some(key), br#"{"channel":"sandbox"}"#).await
    }

    async fn record(&self, o: &Order) -> OrderRecord {
        self.store.order_record(&o.order_id).await.unwrap().unwrap()
    }

    async fn item_count(&self) -> i32 {
        self.store.client().scan().table_name(self.store.table()).send().await.unwrap().count
    }

    async fn set_coupon_state(&self, id: &str, state: &str) {
        self.store
            .client()
            .update_item()
            .table_name(self.store.table())
            .key("pk", Av::S(keys::coupon(&CouponId::parse(id).unwrap())))
            .key("sk", Av::S(keys::COUPON_SK.into()))
            .update_expression("SET #s = :s")
            .expression_attribute_names("#s", "state")
            .expression_attribute_values(":s", Av::S(state.into()))
            .send()
            .await
            .unwrap();
    }
}

fn sku(s: &str) -> Sku {
    Sku::parse(s).unwrap()
}

fn code<T: std::fmt::Debug>(r: Result<T, ApiError>) -> String {
    match r {
        Err(ApiError::Refused { code, .. }) => code.to_owned(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn message<T: std::fmt::Debug>(r: Result<T, ApiError>) -> String {
    match r {
        Err(ApiError::Refused { message, .. }) => message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn coupon_body(returnable: Option<bool>) -> Vec<u8> {
    let mut b = json!({"user_id": "u1", "valid_until": "2030-01-01T00:00:00Z"});
    if let Some(r) = returnable {
        b["returnable"] = json!(r);
    }
    b.to_string().into_bytes()
}

// ---------------------------------------------------------------- coupons

#[tokio::test]
async fn an_operator_write_never_turns_a_used_coupon_back_to_available() {
    let w = World::new().await;
    requests::put_coupon(&w.store, "C-USED", &coupon_body(None)).await.unwrap();
    let o = w.order(Some("C-USED")).await.unwrap();
    let (o, a) = {
        let started = w.pay(&o, "p1").await.unwrap();
        let rec = w.record(&o).await;
        let a = rec.payments.into_iter().find(|p| p.payment_id == started.attempt.payment_id).unwrap();
        (rec.order, a)
    };
    let ev = Evidence { at: w.clock.now(), source: "test".into(), status: PaymentStatus::Succeeded, detail: None };
    w.store.settle_success(&o, &a, "tx-used", ev, None, "").await.unwrap();
    settle_order(&w.store, &RecordedWakeUps::default(), &w.channel, &w.clock, &o.order_id).await.unwrap();
    let before = requests::get_coupon(&w.store, "C-USED").await.unwrap();
    assert_eq!(before["state"], "USED");

    let refused = requests::put_coupon(&w.store, "C-USED", &coupon_body(None)).await;
    assert_eq!(code(refused), "coupon_final");
    assert_eq!(requests::get_coupon(&w.store, "C-USED").await.unwrap(), before, "nothing written");
    assert_eq!(code(w.order(Some("C-USED")).await), "coupon_unavailable", "a second order cannot spend it");
}

#[tokio::test]
async fn an_operator_write_never_revives_an_expired_or_void_coupon() {
    let w = World::new().await;
    for state in ["EXPIRED", "VOID"] {
        let id = format!("C-{state}");
        requests::put_coupon(&w.store, &id, &coupon_body(None)).await.unwrap();
        w.set_coupon_state(&id, state).await;
        let refused = requests::put_coupon(&w.store, &id, &coupon_body(None)).await;
        assert!(message(refused).contains(state), "the refusal names the outcome");
        assert_eq!(requests::get_coupon(&w.store, &id).await.unwrap()["state"], state);
    }
    // An AVAILABLE coupon may still be rewritten (e.g. a new validity).
    requests::put_coupon(&w.store, "C-NEW", &coupon_body(None)).await.unwrap();
    let again = requests::put_coupon(&w.store, "C-NEW", &coupon_body(Some(false))).await.unwrap();
    assert_eq!(again["returnable"], false);
}

#[tokio::test]
async fn a_non_returnable_coupon_ends_void_with_a_reason_when_its_order_closes_unpaid() {
    let w = World::new().await;
    let stored = requests::put_coupon(&w.store, "ONCE", &coupon_body(Some(false))).await.unwrap();
    assert_eq!(stored["returnable"], false);
    assert_eq!(requests::get_coupon(&w.store, "ONCE").await.unwrap()["returnable"], false);
    assert_eq!(
        code(
            requests::put_coupon(
                &w.store,
                "X",
                br#"{"user_id":"u1","valid_until":"2030-01-01T00:00:00Z","returnable":"no"}"#
            )
            .await
        ),
        "invalid_request"
    );

    let o = w.order(Some("ONCE")).await.unwrap();
    w.clock.set(T0 + WINDOW_MS + 1);
    assert_eq!(w.store.close_unpaid(&o, w.clock.now()).await.unwrap(), Cas::Applied);
    let report = release_order(&w.store, &w.clock, &o.order_id).await.unwrap();
    assert_eq!(report.refused, 0);

    let lock = w.record(&o).await.coupon_lock.unwrap();
    assert_eq!(lock.status, CouponLockStatus::Void);
    assert!(lock.reason.unwrap().contains("not returnable"));
    let coupon = requests::get_coupon(&w.store, "ONCE").await.unwrap();
    assert_eq!(coupon["state"], "VOID");
    assert!(coupon["reason"].as_str().unwrap().contains("not returnable"));
    assert_eq!(code(w.order(Some("ONCE")).await), "coupon_unavailable");
    // A duplicate release record changes nothing.
    let again = release_order(&w.store, &w.clock, &o.order_id).await.unwrap();
    assert_eq!((again.moved, again.refused), (0, 0));
}

// ------------------------------------------------------------------ stock

/// PUT /admin/skus/{sku} without an Idempotency-Key, as the handler calls it.
async fn put_stock(store: &DynamoStore, sku: &str, body: &[u8]) -> Result<serde_json::Value, ApiError> {
    requests::put_stock(store, &SystemClock, &RandomIds, sku, None, "tests".into(), body).await.map(|(v, _)| v)
}

#[tokio::test]
async fn a_blind_stock_set_of_a_live_sku_is_refused_and_changes_nothing() {
    let w = World::new().await;
    let seeded = put_stock(&w.store, "NEW", br#"{"available": 5, "price": 1299, "currency": "EUR"}"#).await.unwrap();
    assert_eq!(
        seeded,
        json!({"sku": "NEW", "available": 5, "reserved": 0, "sold": 0, "price": 1299, "currency": "EUR"})
    );
    w.order(None).await.unwrap(); // holds 2 of A
    let before = requests::get_stock(&w.store, "A").await.unwrap();
    assert_eq!((before["available"].as_i64(), before["reserved"].as_i64()), (Some(8), Some(2)));

    let blind = br#"{"available": 100, "price": 1, "currency": "EUR"}"#;
    let refused = put_stock(&w.store, "A", blind).await;
    let msg = message(refused);
    assert!(msg.contains("if_available") && msg.contains("adjust"), "names what to send: {msg}");
    assert_eq!(code(put_stock(&w.store, "A", blind).await), "stock_exists");
    // Without a price it is not a seed at all.
    let bare = put_stock(&w.store, "A", br#"{"available": 100}"#).await;
    assert_eq!(code(put_stock(&w.store, "A", br#"{"available": 100}"#).await), "invalid_request");
    assert!(message(bare).contains("price and currency are required"));
    assert_eq!(requests::get_stock(&w.store, "A").await.unwrap(), before, "nothing written");
}

#[tokio::test]
async fn live_stock_changes_by_compare_and_swap_or_by_a_relative_adjustment() {
    let w = World::new().await;
    w.order(None).await.unwrap();
    let after = put_stock(&w.store, "A", br#"{"adjust": -3}"#).await.unwrap();
    assert_eq!((after["available"].as_i64(), after["reserved"].as_i64()), (Some(5), Some(2)));
    assert_eq!(code(put_stock(&w.store, "A", br#"{"adjust": -6}"#).await), "insufficient_stock");
    assert_eq!(code(put_stock(&w.store, "A", br#"{"available": 9, "if_available": 8}"#).await), "stock_changed");
    let swapped = put_stock(&w.store, "A", br#"{"available": 9, "if_available": 5}"#).await.unwrap();
    assert_eq!(swapped["available"], 9);
    assert_eq!(code(put_stock(&w.store, "NONE", br#"{"adjust": 1}"#).await), "not_found");
    for bad in [&br#"{"available": 1, "adjust": 1}"#[..], br#"{"adjust": 0}"#, br#"{"if_available": 1}"#, b"{}"] {
        assert_eq!(code(put_stock(&w.store, "A", bad).await), "invalid_request");
    }
    assert_eq!(requests::get_stock(&w.store, "A").await.unwrap()["available"], 9);
}

#[tokio::test]
async fn a_price_change_touches_only_the_catalog_price_and_never_an_open_order() {
    let w = World::new().await;
    let open = w.order(None).await.unwrap(); // 2 of A at 100
    let before = requests::get_stock(&w.store, "A").await.unwrap();
    assert_eq!((before["price"].as_i64(), before["currency"].as_str()), (Some(100), Some("EUR")));

    let after = put_stock(&w.store, "A", br#"{"price": 150, "currency": "EUR"}"#).await.unwrap();
    assert_eq!(
        after,
        json!({"sku": "A", "available": 8, "reserved": 2, "sold": 0, "price": 150, "currency": "EUR"}),
        "the counts are untouched"
    );
    let kept = w.store.order(&open.order_id).await.unwrap().unwrap();
    assert_eq!(kept.items[0].unit_price, 100, "the open order keeps its price");
    assert_eq!(kept.amount_total, 200);
    assert_eq!(kept.version, open.version);

    // A price alone never creates a SKU.
    let missing = put_stock(&w.store, "NONE", br#"{"price": 150, "currency": "EUR"}"#).await;
    assert_eq!(code(missing), "not_found");
    assert_eq!(w.store.stock(&sku("NONE")).await.unwrap(), None, "nothing written");

    for (bad, names) in [
        (&br#"{"price": 150}"#[..], "currency"),
        (br#"{"currency": "EUR"}"#, "price"),
        (br#"{"price": -1, "currency": "EUR"}"#, "price"),
        (br#"{"price": 150, "currency": "euro"}"#, "currency"),
        (br#"{"price": 150, "currency": "EUR", "adjust": 1}"#, "adjust"),
    ] {
        let m = message(put_stock(&w.store, "A", bad).await);
        assert!(m.contains(names), "{}: {m}", String::from_utf8_lossy(bad));
    }
    assert_eq!(requests::get_stock(&w.store, "A").await.unwrap(), after, "the refusals wrote nothing");
}

// -------------------------------------------------------- payment entry

#[tokio::test]
async fn a_payment_replayed_with_the_same_key_returns_the_same_attempt_and_opens_nothing_new() {
    let w = World::new().await;
    let o = w.order(None).await.unwrap();
    let first = w.pay(&o, "pay-1").await.unwrap();
    let again = w.pay(&o, "pay-1").await.unwrap();
    assert!(!first.replayed && again.replayed);
    assert_eq!(first.attempt.payment_id, again.attempt.payment_id);
    let rec = w.record(&o).await;
    assert_eq!((rec.order.payment_attempts, rec.payments.len()), (1, 1));
    assert_eq!(w.channel.distinct_opened(), 1);
    assert!(w.channel.cancelled.lock().unwrap().is_empty(), "the replay closed nothing");
    // Missing key: refused before anything is written.
    let count = w.item_count().await;
    let missing =
        start_payment(&w.payments(), &o.user_id, o.order_id.as_str(), None, br#"{"channel":"sandbox"}"#).await;
    assert!(message(missing).contains("Idempotency-Key"));
    assert_eq!(w.item_count().await, count);
}

#[tokio::test]
async fn a_payment_key_is_scoped_to_its_order_and_reused_with_another_body_is_refused() {
    let w = World::new().await;
    let (o1, o2) = (w.order(None).await.unwrap(), w.order(None).await.unwrap());
    let a = w.pay(&o1, "same").await.unwrap();
    let b = w.pay(&o2, "same").await.unwrap();
    assert_ne!(a.attempt.payment_id, b.attempt.payment_id, "another order: another attempt");
    assert!(!b.replayed);

    // The key was first used with another body (planted: today one channel exists).
    let o3 = w.order(None).await.unwrap();
    let planted = PaymentAttempt {
        payment_id: PaymentId::parse("pay_planted").unwrap(),
        order_id: o3.order_id.clone(),
        channel: ChannelName::parse("sandbox").unwrap(),
        amount: o3.amount_total,
        currency: o3.currency.clone(),
        status: PaymentStatus::Processing,
        channel_txn_id: None,
        channel_ref: None,
        created_at: w.clock.now(),
        evidence: vec![],
    };
    let claim = PaymentClaim { key: IdempotencyKey::parse("k3").unwrap(), request_hash: "another-body".into() };
    assert_eq!(w.store.record_keyed_attempt(&o3, &planted, Some(&claim)).await.unwrap(), AttemptResult::Recorded);
    let count = w.item_count().await;
    assert_eq!(code(w.pay(&o3, "k3").await), "idempotency_key_reused");
    assert_eq!(w.item_count().await, count, "nothing written");
}

#[tokio::test]
async fn a_new_attempt_closes_the_previous_one_at_the_channel() {
    let w = World::new().await;
    let o = w.order(None).await.unwrap();
    let first = w.pay(&o, "k1").await.unwrap();
    let second = w.pay(&o, "k2").await.unwrap();
    let first_id = first.attempt.payment_id.clone();
    assert_eq!(*w.channel.cancelled.lock().unwrap(), vec![first_id.clone()]);
    let rec = w.record(&o).await;
    let status = |id: &PaymentId| rec.payments.iter().find(|p| p.payment_id == *id).unwrap().status;
    assert_eq!(status(&first.attempt.payment_id), PaymentStatus::Failed);
    assert_eq!(status(&second.attempt.payment_id), PaymentStatus::Processing);
    let superseded = rec.payments.iter().find(|p| p.payment_id == first_id).unwrap();
    assert!(superseded.evidence.iter().any(|e| e.source.contains("superseded")));
}

#[tokio::test]
async fn a_previous_attempt_found_paid_when_a_new_one_starts_pays_the_order() {
    let w = World::new().await;
    let o = w.order(None).await.unwrap();
    let first = w.pay(&o, "k1").await.unwrap();
    let first_id = first.attempt.payment_id.clone();
    w.channel.pay(&first_id, "tx-first", o.amount_total);
    assert_eq!(code(w.pay(&o, "k2").await), "order_not_payable");
    let rec = w.record(&o).await;
    assert_eq!(rec.order.status, OrderStatus::Paid);
    assert_eq!(rec.order.paid_by, Some(first_id));
    assert_eq!(rec.payments.len(), 1, "no second attempt was recorded");
}

#[tokio::test]
async fn more_than_max_payment_attempts_are_refused_and_nothing_is_written() {
    let w = World::new().await;
    let o = w.order(None).await.unwrap();
    for i in 0..MAX_PAYMENT_ATTEMPTS {
        w.pay(&o, &format!("k{i}")).await.unwrap();
    }
    let count = w.item_count().await;
    assert_eq!(code(w.pay(&o, "one-more").await), "too_many_attempts");
    assert_eq!(w.item_count().await, count);
    let rec = w.record(&o).await;
    assert_eq!(rec.order.payment_attempts, MAX_PAYMENT_ATTEMPTS);
    assert_eq!(rec.payments.iter().filter(|p| !p.status.is_final()).count(), 1, "one open attempt at a time");
}

#[tokio::test]
async fn concurrent_payment_entries_answer_created_or_busy_never_an_internal_error() {
    let w = World::new().await;
    let o = w.order(None).await.unwrap();
    let calls = (0..12).map(|i| {
        let w = &w;
        let o = &o;
        async move { w.pay(o, &format!("c{i}")).await }
    });
    let results = futures::future::join_all(calls).await;
    let mut created = 0;
    for r in results {
        match r {
            Ok(_) => created += 1,
            Err(ApiError::Refused { code, .. }) => {
                assert!(["order_busy", "too_many_attempts"].contains(&code), "unexpected refusal {code}")
            }
            Err(e @ ApiError::Internal(_)) => panic!("contention answered as an internal error: {e}"),
        }
    }
    assert!(created >= 1);
    let rec = w.record(&o).await;
    assert!(rec.order.payment_attempts <= MAX_PAYMENT_ATTEMPTS);
    assert_eq!(rec.payments.len() as u32, rec.order.payment_attempts);
}

// ------------------------------------------------------------ the webhook

fn notification(a: &PaymentAttempt, notify_id: &str, txn: &str) -> Vec<u8> {
    json!({
        "notify_id": notify_id, "payment_id": a.payment_id, "order_id": a.order_id, "channel_txn_id": txn,
        "amount": a.amount, "currency": a.currency, "merchant_id": MERCHANT, "status": "SUCCEEDED",
    })
    .to_string()
    .into_bytes()
}

async fn notify_count(w: &World) -> usize {
    let out = w
        .store
        .client()
        .scan()
        .table_name(w.store.table())
        .filter_expression("begins_with(pk, :p)")
        .expression_attribute_values(":p", Av::S("NOTIFY#".into()))
        .send()
        .await
        .unwrap();
    for item in out.items() {
        let received = Timestamp::parse(item["received_at"].as_s().unwrap()).unwrap().unix_seconds();
        let expires: i64 = item["expires_at_epoch"].as_n().unwrap().parse().unwrap();
        assert_eq!(expires - received, 30 * 24 * 3600, "dedupe records expire after 30 days");
    }
    out.items().len()
}

#[tokio::test]
async fn a_success_resent_with_new_notify_ids_for_the_paying_payment_changes_nothing() {
    let w = World::new().await;
    let o = w.order(None).await.unwrap();
    w.pay(&o, "k1").await.unwrap();
    let a = w.record(&o).await.payments.remove(0);
    let first = payment_notification(&w.store, &w.clock, MERCHANT, "sandbox", &notification(&a, "n0", "tx-1")).await;
    assert_eq!(first.unwrap()["result"], "paid");
    let before = w.record(&o).await;
    for i in 1..6 {
        let r =
            payment_notification(&w.store, &w.clock, MERCHANT, "sandbox", &notification(&a, &format!("n{i}"), "tx-1"))
                .await
                .unwrap();
        assert_eq!(r["result"], "duplicate");
    }
    let after = w.record(&o).await;
    assert_eq!(after.payments[0].evidence.len(), 1, "the attempt does not grow");
    assert_eq!(after, before);
    assert_eq!(notify_count(&w).await, 1, "one dedupe record, with its TTL");
}

#[tokio::test]
async fn a_late_success_resent_keeps_one_refund_one_evidence_and_an_expiring_dedupe_record() {
    let w = World::new().await;
    let o = w.order(None).await.unwrap();
    w.pay(&o, "k1").await.unwrap();
    let rec = w.record(&o).await;
    let a = rec.payments[0].clone();
    // Closed while the channel said "failed"; the success comes late.
    w.clock.set(T0 + WINDOW_MS + 1);
    let lease = ClosingLease {
        owner: "t".into(),
        started_at: w.clock.now(),
        lease_until: w.clock.now().plus(Duration::from_secs(30)),
        resumes: 0,
    };
    assert_eq!(w.store.begin_closing(&rec.order, &lease, w.clock.now()).await.unwrap(), Cas::Applied);
    let closing = w.store.order(&o.order_id).await.unwrap().unwrap();
    assert_eq!(w.store.close_after_check(&closing, w.clock.now(), "test").await.unwrap(), Cas::Applied);
    for i in 0..4 {
        let r =
            payment_notification(&w.store, &w.clock, MERCHANT, "sandbox", &notification(&a, &format!("n{i}"), "tx-9"))
                .await
                .unwrap();
        // The first makes the refund; a resend changes nothing and says so.
        assert_eq!(r["result"], if i == 0 { "refund_pending" } else { "duplicate" }, "notification {i}");
    }
    let after = w.record(&o).await;
    assert_eq!(after.order.status, OrderStatus::Closed);
    assert_eq!(after.refunds.len(), 1);
    assert_eq!(after.payments[0].evidence.len(), 1);
    assert_eq!(notify_count(&w).await, 1);
}

#[tokio::test]
async fn another_buyer_paying_or_reading_an_order_gets_404_and_nothing_is_written_or_asked() {
    let w = World::new().await;
    let o = w.order(None).await.unwrap();
    let before = (w.item_count().await, w.record(&o).await.order.version);
    let stranger = UserId::parse("u-stranger").unwrap();

    let paid =
        start_payment(&w.payments(), &stranger, o.order_id.as_str(), Some("k-x"), br#"{"channel":"sandbox"}"#).await;
    match paid {
        Err(ApiError::Refused { code: "not_found", .. }) => {}
        other => panic!("expected 404, got {other:?}"),
    }
    // An overdue order: the owner's read would nudge the closer; a stranger's must not.
    w.clock.set(T0 + WINDOW_MS + 1_000);
    let reminders = system_tests::fakes::RecordedReminders::default();
    let read = get_order(&w.store, &reminders, &w.clock, o.order_id.as_str(), &Reader::Buyer(stranger)).await;
    match read {
        Err(ApiError::Refused { code: "not_found", .. }) => {}
        other => panic!("expected 404, got {other:?}"),
    }
    assert_eq!((w.item_count().await, w.record(&o).await.order.version), before, "nothing written");
    assert!(w.channel.opened.lock().unwrap().is_empty(), "the channel was never asked to open a payment");
    assert!(reminders.0.lock().unwrap().is_empty(), "no close reminder for a stranger's read");
    // The owner's read of the same overdue order is served (and nudges).
    let own = get_order(&w.store, &reminders, &w.clock, o.order_id.as_str(), &Reader::Buyer(o.user_id.clone())).await;
    assert_eq!(own.unwrap()["expired_awaiting_close"], true);
    assert_eq!(reminders.0.lock().unwrap().len(), 1);
}
