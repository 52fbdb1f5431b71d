//! BENCHMARKS.md#what-does-an-order-cost-in-capacity-units: DynamoDB capacity
//! units per lifecycle path, measured on DynamoDB Local through the real use
//! cases and the production store adapter. The SDK client carries
//! `system_tests::capacity::Meter`, which asks every call for
//! `ReturnConsumedCapacity=INDEXES` and records what each response reports;
//! nothing in the store changes.
//!
//! `DYNAMODB_LOCAL_ENDPOINT=http://127.0.0.1:8005 cargo bench -p system_tests --profile dev --bench capacity`

use aws_sdk_dynamodb::types::AttributeValue as Av;
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::*;
use order_core::handlers::requests::{create_order, payment_notification, start_payment};
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::cancel_order::{cancel_order, CancelOutcome};
use order_core::usecases::close_order::{CloseOrder, CloseOutcome, DEFAULT_CLOSE_BUDGET};
use order_core::usecases::create_order::CreateOrder;
use order_core::usecases::expiring_soon::{notice_expiring_soon, NoticeConfig};
use order_core::usecases::my_orders::{list_orders, ListQuery};
use order_core::usecases::payments::StartPayment;
use order_core::usecases::refunds::{process_refund, RefundOutcome};
use order_core::usecases::release_order::{release_order, settle_order};
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;
use system_tests::capacity::{metered_client, Call, Meter};
use system_tests::fakes::{FixedClock, RecordedReminders, RecordedWakeUps, ScriptedChannel};
use system_tests::fixtures::{available_coupon, eur};
use system_tests::{fresh_table, unique};

const T0: i64 = 1_800_000_000_000;
const WINDOW: Duration = Duration::from_secs(60);
const MERCHANT: &str = "m-bench";

struct World {
    store: DynamoStore,
    /// The same table through an unmetered client: the benchmark's own
    /// reads (an attempt's id, item sizes) are not the path's.
    raw: DynamoStore,
    meter: Meter,
    clock: FixedClock,
    channel: ScriptedChannel,
    /// Set by [`World::every_holding`]: the order also holds an open-order
    /// slot, its units of A's purchase limit and these points.
    open_order_cap: Option<u32>,
    points: Option<u32>,
}

/// One step of a path and the calls it made.
struct Step {
    name: &'static str,
    calls: Vec<Call>,
}

impl World {
    async fn new() -> Self {
        let meter = Meter::default();
        let store = fresh_table(&metered_client(&meter).await).await;
        system_tests::fixtures::seed_stock(&store, &Sku::parse("A").unwrap(), 1_000, &eur(100)).await.unwrap();
        meter.take();
        let raw = DynamoStore::new(system_tests::dynamodb_local().await, store.table());
        Self {
            store,
            raw,
            meter,
            clock: FixedClock::at(T0),
            channel: ScriptedChannel::default(),
            open_order_cap: None,
            points: None,
        }
    }

    /// A world whose orders hold every kind: A limited to 5 per buyer, 50
    /// of the buyer's 1,000 points, a slot of an open-order cap of 10.
    async fn every_holding() -> Self {
        let mut w = Self::new().await;
        let limit = order_core::usecases::queries::StockRequest {
            change: StockChange::Limit(5),
            key: Some(IdempotencyKey::parse("limit").unwrap()),
            by: "bench".into(),
        };
        order_core::usecases::queries::put_stock(&w.raw, &w.clock, &RandomIds, &Sku::parse("A").unwrap(), limit)
            .await
            .unwrap();
        let credit = order_core::usecases::points::CreditRequest {
            user_id: UserId::parse("u1").unwrap(),
            currency: Currency::parse("EUR").unwrap(),
            key: IdempotencyKey::parse("credit").unwrap(),
            delta: 1000,
            reason: "bench".into(),
            by: "bench".into(),
        };
        order_core::usecases::points::credit_points(&w.raw, &w.clock, credit).await.unwrap();
        w.meter.take();
        w.open_order_cap = Some(10);
        w.points = Some(50);
        w
    }

