//! The sweep (docs/design.md#backstop): the second trigger path.
//! A wake-up is a reminder, never the truth, and reminders get lost (a
//! schedule never created or deleted, a message dead-lettered, a stream
//! record skipped). Every run queries each shard of the due index for what
//! is overdue and re-drives it through the normal, idempotent use cases:
//!
//! - an open order past its due time → a close reminder (the close use case
//!   decides; the sweep writes no status);
//! - a final order whose stock or coupon is still held, or a refund still
//!   pending past its retry budget → a message on the effects queue, whose
//!   consumer runs release / settle / the refund re-drive (the sweep does not
//!   wait for them: a backlog of thousands is drained by as many consumer
//!   invocations as the queue's mapping allows, not one after another
//!   inside this run). A final order's entry is then moved ahead by the
//!   queue's visibility timeout, as a reminded open order's is, so the
//!   runs in between do not hand the same effect on again.
//!
//! With nothing due, a run costs one query per shard and the cursor read,
//! however large the table: the index only holds what is still to happen.
//! A run that runs out of time stores where each unfinished shard stopped;
//! the next run goes on from there. Two overlapping runs only send the same
//! reminders twice, which the use cases absorb.
//!
//! A run's work in flight is bounded however large the backlog:
//! [`SweepConfig::shards_at_once`] shards at a time, each with at most
//! [`SweepConfig::calls_per_shard`] calls (reminder and effect batches,
//! snoozes) at a time. A stored cursor the index refuses is dropped and its shard swept
//! from the top, so it cannot fail every run.

use crate::domain::{OrderId, Timestamp};
use crate::metrics;
use crate::ports::{Clock, PendingEffect, Redrive, Unavailable};
use crate::store::{Cas, DueCursor, DueEntry, DueIndex, DueItem, DuePageError, SweepCursors};
use futures_util::StreamExt;
use std::time::Duration;
use tracing::{info, instrument, warn};

#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// An open order is swept only this long after its due time, so that
    /// its own wake-up gets the first chance.
    pub grace: Duration,
    /// Entries read per query (the page size).
    pub page: u32,
    /// Time after which the run stops and stores its cursors; well under
    /// the function's timeout.
    pub budget: Duration,
    /// After a close reminder is sent, how long later runs leave the order
    /// to it (its index entry is moved that far ahead). Without it, every
    /// run re-sends a reminder for every order still waiting in a backlog
    /// of the close path, which only lengthens the backlog: 10,000 orders
    /// expiring within one minute on the local stack drew 23,305 such
    /// reminders, every one of which found its order already final. The
    /// default is the close queue's visibility timeout: a reminder taken
    /// and failed is redelivered by SQS after it anyway.
    pub remind_again_after: Duration,
    /// After a final order's pending effects are handed to the effects
    /// queue, how long later runs leave them to that message (the order's
    /// effects entry is moved that far ahead, as a reminded open order's
    /// is). Without it every run, once a minute, handed the same effect on
    /// again while its first message was still queued or in flight: a
    /// backlog of 100 effects that the consumer had not drained yet drew
    /// 300 messages in three runs. The default is the effects queue's
    /// visibility timeout (template.yaml, PendingEffectsQueue): a message
    /// taken and failed is redelivered by SQS after it anyway. The price:
    /// an effect that failed (an outage) is tried again that long after its
    /// hand-off, not at the next run, and each hand-off of an order's
    /// effects costs one conditional write more. A refund's entry is not
    /// moved: its re-drive pushes the refund's own budget.
    pub hand_off_again_after: Duration,
    /// Shards swept at the same time. With every shard at once (32), a
    /// backlog of 10,000 due orders put 16 pages × 100 snoozes in flight
    /// together: 1,600 writes, each on a fresh connection, from one small
    /// function (issue 16; on DynamoDB Local with the functions' client
    /// settings the run's first query then timed out and the run failed,
    /// saving no cursor). 4 keeps a run's fan-out small and still covers
    /// 32 shards in 8 rounds, each one query when nothing is due.
    pub shards_at_once: usize,
    /// Calls one shard has in flight at the same time: close reminders
    /// (one `SendMessageBatch` of 10 each) and snoozes. A run has at most
    /// `shards_at_once × calls_per_shard` = 32 calls in flight, so at most
    /// 32 connections to open; at ~10 ms a write that is still ~3,000
    /// entries a second, a backlog of 10,000 in a few seconds of a 40 s
    /// budget (the drain test prints the figures on DynamoDB Local).
    pub calls_per_shard: usize,
}

