//! The invariant check after a run (issue 9 item 1). It reads the records
//! directly (the orders table, the sandbox ledger, the queues, and for
//! Stripe attempts the intents and refunds at Stripe: [`at_stripe`]) and checks
//! them on its own terms, as raw attributes, without the domain crate's
//! decoding or the reconcile use case's logic, so that a bug there cannot
//! hide a violation here; then it runs reconciliation too and requires it
//! clean for the run's orders and SKUs.
//!
//! The checks ([`check`]) are a pure function of what was read, so each one
//! is unit-tested by planting its violation into a clean set of records.

mod at_stripe;

use crate::stack::Stack;
use aws_sdk_dynamodb::types::AttributeValue;
use futures_util::{stream, StreamExt, TryStreamExt};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// What the run created: only these are checked, so other traffic on the
/// same stack (the end-to-end tests) never counts against the run.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// The order ids the API answered with (every accepted create).
    pub orders: BTreeSet<String>,
    /// The run's SKUs with the stock each was seeded with (reserved and
    /// sold 0 at seed time, and nothing else sells them).
    pub skus: BTreeMap<String, i64>,
    /// The run's coupons (each issued AVAILABLE to one buyer of the run).
    pub coupons: BTreeSet<String>,
    /// How long past `expire_at` an order may still be open before that is
    /// a violation: the sweep's period + grace + the CLOSING lease, and the
    /// run's own slack.
    pub open_bound: Duration,
    /// When the run started (before its setup). A message on a stream
    /// failure queue sent after it is the run's finding: such a message
    /// names a shard and sequence numbers, never an order, so the time is
    /// all that ties it to the run. None (a `scope.json` from before this
    /// was recorded): the earliest `created_at` of the run's orders.
    pub started_at: Option<OffsetDateTime>,
    /// The orders of the `relay-fails` drill: each one's final event must
    /// reach the run's own subscriber queue.
    pub relay_orders: BTreeSet<String>,
    /// That queue (the run subscribes it to the order event bus for the
    /// drill's buyers), if the run made one.
    pub event_queue_url: Option<String>,
    /// When the emulator-restart drill stopped the emulator, if it ran.
    /// ministack keeps no stream records across a restart (the tables, the
    /// queues and the mappings' positions, but not the records not yet
    /// read), so a relay-fails order that became final shortly before it
    /// may never have its final event published, which AWS (a stream keeps
    /// its records 24 hours) would not do. Such an order is counted apart
    /// (`events.lost_in_emulator_restart`), not passed silently; its
    /// effects are still checked like every order's (the sweep re-drives
    /// them).
    pub restarted_at: Option<OffsetDateTime>,
}

/// How long before the restart an order's final transition may be for its
/// missing event to be put down to the restart: the relay's lag behind the
/// stream (up to 90 s measured under the 10,000-order run's load), with room.
pub const RESTART_EVENT_LOSS_WINDOW: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant, short and stable (e.g. `two_final_transitions`).
    pub invariant: &'static str,
    /// What it is about (an order id, `SKU#…`, a queue name).
    pub subject: String,
    pub detail: String,
}

/// One order as found after the run.
#[derive(Debug, Clone)]
pub struct OrderOutcome {
    pub order_id: String,
    /// Its status (PAID, CLOSED, or whatever it is stuck in).
    pub status: String,
    pub expire_at: OffsetDateTime,
    /// When it became final (its history's final transition), if it did.
    pub final_at: Option<OffsetDateTime>,
    /// Whether a late payment of it was refunded (a REFUND record exists).
    pub refunds: usize,
}

impl OrderOutcome {
    /// `final_at - expire_at` in milliseconds (negative for an order paid
    /// before its window ended).
    pub fn delay_ms(&self) -> Option<i64> {
        self.final_at.map(|f| ((f - self.expire_at).whole_milliseconds()) as i64)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    pub orders: Vec<OrderOutcome>,
    /// Figures for the summary: e.g. `orders.PAID`, `refunds.REFUNDED`,
    /// `channel.successes`, `dlq.<name>`, `reconcile.<kind>`.
    pub counts: BTreeMap<String, i64>,
    /// Invariants that could not be checked on this stack, with why (the
    /// summary says "skipped", not "pass").
    pub skipped: BTreeMap<&'static str, String>,
}

/// Every invariant [`verify`] checks, for the summary's pass/fail table
/// (an invariant with no violation passed).
pub const INVARIANTS: [(&str, &str); 28] = [
    ("order_missing", "every accepted order exists"),
    ("not_final", "every order ends PAID or CLOSED (none open, none CLOSING)"),
    ("open_past_bound", "no order open (still, or before it became final) past expire_at + the sweep's bound"),
    ("final_transitions", "exactly one final transition in each order's history, the last one"),
    ("paid_without_success", "a PAID order's paying attempt SUCCEEDED at the channel with the order's amount"),
    (
        "holdings_match_order",
        "each order holds one stock reservation per line with the line's quantity (and of its purchase limit, if \
         limited), its points, and the lock of its coupon",
    ),
    (
        "buyer_counter",
        "each buyer counter holds what the run's orders hold of it: a purchase limit's held/bought (never past \
         the limit), a points balance's held/spent (adding up to its audited credits), the open-order slots",
    ),
    ("released_on_paid", "no PAID order has a released reservation or a returned coupon"),
    ("confirmed_on_closed", "no CLOSED order has a confirmed reservation or a used coupon"),
    ("effects_pending", "every final order's reservations and coupon lock are settled and it left the due index"),
    (
        "unknown_released",
        "no CLOSED order has a payment still PROCESSING at the channel or not decided in its own records",
    ),
    ("refund_unsettled", "every refund ended REFUNDED, for the payment's amount, at the channel too"),
    ("success_unaccounted", "every channel success is the paying payment or has exactly one refund"),
    ("funds_identity", "per order: channel successes - refunds = amount (PAID) or 0 (CLOSED)"),
    (
        "stock_conservation",
        "per SKU: initial = available + reserved + sold, reserved = sum RESERVED, sold = sum CONFIRMED",
    ),
    ("stock_record", "every SKU of the run exists and no count is negative"),
    ("coupon_conservation", "each USED coupon is used by exactly one PAID order, and no other coupon is"),
    ("coupon_left_locked", "no coupon of the run is left LOCKED"),
    ("dead_letter", "no dead-letter queue holds a message about an order of the run"),
    (
        "stream_failure",
        "no stream failure queue got a message after the run started, unless it is shown not to be about the run",
    ),
    (
        "final_event_undelivered",
        "each relay-fails order's final event (OrderPaid / OrderClosed) reached a subscriber's queue at least once",
    ),
    ("coupon_locks_per_order", "an order holds at most one coupon lock (RES#COUPON#… row)"),
    (
        "holding_status_unknown",
        "every reservation is RESERVED, RELEASED or CONFIRMED; every coupon lock LOCKED, AVAILABLE, EXPIRED, VOID or USED",
    ),
    ("reconcile", "reconciliation reports nothing about the run's orders and SKUs"),
    ("ledger_unknown_order", "no channel payment names an order of the run that has no attempt for it"),
    ("record_undecodable", "every record of the run has the attributes its kind needs"),
    (
        "stripe_intent_state",
        "each Stripe attempt's intent carries its ids and amount, is succeeded iff it paid the order or was \
         refunded, canceled otherwise, none left payable",
    ),
    (
        "stripe_refunds",
        "at Stripe each charge has at most one refund, succeeded and in full, the one our record names; the \
         paying charge none",
    ),
];

/// The records of one order, as stored.
#[derive(Debug, Clone, Default)]
pub struct OrderRecords {
    pub order: Option<Value>,
    pub reservations: Vec<Value>,
    /// Every `RES#COUPON#…` row (one at most, or an invariant is broken).
    pub coupon_locks: Vec<Value>,
    pub payments: Vec<Value>,
    pub refunds: Vec<Value>,
}

/// Everything the check reads: the run's orders with what they hold, its
/// SKUs and coupons, and the channel's ledger rows for its orders.
#[derive(Debug, Clone)]
pub struct Records {
    pub orders: BTreeMap<String, OrderRecords>,
    /// SKU → its stock row (None: missing).
    pub stocks: BTreeMap<String, Option<Value>>,
    /// Coupon → its row (None: missing).
    pub coupons: BTreeMap<String, Option<Value>>,
    /// The buyer counters the run's orders hold something of, by
    /// `(pk, sk)` (`BUYER#<user>`, `LIMIT#<sku>` / `POINTS` /
    /// `OPEN_ORDERS`), with the points credits of each points balance
    /// (`POINTS_CHANGE#…` rows). None: missing.
    pub buyer_counters: BTreeMap<(String, String), Option<Value>>,
    pub points_credits: BTreeMap<String, Vec<Value>>,
    /// Ledger rows whose `order_id` is an order of the run.
    pub ledger: Vec<Value>,
    /// The run's Stripe attempts as found at Stripe (their intents and
    /// refunds): the Stripe channel's rows.
    pub stripe: Vec<at_stripe::StripeFact>,
    /// Every message seen on the stack's dead-letter queues.
    pub dead_letters: Vec<DeadLetter>,
    /// Each dead-letter queue's depth when it was read.
    pub dlq_depths: BTreeMap<&'static str, i64>,
    /// The order events (EventBridge envelopes) the run's subscriber queue
    /// received; `Err(why)` when they could not be read.
    pub delivered_events: Result<Vec<Value>, String>,
}

impl Default for Records {
    fn default() -> Self {
        Self {
            orders: BTreeMap::new(),
            stocks: BTreeMap::new(),
            coupons: BTreeMap::new(),
            buyer_counters: BTreeMap::new(),
            points_credits: BTreeMap::new(),
            ledger: Vec::new(),
            stripe: Vec::new(),
            dead_letters: Vec::new(),
            dlq_depths: BTreeMap::new(),
            delivered_events: Ok(Vec::new()),
        }
    }
}

/// One message peeked on a dead-letter queue.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The queue's stack output name (`STREAM_FAILURE_QUEUE_URL`, …).
    pub queue: &'static str,
    /// Its `SentTimestamp` (when it was put on the queue).
    pub sent_at: Option<OffsetDateTime>,
    pub body: String,
}

/// Checks every invariant over the run's records. Call it after the drain
/// (every order final, every effect settled), or it reports what is not.
/// `stripe_concurrency` bounds the calls to the Stripe server.
pub async fn verify(stack: &Stack, scope: &Scope, stripe_concurrency: usize) -> Result<Verdict, String> {
    if let Some(problem) = scope_problem(scope) {
        return Err(problem);
    }
    let now = OffsetDateTime::now_utc();
    let mut records = load(stack, scope).await?;
    records.stripe = at_stripe::read(stack, &records.orders, stripe_concurrency).await?;
    (records.dead_letters, records.dlq_depths) = dead_letters(stack).await?;
    records.delivered_events = delivered_events(stack, scope).await;
    let mut verdict = check(&records, scope, now);
    reconcile(stack, scope, &mut verdict).await?;
    Ok(verdict)
}