    fn step(&self, name: &'static str, steps: &mut Vec<Step>) {
        steps.push(Step { name, calls: self.meter.take() });
    }

    async fn coupon(&self) -> String {
        let id = unique("C");
        let c = available_coupon(&id, "u1", Timestamp::from_unix_millis(T0 + 3_600_000));
        self.store.put_coupon(&c).await.unwrap();
        self.meter.take();
        id
    }

    async fn create(&self, coupon: Option<&str>) -> Order {
        let uc = CreateOrder {
            store: self.store.clone(),
            clock: Box::new(self.clock.clone()),
            ids: Box::new(RandomIds),
            window: WINDOW,
            expiry_rule_version: "bench".into(),
            open_order_cap: self.open_order_cap,
        };
        let mut body =
            json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "A", "qty": 1, "unit_price": 100}]});
        if let Some(c) = coupon {
            body["coupon_id"] = json!(c);
        }
        if let Some(p) = self.points {
            body["points"] = json!(p);
        }
        let buyer = UserId::parse("u1").unwrap();
        create_order(&uc, &buyer, Some(&unique("k")), body.to_string().as_bytes()).await.unwrap().order
    }

    async fn start_payment(&self, o: &Order) -> PaymentAttempt {
        let uc = StartPayment {
            store: &self.store,
            channel: Some(&self.channel),
            clock: &self.clock,
            ids: &RandomIds,
            merchant_id: MERCHANT,
            not_found_grace: Duration::from_secs(10),
            until: None,
        };
        let started =
            start_payment(&uc, &o.user_id, o.order_id.as_str(), Some(&unique("p")), br#"{"channel":"sandbox"}"#)
                .await
                .unwrap();
        self.raw.attempt(&started.attempt.payment_id).await.unwrap().unwrap()
    }

    async fn notify_success(&self, a: &PaymentAttempt) -> serde_json::Value {
        let body = json!({
            "notify_id": unique("n"), "payment_id": a.payment_id, "order_id": a.order_id, "channel_txn_id": unique("tx"),
            "amount": a.amount, "currency": a.currency, "merchant_id": MERCHANT, "status": "SUCCEEDED",
        });
        payment_notification(&self.store, &self.clock, MERCHANT, "sandbox", body.to_string().as_bytes()).await.unwrap()
    }

    async fn close(&self, o: &Order) -> CloseOutcome {
        let closer = CloseOrder {
            store: self.store.clone(),
            channel: self.channel.clone(),
            reminders: RecordedReminders::default(),
            clock: Box::new(self.clock.clone()),
            lease: Duration::from_secs(30),
            not_found_grace: Duration::from_secs(10),
            budget: DEFAULT_CLOSE_BUDGET,
        };
        closer.close(&o.order_id, "bench").await.unwrap()
    }

    /// Every item of the order's partition plus the stock and coupon
    /// records it touched, with its size in bytes as DynamoDB counts it.
    async fn item_sizes(&self, o: &Order, coupon: Option<&str>) -> Vec<(String, usize)> {
        let c = self.raw.client();
        let mut keys = vec![format!("ORDER#{}", o.order_id), "SKU#A".into(), "BUYER#u1".into()];
        if let Some(cp) = coupon {
            keys.push(format!("COUPON#{cp}"));
        }
        let mut out = Vec::new();
        for pk in keys {
            let q = c
                .query()
                .table_name(self.raw.table())
                .key_condition_expression("pk = :p")
                .expression_attribute_values(":p", Av::S(pk))
                .send()
                .await
                .unwrap();
            for item in q.items() {
                let sk = item.get("sk").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
                let pk = item.get("pk").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
                let kind = if pk.starts_with("ORDER#") { sk } else { pk.split('#').next().unwrap_or("").to_owned() };
                out.push((kind, item_size(item)));
            }
        }
        // The items outside the order's partition that a path writes.
        let scan = c.scan().table_name(self.raw.table()).send().await.unwrap();
        for item in scan.items() {
            let pk = item.get("pk").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
            for p in ["IDEM#", "PAYMENT#", "NOTIFY#", "CHTXN#"] {
                if pk.starts_with(p) {
                    let sk = item.get("sk").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
                    out.push((format!("{}{}", p, if sk.starts_with("PAY#") { "PAY" } else { "" }), item_size(item)));
                }
            }
        }
        out
    }
}