impl Default for SweepConfig {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(30),
            page: 100,
            budget: Duration::from_secs(40),
            remind_again_after: Duration::from_secs(180),
            hand_off_again_after: Duration::from_secs(180),
            shards_at_once: 4,
            calls_per_shard: 8,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SweepReport {
    pub shards: usize,
    pub queries: u32,
    pub items_read: u32,
    pub consumed_capacity: f64,
    pub open_found: u32,
    pub effects_found: u32,
    pub refunds_found: u32,
    pub unrecognised: u32,
    /// Open orders whose entry was moved ahead after their reminder was
    /// sent (`remind_again_after`).
    pub snoozed: u32,
    /// Final orders whose effects entry was moved ahead after their
    /// effects were handed on (`hand_off_again_after`).
    pub effects_snoozed: u32,
    /// How far past its due time the oldest overdue open order is.
    pub oldest_open_overdue: Duration,
    /// How long the oldest pending effect has been due.
    pub oldest_effect_overdue: Duration,
    /// Shards left unfinished (the run ran out of time); their cursors are
    /// stored for the next run.
    pub unfinished: Vec<String>,
    /// Re-drives that failed (retried by the next run: the entries stay).
    pub failures: u32,
    /// Stored cursors the index refused (see [`DuePageError::CursorRejected`]):
    /// dropped, their shard swept from the top.
    pub cursors_reset: u32,
}

impl SweepReport {
    pub fn found(&self) -> u32 {
        self.open_found + self.effects_found + self.refunds_found
    }
}

struct ShardRun {
    report: SweepReport,
    /// The run stopped before the shard's end.
    unfinished: bool,
    /// Where the next run continues (`None`: from the top).
    cursor: Option<DueCursor>,
}

#[instrument(skip_all)]
pub async fn sweep<I: DueIndex, R: Redrive>(
    index: &I,
    redrive: &R,
    clock: &dyn Clock,
    cfg: &SweepConfig,
) -> Result<SweepReport, Unavailable> {
    let started = clock.now();
    let deadline = started.plus(cfg.budget);
    let stored = index.sweep_cursors().await?;
    let shards = index.shards();
    let stored_ref = &stored;
    let mut runs: Vec<(usize, Result<ShardRun, Unavailable>)> = futures_util::stream::iter(shards.iter().enumerate())
        .map(|(i, shard)| async move {
            let start = stored_ref.shards.get(shard).cloned();
            (i, sweep_shard(index, redrive, clock, cfg, shard, start, started, deadline).await)
        })
        .buffer_unordered(cfg.shards_at_once.max(1))
        .collect()
        .await;
    runs.sort_by_key(|(i, _)| *i);
    let runs = runs.into_iter().map(|(_, run)| run);

    let mut report = SweepReport { shards: shards.len(), ..Default::default() };
    let mut cursors = SweepCursors { version: stored.version, ..Default::default() };
    let mut first_error = None;
    for (shard, run) in shards.iter().zip(runs) {
        let run = match run {
            Ok(run) => run,
            Err(e) => {
                // One shard that cannot be read keeps its stored cursor and
                // does not cost the other shards their progress.
                warn!(shard, error = %e, "shard not swept");
                if let Some(c) = stored.shards.get(shard) {
                    cursors.shards.insert(shard.clone(), c.clone());
                }
                first_error.get_or_insert(e);
                continue;
            }
        };
        merge(&mut report, run.report);
        if run.unfinished {
            report.unfinished.push(shard.clone());
        }
        if let Some(c) = run.cursor {
            cursors.shards.insert(shard.clone(), c);
        }
    }
    // Only a change is written: with nothing due and nothing unfinished the
    // run writes nothing at all.
    if cursors.shards != stored.shards && index.save_sweep_cursors(&cursors).await? == Cas::Rejected {
        // An overlapping run saved first; its cursors are as good as ours.
        warn!("another sweep run stored its cursors first");
    }
    if let Some(e) = first_error {
        // The run failed (alarm: the function's Errors, no SweepCompleted),
        // after saving what the other shards achieved.
        return Err(e);
    }
    info!(
        found = report.found(),
        open = report.open_found,
        effects = report.effects_found,
        refunds = report.refunds_found,
        queries = report.queries,
        items_read = report.items_read,
        consumed_capacity = report.consumed_capacity,
        unfinished = report.unfinished.len(),
        snoozed = report.snoozed,
        effects_snoozed = report.effects_snoozed,
        cursors_reset = report.cursors_reset,
        duration_ms = started.until(clock.now()).as_millis() as u64,
        "sweep done"
    );
    Ok(report)
}

/// Where the next run continues a shard: nowhere (from the top), or right
/// after a key.
type Resume = Option<DueCursor>;

#[allow(clippy::too_many_arguments)]
async fn sweep_shard<I: DueIndex, R: Redrive>(
    index: &I,
    redrive: &R,
    clock: &dyn Clock,
    cfg: &SweepConfig,
    shard: &str,
    mut start: Option<DueCursor>,
    now: Timestamp,
    deadline: Timestamp,
) -> Result<ShardRun, Unavailable> {
    let run = ShardSweep { index, redrive, clock, cfg, shard, now, deadline };
    let mut walk =
        ShardWalk { report: SweepReport::default(), last_done: start.clone(), first_failure: None, handled: 0 };
    // Open orders get the grace; an effects entry's due time already
    // includes its own.
    let cutoff = if index.is_open_shard(shard) { now.minus(cfg.grace) } else { now };
    loop {
        let page = match index.due_page(shard, cutoff, cfg.page, start.take()).await {
            Ok(page) => page,
            // Kept, a refused cursor would fail this shard, and the run,
            // every time. Once per shard and run: the query from the top
            // carries no cursor to refuse.
            Err(DuePageError::CursorRejected(e)) if walk.report.cursors_reset == 0 => {
                warn!(shard, error = %e, "stored sweep cursor refused by the index: dropped, shard swept from the top");
                walk.report.cursors_reset += 1;
                walk.last_done = None;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        walk.report.queries += 1;
        walk.report.items_read += page.entries.len() as u32;
        walk.report.consumed_capacity += page.consumed_capacity;
        let page_start = walk.last_done.clone();
        let work = walk.take_page(&run, &page.entries);
        walk.hand_on(&run, &work, page_start).await;
        let out_of_time = work.stopped_early || clock.now() >= deadline;
        match page.next {
            // The shard is done: the next run starts from the top, which
            // retries anything that failed on the way.
            None if !work.stopped_early => {
                return Ok(ShardRun { report: walk.report, unfinished: false, cursor: None })
            }
            next => {
                if out_of_time {
                    let resume = walk.first_failure.unwrap_or(walk.last_done);
                    return Ok(ShardRun { report: walk.report, unfinished: true, cursor: resume });
                }
                start = next;
            }
        }
    }
}

/// One shard's sweep in one run: what it works with.
struct ShardSweep<'a, I, R> {
    index: &'a I,
    redrive: &'a R,
    clock: &'a dyn Clock,
    cfg: &'a SweepConfig,
    shard: &'a str,
    /// The run's start: what it finds is counted overdue as of then.
    now: Timestamp,
    deadline: Timestamp,
}

/// How far one shard's sweep got.
struct ShardWalk {
    report: SweepReport,
    /// Where the next run must resume if this one stops early: right after
    /// the last entry handled, or, once something failed, right before the
    /// first failure (`first_failure`), so that a failed re-drive is
    /// retried by the very next run rather than after the cursor wraps
    /// around.
    last_done: Resume,
    first_failure: Option<Resume>,
    /// Entries handled so far.
    handled: u32,
}

/// What one page of a shard asks for: close reminders for its open orders,
/// hand-offs of its pending effects.
struct PageWork<'p> {
    close: Vec<&'p DueEntry>,
    effects: Vec<&'p DueEntry>,
    /// The run ran out of time before the page's end.
    stopped_early: bool,
}

impl ShardWalk {
    /// Takes a page's entries, counting each into the report, until the
    /// run is out of time.
    fn take_page<'p, I, R>(&mut self, run: &ShardSweep<'_, I, R>, entries: &'p [DueEntry]) -> PageWork<'p> {
        let mut work = PageWork { close: Vec::new(), effects: Vec::new(), stopped_early: false };
        let report = &mut self.report;
        for entry in entries {
            if self.handled > 0 && run.clock.now() >= run.deadline {
                // Out of time in the middle of a page: stop at this entry
                // (every run handles at least one, so a run always moves).
                work.stopped_early = true;
                break;
            }
            self.handled += 1;
            let overdue = entry.due_at.until(run.now);
            match &entry.item {
                DueItem::Open(_) => {
                    report.open_found += 1;
                    report.oldest_open_overdue = report.oldest_open_overdue.max(overdue);
                    work.close.push(entry);
                }
                DueItem::OrderEffects(_) => {
                    report.effects_found += 1;
                    report.oldest_effect_overdue = report.oldest_effect_overdue.max(overdue);
                    work.effects.push(entry);
                }
                DueItem::Refund(..) => {
                    report.refunds_found += 1;
                    report.oldest_effect_overdue = report.oldest_effect_overdue.max(overdue);
                    work.effects.push(entry);
                }
                DueItem::Unrecognised { pk, sk } => {
                    warn!(pk, sk, "unrecognised due-index entry left alone");
                    report.unrecognised += 1;
                }
            }
            self.last_done = Some(entry.key.clone());
        }
        work
    }