/// Why a scope cannot stand for a run, if it cannot: a check over no
/// orders (a `scope.json` of another shape, an empty run) finds nothing
/// and would pass, which proves nothing.
pub fn scope_problem(scope: &Scope) -> Option<String> {
    if scope.orders.is_empty() {
        return Some("the scope holds no order: there is nothing to check".into());
    }
    if scope.skus.is_empty() {
        return Some("the scope holds no SKU: the stock could not be checked".into());
    }
    None
}

// ---------------------------------------------------------------- reading

async fn load(stack: &Stack, scope: &Scope) -> Result<Records, String> {
    let db = aws_sdk_dynamodb::Client::new(&stack.sdk);
    let table = stack.get("ORDERS_TABLE_NAME")?.to_owned();
    let orders: BTreeMap<String, OrderRecords> = stream::iter(scope.orders.iter().cloned())
        .map(|id| {
            let (db, table) = (db.clone(), table.clone());
            async move { order_records(&db, &table, &id).await.map(|r| (id, r)) }
        })
        .buffer_unordered(16)
        .try_collect()
        .await?;
    let mut stocks = BTreeMap::new();
    for sku in scope.skus.keys() {
        stocks.insert(sku.clone(), get(&db, &table, &format!("SKU#{sku}"), "STOCK").await?);
    }
    let mut coupons = BTreeMap::new();
    for c in &scope.coupons {
        coupons.insert(c.clone(), get(&db, &table, &format!("COUPON#{c}"), "COUPON").await?);
    }
    // The channel's side: the whole sandbox ledger, kept to the run's
    // orders. Scanning it (not looking up the attempts' ids) also finds a
    // channel payment the order's records do not know about.
    let mut ledger = Vec::new();
    if let Some(ledger_table) = stack.get_opt("SANDBOX_LEDGER_TABLE_NAME") {
        let mut pages = db.scan().table_name(ledger_table).consistent_read(true).into_paginator().items().send();
        while let Some(item) = pages.next().await {
            let row = to_json(item.map_err(|e| format!("scanning the sandbox ledger: {e}"))?);
            if row["order_id"].as_str().is_some_and(|o| scope.orders.contains(o)) {
                ledger.push(row);
            }
        }
    }
    let (buyer_counters, points_credits) = load_buyer_counters(&db, &table, &orders).await?;
    Ok(Records { orders, stocks, coupons, ledger, buyer_counters, points_credits, ..Records::default() })
}

/// A holding row's kind (absent: STOCK, as written before kinds) and key
/// (absent: its `sku`, as written before keys).
fn kind_and_key(res: &Value) -> (&str, &str) {
    let kind = res["resource_type"].as_str().unwrap_or("STOCK");
    let key = res["resource_key"].as_str().or_else(|| res["sku"].as_str()).unwrap_or_default();
    (kind, key)
}

/// The buyer counter a holding of `kind` and `key` moves, as `(pk, sk)`.
fn counter_of(kind: &str, key: &str) -> Option<(String, String)> {
    match kind {
        "PURCHASE_LIMIT" => key.split_once('#').map(|(u, sku)| (format!("BUYER#{u}"), format!("LIMIT#{sku}"))),
        "POINTS" => Some((format!("BUYER#{key}"), "POINTS".to_owned())),
        "OPEN_ORDERS" => Some((format!("BUYER#{key}"), "OPEN_ORDERS".to_owned())),
        _ => None,
    }
}

type BuyerRows = (BTreeMap<(String, String), Option<Value>>, BTreeMap<String, Vec<Value>>);

async fn load_buyer_counters(
    db: &aws_sdk_dynamodb::Client,
    table: &str,
    orders: &BTreeMap<String, OrderRecords>,
) -> Result<BuyerRows, String> {
    let keys: BTreeSet<(String, String)> = orders
        .values()
        .flat_map(|r| &r.reservations)
        .filter_map(|res| {
            let (kind, key) = kind_and_key(res);
            counter_of(kind, key)
        })
        .collect();
    let mut counters = BTreeMap::new();
    let mut credits = BTreeMap::new();
    for (pk, sk) in keys {
        if sk == "POINTS" {
            let mut pages = db
                .query()
                .table_name(table)
                .key_condition_expression("pk = :pk AND begins_with(sk, :c)")
                .expression_attribute_values(":pk", AttributeValue::S(pk.clone()))
                .expression_attribute_values(":c", AttributeValue::S("POINTS_CHANGE#".into()))
                .consistent_read(true)
                .into_paginator()
                .items()
                .send();
            let mut rows = Vec::new();
            while let Some(item) = pages.next().await {
                rows.push(to_json(item.map_err(|e| format!("reading the credits of {pk}: {e}"))?));
            }
            credits.insert(pk.clone(), rows);
        }
        let row = get(db, table, &pk, &sk).await?;
        counters.insert((pk, sk), row);
    }
    Ok((counters, credits))
}

async fn order_records(db: &aws_sdk_dynamodb::Client, table: &str, id: &str) -> Result<OrderRecords, String> {
    let mut r = OrderRecords::default();
    let mut pages = db
        .query()
        .table_name(table)
        .key_condition_expression("pk = :pk")
        .expression_attribute_values(":pk", AttributeValue::S(format!("ORDER#{id}")))
        .consistent_read(true)
        .into_paginator()
        .items()
        .send();
    while let Some(item) = pages.next().await {
        let row = to_json(item.map_err(|e| format!("reading order {id}: {e}"))?);
        let sk = row["sk"].as_str().unwrap_or_default().to_owned();
        if sk == "ORDER" {
            r.order = Some(row);
        } else if sk.starts_with("RES#COUPON#") {
            r.coupon_locks.push(row);
        } else if sk.starts_with("RES#") {
            // Every kind of holding: stock, purchase limit, points, slot.
            r.reservations.push(row);
        } else if sk.starts_with("PAY#") {
            r.payments.push(row);
        } else if sk.starts_with("REFUND#") {
            r.refunds.push(row);
        }
    }
    Ok(r)
}

async fn get(db: &aws_sdk_dynamodb::Client, table: &str, pk: &str, sk: &str) -> Result<Option<Value>, String> {
    let out = db
        .get_item()
        .table_name(table)
        .key("pk", AttributeValue::S(pk.into()))
        .key("sk", AttributeValue::S(sk.into()))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| format!("reading {pk}: {e}"))?;
    Ok(out.item.map(to_json))
}

fn to_json(item: HashMap<String, AttributeValue>) -> Value {
    serde_dynamo::from_item(item).unwrap_or(Value::Null)
}

// ---------------------------------------------------------------- checking

/// The checks over what was read; `now` bounds "open too long".
pub fn check(records: &Records, scope: &Scope, now: OffsetDateTime) -> Verdict {
    let mut found = Findings::default();
    let mut held = Held::default();
    // Ledger rows by order: the sandbox's, and Stripe's figures as rows.
    let stripe_rows = at_stripe::ledger_rows(&records.stripe);
    let mut ledger: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for row in records.ledger.iter().chain(&stripe_rows) {
        ledger.entry(row["order_id"].as_str().unwrap_or_default()).or_default().push(row);
    }
    let mut outcomes = Vec::new();
    for id in &scope.orders {
        let Some(o) = OrderUnderCheck::read(id, records, scope, now, &mut found) else { continue };
        let final_at = check_history(&o, scope, &mut found);
        check_settled_reservations(&o, &mut held, &mut found);
        check_settled_coupon_locks(&o, &mut held, &mut found);
        check_holdings_match_order(&o, &mut found);
        check_left_due_index(&o, &mut found);
        let rows = ledger.get(id.as_str()).cloned().unwrap_or_default();
        let payments = Payments::of(&o, &rows);
        check_paid_by(&o, &payments, &mut found);
        check_unknown_released(&o, &payments, &mut found);
        check_channel_payments(&o, &payments, &mut found);
        check_refunds(&o, &payments, &mut found);
        check_funds_identity(&o, &rows, payments.amount, &mut found);
        outcomes.push(OrderOutcome {
            order_id: id.clone(),
            status: o.status.clone(),
            expire_at: o.expire_at,
            final_at: if o.is_final { final_at } else { None },
            refunds: o.records.refunds.len(),
        });
    }
    for (sku, initial) in &scope.skus {
        check_stock(records, sku, *initial, &held, &mut found);
    }
    for c in &scope.coupons {
        check_coupon(records, c, &held, &mut found);
    }

    let Findings { mut violations, mut counts } = found;
    let mut skipped = BTreeMap::new();
    let mut flag = |invariant: &'static str, subject: &str, detail: String| {
        violations.push(Violation { invariant, subject: subject.to_owned(), detail });
    };
    check_buyer_counters(records, &held.units, &mut flag, &mut counts);
    check_dead_letters(records, scope, &mut flag, &mut counts);
    check_final_events(records, scope, &mut flag, &mut counts, &mut skipped);
    at_stripe::check(&records.orders, &records.stripe, &mut flag, &mut counts, &mut skipped);
    Verdict { violations, orders: outcomes, counts, skipped }
}

/// What the checks found: the violations in the order they were found (the
/// summary lists them so), and the figures.
#[derive(Default)]
struct Findings {
    violations: Vec<Violation>,
    counts: BTreeMap<String, i64>,
}

impl Findings {
    fn flag(&mut self, invariant: &'static str, subject: &str, detail: String) {
        self.violations.push(Violation { invariant, subject: subject.to_owned(), detail });
    }

    fn count(&mut self, figure: String) {
        *self.counts.entry(figure).or_default() += 1;
    }
}

/// What the run's orders hold, summed over them for the checks of the
/// stock, the coupons and the buyer counters.
#[derive(Default)]
struct Held {
    /// Per SKU (`<kind>#<key>`): quantities RESERVED / CONFIRMED over the
    /// run's orders.
    units: BTreeMap<String, (i64, i64)>,
    /// Per coupon: the orders whose lock of it is USED.
    used_by: BTreeMap<String, Vec<String>>,
}

/// One order of the run with its ORDER record read.
struct OrderUnderCheck<'a> {
    id: &'a String,
    records: &'a OrderRecords,
    order: &'a Value,
    status: String,
    expire_at: OffsetDateTime,
    is_final: bool,
}

impl<'a> OrderUnderCheck<'a> {
    /// The order, counted by its status; None (and why, flagged) when it
    /// is missing or its expiry cannot be read. An order not final is
    /// flagged as such, and as open past the bound once it is.
    fn read(
        id: &'a String,
        records: &'a Records,
        scope: &Scope,
        now: OffsetDateTime,
        found: &mut Findings,
    ) -> Option<Self> {
        let Some(r) = records.orders.get(id) else {
            found.flag("order_missing", id, "the API accepted it, but it was not read back".into());
            return None;
        };
        let Some(order) = &r.order else {
            found.flag("order_missing", id, "no ORDER record under its partition".into());
            return None;
        };
        let status = order["status"].as_str().unwrap_or("?").to_owned();
        found.count(format!("orders.{status}"));
        let Some(expire_at) = time_of(&order["expire_at"]) else {
            found.flag("record_undecodable", id, format!("expire_at {} is not RFC 3339", order["expire_at"]));
            return None;
        };
        let is_final = status == "PAID" || status == "CLOSED";
        if !is_final {
            found.flag("not_final", id, format!("{status}, expire_at {}", order["expire_at"]));
            let late = now - expire_at;
            if late > scope.open_bound {
                found.flag("open_past_bound", id, format!("{status} {:.0} s after expire_at", late.as_seconds_f64()));
            }
        }
        Some(Self { id, records: r, order, status, expire_at, is_final })
    }
}

