//! BENCHMARKS.md "The effects backstop: 5,000 pending releases drained"
//! (issue 17): 5,000 CLOSED orders whose release is pending (their stream
//! records lost), the release failing for the first 20 s (the fault switch
//! `fault-release-until-`), then recovering; drained by the sweep handing
//! the effects to the effects queue and its consumers, on a fresh table of
//! DynamoDB Local, the production store and use cases on a client with the
//! functions' settings:
//!
//! - the sweep with its default bounds, a run every 60 s (the first 20 s
//!   before the release recovers);
//! - the queue and Lambda modelled in-process: 10 consumers (the mapping's
//!   `QueueMaxConcurrency`), each taking batches of up to 10 visible
//!   messages and running them through `pending_effects_batch` one after
//!   another, as drive-effects does; a failed message is visible again
//!   after the queue's 180 s visibility timeout. No network hop to SQS, no
//!   cold start, no Lambda polling delay.
//!
//! The `before` figure is the same bench on the code before issue 17
//! (commit 51f95c7, the parent of the change, where `AwsRedrive::effects` drives each
//! effect in the sweep's run): same planting, fault and schedule.
//!
//! Prints each sweep run and the time from the first run (and from the
//! recovery) to the last release.
//!
//! `DYNAMODB_LOCAL_ENDPOINT=http://127.0.0.1:8003 cargo bench -p system_tests --profile dev --bench effects_drain [-- N]`

use async_trait::async_trait;
use aws_lambda_events::event::sqs::SqsEvent;
use aws_sdk_dynamodb::types::{AttributeValue as Av, PutRequest, WriteRequest};
use order_core::aws::dynamo::{keys, DynamoStore};
use order_core::domain::*;
use order_core::handlers::effects::pending_effects_batch;
use order_core::ports::*;
use order_core::store::OrderStore;
use order_core::usecases::close_order::{CloseOrder, CloseOutcome, DEFAULT_CLOSE_BUDGET};
use order_core::usecases::create_order::CreateOrder;
use order_core::usecases::pending_effects::{drive_pending_effect, EffectDriven, EffectPorts};
use order_core::usecases::sweep::{sweep, SweepConfig};
use serde_json::json;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use system_tests::fakes::{FixedClock, RecordedReminders, RecordedWakeUps, ScriptedChannel};
use system_tests::fixtures::eur;
use system_tests::CreateAsNamed;

const SKUS: usize = 50;
const FAULT: Duration = Duration::from_secs(20);
const SWEEP_PERIOD: Duration = Duration::from_secs(60);
const CONSUMERS: usize = 10;
const BATCH: usize = 10;
const VISIBILITY: Duration = Duration::from_secs(180);

struct NoRefunds;
#[async_trait]
impl RefundRequests for NoRefunds {
    async fn request_refund(&self, _: &OrderId, _: &PaymentId) -> Result<(), Unavailable> {
        unreachable!("only order effects are planted")
    }
}

/// The ports of the effects use case and the count of effects that
/// released something (a duplicate releases nothing).
struct Drain<'a> {
    ports: EffectPorts<'a, DynamoStore, RecordedWakeUps, ScriptedChannel, NoRefunds>,
    released: AtomicUsize,
    driven: AtomicUsize,
    last_release: Mutex<Option<Instant>>,
}

impl Drain<'_> {
    async fn drive(&self, effect: &PendingEffect, until: Option<Instant>) -> Result<EffectDriven, Unavailable> {
        let out = drive_pending_effect(&self.ports, effect, until).await;
        self.driven.fetch_add(1, Ordering::Relaxed);
        if let Ok(EffectDriven::Resources(r)) = &out {
            if r.moved > 0 {
                self.released.fetch_add(1, Ordering::Relaxed);
                *self.last_release.lock().unwrap() = Some(Instant::now());
            }
        }
        out
    }
}

