//! The sweep's [`Redrive`] port on AWS: close reminders on CloseQueue,
//! release/settle run in-process, refunds back on RefundQueue.

use super::dynamo::DynamoStore;
use super::queue::{enqueue_refund, RefundMessage, SqsCloseReminders};
use super::scheduler::EventBridgeWakeUps;
use crate::channels::ConfiguredChannel;
use crate::domain::{OrderId, PaymentId};
use crate::ports::{Clock, Redrive, Unavailable};
use crate::store::{Cas, PaymentStore};
use crate::usecases::release_order::drive_effects;
use async_trait::async_trait;

pub struct AwsRedrive {
    pub store: DynamoStore,
    pub wakeups: EventBridgeWakeUps,
    pub channel: ConfiguredChannel,
    pub reminders: SqsCloseReminders,
    pub sqs: aws_sdk_sqs::Client,
    pub refund_queue_url: String,
    pub clock: Box<dyn Clock>,
}

#[async_trait]
impl Redrive for AwsRedrive {
    async fn close(&self, order_ids: &[OrderId]) -> Result<(), Unavailable> {
        self.reminders.remind_now(order_ids, "sweep").await
    }

    async fn effects(&self, order_id: &OrderId) -> Result<(), Unavailable> {
        drive_effects(&self.store, &self.wakeups, &self.channel, self.clock.as_ref(), order_id).await.map(|_| ())
    }

    async fn refund(&self, order_id: &OrderId, payment_id: &PaymentId) -> Result<(), Unavailable> {
        // Push the refund's due time forward first (conditional on it still
        // being REFUND_PENDING): a refund is re-driven once per retry
        // budget, and one that finished meanwhile is not re-driven at all.
        let Some(refund) = self.store.refund(order_id, payment_id).await? else {
            return Ok(());
        };
        if self.store.redrive_refund(&refund, self.clock.now()).await? == Cas::Rejected {
            return Ok(());
        }
        let message = RefundMessage { order_id: order_id.clone(), payment_id: payment_id.clone() };
        enqueue_refund(&self.sqs, &self.refund_queue_url, &message).await
    }
}
