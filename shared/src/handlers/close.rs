//! The close queue's messages.

use crate::aws::queue::CloseMessage;
use crate::metrics;
use crate::ports::{CloseReminders, PaymentChannel, Unavailable};
use crate::store::{OrderStore, PaymentStore};
use crate::usecases::close_order::CloseOrder;
use tracing::{error, Instrument};

/// One close reminder. A body that is not a close message can never
/// succeed: it is logged, counted and acknowledged rather than retried into
/// the dead-letter queue. A failure to reach the store or the channel is
/// returned, so that the message is retried.
pub async fn close_message<S, C, Q>(uc: &CloseOrder<S, C, Q>, owner: &str, body: &str) -> Result<(), Unavailable>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
    Q: CloseReminders,
{
    close_message_until(uc, owner, body, None).await
}

/// As [`close_message`], with the channel cut off at `until` (the
/// message's share of the invocation).
pub async fn close_message_until<S, C, Q>(
    uc: &CloseOrder<S, C, Q>,
    owner: &str,
    body: &str,
    until: Option<std::time::Instant>,
) -> Result<(), Unavailable>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
    Q: CloseReminders,
{
    let msg: CloseMessage = match serde_json::from_str(body) {
        Ok(m) => m,
        Err(e) => {
            error!(error = %e, body = %body.chars().take(200).collect::<String>(), "malformed close message dropped");
            metrics::MALFORMED_CLOSE_MESSAGE.count(1);
            return Ok(());
        }
    };
    let trigger = msg.trigger.as_deref().unwrap_or("unknown");
    let span = tracing::info_span!("close_message", trigger);
    let outcome = uc.close_until(&msg.order_id, owner, until).instrument(span).await?;
    // The one event per close outcome: the order, who sent the reminder
    // (schedule, reminder, sweep, lazy, operator) and what came of it.
    tracing::info!(order_id = %msg.order_id, trigger, outcome = crate::usecases::force_check::outcome_name(&outcome), detail = ?outcome, "close reminder handled");
    Ok(())
}
