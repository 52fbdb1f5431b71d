//! The sweep's [`Redrive`] port on AWS: close reminders on CloseQueue,
//! pending effects (release, settle, refund re-drives) on PendingEffectsQueue.
//! Both are one `SendMessageBatch` per ten; nothing is driven in the sweep.

use super::queue::{SqsCloseReminders, SqsPendingEffects};
use crate::domain::OrderId;
use crate::ports::{PendingEffect, Redrive, Unavailable};
use async_trait::async_trait;

pub struct AwsRedrive {
    pub reminders: SqsCloseReminders,
    pub effects: SqsPendingEffects,
}

#[async_trait]
impl Redrive for AwsRedrive {
    async fn close(&self, order_ids: &[OrderId]) -> Result<(), Unavailable> {
        self.reminders.remind_now(order_ids, "sweep").await
    }

    async fn effects(&self, effects: &[PendingEffect]) -> Result<(), Unavailable> {
        self.effects.hand_off(effects).await
    }
}