/// The history: exactly one entry into a final status, and it is the last
/// one (nothing moves an order out of PAID or CLOSED). Returns when the
/// order first became final.
fn check_history(o: &OrderUnderCheck, scope: &Scope, found: &mut Findings) -> Option<OffsetDateTime> {
    let (id, status) = (o.id, &o.status);
    let history = o.order["history"].as_array().cloned().unwrap_or_default();
    let finals: Vec<&Value> = history.iter().filter(|h| matches!(h["to"].as_str(), Some("PAID" | "CLOSED"))).collect();
    let final_at = finals.first().and_then(|h| time_of(&h["at"]));
    if let (true, Some(at)) = (o.is_final, final_at) {
        // Final now, but open for too long before it got there.
        let late = at - o.expire_at;
        if late > scope.open_bound {
            found.flag(
                "open_past_bound",
                id,
                format!("became {status} {:.0} s after expire_at", late.as_seconds_f64()),
            );
        }
    }
    if o.is_final {
        let last_to = history.last().and_then(|h| h["to"].as_str());
        if finals.len() != 1 || last_to != Some(status.as_str()) {
            found.flag(
                "final_transitions",
                id,
                format!("status {status}; history into a final status: {}", summary_of(&finals)),
            );
        }
    } else if !finals.is_empty() {
        found.flag("final_transitions", id, format!("status {status} after {}", summary_of(&finals)));
    }
    if history.iter().any(|h| matches!(h["from"].as_str(), Some("PAID" | "CLOSED"))) {
        found.flag("final_transitions", id, "a history entry leaves a final status".into());
    }
    final_at
}

/// What the order holds, settled the way its outcome requires: its
/// reservations (each summed into `held`).
fn check_settled_reservations(o: &OrderUnderCheck, held: &mut Held, found: &mut Findings) {
    let (id, status) = (o.id, &o.status);
    for res in &o.records.reservations {
        let (kind, key) = kind_and_key(res);
        let sku = format!("{kind} {key}");
        let qty = res["qty"].as_i64().unwrap_or(0);
        let rs = res["status"].as_str().unwrap_or("?");
        if !RESERVATION_STATUSES.contains(&rs) {
            found.flag("holding_status_unknown", id, format!("reservation of {sku} has status {}", res["status"]));
        }
        let e = held.units.entry(format!("{kind}#{key}")).or_default();
        match rs {
            "RESERVED" => e.0 += qty,
            "CONFIRMED" => e.1 += qty,
            _ => {}
        }
        match (status.as_str(), rs) {
            ("PAID", "RELEASED") => found.flag("released_on_paid", id, format!("reservation of {sku} RELEASED")),
            ("CLOSED", "CONFIRMED") => found.flag("confirmed_on_closed", id, format!("reservation of {sku} CONFIRMED")),
            ("PAID" | "CLOSED", "RESERVED") => {
                found.flag("effects_pending", id, format!("{status} but its reservation of {sku} is still RESERVED"))
            }
            _ => {}
        }
    }
}

/// Its coupon locks (one at most), settled the way its outcome requires;
/// a USED one is noted in `held`.
fn check_settled_coupon_locks(o: &OrderUnderCheck, held: &mut Held, found: &mut Findings) {
    let (id, status, locks) = (o.id, &o.status, &o.records.coupon_locks);
    if locks.len() > 1 {
        let held: Vec<&str> = locks.iter().map(|l| l["coupon_id"].as_str().unwrap_or("?")).collect();
        found.flag("coupon_locks_per_order", id, format!("{} coupon locks: {held:?}", held.len()));
    }
    for lock in locks {
        let coupon = lock["coupon_id"].as_str().unwrap_or_default().to_owned();
        let ls = lock["status"].as_str().unwrap_or("?");
        if !COUPON_LOCK_STATUSES.contains(&ls) {
            found.flag("holding_status_unknown", id, format!("coupon lock of {coupon} has status {}", lock["status"]));
        }
        if ls == "USED" {
            held.used_by.entry(coupon.clone()).or_default().push(id.clone());
        }
        match (status.as_str(), ls) {
            ("PAID", "AVAILABLE" | "EXPIRED" | "VOID") => {
                found.flag("released_on_paid", id, format!("coupon lock of {coupon} {ls}"))
            }
            ("CLOSED", "USED") => found.flag("confirmed_on_closed", id, format!("coupon lock of {coupon} USED")),
            ("PAID" | "CLOSED", "LOCKED") => {
                found.flag("effects_pending", id, format!("{status} but its coupon lock of {coupon} is still LOCKED"))
            }
            _ => {}
        }
    }
}

/// What it holds is what it was created with: a reservation per line
/// (same SKU, same quantity) and the lock of its coupon. A missing or
/// short one would let a PAID order keep goods or a discount it never
/// took from the stock or the coupon, with every count still adding up.
fn check_holdings_match_order(o: &OrderUnderCheck, found: &mut Findings) {
    let (id, order) = (o.id, o.order);
    let mut lines: BTreeMap<String, i64> = BTreeMap::new();
    for line in order["items"].as_array().into_iter().flatten() {
        *lines.entry(line["sku"].as_str().unwrap_or("?").to_owned()).or_default() += line["qty"].as_i64().unwrap_or(-1);
    }
    let mut holds: BTreeMap<String, i64> = BTreeMap::new();
    let mut limited: BTreeMap<String, i64> = BTreeMap::new();
    let mut points = 0;
    for res in &o.records.reservations {
        let (kind, key) = kind_and_key(res);
        let qty = res["qty"].as_i64().unwrap_or(-1);
        match kind {
            "STOCK" => *holds.entry(key.to_owned()).or_default() += qty,
            "PURCHASE_LIMIT" => {
                *limited.entry(key.split_once('#').map_or(key, |(_, s)| s).to_owned()).or_default() += qty
            }
            "POINTS" => points += qty,
            _ => {}
        }
    }
    if lines.is_empty() || lines != holds {
        found.flag("holdings_match_order", id, format!("lines {lines:?}, reservations {holds:?}"));
    }
    // A purchase-limit holding is of a line, for the line's quantity;
    // the points held are the order's.
    if limited.iter().any(|(sku, q)| lines.get(sku) != Some(q)) {
        found.flag("holdings_match_order", id, format!("lines {lines:?}, purchase-limit holdings {limited:?}"));
    }
    if points != order["points"].as_i64().unwrap_or(0) {
        found.flag("holdings_match_order", id, format!("points {}, points held {points}", order["points"]));
    }
    let lock_of = o.records.coupon_locks.first().and_then(|l| l["coupon_id"].as_str());
    if order["coupon_id"].as_str() != lock_of {
        found.flag("holdings_match_order", id, format!("coupon_id {}, coupon lock of {lock_of:?}", order["coupon_id"]));
    }
}

/// A final order has left the due index.
fn check_left_due_index(o: &OrderUnderCheck, found: &mut Findings) {
    let order = o.order;
    if o.is_final && !order["due_shard"].is_null() {
        found.flag(
            "effects_pending",
            o.id,
            format!("still in the due index ({} at {})", order["due_shard"], order["due_at"]),
        );
    }
}

/// An order's payments as its records and the channel know them, each by
/// payment id.
struct Payments<'a> {
    attempts: BTreeMap<&'a str, &'a Value>,
    refunds: BTreeMap<&'a str, &'a Value>,
    channel: BTreeMap<&'a str, &'a Value>,
    amount: i64,
    paid_by: Option<&'a str>,
}

impl<'a> Payments<'a> {
    fn of(o: &OrderUnderCheck<'a>, rows: &[&'a Value]) -> Self {
        let r = o.records;
        Self {
            attempts: r.payments.iter().map(|p| (p["payment_id"].as_str().unwrap_or_default(), p)).collect(),
            refunds: r.refunds.iter().map(|p| (p["payment_id"].as_str().unwrap_or_default(), p)).collect(),
            channel: rows.iter().map(|p| (p["payment_id"].as_str().unwrap_or_default(), *p)).collect(),
            amount: o.order["amount_total"].as_i64().unwrap_or(-1),
            paid_by: o.order["paid_by"].as_str(),
        }
    }
}

/// Payments: the paying one SUCCEEDED at the channel with the order's
/// amount, and only a PAID order names one.
fn check_paid_by(o: &OrderUnderCheck, p: &Payments, found: &mut Findings) {
    let (id, status, paid_by) = (o.id, &o.status, p.paid_by);
    if status == "PAID" {
        let at_channel = paid_by.and_then(|pid| p.channel.get(pid));
        let ok = at_channel.is_some_and(|c| {
            c["status"] == "SUCCEEDED" && c["amount"].as_i64() == Some(p.amount) && c["currency"] == o.order["currency"]
        }) && paid_by.and_then(|pid| p.attempts.get(pid)).is_some_and(|a| a["status"] == "SUCCEEDED");
        if !ok {
            found.flag(
                "paid_without_success",
                id,
                format!("paid_by {paid_by:?}: channel {:?}", at_channel.map(|c| &c["status"])),
            );
        }
    } else if paid_by.is_some() {
        found.flag("paid_without_success", id, format!("{status} but paid_by {paid_by:?} is set"));
    }
}

/// An order closes only once every attempt of it is decided: the close
/// closes a processing payment at the channel (it ends FAILED there) or
/// waits. A CLOSED order with a payment still live at the channel, or
/// undecided in its own records, was closed on an unknown payment state.
fn check_unknown_released(o: &OrderUnderCheck, p: &Payments, found: &mut Findings) {
    if o.status != "CLOSED" {
        return;
    }
    for (pid, row) in &p.channel {
        if row["status"] == "PROCESSING" {
            found.flag("unknown_released", o.id, format!("payment {pid} is still PROCESSING at the channel"));
        }
    }
    for (pid, a) in &p.attempts {
        if matches!(a["status"].as_str(), Some("PROCESSING" | "UNKNOWN")) {
            found.flag("unknown_released", o.id, format!("its attempt {pid} is {}", a["status"]));
        }
    }
}

/// Each channel payment is one of the order's attempts, and each channel
/// success is either the paying payment or refunded.
fn check_channel_payments(o: &OrderUnderCheck, p: &Payments, found: &mut Findings) {
    let id = o.id;
    for (pid, row) in &p.channel {
        found.count(format!("channel.{}", row["status"].as_str().unwrap_or("?")));
        if !p.attempts.contains_key(pid) {
            found.flag(
                "ledger_unknown_order",
                id,
                format!("the channel has payment {pid}, the order has no attempt for it"),
            );
        }
        if row["status"] != "SUCCEEDED" {
            continue;
        }
        let paying = o.status == "PAID" && p.paid_by == Some(*pid);
        let refunded = p.refunds.get(pid).is_some_and(|f| f["status"] == "REFUNDED");
        if paying == refunded {
            found.flag(
                "success_unaccounted",
                id,
                format!("channel success {pid}: paying {paying}, refunded {refunded} (exactly one must hold)"),
            );
        }
    }
}