/// DynamoDB's item size: attribute names plus values (strings and binary
/// by length, numbers about one byte per two digits plus one, 1 byte for a
/// boolean or null, 3 bytes per list or map plus 1 per element).
fn item_size(item: &HashMap<String, Av>) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

fn value_size(v: &Av) -> usize {
    match v {
        Av::S(s) => s.len(),
        Av::N(n) => {
            let digits = n.trim_start_matches('-').replace('.', "").trim_start_matches('0').len().max(1);
            digits.div_ceil(2) + 1
        }
        Av::Bool(_) | Av::Null(_) => 1,
        Av::L(l) => 3 + l.iter().map(|e| 1 + value_size(e)).sum::<usize>(),
        Av::M(m) => 3 + m.iter().map(|(k, e)| 1 + k.len() + value_size(e)).sum::<usize>(),
        Av::Ss(s) => s.iter().map(String::len).sum(),
        Av::B(b) => b.as_ref().len(),
        _ => 0,
    }
}

/// What AWS would charge for one part of a call: DynamoDB Local reports
/// single-item calls and queries by AWS's rules, but not transactions (a
/// one-item transaction of a 50-byte item reports 4 WCU, two items 4, six items
/// 8; see BENCHMARKS.md#does-dynamodb-local-count-like-aws). For a transaction
/// the table part is AWS's documented 2 WCU per item per started KB (every item
/// here is under 1 KB, checked below) and the index part is half of what Local
/// reports (Local reports 4 per index entry written: taken as 2, a
/// transactional write).
fn aws_rule(c: &Call, u: &system_tests::capacity::Units) -> f64 {
    match (c.transact_items, u.on.contains('/')) {
        (Some(n), false) => 2.0 * n as f64,
        (Some(_), true) => u.write / 2.0,
        (None, _) => u.write,
    }
}

fn print_path(title: &str, steps: &[Step], sizes: &[(String, usize)]) {
    assert!(sizes.iter().all(|(_, n)| *n < 1024), "an item over 1 KB: {sizes:?}");
    let (mut r, mut w, mut aws) = (0.0, 0.0, 0.0);
    println!("\n### {title}\n");
    println!("| step | call | on | RCU | WCU (Local) | WCU (AWS rule) |");
    println!("|---|---|---|---:|---:|---:|");
    for s in steps {
        for c in &s.calls {
            let mut op = if c.ok { c.operation.clone() } else { format!("{} (refused)", c.operation) };
            if let Some(n) = c.transact_items {
                op = format!("{op} ({n} item{})", if n == 1 { "" } else { "s" });
            }
            if c.units.is_empty() {
                println!("| {} | {op} | – | – | – | – |", s.name);
            }
            for u in &c.units {
                let on = u.on.split_once('/').map(|(_, i)| format!("index {i}")).unwrap_or_else(|| "table".into());
                println!("| {} | {op} | {on} | {} | {} | {} |", s.name, u.read, u.write, aws_rule(c, u));
                aws += aws_rule(c, u);
            }
            r += c.read();
            w += c.write();
        }
    }
    let failed = steps.iter().flat_map(|s| &s.calls).filter(|c| !c.ok).count();
    let calls: usize = steps.iter().map(|s| s.calls.len()).sum();
    println!("| **total** | {calls} calls ({failed} refused) | | **{r}** | **{w}** | **{aws}** |");
    let sizes: Vec<String> = sizes.iter().map(|(k, n)| format!("{k} {n} B")).collect();
    println!("\nitem sizes at the end: {}", sizes.join(", "));
}

