//! A close batch inside one invocation's time: ten messages share it, a
//! channel in a brownout is cut off at each message's share (the order is
//! held, asked again later), the unpaid orders of the same batch still close
//! in that round, and messages with no time left are handed back unstarted
//! instead of dying with the invocation. DynamoDB Local, the channel faked.

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::*;
use order_core::handlers::batch::each_sqs_message_within;
use order_core::handlers::close::close_message_until;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::close_order::{CloseOrder, DEFAULT_CLOSE_BUDGET};
use order_core::usecases::create_order::CreateOrder;
use serde_json::json;
use std::time::{Duration, Instant};
use system_tests::fakes::{FixedClock, RecordedReminders};
use system_tests::fixtures::{eur, processing_attempt};
use system_tests::CreateAsNamed;
use system_tests::{dynamodb_local, fresh_table};

const T0: i64 = 1_800_000_000_000;

/// A channel in a brownout: every question takes a minute.
#[derive(Clone)]
struct Brownout;
#[async_trait::async_trait]
impl PaymentChannel for Brownout {
    async fn open(&self, _: &PaymentAttempt, _: &str) -> Result<OpenedPayment, Unavailable> {
        Ok(OpenedPayment::default())
    }
    async fn query(&self, _: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(ChannelPayment::Pending)
    }
    async fn cancel(&self, _: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(ChannelPayment::Failed)
    }
    async fn refund(&self, _: &PaymentAttempt, _: i64, _: &str) -> Result<RefundResult, Unavailable> {
        Ok(RefundResult::Failed("not here".into()))
    }
}

struct World {
    store: DynamoStore,
    clock: FixedClock,
    reminders: RecordedReminders,
}

impl World {
    async fn new() -> Self {
        let store = fresh_table(&dynamodb_local().await).await;
        system_tests::fixtures::seed_stock(&store, &Sku::parse("A").unwrap(), 100, &eur(100)).await.unwrap();
        Self { store, clock: FixedClock::at(T0), reminders: RecordedReminders::default() }
    }

    async fn order(&self, with_attempt: bool) -> Order {
        let create = CreateOrder {
            store: self.store.clone(),
            clock: Box::new(self.clock.clone()),
            ids: Box::new(RandomIds),
            window: Duration::from_secs(60),
            expiry_rule_version: "t".into(),
            open_order_cap: None,
        };
        let body = json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "A", "qty": 1, "unit_price": 100}]});
        let key = format!("k{}", rand::random::<u64>());
        let order = create.execute_as_named(Some(&key), body.to_string().as_bytes()).await.unwrap().order;
        if with_attempt {
            let a = processing_attempt(&order, self.clock.now());
            assert_eq!(self.store.record_attempt(&order, &a).await.unwrap(), AttemptResult::Recorded);
        }
        order
    }

    fn closer(&self) -> CloseOrder<DynamoStore, Brownout, RecordedReminders> {
        CloseOrder {
            store: self.store.clone(),
            channel: Brownout,
            reminders: self.reminders.clone(),
            clock: Box::new(self.clock.clone()),
            lease: Duration::from_secs(60),
            not_found_grace: Duration::from_secs(10),
            budget: DEFAULT_CLOSE_BUDGET,
        }
    }

    async fn status(&self, o: &Order) -> OrderStatus {
        self.store.order(&o.order_id).await.unwrap().unwrap().status
    }
}

fn batch(orders: &[&Order]) -> SqsEvent {
    let mut event = SqsEvent::default();
    event.records = orders
        .iter()
        .map(|o| {
            let mut m = SqsMessage::default();
            m.message_id = Some(format!("m-{}", o.order_id));
            m.body = Some(json!({"order_id": o.order_id, "trigger": "schedule"}).to_string());
            m
        })
        .collect();
    event
}

#[tokio::test]
async fn three_slow_channel_orders_are_held_and_the_unpaid_ones_close_in_the_same_round() {
    let w = World::new().await;
    let mut slow = Vec::new();
    for _ in 0..3 {
        slow.push(w.order(true).await);
    }
    let mut unpaid = Vec::new();
    for _ in 0..7 {
        unpaid.push(w.order(false).await);
    }
    w.clock.set(T0 + 61_000);
    let closer = w.closer();
    // The slow ones first: the worst order for a batch that runs one
    // message after another.
    let all: Vec<&Order> = slow.iter().chain(&unpaid).collect();
    let started = Instant::now();
    let response = each_sqs_message_within(batch(&all), started + Duration::from_secs(12), |m, until| {
        let closer = &closer;
        async move { close_message_until(closer, "invocation-1", m.body.as_deref().unwrap_or(""), Some(until)).await }
    })
    .await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(12), "the batch ended inside its invocation: {took:?}");
    assert!(response.batch_item_failures.is_empty(), "every message was handled: {:?}", response.batch_item_failures);
    for o in &unpaid {
        assert_eq!(w.status(o).await, OrderStatus::Closed, "an unpaid order of the same batch closes this round");
    }
    for o in &slow {
        assert_eq!(w.status(o).await, OrderStatus::Closing, "held: its payment is unknown, nothing released");
    }
    let reminded = w.reminders.0.lock().unwrap().len();
    assert_eq!(reminded, 3, "each held order is asked again later");
}

#[tokio::test]
async fn messages_with_no_time_left_are_handed_back_unstarted() {
    let w = World::new().await;
    let mut orders = Vec::new();
    for _ in 0..3 {
        orders.push(w.order(false).await);
    }
    w.clock.set(T0 + 61_000);
    let closer = w.closer();
    let all: Vec<&Order> = orders.iter().collect();
    // Less than a message's least share left.
    let response = each_sqs_message_within(batch(&all), Instant::now() + Duration::from_millis(800), |m, until| {
        let closer = &closer;
        async move { close_message_until(closer, "invocation-2", m.body.as_deref().unwrap_or(""), Some(until)).await }
    })
    .await;
    let failed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    assert_eq!(failed.len(), 3, "handed back to the queue: {failed:?}");
    for o in &orders {
        assert_eq!(w.status(o).await, OrderStatus::PendingPayment, "not started, nothing written");
    }
}
