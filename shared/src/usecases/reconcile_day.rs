//! Reconciliation by day and shard: the same checks as [`super::reconcile`],
//! cut into pieces whose cost follows one day's traffic, not the table's
//! history (docs/reconciliation.md).
//!
//! A run of day D over `p` pieces is one piece per shard `n < p` and one
//! catalog piece:
//! - shard `n` reads the reconcile-index partitions `D#m`, `m ≡ n (mod p)`
//!   (the orders and refunds that became final on D; the index always has
//!   [`RECONCILE_SHARDS`] partitions a day), the channel's lines opened on
//!   D of those orders, and the due-index partitions `OPEN#n`/`FX#n` (what
//!   is in flight now: bounded by the backlog), then each of those orders
//!   by a query of its own partition;
//! - the catalog piece reads the SKU rows listed in the reconcile index's
//!   catalog partition and their audit records, and compares each SKU's
//!   `reserved` with the orders in flight, all read by the one piece.
//!
//! Each piece stores a [`PartialReport`]; [`merge`] folds them into one
//! [`DayReport`] whatever order they ran in, and names the pieces missing.
//!
//! Which day a discrepancy belongs to: an order's or refund's on the day it
//! became final; a channel-side one (a success the order does not show) on
//! the day the payment was opened at the channel; a state left too long
//! (`order_open_past_expiry`, `refund_pending_stale`) on the day it crossed
//! its bound; the catalog's (`stock_*`) on every run, as of the run.

use super::reconcile::{
    channel_checks, count_kinds, local_checks, released_on_paid, supply_checks, undecodable, unknown_order, Bounds,
    Discrepancy, DiscrepancyKind, Ledger,
};
use crate::domain::points::{PointsBalance, PointsCredit};
use crate::domain::*;
use crate::ports::{ChannelStatement, Statement, Unavailable};
use crate::store::{DayIndex, DayRuns, DueCursor, IndexPage, OrderRecord, ReadCost, TableSnapshot};
use crate::usecases::refunds::REFUND_REDRIVE_AFTER;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;
use tracing::{info, instrument};

/// How far before the day the channel's window opens: an order that became
/// final on D usually had its payments opened its lifetime before (the
/// payment window plus the close, minutes to hours), so one day covers
/// them. A payment opened earlier still (a window over a day, a refund
/// that ended days after its payment) is read by a second statement of its
/// own (see `widen_statement`), back to at most [`STATEMENT_MAX_LOOKBACK`].
pub const STATEMENT_LOOKBACK: Duration = Duration::from_secs(86_400);

/// How far before the day a piece reads the channel at most: a statement
/// is a list of every payment opened in its window, so a refund ended a
/// month after its payment must not make one piece list a month of the
/// shop's payments. An order whose payment is older still is counted in
/// `orders_outside_statement` (the full read covers it).
pub const STATEMENT_MAX_LOOKBACK: Duration = Duration::from_secs(7 * 86_400);

/// Partitions of the reconcile index per day, fixed: an entry stays in its
/// partition for good, so the count the runs read must never drop below
/// the count any entry was written under. It is not the due index's
/// count, which an operator may lower once its old entries are gone.
pub const RECONCILE_SHARDS: u32 = 16;

/// The reconcile-index partition numbers shard piece `n` of `pieces` reads:
/// every partition `m ≡ n (mod pieces)`, so each is read by one piece
/// whatever the piece count.
pub fn day_partitions(n: u32, pieces: u32) -> impl Iterator<Item = u32> {
    (n..RECONCILE_SHARDS).step_by(pieces.max(1) as usize)
}

/// The piece of `pieces` that reads an order's reconcile entries and its
/// channel lines.
fn piece_of(order: &OrderId, pieces: u32) -> u32 {
    order.shard(RECONCILE_SHARDS) % pieces.max(1)
}

/// Entries per index query; a piece reads at most [`MAX_PAGES`] pages of a
/// partition, so its run is bounded whatever the day held.
pub const PAGE_LIMIT: u32 = 500;
/// 500 × 400 = 200,000 entries per partition: a day of
/// [`RECONCILE_SHARDS`] partitions covers 3.2 million final orders. Beyond it the piece fails, visibly, rather
/// than report a day it did not read whole.
pub const MAX_PAGES: u32 = 400;

