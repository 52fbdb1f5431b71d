//! What a buyer's order holds besides stock, on the real store (DynamoDB
//! Local): the per-SKU purchase limit and the open-order cap, taken in the
//! create transaction so concurrent creates by one buyer never pass them;
//! loyalty points held from the balance, returned on close and spent on
//! pay, exactly once each; the audited credit of a balance; and the bad
//! inputs of each, refused with nothing written.

use order_core::aws::dynamo::{keys, DynamoStore};
use order_core::domain::points::audit_disagreements;
use order_core::domain::*;
use order_core::error::ApiError;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::close_order::CloseOutcome;
use order_core::usecases::create_order::CreateOrder;
use order_core::usecases::points::{credit_points, CreditRequest};
use order_core::usecases::queries::{put_stock, StockRequest};
use order_core::usecases::release_order::{release_order, settle_order};
use serde_json::{json, Value};
use std::time::Duration;
use system_tests::fakes::*;
use system_tests::fixtures::{self, eur};
use system_tests::CreateAsNamed;
use system_tests::{dynamodb_local, fresh_table};

const T0: i64 = 1_800_000_000_000;
const WINDOW_MS: i64 = 60_000;
const BUYER: &str = "hoarder";

struct World {
    store: DynamoStore,
    clock: FixedClock,
}

impl World {
    async fn new() -> Self {
        let store = fresh_table(&dynamodb_local().await).await;
        for sku in ["A", "B"] {
            system_tests::fixtures::seed_stock(&store, &sku_(sku), 100, &eur(1000)).await.unwrap();
        }
        Self { store, clock: FixedClock::at(T0) }
    }

    fn creator(&self, cap: Option<u32>) -> CreateOrder<DynamoStore> {
        CreateOrder {
            open_order_cap: cap,
            ..fixtures::creator(&self.store, &self.clock, Duration::from_millis(WINDOW_MS as u64), "t")
        }
    }

    async fn create(&self, cap: Option<u32>, body: Value) -> Result<Order, ApiError> {
        let key = format!("k{}", rand::random::<u64>());
        self.creator(cap).execute_as_named(Some(&key), body.to_string().as_bytes()).await.map(|c| c.order)
    }

    async fn limit(&self, sku: &str, n: u32) {
        let req = StockRequest {
            change: StockChange::Limit(n),
            key: Some(IdempotencyKey::parse(format!("limit-{n}-{}", rand::random::<u32>())).unwrap()),
            by: "ops".into(),
        };
        put_stock(&self.store, &self.clock, &RandomIds, &sku_(sku), req).await.unwrap();
    }

    async fn credit(
        &self,
        delta: i64,
        key: &str,
    ) -> Result<(order_core::domain::points::PointsBalance, bool), ApiError> {
        let req = CreditRequest {
            user_id: UserId::parse(BUYER).unwrap(),
            currency: Currency::parse("EUR").unwrap(),
            key: IdempotencyKey::parse(key).unwrap(),
            delta,
            reason: "welcome bonus".into(),
            by: "ops".into(),
        };
        credit_points(&self.store, &self.clock, req).await.map_err(ApiError::from)
    }

    /// A buyer counter's attribute (`None`: the counter does not exist).
    async fn counter(&self, sk: &str, attr: &str) -> Option<i64> {
        let item = self.store.get_item(keys::buyer(&UserId::parse(BUYER).unwrap()), sk).await.unwrap()?;
        item.get(attr).map(|v| v.as_n().unwrap().parse().unwrap())
    }

    async fn balance(&self) -> order_core::domain::points::PointsBalance {
        self.store.points_balance(&UserId::parse(BUYER).unwrap()).await.unwrap().expect("a balance")
    }

    /// Closes `o` (its window over, no payment) and releases what it held,
    /// through the close and release use cases.
    async fn close_and_release(&self, o: &Order) {
        let at = self.clock.now();
        self.clock.set(o.expire_at.unix_millis());
        let closer =
            fixtures::closer(&self.store, ScriptedChannel::default(), RecordedReminders::default(), &self.clock);
        assert_eq!(closer.close(&o.order_id, "t").await.unwrap(), CloseOutcome::Closed);
        release_order(&self.store, &self.clock, &o.order_id).await.unwrap();
        self.clock.set(at.unix_millis());
    }