    /// Hands a page's work on: its pending effects to the effects queue,
    /// its open orders' close reminders to the close queue. A failure makes
    /// the next run resume from the page's start (`page_start`).
    async fn hand_on<I: DueIndex, R: Redrive>(
        &mut self,
        run: &ShardSweep<'_, I, R>,
        work: &PageWork<'_>,
        page_start: Resume,
    ) {
        let (report, now, cfg) = (&mut self.report, run.now, run.cfg);
        // Handed on, not driven: the entry stays in the index until the
        // consumer's use case settles it, so one the queue loses, or the
        // consumer cannot finish, is handed on again by a later run (once
        // `hand_off_again_after` has passed).
        if !work.effects.is_empty() {
            let unsent = hand_off_and_snooze(run.index, run.redrive, run.shard, &work.effects, now, cfg, report).await;
            if unsent > 0 {
                report.failures += unsent;
                self.first_failure.get_or_insert(page_start.clone());
            }
        }
        if !work.close.is_empty() {
            let (sent, unsent) = remind_all(run.redrive, &work.close, cfg.calls_per_shard).await;
            if unsent > 0 {
                report.failures += unsent;
                // Some of the page's reminders: resume from the page's start.
                self.first_failure.get_or_insert(page_start);
            }
            let until = now.plus(cfg.remind_again_after);
            let (moved, oldest) = snooze_all(run.index, run.shard, &sent, until, cfg.calls_per_shard).await;
            report.snoozed += moved;
            // Counted from the order's own due time: the entry's restarts
            // with every snooze, and an order reminded and left open must
            // still reach the overdue alarm.
            if let Some(due) = oldest {
                report.oldest_open_overdue = report.oldest_open_overdue.max(due.until(now));
            }
        }
    }
}

/// A re-drive with a time bound, so that one slow call (a throttled table,
/// a slow provider) cannot hold the whole run past the function's timeout.
/// `false` when it failed or took too long; the entry stays due.
async fn bounded<F: std::future::Future<Output = Result<(), Unavailable>>>(f: F, what: impl Fn() -> String) -> bool {
    match tokio::time::timeout(REDRIVE_TIMEOUT, f).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            warn!(error = %e, "{}: failed; the next run tries again", what());
            false
        }
        Err(_) => {
            warn!("{}: no answer within {REDRIVE_TIMEOUT:?}; the next run tries again", what());
            false
        }
    }
}