/// One piece of a day's run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Piece {
    Shard(u32),
    Catalog,
}

impl Piece {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "catalog" => Some(Self::Catalog),
            _ => s.strip_prefix("shard-")?.parse().ok().map(Self::Shard),
        }
    }
}

impl std::fmt::Display for Piece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Shard(n) => write!(f, "shard-{n}"),
            Self::Catalog => f.write_str("catalog"),
        }
    }
}

/// The pieces of a day over `shards` shards (the due index's read count:
/// every shard any live record was written under, so every `OPEN#n` and
/// `FX#n` is read).
pub fn pieces(shards: u32) -> Vec<Piece> {
    (0..shards.max(1)).map(Piece::Shard).chain([Piece::Catalog]).collect()
}

/// A run of one day: the pieces it expects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DayRun {
    pub day: Day,
    /// Sorts as its start time: the latest run of a day is the last one.
    pub run_id: String,
    pub started_at: Timestamp,
    pub pieces: Vec<String>,
}

impl DayRun {
    pub fn new(day: Day, shards: u32, now: Timestamp, nonce: u32) -> Self {
        Self {
            day,
            run_id: format!("{now}-{nonce:08x}"),
            started_at: now,
            pieces: pieces(shards).iter().map(Piece::to_string).collect(),
        }
    }
}

/// What the shards found in flight when they read the due index (the
/// figures the full scan's run emitted: open orders, the oldest one's age,
/// refunds pending).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    pub open_orders: u64,
    pub oldest_open_seconds: u64,
    pub refunds_pending: u64,
}

impl InFlight {
    fn add(&mut self, other: InFlight) {
        self.open_orders += other.open_orders;
        self.oldest_open_seconds = self.oldest_open_seconds.max(other.oldest_open_seconds);
        self.refunds_pending += other.refunds_pending;
    }
}

/// What one piece found: counters and the discrepancies it owns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PartialReport {
    pub day: Option<Day>,
    pub run_id: String,
    pub piece: String,
    pub orders_checked: usize,
    pub payments_checked: usize,
    pub refunds_pending: usize,
    pub orders_outside_statement: usize,
    pub stocks_checked: usize,
    pub channel_checked: bool,
    pub discrepancies: Vec<Discrepancy>,
    pub backlog: InFlight,
    pub cost: ReadCost,
}

/// One report per day's run, merged from its pieces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DayReport {
    pub day: Day,
    pub run_id: String,
    pub started_at: Timestamp,
    /// Every expected piece reported.
    pub complete: bool,
    /// The pieces with no report (still running, or failed for good: their
    /// messages are in ReconcilePieceDLQ).
    pub pieces_missing: Vec<String>,
    pub orders_checked: usize,
    pub payments_checked: usize,
    pub refunds_pending: usize,
    pub orders_outside_statement: usize,
    pub stocks_checked: usize,
    /// True only when every piece that reported read a channel statement.
    pub channel_checked: bool,
    /// `stock_reserved_mismatch` is the catalog piece's: false while it is
    /// missing.
    pub stock_reserved_checked: bool,
    pub counts: BTreeMap<DiscrepancyKind, usize>,
    pub discrepancies: Vec<Discrepancy>,
    pub backlog: InFlight,
    pub cost: ReadCost,
}

