//! A close batch inside one invocation's time: ten messages share it, a
//! channel in a brownout is cut off at each message's share (the order is
//! held, asked again later), the unpaid orders of the same batch still close
//! in that round, and messages with no time left are handed back unstarted
//! instead of dying with the invocation. DynamoDB Local, the channel faked.

use order_core::aws::dynamo::DynamoStore;
use order_core::domain::*;
use order_core::handlers::batch::each_sqs_message_within;
use order_core::handlers::close::close_message_until;
use order_core::ports::*;
use order_core::usecases::close_order::CloseOrder;
use std::time::{Duration, Instant};
use system_tests::fakes::{FixedChannel, RecordedReminders};
use system_tests::fixtures::{self, one_line, sqs_batch, T0};

/// A channel in a brownout: every question takes a minute ("pending",
/// "failed" to a close).
fn brownout() -> FixedChannel {
    FixedChannel::answering(ChannelPayment::Pending, ChannelPayment::Failed)
        .refusing_refunds("not here")
        .taking(Duration::from_secs(60))
}

system_tests::world_of!(World, FixedChannel);

impl World {
    async fn new() -> Self {
        Self(fixtures::World::with_channel(brownout(), &["A"], 100).await)
    }

    async fn order(&self, with_attempt: bool) -> Order {
        let order = self.create(Duration::from_secs(60), &one_line("u1", "A", 1, 100)).await;
        if with_attempt {
            self.attempt(&order).await;
        }
        order
    }

    fn closer(&self) -> CloseOrder<DynamoStore, FixedChannel, RecordedReminders> {
        CloseOrder { lease: Duration::from_secs(60), ..self.0.closer() }
    }
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
    let response = each_sqs_message_within(sqs_batch(&all, "schedule"), started + Duration::from_secs(12), |m, until| {
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
    let response =
        each_sqs_message_within(
            sqs_batch(&all, "schedule"),
            Instant::now() + Duration::from_millis(800),
            |m, until| {
                let closer = &closer;
                async move {
                    close_message_until(closer, "invocation-2", m.body.as_deref().unwrap_or(""), Some(until)).await
                }
            },
        )
        .await;
    let failed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    assert_eq!(failed.len(), 3, "handed back to the queue: {failed:?}");
    for o in &orders {
        assert_eq!(w.status(o).await, OrderStatus::PendingPayment, "not started, nothing written");
    }
}
