//! Decoding of the batch triggers (DynamoDB stream, SQS) and their partial
//! batch responses.

use aws_lambda_events::event::dynamodb::{Event as StreamEvent, EventRecord};
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use std::future::Future;
use tracing::error;

/// Processes stream records in order. On the first failure it stops and
/// reports that record's sequence number: the mapping retries from there,
/// so nothing after a failure is skipped and nothing is dropped silently.
pub async fn each_stream_record<F, Fut, E>(event: StreamEvent, mut f: F) -> DynamoDbEventResponse
where
    F: FnMut(EventRecord) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut response = DynamoDbEventResponse::default();
    for record in event.records {
        let seq = record.change.sequence_number.clone();
        if let Err(e) = f(record).await {
            error!(sequence_number = seq.as_deref().unwrap_or(""), error = %e, "stream record failed; will be retried");
            let mut failure = DynamoDbBatchItemFailure::default();
            failure.item_identifier = seq;
            response.batch_item_failures.push(failure);
            break;
        }
    }
    response
}

/// Processes SQS messages independently and names only the failed ones, so
/// one bad message never makes the rest of the batch run again.
pub async fn each_sqs_message<F, Fut, E>(event: SqsEvent, mut f: F) -> SqsBatchResponse
where
    F: FnMut(SqsMessage) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut response = SqsBatchResponse::default();
    for message in event.records {
        let id = message.message_id.clone().unwrap_or_default();
        if let Err(e) = f(message).await {
            error!(message_id = %id, error = %e, "message failed; will be retried");
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            response.batch_item_failures.push(failure);
        }
    }
    response
}

/// Decodes a stream image (new or old) into a domain record.
pub fn decode_image<T: serde::de::DeserializeOwned>(image: serde_dynamo::Item) -> Result<T, String> {
    serde_dynamo::from_item(image).map_err(|e| format!("undecodable stream image: {e}"))
}