/// Folds the pieces' reports of `run` into one. Parts are taken in piece
/// order, discrepancies sorted and deduplicated (a piece redelivered, or
/// an order reached both as final and through a channel line, counts
/// once), so the result does not depend on the order the pieces ran in.
pub fn merge(run: &DayRun, parts: &[PartialReport]) -> DayReport {
    let mut by_piece: BTreeMap<&str, &PartialReport> = BTreeMap::new();
    for p in parts.iter().filter(|p| p.run_id == run.run_id && run.pieces.contains(&p.piece)) {
        by_piece.entry(p.piece.as_str()).or_insert(p);
    }
    let missing: Vec<String> = run.pieces.iter().filter(|p| !by_piece.contains_key(p.as_str())).cloned().collect();
    let mut r = DayReport {
        day: run.day,
        run_id: run.run_id.clone(),
        started_at: run.started_at,
        complete: missing.is_empty(),
        pieces_missing: missing,
        orders_checked: 0,
        payments_checked: 0,
        refunds_pending: 0,
        orders_outside_statement: 0,
        stocks_checked: 0,
        channel_checked: !by_piece.is_empty(),
        stock_reserved_checked: by_piece.contains_key(Piece::Catalog.to_string().as_str()),
        counts: BTreeMap::new(),
        discrepancies: Vec::new(),
        backlog: InFlight::default(),
        cost: ReadCost::default(),
    };
    for p in by_piece.values() {
        r.orders_checked += p.orders_checked;
        r.payments_checked += p.payments_checked;
        r.refunds_pending += p.refunds_pending;
        r.orders_outside_statement += p.orders_outside_statement;
        r.stocks_checked += p.stocks_checked;
        r.channel_checked &= p.channel_checked;
        r.cost.add(p.cost);
        r.backlog.add(p.backlog);
        r.discrepancies.extend(p.discrepancies.iter().cloned());
    }
    r.discrepancies.sort_by(|a, b| {
        (a.kind, &a.order_id, &a.payment_id, &a.key, &a.detail).cmp(&(
            b.kind,
            &b.order_id,
            &b.payment_id,
            &b.key,
            &b.detail,
        ))
    });
    r.discrepancies.dedup();
    r.counts = count_kinds(&r.discrepancies);
    r
}

/// The SKUs whose `reserved` differs from the RESERVED units of the orders
/// in flight, with both figures. A SKU held by an order but not listed in
/// the catalog counts as reserved 0, as in the full scan.
fn reserved_differences(
    held: &BTreeMap<String, i64>,
    reserved: &BTreeMap<String, i64>,
) -> BTreeMap<String, (i64, i64)> {
    let skus: BTreeSet<&String> = held.keys().chain(reserved.keys()).collect();
    skus.into_iter()
        .map(|sku| (sku.clone(), (reserved.get(sku).copied().unwrap_or(0), held.get(sku).copied().unwrap_or(0))))
        .filter(|(_, (counted, sum))| counted != sum)
        .collect()
}

/// What a piece runs with.
pub struct DayPorts<'a, I: DayIndex, C: ChannelStatement> {
    pub index: &'a I,
    /// `None`: no channel configured, only the local checks run.
    pub channel: Option<&'a C>,
    pub bounds: Bounds,
    /// Shards of the due index to read (its read count).
    pub shards: u32,
}

/// Every key of a partition, page by page, at most [`MAX_PAGES`] pages.
async fn all_keys<F, Fut>(mut page: F, cost: &mut ReadCost) -> Result<Vec<(String, String)>, Unavailable>
where
    F: FnMut(Option<DueCursor>) -> Fut,
    Fut: std::future::Future<Output = Result<IndexPage, Unavailable>>,
{
    let (mut keys, mut start) = (Vec::new(), None);
    for _ in 0..MAX_PAGES {
        let p = page(start.take()).await?;
        cost.add(p.cost);
        keys.extend(p.keys);
        match p.next {
            Some(next) => start = Some(next),
            None => return Ok(keys),
        }
    }
    Err(Unavailable::new("read an index partition", format!("more than {MAX_PAGES} pages of {PAGE_LIMIT}")))
}

fn order_of(pk: &str) -> Option<OrderId> {
    pk.strip_prefix("ORDER#").and_then(|id| OrderId::parse(id).ok())
}

/// Runs one piece of `day`'s run `run` as of `now`.
#[instrument(skip_all, fields(day = %run.day, run_id = %run.run_id, piece = %piece))]
pub async fn run_piece<I: DayIndex, C: ChannelStatement>(
    ports: &DayPorts<'_, I, C>,
    run: &DayRun,
    piece: Piece,
    now: Timestamp,
) -> Result<PartialReport, Unavailable> {
    let mut part = match piece {
        Piece::Shard(n) => shard_piece(ports, run.day, n, now).await?,
        Piece::Catalog => catalog_piece(ports).await?,
    };
    part.day = Some(run.day);
    part.run_id = run.run_id.clone();
    part.piece = piece.to_string();
    info!(discrepancies = part.discrepancies.len(), items_read = part.cost.items, "piece reconciled");
    Ok(part)
}