/// Every refund ended REFUNDED, for its payment's amount, at the channel too.
fn check_refunds(o: &OrderUnderCheck, p: &Payments, found: &mut Findings) {
    for (pid, refund) in &p.refunds {
        let rs = refund["status"].as_str().unwrap_or("?");
        found.count(format!("refunds.{rs}"));
        let want = p.attempts.get(pid).and_then(|a| a["amount"].as_i64());
        let at_channel = p.channel.get(pid).and_then(|c| c["refunded_amount"].as_i64()).unwrap_or(0);
        if rs != "REFUNDED" || refund["amount"].as_i64() != want || Some(at_channel) != want {
            found.flag(
                "refund_unsettled",
                o.id,
                format!(
                    "refund of {pid}: {rs}, amount {}, attempt {want:?}, refunded at the channel {at_channel}",
                    refund["amount"]
                ),
            );
        }
    }
}

/// The funds identity on the channel's own figures (docs/design.md#funds-identity).
fn check_funds_identity(o: &OrderUnderCheck, rows: &[&Value], amount: i64, found: &mut Findings) {
    let status = &o.status;
    let received: i64 = rows.iter().filter(|c| c["status"] == "SUCCEEDED").filter_map(|c| c["amount"].as_i64()).sum();
    let returned: i64 = rows.iter().filter_map(|c| c["refunded_amount"].as_i64()).sum();
    let expected = match status.as_str() {
        "PAID" => Some(amount),
        "CLOSED" => Some(0),
        _ => None,
    };
    if let Some(expected) = expected {
        if received - returned != expected {
            found.flag(
                "funds_identity",
                o.id,
                format!("{status}: received {received} - refunded {returned} != {expected}"),
            );
        }
    }
}

/// One SKU of the run: its record exists with no negative count, and its
/// stock is conserved and agrees with what the orders hold.
fn check_stock(records: &Records, sku: &str, initial: i64, held: &Held, found: &mut Findings) {
    let subject = format!("SKU#{sku}");
    let Some(Some(stock)) = records.stocks.get(sku) else {
        found.flag("stock_record", &subject, "missing".into());
        return;
    };
    let (available, reserved, sold) = (
        stock["available"].as_i64().unwrap_or(-1),
        stock["reserved"].as_i64().unwrap_or(-1),
        stock["sold"].as_i64().unwrap_or(0),
    );
    if available < 0 || reserved < 0 || sold < 0 {
        found.flag("stock_record", &subject, format!("available {available}, reserved {reserved}, sold {sold}"));
    }
    let (want_reserved, want_sold) = held.units.get(&format!("STOCK#{sku}")).copied().unwrap_or_default();
    if available + reserved + sold != initial || reserved != want_reserved || sold != want_sold {
        found.flag(
            "stock_conservation",
            &subject,
            format!(
                "seeded {initial}; available {available} + reserved {reserved} + sold {sold}; the orders hold \
                 {want_reserved} RESERVED and {want_sold} CONFIRMED"
            ),
        );
    }
    found.counts.insert(format!("stock.{sku}.sold"), sold);
}

/// One coupon of the run: USED by exactly one PAID order, or by none; not
/// left LOCKED.
fn check_coupon(records: &Records, c: &str, held: &Held, found: &mut Findings) {
    let subject = format!("COUPON#{c}");
    let Some(Some(coupon)) = records.coupons.get(c) else {
        found.flag("coupon_conservation", &subject, "missing".into());
        return;
    };
    let state = coupon["state"].as_str().unwrap_or("?");
    found.count(format!("coupons.{state}"));
    let users = held.used_by.get(c).cloned().unwrap_or_default();
    let paid_users: Vec<&String> = users
        .iter()
        .filter(|o| records.orders.get(*o).and_then(|r| r.order.as_ref()).is_some_and(|o| o["status"] == "PAID"))
        .collect();
    let ok = match state {
        // Settling a lock removes the coupon's `locked_by`, so the
        // order that used it is known from the locks alone.
        "USED" => users.len() == 1 && paid_users.len() == 1,
        "LOCKED" => {
            found.flag("coupon_left_locked", &subject, format!("locked by {}", coupon["locked_by"]));
            users.is_empty()
        }
        _ => users.is_empty(),
    };
    if !ok {
        found.flag(
            "coupon_conservation",
            &subject,
            format!(
                "state {state}, locked_by {}; USED by orders {users:?} (PAID: {paid_users:?})",
                coupon["locked_by"]
            ),
        );
    }
}

