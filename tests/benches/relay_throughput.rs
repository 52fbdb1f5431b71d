//! BENCHMARKS.md "The relay's records per second per shard": how many
//! stream records the relay gets through on one shard when each `PutEvents`
//! call takes a realistic round trip, batched (this code) against one call
//! per record (the relay before it).
//!
//! In-process: the production `relay_batch` with a publisher that takes
//! every entry after sleeping `LATENCY_MS` per call (default 20 ms, about an
//! in-region `PutEvents`; `-- N MS` sets the records and the latency). The
//! records alternate an order's INSERT (OrderPlaced) and its close (MODIFY
//! into CLOSED, OrderClosed), the two records every order yields, from the
//! `events/relay-order-*.json` fixtures, one order id each. One shard with
//! `ParallelizationFactor` 1 hands the function one batch after another, so
//! the batches run one after another here too, `BATCH_SIZE` records each
//! (the mapping's `BatchSize`). "One call per record" feeds each record to
//! `relay_batch` alone: one call per record, one after another, as the
//! relay made them before it packed a batch's events (on the code before
//! the change, both lines print that figure).
//!
//! Not in the figure: Lambda's own time per invocation and the mapping's
//! polling (the AWS figure in BENCHMARKS.md#the-relay-on-paper-for-aws adds
//! them on paper).
//!
//! `cargo bench -p system_tests --profile dev --bench relay_throughput 2>/dev/null | grep -v '^{"'`

use async_trait::async_trait;
use aws_lambda_events::event::dynamodb::Event as StreamEvent;
use order_core::domain::events::IntegrationEvent;
use order_core::faults::Faults;
use order_core::handlers::relay::{relay_batch, RetryPolicy};
use order_core::ports::{DeadLetters, EventPublisher, PublishFailure, Unavailable};
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The relay mapping's `BatchSize` in template.yaml.
const BATCH_SIZE: usize = 50;

/// A bus that answers after `latency`, taking every entry; counts calls
/// and entries.
struct SlowBus {
    latency: Duration,
    calls: AtomicUsize,
    entries: AtomicUsize,
}

#[async_trait]
impl EventPublisher for SlowBus {
    async fn publish(&self, events: &[IntegrationEvent]) -> Result<Vec<PublishFailure>, Unavailable> {
        tokio::time::sleep(self.latency).await;
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.entries.fetch_add(events.len(), Ordering::Relaxed);
        Ok(vec![])
    }
}

/// Every record here decodes: nothing may be set aside.
struct NothingSetAside;
#[async_trait]
impl DeadLetters for NothingSetAside {
    async fn set_aside(&self, body: String) -> Result<(), Unavailable> {
        panic!("a benchmark record was set aside: {body}")
    }
}

/// `n` stream records: order `i`'s INSERT, then its close, and so on.
fn records(n: usize) -> Vec<Value> {
    let fixture = |text: &str| -> Value {
        let mut e: Value = serde_json::from_str(text).unwrap();
        e["Records"][0].take()
    };
    let inserted = serde_json::to_string(&fixture(include_str!("../../events/relay-order-inserted.json"))).unwrap();
    let closed = serde_json::to_string(&fixture(include_str!("../../events/relay-order-closed.json"))).unwrap();
    (0..n)
        .map(|i| {
            let template = if i % 2 == 0 { &inserted } else { &closed };
            let mut r: Value =
                serde_json::from_str(&template.replace("ord_example", &format!("ord_b{:06}", i / 2))).unwrap();
            r["dynamodb"]["SequenceNumber"] = Value::String(format!("{:021}", i + 1));
            r
        })
        .collect()
}

fn stream_event(records: &[Value]) -> StreamEvent {
    serde_json::from_value(serde_json::json!({ "Records": records })).unwrap()
}

/// Runs `records` through the relay in batches of `batch`, one after
/// another; answers the time taken and the calls and entries the bus saw.
async fn run(records: &[Value], batch: usize, latency: Duration) -> (Duration, usize, usize) {
    let bus = SlowBus { latency, calls: AtomicUsize::new(0), entries: AtomicUsize::new(0) };
    let policy = RetryPolicy::default();
    let started = Instant::now();
    for chunk in records.chunks(batch) {
        let resp = relay_batch(stream_event(chunk), &bus, &NothingSetAside, Faults::default(), policy).await;
        assert!(resp.batch_item_failures.is_empty(), "every record acknowledged");
    }
    (started.elapsed(), bus.calls.into_inner(), bus.entries.into_inner())
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1).filter_map(|a| a.parse::<u64>().ok());
    let n = args.next().unwrap_or(2000) as usize;
    let latency = Duration::from_millis(args.next().unwrap_or(20));
    let records = records(n);
    println!(
        "relay, one shard, {n} records (OrderPlaced and OrderClosed alternating), PutEvents taking {} ms a call, \
         batches of {BATCH_SIZE}",
        latency.as_millis()
    );
    println!(
        "{:<22} {:>8} {:>8} {:>10} {:>11} {:>14}",
        "path", "calls", "entries", "seconds", "records/s", "ms per batch"
    );
    for (path, batch) in [("one call per record", 1), ("batched", BATCH_SIZE)] {
        let (took, calls, entries) = run(&records, batch, latency).await;
        assert_eq!(entries, n, "one event per record, each published once");
        let per_batch = took.as_secs_f64() * 1000.0 / n.div_ceil(BATCH_SIZE) as f64;
        println!(
            "{path:<22} {calls:>8} {entries:>8} {:>10.2} {:>11.0} {per_batch:>14.1}",
            took.as_secs_f64(),
            n as f64 / took.as_secs_f64()
        );
    }
}