/// Close reminders for a page's open orders, one [`Redrive::close`] call
/// per `SendMessageBatch` (10 messages, the most SQS takes in one), at most
/// `at_once` of them in flight, each bounded in time. The entries whose
/// reminders were sent, and how many were not (their orders stay due).
async fn remind_all<'e, R: Redrive>(redrive: &R, entries: &[&'e DueEntry], at_once: usize) -> (Vec<&'e DueEntry>, u32) {
    in_batches(entries, at_once, |batch| async move {
        let ids: Vec<OrderId> = batch
            .iter()
            .filter_map(|e| if let DueItem::Open(id) = &e.item { Some(id.clone()) } else { None })
            .collect();
        let ok = bounded(redrive.close(&ids), || format!("close reminders for {} orders", ids.len())).await;
        if ok {
            log_found(&ids);
        }
        ok
    })
    .await
}

/// `entries` in batches of [`REMINDERS_PER_CALL`], one `send` each, at
/// most `at_once` in flight: the entries whose batch was sent, and how
/// many were not.
async fn in_batches<'s, 'e, F, Fut>(entries: &'s [&'e DueEntry], at_once: usize, send: F) -> (Vec<&'e DueEntry>, u32)
where
    F: Fn(&'s [&'e DueEntry]) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let batches: Vec<(bool, &[&DueEntry])> = futures_util::stream::iter(entries.chunks(REMINDERS_PER_CALL))
        .map(|batch| {
            let sent = send(batch);
            async move { (sent.await, batch) }
        })
        .buffer_unordered(at_once.max(1))
        .collect()
        .await;
    let (mut sent, mut unsent) = (Vec::new(), 0);
    for (ok, batch) in batches {
        if ok {
            sent.extend_from_slice(batch);
        } else {
            unsent += batch.len() as u32;
        }
    }
    (sent, unsent)
}

