//! BENCHMARKS.md, "Reconciliation by day": what one day's run reads when
//! the table also holds 10^3, 10^4 and 10^5 orders made final on the 30
//! days before, on DynamoDB Local. The day itself holds 100 orders made
//! through the store (40 closed unpaid, 40 paid with their channel lines,
//! 20 still open); the older ones are written as the final writes leave
//! them (a real order's shape, their reconcile-index entry on their own
//! day). Every piece runs through the production use case and adapters;
//! the SDK client carries `system_tests::capacity::Meter`, so the read
//! units are DynamoDB's own figures, not the run's arithmetic. The full
//! scan (`orderctl reconcile` without --day) is measured beside it.
//!
//! `DYNAMODB_LOCAL_ENDPOINT=http://127.0.0.1:8002 cargo bench -p system_tests --profile dev --bench reconcile_day [-- MAX_N]`

use aws_sdk_dynamodb::types::{AttributeValue as Av, PutRequest, WriteRequest};
use order_core::aws::dynamo::{keys, DueShards, DynamoStore};
use order_core::aws::sandbox::{Faults, LedgerEntry, SandboxChannel};
use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::create_order::CreateOrder;
use order_core::usecases::reconcile::Bounds;
use order_core::usecases::reconcile_day::{merge, run_piece, store_part, DayPorts, DayReport, DayRun, Piece};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use system_tests::capacity::{metered_client, Meter};
use system_tests::fakes::FixedClock;
use system_tests::fixtures::eur;
use system_tests::{dynamodb_local, fresh_sandbox_ledger_table, fresh_table};

const DAY: &str = "2027-01-10";
const SHARDS: u32 = 16;

fn day() -> Day {
    Day::parse(DAY).unwrap()
}

/// An order made final `1 + i % 30` days before the day under test, as the
/// final write leaves it once its effects are done (about 600 bytes).
fn older_order(i: usize) -> HashMap<String, Av> {
    let s = |v: &str| Av::S(v.to_owned());
    let n = |v: i64| Av::N(v.to_string());
    let id = OrderId::parse(format!("ord_old{i:07}")).unwrap();
    let at = day().start().minus(Duration::from_secs(86_400 * (1 + (i as u64 % 30)))).plus(Duration::from_secs(3600));
    let line = Av::M(HashMap::from([
        ("sku".into(), s("A")),
        ("qty".into(), n(1)),
        ("unit_price".into(), n(100)),
        ("line_total".into(), n(100)),
    ]));
    let hist = |from: Option<&str>, to: &str| {
        let mut m =
            HashMap::from([("at".into(), s(&at.to_string())), ("to".into(), s(to)), ("cause".into(), s("bench"))]);
        if let Some(f) = from {
            m.insert("from".into(), s(f));
        }
        Av::M(m)
    };
    HashMap::from([
        ("pk".into(), s(&keys::order(&id))),
        ("sk".into(), s(keys::ORDER_SK)),
        ("entity".into(), s("ORDER")),
        ("order_id".into(), s(id.as_str())),
        ("status".into(), s("CLOSED")),
        ("version".into(), n(2)),
        ("user_id".into(), s("u1")),
        ("currency".into(), s("EUR")),
        ("items".into(), Av::L(vec![line])),
        ("amount_total".into(), n(100)),
        ("created_at".into(), s(&at.minus(Duration::from_secs(1800)).to_string())),
        ("expire_at".into(), s(&at.to_string())),
        ("expiry_rule_version".into(), s("bench")),
        ("payment_attempts".into(), n(0)),
        ("history".into(), Av::L(vec![hist(None, "PENDING_PAYMENT"), hist(Some("PENDING_PAYMENT"), "CLOSED")])),
        ("recon_part".into(), s(&keys::day_part(&id, at))),
        ("recon_at".into(), s(&at.to_string())),
    ])
}