/// Never paid: created, closed at expiry by one conditional write, its
/// stock (and coupon) released.
async fn never_paid(w: &World, coupon: Option<&str>) -> (Vec<Step>, Order) {
    let mut steps = Vec::new();
    w.clock.set(T0);
    let o = w.create(coupon).await;
    w.step("create", &mut steps);
    w.clock.set(o.expire_at.unix_millis());
    assert_eq!(w.close(&o).await, CloseOutcome::Closed);
    w.step("close", &mut steps);
    let r = release_order(&w.store, &w.clock, &o.order_id).await.unwrap();
    assert_eq!(r.refused, 0);
    w.step("release", &mut steps);
    (steps, o)
}

/// Paid in time: payment entry, the provider's success notification, the
/// settle (stock sold, coupon used, the wake-up cancelled).
async fn paid(w: &World, coupon: Option<&str>) -> (Vec<Step>, Order) {
    let mut steps = Vec::new();
    w.clock.set(T0);
    let o = w.create(coupon).await;
    w.step("create", &mut steps);
    w.clock.set(T0 + 5_000);
    let a = w.start_payment(&o).await;
    w.step("start payment", &mut steps);
    w.clock.set(T0 + 10_000);
    let v = w.notify_success(&a).await;
    w.step("notification", &mut steps);
    let r = settle_order(&w.store, &RecordedWakeUps::default(), &w.channel, &w.clock, &o.order_id).await.unwrap();
    assert_eq!(r.refused, 0, "{v}");
    w.step("settle", &mut steps);
    (steps, o)
}

/// Paid too late: an attempt the channel reports failed at the close, the
/// order closed and released, then the success arrives and is refunded.
async fn late_payment(w: &World) -> (Vec<Step>, Order) {
    let mut steps = Vec::new();
    w.clock.set(T0);
    let o = w.create(None).await;
    w.step("create", &mut steps);
    w.clock.set(T0 + 5_000);
    let a = w.start_payment(&o).await;
    w.step("start payment", &mut steps);
    w.channel.answer(&a.payment_id, Some(ChannelPayment::Failed));
    w.clock.set(o.expire_at.unix_millis());
    assert_eq!(w.close(&o).await, CloseOutcome::Closed);
    w.step("close (via CLOSING)", &mut steps);
    release_order(&w.store, &w.clock, &o.order_id).await.unwrap();
    w.step("release", &mut steps);
    w.clock.set(o.expire_at.unix_millis() + 30_000);
    w.notify_success(&a).await;
    w.step("late notification", &mut steps);
    let out = process_refund(&w.store, &w.channel, &w.clock, &o.order_id, &a.payment_id).await.unwrap();
    assert_eq!(out, RefundOutcome::Refunded);
    w.step("refund", &mut steps);
    (steps, o)
}

/// Cancelled by its buyer before anyone paid: the cancel request, the
/// close it runs at once, the release; then one page of the buyer's list.
async fn cancelled(w: &World) -> (Vec<Step>, Order) {
    let mut steps = Vec::new();
    w.clock.set(T0);
    let o = w.create(None).await;
    w.step("create", &mut steps);
    w.clock.set(T0 + 5_000);
    let closer = CloseOrder {
        store: w.store.clone(),
        channel: w.channel.clone(),
        reminders: RecordedReminders::default(),
        clock: Box::new(w.clock.clone()),
        lease: Duration::from_secs(30),
        not_found_grace: Duration::from_secs(10),
        budget: DEFAULT_CLOSE_BUDGET,
    };
    let c = cancel_order(&closer, &o.user_id, &o.order_id, None).await.unwrap();
    assert_eq!(c.outcome, CancelOutcome::Closed);
    w.step("cancel (request + close)", &mut steps);
    let r = release_order(&w.store, &w.clock, &o.order_id).await.unwrap();
    assert_eq!(r.refused, 0);
    w.step("release", &mut steps);
    let q = ListQuery { status: None, limit: 20, after: None };
    let page = list_orders(&w.store, &w.clock, &o.user_id, q).await.unwrap();
    assert_eq!(page.orders.len(), 1);
    w.step("list the buyer's orders (one page)", &mut steps);
    (steps, o)
}

