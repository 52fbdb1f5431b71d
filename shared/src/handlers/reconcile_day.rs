//! The day run's two functions: `reconcile-day` (the coordinator: records a
//! run of one day and hands its pieces to ReconcilePieceQueue) and
//! `reconcile-piece` (the worker: one piece per message, its report stored,
//! the day's report merged once the last piece is in).

use super::batch::each_sqs_message;
use crate::aws::queue::{PieceMessage, SqsReconcilePieces};
use crate::domain::{Day, Timestamp};
use crate::metrics;
use crate::ports::{ChannelStatement, Unavailable};
use crate::store::{Cas, DayIndex, DayRuns};
use crate::usecases::reconcile_day::{run_piece, store_part, DayPorts, DayReport, DayRun, PartStored, Piece};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use serde::Deserialize;
use tracing::{info, warn};

/// A payload that names a day which does not parse: refused (the
/// invocation fails) rather than taken for yesterday.
#[derive(Debug, thiserror::Error)]
#[error("not a day request: {0}")]
pub struct NotADayRequest(serde_json::Error);

/// Why a piece message failed: it comes back (a batch item failure) and,
/// after 3 receives, is set aside in ReconcilePieceDLQ (alarmed).
#[derive(Debug, thiserror::Error)]
pub enum PieceError {
    /// The body is not a piece message (only the coordinator writes the
    /// queue: a format disagreement, to be redriven once they agree).
    #[error("not a piece message: {0}")]
    NotAPieceMessage(serde_json::Error),
    /// The message names a piece this version does not know.
    #[error("unknown piece {0:?}")]
    UnknownPiece(String),
    /// The run's record could not be read.
    #[error(transparent)]
    ReadRun(Unavailable),
    /// No run of that id is recorded for the day.
    #[error("no run {run_id} of {day}")]
    NoRun { run_id: String, day: Day },
    /// The piece could not read or check what it owns; shown with its
    /// whole cause chain.
    #[error("{}", crate::error::error_chain(.0))]
    Piece(Unavailable),
    /// The piece's report could not be stored.
    #[error(transparent)]
    StorePart(Unavailable),
}

/// What starts a run: nothing (the daily schedule: yesterday) or a day an
/// operator names.
#[derive(Debug, Default, Deserialize)]
pub struct DayRequest {
    #[serde(default)]
    pub day: Option<Day>,
}

impl DayRequest {
    /// The invocation's payload: without a `day` (the schedule's own body,
    /// `{}`), yesterday; with one, that day, and a day that does not parse
    /// is refused rather than taken for yesterday.
    pub fn from_payload(payload: serde_json::Value) -> Result<Self, NotADayRequest> {
        match payload.get("day") {
            None | Some(serde_json::Value::Null) => Ok(Self::default()),
            Some(_) => serde_json::from_value(payload).map_err(NotADayRequest),
        }
    }

    /// The day asked for, or the day before `now`'s.
    pub fn day(&self, now: Timestamp) -> Day {
        self.day.unwrap_or_else(|| Day::of(now).previous())
    }
}

/// Records a run of `day` over `shards` shards and hands out its pieces.
/// A hand-out that fails fails the invocation; the run's record stays,
/// with every piece missing, until a new run is started.
pub async fn start_day_run<R: DayRuns>(
    runs: &R,
    queue: &SqsReconcilePieces,
    day: Day,
    shards: u32,
    now: Timestamp,
) -> Result<DayRun, Unavailable> {
    let run = DayRun::new(day, shards, now, rand::random());
    if runs.start_run(&run).await? == Cas::Rejected {
        return Err(Unavailable::new("start a day run", format!("run {} exists", run.run_id)));
    }
    let messages: Vec<PieceMessage> =
        run.pieces.iter().map(|piece| PieceMessage { day, run_id: run.run_id.clone(), piece: piece.clone() }).collect();
    queue.hand_out(&messages).await?;
    info!(day = %day, run_id = %run.run_id, pieces = messages.len(), "day run started");
    Ok(run)
}

/// One piece message: the run read back, the piece run, its report stored.
pub async fn piece_message<I, C, R>(
    ports: &DayPorts<'_, I, C>,
    runs: &R,
    body: &str,
    now: Timestamp,
) -> Result<(), PieceError>
where
    I: DayIndex,
    C: ChannelStatement,
    R: DayRuns,
{
    // Only the coordinator writes this queue: a body that does not decode
    // is a format disagreement, kept in the DLQ (alarmed) to be redriven.
    let msg: PieceMessage = serde_json::from_str(body).map_err(PieceError::NotAPieceMessage)?;
    let piece = Piece::parse(&msg.piece).ok_or_else(|| PieceError::UnknownPiece(msg.piece.clone()))?;
    let run = runs
        .day_run(msg.day, Some(&msg.run_id))
        .await
        .map_err(PieceError::ReadRun)?
        .ok_or_else(|| PieceError::NoRun { run_id: msg.run_id.clone(), day: msg.day })?;
    let part = run_piece(ports, &run, piece, now).await.map_err(PieceError::Piece)?;
    match store_part(runs, &run, &part).await.map_err(PieceError::StorePart)? {
        PartStored::Complete(report) => emit(&report),
        PartStored::Waiting { missing } => info!(missing, "piece stored; the run waits for others"),
        PartStored::AlreadyStored => info!("piece reported before: a redelivery"),
    }
    Ok(())
}

/// The merged report's metrics, once per complete run: one point per kind
/// (the same `Discrepancy.<kind>` alarms as the full scan), the backlog the
/// shards saw, and `ReconcileCompleted`, whose absence for 26 hours raises
/// ReconcileNotRunAlarm (a piece that never reports keeps its day's run
/// incomplete, so that alarm covers it too).
fn emit(report: &DayReport) {
    for (kind, count) in &report.counts {
        metrics::discrepancy(*kind).count(*count as u64);
    }
    metrics::OPEN_ORDERS.count(report.backlog.open_orders);
    metrics::OLDEST_OPEN_ORDER_SECONDS.duration(std::time::Duration::from_secs(report.backlog.oldest_open_seconds));
    metrics::REFUNDS_PENDING.count(report.backlog.refunds_pending);
    metrics::RECONCILE_COMPLETED.count(1);
    if report.discrepancies.is_empty() {
        info!(day = %report.day, orders = report.orders_checked, items_read = report.cost.items, "day reconciled: clean");
    } else {
        warn!(day = %report.day, counts = ?report.counts, "day reconciled: discrepancies found");
    }
}

/// A batch of piece messages; each failed one is named for its own retry.
pub async fn piece_batch<I, C, R>(
    ports: &DayPorts<'_, I, C>,
    runs: &R,
    event: SqsEvent,
    now: Timestamp,
) -> SqsBatchResponse
where
    I: DayIndex,
    C: ChannelStatement,
    R: DayRuns,
{
    each_sqs_message(event, |m| async move { piece_message(ports, runs, m.body.as_deref().unwrap_or(""), now).await })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_request_without_a_day_is_yesterday_and_a_bad_day_is_refused() {
        let now = Timestamp::parse("2026-12-03T03:00:00Z").unwrap();
        let scheduled = DayRequest::from_payload(json!({})).unwrap();
        assert_eq!(scheduled.day(now).to_string(), "2026-12-02");
        let named = DayRequest::from_payload(json!({"day": "2026-11-20"})).unwrap();
        assert_eq!(named.day(now).to_string(), "2026-11-20");
        assert!(DayRequest::from_payload(json!({"day": "20-11-2026"})).is_err());
        assert!(DayRequest::from_payload(json!("not an object")).is_ok(), "a body that names no day");
    }
}
