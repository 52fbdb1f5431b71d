//! The effect queues (OrderPlaced → wake-up, OrderClosed → release,
//! OrderPaid → settle): each message names an order, and the handler acts
//! on the order as the table has it, never on what the event said. A body
//! that is not an effect message can never succeed: it is logged, counted
//! and acknowledged; a store or channel failure is returned so the message
//! is retried (and, after 10 receives, dead-lettered; the sweep re-drives
//! whatever it left undone).
//!
//! The effects queue (the sweep's pending effects, [`pending_effects_batch`])
//! differs in one point: a body that does not decode is *failed*, not
//! acknowledged. Only this stack's sweep writes that queue, so such a body
//! means the sweep and the consumer disagree on the format (a deploy
//! half-way through, a hand-written message): kept in the DLQ (alarmed),
//! it can be redriven once they agree, and the effect itself is never
//! lost, since its index entry stays due until the use case settles it.

use super::batch::{each_sqs_message_within, fail_message, MIN_MESSAGE_SHARE};
use crate::aws::queue::PendingEffectMessage;
use crate::domain::OrderId;
use crate::error::error_chain;
use crate::metrics;
use crate::ports::{Clock, CloseReminders, PaymentChannel, PendingEffect, Unavailable, WakeUpScheduler};
use crate::store::{OrderStore, PaymentStore};
use crate::usecases::pending_effects::EffectDriven;
use crate::usecases::release_order::{release_order, settle_order_until};
use crate::usecases::schedule_wakeup::schedule_wake_up;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::time::Instant;
use tracing::{error, info, warn};

/// The body the bus's rules put on each effect queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectMessage {
    pub order_id: OrderId,
    /// The event type that sent it, for the logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
}

/// Why an effect message failed: it comes back (a batch item failure) and,
/// after 10 receives, goes to its DLQ. Shown as its cause alone, as the
/// message's log line has always read.
#[derive(Debug, thiserror::Error)]
pub enum EffectMessageError {
    /// The order could not be read.
    #[error(transparent)]
    ReadOrder(Unavailable),
    /// The wake-up could not be scheduled.
    #[error(transparent)]
    WakeUp(Unavailable),
    /// The release or settle failed (logged and counted as `EffectFailed`).
    #[error(transparent)]
    Effect(Unavailable),
}

/// Why a message of the effects queue failed; it comes back, and after
/// `maxReceiveCount` receives reaches the DLQ.
#[derive(Debug, thiserror::Error)]
pub enum PendingEffectError {
    /// The body is not a pending effect (counted as `MalformedEffectMessage`).
    #[error("undecodable pending-effect message: {0}")]
    Undecodable(serde_json::Error),
    /// The effect failed (counted as `EffectFailed`, Effect=backstop);
    /// shown with its whole cause chain.
    #[error("{}", error_chain(.0))]
    Failed(Unavailable),
    /// Out of its share in the first pass, and too little of the
    /// invocation left to run it again.
    #[error("not run again: {} ms left in the invocation", .0.as_millis())]
    NoTimeLeft(std::time::Duration),
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
) -> Result<(), EffectMessageError>
where
    S: OrderStore,
    W: WakeUpScheduler,
    Q: CloseReminders,
{
    let Some(msg) = decode(body, "order-placed") else { return Ok(()) };
    let Some(order) = store.order(&msg.order_id).await.map_err(EffectMessageError::ReadOrder)? else {
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
        .map_err(EffectMessageError::WakeUp)
}

/// OrderClosed: the order's reservations and coupon lock are released.
pub async fn release_message<S: OrderStore>(
    store: &S,
    clock: &dyn Clock,
    body: &str,
) -> Result<(), EffectMessageError> {
    let Some(msg) = decode(body, "order-closed") else { return Ok(()) };
    if let Some(order) = store.order(&msg.order_id).await.map_err(EffectMessageError::ReadOrder)? {
        if crate::faults::active().release_fails(&order, clock.now()).is_some() {
            warn!(order_id = %order.order_id, "fault injection: OrderClosed event lost");
            return Ok(());
        }
    }
    release_order(store, clock, &msg.order_id).await.map(|_| ()).map_err(|e| effect_failed("release", &msg, e))
}

/// A release or settle that will be retried (the message comes back; the
/// sweep re-drives it after that): counted by effect, logged once.
fn effect_failed(effect: &'static str, msg: &EffectMessage, e: Unavailable) -> EffectMessageError {
    warn!(order_id = %msg.order_id, effect, trigger = msg.trigger.as_deref().unwrap_or("event"), error = %e, "effect failed; retried");
    metrics::EFFECT_FAILED.emit(1.0, &[effect]);
    EffectMessageError::Effect(e)
}

/// OrderPaid: reservations confirmed, coupon used, wake-up cancelled, the
/// order's other open payments closed at the channel.
pub async fn settle_message<S, W, C>(
    store: &S,
    wakeups: &W,
    channel: &C,
    clock: &dyn Clock,
    body: &str,
) -> Result<(), EffectMessageError>
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
) -> Result<(), EffectMessageError>
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