    /// Pays `o` (a trusted success) and settles it: every holding confirmed.
    async fn pay_and_settle(&self, o: &Order) {
        let a = system_tests::fixtures::processing_attempt(o, self.clock.now());
        assert_eq!(self.store.record_attempt(o, &a).await.unwrap(), AttemptResult::Recorded);
        let o = self.store.order(&o.order_id).await.unwrap().unwrap();
        let ev = Evidence { at: self.clock.now(), source: "t".into(), status: PaymentStatus::Succeeded, detail: None };
        assert_eq!(self.store.settle_success(&o, &a, "tx", ev, None, "").await.unwrap(), SettleResult::Paid);
        let channel = ScriptedChannel::default();
        settle_order(&self.store, &RecordedWakeUps::default(), &channel, &self.clock, &o.order_id).await.unwrap();
    }

    async fn holdings(&self, o: &Order) -> Vec<Reservation> {
        self.store.order_record(&o.order_id).await.unwrap().unwrap().reservations
    }
}

fn sku_(s: &str) -> Sku {
    Sku::parse(s).unwrap()
}

fn body(sku: &str, qty: u32, points: Option<u32>) -> Value {
    let mut b = json!({"user_id": BUYER, "currency": "EUR", "items": [{"sku": sku, "qty": qty}]});
    if let Some(p) = points {
        b["points"] = json!(p);
    }
    b
}

fn code(r: Result<Order, ApiError>) -> String {
    r.map(|o| format!("created {}", o.order_id)).unwrap_or_else(|e| e.code().to_string())
}

/// Runs `n` creates of `body` at once, returning the created orders and
/// the refusal codes.
async fn at_once(w: &World, cap: Option<u32>, n: usize, body: Value) -> (Vec<Order>, Vec<String>) {
    let results = futures::future::join_all((0..n).map(|_| w.create(cap, body.clone()))).await;
    let mut created = Vec::new();
    let mut refused = Vec::new();
    for r in results {
        match r {
            Ok(o) => created.push(o),
            Err(e) => refused.push(e.code().to_string()),
        }
    }
    (created, refused)
}

#[tokio::test]
async fn twenty_concurrent_creates_by_one_buyer_never_pass_the_purchase_limit() {
    let w = World::new().await;
    w.limit("A", 2).await;
    let (created, refused) = at_once(&w, None, 20, body("A", 1, None)).await;
    assert_eq!(created.len(), 2, "refusals: {refused:?}");
    assert!(refused.iter().all(|c| c == "purchase_limit_reached"), "{refused:?}");
    assert_eq!(w.counter("LIMIT#A", "used").await, Some(2));
    assert_eq!(w.counter("LIMIT#A", "held").await, Some(2));
    // The stock moved only for the two orders.
    assert_eq!(w.store.stock(&sku_("A")).await.unwrap().unwrap().reserved, 2);
    // Each order holds its units of the limit beside its stock.
    let held = w.holdings(&created[0]).await;
    let kinds: Vec<ResourceType> = held.iter().map(|r| r.resource_type).collect();
    assert_eq!(kinds, [ResourceType::PurchaseLimit, ResourceType::Stock], "{held:?}");
    // Another SKU, or another buyer, is not limited by it.
    assert!(w.create(None, body("B", 5, None)).await.is_ok());
    let other = json!({"user_id": "someone-else", "currency": "EUR", "items": [{"sku": "A", "qty": 2}]});
    assert!(w.create(None, other).await.is_ok());

    // Closed: the units come back to the buyer's limit (and the stock).
    w.close_and_release(&created[0]).await;
    assert_eq!(w.counter("LIMIT#A", "used").await, Some(1));
    let third = w.create(None, body("A", 1, None)).await.expect("room again after a close");
    // Paid: the units stay counted (bought), never returned.
    w.pay_and_settle(&third).await;
    assert_eq!(w.counter("LIMIT#A", "used").await, Some(2));
    assert_eq!(w.counter("LIMIT#A", "held").await, Some(1));
    assert_eq!(w.counter("LIMIT#A", "bought").await, Some(1));
    assert_eq!(code(w.create(None, body("A", 1, None)).await), "purchase_limit_reached");
    // A release delivered twice returns the units once.
    release_order(&w.store, &w.clock, &created[0].order_id).await.unwrap();
    assert_eq!(w.counter("LIMIT#A", "used").await, Some(2));
}

