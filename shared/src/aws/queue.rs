//! SQS adapters: close reminders put back with a delay; stream records set
//! aside on a dead-letter queue.

use crate::domain::OrderId;
use crate::ports::{CloseReminders, DeadLetters, Unavailable};
use async_trait::async_trait;
use aws_sdk_sqs::Client;
use std::time::Duration;

/// SQS refuses delays above 15 minutes; a longer wait is covered by
/// successive reminders, each re-checking the order.
pub const MAX_SQS_DELAY: Duration = Duration::from_secs(900);

/// The body of every close reminder, whoever sends it (scheduler, sweep,
/// the close function itself).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CloseMessage {
    pub order_id: OrderId,
}

pub struct SqsCloseReminders {
    client: Client,
    queue_url: String,
}

impl SqsCloseReminders {
    pub fn new(client: Client, queue_url: String) -> Self {
        Self { client, queue_url }
    }
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
        let body = serde_json::to_string(&CloseMessage { order_id: order_id.clone() }).expect("serialisable");
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
        Ok(Self::new(Client::new(config), super::env("STREAM_DEAD_LETTER_QUEUE_URL")?))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_up_and_cap_at_fifteen_minutes() {
        assert_eq!(delay_seconds(Duration::from_millis(1)), 1);
        assert_eq!(delay_seconds(Duration::from_millis(2000)), 2);
        assert_eq!(delay_seconds(Duration::from_secs(3600)), 900);
    }
}
