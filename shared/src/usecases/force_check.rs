//! `POST /admin/orders/{id}/check`: an operator asks the system to look at
//! one order now. It runs the same close use case as every wake-up — so it
//! can only do what a wake-up could do, never set a status — and records
//! who asked, when, what it found and what happened, on the order itself.

use crate::domain::*;
use crate::error::ApiError;
use crate::ports::{CloseReminders, PaymentChannel};
use crate::store::{OrderStore, PaymentStore};
use crate::usecases::close_order::{CloseOrder, CloseOutcome};
use serde_json::{json, Value};
use tracing::info;

pub fn outcome_name(o: &CloseOutcome) -> &'static str {
    match o {
        CloseOutcome::Closed => "closed",
        CloseOutcome::Paid => "paid",
        CloseOutcome::AlreadyFinal(_) => "already_final",
        CloseOutcome::NotFound => "not_found",
        CloseOutcome::LeftToLeaseHolder => "left_to_lease_holder",
        CloseOutcome::ReminderPending => "reminder_pending",
        CloseOutcome::RemindedLater { .. } => "reminded_later",
    }
}

pub async fn force_check<S, C, Q>(closer: &CloseOrder<S, C, Q>, id: &str, by: &str) -> Result<Value, ApiError>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
    Q: CloseReminders,
{
    let order_id = OrderId::parse(id).map_err(|_| ApiError::not_found(format!("order {id}")))?;
    let before = closer.store.order(&order_id).await?.ok_or_else(|| ApiError::not_found(format!("order {id}")))?;
    let outcome = closer.close(&order_id, &format!("operator:{by}")).await?;
    let after = closer.store.order(&order_id).await?.ok_or_else(|| ApiError::not_found(format!("order {id}")))?;
    let check = OperatorCheck {
        at: closer.clock.now(),
        by: by.to_owned(),
        found: before.status,
        outcome: outcome_name(&outcome).to_owned(),
        status: after.status,
    };
    closer.store.record_check(&order_id, &check).await?;
    info!(order_id = %order_id, trigger = "operator", by, found = before.status.as_str(),
          outcome = check.outcome, status = after.status.as_str(), "operator force-check");
    let mut v = json!({
        "order_id": order_id,
        "found": before.status,
        "outcome": check.outcome,
        "status": after.status,
        "checked_at": check.at,
        "checked_by": by,
    });
    if let CloseOutcome::RemindedLater { after, why } = outcome {
        v["retry_after_seconds"] = json!(after.as_secs());
        v["why"] = json!(why);
    }
    Ok(v)
}
