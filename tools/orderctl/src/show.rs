//! `orderctl order show ID`: one order's whole story as a timeline.
//!
//! The records are the truth: the order's history (every status change with
//! its cause), its closing lease, the reminder notes, every payment attempt
//! with the evidence seen at the channel, refunds with their tries, the
//! reservations and the coupon lock with when each settled, and the
//! operators' checks. They are read with one Query of the order's partition
//! and decoded by `order_core`, as the functions do. The functions' log
//! lines that name the order (see [`crate::logs`]) are added after them:
//! they show which wake-ups and sweep reminders reached it.

use crate::error::{CliError, Result};
use crate::logs::{self, LogLine};
use crate::output::{name_of, print_json, spinner, table};
use crate::settings::Stack;
use aws_sdk_dynamodb::types::AttributeValue as Av;
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::{OrderId, Timestamp};
use order_core::store::{OrderRecord, OrderStore};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

/// One line of the timeline.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    pub at: String,
    /// `status`, `payment`, `evidence`, `refund`, `reservation`, `coupon`,
    /// `lease`, `reminder`, `check`, `order`.
    pub kind: String,
    pub what: String,
}

/// Times the store writes on the order's items that the domain types do not
/// carry: when a reservation or the lock settled, and the reminder notes.
#[derive(Debug, Default)]
pub struct ItemTimes {
    /// sk → attribute → value.
    by_sk: HashMap<String, HashMap<String, String>>,
}

impl ItemTimes {
    fn get(&self, sk: &str, attr: &str) -> Option<&str> {
        self.by_sk.get(sk).and_then(|m| m.get(attr)).map(String::as_str)
    }
}

pub async fn run(stack: &Stack, id: &str, with_logs: bool, json_out: bool) -> Result<()> {
    let order_id = OrderId::parse(id).map_err(|_| {
        CliError::new(
            format!("{id:?} is not an order id"),
            "order ids look like ord_…; copy one from the API or `orderctl stuck`",
        )
    })?;
    let client = aws_sdk_dynamodb::Client::new(&stack.sdk);
    let table_name = stack.table()?;
    let store = DynamoStore::new(client.clone(), table_name);
    let record = store.order_record(&order_id).await?.ok_or_else(|| {
        CliError::new(
            format!("order {order_id} is not in table {table_name}"),
            "check the id, and that --stack / --env-file point at the stack that took the order",
        )
    })?;
    let times = item_times(&client, table_name, &order_id).await?;
    let entries = timeline(&record, &times);
    let (log_lines, log_notes) = if with_logs {
        let since = record.order.created_at.minus(Duration::from_secs(60));
        let pb = spinner(json_out, "searching the functions' log groups for the order id (--no-logs skips this)");
        let found = logs::lines_naming(stack, order_id.as_str(), since, None).await;
        pb.finish_and_clear();
        found?
    } else {
        (Vec::new(), vec!["not read (--no-logs)".to_owned()])
    };
    if json_out {
        return print_json(&json!({
            "order": summary(&record),
            "timeline": entries,
            "reservations": record.reservations.iter().map(|r| {
                let mut v = order_core::handlers::views::holding_view(r, None);
                v["settled_at"] = json!(times.get(&r.sort_key(), "updated_at"));
                v
            }).collect::<Vec<_>>(),
            "coupon_lock": record.coupon_lock.as_ref().map(|l| json!({
                "coupon_id": l.coupon_id, "status": l.status, "reason": l.reason,
                "settled_at": times.get(&format!("RES#COUPON#{}", l.coupon_id), "ended_at"),
            })),
            "payments": record.payments,
            "refunds": record.refunds,
            "checks": record.order.checks,
            "logs": log_lines,
            "logs_unavailable": log_notes,
        }));
    }
    print_human(&record, &entries, &log_lines, &log_notes);
    Ok(())
}

