//! `POST /admin/orders/{id}/check`: an operator asks the system to look at
//! one order now. It runs the same close use case as every wake-up — so it
//! can only do what a wake-up could do, never set a status — and records
//! who asked, when, what it found and what happened, on the order itself.

use crate::domain::*;
use crate::ports::{CloseReminders, PaymentChannel};
use crate::store::{OrderStore, PaymentStore};
use crate::usecases::close_order::{CloseOrder, CloseOutcome};
use crate::usecases::UseCaseError;
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

/// What an operator's check found and did.
#[derive(Debug, Clone, PartialEq)]
pub struct ForceCheck {
    pub order_id: OrderId,
    /// The check as recorded on the order (who, when, found, outcome, status).
    pub check: OperatorCheck,
    /// The close use case's answer; a reminder put back says when and why.
    pub outcome: CloseOutcome,
}

/// Runs the close use case on `order_id` for the operator `by`, and
/// records the check beside the order.
pub async fn force_check<S, C, Q>(
    closer: &CloseOrder<S, C, Q>,
    order_id: &OrderId,
    by: &str,
) -> Result<ForceCheck, UseCaseError>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
    Q: CloseReminders,
{
    force_check_until(closer, order_id, by, None).await
}

/// As [`force_check`], with the channel's questions cut off at `until`
/// (the API invocation's deadline less its margin): a question not answered
/// by then leaves the order held (nothing released, asked again by the
/// reminder the close puts back), and the operator gets the check as it
/// stands — `reminded_later` — instead of the API timing out.
pub async fn force_check_until<S, C, Q>(
    closer: &CloseOrder<S, C, Q>,
    order_id: &OrderId,
    by: &str,
    until: Option<std::time::Instant>,
) -> Result<ForceCheck, UseCaseError>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
    Q: CloseReminders,
{
    let not_found = || UseCaseError::not_found(format!("order {order_id}"));
    let before = closer.store.order(order_id).await?.ok_or_else(not_found)?;
    let outcome = closer.close_until(order_id, &format!("operator:{by}"), until).await?;
    let after = closer.store.order(order_id).await?.ok_or_else(not_found)?;
    let check = OperatorCheck {
        at: closer.clock.now(),
        by: by.to_owned(),
        found: before.status,
        outcome: outcome_name(&outcome).to_owned(),
        status: after.status,
    };
    closer.store.record_check(order_id, &check).await?;
    info!(order_id = %order_id, trigger = "operator", by, found = before.status.as_str(),
          outcome = check.outcome, status = after.status.as_str(), "operator force-check");
    Ok(ForceCheck { order_id: order_id.clone(), check, outcome })
}
