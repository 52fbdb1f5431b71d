//! The EMF lines the use cases emit (docs/design.md#observability), read back
//! as CloudWatch would: each parses as JSON, names its metric in namespace
//! `OrderExpiry` with the catalog's unit, and carries the `Stack` dimension
//! (plus the metric's own low-cardinality one), never an order id. The use
//! cases run on DynamoDB Local with the clock and channel faked.

use order_core::domain::*;
use order_core::metrics::{self, capture, points, Metric};
use order_core::ports::*;
use order_core::usecases::close_order::CloseOutcome;
use serde_json::{json, Value};
use std::time::Duration;
use system_tests::fixtures::{self, one_line, T0};

const WINDOW_MS: i64 = 60_000;

type World = fixtures::World;

async fn world() -> World {
    World::new(&["A"], 10).await.ordering(Duration::from_millis(WINDOW_MS as u64), one_line("u1", "A", 1, 100))
}

/// The one point of `metric` among `lines`, checked against the catalog:
/// namespace, name, unit, the dimension sets and the Stack value. Returns
/// the document for its value and dimension values.
fn the_point(lines: &[String], metric: &Metric) -> Value {
    let found: Vec<Value> = points(lines, metric.name).collect();
    assert_eq!(found.len(), 1, "one {} point expected in {lines:#?}", metric.name);
    let doc = found.into_iter().next().unwrap();
    let cw = &doc["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(cw["Namespace"], "OrderExpiry");
    assert_eq!(cw["Metrics"], json!([{"Name": metric.name, "Unit": metric.unit.as_str()}]));
    let mut sets = vec![json!(["Stack"])];
    if !metric.dimensions.is_empty() {
        let mut full = vec!["Stack"];
        full.extend_from_slice(metric.dimensions);
        sets.push(json!(full));
    }
    assert_eq!(cw["Dimensions"], Value::Array(sets), "{}", metric.name);
    let stack = std::env::var("STACK_NAME").unwrap_or_else(|_| "local".into());
    assert_eq!(doc["Stack"], stack.as_str());
    assert!(doc["_aws"]["Timestamp"].as_u64().is_some_and(|t| t > 0));
    assert!(doc[metric.name].is_number(), "{doc}");
    assert!(doc.get("order_id").is_none(), "never an order id in a metric document");
    doc
}

fn none_of(lines: &[String], metric: &Metric) {
    assert_eq!(points(lines, metric.name).count(), 0, "no {} expected in {lines:#?}", metric.name);
}

#[tokio::test]
async fn creating_and_closing_an_order_emit_order_created_order_closed_and_the_expiry_to_close_delay() {
    let w = world().await;
    let (o, lines) = capture(w.order()).await;
    assert_eq!(the_point(&lines, &metrics::ORDER_CREATED)["OrderCreated"], 1.0);

    w.clock.set(T0 + WINDOW_MS + 2_500);
    let (out, lines) = capture(w.closer().close(&o.order_id, "t")).await;
    assert_eq!(out.unwrap(), CloseOutcome::Closed);
    assert_eq!(the_point(&lines, &metrics::ORDER_CLOSED)["OrderClosed"], 1.0);
    assert_eq!(the_point(&lines, &metrics::EXPIRY_TO_CLOSE_DELAY)["ExpiryToCloseDelay"], 2_500.0);
    none_of(&lines, &metrics::LATE_WAKE_UP);

    let (out, lines) = capture(w.closer().close(&o.order_id, "t")).await;
    assert_eq!(out.unwrap(), CloseOutcome::AlreadyFinal(OrderStatus::Closed));
    assert_eq!(the_point(&lines, &metrics::REDUNDANT_WAKE_UP)["RedundantWakeUp"], 1.0);
    none_of(&lines, &metrics::ORDER_CLOSED);
}

#[tokio::test]
async fn an_early_wake_up_and_a_late_one_are_counted_as_such() {
    let w = world().await;
    let o = w.order().await;
    w.clock.set(T0 + WINDOW_MS - 1_000);
    let (_, lines) = capture(w.closer().close(&o.order_id, "t")).await;
    the_point(&lines, &metrics::EARLY_WAKE_UP);
    none_of(&lines, &metrics::ORDER_CLOSED);

    w.clock.set(T0 + WINDOW_MS + 61_000);
    let (out, lines) = capture(w.closer().close(&o.order_id, "t")).await;
    assert_eq!(out.unwrap(), CloseOutcome::Closed);
    the_point(&lines, &metrics::LATE_WAKE_UP);
    assert_eq!(the_point(&lines, &metrics::EXPIRY_TO_CLOSE_DELAY)["ExpiryToCloseDelay"], 61_000.0);
}

#[tokio::test]
async fn a_channel_that_does_not_answer_emits_an_unavailable_query_and_payment_state_unknown() {
    let w = world().await;
    let o = w.order().await;
    let a = w.attempt(&o).await;
    w.channel.answer(&a.payment_id, None); // times out
    w.clock.set(T0 + WINDOW_MS + 1);
    let (_, lines) = capture(w.closer().close(&o.order_id, "t")).await;
    let q = the_point(&lines, &metrics::CHANNEL_QUERY);
    assert_eq!(q["Outcome"], "unavailable");
    the_point(&lines, &metrics::PAYMENT_STATE_UNKNOWN);
    none_of(&lines, &metrics::ORDER_CLOSED);
}

#[tokio::test]
async fn a_success_found_while_closing_emits_order_paid_and_a_succeeded_query() {
    let w = world().await;
    let o = w.order().await;
    let a = w.attempt(&o).await;
    w.channel.answer(
        &a.payment_id,
        Some(ChannelPayment::Succeeded { channel_txn_id: "tx-m".into(), amount: a.amount, currency: "EUR".into() }),
    );
    w.clock.set(T0 + WINDOW_MS + 1);
    let (out, lines) = capture(w.closer().close(&o.order_id, "t")).await;
    assert_eq!(out.unwrap(), CloseOutcome::Paid);
    assert_eq!(the_point(&lines, &metrics::CHANNEL_QUERY)["Outcome"], "succeeded");
    the_point(&lines, &metrics::ORDER_PAID);
    the_point(&lines, &metrics::PAID_WHILE_CLOSING);
    none_of(&lines, &metrics::ORDER_CLOSED);
}