async fn item_times(client: &aws_sdk_dynamodb::Client, table: &str, id: &OrderId) -> Result<ItemTimes> {
    let attrs = ["sk", "updated_at", "ended_at", "lazy_reminder_at", "early_reminder_until", "closed_at"];
    let mut times = ItemTimes::default();
    let mut start = None;
    loop {
        let out = client
            .query()
            .table_name(table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", Av::S(format!("ORDER#{id}")))
            .projection_expression(attrs.join(", "))
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| CliError::aws("reading the order's items", e))?;
        for item in out.items() {
            let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
            let Some(sk) = text("sk") else { continue };
            let found = attrs[1..].iter().filter_map(|a| text(a).map(|v| (a.to_string(), v))).collect();
            times.by_sk.insert(sk, found);
        }
        start = out.last_evaluated_key().cloned();
        if start.is_none() {
            return Ok(times);
        }
    }
}

fn money(amount: i64, currency: &impl std::fmt::Display) -> String {
    format!("{amount} {currency}")
}

/// Every dated fact of the order's records, oldest first.
pub fn timeline(r: &OrderRecord, times: &ItemTimes) -> Vec<Entry> {
    let mut tl = Timeline::default();
    order_entries(&mut tl, r, times);
    payment_entries(&mut tl, r);
    refund_entries(&mut tl, r);
    holding_entries(&mut tl, r, times);
    check_entries(&mut tl, r);
    // Stable: same-time facts keep the order they were pushed in (a
    // status change before the effects it caused).
    tl.0.sort_by(|a, b| a.at.cmp(&b.at));
    tl.0
}

/// The timeline's entries in the order they were found.
#[derive(Default)]
struct Timeline(Vec<Entry>);

impl Timeline {
    fn push(&mut self, at: &Timestamp, kind: &str, what: String) {
        self.0.push(Entry { at: at.to_string(), kind: kind.to_owned(), what });
    }
}

/// The order's own facts: placed, its window, the buyer's cancel, the
/// heads-up, every status change, the closing lease and the reminders.
fn order_entries(tl: &mut Timeline, r: &OrderRecord, times: &ItemTimes) {
    let o = &r.order;
    let lines: Vec<String> = o.items.iter().map(|l| format!("{}×{} @{}", l.qty, l.sku, l.unit_price)).collect();
    tl.push(
        &o.created_at,
        "order",
        format!(
            "placed by {}: {} = {}{}; window rule {}",
            o.user_id,
            lines.join(", "),
            money(o.amount_total, &o.currency),
            o.coupon_id.as_ref().map(|c| format!(", coupon {c}")).unwrap_or_default(),
            o.expiry_rule_version
        ),
    );
    tl.push(&o.expire_at, "order", "payment window ends (expire_at)".into());
    if let Some(at) = &o.cancel_requested_at {
        tl.push(at, "order", "the buyer asked to cancel (due from now)".into());
    }
    if let Some(at) = &o.expiring_soon_at {
        tl.push(at, "order", "noticed as expiring soon (OrderExpiringSoon published)".into());
    }
    for h in &o.history {
        let from = h.from.map(|s| s.as_str()).unwrap_or("(new)");
        tl.push(&h.at, "status", format!("{from} → {} (cause: {})", h.to.as_str(), h.cause));
    }
    if let Some(l) = &o.closing {
        tl.push(
            &l.started_at,
            "lease",
            format!("closing lease held by {} until {} (taken over {} time(s))", l.owner, l.lease_until, l.resumes),
        );
    }
    let note = |attr: &str| times.get("ORDER", attr).and_then(|t| Timestamp::parse(t).ok());
    if let Some(at) = note("lazy_reminder_at") {
        tl.push(&at, "reminder", "an overdue read sent a close reminder (lazy expiry; the latest one)".into());
    }
    if let Some(at) = note("early_reminder_until") {
        tl.push(&at, "reminder", "an early reminder was put back, due now (the latest one)".into());
    }
}

/// Every payment attempt and the evidence seen at its channel.
fn payment_entries(tl: &mut Timeline, r: &OrderRecord) {
    for p in &r.payments {
        tl.push(
            &p.created_at,
            "payment",
            format!(
                "attempt {} opened on {} for {} (now {}{})",
                p.payment_id,
                p.channel,
                money(p.amount, &p.currency),
                p.status.as_str(),
                p.channel_txn_id.as_ref().map(|t| format!(", channel txn {t}")).unwrap_or_default()
            ),
        );
        for e in &p.evidence {
            tl.push(
                &e.at,
                "evidence",
                format!(
                    "{}: {} says {}{}",
                    p.payment_id,
                    e.source,
                    e.status.as_str(),
                    e.detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default()
                ),
            );
        }
    }
}

