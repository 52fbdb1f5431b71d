//! SQS adapters: close reminders put back with a delay; stream records set
//! aside on a dead-letter queue; the refund worker's backoff and give-up;
//! the sweep's pending effects handed to the effects queue.

use crate::domain::{OrderId, PaymentId};
use crate::ports::{CloseReminders, DeadLetters, PendingEffect, RefundRequests, RefundRetries, Unavailable};
use async_trait::async_trait;
use aws_sdk_sqs::Client;
use std::time::Duration;

/// SQS refuses delays above 15 minutes; a longer wait is covered by
/// successive reminders, each re-checking the order.
pub const MAX_SQS_DELAY: Duration = crate::ports::MAX_REMINDER_DELAY;

/// The body of every close reminder, whoever sends it (scheduler, sweep,
/// the close function itself).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CloseMessage {
    pub order_id: OrderId,
    /// Who sent it: `schedule`, `reminder` (put back by a close run),
    /// `sweep`, `lazy` (a read found the order overdue), `operator`. For the
    /// logs only: the close use case decides from the order, never from this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
}

/// The body of a refund-queue message: which refund to try. Whoever
/// sends it (the stream, the sweep, an operator's redrive), the worker
/// decides from the refund record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RefundMessage {
    pub order_id: OrderId,
    pub payment_id: crate::domain::PaymentId,
}

/// Puts one refund on RefundQueue.
pub async fn enqueue_refund(client: &Client, queue_url: &str, message: &RefundMessage) -> Result<(), Unavailable> {
    let body = serde_json::to_string(message).expect("serialisable");
    client
        .send_message()
        .queue_url(queue_url)
        .message_body(body)
        .send()
        .await
        .map_err(|e| Unavailable::new("enqueue refund", e))?;
    Ok(())
}

/// The body of an effects-queue message: which pending effect, by its ids
/// and kind, and nothing of its state (the consumer re-reads the record).
/// `{"kind":"order_effects","order_id":…}` or
/// `{"kind":"refund","order_id":…,"payment_id":…}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PendingEffectMessage {
    OrderEffects { order_id: OrderId },
    Refund { order_id: OrderId, payment_id: PaymentId },
}

impl From<&PendingEffect> for PendingEffectMessage {
    fn from(e: &PendingEffect) -> Self {
        match e {
            PendingEffect::Order(order_id) => Self::OrderEffects { order_id: order_id.clone() },
            PendingEffect::Refund(order_id, payment_id) => {
                Self::Refund { order_id: order_id.clone(), payment_id: payment_id.clone() }
            }
        }
    }
}

impl From<PendingEffectMessage> for PendingEffect {
    fn from(m: PendingEffectMessage) -> Self {
        match m {
            PendingEffectMessage::OrderEffects { order_id } => Self::Order(order_id),
            PendingEffectMessage::Refund { order_id, payment_id } => Self::Refund(order_id, payment_id),
        }
    }
}

/// The effects queue as the sweep fills it (`PENDING_EFFECTS_QUEUE_URL`).
pub struct SqsPendingEffects {
    client: Client,
    queue_url: String,
}

impl SqsPendingEffects {
    pub fn new(client: Client, queue_url: String) -> Self {
        Self { client, queue_url }
    }

    /// One message per effect, ten to a `SendMessageBatch`. Entries SQS
    /// reports as failed are an error, so the caller knows (the sweep finds
    /// those effects again next run: their entries stay due).
    pub async fn hand_off(&self, effects: &[PendingEffect]) -> Result<(), Unavailable> {
        let bodies = effects
            .iter()
            .map(|effect| serde_json::to_string(&PendingEffectMessage::from(effect)).expect("serialisable"));
        send_in_batches(&self.client, &self.queue_url, bodies, "send pending effects").await
    }
}

/// One piece of a day's reconciliation, as the coordinator hands it to
/// ReconcilePieceQueue: the run and the piece, nothing else (the worker
/// reads the run's record for the rest).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PieceMessage {
    pub day: crate::domain::Day,
    pub run_id: String,
    pub piece: String,
}

/// ReconcilePieceQueue (`RECONCILE_PIECE_QUEUE_URL`).
pub struct SqsReconcilePieces {
    client: Client,
    queue_url: String,
}

impl SqsReconcilePieces {
    pub fn new(client: Client, queue_url: String) -> Self {
        Self { client, queue_url }
    }

    /// One message per piece, ten to a `SendMessageBatch`.
    pub async fn hand_out(&self, pieces: &[PieceMessage]) -> Result<(), Unavailable> {
        let bodies = pieces.iter().map(|p| serde_json::to_string(p).expect("serialisable"));
        send_in_batches(&self.client, &self.queue_url, bodies, "send reconcile pieces").await
    }
}

/// RefundQueue as the effects consumer uses it: a refund re-driven by the
/// backstop goes back to the refund worker (`REFUND_QUEUE_URL`).
pub struct SqsRefundRequests {
    client: Client,
    queue_url: String,
}

impl SqsRefundRequests {
    pub fn new(client: Client, queue_url: String) -> Self {
        Self { client, queue_url }
    }
}

#[async_trait]
impl RefundRequests for SqsRefundRequests {
    async fn request_refund(&self, order_id: &OrderId, payment_id: &PaymentId) -> Result<(), Unavailable> {
        let message = RefundMessage { order_id: order_id.clone(), payment_id: payment_id.clone() };
        enqueue_refund(&self.client, &self.queue_url, &message).await
    }
}

pub struct SqsCloseReminders {
    client: Client,
    queue_url: String,
}

impl SqsCloseReminders {
    pub fn new(client: Client, queue_url: String) -> Self {
        Self { client, queue_url }
    }

