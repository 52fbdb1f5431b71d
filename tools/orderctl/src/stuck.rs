//! `orderctl stuck`: what the backstop has not finished, from the sparse
//! due index (never a scan; layout in
//! `docs/data-model.md#the-due-index-gsi-due-index-open-orders-and-pending-effects`):
//!
//! - `OPEN#n` entries past due: CLOSING orders past their lease (a closer
//!   died, or nobody resumed an unknown payment state) and PENDING_PAYMENT
//!   orders past `expire_at` by more than the sweep's grace (their wake-up
//!   was lost; the sweep sends a reminder);
//! - `FX#n` order entries past due: final orders whose stock or coupon is
//!   not settled yet;
//! - `FX#n` refund entries: every refund still REFUND_PENDING (the backlog),
//!   with the oldest age;
//! - every dead-letter queue's depth, with a peek at its messages.
//!
//! Each index entry is read back with `order_core`'s decoding; nothing is
//! written.

use crate::error::Result;
use crate::output::{age, print_json, spinner, table};
use crate::queues::{self, Depth};
use crate::settings::Stack;
use order_core::aws::dynamo::{DueShards, DynamoStore};
use order_core::domain::{CouponLockStatus, OrderStatus, RefundStatus, ReservationStatus, Timestamp};
use order_core::ports::{Clock, SystemClock, Unavailable};
use order_core::store::{DueEntry, DueIndex, DueItem, OrderStore, PaymentStore};
use serde::Serialize;
use serde_json::json;
use std::time::Duration;