/// The orders a shard piece looks at, by why it reads them.
struct ShardOrders {
    finals: BTreeSet<OrderId>,
    /// Orders of the day's channel lines not final that day.
    linked: BTreeSet<OrderId>,
    in_flight: BTreeSet<OrderId>,
}

async fn shard_orders<I: DayIndex>(
    index: &I,
    (day, n, shards): (Day, u32, u32),
    statement: Option<&Statement>,
    cost: &mut ReadCost,
) -> Result<ShardOrders, Unavailable> {
    let mut finals = BTreeSet::new();
    for m in day_partitions(n, shards) {
        let part = format!("{day}#{m}");
        let keys = all_keys(|s| index.reconcile_page(&part, PAGE_LIMIT, s), cost).await?;
        finals.extend(keys.iter().filter_map(|(pk, _)| order_of(pk)));
    }
    let in_flight = in_flight_orders(index, [n], cost).await?;
    let linked =
        day_lines(statement, day, n, shards).map(|l| l.order_id.clone()).filter(|id| !finals.contains(id)).collect();
    Ok(ShardOrders { finals, linked, in_flight })
}

/// The orders the due index holds in flight (`OPEN#n`, `FX#n`) in `shards`.
async fn in_flight_orders<I: DayIndex>(
    index: &I,
    shards: impl IntoIterator<Item = u32>,
    cost: &mut ReadCost,
) -> Result<BTreeSet<OrderId>, Unavailable> {
    let mut orders = BTreeSet::new();
    for n in shards {
        for shard in [format!("OPEN#{n}"), format!("FX#{n}")] {
            let keys = all_keys(|s| index.in_flight_page(&shard, PAGE_LIMIT, s), cost).await?;
            orders.extend(keys.iter().filter_map(|(pk, _)| order_of(pk)));
        }
    }
    Ok(orders)
}

