//! The reconcile function: read both sides, compare, report.

use crate::aws::dynamo::DynamoStore;
use crate::metrics;
use crate::ports::{ChannelStatement, Clock};
use crate::store::PaymentStore;
use crate::usecases::reconcile::{reconcile, Backlog, Bounds};
use lambda_runtime::Error;
use serde_json::Value;
use tracing::{info, warn};

/// `ledger` is the channel's side (the sandbox's ledger, Stripe's intents
/// and refunds of the statement window); without one only the local
/// cross-checks run. A row
/// that does not decode is reported, not fatal; only a store or ledger that
/// cannot be read fails the run (and raises the function's error alarm).
pub async fn run_reconcile(
    store: &DynamoStore,
    ledger: Option<&impl ChannelStatement>,
    bounds: &Bounds,
    clock: &dyn Clock,
) -> Result<Value, Error> {
    let snapshot = store.scan_snapshot().await?;
    let statement = match ledger {
        Some(l) => Some(l.statement(clock.now()).await?),
        None => None,
    };
    let report = reconcile(&snapshot, statement.as_ref(), bounds, clock.now());
    for (kind, count) in &report.counts {
        metrics::discrepancy(*kind).count(*count as u64);
    }
    let backlog = Backlog::of(&snapshot.orders, clock.now());
    metrics::OPEN_ORDERS.count(backlog.open_orders);
    metrics::OLDEST_OPEN_ORDER_SECONDS.duration(backlog.oldest_open);
    metrics::REFUNDS_PENDING.count(backlog.refunds_pending);
    if report.discrepancies.is_empty() {
        info!(
            orders = report.orders_checked,
            payments = report.payments_checked,
            stocks = report.stocks_checked,
            "reconciliation clean"
        );
    } else {
        warn!(count = report.discrepancies.len(), counts = ?report.counts, "reconciliation found discrepancies");
    }
    // One point per completed run: its absence (alarm ReconcileNotRunAlarm,
    // missing data breaching) is how a schedule that stopped firing, or runs
    // that keep failing, become visible. A failed run returns above and
    // emits nothing.
    metrics::RECONCILE_COMPLETED.count(1);
    Ok(serde_json::to_value(&report)?)
}
