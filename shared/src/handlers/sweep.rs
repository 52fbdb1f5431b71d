//! The sweep's scheduled trigger: run, emit the backstop metrics, answer
//! with the report (what a manual `aws lambda invoke` prints).

use crate::aws::seconds_env;
use crate::metrics;
use crate::ports::{Clock, Redrive};
use crate::store::{DueIndex, PaymentStore};
use crate::usecases::sweep::{emit_metrics, sweep, SweepConfig};
use serde_json::{json, Value};

/// `SWEEP_GRACE_SECONDS`, `SWEEP_REMIND_AGAIN_SECONDS`, `SWEEP_BUDGET_SECONDS`,
/// `SWEEP_PAGE_SIZE`; each
/// optional, defaults in [`SweepConfig::default`].
pub fn config_from_env() -> Result<SweepConfig, lambda_runtime::Error> {
    let mut cfg = SweepConfig::default();
    if std::env::var("SWEEP_GRACE_SECONDS").is_ok() {
        cfg.grace = seconds_env("SWEEP_GRACE_SECONDS")?;
    }
    if std::env::var("SWEEP_REMIND_AGAIN_SECONDS").is_ok() {
        cfg.remind_again_after = seconds_env("SWEEP_REMIND_AGAIN_SECONDS")?;
    }
    if std::env::var("SWEEP_BUDGET_SECONDS").is_ok() {
        cfg.budget = seconds_env("SWEEP_BUDGET_SECONDS")?;
    }
    if let Ok(v) = std::env::var("SWEEP_PAGE_SIZE") {
        cfg.page = v
            .parse()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| format!("SWEEP_PAGE_SIZE must be a whole number from 1 to 1000, got {v:?}"))?;
    }
    Ok(cfg)
}

pub async fn run_sweep<I: DueIndex + PaymentStore, R: Redrive>(
    index: &I,
    redrive: &R,
    clock: &dyn Clock,
    cfg: &SweepConfig,
) -> Result<Value, lambda_runtime::Error> {
    let started = clock.now();
    // A failure to read the index fails the invocation: the Errors metric
    // and the missing SweepCompleted point both show it.
    let report = sweep(index, redrive, clock, cfg).await;
    // Counted whatever became of the run: the alarm on refunds waiting for
    // a person must not go quiet while the sweep keeps failing.
    let refunds_failed = count_failed_refunds(index).await;
    let report = report?;
    let duration = started.until(clock.now());
    emit_metrics(&report, duration);
    Ok(json!({
        "refunds_failed": refunds_failed,
        "shards": report.shards,
        "queries": report.queries,
        "items_read": report.items_read,
        "consumed_capacity": report.consumed_capacity,
        "open_found": report.open_found,
        "effects_found": report.effects_found,
        "refunds_found": report.refunds_found,
        "unrecognised": report.unrecognised,
        "failures": report.failures,
        "cursors_reset": report.cursors_reset,
        "oldest_open_overdue_seconds": report.oldest_open_overdue.as_secs_f64(),
        "oldest_effect_overdue_seconds": report.oldest_effect_overdue.as_secs_f64(),
        "unfinished_shards": report.unfinished,
        "duration_ms": duration.as_millis() as u64,
    }))
}

/// The refunds given up on and not yet resolved, as a metric every run
/// (0 included), so that their alarm is raised while one exists and clears
/// when the last is resolved. A failed read is logged and leaves the
/// metric out for this run: the alarm keeps its state.
async fn count_failed_refunds<S: PaymentStore>(store: &S) -> Option<usize> {
    match store.failed_refunds().await {
        Ok(failed) => {
            for (order_id, payment_id) in &failed {
                tracing::warn!(%order_id, %payment_id, "refund REFUND_FAILED, waiting for a person (runbook: RefundsFailedAlarm)");
            }
            metrics::REFUNDS_FAILED.count(failed.len() as u64);
            Some(failed.len())
        }
        Err(e) => {
            tracing::error!(error = %crate::error::error_chain(&e), "failed refunds not counted");
            None
        }
    }
}