/// The effects queue, in memory: (visible from, body).
#[derive(Default)]
struct Queue(Mutex<VecDeque<(Instant, String)>>);
#[async_trait]
impl Redrive for Queue {
    async fn close(&self, _: &[OrderId]) -> Result<(), Unavailable> {
        unreachable!("no open order is planted")
    }
    async fn effects(&self, effects: &[PendingEffect]) -> Result<(), Unavailable> {
        let now = Instant::now();
        let mut q = self.0.lock().unwrap();
        for e in effects {
            let body = serde_json::to_string(&order_core::aws::queue::PendingEffectMessage::from(e)).unwrap();
            q.push_back((now, body));
        }
        Ok(())
    }
}

impl Queue {
    /// Up to `BATCH` visible messages, as one SQS event.
    fn receive(&self) -> Option<(SqsEvent, Vec<String>)> {
        let now = Instant::now();
        let mut q = self.0.lock().unwrap();
        let mut bodies = Vec::new();
        let mut i = 0;
        while i < q.len() && bodies.len() < BATCH {
            if q[i].0 <= now {
                bodies.push(q.remove(i).unwrap().1);
            } else {
                i += 1;
            }
        }
        if bodies.is_empty() {
            return None;
        }
        let records: Vec<_> = bodies
            .iter()
            .enumerate()
            .map(|(i, b)| json!({"messageId": i.to_string(), "body": b, "eventSource": "aws:sqs"}))
            .collect();
        Some((serde_json::from_value(json!({ "Records": records })).unwrap(), bodies))
    }
    fn put_back(&self, body: String) {
        self.0.lock().unwrap().push_back((Instant::now() + VISIBILITY, body));
    }
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

async fn production_client() -> aws_sdk_dynamodb::Client {
    let endpoint = std::env::var("DYNAMODB_LOCAL_ENDPOINT").expect("DYNAMODB_LOCAL_ENDPOINT");
    let loader = order_core::aws::with_client_defaults(aws_config::defaults(aws_config::BehaviorVersion::latest()))
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(aws_credential_types::Credentials::new("test", "test", None, None, "bench"));
    aws_sdk_dynamodb::Client::new(&loader.load().await)
}

fn sku(i: usize) -> Sku {
    Sku::parse(format!("S{:02}", i % SKUS)).unwrap()
}

/// One order of `user` closed unpaid, and `n - 1` copies of its partition
/// under new ids, each holding 1 unit of one of `SKUS` SKUs and due in its
/// effects shard: closed orders whose release never ran.
async fn plant(store: &DynamoStore, user: &str, n: usize) -> Vec<OrderId> {
    seed_skus(store, n).await;
    let template = closed_order(store, user).await;
    let items = store
        .client()
        .query()
        .table_name(store.table())
        .key_condition_expression("pk = :pk")
        .expression_attribute_values(":pk", Av::S(keys::order(&template)))
        .send()
        .await
        .unwrap()
        .items
        .unwrap_or_default();
    // Copies 1..n; the template (its release pending too) is the n-th.
    let ids: Vec<OrderId> = (1..n).map(|i| OrderId::parse(format!("ord_fx{i:05}")).unwrap()).collect();
    let due = SystemClock.now().minus(Duration::from_secs(600)).to_string();
    let mut writes = Vec::new();
    for (i, id) in (1..n).zip(&ids) {
        for item in &items {
            let mut copy = item.clone();
            copy.insert("pk".into(), Av::S(keys::order(id)));
            if copy.contains_key("order_id") {
                copy.insert("order_id".into(), Av::S(id.to_string()));
            }
            if copy.get("sk").and_then(|v| v.as_s().ok()).map(String::as_str) == Some(keys::ORDER_SK) {
                copy.insert("due_shard".into(), Av::S(keys::effects_shard(id, store.shards().count)));
                copy.insert("due_at".into(), Av::S(due.clone()));
            } else if copy.contains_key("sku") {
                copy.insert("sk".into(), Av::S(keys::stock_reservation_sk(&sku(i))));
                copy.insert("sku".into(), Av::S(sku(i).to_string()));
            }
            writes.push(
                WriteRequest::builder()
                    .put_request(PutRequest::builder().set_item(Some(copy)).build().unwrap())
                    .build(),
            );
        }
    }
    write_all(store, writes).await;
    [vec![template], ids].concat()
}

/// `SKUS` SKUs of 1,000 units, each with the units the copies will hold
/// counted as reserved (the template order reserves its unit of S00 itself).
async fn seed_skus(store: &DynamoStore, n: usize) {
    for i in 0..SKUS {
        system_tests::fixtures::seed_stock(store, &sku(i), 1_000, &eur(100)).await.unwrap();
        let held = (1..n).filter(|c| c % SKUS == i).count() as i64;
        store
            .client()
            .update_item()
            .table_name(store.table())
            .key("pk", Av::S(keys::sku(&sku(i))))
            .key("sk", Av::S(keys::STOCK_SK.into()))
            .update_expression("SET reserved = reserved + :n")
            .expression_attribute_values(":n", Av::N(held.to_string()))
            .send()
            .await
            .unwrap();
    }
}

/// An order of `user` for 1 unit of S00, created an hour ago and closed
/// unpaid by the close use case: CLOSED, its release pending.
async fn closed_order(store: &DynamoStore, user: &str) -> OrderId {
    let clock = FixedClock::at(SystemClock.now().unix_millis() - 3_600_000);
    let creator = CreateOrder {
        store: store.clone(),
        clock: Box::new(clock.clone()),
        ids: Box::new(RandomIds),
        window: Duration::from_secs(60),
        expiry_rule_version: "w60".into(),
        open_order_cap: None,
    };
    let body = json!({"user_id": user, "currency": "EUR", "items": [{"sku": sku(0).to_string(), "qty": 1, "unit_price": 100}]});
    let order = creator.execute_as_named(Some("k-template"), body.to_string().as_bytes()).await.unwrap().order;
    clock.set(clock.now().unix_millis() + 61_000);
    let closer = CloseOrder {
        store: store.clone(),
        channel: ScriptedChannel::default(),
        reminders: RecordedReminders::default(),
        clock: Box::new(clock.clone()),
        lease: Duration::from_secs(30),
        not_found_grace: Duration::from_secs(30),
        budget: DEFAULT_CLOSE_BUDGET,
    };
    assert_eq!(closer.close(&order.order_id, "bench").await.unwrap(), CloseOutcome::Closed);
    order.order_id
}

/// `BatchWriteItem`s of 25, 8 at a time, unprocessed items sent again.
async fn write_all(store: &DynamoStore, writes: Vec<WriteRequest>) {
    for group in writes.chunks(25 * 8) {
        let puts = group.chunks(25).map(|chunk| {
            let (client, table) = (store.client().clone(), store.table().to_owned());
            let chunk = chunk.to_vec();
            async move {
                let mut pending = HashMap::from([(table, chunk)]);
                while !pending.is_empty() {
                    let out = client.batch_write_item().set_request_items(Some(pending)).send().await.unwrap();
                    pending =
                        out.unprocessed_items.unwrap_or_default().into_iter().filter(|(_, v)| !v.is_empty()).collect();
                }
            }
        });
        futures_util::future::join_all(puts).await;
    }
}

/// Sweep runs every `SWEEP_PERIOD` until every planted effect released.
async fn sweeps<R: Redrive>(
    store: &DynamoStore,
    redrive: &R,
    cfg: &SweepConfig,
    drain: &Drain<'_>,
    n: usize,
    t0: Instant,
) {
    let mut run: u32 = 0;
    while drain.released.load(Ordering::Relaxed) < n {
        let next = t0 + SWEEP_PERIOD * run;
        tokio::time::sleep_until(next.into()).await;
        if drain.released.load(Ordering::Relaxed) >= n {
            break;
        }
        let started = Instant::now();
        let report = sweep(store, redrive, &SystemClock, cfg).await.expect("the sweep runs");
        println!(
            "  sweep run {run} at {:>6.1} s: {:>6.1} s, {} effects found, {} failed, {} shards unfinished, released so far {}",
            started.duration_since(t0).as_secs_f64(),
            started.elapsed().as_secs_f64(),
            report.effects_found,
            report.failures,
            report.unfinished.len(),
            drain.released.load(Ordering::Relaxed)
        );
        run += 1;
    }
}

/// `CONSUMERS` invocations at a time, each a batch of up to `BATCH`.
async fn consumers(queue: &Queue, drain: &Drain<'_>, n: usize, batches: &AtomicUsize) {
    let one = || async {
        while drain.released.load(Ordering::Relaxed) < n {
            let Some((event, bodies)) = queue.receive() else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            batches.fetch_add(1, Ordering::Relaxed);
            let deadline = Instant::now() + Duration::from_millis(28_500);
            let response =
                pending_effects_batch(event, deadline, |e, until| async move { drain.drive(&e, Some(until)).await })
                    .await;
            for failure in response.batch_item_failures {
                let i: usize = failure.item_identifier.parse().unwrap();
                queue.put_back(bodies[i].clone());
            }
        }
    };
    futures_util::future::join_all((0..CONSUMERS).map(|_| one())).await;
}

async fn scenario(way: &str, n: usize) {
    let planter = system_tests::fresh_table(&system_tests::dynamodb_local().await).await;
    let store = DynamoStore::new(production_client().await, planter.table());
    // The fault ends FAULT after the first sweep run; planting must be done
    // by then, so the first run is started at the end of the fault less FAULT.
    let plant_started = Instant::now();
    // Time allowed for planting (EFFECTS_DRAIN_PLANT_SECONDS, 150 by default).
    let allowance = Duration::from_secs(
        std::env::var("EFFECTS_DRAIN_PLANT_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(150),
    );
    let recover_at_unix = SystemClock.now().plus(allowance).unix_millis() / 1000 + 1;
    let user = format!("fault-release-until-{recover_at_unix}-bench");
    let _ids = plant(&planter, &user, n).await;
    let planted = plant_started.elapsed();
    let recover = Instant::now()
        + Duration::from_millis((recover_at_unix * 1000 - SystemClock.now().unix_millis()).max(0) as u64);
    let t0 = recover.checked_sub(FAULT).unwrap_or(recover).max(Instant::now());
    println!(
        "{way}: {n} pending releases planted in {:.1} s; first sweep run {:.1} s before the release recovers",
        planted.as_secs_f64(),
        recover.saturating_duration_since(t0).as_secs_f64()
    );
    tokio::time::sleep_until(t0.into()).await;

    let (wakeups, channel) = (RecordedWakeUps::default(), ScriptedChannel::default());
    let drain = Drain {
        ports: EffectPorts {
            store: &store,
            wakeups: &wakeups,
            channel: &channel,
            refunds: &NoRefunds,
            clock: &SystemClock,
        },
        released: AtomicUsize::new(0),
        driven: AtomicUsize::new(0),
        last_release: Mutex::new(None),
    };
    let (queue, batches) = (Queue::default(), AtomicUsize::new(0));
    let cfg = SweepConfig::default();
    tokio::join!(sweeps(&store, &queue, &cfg, &drain, n, t0), consumers(&queue, &drain, n, &batches));
    let last = drain.last_release.lock().unwrap().expect("something released");
    println!(
        "{way}: {n} releases done {:.1} s after the first sweep run, {:.1} s after the release recovered; \
         {} effect runs ({} duplicates or failures); {} consumer batches, {} messages left on the queue \
         (duplicates)",
        last.duration_since(t0).as_secs_f64(),
        last.saturating_duration_since(recover).as_secs_f64(),
        drain.driven.load(Ordering::Relaxed),
        drain.driven.load(Ordering::Relaxed) - n,
        batches.load(Ordering::Relaxed),
        queue.len()
    );
    // Every planted unit is back: stock reserved back to 0 on every SKU.
    for i in 0..SKUS {
        let s = store.stock(&sku(i)).await.unwrap().unwrap();
        assert_eq!(s.reserved, 0, "{}: {s:?}", sku(i));
    }
}

#[tokio::main]
async fn main() {
    // The fault switch is read once, from the environment, as in a dev stack.
    std::env::set_var("FAULT_INJECTION", "on");
    std::env::set_var("STAGE", "dev");
    let n: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(5_000);
    scenario("after", n).await;
}