/// An effects-queue body as the effect it names, or why it cannot be one
/// (counted as `MalformedEffectMessage`; the message is then failed, see
/// the module's docs).
pub fn decode_pending_effect(body: &str) -> Result<PendingEffect, PendingEffectError> {
    match serde_json::from_str::<PendingEffectMessage>(body) {
        Ok(m) => Ok(m.into()),
        Err(e) => {
            error!(queue = "pending-effects", error = %e, body = %body.chars().take(200).collect::<String>(), "undecodable pending-effect message: failed, so it reaches the DLQ");
            metrics::MALFORMED_EFFECT_MESSAGE.count(1);
            Err(PendingEffectError::Undecodable(e))
        }
    }
}

/// The effects queue's batch: each message decoded and handed to `drive`
/// (the pending-effect use case) with a deadline of its own. Only the
/// messages that failed are named in the answer, so a poison message comes
/// back alone, and after `maxReceiveCount` receives reaches the DLQ, while
/// the rest of its batch is done.
///
/// Time, in two passes. A settle asks the channel to close the order's
/// other payments, which can take a Stripe call's operation bound (9 s);
/// a batch of 10 sharing the invocation fairly (as settle-order's does)
/// gives each message 2.85 s, so with a slow channel such a settle was
/// handed back on every receive until it reached the DLQ, although nothing
/// was wrong but the time. Releases and refunds ask no channel and take
/// milliseconds. So the first pass shares only half of the invocation
/// among the messages; an effect that failed at or after its share's end
/// (it ran out of time; store-only effects never do, unless the store was
/// that slow, and a retry of those is harmless) is not failed but run
/// again in the second pass, one after the other, each with all the time
/// that is left: the first gets at least the half kept back, so a batch
/// always finishes a settle whose channel answers within that. Those still
/// unfinished come back as before. Not chosen: one message per batch for
/// settles (the mapping cannot tell a settle from a release, and a
/// backlog of releases would drain ten times slower), or re-sending a
/// message that made progress (a channel slower than a share makes none).
pub async fn pending_effects_batch<F, Fut>(event: SqsEvent, deadline: Instant, drive: F) -> SqsBatchResponse
where
    F: Fn(PendingEffect, Instant) -> Fut,
    Fut: Future<Output = Result<EffectDriven, Unavailable>>,
{
    let drive = &drive;
    let now = Instant::now();
    let first_pass_end = now + deadline.saturating_duration_since(now) / 2;
    let out_of_time = std::sync::Mutex::new(Vec::new());
    let out_of_time_ref = &out_of_time;
    let mut response = each_sqs_message_within(event, first_pass_end, |m, until| async move {
        let effect = decode_pending_effect(m.body.as_deref().unwrap_or(""))?;
        match drive(effect.clone(), until).await {
            Ok(done) => {
                effect_driven(&effect, &done);
                Ok(())
            }
            Err(e) if Instant::now() >= until => {
                info!(order_id = %effect.order_id(), trigger = "sweep", effect = ?effect, error = %error_chain(&e), "pending effect ran out of its share; run again with the time kept back");
                out_of_time_ref.lock().expect("not poisoned").push((m.message_id.clone().unwrap_or_default(), effect));
                Ok(())
            }
            Err(e) => Err(pending_effect_failed(&effect, e)),
        }
    })
    .await;
    for (id, effect) in out_of_time.into_inner().expect("not poisoned") {
        let left = deadline.saturating_duration_since(Instant::now());
        let outcome = if left < MIN_MESSAGE_SHARE {
            Err(PendingEffectError::NoTimeLeft(left))
        } else {
            drive(effect.clone(), deadline)
                .await
                .map(|done| effect_driven(&effect, &done))
                .map_err(|e| pending_effect_failed(&effect, e))
        };
        if let Err(e) = outcome {
            fail_message(&mut response, id, e);
        }
    }
    response
}

fn effect_driven(effect: &PendingEffect, done: &EffectDriven) {
    info!(order_id = %effect.order_id(), trigger = "sweep", outcome = "effect_driven", effect = ?effect, result = ?done, "pending effect driven");
}

