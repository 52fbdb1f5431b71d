//! Decoding of the batch triggers (DynamoDB stream, SQS) and their partial
//! batch responses.

use crate::error::error_chain;
use crate::metrics;
use crate::ports::{DeadLetters, Unavailable};
use aws_lambda_events::event::dynamodb::{Event as StreamEvent, EventRecord};
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use std::future::Future;
use tracing::error;

/// Why a stream record failed, which decides what happens to the batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// A passing fault (the table or a queue did not answer): the same
    /// record may well succeed when the mapping retries it.
    #[error("{0}")]
    Transient(String),
    /// The record can never be processed (it does not decode, or it breaks
    /// an invariant): retrying would only hold up the records behind it.
    #[error("{0}")]
    Permanent(String),
}

impl From<Unavailable> for RecordError {
    fn from(e: Unavailable) -> Self {
        Self::Transient(error_chain(&e))
    }
}

/// Processes stream records in order. A transient failure stops the batch
/// and reports that record's sequence number: the mapping retries from
/// there, so nothing after it is skipped. A permanent failure sets the
/// record itself (its JSON) aside on `dead_letters`, counts it
/// (`StreamRecordSetAside`) and goes on; if it cannot be set aside, it is
/// treated as transient, so a record is never dropped silently.
pub async fn each_stream_record<D, F, Fut>(event: StreamEvent, dead_letters: &D, mut f: F) -> DynamoDbEventResponse
where
    D: DeadLetters + ?Sized,
    F: FnMut(EventRecord) -> Fut,
    Fut: Future<Output = Result<(), RecordError>>,
{
    let mut response = DynamoDbEventResponse::default();
    for record in event.records {
        let seq = record.change.sequence_number.clone();
        let seq_str = seq.as_deref().unwrap_or("").to_owned();
        let why = match f(record.clone()).await {
            Ok(()) => continue,
            Err(RecordError::Permanent(why)) => {
                let body = serde_json::to_string(&record).expect("a decoded stream record serialises");
                match dead_letters.set_aside(body).await {
                    Ok(()) => {
                        error!(sequence_number = %seq_str, error = %why, "stream record can never be processed; set aside");
                        metrics::STREAM_RECORD_SET_ASIDE.count(1);
                        continue;
                    }
                    Err(e) => format!("{why}; and it could not be set aside: {}", error_chain(&e)),
                }
            }
            Err(RecordError::Transient(why)) => why,
        };
        error!(sequence_number = %seq_str, error = %why, "stream record failed; will be retried");
        let mut failure = DynamoDbBatchItemFailure::default();
        failure.item_identifier = seq;
        response.batch_item_failures.push(failure);
        break;
    }
    response
}

/// Processes SQS messages one after the other and names only the failed
/// ones, so one bad message never makes the rest of the batch run again.
///
/// One at a time on purpose: handling a batch's messages concurrently (up to
/// 10) was tried for the drain benchmark
/// (BENCHMARKS.md#history-the-10000-order-drain-on-2026-11-30) and made no
/// difference on the emulator, while on AWS it would multiply the
/// transactions meeting on one hot SKU's stock item during a mass expiry
/// (every release of a batch at once, times the mapping's concurrency), and a
/// transaction that loses its retries waits out the queue's visibility
/// timeout.
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
            fail_message(&mut response, id, e);
        }
    }
    response
}

/// Names message `id` as failed in the batch's answer (it comes back after
/// the queue's visibility timeout), logged with why.
pub(super) fn fail_message(response: &mut SqsBatchResponse, id: String, e: impl std::fmt::Display) {
    error!(message_id = %id, error = %e, "message failed; will be retried");
    let mut failure = BatchItemFailure::default();
    failure.item_identifier = id;
    response.batch_item_failures.push(failure);
}

/// Why a message of [`each_sqs_message_within`] is named as failed.
#[derive(Debug, thiserror::Error)]
enum MessageFailure<E> {
    /// Too little of the invocation left to start it: handed back unstarted.
    #[error("not started: {} ms left in the invocation for {messages} messages", left.as_millis())]
    NotStarted { left: std::time::Duration, messages: usize },
    /// It ran and failed.
    #[error("{0}")]
    Failed(E),
}

/// The least time a message is started with: less than this left in the
/// invocation, and the message is handed back to its queue unstarted.
pub const MIN_MESSAGE_SHARE: std::time::Duration = std::time::Duration::from_secs(1);

/// As [`each_sqs_message`], inside the invocation's own time: each message
/// gets a fair share of what is left before `deadline` (the Lambda
/// context's, less a margin), at least [`MIN_MESSAGE_SHARE`], handed to `f`
/// as its deadline, so one slow message (a channel in a brownout) cannot
/// spend the time of the others. Once less than that least share is left,
/// the messages not started are reported as failures and come back after
/// the queue's visibility timeout, instead of being killed with the whole
/// batch when Lambda's timeout ends the invocation.
pub async fn each_sqs_message_within<F, Fut, E>(
    event: SqsEvent,
    deadline: std::time::Instant,
    mut f: F,
) -> SqsBatchResponse
where
    F: FnMut(SqsMessage, std::time::Instant) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut response = SqsBatchResponse::default();
    let count = event.records.len();
    for (i, message) in event.records.into_iter().enumerate() {
        let id = message.message_id.clone().unwrap_or_default();
        let now = std::time::Instant::now();
        let left = deadline.saturating_duration_since(now);
        let outcome = if left < MIN_MESSAGE_SHARE {
            Err(MessageFailure::NotStarted { left, messages: count - i })
        } else {
            let share = (left / (count - i) as u32).max(MIN_MESSAGE_SHARE);
            f(message, now + share).await.map_err(MessageFailure::Failed)
        };
        if let Err(e) = outcome {
            fail_message(&mut response, id, e);
        }
    }
    response
}

