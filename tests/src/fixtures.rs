//! Builders for the store and use-case tests on DynamoDB Local: domain
//! records, the create and close use cases as the tests run them, a paid
//! order with a second success, and [`World`] — a fresh stocked table, a
//! clock the test moves, a scripted channel and recorded reminders.

use crate::fakes::{FixedClock, RecordedReminders, ScriptedChannel};
use crate::{dynamodb_local, fresh_table, CreateAsNamed};
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::close_order::{CloseOrder, DEFAULT_CLOSE_BUDGET};
use order_core::usecases::create_order::CreateOrder;
use order_core::usecases::payments::StartPayment;
use order_core::usecases::queries::{self, StockChange, StockRequest};
use order_core::usecases::UseCaseError;
use serde_json::{json, Value};
use std::time::Duration;

/// The instant the tests' clocks start at.
pub const T0: i64 = 1_800_000_000_000;

/// A SKU by name.
pub fn sku(name: &str) -> Sku {
    Sku::parse(name).unwrap()
}

/// The body of a one-line EUR order of buyer `user` for `qty` of `sku`,
/// showing `unit_price` (in cents).
pub fn one_line(user: &str, sku: &str, qty: u32, unit_price: i64) -> Value {
    json!({"user_id": user, "currency": "EUR", "items": [{"sku": sku, "qty": qty, "unit_price": unit_price}]})
}

/// A fresh idempotency key (`k<random>`).
pub fn fresh_key() -> String {
    format!("k{}", rand::random::<u64>())
}

/// The create-order use case as the tests run it: random ids, no
/// open-order cap, `window` and expiry rule version `rule`.
pub fn creator<S: Clone>(
    store: &S,
    clock: &(impl Clock + Clone + 'static),
    window: Duration,
    rule: &str,
) -> CreateOrder<S> {
    CreateOrder {
        store: store.clone(),
        clock: Box::new(clock.clone()),
        ids: Box::new(RandomIds),
        window,
        expiry_rule_version: rule.into(),
        open_order_cap: None,
    }
}

/// `body` created under `key` as the buyer it names; the order as created.
pub async fn create(uc: &CreateOrder<DynamoStore>, key: &str, body: &Value) -> Order {
    uc.execute_as_named(Some(key), body.to_string().as_bytes()).await.unwrap().order
}

/// The close use case as the tests run it: a 30 s lease, 10 s of
/// not-found grace, the default budget (a test changes one with
/// `CloseOrder { lease: …, ..closer(…) }`).
pub fn closer<C, Q>(
    store: &DynamoStore,
    channel: C,
    reminders: Q,
    clock: &(impl Clock + Clone + 'static),
) -> CloseOrder<DynamoStore, C, Q> {
    CloseOrder {
        store: store.clone(),
        channel,
        reminders,
        clock: Box::new(clock.clone()),
        lease: Duration::from_secs(30),
        not_found_grace: Duration::from_secs(10),
        budget: DEFAULT_CLOSE_BUDGET,
    }
}

/// The payment-entry use case on `channel` for `merchant_id`, with
/// `not_found_grace` and no deadline (a test sets one with
/// `StartPayment { until: …, ..payment_entry(…) }`).
pub fn payment_entry<'a, C>(
    store: &'a DynamoStore,
    channel: &'a C,
    clock: &'a FixedClock,
    merchant_id: &'a str,
    not_found_grace: Duration,
) -> StartPayment<'a, DynamoStore, C> {
    StartPayment { store, channel: Some(channel), clock, ids: &RandomIds, merchant_id, not_found_grace, until: None }
}

/// A fresh SKU (`prefix` and a random number) with 5 units at `price` EUR
/// cents, and buyer u1's order of one unit of it at that price, created
/// under `key` with `window` at `clock`'s time.
pub async fn one_unit_order(
    store: &DynamoStore,
    clock: &FixedClock,
    prefix: &str,
    price: i64,
    window: Duration,
    key: &str,
) -> Order {
    let sku = Sku::parse(format!("{prefix}{}", rand::random::<u32>())).unwrap();
    seed_stock(store, &sku, 5, &eur(price)).await.unwrap();
    create(&creator(store, clock, window, "t"), key, &one_line("u1", sku.as_str(), 1, price)).await
}

