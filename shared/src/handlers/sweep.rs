//! The sweep function's scheduled triggers, one per pass over the due
//! index: the backstop sweep (run, emit the backstop metrics, answer with
//! the report: what a manual `aws lambda invoke` prints) and the
//! expiring-soon pass ([`run_expiring_soon_pass`]).

use crate::aws::seconds_env;
use crate::metrics;
use crate::ports::{Clock, Redrive};
use crate::store::{DueIndex, ExpiringSoonNotices, PaymentStore};
use crate::usecases::expiring_soon::{notice_expiring_soon, NoticeConfig};
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

/// Which pass a scheduled invocation of the sweep function asks for: the
/// backstop sweep (the `rate(SweepPeriodMinutes)` schedule sends no
/// input), or the expiring-soon pass (its own `rate(1 minute)` schedule
/// sends `{"pass":"expiring-soon"}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    Sweep,
    ExpiringSoon,
}

/// An invocation's input that names a pass this function does not have
/// (`None`: a `pass` that is not a string).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown pass {0:?}: expected \"sweep\" or \"expiring-soon\"")]
pub struct UnknownPass(pub Option<String>);

/// Reads the pass from the invocation's input. An input naming an unknown
/// pass is refused (the invocation fails, visible in its Errors), never
/// taken for the sweep.
pub fn pass_of(input: &Value) -> Result<Pass, UnknownPass> {
    match input.get("pass").map(|p| p.as_str()) {
        None => Ok(Pass::Sweep),
        Some(Some("sweep")) => Ok(Pass::Sweep),
        Some(Some("expiring-soon")) => Ok(Pass::ExpiringSoon),
        Some(other) => Err(UnknownPass(other.map(str::to_owned))),
    }
}

/// Why the expiring-soon pass's configuration is refused (the pass then
/// does not run; the backstop sweep does).
#[derive(Debug, thiserror::Error)]
pub enum NoticeConfigError {
    /// `EXPIRING_SOON_LEAD_SECONDS` is not whole seconds.
    #[error("{0}")]
    Unreadable(lambda_runtime::Error),
    /// A lead that is not 0 and shorter than the pass period.
    #[error(
        "EXPIRING_SOON_LEAD_SECONDS must be 0 (no notices) or at least {} (the pass period), got {}",
        period.as_secs(),
        lead.as_secs()
    )]
    LeadTooShort { lead: std::time::Duration, period: std::time::Duration },
}

/// `EXPIRING_SOON_LEAD_SECONDS` (optional, default 300): 0 turns the
/// notices off; otherwise at least the pass period (one minute), or the
/// pass could reach an order only after it expired.
pub fn notice_config_from_env() -> Result<NoticeConfig, NoticeConfigError> {
    let mut cfg = NoticeConfig::default();
    if std::env::var("EXPIRING_SOON_LEAD_SECONDS").is_ok() {
        cfg.lead = seconds_env("EXPIRING_SOON_LEAD_SECONDS").map_err(NoticeConfigError::Unreadable)?;
    }
    if !cfg.lead.is_zero() && cfg.lead < cfg.period {
        return Err(NoticeConfigError::LeadTooShort { lead: cfg.lead, period: cfg.period });
    }
    Ok(cfg)
}

/// One run of the expiring-soon pass: the report as the answer, the count
/// of orders noticed as a metric, and `ExpiringSoonPassCompleted` when the
/// run read every shard and made every write it meant to. A run never
/// fails the invocation: the function's Errors (SweepErrorsAlarm) stay the
/// backstop sweep's; a pass that keeps failing, or a lead the pass refuses,
/// shows as the missing completions (ExpiringSoonPassStoppedAlarm). Its
/// failed writes and unread shards are looked at again by the next run.
pub async fn run_expiring_soon_pass<S: DueIndex + ExpiringSoonNotices>(
    store: &S,
    clock: &dyn Clock,
    cfg: Result<&NoticeConfig, &NoticeConfigError>,
) -> Result<Value, lambda_runtime::Error> {
    let cfg = match cfg {
        Ok(cfg) => cfg,
        Err(why) => {
            tracing::error!(error = %why, "expiring-soon pass not run: its configuration is refused");
            return Ok(json!({ "error": why.to_string() }));
        }
    };
    let report = notice_expiring_soon(store, clock, cfg).await;
    metrics::ORDER_EXPIRING_SOON.count(report.noticed as u64);
    if report.failed == 0 && report.shards_failed == 0 {
        metrics::EXPIRING_SOON_PASS_COMPLETED.count(1);
    } else {
        tracing::error!(
            failed = report.failed,
            shards_failed = report.shards_failed,
            "expiring-soon pass incomplete; the next run tries again"
        );
    }
    Ok(serde_json::to_value(&report)?)
}

#[cfg(test)]
mod pass_tests {
    use super::*;

    #[test]
    fn the_input_names_the_pass_and_an_unknown_one_is_refused() {
        assert_eq!(pass_of(&json!({})), Ok(Pass::Sweep));
        assert_eq!(pass_of(&json!({"source": "aws.scheduler"})), Ok(Pass::Sweep));
        assert_eq!(pass_of(&json!({"pass": "sweep"})), Ok(Pass::Sweep));
        assert_eq!(pass_of(&json!({"pass": "expiring-soon"})), Ok(Pass::ExpiringSoon));
        assert!(pass_of(&json!({"pass": "expiring_soon"})).unwrap_err().to_string().contains("unknown pass"));
        assert!(pass_of(&json!({"pass": 3})).is_err());
    }
}