/// The channel's lines opened on `day` whose order falls to piece `n` of
/// `shards`: each line is looked at by exactly one piece.
fn day_lines(
    statement: Option<&Statement>,
    day: Day,
    n: u32,
    shards: u32,
) -> impl Iterator<Item = &crate::ports::StatementLine> {
    statement
        .map(|s| s.lines.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(move |l| l.created_at.is_some_and(|at| day.holds(at)) && piece_of(&l.order_id, shards) == n)
}

/// Whether an in-flight record's overdue state crossed its bound on `day`.
fn crossed_on(d: &Discrepancy, r: &OrderRecord, bounds: &Bounds, day: Day) -> bool {
    match d.kind {
        DiscrepancyKind::OrderOpenPastExpiry => day.holds(r.order.expire_at.plus(bounds.open_past_expiry)),
        DiscrepancyKind::RefundPendingStale => r
            .refunds
            .iter()
            .filter(|f| d.payment_id.as_deref() == Some(f.payment_id.as_str()))
            .any(|f| day.holds(f.created_at.plus(REFUND_REDRIVE_AFTER))),
        _ => false,
    }
}

async fn shard_piece<I: DayIndex, C: ChannelStatement>(
    ports: &DayPorts<'_, I, C>,
    day: Day,
    n: u32,
    now: Timestamp,
) -> Result<PartialReport, Unavailable> {
    let statement = match ports.channel {
        Some(c) => Some(c.statement_between(day.start().minus(STATEMENT_LOOKBACK), day.end()).await?),
        None => None,
    };
    let mut part = PartialReport { channel_checked: statement.is_some(), ..Default::default() };
    let orders = shard_orders(ports.index, (day, n, ports.shards), statement.as_ref(), &mut part.cost).await?;
    // Each order once, however many reasons the piece has to read it.
    let ids: BTreeSet<&OrderId> = orders.finals.iter().chain(&orders.linked).chain(&orders.in_flight).collect();
    let ids: Vec<OrderId> = ids.into_iter().cloned().collect();
    let read = ports.index.order_records(&ids).await?;
    part.cost.add(read.cost);
    let records: HashMap<&OrderId, &OrderRecord> = read.records.iter().map(|r| (&r.order.order_id, r)).collect();
    let finals = orders.finals.iter().filter_map(|id| records.get(id).copied());
    let statement = match (statement, ports.channel) {
        (Some(s), Some(channel)) => Some(widen_statement(day, s, finals, channel).await?),
        (s, _) => s,
    };
    let mut out: Vec<Discrepancy> = read
        .undecodable
        .iter()
        .filter(|row| order_of(&row.pk).is_some_and(|id| orders.finals.contains(&id) || orders.linked.contains(&id)))
        .map(undecodable)
        .collect();
    let empty = Statement::default();
    let ledger = Ledger::of(statement.as_ref().unwrap_or(&empty));
    for r in orders.finals.iter().filter_map(|id| records.get(id)) {
        part.orders_checked += 1;
        let mut found = Vec::new();
        local_checks(r, &ports.bounds, now, &mut found);
        // An order final on D owns what its effects left behind; its
        // refunds' staleness is counted where the refund is in flight.
        found.retain(|d| d.kind != DiscrepancyKind::RefundPendingStale);
        released_on_paid(r, &mut found);
        let tally = channel_checks(r, &ledger, now, &mut found);
        part.payments_checked += tally.payments_checked;
        part.refunds_pending += usize::from(tally.refund_pending);
        part.orders_outside_statement += usize::from(tally.outside_statement);
        out.extend(found);
    }
    for r in orders.linked.iter().filter_map(|id| records.get(id)) {
        // Not final on D: only what a channel line of D can show about
        // an order that is not final yet.
        let mut found = Vec::new();
        channel_checks(r, &ledger, now, &mut found);
        out.extend(found.into_iter().filter(|d| d.kind == DiscrepancyKind::ChannelSuccessOrderUnpaid));
    }
    let known = |id: &OrderId| records.contains_key(id);
    out.extend(
        day_lines(statement.as_ref(), day, n, ports.shards).filter(|l| !known(&l.order_id)).filter_map(unknown_order),
    );
    for r in orders.in_flight.iter().filter_map(|id| records.get(id)) {
        let mut found = Vec::new();
        local_checks(r, &ports.bounds, now, &mut found);
        out.extend(found.into_iter().filter(|d| crossed_on(d, r, &ports.bounds, day)));
        part.backlog.add(in_flight(r, now));
    }
    if statement.is_none() {
        out.retain(|d| !d.kind.needs_channel());
    }
    part.discrepancies = out;
    Ok(part)
}

/// The day's statement with the lines of the payments its final orders
/// opened before it: an order paid or refunded on D whose payment was
/// opened before the statement's window (a window over a day, a refund
/// ended days later) is compared with the channel on D, not counted as
/// outside the statement. One more channel read, only when such an order
/// exists, of the window `[earliest, since)`, never further back than
/// [`STATEMENT_MAX_LOOKBACK`] before the day.
async fn widen_statement<'r, C: ChannelStatement>(
    day: Day,
    mut statement: Statement,
    finals: impl Iterator<Item = &'r OrderRecord>,
    channel: &C,
) -> Result<Statement, Unavailable> {
    let earliest = finals.flat_map(|r| r.payments.iter().map(|p| p.created_at)).min();
    let (Some(earliest), Some(since)) = (earliest, statement.since) else { return Ok(statement) };
    let earliest = earliest.max(day.start().minus(STATEMENT_MAX_LOOKBACK));
    if earliest >= since {
        return Ok(statement);
    }
    let older = channel.statement_between(earliest, since).await?;
    let known: BTreeSet<String> = statement.lines.iter().map(|l| l.payment_id.to_string()).collect();
    statement.lines.extend(older.lines.into_iter().filter(|l| !known.contains(&l.payment_id.to_string())));
    statement.since = Some(earliest);
    Ok(statement)
}

/// One in-flight record's share of the backlog.
fn in_flight(r: &OrderRecord, now: Timestamp) -> InFlight {
    let open = !r.order.status.is_final();
    InFlight {
        open_orders: u64::from(open),
        oldest_open_seconds: if open { r.order.created_at.until(now).as_secs() } else { 0 },
        refunds_pending: r.refunds.iter().filter(|f| f.status == RefundStatus::RefundPending).count() as u64,
    }
}

