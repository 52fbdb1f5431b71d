//! BENCHMARKS.md#measured-locally-dynamodb-local: how many orders per second
//! one SKU accepts before transaction conflicts dominate, measured on
//! DynamoDB Local through the real `CreateOrder` use case and the production
//! store adapter.
//!
//! Every accepted order decrements its SKU's stock item inside the create
//! transaction, so all creators of one SKU write the same item. The store
//! retries a transaction cancelled by a conflict (jittered backoff, at most
//! `MAX_CONFLICT_RETRIES` times) without telling the caller, so the
//! conflicts are counted from the outside: the SDK client carries
//! `system_tests::capacity::Meter`, which records every call attempt and,
//! for a failed one, why (a cancelled transaction with its reason codes,
//! such as `TransactionConflict`; a timeout).
//!
//! Each level runs `concurrency` creators for `HOT_SKU_SECONDS` (default 5)
//! on one SKU, then the same creators spread over `SPREAD_SKUS` SKUs (each
//! creator takes the SKUs in turn from its own starting point). The meter's
//! per-call item count assumes one call at a time and is not used here;
//! its per-call operation and outcome are exact under concurrency.
//!
//! `DYNAMODB_LOCAL_ENDPOINT=http://127.0.0.1:8003 cargo bench -p system_tests --profile dev --bench hot_sku`

use order_core::aws::dynamo::DynamoStore;
use order_core::domain::{Sku, UserId};
use order_core::handlers::requests::create_order;
use order_core::ports::{RandomIds, SystemClock};
use order_core::store::OrderStore;
use order_core::usecases::create_order::CreateOrder;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use system_tests::capacity::{metered_client, Meter};
use system_tests::fixtures::eur;
use system_tests::{fresh_table, unique};

const LEVELS: [usize; 6] = [1, 2, 4, 8, 16, 32];
const SPREAD_SKUS: usize = 32;
const STOCK_PER_SKU: i64 = 10_000_000;