#[tokio::test]
async fn a_line_over_the_limit_is_refused_before_anything_is_written() {
    let w = World::new().await;
    w.limit("A", 2).await;
    assert_eq!(code(w.create(None, body("A", 3, None)).await), "purchase_limit_reached");
    assert_eq!(w.counter("LIMIT#A", "used").await, None);
    assert_eq!(w.store.stock(&sku_("A")).await.unwrap().unwrap().reserved, 0);
    // Lifting the limit (0) lets it through, and takes no limit holding.
    w.limit("A", 0).await;
    let o = w.create(None, body("A", 3, None)).await.unwrap();
    assert_eq!(w.holdings(&o).await.len(), 1);
}

#[tokio::test]
async fn twenty_concurrent_creates_by_one_buyer_never_pass_the_open_order_cap() {
    let w = World::new().await;
    let (created, refused) = at_once(&w, Some(3), 20, body("A", 1, None)).await;
    assert_eq!(created.len(), 3, "refusals: {refused:?}");
    assert!(refused.iter().all(|c| c == "open_order_cap_reached"), "{refused:?}");
    assert_eq!(w.counter("OPEN_ORDERS", "open").await, Some(3));
    assert_eq!(w.store.stock(&sku_("A")).await.unwrap().unwrap().reserved, 3, "nothing held by the refused");
    // A closed order and a paid one each give their slot back.
    w.close_and_release(&created[0]).await;
    w.pay_and_settle(&created[1]).await;
    assert_eq!(w.counter("OPEN_ORDERS", "open").await, Some(1));
    let (again, _) = at_once(&w, Some(3), 5, body("A", 1, None)).await;
    assert_eq!(again.len(), 2);
    assert_eq!(w.counter("OPEN_ORDERS", "open").await, Some(3));
}

#[tokio::test]
async fn points_are_held_by_an_open_order_returned_on_close_and_spent_on_pay_once_each() {
    let w = World::new().await;
    assert_eq!(w.credit(500, "credit-1").await.unwrap().0.available, 500);
    // Held: taken from available, the amount lowered by one per point.
    let o = w.create(None, body("A", 1, Some(300))).await.unwrap();
    assert_eq!((o.points, o.amount_total), (300, 700));
    let b = w.balance().await;
    assert_eq!((b.available, b.held, b.spent), (200, 300, 0));
    // Not enough left for a second order of 300.
    assert_eq!(code(w.create(None, body("A", 1, Some(300))).await), "not_enough_points");
    assert_eq!(w.balance().await.available, 200, "a refused create holds nothing");
    // Closed: back, once, however often the release is delivered.
    w.close_and_release(&o).await;
    release_order(&w.store, &w.clock, &o.order_id).await.unwrap();
    let b = w.balance().await;
    assert_eq!((b.available, b.held, b.spent), (500, 0, 0));
    // Paid: spent, once.
    let paid = w.create(None, body("A", 1, Some(250))).await.unwrap();
    w.pay_and_settle(&paid).await;
    settle_order(&w.store, &RecordedWakeUps::default(), &ScriptedChannel::default(), &w.clock, &paid.order_id)
        .await
        .unwrap();
    let b = w.balance().await;
    assert_eq!((b.available, b.held, b.spent), (250, 0, 250));
    let credits = w.store.points_credits(&UserId::parse(BUYER).unwrap()).await.unwrap();
    assert!(audit_disagreements(&b, &credits).is_empty(), "{:?}", audit_disagreements(&b, &credits));
}

