//! BENCHMARKS.md#what-does-the-sweep-cost: what one sweep run costs when
//! nothing is due, with 10^3, 10^4 and 10^5 closed orders in the table (plus
//! 100 open orders not yet due), on DynamoDB Local. The closed orders are
//! written as the store leaves them once their effects are done: final, out
//! of the due index. The sweep is the production use case on the production
//! store; the SDK client carries `system_tests::capacity::Meter`.
//!
//! `DYNAMODB_LOCAL_ENDPOINT=http://127.0.0.1:8005 cargo bench -p system_tests --profile dev --bench sweep_cost [-- MAX_N]`

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue as Av, PutRequest, WriteRequest};
use order_core::domain::*;
use order_core::ports::*;

use order_core::usecases::create_order::CreateOrder;
use order_core::usecases::sweep::{sweep, SweepConfig};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use system_tests::capacity::{metered_client, Meter};
use system_tests::fakes::FixedClock;
use system_tests::fixtures::eur;
use system_tests::{dynamodb_local, fresh_table};

const T0: i64 = 1_800_000_000_000;

/// Counts what the sweep would re-drive (nothing, here).
struct NoRedrive;
#[async_trait]
impl Redrive for NoRedrive {
    async fn close(&self, ids: &[OrderId]) -> Result<(), Unavailable> {
        panic!("nothing is due, yet the sweep re-drove {} closes", ids.len())
    }
    async fn effects(&self, effects: &[PendingEffect]) -> Result<(), Unavailable> {
        panic!("nothing is due, yet the sweep handed on {} effects", effects.len())
    }
}

/// A closed order as the store leaves it after its effects: the shape and
/// size of a real one (about 500 bytes), no `due_shard`/`due_at`.
fn closed_order(i: usize) -> HashMap<String, Av> {
    let s = |v: &str| Av::S(v.to_owned());
    let n = |v: i64| Av::N(v.to_string());
    let id = format!("ord_closed{i:07}");
    let line = Av::M(HashMap::from([
        ("sku".into(), s("A")),
        ("qty".into(), n(1)),
        ("unit_price".into(), n(100)),
        ("line_total".into(), n(100)),
    ]));
    let hist = |from: Option<&str>, to: &str| {
        let mut m = HashMap::from([
            ("at".into(), s("2026-11-30T00:00:00.000Z")),
            ("to".into(), s(to)),
            ("cause".into(), s("bench")),
        ]);
        if let Some(f) = from {
            m.insert("from".into(), s(f));
        }
        Av::M(m)
    };
    HashMap::from([
        ("pk".into(), s(&format!("ORDER#{id}"))),
        ("sk".into(), s("ORDER")),
        ("entity".into(), s("ORDER")),
        ("order_id".into(), s(&id)),
        ("status".into(), s("CLOSED")),
        ("version".into(), n(2)),
        ("user_id".into(), s("u1")),
        ("currency".into(), s("EUR")),
        ("items".into(), Av::L(vec![line])),
        ("amount_total".into(), n(100)),
        ("created_at".into(), s("2026-11-30T00:00:00.000Z")),
        ("expire_at".into(), s("2026-11-30T00:30:00.000Z")),
        ("expiry_rule_version".into(), s("bench")),
        ("payment_attempts".into(), n(0)),
        ("history".into(), Av::L(vec![hist(None, "PENDING_PAYMENT"), hist(Some("PENDING_PAYMENT"), "CLOSED")])),
    ])
}

/// Writes orders `from..to` with BatchWriteItem, 16 batches of 25 at a time.
async fn write_closed(client: &aws_sdk_dynamodb::Client, table: &str, from: usize, to: usize) {
    let writes: Vec<WriteRequest> = (from..to)
        .map(|i| {
            let put = PutRequest::builder().set_item(Some(closed_order(i))).build().unwrap();
            WriteRequest::builder().put_request(put).build()
        })
        .collect();
    for group in writes.chunks(25 * 16) {
        let puts = group.chunks(25).map(|chunk| {
            let mut pending = HashMap::from([(table.to_owned(), chunk.to_vec())]);
            async move {
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

#[tokio::main]
async fn main() {
    let max: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(100_000);
    let meter = Meter::default();
    let store = fresh_table(&metered_client(&meter).await).await;
    // Bulk writes go through an unmetered client: they are the set-up.
    let raw = dynamodb_local().await;
    let table = store.table().to_owned();
    system_tests::fixtures::seed_stock(&store, &Sku::parse("A").unwrap(), 1_000, &eur(100)).await.unwrap();
    let clock = FixedClock::at(T0);
    let create = CreateOrder {
        store: store.clone(),
        clock: Box::new(clock.clone()),
        ids: Box::new(RandomIds),
        window: Duration::from_secs(1800),
        expiry_rule_version: "bench".into(),
        open_order_cap: None,
    };
    let body = json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "A", "qty": 1, "unit_price": 100}]});
    for i in 0..100 {
        let buyer = UserId::parse("u1").unwrap();
        order_core::handlers::requests::create_order(
            &create,
            &buyer,
            Some(&format!("k{i}")),
            body.to_string().as_bytes(),
        )
        .await
        .unwrap();
    }
    // The sweep runs a minute after the open orders were created: none due.
    clock.set(T0 + 60_000);
    let cfg = SweepConfig::default();
    println!(
        "Sweep with nothing due (DynamoDB Local; 100 open orders not due in the index; closed orders out of it)\n"
    );
    println!("| closed orders | write time (s) | sweep queries | items read | RCU (report) | calls (meter: operation × count, RCU, WCU) | sweep time (ms) |");
    println!("|---:|---:|---:|---:|---:|---|---:|");
    let mut written = 0;
    for n in [1_000, 10_000, 100_000].into_iter().filter(|n| *n <= max) {
        let t = Instant::now();
        write_closed(&raw, &table, written, n).await;
        let write_s = t.elapsed().as_secs_f64();
        let added = n - written;
        written = n;
        meter.take();
        let t = Instant::now();
        let r = sweep(&store, &NoRedrive, &clock, &cfg).await.unwrap();
        let sweep_ms = t.elapsed().as_millis();
        assert_eq!((r.found(), r.items_read), (0, 0), "{r:?}");
        let calls = meter.take();
        let mut by_op: BTreeMap<String, (usize, f64, f64)> = BTreeMap::new();
        for c in &calls {
            let e = by_op.entry(c.operation.clone()).or_default();
            e.0 += 1;
            e.1 += c.read();
            e.2 += c.write();
        }
        let ops: Vec<String> =
            by_op.iter().map(|(op, (k, rd, wr))| format!("{op} × {k}: {rd} RCU, {wr} WCU")).collect();
        println!(
            "| {n} | {write_s:.1} (+{added}) | {} | {} | {} | {} | {sweep_ms} |",
            r.queries,
            r.items_read,
            r.consumed_capacity,
            ops.join("; ")
        );
    }
    // A 10^5-item table slows every later user of the same DynamoDB Local.
    raw.delete_table().table_name(&table).send().await.expect("delete the benchmark's table");
}