/// What one level measured.
#[derive(Default)]
struct Level {
    accepted: usize,
    /// Creates that failed (the store ran out of retries, or DynamoDB
    /// failed: a 500 the buyer may retry).
    refused: usize,
    latencies_ms: Vec<f64>,
    transactions: usize,
    /// Transactions cancelled because another one held an item.
    conflicts: usize,
    /// Every failed transaction attempt by cause (conflicts included).
    failures: BTreeMap<String, usize>,
    /// Every DynamoDB call the creates made (catalog reads included).
    calls: usize,
    seconds: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `concurrency` creators, each creating one-line orders back to back for
/// `duration`; creator `i`'s `n`-th order is for `skus[(i + n) % len]`.
async fn run_level(
    store: &DynamoStore,
    meter: &Meter,
    skus: &[String],
    concurrency: usize,
    duration: Duration,
) -> Level {
    meter.take();
    let start = Instant::now();
    let deadline = start + duration;
    let creators = (0..concurrency).map(|i| {
        let store = store.clone();
        let skus = skus.to_vec();
        tokio::spawn(async move {
            let uc = CreateOrder {
                store,
                clock: Box::new(SystemClock),
                ids: Box::new(RandomIds),
                window: Duration::from_secs(900),
                expiry_rule_version: "bench".into(),
                open_order_cap: None,
            };
            let buyer = UserId::parse(format!("buyer-{i}")).unwrap();
            let (mut ok, mut failed, mut lat) = (0usize, 0usize, Vec::new());
            let mut n = 0;
            while Instant::now() < deadline {
                let sku = &skus[(i + n) % skus.len()];
                n += 1;
                let body = json!({"currency": "EUR", "items": [{"sku": sku, "qty": 1}]}).to_string();
                let t = Instant::now();
                match create_order(&uc, &buyer, Some(&unique("k")), body.as_bytes()).await {
                    Ok(_) => {
                        ok += 1;
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                    Err(_) => failed += 1,
                }
            }
            (ok, failed, lat)
        })
    });
    let mut level = Level::default();
    for c in futures::future::join_all(creators).await {
        let (ok, failed, lat) = c.expect("creator task");
        level.accepted += ok;
        level.refused += failed;
        level.latencies_ms.extend(lat);
    }
    level.seconds = start.elapsed().as_secs_f64();
    let calls = meter.take();
    level.calls = calls.len();
    for call in calls.iter().filter(|c| c.operation == "TransactWriteItems") {
        level.transactions += 1;
        if let Some(why) = &call.error {
            *level.failures.entry(why.clone()).or_default() += 1;
            level.conflicts += usize::from(why.contains("TransactionConflict"));
        }
    }
    level.latencies_ms.sort_by(|a, b| a.total_cmp(b));
    level
}

async fn table(meter: &Meter, skus: &[String]) -> (DynamoStore, aws_sdk_dynamodb::Client) {
    let client = metered_client(meter).await;
    let store = fresh_table(&client).await;
    for sku in skus {
        system_tests::fixtures::seed_stock(&store, &Sku::parse(sku).unwrap(), STOCK_PER_SKU, &eur(100)).await.unwrap();
    }
    (store, client)
}

fn print_row(skus: usize, concurrency: usize, l: &Level) {
    let other: Vec<String> = l
        .failures
        .iter()
        .filter(|(k, _)| !k.contains("TransactionConflict"))
        .map(|(k, n)| format!("{k} × {n}"))
        .collect();
    println!(
        "| {skus} | {concurrency} | {:.0} | {:.2} | {} | {} ({:.0} %) | {:.2} | {} | {} | {:.1} | {:.1} |",
        l.accepted as f64 / l.seconds,
        l.calls as f64 / l.accepted.max(1) as f64,
        l.transactions,
        l.conflicts,
        100.0 * l.conflicts as f64 / l.transactions.max(1) as f64,
        l.conflicts as f64 / l.accepted.max(1) as f64,
        if other.is_empty() { "–".to_owned() } else { other.join(", ") },
        l.refused,
        percentile(&l.latencies_ms, 50.0),
        percentile(&l.latencies_ms, 99.0),
    );
}

/// The machine's load average (Linux), printed beside the figures: on a
/// shared machine it says how much of the latency is other work.
fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let seconds: u64 = std::env::var("HOT_SKU_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let duration = Duration::from_secs(seconds);
    let meter = Meter::default();
    let hot = vec!["HOT".to_owned()];
    let spread: Vec<String> = (0..SPREAD_SKUS).map(|i| format!("S{i:02}")).collect();
    let (hot_store, client) = table(&meter, &hot).await;
    let (spread_store, _) = table(&meter, &spread).await;
    // Untimed runs first: the first calls pay for the client's
    // connections and DynamoDB Local's JIT warm-up.
    let warm_hot = run_level(&hot_store, &meter, &hot, 4, Duration::from_secs(2)).await.accepted;
    let warm_spread = run_level(&spread_store, &meter, &spread, 4, Duration::from_secs(2)).await.accepted;
    // Each concurrency level runs on one SKU and then on the spread, back
    // to back, so both see the same machine (a shared one is noisy).
    let load_before = load_average();
    let mut rows = Vec::new();
    for c in LEVELS {
        let one = run_level(&hot_store, &meter, &hot, c, duration).await;
        let many = run_level(&spread_store, &meter, &spread, c, duration).await;
        rows.push((c, one, many));
    }
    // Whatever the contention, each accepted order reserved exactly its
    // unit: no stock lost or counted twice.
    let accepted_hot = warm_hot + rows.iter().map(|(_, one, _)| one.accepted).sum::<usize>();
    let accepted_spread = warm_spread + rows.iter().map(|(_, _, many)| many.accepted).sum::<usize>();
    for (store, skus, accepted) in [(&hot_store, &hot, accepted_hot), (&spread_store, &spread, accepted_spread)] {
        let ids: Vec<Sku> = skus.iter().map(|s| Sku::parse(s).unwrap()).collect();
        let stocks = store.stocks(&ids).await.unwrap();
        let reserved: i64 = stocks.iter().map(|s| s.reserved).sum();
        let available: i64 = stocks.iter().map(|s| s.available).sum();
        let seeded = STOCK_PER_SKU * skus.len() as i64;
        assert_eq!((reserved as usize, reserved + available), (accepted, seeded), "stock of {skus:?}");
        println!(
            "{} SKU(s): {accepted} orders accepted, {reserved} units reserved, {available} available of {seeded}",
            skus.len()
        );
    }
    println!("{seconds} s per level; `CreateOrder` end to end (catalog read + create transaction, retries included)");
    println!("machine load average (1/5/15 min) before: {load_before}, after: {}", load_average());
    println!(
        "| SKUs | creators | accepted orders/s | DynamoDB calls per order | TransactWriteItems | conflicts (share) \
         | conflicts per accepted | other failed attempts | failed creates | P50 ms | P99 ms |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|");
    for (c, one, _) in &rows {
        print_row(1, *c, one);
    }
    for (c, _, many) in &rows {
        print_row(SPREAD_SKUS, *c, many);
    }
    for t in [hot_store.table(), spread_store.table()] {
        client.delete_table().table_name(t).send().await.expect("delete the benchmark's table");
    }
}