/// Every refund: when it was asked for, and where it stands.
fn refund_entries(tl: &mut Timeline, r: &OrderRecord) {
    for f in &r.refunds {
        tl.push(
            &f.created_at,
            "refund",
            format!("refund of {} for {} requested: {}", f.payment_id, money(f.amount, &f.currency), f.reason),
        );
        let state = format!(
            "refund of {} is {} after {} tr{}{}{}",
            f.payment_id,
            name_of(&f.status),
            f.tries,
            if f.tries == 1 { "y" } else { "ies" },
            f.last_error.as_ref().map(|e| format!("; last error: {e}")).unwrap_or_default(),
            f.channel_refund_id.as_ref().map(|c| format!("; channel refund {c}")).unwrap_or_default()
        );
        if let Some(at) = f.refunded_at.or(f.updated_at) {
            tl.push(&at, "refund", state);
        }
    }
}

/// The reservations and the coupon lock, when each settled (at the order's
/// creation while not settled).
fn holding_entries(tl: &mut Timeline, r: &OrderRecord, times: &ItemTimes) {
    let o = &r.order;
    for res in &r.reservations {
        match times.get(&res.sort_key(), "updated_at").and_then(|t| Timestamp::parse(t).ok()) {
            Some(at) => tl.push(&at, "reservation", format!("{} {}", res.label(), name_of(&res.status))),
            None => {
                tl.push(&o.created_at, "reservation", format!("{} {} (not settled)", res.label(), name_of(&res.status)))
            }
        }
    }
    if let Some(l) = &r.coupon_lock {
        let sk = format!("RES#COUPON#{}", l.coupon_id);
        let reason = l.reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default();
        match times.get(&sk, "ended_at").and_then(|t| Timestamp::parse(t).ok()) {
            Some(at) => tl.push(&at, "coupon", format!("lock of {} ended {}{reason}", l.coupon_id, name_of(&l.status))),
            None => tl.push(&o.created_at, "coupon", format!("{} {} (not settled)", l.coupon_id, name_of(&l.status))),
        }
    }
}

/// The operators' checks.
fn check_entries(tl: &mut Timeline, r: &OrderRecord) {
    for c in &r.order.checks {
        tl.push(
            &c.at,
            "check",
            format!(
                "operator check by {}: found {}, outcome {}, now {}",
                c.by,
                c.found.as_str(),
                c.outcome,
                c.status.as_str()
            ),
        );
    }
}

fn summary(r: &OrderRecord) -> Value {
    let o = &r.order;
    json!({
        "order_id": o.order_id, "status": o.status, "version": o.version, "user_id": o.user_id,
        "amount_total": o.amount_total, "currency": o.currency, "created_at": o.created_at,
        "expire_at": o.expire_at, "payment_attempts": o.payment_attempts, "paid_by": o.paid_by,
        "cancel_requested_at": o.cancel_requested_at, "expiring_soon_at": o.expiring_soon_at,
    })
}

fn print_human(r: &OrderRecord, entries: &[Entry], log_lines: &[LogLine], log_notes: &[String]) {
    let o = &r.order;
    println!(
        "order {}  {}  version {}  {}  buyer {}",
        o.order_id,
        o.status.as_str(),
        o.version,
        money(o.amount_total, &o.currency),
        o.user_id
    );
    let mut t = table(&["at (UTC)", "kind", "what"]);
    for e in entries {
        t.add_row(vec![e.at.as_str(), e.kind.as_str(), e.what.as_str()]);
    }
    println!("{t}");
    println!("\nlog lines naming the order ({}):", log_lines.len());
    if !log_lines.is_empty() {
        let mut t = table(&["at (UTC)", "function", "level", "message", "fields"]);
        for l in log_lines {
            t.add_row(vec![&l.at, &l.function, &l.level, &l.message, &l.fields]);
        }
        println!("{t}");
    }
    for n in log_notes {
        println!("  logs of {n}");
    }
}