/// The SKUs listed in the catalog partition, each checked against its own
/// audit records (`stock_supply_mismatch`) and its `reserved` against the
/// RESERVED units of the orders in flight (`stock_reserved_mismatch`).
async fn catalog_piece<I: DayIndex, C: ChannelStatement>(
    ports: &DayPorts<'_, I, C>,
) -> Result<PartialReport, Unavailable> {
    // The catalog needs no channel: it never makes a run "local only".
    let mut part = PartialReport { channel_checked: true, ..Default::default() };
    let keys = all_keys(|s| ports.index.reconcile_page(CATALOG_PART, PAGE_LIMIT, s), &mut part.cost).await?;
    let skus: Vec<Sku> =
        keys.iter().filter_map(|(pk, _)| pk.strip_prefix("SKU#")).filter_map(|s| Sku::parse(s).ok()).collect();
    let mut snapshot = TableSnapshot::default();
    let mut reserved = BTreeMap::new();
    for sku in &skus {
        let entry = ports.index.catalog_entry(sku).await?;
        part.cost.add(entry.cost);
        snapshot.stock_changes.extend(entry.changes);
        if let Some(stock) = entry.stock {
            reserved.insert(stock.sku.to_string(), stock.reserved);
            snapshot.stocks.push(stock);
        }
    }
    part.stocks_checked = snapshot.stocks.len();
    supply_checks(&snapshot, &mut part.discrepancies);
    let held = held_in_flight(ports, &mut part.cost).await?;
    points_checked(ports, &held.points, &mut part).await?;
    let first = reserved_differences(&held.stock, &reserved);
    if first.is_empty() {
        return Ok(part);
    }
    // A create or a release moves a SKU's counter and its order's
    // reservation in one transaction, but this piece read the counters
    // before the orders: an order placed or released in between is a
    // difference of the moment. Read both again; what persists is real.
    for sku in skus.iter().filter(|s| first.contains_key(s.as_str())) {
        let entry = ports.index.catalog_entry(sku).await?;
        part.cost.add(entry.cost);
        reserved.insert(sku.to_string(), entry.stock.map_or(0, |s| s.reserved));
    }
    let second = reserved_differences(&held_in_flight(ports, &mut part.cost).await?.stock, &reserved);
    part.discrepancies.extend(second.into_iter().filter(|(sku, _)| first.contains_key(sku)).map(
        |(sku, (counted, sum))| Discrepancy {
            kind: DiscrepancyKind::StockReservedMismatch,
            order_id: String::new(),
            payment_id: None,
            key: Some(format!("SKU#{sku}/STOCK")),
            detail: format!("reserved {counted}, RESERVED reservations of orders in flight sum to {sum} (read twice)"),
        },
    ));
    Ok(part)
}

/// What the orders in flight hold: RESERVED units per SKU, RESERVED
/// points per buyer.
struct HeldInFlight {
    stock: BTreeMap<String, i64>,
    points: BTreeMap<String, i64>,
}

/// What every order in flight (all due-index shards) holds.
async fn held_in_flight<I: DayIndex, C: ChannelStatement>(
    ports: &DayPorts<'_, I, C>,
    cost: &mut ReadCost,
) -> Result<HeldInFlight, Unavailable> {
    let ids: Vec<OrderId> = in_flight_orders(ports.index, 0..ports.shards.max(1), cost).await?.into_iter().collect();
    let read = ports.index.order_records(&ids).await?;
    cost.add(read.cost);
    let mut stock = BTreeMap::new();
    for r in &read.records {
        let held = r.reservations.iter().filter(|x| x.status == ReservationStatus::Reserved);
        for res in held.filter(|x| x.resource_type == ResourceType::Stock) {
            *stock.entry(res.resource_key.clone()).or_default() += i64::from(res.qty);
        }
    }
    Ok(HeldInFlight { stock, points: crate::usecases::reconcile::points_held(read.records.iter()) })
}