/// Writes orders `from..to` with BatchWriteItem, 16 batches of 25 at a time.
async fn write_older(client: &aws_sdk_dynamodb::Client, table: &str, from: usize, to: usize) {
    let writes: Vec<WriteRequest> = (from..to)
        .map(|i| {
            WriteRequest::builder()
                .put_request(PutRequest::builder().set_item(Some(older_order(i))).build().unwrap())
                .build()
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

/// The day's 100 orders, made through the store at their times on the day.
async fn plant_the_day(store: &DynamoStore, ledger: &aws_sdk_dynamodb::Client, ledger_table: &str) {
    system_tests::fixtures::seed_stock(store, &Sku::parse("A").unwrap(), 100_000, &eur(100)).await.unwrap();
    for i in 0..100u64 {
        let at = day().start().plus(Duration::from_secs(600 * i));
        let create = CreateOrder {
            store: store.clone(),
            clock: Box::new(FixedClock::at(at.unix_millis())),
            ids: Box::new(RandomIds),
            window: Duration::from_secs(60),
            expiry_rule_version: "bench".into(),
            open_order_cap: None,
        };
        let body = json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "A", "qty": 1, "unit_price": 100}]});
        let buyer = UserId::parse("u1").unwrap();
        let order = order_core::handlers::requests::create_order(
            &create,
            &buyer,
            Some(&format!("k{i}")),
            body.to_string().as_bytes(),
        )
        .await
        .unwrap();
        let order = store.order(&order.order.order_id).await.unwrap().unwrap();
        match i % 5 {
            0 | 1 => assert_eq!(store.close_unpaid(&order, order.expire_at).await.unwrap(), Cas::Applied),
            2 | 3 => {
                let a = system_tests::fixtures::processing_attempt(&order, at);
                assert_eq!(store.record_attempt(&order, &a).await.unwrap(), AttemptResult::Recorded);
                let order = store.order(&order.order_id).await.unwrap().unwrap();
                let ev = Evidence { at, source: "bench".into(), status: PaymentStatus::Succeeded, detail: None };
                let txn = format!("tx_{}", a.payment_id);
                assert_eq!(store.settle_success(&order, &a, &txn, ev, None, "").await.unwrap(), SettleResult::Paid);
                let entry = LedgerEntry {
                    payment_id: a.payment_id.clone(),
                    order_id: a.order_id.clone(),
                    merchant_id: "m".into(),
                    amount: a.amount,
                    currency: a.currency.clone(),
                    status: PaymentStatus::Succeeded,
                    channel_txn_id: Some(txn),
                    refund_id: None,
                    refunded_amount: 0,
                    faults: Faults::default(),
                    created_at: Some(at),
                };
                let item = serde_dynamo::to_item(&entry).unwrap();
                ledger.put_item().table_name(ledger_table).set_item(Some(item)).send().await.unwrap();
            }
            _ => {}
        }
    }
}

/// Every piece of a run of the day, one after another.
async fn run_the_day(store: &DynamoStore, channel: &SandboxChannel) -> DayReport {
    let now = day().end().plus(Duration::from_secs(3 * 3600));
    let run = DayRun::new(day(), SHARDS, now, rand::random());
    assert_eq!(store.start_run(&run).await.unwrap(), Cas::Applied);
    let ports = DayPorts { index: store, channel: Some(channel), bounds: Bounds::default(), shards: SHARDS };
    for piece in &run.pieces {
        let part = run_piece(&ports, &run, Piece::parse(piece).unwrap(), now).await.unwrap();
        store_part(store, &run, &part).await.unwrap();
    }
    merge(&run, &store.parts(day(), &run.run_id).await.unwrap())
}

/// The meter's calls, by operation: `op × count: RCU`.
fn by_operation(meter: &Meter) -> (f64, String) {
    let mut ops: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    let mut total = 0.0;
    for c in meter.take() {
        let e = ops.entry(c.operation.clone()).or_default();
        e.0 += 1;
        e.1 += c.read();
        total += c.read();
    }
    (total, ops.iter().map(|(op, (k, rcu))| format!("{op} × {k}: {rcu} RCU")).collect::<Vec<_>>().join("; "))
}

#[tokio::main]
async fn main() {
    let max: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(100_000);
    let meter = Meter::default();
    let client = metered_client(&meter).await;
    let store = fresh_table(&client).await.with_shards(DueShards { count: SHARDS, sweep_count: SHARDS });
    // Bulk writes and the day's set-up go through an unmetered client.
    let raw = dynamodb_local().await;
    let ledger_table = fresh_sandbox_ledger_table(&raw).await;
    let channel = SandboxChannel::new(raw.clone(), ledger_table.clone());
    let table = store.table().to_owned();
    plant_the_day(&DynamoStore::new(raw.clone(), &table).with_shards(store.shards()), &raw, &ledger_table).await;
    println!("Reconciliation of {DAY} ({SHARDS} shards + catalog; 100 orders that day), DynamoDB Local\n");
    println!("| older orders | day run: items read | day run: RCU (report) | day run: RCU (meter) | day run calls (meter) | day run (ms) | full scan: RCU (meter) | full scan (ms) |");
    println!("|---:|---:|---:|---:|---|---:|---:|---:|");
    let mut written = 0;
    for n in [1_000, 10_000, 100_000].into_iter().filter(|n| *n <= max) {
        write_older(&raw, &table, written, n).await;
        written = n;
        meter.take();
        let t = Instant::now();
        let report = run_the_day(&store, &channel).await;
        let day_ms = t.elapsed().as_millis();
        assert!(report.complete, "{:?}", report.pieces_missing);
        let (day_rcu, calls) = by_operation(&meter);
        let t = Instant::now();
        let snapshot = store.scan_snapshot().await.unwrap();
        let scan_ms = t.elapsed().as_millis();
        let (scan_rcu, _) = by_operation(&meter);
        println!(
            "| {n} | {} | {:.1} | {day_rcu:.1} | {calls} | {day_ms} | {scan_rcu:.1} ({} orders) | {scan_ms} |",
            report.cost.items,
            report.cost.capacity_units,
            snapshot.orders.len(),
        );
    }
    // A 10^5-item table slows every later user of the same DynamoDB Local.
    raw.delete_table().table_name(&table).send().await.expect("delete the benchmark's table");
    raw.delete_table().table_name(&ledger_table).send().await.expect("delete the benchmark's ledger");
}
