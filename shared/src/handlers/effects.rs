//! The effect queues (OrderPlaced → wake-up, OrderClosed → release,
//! OrderPaid → settle): each message names an order, and the handler acts
//! on the order as the table has it, never on what the event said. A body
//! that is not an effect message can never succeed: it is logged, counted
//! and acknowledged; a store or channel failure is returned so the message
//! is retried (and, after 10 receives, dead-lettered; the sweep re-drives
//! whatever it left undone).

use crate::domain::OrderId;
use crate::metrics;
use crate::ports::{Clock, CloseReminders, PaymentChannel, WakeUpScheduler};
use crate::store::{OrderStore, PaymentStore};
use crate::usecases::release_order::{release_order, settle_order_until};
use crate::usecases::schedule_wakeup::schedule_wake_up;
use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

/// The body the bus's rules put on each effect queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectMessage {
    pub order_id: OrderId,
    /// The event type that sent it, for the logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
}

fn decode(body: &str, queue: &'static str) -> Option<EffectMessage> {
    match serde_json::from_str(body) {
        Ok(m) => Some(m),
        Err(e) => {
            error!(queue, error = %e, body = %body.chars().take(200).collect::<String>(), "malformed effect message dropped");
            metrics::MALFORMED_EFFECT_MESSAGE.count(1);
            None
        }
    }
}

/// OrderPlaced: the order's one-shot wake-up (from the order's own
/// `expire_at`). An order already final needs none.
pub async fn wake_up_message<S, W, Q>(
    store: &S,
    wakeups: &W,
    reminders: &Q,
    clock: &dyn Clock,
    body: &str,
) -> Result<(), String>
where
    S: OrderStore,
    W: WakeUpScheduler,
    Q: CloseReminders,
{
    let Some(msg) = decode(body, "order-placed") else { return Ok(()) };
    let Some(order) = store.order(&msg.order_id).await.map_err(|e| e.to_string())? else {
        warn!(order_id = %msg.order_id, "wake-up for an order that does not exist");
        return Ok(());
    };
    if order.status.is_final() {
        info!(order_id = %order.order_id, status = order.status.as_str(), "already final: no wake-up needed");
        return Ok(());
    }
    if crate::faults::active().wake_up_lost(order.user_id.as_str()) {
        warn!(order_id = %order.order_id, "fault injection: wake-up never created");
        return Ok(());
    }
    schedule_wake_up(wakeups, reminders, clock, &order.order_id, order.expire_at)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// OrderClosed: the order's reservations and coupon lock are released.
pub async fn release_message<S: OrderStore>(store: &S, clock: &dyn Clock, body: &str) -> Result<(), String> {
    let Some(msg) = decode(body, "order-closed") else { return Ok(()) };
    if let Some(order) = store.order(&msg.order_id).await.map_err(|e| e.to_string())? {
        if crate::faults::active().release_fails(&order, clock.now()).is_some() {
            warn!(order_id = %order.order_id, "fault injection: OrderClosed event lost");
            return Ok(());
        }
    }
    release_order(store, clock, &msg.order_id).await.map(|_| ()).map_err(|e| effect_failed("release", &msg, e))
}

/// A release or settle that will be retried (the message comes back; the
/// sweep re-drives it after that): counted by effect, logged once.
fn effect_failed(effect: &'static str, msg: &EffectMessage, e: impl std::fmt::Display) -> String {
    warn!(order_id = %msg.order_id, effect, trigger = msg.trigger.as_deref().unwrap_or("event"), error = %e, "effect failed; retried");
    metrics::EFFECT_FAILED.emit(1.0, &[effect]);
    e.to_string()
}

/// OrderPaid: reservations confirmed, coupon used, wake-up cancelled, the
/// order's other open payments closed at the channel.
pub async fn settle_message<S, W, C>(
    store: &S,
    wakeups: &W,
    channel: &C,
    clock: &dyn Clock,
    body: &str,
) -> Result<(), String>
where
    S: OrderStore + PaymentStore,
    W: WakeUpScheduler,
    C: PaymentChannel,
{
    settle_message_until(store, wakeups, channel, clock, body, None).await
}

/// As [`settle_message`], with the channel cut off at `until` (the
/// message's share of the invocation): a settle that ran out of it fails,
/// and its message comes back.
pub async fn settle_message_until<S, W, C>(
    store: &S,
    wakeups: &W,
    channel: &C,
    clock: &dyn Clock,
    body: &str,
    until: Option<std::time::Instant>,
) -> Result<(), String>
where
    S: OrderStore + PaymentStore,
    W: WakeUpScheduler,
    C: PaymentChannel,
{
    let Some(msg) = decode(body, "order-paid") else { return Ok(()) };
    settle_order_until(store, wakeups, channel, clock, &msg.order_id, until)
        .await
        .map(|_| ())
        .map_err(|e| effect_failed("settle", &msg, e))
}