/// Every points balance listed in the index's points partition, checked
/// against its credits and its `held` against the points the orders in
/// flight hold (`points_balance_mismatch`). A difference in `held` is read
/// again, balances and orders, before it is reported: an order placed or
/// released between the two reads is a difference of the moment.
async fn points_checked<I: DayIndex, C: ChannelStatement>(
    ports: &DayPorts<'_, I, C>,
    held: &BTreeMap<String, i64>,
    part: &mut PartialReport,
) -> Result<(), Unavailable> {
    let keys = all_keys(|s| ports.index.reconcile_page(POINTS_PART, PAGE_LIMIT, s), &mut part.cost).await?;
    let users: Vec<UserId> =
        keys.iter().filter_map(|(pk, _)| pk.strip_prefix("BUYER#")).filter_map(|u| UserId::parse(u).ok()).collect();
    let (balances, credits) = read_points(ports.index, &users, &mut part.cost).await?;
    let mut first = Vec::new();
    crate::usecases::reconcile::points_checks(&balances, &credits, held, &mut first);
    let moving: Vec<UserId> = first
        .iter()
        .filter(|d| d.detail.contains("the open orders hold"))
        .filter_map(|d| d.key.as_deref()?.strip_prefix("BUYER#")?.strip_suffix("/POINTS").map(str::to_owned))
        .filter_map(|u| UserId::parse(u).ok())
        .collect();
    // Differences with the credits are not of the moment: reported as read.
    part.discrepancies.extend(first.into_iter().filter(|d| !d.detail.contains("the open orders hold")));
    if moving.is_empty() {
        return Ok(());
    }
    let held_again = held_in_flight(ports, &mut part.cost).await?.points;
    let (balances, credits) = read_points(ports.index, &moving, &mut part.cost).await?;
    let mut second = Vec::new();
    let only: BTreeMap<String, i64> =
        held_again.into_iter().filter(|(u, _)| moving.iter().any(|m| m.as_str() == u)).collect();
    crate::usecases::reconcile::points_checks(&balances, &credits, &only, &mut second);
    part.discrepancies.extend(second.into_iter().filter(|d| d.detail.contains("the open orders hold")));
    Ok(())
}

/// The reconcile index's partition listing the catalog's SKU rows.
pub const CATALOG_PART: &str = "CATALOG#SKU";
/// The reconcile index's partition listing the buyers' points balances.
pub const POINTS_PART: &str = "CATALOG#POINTS";

/// The balances and credits of `users`.
async fn read_points<I: DayIndex>(
    index: &I,
    users: &[UserId],
    cost: &mut ReadCost,
) -> Result<(Vec<PointsBalance>, Vec<PointsCredit>), Unavailable> {
    let (mut balances, mut credits) = (Vec::new(), Vec::new());
    for user in users {
        let entry = index.points_entry(user).await?;
        cost.add(entry.cost);
        balances.extend(entry.balance);
        credits.extend(entry.credits);
    }
    Ok((balances, credits))
}

/// What storing a piece's report led to.
#[derive(Debug, Clone, PartialEq)]
pub enum PartStored {
    /// Stored; other pieces are still to report.
    Waiting { missing: usize },
    /// This was the last piece: the merged report, stored once.
    Complete(Box<DayReport>),
    /// The piece had reported before (a redelivery): nothing changed.
    AlreadyStored,
}

/// Stores a piece's report and, if it was the last one the run waited
/// for, the merged report. Two last pieces finishing together both merge
/// the same parts; the conditional put keeps one report.
///
/// A redelivered piece (its part stored before) merges too: the delivery
/// before it may have stored its part and failed to store the merged
/// report, and no other piece is left to store it.
pub async fn store_part<R: DayRuns>(runs: &R, run: &DayRun, part: &PartialReport) -> Result<PartStored, Unavailable> {
    let redelivered = runs.save_part(part).await? == crate::store::Cas::Rejected;
    let merged = merge(run, &runs.parts(run.day, &run.run_id).await?);
    if !merged.complete {
        return Ok(if redelivered {
            PartStored::AlreadyStored
        } else {
            PartStored::Waiting { missing: merged.pieces_missing.len() }
        });
    }
    match runs.save_report(&merged).await? {
        crate::store::Cas::Applied => Ok(PartStored::Complete(Box::new(merged))),
        crate::store::Cas::Rejected => Ok(PartStored::AlreadyStored),
    }
}