/// SQS's most messages in one `SendMessageBatch`.
const REMINDERS_PER_CALL: usize = 10;

/// A page's pending effects handed on, then the entries of the final
/// orders among them moved to `now + hand_off_again_after` (refunds keep
/// theirs: the re-drive pushes the refund's own budget, in the refund's
/// write). Counts the moves and the orders' own overdue time into
/// `report`; returns how many effects were not handed on (their entries
/// stay due).
async fn hand_off_and_snooze<I: DueIndex, R: Redrive>(
    index: &I,
    redrive: &R,
    shard: &str,
    effects: &[&DueEntry],
    now: Timestamp,
    cfg: &SweepConfig,
    report: &mut SweepReport,
) -> u32 {
    let (sent, unsent) = hand_off_all(redrive, effects, cfg.calls_per_shard).await;
    let orders: Vec<&DueEntry> = sent.into_iter().filter(|e| matches!(e.item, DueItem::OrderEffects(_))).collect();
    let until = now.plus(cfg.hand_off_again_after);
    let (moved, oldest) = snooze_all(index, shard, &orders, until, cfg.calls_per_shard).await;
    report.effects_snoozed += moved;
    // As for open orders: counted from the due time the order's final
    // write gave the entry, which a snooze does not restart, so an effect
    // that keeps failing still reaches the pending-effect alarm.
    if let Some(due) = oldest {
        report.oldest_effect_overdue = report.oldest_effect_overdue.max(due.until(now));
    }
    unsent
}

/// The effect an effects entry stands for.
fn pending_effect(entry: &DueEntry) -> Option<PendingEffect> {
    match &entry.item {
        DueItem::OrderEffects(id) => Some(PendingEffect::Order(id.clone())),
        DueItem::Refund(order_id, payment_id) => Some(PendingEffect::Refund(order_id.clone(), payment_id.clone())),
        DueItem::Open(_) | DueItem::Unrecognised { .. } => None,
    }
}