/// An SQS batch of one message per order (`{"order_id", "trigger"}`, the
/// message id `m-<order id>`), as the close and effects queues deliver.
pub fn sqs_batch(orders: &[&Order], trigger: &str) -> aws_lambda_events::event::sqs::SqsEvent {
    use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
    let mut event = SqsEvent::default();
    event.records = orders
        .iter()
        .map(|o| {
            let mut m = SqsMessage::default();
            m.message_id = Some(format!("m-{}", o.order_id));
            m.body = Some(json!({"order_id": o.order_id, "trigger": trigger}).to_string());
            m
        })
        .collect();
    event
}

/// A PROCESSING attempt ([`processing_attempt`]) made at `at`, recorded on
/// `order` as given; fails the test unless it is recorded.
pub async fn record_attempt(store: &DynamoStore, order: &Order, at: Timestamp) -> PaymentAttempt {
    let a = processing_attempt(order, at);
    assert_eq!(store.record_attempt(order, &a).await.unwrap(), AttemptResult::Recorded);
    a
}

/// The order as the store holds it now.
pub async fn reread(store: &DynamoStore, id: &OrderId) -> Order {
    store.order(id).await.unwrap().unwrap()
}

/// A SKU's available units now.
pub async fn available(store: &DynamoStore, name: &str) -> i64 {
    store.stock(&sku(name)).await.unwrap().unwrap().available
}

/// Closes `order` (as the store holds it) at its `expire_at` the way a
/// closer that found it never charged does: CLOSING under a lease, then
/// CLOSED, each write applied; the order as closed.
pub async fn close_at_expiry(store: &DynamoStore, order: &Order) -> Order {
    let lease =
        ClosingLease { started_at: order.expire_at, owner: "w".into(), lease_until: order.expire_at, resumes: 0 };
    assert_eq!(store.begin_closing(order, &lease, order.expire_at).await.unwrap(), Cas::Applied);
    let closing = reread(store, &order.order_id).await;
    assert_eq!(store.close_after_check(&closing, order.expire_at, "t").await.unwrap(), Cas::Applied);
    reread(store, &order.order_id).await
}