/// Never paid, with the heads-up: two runs of the expiring-soon pass look
/// at it (the first notices it, the next is refused), then the close and
/// the release as in [`never_paid`]. The pass's queries are per run (one
/// per OPEN shard, whatever the number of orders), the writes per order.
/// The lead is 30 s so that the bench's 60 s window gets a notice (the
/// stack's minimum is 60 s; the writes do not depend on it).
async fn noticed(w: &World) -> (Vec<Step>, Order) {
    let mut steps = Vec::new();
    w.clock.set(T0);
    let o = w.create(None).await;
    w.step("create", &mut steps);
    let cfg = NoticeConfig { lead: Duration::from_secs(30), ..NoticeConfig::default() };
    w.clock.set(o.expire_at.unix_millis() - 45_000);
    let first = notice_expiring_soon(&w.store, &w.clock, &cfg).await;
    assert_eq!(first.noticed, 1, "{first:?}");
    w.step("expiring-soon pass: notice", &mut steps);
    w.clock.set(o.expire_at.unix_millis() - 5_000);
    let next = notice_expiring_soon(&w.store, &w.clock, &cfg).await;
    assert_eq!((next.seen, next.refused), (1, 1), "{next:?}");
    w.step("next pass: looked again, refused", &mut steps);
    w.clock.set(o.expire_at.unix_millis());
    assert_eq!(w.close(&o).await, CloseOutcome::Closed);
    w.step("close", &mut steps);
    let r = release_order(&w.store, &w.clock, &o.order_id).await.unwrap();
    assert_eq!(r.refused, 0);
    w.step("release", &mut steps);
    (steps, o)
}

#[tokio::main]
async fn main() {
    println!(
        "DynamoDB capacity per lifecycle path (DynamoDB Local, ReturnConsumedCapacity=INDEXES), one order of one line"
    );
    // A fresh table per path, so the sizes printed are this path's items.
    let w = World::new().await;
    let (s, o) = never_paid(&w, None).await;
    print_path("never paid → closed and released", &s, &w.item_sizes(&o, None).await);
    let w = World::new().await;
    let (s, o) = paid(&w, None).await;
    print_path("paid → settled", &s, &w.item_sizes(&o, None).await);
    let w = World::new().await;
    let (s, o) = late_payment(&w).await;
    print_path("late payment after close → refund", &s, &w.item_sizes(&o, None).await);
    let w = World::new().await;
    let c = w.coupon().await;
    let (s, o) = never_paid(&w, Some(&c)).await;
    print_path("with a coupon, never paid → closed, stock and coupon released", &s, &w.item_sizes(&o, Some(&c)).await);
    let w = World::new().await;
    let c = w.coupon().await;
    let (s, o) = paid(&w, Some(&c)).await;
    print_path("with a coupon, paid → settled, coupon used", &s, &w.item_sizes(&o, Some(&c)).await);
    let w = World::new().await;
    let (s, o) = cancelled(&w).await;
    print_path("cancelled by the buyer → closed and released; one list page", &s, &w.item_sizes(&o, None).await);
    let w = World::new().await;
    let (s, o) = noticed(&w).await;
    print_path(
        "noticed as expiring soon (two pass runs), never paid → closed and released",
        &s,
        &w.item_sizes(&o, None).await,
    );
    let w = World::every_holding().await;
    let (s, o) = never_paid(&w, None).await;
    print_path(
        "every holding (stock, purchase limit, 50 points, open-order slot), never paid → closed and released",
        &s,
        &w.item_sizes(&o, None).await,
    );
    let w = World::every_holding().await;
    let (s, o) = paid(&w, None).await;
    print_path(
        "every holding, paid → settled (limit kept, points spent, slot back)",
        &s,
        &w.item_sizes(&o, None).await,
    );
}