/// Pending effects onto the effects queue, one [`Redrive::effects`] call per
/// `SendMessageBatch` of 10, at most `at_once` in flight, each bounded in
/// time. The entries whose effects were handed on, and how many were not
/// (their entries stay due).
async fn hand_off_all<'e, R: Redrive>(
    redrive: &R,
    entries: &[&'e DueEntry],
    at_once: usize,
) -> (Vec<&'e DueEntry>, u32) {
    in_batches(entries, at_once, |batch| async move {
        let effects: Vec<PendingEffect> = batch.iter().filter_map(|e| pending_effect(e)).collect();
        let ok = bounded(redrive.effects(&effects), || format!("hand-off of {} pending effects", effects.len())).await;
        if ok {
            for effect in &effects {
                info!(order_id = %effect.order_id(), trigger = "sweep", outcome = "effect_handed_off", effect = ?effect, "pending effect handed to the effects queue");
            }
        }
        ok
    })
    .await
}

/// Moves the entries of orders just reminded (or whose effects were just
/// handed on) to `until`, at most `at_once` at a time: how many moved, and
/// the earliest own due time among them (see [`DueIndex::snooze`]). A move
/// that fails or is refused costs nothing but a message more at the next
/// run: the entry is where it was.
async fn snooze_all<I: DueIndex>(
    index: &I,
    shard: &str,
    entries: &[&DueEntry],
    until: Timestamp,
    at_once: usize,
) -> (u32, Option<Timestamp>) {
    let moved: Vec<_> = futures_util::stream::iter(entries)
        .map(|e| index.snooze(shard, e, until))
        .buffer_unordered(at_once.max(1))
        .collect()
        .await;
    let (mut count, mut oldest) = (0, None::<Timestamp>);
    for r in moved {
        match r {
            Ok(Some(due)) => {
                count += 1;
                oldest = Some(oldest.map_or(due, |o| o.min(due)));
            }
            Ok(None) => {}
            Err(e) => {
                warn!(error = %e, "a due-index entry was not moved ahead; the next run may hand it on again")
            }
        }
    }
    (count, oldest)
}

/// The longest one re-drive may take.
const REDRIVE_TIMEOUT: Duration = Duration::from_secs(10);

fn log_found(ids: &[OrderId]) {
    for id in ids {
        info!(order_id = %id, trigger = "sweep", outcome = "reminder_sent", "overdue open order: close reminder sent");
    }
}

fn merge(into: &mut SweepReport, r: SweepReport) {
    into.queries += r.queries;
    into.items_read += r.items_read;
    into.consumed_capacity += r.consumed_capacity;
    into.open_found += r.open_found;
    into.effects_found += r.effects_found;
    into.refunds_found += r.refunds_found;
    into.unrecognised += r.unrecognised;
    into.snoozed += r.snoozed;
    into.effects_snoozed += r.effects_snoozed;
    into.failures += r.failures;
    into.cursors_reset += r.cursors_reset;
    into.oldest_open_overdue = into.oldest_open_overdue.max(r.oldest_open_overdue);
    into.oldest_effect_overdue = into.oldest_effect_overdue.max(r.oldest_effect_overdue);
}

/// The backstop's figures as metrics (docs/design.md#observability): what
/// a run found (should stay near 0), how old the oldest overdue things are,
/// and that the run completed (the "sweep not running" alarm watches this).
pub fn emit_metrics(report: &SweepReport, duration: Duration) {
    metrics::SWEEP_FOUND_OPEN.count(u64::from(report.open_found));
    metrics::SWEEP_FOUND_EFFECTS.count(u64::from(report.effects_found));
    metrics::SWEEP_FOUND_REFUNDS.count(u64::from(report.refunds_found));
    metrics::OLDEST_OVERDUE_OPEN_ORDER_SECONDS.duration(report.oldest_open_overdue);
    metrics::OLDEST_PENDING_EFFECT_SECONDS.duration(report.oldest_effect_overdue);
    metrics::SWEEP_DURATION.duration(duration);
    metrics::SWEEP_UNFINISHED_SHARDS.count(report.unfinished.len() as u64);
    metrics::SWEEP_CURSORS_RESET.count(u64::from(report.cursors_reset));
    metrics::SWEEP_COMPLETED.count(1);
}