/// The day's report as it stands: merged from whatever pieces of the
/// run (the latest if `run_id` is `None`) have reported.
pub async fn day_report<R: DayRuns>(
    runs: &R,
    day: Day,
    run_id: Option<&str>,
) -> Result<Option<DayReport>, Unavailable> {
    let Some(run) = runs.day_run(day, run_id).await? else { return Ok(None) };
    Ok(Some(merge(&run, &runs.parts(day, &run.run_id).await?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> DayRun {
        DayRun::new(Day::parse("2026-12-02").unwrap(), 2, Timestamp::from_unix_millis(0), 1)
    }

    fn part(piece: &str, kinds: &[(&'static str, &str)]) -> PartialReport {
        PartialReport {
            day: Some(run().day),
            run_id: run().run_id,
            piece: piece.into(),
            orders_checked: kinds.len(),
            channel_checked: true,
            discrepancies: kinds
                .iter()
                .map(|(kind, order)| Discrepancy {
                    kind: DiscrepancyKind::parse(kind).unwrap(),
                    order_id: order.to_string(),
                    payment_id: None,
                    key: None,
                    detail: String::new(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn pieces_are_one_per_shard_and_the_catalog_and_read_back_from_their_names() {
        let names: Vec<String> = pieces(3).iter().map(Piece::to_string).collect();
        assert_eq!(names, ["shard-0", "shard-1", "shard-2", "catalog"]);
        assert!(names.iter().all(|n| Piece::parse(n).is_some_and(|p| p.to_string() == *n)));
        assert_eq!(Piece::parse("shard-x"), None);
    }

    #[test]
    fn every_day_partition_is_read_by_exactly_one_piece_whatever_the_piece_count() {
        for pieces in [1, 2, 3, 5, 8, 16, 17, 1000] {
            let mut read: Vec<u32> = (0..pieces).flat_map(|n| day_partitions(n, pieces)).collect();
            read.sort_unstable();
            assert_eq!(read, (0..RECONCILE_SHARDS).collect::<Vec<_>>(), "{pieces} pieces");
        }
        // An order's channel lines go to the piece that reads its entries.
        let id = OrderId::parse("ord_partition_check").unwrap();
        for pieces in [1, 3, 8, 1000] {
            let m = id.shard(RECONCILE_SHARDS);
            assert!(day_partitions(piece_of(&id, pieces), pieces).any(|x| x == m));
        }
    }

    #[test]
    fn the_merge_is_the_same_whatever_order_the_pieces_came_in() {
        let stock = ("stock_reserved_mismatch", "");
        let parts = [
            part("shard-0", &[("amount_mismatch", "o1"), ("funds_identity_violation", "o1")]),
            part("shard-1", &[("amount_mismatch", "o1"), ("refund_state_mismatch", "o2")]),
            part("catalog", &[stock]),
        ];
        let forward = merge(&run(), &parts);
        let mut reversed = parts.to_vec();
        reversed.reverse();
        assert_eq!(forward, merge(&run(), &reversed));
        assert!(forward.complete && forward.stock_reserved_checked);
        assert_eq!(forward.counts["amount_mismatch"], 1, "the same finding from two pieces counts once");
        assert_eq!(forward.counts["stock_reserved_mismatch"], 1);
    }

    #[test]
    fn a_missing_piece_is_named_and_the_stock_comparison_is_the_catalog_pieces() {
        let merged = merge(&run(), &[part("shard-0", &[]), part("catalog", &[])]);
        assert!(!merged.complete);
        assert_eq!(merged.pieces_missing, ["shard-1"]);
        assert!(merged.stock_reserved_checked, "the catalog piece compared the stock on its own");
        let merged = merge(&run(), &[part("shard-0", &[]), part("shard-1", &[])]);
        assert_eq!(merged.pieces_missing, ["catalog"]);
        assert!(!merged.stock_reserved_checked);
    }

    #[test]
    fn only_the_skus_whose_counter_and_holdings_differ_are_named() {
        let map = |v: &[(&str, i64)]| v.iter().map(|(k, n)| (k.to_string(), *n)).collect::<BTreeMap<_, _>>();
        let diff = reserved_differences(&map(&[("A", 2), ("C", 1)]), &map(&[("A", 2), ("B", 1)]));
        assert_eq!(diff, BTreeMap::from([("B".to_string(), (1, 0)), ("C".to_string(), (0, 1))]));
    }
}