#[derive(Debug, Clone, Serialize)]
pub struct OpenOrder {
    pub order_id: String,
    pub status: String,
    /// When it became due: `expire_at`, or the lease's end for CLOSING.
    pub due_at: String,
    pub overdue_seconds: u64,
    pub lease_owner: Option<String>,
    pub lease_resumes: Option<u32>,
    pub payment_attempts: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct PendingEffects {
    pub order_id: String,
    pub status: String,
    pub final_since: Option<String>,
    pub pending_seconds: Option<u64>,
    /// What it still holds: `2×sku-1 RESERVED`, `coupon c-1 LOCKED`.
    pub holds: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PendingRefund {
    pub order_id: String,
    pub payment_id: String,
    pub amount: i64,
    pub currency: String,
    pub age_seconds: u64,
    pub tries: u32,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ShardSummary {
    pub shard: String,
    pub entries: u64,
    pub oldest_due_at: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub now: String,
    pub shards_read: u32,
    pub closing_past_lease: Vec<OpenOrder>,
    /// Past `expire_at` by more than the sweep's grace: its wake-up did not
    /// close it, and the sweep has not either yet.
    pub open_past_expiry: Vec<OpenOrder>,
    /// Final orders that still have an `OPEN#` entry (written outside the
    /// store's transitions): the sweep sends them a reminder every run.
    pub open_entry_on_final_order: Vec<OpenOrder>,
    /// Past `expire_at` within the grace: the wake-up is normally on it.
    pub open_within_grace: usize,
    pub grace_seconds: u64,
    pub effects_pending: Vec<PendingEffects>,
    /// FX order entries not yet due (within the effects grace): normal.
    pub effects_settling: usize,
    pub refunds_pending: Vec<PendingRefund>,
    pub oldest_refund_age_seconds: Option<u64>,
    pub dead_letter_queues: Vec<Depth>,
    /// Every non-empty shard of the index, due or not: how many entries and
    /// the oldest `due_at` (what lowering `DueIndexShards` waits on:
    /// `docs/data-model.md#the-due-index-gsi-due-index-open-orders-and-pending-effects`).
    pub index_shards: Vec<ShardSummary>,
    /// Index keys this version does not know.
    pub unrecognised: Vec<String>,
}

impl Report {
    /// Anything an operator should look at.
    pub fn anything_stuck(&self) -> bool {
        !self.closing_past_lease.is_empty()
            || !self.open_past_expiry.is_empty()
            || !self.effects_pending.is_empty()
            || !self.open_entry_on_final_order.is_empty()
            || self.dead_letter_queues.iter().any(|d| d.visible > 0)
    }
}

pub async fn run(stack: &Stack, shards: Option<u32>, peek: i32, json_out: bool) -> Result<()> {
    // The sweep's grace (the template's default when the outputs do not
    // say): an order just past expire_at is being closed by its wake-up.
    let grace = stack.opt("SWEEP_GRACE_SECONDS").and_then(|n| n.parse().ok()).unwrap_or(30);
    let shard_count = match shards {
        Some(n) => n,
        None => stack.opt("DUE_INDEX_SHARDS_SWEEP").and_then(|n| n.parse().ok()).unwrap_or(16),
    };
    let client = aws_sdk_dynamodb::Client::new(&stack.sdk);
    let store = DynamoStore::new(client, stack.table()?)
        .with_shards(DueShards { count: shard_count, sweep_count: shard_count });
    let now = SystemClock.now();
    let pb = spinner(json_out, format!("reading {} due-index shards and the dead-letter queues", shard_count * 2));
    // Every FX entry (a refund stays in the index until it leaves
    // REFUND_PENDING, even before it is due): the backlog is all of them.
    let far = now.plus(Duration::from_secs(100 * 365 * 24 * 3600));
    let pages = futures_util::future::join_all(DueIndex::shards(&store).into_iter().map(|shard| {
        let store = &store;
        async move {
            let cutoff = if shard.starts_with("OPEN#") { now } else { far };
            all_entries(store, &shard, cutoff).await
        }
    }));
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    let depths = futures_util::future::join_all(queues::DLQS.iter().map(|d| queues::depth(&sqs, stack, d, peek)));
    let summaries = futures_util::future::join_all(
        DueIndex::shards(&store).into_iter().map(|shard| shard_summary(&store, shard, far)),
    );
    let (pages, depths, summaries) = futures_util::join!(pages, depths, summaries);
    let mut report = Report {
        now: now.to_string(),
        shards_read: shard_count,
        closing_past_lease: vec![],
        open_past_expiry: vec![],
        open_within_grace: 0,
        open_entry_on_final_order: vec![],
        grace_seconds: grace,
        effects_pending: vec![],
        effects_settling: 0,
        refunds_pending: vec![],
        oldest_refund_age_seconds: None,
        dead_letter_queues: depths,
        index_shards: summaries.into_iter().collect::<Result<Vec<_>>>()?.into_iter().flatten().collect(),
        unrecognised: vec![],
    };
    for entry in pages.into_iter().collect::<Result<Vec<_>>>()?.into_iter().flatten() {
        classify(&store, entry, now, &mut report).await?;
    }
    pb.finish_and_clear();
    report.closing_past_lease.sort_by_key(|o| std::cmp::Reverse(o.overdue_seconds));
    report.open_past_expiry.sort_by_key(|o| std::cmp::Reverse(o.overdue_seconds));
    report.refunds_pending.sort_by_key(|f| std::cmp::Reverse(f.age_seconds));
    report.oldest_refund_age_seconds = report.refunds_pending.first().map(|r| r.age_seconds);
    if json_out {
        let mut v = json!(report);
        v["anything_stuck"] = json!(report.anything_stuck());
        return print_json(&v);
    }
    print_human(&report);
    Ok(())
}

/// The shard's entry count (a COUNT query: keys only, nothing decoded) and
/// its oldest entry; `None` for an empty shard.
async fn shard_summary(store: &DynamoStore, shard: String, far: Timestamp) -> Result<Option<ShardSummary>> {
    use aws_sdk_dynamodb::types::{AttributeValue as Av, Select};
    let (mut entries, mut start) = (0u64, None);
    loop {
        let out = store
            .client()
            .query()
            .table_name(store.table())
            .index_name(order_core::aws::due_index::DUE_INDEX)
            .key_condition_expression("due_shard = :shard")
            .expression_attribute_values(":shard", Av::S(shard.clone()))
            .select(Select::Count)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| crate::error::CliError::aws("counting due-index entries", e))?;
        entries += out.count().max(0) as u64;
        start = out.last_evaluated_key().cloned();
        if start.is_none() {
            break;
        }
    }
    if entries == 0 {
        return Ok(None);
    }
    let oldest = store
        .due_page(&shard, far, 1, None)
        .await
        .map_err(Unavailable::from)?
        .entries
        .first()
        .map(|e| e.due_at.to_string());
    Ok(Some(ShardSummary { shard, entries, oldest_due_at: oldest }))
}

async fn all_entries(store: &DynamoStore, shard: &str, cutoff: Timestamp) -> Result<Vec<DueEntry>> {
    let mut entries = Vec::new();
    let mut start = None;
    loop {
        let page = store.due_page(shard, cutoff, 1000, start).await.map_err(Unavailable::from)?;
        entries.extend(page.entries);
        start = page.next;
        if start.is_none() {
            return Ok(entries);
        }
    }
}

async fn classify(store: &DynamoStore, entry: DueEntry, now: Timestamp, report: &mut Report) -> Result<()> {
    match entry.item {
        DueItem::Open(id) => {
            // Gone or moved on since the index was read: not stuck.
            let Some(o) = store.order(&id).await? else { return Ok(()) };
            let open = |due_at: Timestamp| OpenOrder {
                order_id: id.to_string(),
                status: o.status.as_str().to_owned(),
                due_at: due_at.to_string(),
                overdue_seconds: due_at.until(now).as_secs(),
                lease_owner: o.closing.as_ref().map(|l| l.owner.clone()),
                lease_resumes: o.closing.as_ref().map(|l| l.resumes),
                payment_attempts: o.payment_attempts,
            };
            match (o.status, &o.closing) {
                (OrderStatus::Closing, Some(l)) if l.lease_until <= now => {
                    report.closing_past_lease.push(open(l.lease_until))
                }
                (OrderStatus::Closing, None) => report.closing_past_lease.push(open(entry.due_at)),
                // Due at `expire_at`, or earlier when its buyer asked to cancel.
                (OrderStatus::PendingPayment, _)
                    if o.due_at().plus(Duration::from_secs(report.grace_seconds)) <= now =>
                {
                    report.open_past_expiry.push(open(o.due_at()))
                }
                (OrderStatus::PendingPayment, _) if o.due_at() <= now => report.open_within_grace += 1,
                // The write into a final status moves the entry to FX# or
                // drops it; one left behind means the record was written
                // some other way, and the sweep reminds it every run.
                (s, _) if s.is_final() => report.open_entry_on_final_order.push(open(entry.due_at)),
                _ => {}
            }
        }
        DueItem::OrderEffects(id) => {
            if entry.due_at > now {
                report.effects_settling += 1;
                return Ok(());
            }
            let Some(r) = store.order_record(&id).await? else { return Ok(()) };
            let mut holds: Vec<String> = r
                .reservations
                .iter()
                .filter(|res| res.status == ReservationStatus::Reserved)
                .map(|res| format!("{} RESERVED", res.label()))
                .collect();
            if let Some(l) = r.coupon_lock.as_ref().filter(|l| l.status == CouponLockStatus::Locked) {
                holds.push(format!("coupon {} LOCKED", l.coupon_id));
            }
            let final_since = r.order.status.is_final().then(|| r.order.history.last().map(|h| h.at)).flatten();
            report.effects_pending.push(PendingEffects {
                order_id: id.to_string(),
                status: r.order.status.as_str().to_owned(),
                final_since: final_since.map(|t| t.to_string()),
                pending_seconds: final_since.map(|t| t.until(now).as_secs()),
                holds,
            });
        }
        DueItem::Refund(order_id, payment_id) => {
            let Some(f) = store.refund(&order_id, &payment_id).await? else { return Ok(()) };
            if f.status != RefundStatus::RefundPending {
                return Ok(());
            }
            report.refunds_pending.push(PendingRefund {
                order_id: order_id.to_string(),
                payment_id: payment_id.to_string(),
                amount: f.amount,
                currency: f.currency.to_string(),
                age_seconds: f.created_at.until(now).as_secs(),
                tries: f.tries,
                last_error: f.last_error,
            });
        }
        DueItem::Unrecognised { pk, sk } => report.unrecognised.push(format!("{pk}/{sk}")),
    }
    Ok(())
}

fn print_human(r: &Report) {
    println!("as of {} ({} shards of each kind read)", r.now, r.shards_read);
    print_open(r);
    print_effects(r);
    print_refunds(r);
    println!();
    queues::print_depths(&r.dead_letter_queues);
    print_index(r);
    if !r.unrecognised.is_empty() {
        println!("\nindex keys this orderctl does not know: {}", r.unrecognised.join(", "));
    }
    if !r.anything_stuck() {
        println!("\nnothing stuck");
    }
}

fn secs(s: u64) -> String {
    age(Duration::from_secs(s))
}

/// The `OPEN#` part: CLOSING past its lease, PENDING_PAYMENT past its
/// grace, and final orders left in it.
fn print_open(r: &Report) {
    println!("\nCLOSING past its lease: {}", r.closing_past_lease.len());
    if !r.closing_past_lease.is_empty() {
        let mut t = table(&["order", "lease ended", "overdue", "lease owner", "takeovers", "attempts"]);
        for o in &r.closing_past_lease {
            t.add_row(vec![
                o.order_id.clone(),
                o.due_at.clone(),
                secs(o.overdue_seconds),
                o.lease_owner.clone().unwrap_or_default(),
                o.lease_resumes.unwrap_or(0).to_string(),
                o.payment_attempts.to_string(),
            ]);
        }
        println!("{t}");
    }
    println!(
        "\nPENDING_PAYMENT past expire_at + the sweep's grace ({}s): {} (and {} within it)",
        r.grace_seconds,
        r.open_past_expiry.len(),
        r.open_within_grace
    );
    if !r.open_past_expiry.is_empty() {
        let mut t = table(&["order", "expired at", "overdue", "attempts"]);
        for o in &r.open_past_expiry {
            t.add_row(vec![
                o.order_id.clone(),
                o.due_at.clone(),
                secs(o.overdue_seconds),
                o.payment_attempts.to_string(),
            ]);
        }
        println!("{t}");
    }
    if !r.open_entry_on_final_order.is_empty() {
        println!("\nfinal orders still in the OPEN part of the index: {}", r.open_entry_on_final_order.len());
        let mut t = table(&["order", "status", "due since"]);
        for o in &r.open_entry_on_final_order {
            t.add_row(vec![o.order_id.clone(), o.status.clone(), o.due_at.clone()]);
        }
        println!("{t}");
    }
}

fn print_effects(r: &Report) {
    println!(
        "\nfinal orders with effects pending past their grace: {} (and {} within it)",
        r.effects_pending.len(),
        r.effects_settling
    );
    if !r.effects_pending.is_empty() {
        let mut t = table(&["order", "status", "final since", "pending for", "still holds"]);
        for e in &r.effects_pending {
            t.add_row(vec![
                e.order_id.clone(),
                e.status.clone(),
                e.final_since.clone().unwrap_or_default(),
                e.pending_seconds.map(secs).unwrap_or_default(),
                e.holds.join(", "),
            ]);
        }
        println!("{t}");
    }
}

fn print_refunds(r: &Report) {
    println!(
        "\nrefunds pending: {}{}",
        r.refunds_pending.len(),
        r.oldest_refund_age_seconds.map(|s| format!(", oldest {}", secs(s))).unwrap_or_default()
    );
    if !r.refunds_pending.is_empty() {
        let mut t = table(&["order", "payment", "amount", "age", "tries", "last error"]);
        for f in &r.refunds_pending {
            t.add_row(vec![
                f.order_id.clone(),
                f.payment_id.clone(),
                format!("{} {}", f.amount, f.currency),
                secs(f.age_seconds),
                f.tries.to_string(),
                f.last_error.clone().unwrap_or_default(),
            ]);
        }
        println!("{t}");
    }
}

/// The due index's size by part, and its oldest entries.
fn print_index(r: &Report) {
    let (open, fx): (Vec<&ShardSummary>, Vec<&ShardSummary>) =
        r.index_shards.iter().partition(|s| s.shard.starts_with("OPEN#"));
    let oldest =
        |v: &[&ShardSummary]| v.iter().filter_map(|s| s.oldest_due_at.clone()).min().unwrap_or_else(|| "-".into());
    println!(
        "\ndue index: {} OPEN entries in {} shard(s) (oldest due {}), {} FX entries in {} shard(s) (oldest due {})",
        open.iter().map(|s| s.entries).sum::<u64>(),
        open.len(),
        oldest(&open),
        fx.iter().map(|s| s.entries).sum::<u64>(),
        fx.len(),
        oldest(&fx),
    );
}