/// Time kept back from an invocation's deadline for its answer (the batch
/// response, an HTTP response): the functions' budgets end this long
/// before Lambda's timeout would.
pub const INVOCATION_MARGIN: std::time::Duration = std::time::Duration::from_millis(1500);

/// The instant of a Lambda context's deadline (milliseconds since the
/// epoch), less `margin` for the answer itself.
pub fn invocation_deadline(deadline_epoch_ms: u64, margin: std::time::Duration) -> std::time::Instant {
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let left = std::time::Duration::from_millis(deadline_epoch_ms.saturating_sub(now_ms));
    std::time::Instant::now() + left.saturating_sub(margin)
}

/// Decodes a stream image (new or old) into a domain record. A record that
/// does not decode now never will: the failure is permanent.
pub fn decode_image<T: serde::de::DeserializeOwned>(image: serde_dynamo::Item) -> Result<T, RecordError> {
    serde_dynamo::from_item(image).map_err(|e| RecordError::Permanent(format!("undecodable stream image: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use std::sync::Mutex;

    /// Keeps what is set aside; refuses everything when `broken`.
    #[derive(Default)]
    struct Sink {
        kept: Mutex<Vec<String>>,
        broken: bool,
    }
    #[async_trait]
    impl DeadLetters for Sink {
        async fn set_aside(&self, body: String) -> Result<(), Unavailable> {
            if self.broken {
                return Err(Unavailable::new("sink", "queue unavailable"));
            }
            self.kept.lock().unwrap().push(body);
            Ok(())
        }
    }

    /// Three records, sequence numbers 1, 2, 3, from the release fixture.
    fn three_records() -> StreamEvent {
        let mut event: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/relay-order-closed.json")).unwrap();
        let one = event["Records"][0].clone();
        event["Records"] = (1..=3)
            .map(|i| {
                let mut r = one.clone();
                r["dynamodb"]["SequenceNumber"] = serde_json::json!(i.to_string());
                r
            })
            .collect();
        serde_json::from_value(event).unwrap()
    }

    /// Runs the batch, failing record 2 with `fail`; returns the records
    /// that ran and the sequence numbers reported failed.
    async fn run(sink: &Sink, fail: RecordError) -> (Vec<String>, Vec<String>) {
        let ran = Mutex::new(Vec::new());
        let resp = each_stream_record(three_records(), sink, |r| {
            let seq = r.change.sequence_number.clone().unwrap();
            ran.lock().unwrap().push(seq.clone());
            let fail = fail.clone();
            async move {
                match seq.as_str() {
                    "2" => Err(fail),
                    _ => Ok(()),
                }
            }
        })
        .await;
        let failed = resp.batch_item_failures.into_iter().filter_map(|f| f.item_identifier).collect();
        (ran.into_inner().unwrap(), failed)
    }

    #[tokio::test]
    async fn a_permanent_failure_is_set_aside_and_the_records_after_it_run() {
        let sink = Sink::default();
        let (ran, failed) = run(&sink, RecordError::Permanent("undecodable".into())).await;
        assert_eq!(ran, ["1", "2", "3"]);
        assert_eq!(failed, Vec::<String>::new());
        let kept = sink.kept.lock().unwrap();
        assert_eq!(kept.len(), 1);
        let record: EventRecord = serde_json::from_str(&kept[0]).expect("the record itself, as JSON");
        assert_eq!(record.change.sequence_number.as_deref(), Some("2"));
    }

    #[tokio::test]
    async fn a_transient_failure_stops_the_batch_at_that_record() {
        let sink = Sink::default();
        let (ran, failed) = run(&sink, RecordError::Transient("table unavailable".into())).await;
        assert_eq!(ran, ["1", "2"]);
        assert_eq!(failed, ["2"]);
        assert!(sink.kept.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_permanent_failure_that_cannot_be_set_aside_stops_the_batch() {
        let sink = Sink { broken: true, ..Sink::default() };
        let (ran, failed) = run(&sink, RecordError::Permanent("undecodable".into())).await;
        assert_eq!(ran, ["1", "2"]);
        assert_eq!(failed, ["2"], "never dropped: retried like a passing fault");
    }

    /// `n` messages with ids m0, m1, …, from the close-order fixture.
    fn messages(n: usize) -> SqsEvent {
        let mut event: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/close-order.json")).unwrap();
        let one = event["Records"][0].clone();
        event["Records"] = (0..n)
            .map(|i| {
                let mut m = one.clone();
                m["messageId"] = serde_json::json!(format!("m{i}"));
                m
            })
            .collect();
        serde_json::from_value(event).unwrap()
    }

    #[tokio::test]
    async fn only_the_failed_messages_are_named_in_batch_order_and_the_rest_run() {
        let ran = Mutex::new(Vec::new());
        let response = each_sqs_message(messages(25), |m| {
            let id = m.message_id.clone().unwrap();
            ran.lock().unwrap().push(id.clone());
            async move {
                let i: u64 = id[1..].parse().unwrap();
                if i % 7 == 3 {
                    Err(format!("{id} failed"))
                } else {
                    Ok(())
                }
            }
        })
        .await;
        let failed: Vec<String> = response.batch_item_failures.into_iter().map(|f| f.item_identifier).collect();
        assert_eq!(failed, ["m3", "m10", "m17", "m24"]);
        assert_eq!(ran.into_inner().unwrap().len(), 25, "every message ran, failed or not");
    }
}