    /// Sends one immediate reminder per order, ten to a `SendMessageBatch`.
    /// Entries SQS reports as failed are an error, so the caller knows
    /// (the sweep finds those orders again next run).
    pub async fn remind_now(&self, order_ids: &[OrderId], trigger: &str) -> Result<(), Unavailable> {
        let bodies = order_ids.iter().map(|id| {
            serde_json::to_string(&CloseMessage { order_id: id.clone(), trigger: Some(trigger.to_owned()) })
                .expect("serialisable")
        });
        send_in_batches(&self.client, &self.queue_url, bodies, "send close reminders").await
    }
}

/// One message per body, ten to a `SendMessageBatch` (SQS's most), batch
/// after batch. A batch whose entries SQS reports as failed is an error, so
/// the caller knows which run to count as unfinished.
async fn send_in_batches(
    client: &Client,
    queue_url: &str,
    bodies: impl Iterator<Item = String>,
    what: &'static str,
) -> Result<(), Unavailable> {
    let bodies: Vec<String> = bodies.collect();
    for chunk in bodies.chunks(10) {
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(i, body)| {
                aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(body)
                    .build()
                    .expect("complete entry")
            })
            .collect();
        let out = client
            .send_message_batch()
            .queue_url(queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| Unavailable::new(what, e))?;
        if !out.failed().is_empty() {
            let why: Vec<_> = out.failed().iter().map(|f| f.code().to_owned()).collect();
            return Err(Unavailable::new(what, format!("entries failed: {why:?}")));
        }
    }
    Ok(())
}

/// Whole seconds, rounded up so that the reminder does not arrive early
/// again, capped at the SQS maximum.
pub fn delay_seconds(after: Duration) -> i32 {
    let secs = after.as_millis().div_ceil(1000) as u64;
    secs.min(MAX_SQS_DELAY.as_secs()) as i32
}

#[async_trait]
impl CloseReminders for SqsCloseReminders {
    async fn remind_later(&self, order_id: &OrderId, after: Duration) -> Result<(), Unavailable> {
        let body =
            serde_json::to_string(&CloseMessage { order_id: order_id.clone(), trigger: Some("reminder".into()) })
                .expect("serialisable");
        self.client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .delay_seconds(delay_seconds(after))
            .send()
            .await
            .map_err(|e| Unavailable::new("send close reminder", e))?;
        Ok(())
    }
}

/// The stream consumers' dead-letter queue (`STREAM_DEAD_LETTER_QUEUE_URL`).
pub struct SqsDeadLetters {
    client: Client,
    queue_url: String,
}

impl SqsDeadLetters {
    pub fn new(client: Client, queue_url: String) -> Self {
        Self { client, queue_url }
    }
    /// From the SDK configuration and `STREAM_DEAD_LETTER_QUEUE_URL`.
    pub fn from_env(config: &aws_config::SdkConfig) -> Result<Self, lambda_runtime::Error> {
        Ok(Self::new(super::clients::sqs(config), super::env("STREAM_DEAD_LETTER_QUEUE_URL")?))
    }
}

#[async_trait]
impl DeadLetters for SqsDeadLetters {
    async fn set_aside(&self, body: String) -> Result<(), Unavailable> {
        self.client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .send()
            .await
            .map_err(|e| Unavailable::new("send to the stream dead-letter queue", e))?;
        Ok(())
    }
}

/// The refund queue as the refund worker uses it: a failed try's message
/// comes back after the backoff (its visibility is extended), a refund out
/// of tries goes to the dead-letter queue.
pub struct SqsRefundRetries {
    client: Client,
    queue_url: String,
    dlq_url: String,
}

impl SqsRefundRetries {
    pub fn new(client: Client, queue_url: String, dlq_url: String) -> Self {
        Self { client, queue_url, dlq_url }
    }
}

#[async_trait]
impl RefundRetries for SqsRefundRetries {
    async fn retry_after(&self, receipt: &str, after: Duration) -> Result<(), Unavailable> {
        self.client
            .change_message_visibility()
            .queue_url(&self.queue_url)
            .receipt_handle(receipt)
            .visibility_timeout(after.as_secs() as i32)
            .send()
            .await
            .map_err(|e| Unavailable::new("sqs change_message_visibility", e))?;
        Ok(())
    }

    async fn hand_to_person(&self, body: String) -> Result<(), Unavailable> {
        self.client
            .send_message()
            .queue_url(&self.dlq_url)
            .message_body(body)
            .send()
            .await
            .map_err(|e| Unavailable::new("sqs send_message", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_effect_message_names_the_effect_by_kind_and_ids_only() {
        let order = OrderId::parse("ord_1").unwrap();
        let payment = PaymentId::parse("pay_9").unwrap();
        for (effect, body) in [
            (PendingEffect::Order(order.clone()), r#"{"kind":"order_effects","order_id":"ord_1"}"#),
            (PendingEffect::Refund(order, payment), r#"{"kind":"refund","order_id":"ord_1","payment_id":"pay_9"}"#),
        ] {
            assert_eq!(serde_json::to_string(&PendingEffectMessage::from(&effect)).unwrap(), body);
            let back: PendingEffectMessage = serde_json::from_str(body).unwrap();
            assert_eq!(PendingEffect::from(back), effect);
        }
    }

    #[test]
    fn delays_round_up_and_cap_at_fifteen_minutes() {
        assert_eq!(delay_seconds(Duration::from_millis(1)), 1);
        assert_eq!(delay_seconds(Duration::from_millis(2000)), 2);
        assert_eq!(delay_seconds(Duration::from_secs(3600)), 900);
    }
}