/// A pending effect that failed: its message comes back (counted as
/// `EffectFailed`, Effect=backstop, which DriveEffectsFailedAlarm watches).
fn pending_effect_failed(effect: &PendingEffect, e: Unavailable) -> PendingEffectError {
    warn!(order_id = %effect.order_id(), trigger = "sweep", effect = ?effect, error = %error_chain(&e), "pending effect failed; its message comes back");
    metrics::EFFECT_FAILED.emit(1.0, &["backstop"]);
    PendingEffectError::Failed(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    /// The fixture's two messages (an order's effects, a refund), then the
    /// given bodies as m2, m3, ….
    fn batch(extra: &[&str]) -> SqsEvent {
        let mut event: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/drive-effects.json")).unwrap();
        let one = event["Records"][0].clone();
        let records = event["Records"].as_array_mut().unwrap();
        for (i, body) in extra.iter().enumerate() {
            let mut m = one.clone();
            m["messageId"] = serde_json::json!(format!("m{}", i + 2));
            m["body"] = serde_json::json!(body);
            records.push(m);
        }
        serde_json::from_value(event).unwrap()
    }

    fn failed(response: SqsBatchResponse) -> Vec<String> {
        response.batch_item_failures.into_iter().map(|f| f.item_identifier).collect()
    }

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(20)
    }

    #[tokio::test]
    async fn an_undecodable_pending_effect_message_is_a_batch_item_failure_and_the_rest_are_driven() {
        let driven = Mutex::new(Vec::new());
        let response = pending_effects_batch(
            batch(&["not json", r#"{"kind":"teleport","order_id":"ord_1"}"#]),
            deadline(),
            |e, _| {
                driven.lock().unwrap().push(e);
                async { Ok(EffectDriven::RefundNotDue) }
            },
        )
        .await;
        assert_eq!(failed(response), ["m2", "m3"], "both poison messages fail, so SQS dead-letters them");
        let driven = driven.into_inner().unwrap();
        assert_eq!(driven.len(), 2, "the fixture's two effects still ran: {driven:?}");
        assert!(matches!(driven[0], PendingEffect::Order(_)) && matches!(driven[1], PendingEffect::Refund(..)));
    }

    #[tokio::test]
    async fn only_an_effect_that_ran_out_of_its_share_runs_again_with_the_time_kept_back() {
        let slow = r#"{"kind":"order_effects","order_id":"ord_slow"}"#;
        let broken = r#"{"kind":"order_effects","order_id":"ord_broken"}"#;
        let runs = Mutex::new(Vec::new());
        let deadline = Instant::now() + Duration::from_secs(8);
        let response = pending_effects_batch(batch(&[slow, broken]), deadline, |e, until| {
            let id = e.order_id().as_str().to_owned();
            let left = until.saturating_duration_since(Instant::now());
            runs.lock().unwrap().push((id.clone(), left));
            async move {
                match id.as_str() {
                    // Needs 2 s: more than a first-pass share (4 s / 4).
                    "ord_slow" if left < Duration::from_secs(2) => {
                        tokio::time::sleep(left).await;
                        Err(Unavailable::new("settle", "out of this message's time"))
                    }
                    "ord_broken" => Err(Unavailable::new("release order", "table unavailable")),
                    _ => Ok(EffectDriven::RefundNotDue),
                }
            }
        })
        .await;
        assert_eq!(failed(response), ["m3"], "the slow one finished in the second pass; the broken one failed");
        let runs = runs.into_inner().unwrap();
        let of = |id: &str| runs.iter().filter(|(r, _)| r == id).map(|(_, left)| *left).collect::<Vec<_>>();
        assert_eq!(of("ord_slow").len(), 2, "{runs:?}");
        assert!(of("ord_slow")[1] >= Duration::from_secs(2), "the second run has the half kept back: {runs:?}");
        assert_eq!(of("ord_broken").len(), 1, "a failure inside its share is not run again: {runs:?}");
    }

    #[tokio::test]
    async fn an_effect_that_keeps_failing_is_a_batch_item_failure_every_time() {
        let body = r#"{"kind":"order_effects","order_id":"ord_stuck"}"#;
        for _receive in 0..3 {
            let response = pending_effects_batch(batch(&[body]), deadline(), |e, _| async move {
                match e {
                    PendingEffect::Order(id) if id.as_str() == "ord_stuck" => {
                        Err(Unavailable::new("release order", "table unavailable"))
                    }
                    _ => Ok(EffectDriven::RefundNotDue),
                }
            })
            .await;
            assert_eq!(failed(response), ["m2"], "only the failing effect's message comes back");
        }
    }
}
