//! EventBridge Scheduler adapter: one one-shot schedule per order.

use crate::domain::{OrderId, Timestamp};
use crate::ports::{Scheduled, Unavailable, WakeUpScheduler};
use async_trait::async_trait;
use aws_sdk_scheduler::error::ProvideErrorMetadata;
use aws_sdk_scheduler::types::{
    ActionAfterCompletion, DeadLetterConfig, FlexibleTimeWindow, FlexibleTimeWindowMode, RetryPolicy, Target,
};
use aws_sdk_scheduler::Client;

pub struct EventBridgeWakeUps {
    client: Client,
    group: String,
    queue_arn: String,
    role_arn: String,
    dead_letter_arn: Option<String>,
}

/// How long Scheduler keeps retrying a wake-up its target refused (the
/// queue unavailable, a permission missing) before the dead-letter queue.
/// The sweep covers the order either way; this bounds the noise.
pub const WAKE_UP_RETRY_ATTEMPTS: i32 = 10;
pub const WAKE_UP_MAX_EVENT_AGE_SECONDS: i32 = 3600;

impl EventBridgeWakeUps {
    pub fn new(client: Client, group: String, queue_arn: String, role_arn: String) -> Self {
        Self { client, group, queue_arn, role_arn, dead_letter_arn: None }
    }
    /// Where Scheduler puts a wake-up it could not deliver after its retries.
    pub fn with_dead_letter(mut self, arn: Option<String>) -> Self {
        self.dead_letter_arn = arn.filter(|a| !a.is_empty());
        self
    }
}

/// The schedule's name is derived from the order id, so that creating it
/// twice is detectable as a conflict and deleting it needs no lookup.
pub fn schedule_name(order_id: &OrderId) -> String {
    format!("order-{order_id}")
}

#[async_trait]
impl WakeUpScheduler for EventBridgeWakeUps {
    async fn schedule_wake_up(&self, order_id: &OrderId, at: Timestamp) -> Result<Scheduled, Unavailable> {
        let retry = RetryPolicy::builder()
            .maximum_retry_attempts(WAKE_UP_RETRY_ATTEMPTS)
            .maximum_event_age_in_seconds(WAKE_UP_MAX_EVENT_AGE_SECONDS)
            .build();
        let target = Target::builder()
            .arn(&self.queue_arn)
            .role_arn(&self.role_arn)
            .input(serde_json::json!({ "order_id": order_id, "trigger": "schedule" }).to_string())
            .retry_policy(retry)
            .set_dead_letter_config(
                self.dead_letter_arn.as_ref().map(|arn| DeadLetterConfig::builder().arn(arn).build()),
            )
            .build()
            .map_err(|e| Unavailable::new("build schedule target", e))?;
        let window = FlexibleTimeWindow::builder()
            .mode(FlexibleTimeWindowMode::Off)
            .build()
            .map_err(|e| Unavailable::new("build schedule window", e))?;
        let res = self
            .client
            .create_schedule()
            .name(schedule_name(order_id))
            .group_name(&self.group)
            .schedule_expression(format!("at({})", at.scheduler_at()))
            .schedule_expression_timezone("UTC")
            .flexible_time_window(window)
            .action_after_completion(ActionAfterCompletion::Delete)
            .target(target)
            .send()
            .await;
        match res {
            Ok(_) => Ok(Scheduled::Created),
            Err(e) if e.as_service_error().and_then(|s| s.code()) == Some("ConflictException") => {
                Ok(Scheduled::AlreadyExisted)
            }
            Err(e) => Err(Unavailable::new("create schedule", e)),
        }
    }

    async fn cancel_wake_up(&self, order_id: &OrderId) -> Result<(), Unavailable> {
        let res = self.client.delete_schedule().name(schedule_name(order_id)).group_name(&self.group).send().await;
        match res {
            Ok(_) => Ok(()),
            Err(e) if e.as_service_error().and_then(|s| s.code()) == Some("ResourceNotFoundException") => Ok(()),
            Err(e) => Err(Unavailable::new("delete schedule", e)),
        }
    }
}
