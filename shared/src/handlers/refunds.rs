//! The refund worker: one refund try per message on the refund queue.

use super::batch::each_sqs_message;
use crate::aws::dynamo::DynamoStore;
pub use crate::aws::queue::RefundMessage;
use crate::aws::queue::SqsRefundRetries;
use crate::channels::ConfiguredChannel;
use crate::domain::PaymentId;
use crate::error::error_chain;
use crate::ports::{Clock, RefundRetries, Unavailable};
use crate::usecases::refunds::{process_refund, RefundOutcome};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::Error;
use serde_json::Value;
use tracing::error;

pub struct RefundWorker {
    pub store: DynamoStore,
    pub channel: ConfiguredChannel,
    /// The refund queue's backoff and dead-letter queue.
    pub retries: SqsRefundRetries,
    pub clock: Box<dyn Clock>,
}

/// Why a refund message is named as failed: it comes back, after the
/// queue's visibility timeout or the backoff set on it.
#[derive(Debug, thiserror::Error)]
pub enum RefundMessageError {
    /// The try could not be made (the store or the channel did not
    /// answer); shown with its whole cause chain.
    #[error("{}", error_chain(.0))]
    Unavailable(Unavailable),
    /// The try failed, or the channel has not finished: failed on purpose,
    /// with the message's visibility set to `after` (the backoff).
    #[error("refund try failed; retrying in {} s", .0.as_secs())]
    RetryAfter(std::time::Duration),
    /// Given up on, and its dead letter could not be sent.
    #[error("move refund of {payment_id} to the dead-letter queue: {}", error_chain(.cause))]
    HandToPerson { payment_id: PaymentId, cause: Unavailable },
}

/// The refund queue: LatePaymentRefundRequested events (through the bus),
/// the worker's own retries, the sweep's re-drives and operator redrives.
pub async fn handle(w: &RefundWorker, event: Value) -> Result<Value, Error> {
    if event["Records"].as_array().is_none_or(|r| r.is_empty()) {
        return Ok(serde_json::json!({"batchItemFailures": []}));
    }
    let event: SqsEvent = serde_json::from_value(event)?;
    Ok(serde_json::to_value(sqs(w, event).await)?)
}

async fn sqs(w: &RefundWorker, event: SqsEvent) -> SqsBatchResponse {
    each_sqs_message(event, |message| async move {
        let body = message.body.unwrap_or_default();
        let msg: RefundMessage = match serde_json::from_str(&body) {
            Ok(m) => m,
            // It can never succeed: logged, counted, acknowledged. Refunds
            // themselves live in the table; a lost message is found by
            // reconciliation (refund state vs channel).
            Err(e) => {
                error!(error = %e, "malformed refund message dropped");
                crate::metrics::MALFORMED_REFUND_MESSAGE.count(1);
                return Ok(());
            }
        };
        match process_refund(&w.store, &w.channel, w.clock.as_ref(), &msg.order_id, &msg.payment_id)
            .await
            .map_err(RefundMessageError::Unavailable)?
        {
            RefundOutcome::Refunded
            | RefundOutcome::AlreadyDone
            | RefundOutcome::NotFound
            | RefundOutcome::Superseded => Ok(()),
            RefundOutcome::RetryAfter(after) | RefundOutcome::ChannelPending(after) => {
                // Failing the message with a longer visibility is the
                // backoff: SQS redelivers it after `after`.
                if let Some(receipt) = &message.receipt_handle {
                    if let Err(e) = w.retries.retry_after(receipt, after).await {
                        error!(error = %error_chain(&e), "could not set the refund retry delay");
                    }
                }
                Err(RefundMessageError::RetryAfter(after))
            }
            RefundOutcome::GiveUp(refund) => {
                // The refund is already REFUND_FAILED, recorded by the one
                // delivery whose conditional write applied: this one. If the
                // dead letter cannot be sent, the message fails and comes
                // back; that delivery finds REFUND_FAILED, tries once more
                // and, failing, gives up (and dead-letters) again.
                w.retries
                    .hand_to_person(body)
                    .await
                    .map_err(|cause| RefundMessageError::HandToPerson { payment_id: refund.payment_id, cause })?;
                Ok(())
            }
        }
    })
    .await
}