/// The raw item at `pk`/`sk`, read consistently (`None`: there is none).
pub async fn raw_item(
    store: &DynamoStore,
    pk: String,
    sk: &str,
) -> Option<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    use aws_sdk_dynamodb::types::AttributeValue as Av;
    store
        .client()
        .get_item()
        .table_name(store.table())
        .key("pk", Av::S(pk))
        .key("sk", Av::S(sk.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
}

/// Buyer u1's one-unit order of `A` (seeded here: 10 units at 100 EUR
/// cents) under key `k1`, with a 60 s window, created at `clock`'s time.
pub async fn open_order(store: &DynamoStore, clock: &FixedClock) -> Order {
    stock(store, &["A"], 10, 100).await;
    let uc = creator(store, clock, Duration::from_secs(60), "t");
    create(&uc, "k1", &one_line("u1", "A", 1, 100)).await
}

/// Two payments of an open order, both succeeding at `clock`'s time (the
/// second after the order is PAID, as a late or duplicate payment would):
/// the attempts and what each settle answered (PAID, then a
/// REFUND_PENDING refund of the second).
pub async fn paid_twice(
    store: &DynamoStore,
    clock: &FixedClock,
    order: &Order,
) -> (Vec<PaymentAttempt>, SettleResult, SettleResult) {
    let mut attempts = Vec::new();
    for _ in 0..2 {
        let order = reread(store, &order.order_id).await;
        attempts.push(record_attempt(store, &order, clock.now()).await);
    }
    let ev = Evidence { at: clock.now(), source: "test".into(), status: PaymentStatus::Succeeded, detail: None };
    let open = reread(store, &order.order_id).await;
    let first = store.settle_success(&open, &attempts[0], "tx-a", ev.clone(), None, "").await.unwrap();
    let paid = reread(store, &order.order_id).await;
    let second = store.settle_success(&paid, &attempts[1], "tx-b", ev, None, "n").await.unwrap();
    (attempts, first, second)
}

/// A fresh table on DynamoDB Local with each of `skus` seeded with
/// `available` units at `price` EUR cents.
pub async fn stocked_table(skus: &[&str], available: i64, price: i64) -> DynamoStore {
    let store = fresh_table(&dynamodb_local().await).await;
    stock(&store, skus, available, price).await;
    store
}

/// Seeds each of `skus` with `available` units at `price` EUR cents.
pub async fn stock(store: &DynamoStore, skus: &[&str], available: i64, price: i64) {
    for name in skus {
        seed_stock(store, &sku(name), available, &eur(price)).await.unwrap();
    }
}

/// A use-case test's world: a fresh table with stock at 100 EUR cents a
/// unit, a clock at [`T0`] the test moves, a channel (by default the
/// [`ScriptedChannel`]), the reminders the close use case puts back, and
/// the order [`World::order`] creates (by default buyer u1's one unit of
/// `A` at 100 with a 60 s window; [`World::ordering`] sets another).
pub struct World<C = ScriptedChannel> {
    pub store: DynamoStore,
    pub clock: FixedClock,
    pub channel: C,
    pub reminders: RecordedReminders,
    pub order_window: Duration,
    pub order_body: Value,
}

/// Declares `struct $name(fixtures::World<$channel>)`, dereferencing to
/// the world, for a test file that adds helpers of its own to it.
#[macro_export]
macro_rules! world_of {
    ($name:ident) => {
        $crate::world_of!($name, $crate::fakes::ScriptedChannel);
    };
    ($name:ident, $channel:ty) => {
        struct $name($crate::fixtures::World<$channel>);
        impl std::ops::Deref for $name {
            type Target = $crate::fixtures::World<$channel>;
            fn deref(&self) -> &Self::Target {
                &self.0
            }
        }
    };
}

impl World<ScriptedChannel> {
    /// `skus` with `available` units each, the scripted channel.
    pub async fn new(skus: &[&str], available: i64) -> Self {
        Self::with_channel(ScriptedChannel::default(), skus, available).await
    }
}

impl<C: Clone> World<C> {
    /// `skus` with `available` units each, `channel` as the channel.
    pub async fn with_channel(channel: C, skus: &[&str], available: i64) -> Self {
        Self::on_store(fresh_table(&dynamodb_local().await).await, channel, skus, available).await
    }

    /// The same on a table the test made (e.g. behind an interceptor).
    pub async fn on_store(store: DynamoStore, channel: C, skus: &[&str], available: i64) -> Self {
        stock(&store, skus, available, 100).await;
        Self {
            store,
            clock: FixedClock::at(T0),
            channel,
            reminders: RecordedReminders::default(),
            order_window: Duration::from_secs(60),
            order_body: one_line("u1", "A", 1, 100),
        }
    }

    /// [`World::order`] creates `body` with `window`.
    pub fn ordering(self, window: Duration, body: Value) -> Self {
        Self { order_window: window, order_body: body, ..self }
    }

    /// The world's order ([`World::ordering`]) created now.
    pub async fn order(&self) -> Order {
        self.create(self.order_window, &self.order_body).await
    }

    /// The world's order with coupon `coupon` applied, when there is one.
    pub async fn order_with_coupon(&self, coupon: Option<&str>) -> Order {
        let mut body = self.order_body.clone();
        if let Some(c) = coupon {
            body["coupon_id"] = json!(c);
        }
        self.create(self.order_window, &body).await
    }

    /// The create-order use case on this world ([`creator`]).
    pub fn creator(&self, window: Duration, rule: &str) -> CreateOrder<DynamoStore> {
        creator(&self.store, &self.clock, window, rule)
    }

    /// `body` created now under a fresh key with `window` (rule version
    /// `t`); the order as created.
    pub async fn create(&self, window: Duration, body: &Value) -> Order {
        create(&self.creator(window, "t"), &fresh_key(), body).await
    }

    /// The close use case on this world's channel and reminders ([`closer`]).
    pub fn closer(&self) -> CloseOrder<DynamoStore, C, RecordedReminders> {
        closer(&self.store, self.channel.clone(), self.reminders.clone(), &self.clock)
    }

    /// A PROCESSING attempt made now, recorded on `order` as given.
    pub async fn attempt(&self, order: &Order) -> PaymentAttempt {
        record_attempt(&self.store, order, self.clock.now()).await
    }

    /// A PROCESSING attempt made now, recorded on `order` as given, and
    /// the order as the store holds it after.
    pub async fn with_attempt(&self, order: &Order) -> (Order, PaymentAttempt) {
        let a = self.attempt(order).await;
        (self.now_order(order).await, a)
    }

    /// The order as the store holds it now.
    pub async fn now_order(&self, o: &Order) -> Order {
        reread(&self.store, &o.order_id).await
    }

    /// The order's status now.
    pub async fn status(&self, o: &Order) -> OrderStatus {
        self.now_order(o).await.status
    }

    /// A SKU's available units now.
    pub async fn available(&self, sku: &str) -> i64 {
        available(&self.store, sku).await
    }
}

/// Seeds a SKU as an operator does (the audited use case), so that
/// reconciliation finds its record.
pub async fn seed_stock(store: &DynamoStore, sku: &Sku, available: i64, price: &Price) -> Result<Stock, UseCaseError> {
    let req =
        StockRequest { change: StockChange::Seed { available, price: price.clone() }, key: None, by: "tests".into() };
    Ok(queries::put_stock(store, &SystemClock, &RandomIds, sku, req).await?.stock)
}

/// An AVAILABLE, returnable coupon of `user` valid until `valid_until`.
pub fn available_coupon(id: &str, user: &str, valid_until: Timestamp) -> Coupon {
    Coupon {
        coupon_id: CouponId::parse(id).unwrap(),
        user_id: UserId::parse(user).unwrap(),
        valid_until,
        state: CouponState::Available,
        locked_by: None,
        reason: None,
        returnable: true,
    }
}

/// A fresh PROCESSING attempt at the sandbox for the whole of `order`,
/// made at `at`, with a unique payment id.
pub fn processing_attempt(order: &Order, at: Timestamp) -> PaymentAttempt {
    PaymentAttempt {
        payment_id: PaymentId::parse(format!("pay_{}", rand::random::<u32>())).unwrap(),
        order_id: order.order_id.clone(),
        channel: ChannelName::parse("sandbox").unwrap(),
        amount: order.amount_total,
        currency: order.currency.clone(),
        status: PaymentStatus::Processing,
        channel_txn_id: None,
        channel_ref: None,
        created_at: at,
        evidence: vec![],
    }
}

/// A PENDING_PAYMENT order as the create use case builds it before its
/// transaction: version 1, created at `at`, expiring `window` later, rule
/// version `v`, its total the sum of its lines, nothing else on it yet.
pub fn pending_order(
    order_id: OrderId,
    user_id: UserId,
    currency: Currency,
    items: Vec<OrderLine>,
    coupon_id: Option<CouponId>,
    at: Timestamp,
    window: Duration,
) -> Order {
    Order {
        order_id,
        user_id,
        status: OrderStatus::PendingPayment,
        version: 1,
        currency,
        amount_total: items.iter().map(|l| i64::from(l.qty) * l.unit_price).sum(),
        items,
        coupon_id,
        created_at: at,
        expire_at: at.plus(window),
        expiry_rule_version: "v".into(),
        cancel_requested_at: None,
        expiring_soon_at: None,
        points: 0,
        payment_attempts: 0,
        closing: None,
        paid_by: None,
        history: vec![],
        checks: vec![],
    }
}

/// A catalog price in EUR.
pub fn eur(amount: i64) -> Price {
    Price::new(amount, Currency::parse("EUR").unwrap()).unwrap()
}

/// What [`ChangedAfterRead`] does after reading the catalog.
pub type AfterRead = std::sync::Arc<dyn Fn(DynamoStore) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// A store whose catalog changes right after a use case read it (an
/// operator's write landing between the create use case's read and its
/// transaction): `stocks` reads, runs `after_read` on the table, and
/// answers what it read; every other call goes to `inner` as it is.
#[derive(Clone)]
pub struct ChangedAfterRead {
    pub inner: DynamoStore,
    pub after_read: AfterRead,
}

impl ChangedAfterRead {
    pub fn new(
        inner: DynamoStore,
        after_read: impl Fn(DynamoStore) -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Self {
        Self { inner, after_read: std::sync::Arc::new(after_read) }
    }
}

#[async_trait::async_trait]
impl OrderStore for ChangedAfterRead {
    async fn create_order(
        &self,
        order: &Order,
        caps: &Caps,
        claim: &IdempotencyClaim,
    ) -> Result<CreateResult, Unavailable> {
        self.inner.create_order(order, caps, claim).await
    }
    async fn claimed_order(&self, u: &UserId, k: &IdempotencyKey) -> Result<Option<ClaimedOrder>, Unavailable> {
        self.inner.claimed_order(u, k).await
    }
    async fn order(&self, id: &OrderId) -> Result<Option<Order>, Unavailable> {
        self.inner.order(id).await
    }
    async fn order_record(&self, id: &OrderId) -> Result<Option<OrderRecord>, Unavailable> {
        self.inner.order_record(id).await
    }
    async fn close_unpaid(&self, o: &Order, now: Timestamp) -> Result<Cas, Unavailable> {
        self.inner.close_unpaid(o, now).await
    }
    async fn begin_closing(&self, o: &Order, l: &ClosingLease, now: Timestamp) -> Result<Cas, Unavailable> {
        self.inner.begin_closing(o, l, now).await
    }
    async fn hold_closing(&self, o: &Order, until: Timestamp) -> Result<Cas, Unavailable> {
        self.inner.hold_closing(o, until).await
    }
    async fn request_cancel(&self, o: &Order, now: Timestamp) -> Result<Cas, Unavailable> {
        self.inner.request_cancel(o, now).await
    }
    async fn note_lazy_reminder(&self, o: &Order, now: Timestamp, every: Duration) -> Result<Cas, Unavailable> {
        self.inner.note_lazy_reminder(o, now, every).await
    }
    async fn note_early_reminder(&self, o: &Order, until: Timestamp, now: Timestamp) -> Result<Cas, Unavailable> {
        self.inner.note_early_reminder(o, until, now).await
    }
    async fn record_check(&self, id: &OrderId, c: &OperatorCheck) -> Result<Cas, Unavailable> {
        self.inner.record_check(id, c).await
    }
    async fn effects_done(&self, id: &OrderId, s: OrderStatus) -> Result<Cas, Unavailable> {
        self.inner.effects_done(id, s).await
    }
    async fn close_after_check(&self, o: &Order, now: Timestamp, cause: &str) -> Result<Cas, Unavailable> {
        self.inner.close_after_check(o, now, cause).await
    }
    async fn release_reservation(
        &self,
        id: &OrderId,
        r: &Reservation,
        now: Timestamp,
    ) -> Result<Moved<ReservationStatus>, Unavailable> {
        self.inner.release_reservation(id, r, now).await
    }
    async fn confirm_reservation(
        &self,
        id: &OrderId,
        r: &Reservation,
        now: Timestamp,
    ) -> Result<Moved<ReservationStatus>, Unavailable> {
        self.inner.confirm_reservation(id, r, now).await
    }
    async fn end_coupon_lock(
        &self,
        id: &OrderId,
        c: &CouponId,
        to: CouponLockStatus,
        reason: &str,
        now: Timestamp,
    ) -> Result<Moved<CouponLockStatus>, Unavailable> {
        self.inner.end_coupon_lock(id, c, to, reason, now).await
    }
    async fn stock(&self, s: &Sku) -> Result<Option<Stock>, Unavailable> {
        self.inner.stock(s).await
    }
    async fn stocks(&self, skus: &[Sku]) -> Result<Vec<Stock>, Unavailable> {
        let read = self.inner.stocks(skus).await?;
        (self.after_read)(self.inner.clone()).await;
        Ok(read)
    }
    async fn put_coupon(&self, c: &Coupon) -> Result<PutCoupon, Unavailable> {
        self.inner.put_coupon(c).await
    }
    async fn coupon(&self, id: &CouponId) -> Result<Option<Coupon>, Unavailable> {
        self.inner.coupon(id).await
    }
}