/// The buyer counters against what the run's orders hold of them (`held`:
/// RESERVED and CONFIRMED per `<kind>#<key>`): each counter holds exactly
/// what its open orders hold and keeps what its paid ones took; a purchase
/// limit is never passed; a points balance adds up to its credits.
fn check_buyer_counters(
    records: &Records,
    held: &BTreeMap<String, (i64, i64)>,
    flag: &mut impl FnMut(&'static str, &str, String),
    counts: &mut BTreeMap<String, i64>,
) {
    let n = |row: &Value, attr: &str| row[attr].as_i64().unwrap_or(0);
    for ((pk, sk), row) in &records.buyer_counters {
        let subject = format!("{pk}/{sk}");
        let Some(row) = row else {
            flag("buyer_counter", &subject, "missing, but the run's orders hold something of it".into());
            continue;
        };
        let user = pk.strip_prefix("BUYER#").unwrap_or_default();
        let of = |kind: &str, key: &str| held.get(&format!("{kind}#{key}")).copied().unwrap_or_default();
        let problem = if let Some(sku) = sk.strip_prefix("LIMIT#") {
            let (reserved, confirmed) = of("PURCHASE_LIMIT", &format!("{user}#{sku}"));
            let limit = records
                .stocks
                .get(sku)
                .and_then(|s| s.as_ref())
                .and_then(|s| s["purchase_limit"].as_i64())
                .unwrap_or(i64::MAX);
            *counts.entry("purchase_limit.bought".into()).or_default() += n(row, "bought");
            let agrees =
                n(row, "held") == reserved && n(row, "bought") == confirmed && n(row, "used") == reserved + confirmed;
            (!agrees || confirmed > limit).then(|| {
                format!(
                    "used {}, held {}, bought {} (limit {limit}); the orders hold {reserved} and bought {confirmed}",
                    n(row, "used"),
                    n(row, "held"),
                    n(row, "bought")
                )
            })
        } else if sk == "POINTS" {
            let (reserved, confirmed) = of("POINTS", user);
            let credited: i64 = records.points_credits.get(pk).into_iter().flatten().map(|c| n(c, "delta")).sum();
            *counts.entry("points.spent".into()).or_default() += n(row, "spent");
            let agrees = n(row, "held") == reserved
                && n(row, "spent") == confirmed
                && n(row, "credited") == credited
                && n(row, "available") + n(row, "held") + n(row, "spent") == credited;
            (!agrees).then(|| {
                format!(
                    "available {}, held {}, spent {}, credited {} (credits add up to {credited}); the orders hold \
                     {reserved} and spent {confirmed}",
                    n(row, "available"),
                    n(row, "held"),
                    n(row, "spent"),
                    n(row, "credited")
                )
            })
        } else {
            let (reserved, _) = of("OPEN_ORDERS", user);
            (n(row, "open") != reserved).then(|| format!("open {}, the orders hold {reserved} slots", n(row, "open")))
        };
        if let Some(detail) = problem {
            flag("buyer_counter", &subject, detail);
        }
    }
}

/// The statuses a reservation row can have (`ReservationStatus`,
/// docs/data-model.md), written out here rather than decoded with the
/// domain's type so that a row the domain would refuse is seen as such.
const RESERVATION_STATUSES: [&str; 3] = ["RESERVED", "RELEASED", "CONFIRMED"];
/// The statuses a coupon lock row can have (`CouponLockStatus`).
const COUPON_LOCK_STATUSES: [&str; 5] = ["LOCKED", "AVAILABLE", "EXPIRED", "VOID", "USED"];

/// Dead letters: any message naming an order of the run; and any message on
/// a stream failure queue put there after the run started, whatever it
/// names (the mapping's on-failure record carries a shard and sequence
/// numbers, not an order id, so it cannot be matched to an order: each
/// such record is an event or an effect the run may have lost).
fn check_dead_letters(
    records: &Records,
    scope: &Scope,
    flag: &mut impl FnMut(&'static str, &str, String),
    counts: &mut BTreeMap<String, i64>,
) {
    for (queue, depth) in &records.dlq_depths {
        counts.insert(format!("dlq.{queue}"), *depth);
    }
    // The run cannot have started after its first order was created.
    let started_at = scope.started_at.or_else(|| {
        scope
            .orders
            .iter()
            .filter_map(|id| records.orders.get(id)?.order.as_ref().and_then(|o| time_of(&o["created_at"])))
            .min()
    });
    for m in &records.dead_letters {
        if let Some(order) = scope.orders.iter().find(|o| m.body.contains(o.as_str())) {
            flag("dead_letter", order, format!("a message about it is on {}", m.queue));
        }
        if !STREAM_FAILURE_QUEUES.contains(&m.queue) {
            continue;
        }
        let during_run = match (m.sent_at, started_at) {
            (Some(sent), Some(start)) => sent >= start,
            // Without both times it cannot be shown to predate the run.
            _ => true,
        };
        if !during_run {
            continue;
        }
        // Sent during the run, but what it is about may still be shown not
        // to be the run's: counted, not flagged.
        if let Some(why) = not_the_runs(&m.body, scope, started_at) {
            *counts.entry(format!("stream_failure.{why}")).or_default() += 1;
            continue;
        }
        let sent = m.sent_at.and_then(|t| t.format(&Rfc3339).ok()).unwrap_or_else(|| "at an unknown time".into());
        flag("stream_failure", m.queue, format!("sent {sent}: {}", stream_failure_summary(&m.body)));
    }
}

/// How far the stream's arrival and creation times (another clock than
/// this machine's, and in whole seconds) must lie before the run's start
/// to show that a record predates it.
const STREAM_CLOCK_MARGIN: Duration = Duration::from_secs(5);

/// Why a stream failure message sent during the run is shown not to be the
/// run's, if it is: `before_run` when every record it covers reached the
/// stream before the run started (the on-failure record's last arrival, or
/// a set-aside record's creation time), `other_order` when it is a
/// set-aside record keyed by an order that is not the run's (the relay sees
/// order and refund rows only, each under `ORDER#<order id>`). None: it may
/// be the run's (it says too little to tell, or it is).
fn not_the_runs(body: &str, scope: &Scope, started_at: Option<OffsetDateTime>) -> Option<&'static str> {
    let parsed: Value = serde_json::from_str(body).ok()?;
    let before = |t: OffsetDateTime| started_at.is_some_and(|start| t + STREAM_CLOCK_MARGIN < start);
    let info = &parsed["DDBStreamBatchInfo"];
    if info.is_object() {
        let last = time_of(&info["approximateArrivalOfLastRecord"])?;
        return before(last).then_some("before_run");
    }
    let change = &parsed["dynamodb"];
    let created = change["ApproximateCreationDateTime"]
        .as_f64()
        .and_then(|s| OffsetDateTime::from_unix_timestamp_nanos((s * 1e9) as i128).ok())
        .or_else(|| time_of(&change["ApproximateCreationDateTime"]));
    if created.is_some_and(before) {
        return Some("before_run");
    }
    let order = change["Keys"]["pk"]["S"].as_str()?.strip_prefix("ORDER#")?;
    (!scope.orders.contains(order)).then_some("other_order")
}

/// What a stream failure message says: the on-failure record's condition,
/// shard and sequence range, or the start of the body if it is not one.
fn stream_failure_summary(body: &str) -> String {
    let parsed: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let info = &parsed["DDBStreamBatchInfo"];
    if info.is_object() {
        return format!(
            "{} ({}); shard {}, sequence numbers {}..{}, {} record(s), first arrived {}",
            parsed["requestContext"]["condition"].as_str().unwrap_or("?"),
            parsed["requestContext"]["functionArn"].as_str().unwrap_or("?"),
            info["shardId"].as_str().unwrap_or("?"),
            info["startSequenceNumber"].as_str().unwrap_or("?"),
            info["endSequenceNumber"].as_str().unwrap_or("?"),
            info["batchSize"],
            info["approximateArrivalOfFirstRecord"].as_str().unwrap_or("?"),
        );
    }
    body.chars().take(300).collect()
}

/// The relay-fails drill, checked by what a subscriber got and not only by
/// its effects: each of the drill's orders that is final had its final
/// event (OrderPaid or OrderClosed) delivered at least once.
fn check_final_events(
    records: &Records,
    scope: &Scope,
    flag: &mut impl FnMut(&'static str, &str, String),
    counts: &mut BTreeMap<String, i64>,
    skipped: &mut BTreeMap<&'static str, String>,
) {
    if scope.relay_orders.is_empty() {
        return;
    }
    let events = match &records.delivered_events {
        Ok(events) => events,
        Err(why) => {
            skipped.insert("final_event_undelivered", why.clone());
            return;
        }
    };
    let mut got: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for e in events {
        let Some(order) = e["detail"]["order_id"].as_str().filter(|o| scope.relay_orders.contains(*o)) else {
            continue;
        };
        let kind = e["detail-type"].as_str().unwrap_or("?");
        *counts.entry(format!("events.{kind}")).or_default() += 1;
        got.entry(order).or_default().push(kind);
    }
    // How far the relay had read when the emulator stopped: the latest
    // change before the stop whose event arrived. The stream is one shard
    // read in order, so a change at or before it was read too, and its
    // missing event is not the restart's doing (2 s for writers' clocks).
    let read_up_to = scope.restarted_at.and_then(|stop| {
        events.iter().filter_map(|e| time_of(&e["detail"]["occurred_at"])).filter(|t| *t <= stop).max()
    });
    for id in &scope.relay_orders {
        let Some(order) = records.orders.get(id).and_then(|r| r.order.as_ref()) else { continue };
        let want = match order["status"].as_str() {
            Some("PAID") => "OrderPaid",
            Some("CLOSED") => "OrderClosed",
            // Not final: `not_final` says so; no final event is due yet.
            _ => continue,
        };
        let kinds = got.get(id.as_str()).cloned().unwrap_or_default();
        let final_at = order["history"]
            .as_array()
            .and_then(|h| h.iter().rev().find(|e| e["to"].as_str() == order["status"].as_str()))
            .and_then(|e| time_of(&e["at"]));
        let lost_in_restart = match (scope.restarted_at, final_at) {
            (Some(stop), Some(at)) => {
                at <= stop
                    && stop - at <= RESTART_EVENT_LOSS_WINDOW
                    && read_up_to.is_none_or(|read| at + Duration::from_secs(2) > read)
            }
            _ => false,
        };
        if !kinds.contains(&want) && lost_in_restart {
            *counts.entry("events.lost_in_emulator_restart".into()).or_default() += 1;
        } else if !kinds.contains(&want) {
            flag(
                "final_event_undelivered",
                id,
                format!("{} but no {want} reached the subscriber queue (it got {kinds:?})", order["status"]),
            );
        }
    }
}

fn time_of(v: &Value) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(v.as_str()?, &Rfc3339).ok()
}

fn summary_of(entries: &[&Value]) -> String {
    let parts: Vec<String> = entries
        .iter()
        .map(|h| {
            format!(
                "{}→{} ({})",
                h["from"].as_str().unwrap_or("-"),
                h["to"].as_str().unwrap_or("?"),
                h["cause"].as_str().unwrap_or("")
            )
        })
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

// ---------------------------------------------------------------- queues

/// The stack's dead-letter queues (stack output names).
const DEAD_LETTER_QUEUES: [&str; 13] = [
    "CLOSE_DLQ_URL",
    "WAKEUP_DLQ_URL",
    "REFUND_DLQ_URL",
    "SWEEP_DLQ_URL",
    "STREAM_FAILURE_QUEUE_URL",
    "STREAM_DEAD_LETTER_QUEUE_URL",
    // The effect queues' (release, settle, wake-up scheduling) and the
    // bus's: a release or settle given up on lands here.
    "ORDER_PLACED_QUEUE_DLQ_URL",
    "ORDER_CLOSED_QUEUE_DLQ_URL",
    "ORDER_PAID_QUEUE_DLQ_URL",
    // The sweep's pending effects handed on and failed 10 receives.
    "PENDING_EFFECTS_QUEUE_DLQ_URL",
    "EVENT_DELIVERY_DLQ_URL",
    "RECONCILE_FAILURE_QUEUE_URL",
    // A day run's piece that failed 3 receives (its message names a day
    // and a run, never an order: counted, never the run's).
    "RECONCILE_PIECE_DLQ_URL",
];

/// The queues that hold stream failures: the relay mapping's on-failure
/// destination (a batch's shard and sequence numbers, never the record)
/// and the stream consumers' set-aside records.
const STREAM_FAILURE_QUEUES: [&str; 2] = ["STREAM_FAILURE_QUEUE_URL", "STREAM_DEAD_LETTER_QUEUE_URL"];

/// Reads each dead-letter queue's depth and peeks at its messages, for the
/// check to match them to the run (other traffic on the stack, a test that
/// plants a dead letter on purpose, is counted but is not the run's). The
/// messages are received with a zero visibility timeout, so they stay
/// where they are for the operator.
async fn dead_letters(stack: &Stack) -> Result<(Vec<DeadLetter>, BTreeMap<&'static str, i64>), String> {
    use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    let (mut letters, mut depths) = (Vec::new(), BTreeMap::new());
    for name in DEAD_LETTER_QUEUES {
        let Some(url) = stack.get_opt(name) else { continue };
        let depth = sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .map_err(|e| format!("reading the depth of {name}: {e}"))?
            .attributes
            .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages).cloned())
            .and_then(|d| d.parse::<i64>().ok())
            .unwrap_or(0);
        depths.insert(name, depth);
        if depth == 0 {
            continue;
        }
        let mut seen = BTreeSet::new();
        // Enough receives to meet every message about twice (10 per call).
        for _ in 0..(depth / 5 + 2).min(200) {
            let out = sqs
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(10)
                .visibility_timeout(0)
                .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
                .send()
                .await
                .map_err(|e| format!("peeking at {name}: {e}"))?;
            for m in out.messages.unwrap_or_default() {
                if !seen.insert(m.message_id.clone().unwrap_or_default()) {
                    continue;
                }
                let sent_at = m
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get(&MessageSystemAttributeName::SentTimestamp))
                    .and_then(|ms| ms.parse::<i128>().ok())
                    .and_then(|ms| OffsetDateTime::from_unix_timestamp_nanos(ms * 1_000_000).ok());
                letters.push(DeadLetter { queue: name, sent_at, body: m.body.unwrap_or_default() });
            }
        }
    }
    Ok((letters, depths))
}

/// The order events on the run's own subscriber queue (`relay-fails`):
/// received with a visibility timeout long enough to see each message once
/// in this pass and not deleted, so a later `--check` sees them again
/// while the queue exists. Bounded: the drill's orders have at most a few
/// events each.
async fn delivered_events(stack: &Stack, scope: &Scope) -> Result<Vec<Value>, String> {
    if scope.relay_orders.is_empty() {
        return Ok(Vec::new());
    }
    let Some(url) = &scope.event_queue_url else {
        return Err("the run has no subscriber queue on the order event bus (ORDER_EVENT_BUS_NAME is not among \
                    the stack's outputs): the drill was checked by its effects only"
            .into());
    };
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    let mut events = Vec::new();
    let mut seen = BTreeSet::new();
    // Up to four events an order (placed, final, a late payment's refund
    // requested and done) and duplicates; SQS may answer fewer than ten a
    // receive. The loop ends at the first empty answer, so the bound only
    // stops a queue that keeps filling.
    let bound = scope.relay_orders.len() * 8 + 10;
    for _ in 0..bound {
        let out = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .visibility_timeout(60)
            .wait_time_seconds(1)
            .send()
            .await
            .map_err(|e| format!("reading the run's subscriber queue {url}: {e} (it is deleted when the run ends)"))?;
        let messages = out.messages.unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        for m in messages {
            if seen.insert(m.message_id.clone().unwrap_or_default()) {
                events.push(serde_json::from_str(m.body.as_deref().unwrap_or("")).unwrap_or(Value::Null));
            }
        }
    }
    Ok(events)
}

// ---------------------------------------------------------------- reconcile

/// Runs the stack's reconciliation (the reconcile function, invoked through
/// the Lambda API) and turns what it reports about the run into violations.
async fn reconcile(stack: &Stack, scope: &Scope, v: &mut Verdict) -> Result<(), String> {
    let (Some(endpoint), Ok(function)) = (stack.get_opt("AWS_ENDPOINT_URL"), stack.get("RECONCILE_FUNCTION_NAME"))
    else {
        // On AWS the invocation needs real SigV4 credentials; the local
        // stack is what loadcheck runs against.
        v.counts.insert("reconcile.skipped".into(), 1);
        return Ok(());
    };
    let url = format!("{}/2015-03-31/functions/{function}/invocations", endpoint.trim_end_matches('/'));
    let body = b"{}".to_vec();
    let hs = vec![("content-type".to_owned(), "application/json".to_owned())];
    let mut req = reqwest::Client::new().post(&url).body(body.clone());
    for (k, val) in hs.iter().cloned().chain(system_tests::sigv4("POST", &url, &hs, &body, "lambda")) {
        req = req.header(k, val);
    }
    let text = req
        .send()
        .await
        .map_err(|e| format!("invoking {function}: {e}"))?
        .text()
        .await
        .map_err(|e| format!("reading the reconcile report: {e}"))?;
    let report: Value = serde_json::from_str(&text).map_err(|_| format!("reconcile answered {text}"))?;
    let Some(found) = report["discrepancies"].as_array() else {
        return Err(format!("reconcile answered without a report: {text}"));
    };
    for d in found {
        let Some(subject) = reconcile_subject(d, scope) else { continue };
        let kind = d["kind"].as_str().unwrap_or("?");
        *v.counts.entry(format!("reconcile.{kind}")).or_default() += 1;
        v.violations.push(Violation {
            invariant: "reconcile",
            subject,
            detail: format!("{kind}: {}", d["detail"].as_str().unwrap_or_default()),
        });
    }
    v.counts.insert("reconcile.orders_checked".into(), report["orders_checked"].as_i64().unwrap_or(0));
    Ok(())
}

