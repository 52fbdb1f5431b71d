//! The expiring-soon pass: once a minute, the open orders whose window ends
//! about `lead` from now are noticed, each with one conditional write; the
//! relay publishes `OrderExpiringSoon` from the notice on the stream.
//!
//! Why a pass over the due index rather than a second one-shot schedule per
//! order: Scheduler's invocation rate is the first AWS quota the close path
//! meets (BENCHMARKS.md, "Which quota binds first"); a schedule per notice
//! would spend it on reminders, and a message and an invocation per order
//! with it. The pass costs a handful of queries a minute whatever the order
//! rate, and per noticed order one write. Its precision (one minute) is
//! plenty for a reminder. The rules it applies are in
//! [`crate::domain::expiring_soon`]; the store's condition enforces them,
//! so two passes at once, or a pass repeated, still notice an order once.

use crate::domain::expiring_soon::{latest_created_for_notice, pass_range, PASS_PERIOD};
use crate::domain::{OrderId, Timestamp};
use crate::ports::{Clock, Unavailable};
use crate::store::{Cas, DueIndex, DueItem, ExpiringSoonNotices};
use futures_util::stream::{self, StreamExt};
use serde::Serialize;
use std::time::Duration;
use tracing::{info, instrument, warn};

#[derive(Debug, Clone)]
pub struct NoticeConfig {
    /// How long before `expire_at` the buyer is told; zero: never.
    pub lead: Duration,
    /// How often the pass runs (its schedule's rate).
    pub period: Duration,
    /// Index entries read per query.
    pub page: u32,
    /// When the run stops looking (the next run covers the rest: every
    /// order is in the range of two consecutive runs).
    pub budget: Duration,
    /// Notice writes in flight at once.
    pub in_flight: usize,
}

impl Default for NoticeConfig {
    fn default() -> Self {
        Self {
            lead: crate::domain::expiring_soon::DEFAULT_LEAD,
            period: PASS_PERIOD,
            page: 100,
            budget: Duration::from_secs(40),
            in_flight: 16,
        }
    }
}

/// What one run did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct NoticeReport {
    pub shards: usize,
    pub queries: usize,
    /// Open orders due in the run's range.
    pub seen: usize,
    /// Noticed by this run (each publishes one `OrderExpiringSoon`).
    pub noticed: usize,
    /// Refused by the store: noticed before, paid, closing or closed, a
    /// cancel asked, or a window under twice the lead.
    pub refused: usize,
    /// Writes that failed (the next run tries them again).
    pub failed: usize,
    /// Shards whose query failed (the others were still looked at; the
    /// next run tries again).
    pub shards_failed: usize,
    /// The run ran out of its budget before the last shard.
    pub out_of_time: bool,
}

#[instrument(skip_all, fields(lead_s = cfg.lead.as_secs()))]
pub async fn notice_expiring_soon<S: DueIndex + ExpiringSoonNotices>(
    store: &S,
    clock: &dyn Clock,
    cfg: &NoticeConfig,
) -> NoticeReport {
    let mut report = NoticeReport::default();
    if cfg.lead.is_zero() {
        return report;
    }
    let started = clock.now();
    let (after, through) = pass_range(started, cfg.lead, cfg.period);
    for shard in store.shards().into_iter().filter(|s| store.is_open_shard(s)) {
        if started.until(clock.now()) >= cfg.budget {
            report.out_of_time = true;
            warn!(shard, "expiring-soon pass out of time; the next run covers the rest");
            break;
        }
        report.shards += 1;
        // A shard that cannot be read does not keep the others from their
        // notices (the shards are always taken in the same order).
        match open_orders_due(store, &shard, after, through, cfg.page, &mut report).await {
            Ok(orders) => notice_each(store, clock, cfg, orders, &mut report).await,
            Err(e) => {
                warn!(shard, error = %crate::error::error_chain(&e), "shard not read; the next run tries again");
                report.shards_failed += 1;
            }
        }
    }
    info!(?report, %after, %through, "expiring-soon pass done");
    report
}

/// Every open order of `shard` due in `[after, through]`, with its due time.
async fn open_orders_due<S: ExpiringSoonNotices>(
    store: &S,
    shard: &str,
    after: Timestamp,
    through: Timestamp,
    page: u32,
    report: &mut NoticeReport,
) -> Result<Vec<(OrderId, Timestamp)>, Unavailable> {
    let mut orders = Vec::new();
    let mut start = None;
    loop {
        let got = store.due_between(shard, after, through, page, start).await?;
        report.queries += 1;
        orders.extend(got.entries.into_iter().filter_map(|e| match e.item {
            DueItem::Open(id) => Some((id, e.due_at)),
            _ => None,
        }));
        match got.next {
            Some(next) => start = Some(next),
            None => break,
        }
    }
    report.seen += orders.len();
    Ok(orders)
}

/// One conditional write per order. The due time is the order's
/// `expire_at` for an order waiting for payment (a cancel asked moves it,
/// and the write refuses such an order anyway).
async fn notice_each<S: ExpiringSoonNotices>(
    store: &S,
    clock: &dyn Clock,
    cfg: &NoticeConfig,
    orders: Vec<(OrderId, Timestamp)>,
    report: &mut NoticeReport,
) {
    let outcomes: Vec<_> = stream::iter(orders)
        .map(|(order_id, expire_at)| async move {
            let now = clock.now();
            let latest_created = latest_created_for_notice(expire_at, cfg.lead);
            let res = store.notice_expiring_soon(&order_id, expire_at, latest_created, now).await;
            (order_id, res)
        })
        .buffer_unordered(cfg.in_flight.max(1))
        .collect()
        .await;
    for (order_id, res) in outcomes {
        match res {
            Ok(Cas::Applied) => {
                info!(order_id = %order_id, "order noticed as expiring soon");
                report.noticed += 1;
            }
            Ok(Cas::Rejected) => report.refused += 1,
            Err(e) => {
                warn!(order_id = %order_id, error = %crate::error::error_chain(&e), "notice failed; the next run tries again");
                report.failed += 1;
            }
        }
    }
}