#[tokio::test]
async fn twenty_concurrent_creates_spending_points_never_hold_more_than_the_balance() {
    let w = World::new().await;
    w.credit(1000, "c").await.unwrap();
    let (created, refused) = at_once(&w, None, 20, body("B", 1, Some(300))).await;
    assert_eq!(created.len(), 3, "{refused:?}");
    assert!(refused.iter().all(|c| c == "not_enough_points"), "{refused:?}");
    let b = w.balance().await;
    assert_eq!((b.available, b.held), (100, 900));
}

#[tokio::test]
async fn points_that_would_pay_the_whole_order_or_that_the_buyer_lacks_are_refused_with_nothing_held() {
    let w = World::new().await;
    // No balance at all.
    assert_eq!(code(w.create(None, body("A", 1, Some(10))).await), "not_enough_points");
    w.credit(5000, "c").await.unwrap();
    assert_eq!(code(w.create(None, body("A", 1, Some(1000))).await), "points_exceed_total");
    assert_eq!(w.balance().await.available, 5000);
    assert_eq!(w.store.stock(&sku_("A")).await.unwrap().unwrap().reserved, 0);
    // Wrong types and bounds are 400s naming the field.
    for bad in [json!(-1), json!(1.5), json!("10"), json!(10_000_000_000u64)] {
        let mut b = body("A", 1, None);
        b["points"] = bad.clone();
        let e = w.create(None, b).await.unwrap_err();
        assert_eq!(e.code(), "invalid_request", "{bad}");
        assert!(e.to_string().contains("points"), "{e}");
    }
}

#[tokio::test]
async fn a_credit_is_applied_once_per_key_and_a_debit_never_takes_held_points() {
    let w = World::new().await;
    let (first, replayed) = w.credit(400, "grant-1").await.unwrap();
    assert!(!replayed);
    let (again, replayed) = w.credit(400, "grant-1").await.unwrap();
    assert!(replayed);
    assert_eq!((first.credited, again.credited, again.changes), (400, 400, 1));
    // The key with another credit is refused.
    assert_eq!(w.credit(401, "grant-1").await.unwrap_err().code(), "idempotency_key_reused");
    // Points held by an open order cannot be taken away.
    w.create(None, body("A", 1, Some(300))).await.unwrap();
    assert_eq!(w.credit(-200, "debit-1").await.unwrap_err().code(), "not_enough_points");
    let (after, _) = w.credit(-100, "debit-2").await.unwrap();
    assert_eq!((after.available, after.held, after.credited, after.changes), (0, 300, 300, 2));
}

#[tokio::test]
async fn points_are_worth_minor_units_of_their_balances_currency_only() {
    let w = World::new().await;
    let usd = Price { amount: 1000, currency: Currency::parse("USD").unwrap() };
    system_tests::fixtures::seed_stock(&w.store, &sku_("U"), 10, &usd).await.unwrap();
    w.credit(500, "eur-credit").await.unwrap();
    // An order in USD cannot spend points kept in EUR; nothing is held.
    let body = json!({"user_id": BUYER, "currency": "USD", "items": [{"sku": "U", "qty": 1}], "points": 100});
    assert_eq!(code(w.create(None, body).await), "points_currency_mismatch");
    assert_eq!(w.balance().await.available, 500);
    assert_eq!(w.store.stock(&sku_("U")).await.unwrap().unwrap().reserved, 0);
    // Nor is a credit in another currency added to the balance.
    let req = CreditRequest {
        user_id: UserId::parse(BUYER).unwrap(),
        currency: Currency::parse("USD").unwrap(),
        key: IdempotencyKey::parse("usd-credit").unwrap(),
        delta: 100,
        reason: "wrong currency".into(),
        by: "ops".into(),
    };
    let refused = credit_points(&w.store, &w.clock, req).await.map_err(ApiError::from).unwrap_err();
    assert_eq!(refused.code(), "points_currency_mismatch");
    let b = w.balance().await;
    assert_eq!((b.currency.as_ref().map(Currency::as_str), b.credited), (Some("EUR"), 500));
}