/// What a reconcile discrepancy is about, if it is about the run: one of
/// its orders, or the record of one of its SKUs or coupons.
fn reconcile_subject(d: &Value, scope: &Scope) -> Option<String> {
    let order = d["order_id"].as_str().unwrap_or_default();
    let key = d["key"].as_str().unwrap_or_default();
    if scope.orders.contains(order) {
        return Some(order.to_owned());
    }
    let of_run = scope.skus.keys().any(|s| key == format!("SKU#{s}/STOCK"))
        || scope.coupons.iter().any(|c| key == format!("COUPON#{c}/COUPON"));
    of_run.then(|| key.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T0: &str = "2026-11-30T10:00:00.000Z";
    const T1: &str = "2026-11-30T10:00:20.000Z";
    const T2: &str = "2026-11-30T10:00:21.500Z";

    fn history(to: &str, at: &str) -> Value {
        json!([{"at": T0, "from": null, "to": "PENDING_PAYMENT", "cause": "created"},
               {"at": at, "from": "PENDING_PAYMENT", "to": to, "cause": "test"}])
    }

    /// A clean run: `paid` (coupon c1, paid by p1, 2 of sku A), `late`
    /// (closed, its late payment p2 refunded, 1 of A), `never` (closed,
    /// never paid, 1 of B, coupon c2 returned).
    pub(super) fn clean() -> (Records, Scope) {
        let mut r = Records::default();
        r.orders.insert(
            "paid".into(),
            OrderRecords {
                order: Some(json!({"status": "PAID", "expire_at": T1, "amount_total": 2000, "currency": "EUR",
                    "items": [{"sku": "A", "qty": 2, "unit_price": 1000}], "coupon_id": "c1",
                    "paid_by": "p1", "history": history("PAID", T0)})),
                reservations: vec![json!({"sku": "A", "qty": 2, "status": "CONFIRMED"})],
                coupon_locks: vec![json!({"coupon_id": "c1", "status": "USED"})],
                payments: vec![json!({"payment_id": "p1", "status": "SUCCEEDED", "amount": 2000})],
                refunds: vec![],
            },
        );
        r.orders.insert(
            "late".into(),
            OrderRecords {
                order: Some(json!({"status": "CLOSED", "expire_at": T1, "amount_total": 1000, "currency": "EUR",
                    "items": [{"sku": "A", "qty": 1, "unit_price": 1000}], "history": history("CLOSED", T2)})),
                reservations: vec![json!({"sku": "A", "qty": 1, "status": "RELEASED"})],
                coupon_locks: vec![],
                payments: vec![json!({"payment_id": "p2", "status": "SUCCEEDED", "amount": 1000})],
                refunds: vec![json!({"payment_id": "p2", "status": "REFUNDED", "amount": 1000})],
            },
        );
        r.orders.insert(
            "never".into(),
            OrderRecords {
                order: Some(json!({"status": "CLOSED", "expire_at": T1, "amount_total": 500, "currency": "EUR",
                    "items": [{"sku": "B", "qty": 1, "unit_price": 500}], "coupon_id": "c2",
                    "history": history("CLOSED", T2)})),
                reservations: vec![json!({"sku": "B", "qty": 1, "status": "RELEASED"})],
                coupon_locks: vec![json!({"coupon_id": "c2", "status": "AVAILABLE"})],
                payments: vec![],
                refunds: vec![],
            },
        );
        r.stocks.insert("A".into(), Some(json!({"available": 8, "reserved": 0, "sold": 2})));
        r.stocks.insert("B".into(), Some(json!({"available": 5, "reserved": 0, "sold": 0})));
        r.coupons.insert("c1".into(), Some(json!({"state": "USED"})));
        r.coupons.insert("c2".into(), Some(json!({"state": "AVAILABLE"})));
        r.ledger = vec![
            json!({"payment_id": "p1", "order_id": "paid", "status": "SUCCEEDED", "amount": 2000, "currency": "EUR", "refunded_amount": 0}),
            json!({"payment_id": "p2", "order_id": "late", "status": "SUCCEEDED", "amount": 1000, "currency": "EUR", "refunded_amount": 1000}),
        ];
        let scope = Scope {
            orders: ["paid", "late", "never"].map(String::from).into(),
            skus: [("A".to_owned(), 10), ("B".to_owned(), 5)].into(),
            coupons: ["c1", "c2"].map(String::from).into(),
            open_bound: Duration::from_secs(120),
            started_at: Some(at(T0)),
            relay_orders: ["paid", "late"].map(String::from).into(),
            restarted_at: None,
            event_queue_url: Some("lc-events".into()),
        };
        // What the queues hold in a clean run: dead letters from before it
        // or about someone else's order, and the drill's orders' events
        // (one delivered twice, as at-least-once allows).
        r.dlq_depths = [("STREAM_FAILURE_QUEUE_URL", 1), ("CLOSE_DLQ_URL", 1)].into();
        r.dead_letters = vec![
            DeadLetter {
                queue: "STREAM_FAILURE_QUEUE_URL",
                sent_at: Some(at("2026-11-30T09:00:00Z")),
                body: stream_failure_body(),
            },
            DeadLetter {
                queue: "CLOSE_DLQ_URL",
                sent_at: Some(at(T1)),
                body: json!({"order_id": "someone-elses"}).to_string(),
            },
        ];
        r.delivered_events = Ok(vec![
            event("OrderPlaced", "paid"),
            event("OrderPaid", "paid"),
            event("OrderPlaced", "late"),
            event("OrderClosed", "late"),
            event("OrderClosed", "late"),
            event("LatePaymentRefundRequested", "late"),
        ]);
        (r, scope)
    }

    pub(super) fn at(t: &str) -> OffsetDateTime {
        OffsetDateTime::parse(t, &Rfc3339).unwrap()
    }

    /// An order event as a subscriber's queue holds it (the EventBridge envelope).
    fn event(kind: &str, order: &str) -> Value {
        json!({"source": "order-expiry", "detail-type": kind, "detail": {"order_id": order, "event_id": "e"}})
    }

    /// The relay mapping's on-failure record: a batch's place in the
    /// stream, no order id.
    fn stream_failure_body() -> String {
        json!({
            "requestContext": {"condition": "RecordAgeExceeded", "functionArn": "arn:aws:lambda:us-east-1:0:function:relay"},
            "DDBStreamBatchInfo": {"shardId": "shardId-0001", "startSequenceNumber": "100", "endSequenceNumber": "104",
                "batchSize": 5, "approximateArrivalOfFirstRecord": "2026-11-30T09:58:00Z", "streamArn": "arn:stream"}
        })
        .to_string()
    }

    pub(super) fn now() -> OffsetDateTime {
        OffsetDateTime::parse("2026-11-30T10:10:00Z", &Rfc3339).unwrap()
    }

    /// The invariants `records` breaks, sorted and deduplicated.
    pub(super) fn broken(r: &Records, scope: &Scope) -> Vec<&'static str> {
        let set: BTreeSet<&'static str> = check(r, scope, now()).violations.iter().map(|v| v.invariant).collect();
        set.into_iter().collect()
    }

    fn order<'a>(r: &'a mut Records, id: &str) -> &'a mut Value {
        r.orders.get_mut(id).unwrap().order.as_mut().unwrap()
    }

    #[test]
    fn a_clean_run_breaks_nothing_and_reports_its_outcomes() {
        let (r, scope) = clean();
        let v = check(&r, &scope, now());
        assert_eq!(v.violations, vec![]);
        assert_eq!(v.counts["orders.PAID"], 1);
        assert_eq!(v.counts["orders.CLOSED"], 2);
        assert_eq!(v.counts["refunds.REFUNDED"], 1);
        let late = v.orders.iter().find(|o| o.order_id == "late").unwrap();
        assert_eq!(late.delay_ms(), Some(1500));
        assert_eq!(late.refunds, 1);
    }

    #[test]
    fn every_invariant_has_a_name_in_the_table() {
        let names: BTreeSet<&str> = INVARIANTS.iter().map(|(n, _)| *n).collect();
        assert_eq!(names.len(), INVARIANTS.len());
        // Outside the table and the tests, each name is reported somewhere.
        let src = include_str!("verify.rs");
        let code = &src[src
            .find("// ---------------------------------------------------------------- checking")
            .unwrap()..src.find("#[cfg(test)]").unwrap()];
        let stripe = include_str!("verify/at_stripe.rs");
        let code = format!("{code}{}", &stripe[..stripe.find("#[cfg(test)]").unwrap()]);
        for (name, _) in INVARIANTS {
            assert!(code.contains(&format!("\"{name}\"")), "{name} is never reported");
        }
    }

    #[test]
    fn an_order_paid_and_closed_in_its_history_is_two_final_transitions() {
        let (mut r, scope) = clean();
        order(&mut r, "paid")["history"]
            .as_array_mut()
            .unwrap()
            .push(json!({"at": T2, "from": "PENDING_PAYMENT", "to": "CLOSED", "cause": "a second closer"}));
        assert_eq!(broken(&r, &scope), ["final_transitions"]);
    }

    #[test]
    fn an_order_left_open_or_closing_is_not_final_and_past_the_bound() {
        let (mut r, scope) = clean();
        order(&mut r, "never")["status"] = json!("CLOSING");
        order(&mut r, "never")["history"] = json!([{"at": T0, "to": "PENDING_PAYMENT", "cause": "created"}]);
        assert_eq!(broken(&r, &scope), ["not_final", "open_past_bound"]);
        let mut wide = scope.clone();
        wide.open_bound = Duration::from_secs(3600);
        assert_eq!(broken(&r, &wide), ["not_final"]);
    }

    #[test]
    fn a_released_reservation_on_a_paid_order_is_caught_with_the_stock_it_broke() {
        let (mut r, scope) = clean();
        r.orders.get_mut("paid").unwrap().reservations[0]["status"] = json!("RELEASED");
        r.stocks.insert("A".into(), Some(json!({"available": 10, "reserved": 0, "sold": 0})));
        assert_eq!(broken(&r, &scope), ["released_on_paid"]);
        // The stock row still counting it sold no longer matches the orders.
        r.stocks.insert("A".into(), Some(json!({"available": 8, "reserved": 0, "sold": 2})));
        assert_eq!(broken(&r, &scope), ["released_on_paid", "stock_conservation"]);
    }

    #[test]
    fn a_closed_order_with_a_confirmed_reservation_or_used_coupon_is_caught() {
        let (mut r, scope) = clean();
        r.orders.get_mut("never").unwrap().coupon_locks[0]["status"] = json!("USED");
        let b = broken(&r, &scope);
        assert!(b.contains(&"confirmed_on_closed") && b.contains(&"coupon_conservation"), "{b:?}");
    }

    #[test]
    fn effects_still_pending_are_caught() {
        let (mut r, scope) = clean();
        r.orders.get_mut("never").unwrap().reservations[0]["status"] = json!("RESERVED");
        r.stocks.insert("B".into(), Some(json!({"available": 4, "reserved": 1, "sold": 0})));
        assert_eq!(broken(&r, &scope), ["effects_pending"]);
        let (mut r, scope) = clean();
        order(&mut r, "late")["due_shard"] = json!("FX#3");
        assert_eq!(broken(&r, &scope), ["effects_pending"]);
    }

    #[test]
    fn stock_that_does_not_add_up_is_caught() {
        let (mut r, scope) = clean();
        r.stocks.insert("B".into(), Some(json!({"available": 6, "reserved": 0, "sold": 0})));
        assert_eq!(broken(&r, &scope), ["stock_conservation"]);
        r.stocks.insert("B".into(), Some(json!({"available": -1, "reserved": 6, "sold": 0})));
        assert_eq!(broken(&r, &scope), ["stock_conservation", "stock_record"]);
        r.stocks.insert("B".into(), None);
        assert_eq!(broken(&r, &scope), ["stock_record"]);
    }

    #[test]
    fn a_coupon_used_by_nobody_or_left_locked_is_caught() {
        let (mut r, scope) = clean();
        r.coupons.insert("c2".into(), Some(json!({"state": "USED"})));
        assert_eq!(broken(&r, &scope), ["coupon_conservation"]);
        // Two paid orders both holding c1 USED.
        let (mut r2, scope2) = clean();
        r2.orders.get_mut("late").unwrap().coupon_locks = vec![json!({"coupon_id": "c1", "status": "USED"})];
        assert!(broken(&r2, &scope2).contains(&"coupon_conservation"));
        r.coupons.insert("c2".into(), Some(json!({"state": "LOCKED", "locked_by": "never"})));
        assert_eq!(broken(&r, &scope), ["coupon_left_locked"]);
    }

    #[test]
    fn a_late_success_without_its_refund_breaks_the_funds_identity() {
        let (mut r, scope) = clean();
        r.orders.get_mut("late").unwrap().refunds[0]["status"] = json!("REFUND_FAILED");
        r.ledger[1]["refunded_amount"] = json!(0);
        assert_eq!(broken(&r, &scope), ["funds_identity", "refund_unsettled", "success_unaccounted"]);
    }

    #[test]
    fn a_refund_of_the_paying_payment_is_caught() {
        let (mut r, scope) = clean();
        r.orders
            .get_mut("paid")
            .unwrap()
            .refunds
            .push(json!({"payment_id": "p1", "status": "REFUNDED", "amount": 2000}));
        r.ledger[0]["refunded_amount"] = json!(2000);
        assert_eq!(broken(&r, &scope), ["funds_identity", "success_unaccounted"]);
    }

    #[test]
    fn a_paid_order_the_channel_never_saw_paid_is_caught() {
        let (mut r, scope) = clean();
        r.ledger[0]["status"] = json!("FAILED");
        assert_eq!(broken(&r, &scope), ["funds_identity", "paid_without_success"]);
        let (mut r, scope) = clean();
        r.ledger[0]["amount"] = json!(1);
        assert_eq!(broken(&r, &scope), ["funds_identity", "paid_without_success"]);
    }

    #[test]
    fn a_channel_payment_the_order_does_not_know_is_caught() {
        let (mut r, scope) = clean();
        r.ledger.push(
            json!({"payment_id": "px", "order_id": "never", "status": "SUCCEEDED", "amount": 500, "currency": "EUR"}),
        );
        assert_eq!(broken(&r, &scope), ["funds_identity", "ledger_unknown_order", "success_unaccounted"]);
    }

    #[test]
    fn an_accepted_order_that_is_not_there_is_caught() {
        let (mut r, scope) = clean();
        r.orders.remove("never");
        assert_eq!(broken(&r, &scope), ["order_missing"]);
        let (mut r, scope) = clean();
        r.orders.get_mut("never").unwrap().order = None;
        assert_eq!(broken(&r, &scope), ["order_missing"]);
    }

    #[test]
    fn an_order_closed_long_after_its_expiry_was_open_past_the_bound() {
        // Final by the time the check reads it, but it sat open for ten
        // minutes first: a violation of the bound, not only a slow figure.
        let (mut r, scope) = clean();
        order(&mut r, "never")["history"] = history("CLOSED", "2026-11-30T10:10:20.000Z");
        assert_eq!(broken(&r, &scope), ["open_past_bound"]);
        let mut wide = scope.clone();
        wide.open_bound = Duration::from_secs(3600);
        assert_eq!(broken(&r, &wide), Vec::<&str>::new());
    }

    #[test]
    fn a_paid_order_missing_a_reservation_or_its_coupon_lock_is_caught() {
        // No reservation at all: the stock never gave the units, so every
        // count still adds up; only the order's own lines tell.
        let (mut r, scope) = clean();
        r.orders.get_mut("paid").unwrap().reservations.clear();
        r.stocks.insert("A".into(), Some(json!({"available": 10, "reserved": 0, "sold": 0})));
        assert_eq!(broken(&r, &scope), ["holdings_match_order"]);
        // A short one: 1 of the 2 units the line names.
        let (mut r, scope) = clean();
        r.orders.get_mut("paid").unwrap().reservations[0]["qty"] = json!(1);
        r.stocks.insert("A".into(), Some(json!({"available": 9, "reserved": 0, "sold": 1})));
        assert_eq!(broken(&r, &scope), ["holdings_match_order"]);
        // The discount without the coupon's lock: c1 still AVAILABLE.
        let (mut r, scope) = clean();
        r.orders.get_mut("paid").unwrap().coupon_locks.clear();
        r.coupons.insert("c1".into(), Some(json!({"state": "AVAILABLE"})));
        assert_eq!(broken(&r, &scope), ["holdings_match_order"]);
    }

    #[test]
    fn a_closed_order_whose_payment_is_still_undecided_is_caught() {
        let (mut r, scope) = clean();
        r.orders.get_mut("never").unwrap().payments =
            vec![json!({"payment_id": "p3", "status": "UNKNOWN", "amount": 500})];
        r.ledger.push(
            json!({"payment_id": "p3", "order_id": "never", "status": "PROCESSING", "amount": 500, "currency": "EUR"}),
        );
        assert_eq!(broken(&r, &scope), ["unknown_released"]);
        // Decided FAILED on both sides: a plain unpaid close.
        r.orders.get_mut("never").unwrap().payments[0]["status"] = json!("FAILED");
        r.ledger.last_mut().unwrap()["status"] = json!("FAILED");
        assert_eq!(broken(&r, &scope), Vec::<&str>::new());
    }

    #[test]
    fn reconcile_findings_about_the_runs_orders_skus_and_coupons_count() {
        let (_, scope) = clean();
        let about = |order: &str, key: &str| reconcile_subject(&json!({"order_id": order, "key": key}), &scope);
        assert_eq!(about("never", ""), Some("never".into()));
        assert_eq!(about("", "SKU#A/STOCK"), Some("SKU#A/STOCK".into()));
        // An undecodable coupon row of the run is the run's finding too.
        assert_eq!(about("", "COUPON#c1/COUPON"), Some("COUPON#c1/COUPON".into()));
        assert_eq!(about("someone-elses", "SKU#Z/STOCK"), None);
    }

    #[test]
    fn a_scope_with_nothing_in_it_cannot_pass() {
        let (_, scope) = clean();
        assert_eq!(scope_problem(&scope), None);
        let empty = Scope { orders: BTreeSet::new(), ..scope.clone() };
        assert!(scope_problem(&empty).is_some());
        let no_skus = Scope { skus: BTreeMap::new(), ..scope };
        assert!(scope_problem(&no_skus).is_some());
    }

    #[test]
    fn every_dead_letter_queue_of_the_stack_is_looked_into() {
        // Each queue output of the template that holds what was given up
        // on (…DlqUrl, …DeadLetterQueueUrl, …FailureQueueUrl), by its
        // stack.env name (infra/deploy.py's snake case).
        let template = include_str!("../../../template.yaml");
        let outputs = &template[template.find("\nOutputs:").expect("the template has outputs")..];
        let mut dlqs = Vec::new();
        for line in outputs.lines() {
            let Some(key) = line.strip_prefix("  ").and_then(|l| l.strip_suffix(':')) else { continue };
            if key.starts_with(' ')
                || !(key.ends_with("DlqUrl") || key.ends_with("DeadLetterQueueUrl") || key.ends_with("FailureQueueUrl"))
            {
                continue;
            }
            let mut env = String::new();
            for (i, c) in key.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    env.push('_');
                }
                env.push(c.to_ascii_uppercase());
            }
            dlqs.push(env);
        }
        assert!(dlqs.len() >= 6, "{dlqs:?}");
        for q in &dlqs {
            assert!(DEAD_LETTER_QUEUES.contains(&q.as_str()), "{q} is never looked into");
        }
    }

    #[test]
    fn an_unreadable_expiry_is_reported_not_skipped() {
        let (mut r, scope) = clean();
        order(&mut r, "never")["expire_at"] = json!("tomorrow");
        assert_eq!(broken(&r, &scope), ["record_undecodable"]);
    }

    #[test]
    fn a_stream_failure_sent_during_the_run_is_caught_with_what_it_says() {
        let (mut r, scope) = clean();
        r.dead_letters.push(DeadLetter {
            queue: "STREAM_FAILURE_QUEUE_URL",
            sent_at: Some(at(T2)),
            body: stream_failure_body(),
        });
        let v = check(&r, &scope, now());
        let found: Vec<&Violation> = v.violations.iter().collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].invariant, "stream_failure");
        assert_eq!(found[0].subject, "STREAM_FAILURE_QUEUE_URL");
        for said in ["RecordAgeExceeded", "shardId-0001", "100..104", "2026-11-30T10:00:21.5Z"] {
            assert!(found[0].detail.contains(said), "{said} in {}", found[0].detail);
        }
        // A set-aside stream record counts the same, even naming no order.
        let (mut r, scope) = clean();
        r.dead_letters.push(DeadLetter {
            queue: "STREAM_DEAD_LETTER_QUEUE_URL",
            sent_at: Some(at(T1)),
            body: json!({"eventName": "MODIFY", "dynamodb": {"Keys": {"pk": {"S": "SKU#A"}}}}).to_string(),
        });
        assert_eq!(broken(&r, &scope), ["stream_failure"]);
    }

    #[test]
    fn a_stream_failure_sent_during_the_run_about_records_from_before_it_is_not_the_runs() {
        // A batch given up on during the run whose last record reached the
        // stream before the run started (a stuck batch of earlier traffic,
        // retried until its age ran out) holds none of the run's records.
        let before = json!({
            "requestContext": {"condition": "RecordAgeExceeded", "functionArn": "arn:relay"},
            "DDBStreamBatchInfo": {"shardId": "shardId-0002", "startSequenceNumber": "7", "endSequenceNumber": "9",
                "batchSize": 3, "approximateArrivalOfFirstRecord": "2026-11-30T09:40:00Z",
                "approximateArrivalOfLastRecord": "2026-11-30T09:41:00Z"}
        });
        let (mut r, scope) = clean();
        r.dead_letters.push(DeadLetter {
            queue: "STREAM_FAILURE_QUEUE_URL",
            sent_at: Some(at(T2)),
            body: before.to_string(),
        });
        assert_eq!(broken(&r, &scope), Vec::<&str>::new());
        assert_eq!(check(&r, &scope, now()).counts["stream_failure.before_run"], 1);
        // The same batch reaching into the run (its last record arrived
        // after the start) may hold the run's events: caught.
        let mut reaching = before.clone();
        reaching["DDBStreamBatchInfo"]["approximateArrivalOfLastRecord"] = json!("2026-11-30T10:00:01Z");
        let (mut r, scope) = clean();
        r.dead_letters.push(DeadLetter {
            queue: "STREAM_FAILURE_QUEUE_URL",
            sent_at: Some(at(T2)),
            body: reaching.to_string(),
        });
        assert_eq!(broken(&r, &scope), ["stream_failure"]);
        // Arrival times are the stream's clock, not this machine's, and in
        // whole seconds: a last record a moment before the start still counts.
        let mut at_start = before;
        at_start["DDBStreamBatchInfo"]["approximateArrivalOfLastRecord"] = json!("2026-11-30T09:59:58Z");
        let (mut r, scope) = clean();
        r.dead_letters.push(DeadLetter {
            queue: "STREAM_FAILURE_QUEUE_URL",
            sent_at: Some(at(T2)),
            body: at_start.to_string(),
        });
        assert_eq!(broken(&r, &scope), ["stream_failure"]);
    }

    #[test]
    fn a_set_aside_stream_record_of_another_order_or_from_before_the_run_is_not_the_runs() {
        // The relay sees order and refund rows only, each keyed by its
        // order: a set-aside record names whose it is.
        let record = |pk: &str, created_s: i64| {
            json!({"eventName": "MODIFY", "dynamodb": {"ApproximateCreationDateTime": created_s,
                "Keys": {"pk": {"S": pk}, "sk": {"S": "ORDER"}}}})
            .to_string()
        };
        let start_s = at(T0).unix_timestamp();
        let set_aside =
            |body: String| DeadLetter { queue: "STREAM_DEAD_LETTER_QUEUE_URL", sent_at: Some(at(T2)), body };
        let (mut r, scope) = clean();
        r.dead_letters.push(set_aside(record("ORDER#someone-elses", start_s + 5)));
        r.dead_letters.push(set_aside(record("ORDER#late", start_s - 600)));
        assert_eq!(broken(&r, &scope), ["dead_letter"], "the run's order is still a dead letter of the run");
        let counts = check(&r, &scope, now()).counts;
        assert_eq!(counts["stream_failure.other_order"], 1);
        assert_eq!(counts["stream_failure.before_run"], 1);
        // One of the run's orders, written during the run: caught by both.
        let (mut r, scope) = clean();
        r.dead_letters.push(set_aside(record("ORDER#late", start_s + 5)));
        assert_eq!(broken(&r, &scope), ["dead_letter", "stream_failure"]);
    }

    #[test]
    fn without_a_recorded_start_the_runs_first_order_bounds_it() {
        // A scope.json from before the start was recorded: the earliest
        // created_at of the run's orders stands in for it.
        let (mut r, mut scope) = clean();
        scope.started_at = None;
        order(&mut r, "paid")["created_at"] = json!(T0);
        order(&mut r, "late")["created_at"] = json!(T1);
        assert_eq!(broken(&r, &scope), Vec::<&str>::new());
        r.dead_letters[0].sent_at = Some(at(T1));
        assert_eq!(broken(&r, &scope), ["stream_failure"]);
    }

    #[test]
    fn a_relay_fails_order_whose_final_event_never_arrived_is_caught() {
        let (mut r, scope) = clean();
        // `late` got its OrderPlaced (and a refund event) but no OrderClosed.
        r.delivered_events.as_mut().unwrap().retain(|e| e["detail-type"] != "OrderClosed");
        let v = check(&r, &scope, now());
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
        assert_eq!(v.violations[0].invariant, "final_event_undelivered");
        assert_eq!(v.violations[0].subject, "late");
        assert!(v.violations[0].detail.contains("OrderClosed"), "{}", v.violations[0].detail);
        // An OrderClosed for a PAID order is not its final event.
        let (mut r, scope) = clean();
        r.delivered_events.as_mut().unwrap().retain(|e| e["detail-type"] != "OrderPaid");
        r.delivered_events.as_mut().unwrap().push(event("OrderClosed", "paid"));
        assert_eq!(broken(&r, &scope), ["final_event_undelivered"]);
        // Orders outside the drill are not expected on the queue.
        let (r, scope) = clean();
        assert!(!scope.relay_orders.contains("never"));
        assert_eq!(check(&r, &scope, now()).counts["events.OrderClosed"], 2);
    }

    #[test]
    fn a_final_event_missing_for_an_order_final_just_before_the_emulator_restart_is_counted_apart() {
        let (mut r, mut scope) = clean();
        r.delivered_events.as_mut().unwrap().retain(|e| e["detail-type"] != "OrderClosed");
        // `late` became CLOSED at T2; the emulator stopped a minute later:
        // its unread stream record went with it.
        scope.restarted_at = Some(at(T2) + Duration::from_secs(60));
        let v = check(&r, &scope, now());
        assert_eq!(v.violations, vec![], "put down to the restart");
        assert_eq!(v.counts["events.lost_in_emulator_restart"], 1);
        // Final after the restart, or long before it: the relay had it. A violation.
        for stop in [at(T2) - Duration::from_secs(1), at(T2) + RESTART_EVENT_LOSS_WINDOW + Duration::from_secs(1)] {
            scope.restarted_at = Some(stop);
            assert_eq!(broken(&r, &scope), ["final_event_undelivered"], "restart at {stop}");
        }
        // An event of a change after `late`'s close arrived before the stop:
        // the relay had read past the close, so its missing event is real.
        scope.restarted_at = Some(at(T2) + Duration::from_secs(60));
        let mut later = event("OrderPlaced", "paid");
        later["detail"]["occurred_at"] = json!("2026-11-30T10:00:41.500Z");
        r.delivered_events.as_mut().unwrap().push(later);
        assert_eq!(broken(&r, &scope), ["final_event_undelivered"], "read past it");
    }

    #[test]
    fn a_subscriber_queue_that_could_not_be_read_is_skipped_not_passed() {
        let (mut r, scope) = clean();
        r.delivered_events = Err("no queue".into());
        let v = check(&r, &scope, now());
        assert_eq!(v.violations, vec![]);
        assert_eq!(v.skipped.get("final_event_undelivered").map(String::as_str), Some("no queue"));
    }

    #[test]
    fn an_order_holding_two_coupon_locks_is_caught() {
        let (mut r, scope) = clean();
        // `never` holds c2 (returned) and another coupon's lock, returned
        // too: every coupon count still adds up, only the rows tell.
        r.orders.get_mut("never").unwrap().coupon_locks.push(json!({"coupon_id": "c3", "status": "AVAILABLE"}));
        let v = check(&r, &scope, now());
        assert_eq!(broken(&r, &scope), ["coupon_locks_per_order"]);
        assert!(v.violations[0].detail.contains("c3"), "{}", v.violations[0].detail);
    }

    #[test]
    fn a_reservation_or_coupon_lock_with_an_unknown_status_is_caught() {
        let (mut r, scope) = clean();
        r.orders.get_mut("late").unwrap().reservations[0]["status"] = json!("RELEASING");
        assert_eq!(broken(&r, &scope), ["holding_status_unknown"]);
        let (mut r, scope) = clean();
        r.orders.get_mut("never").unwrap().coupon_locks[0]["status"] = json!("RETURNED");
        assert_eq!(broken(&r, &scope), ["holding_status_unknown"]);
        let (mut r, scope) = clean();
        r.orders.get_mut("never").unwrap().coupon_locks[0].as_object_mut().unwrap().remove("status");
        assert_eq!(broken(&r, &scope), ["holding_status_unknown"]);
    }

    #[test]
    fn a_dead_letter_naming_an_order_of_the_run_is_caught_whenever_it_was_sent() {
        let (mut r, scope) = clean();
        r.dead_letters.push(DeadLetter {
            queue: "ORDER_CLOSED_QUEUE_DLQ_URL",
            sent_at: None,
            body: json!({"order_id": "never", "trigger": "OrderClosed"}).to_string(),
        });
        assert_eq!(broken(&r, &scope), ["dead_letter"]);
    }

    /// `clean()` with the paid order also holding its unit of A's purchase
    /// limit, 300 points and an open-order slot, and the counters to match.
    fn clean_with_every_holding() -> (Records, Scope) {
        let (mut r, scope) = clean();
        let paid = r.orders.get_mut("paid").unwrap();
        paid.order.as_mut().unwrap()["points"] = json!(300);
        paid.reservations.extend([
            json!({"resource_type": "PURCHASE_LIMIT", "resource_key": "u1#A", "qty": 2, "status": "CONFIRMED"}),
            json!({"resource_type": "POINTS", "resource_key": "u1", "qty": 300, "status": "CONFIRMED"}),
            json!({"resource_type": "OPEN_ORDERS", "resource_key": "u1", "qty": 1, "status": "CONFIRMED"}),
        ]);
        r.stocks.get_mut("A").unwrap().as_mut().unwrap()["purchase_limit"] = json!(2);
        let key = |sk: &str| ("BUYER#u1".to_owned(), sk.to_owned());
        r.buyer_counters.insert(key("LIMIT#A"), Some(json!({"used": 2, "held": 0, "bought": 2})));
        r.buyer_counters
            .insert(key("POINTS"), Some(json!({"available": 700, "held": 0, "spent": 300, "credited": 1000})));
        r.buyer_counters.insert(key("OPEN_ORDERS"), Some(json!({"open": 0})));
        r.points_credits.insert("BUYER#u1".into(), vec![json!({"delta": 1000})]);
        (r, scope)
    }

    #[test]
    fn holdings_of_every_kind_that_agree_with_their_counters_break_nothing() {
        let (r, scope) = clean_with_every_holding();
        assert!(broken(&r, &scope).is_empty(), "{:?}", check(&r, &scope, now()).violations);
    }

    #[test]
    fn a_buyer_counter_that_disagrees_with_the_orders_is_caught() {
        let plant = |sk: &str, attr: &str, v: i64| {
            let (mut r, scope) = clean_with_every_holding();
            r.buyer_counters.get_mut(&("BUYER#u1".to_owned(), sk.to_owned())).unwrap().as_mut().unwrap()[attr] =
                json!(v);
            broken(&r, &scope)
        };
        assert_eq!(plant("LIMIT#A", "held", 1), ["buyer_counter"]);
        assert_eq!(plant("POINTS", "held", 5), ["buyer_counter"]);
        assert_eq!(plant("POINTS", "credited", 1100), ["buyer_counter"]);
        assert_eq!(plant("OPEN_ORDERS", "open", 1), ["buyer_counter"]);
        // Bought past the limit, every count agreeing.
        let (mut r, scope) = clean_with_every_holding();
        r.stocks.get_mut("A").unwrap().as_mut().unwrap()["purchase_limit"] = json!(1);
        assert_eq!(broken(&r, &scope), ["buyer_counter"]);
        // A points holding that is not the order's points.
        let (mut r, scope) = clean_with_every_holding();
        r.orders.get_mut("paid").unwrap().order.as_mut().unwrap()["points"] = json!(200);
        assert_eq!(broken(&r, &scope), ["holdings_match_order"]);
    }
}
