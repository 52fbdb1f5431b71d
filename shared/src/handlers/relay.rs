//! The relay: the one reader of the table stream that publishes business
//! facts on the event bus, so that other services subscribe to the bus and
//! never to the table.
//!
//! Per stream record: decode the images by `entity` (an image that does
//! not decode is set aside through [`each_stream_record`]), map them to
//! integration events ([`events_of_change`]), publish, and retry the
//! entries the bus refused a few times within the invocation. What still
//! fails makes the record a transient failure (and the function fails the
//! invocation: `functions/bootstrap/src/relay.rs`), so the mapping delivers it again and the
//! relay publishes its events again. That is safe because a
//! record always maps to the same event ids and consumers deduplicate on
//! them; it also means delivery is at least once, never exactly once.

use super::batch::{decode_image, each_stream_record, RecordError};
use crate::domain::events::{events_of_change, IntegrationEvent, Record};
use crate::faults::Faults;
use crate::metrics;
use crate::ports::{DeadLetters, EventPublisher, PublishFailure};
use aws_lambda_events::event::dynamodb::{Event as StreamEvent, EventRecord};
use aws_lambda_events::event::streams::DynamoDbEventResponse;
use std::time::Duration;
use tracing::{info, warn};

/// How hard one invocation tries before handing a record back.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub retries: u32,
    /// The wait before the first retry; doubled for each next one.
    pub first_backoff: Duration,
}

impl Default for RetryPolicy {
    /// Three retries after 50, 100 and 200 ms: enough for a throttle to
    /// pass, short against the function's timeout.
    fn default() -> Self {
        Self { retries: 3, first_backoff: Duration::from_millis(50) }
    }
}

/// Relays one stream batch; the answer names the record to resume from.
pub async fn relay_batch<P, D>(
    event: StreamEvent,
    publisher: &P,
    dead_letters: &D,
    faults: Faults,
    policy: RetryPolicy,
) -> DynamoDbEventResponse
where
    P: EventPublisher + ?Sized,
    D: DeadLetters + ?Sized,
{
    each_stream_record(event, dead_letters, |record| async move {
        let events = events_of_record(&record)?;
        publish_all(publisher, &events, faults, policy).await
    })
    .await
}

/// The integration events of one stream record. Only ORDER and REFUND
/// items carry facts; any other entity yields nothing without decoding.
pub fn events_of_record(record: &EventRecord) -> Result<Vec<IntegrationEvent>, RecordError> {
    let old = decode_record(&record.change.old_image)?;
    let new = decode_record(&record.change.new_image)?;
    Ok(events_of_change(old.as_ref(), new.as_ref()))
}

/// An image as a domain record by its `entity`; `None` for an absent image
/// (INSERT's old, REMOVE's new) or an entity without integration events.
fn decode_record(image: &serde_dynamo::Item) -> Result<Option<Record>, RecordError> {
    #[derive(serde::Deserialize)]
    struct Entity {
        #[serde(default)]
        entity: Option<String>,
    }
    if image.is_empty() {
        return Ok(None);
    }
    let Entity { entity } = decode_image(image.clone())?;
    Ok(match entity.as_deref() {
        Some("ORDER") => Some(Record::Order(decode_image(image.clone())?)),
        Some("REFUND") => Some(Record::Refund(decode_image(image.clone())?)),
        _ => None,
    })
}

/// Publishes `events`, retrying the refused entries up to `policy.retries`
/// times. Each attempt sends only what is still unpublished, so an event is
/// published once per successful attempt. Counts `EventsPublished` (taken by
/// the bus), `EventPublishRetried` (entries refused and tried again) and
/// `EventPublishFailed` (entries still refused when the record is handed
/// back).
pub async fn publish_all<P: EventPublisher + ?Sized>(
    publisher: &P,
    events: &[IntegrationEvent],
    faults: Faults,
    policy: RetryPolicy,
) -> Result<(), RecordError> {
    let mut pending: Vec<&IntegrationEvent> = events.iter().collect();
    let mut backoff = policy.first_backoff;
    let mut last: Vec<PublishFailure> = Vec::new();
    for attempt in 0..=policy.retries {
        if pending.is_empty() {
            break;
        }
        if attempt > 0 {
            metrics::EVENT_PUBLISH_RETRIED.count(pending.len() as u64);
            tokio::time::sleep(backoff).await;
            backoff = backoff.saturating_mul(2);
        }
        let (refused, failures) = attempt_once(publisher, &pending, faults, attempt).await;
        let published = pending.len() - refused.len();
        if published > 0 {
            metrics::EVENTS_PUBLISHED.count(published as u64);
        }
        for f in &failures {
            warn!(attempt, code = %f.code, error = %f.message, "event not taken by the bus");
        }
        pending = refused;
        last = failures;
    }
    if pending.is_empty() {
        // One line per event, naming its order: what `orderctl events ID`
        // reads back from the relay's log group (the bus keeps no history
        // one could query per order).
        for e in events {
            info!(order_id = %e.order_id(), detail_type = e.detail_type(), event_id = e.event_id(),
                  version = e.version(), occurred_at = %e.occurred_at(), "event published");
        }
        return Ok(());
    }
    metrics::EVENT_PUBLISH_FAILED.count(pending.len() as u64);
    let ids: Vec<&str> = pending.iter().map(|e| e.event_id()).collect();
    let codes: Vec<&str> = last.iter().map(|f| f.code.as_str()).collect();
    Err(RecordError::Transient(format!(
        "{} event(s) not published after {} attempts: {ids:?} ({codes:?})",
        pending.len(),
        policy.retries + 1
    )))
}

/// One attempt: the events the fault switch holds back on a first attempt
/// are reported failed without being sent; the rest go to the publisher.
/// Returns the events not taken and why.
async fn attempt_once<'e, P: EventPublisher + ?Sized>(
    publisher: &P,
    pending: &[&'e IntegrationEvent],
    faults: Faults,
    attempt: u32,
) -> (Vec<&'e IntegrationEvent>, Vec<PublishFailure>) {
    let held =
        |e: &IntegrationEvent| attempt == 0 && e.user_id().is_some_and(|u| faults.first_publish_fails(u.as_str()));
    let (held_back, to_send): (Vec<&IntegrationEvent>, Vec<&IntegrationEvent>) =
        pending.iter().copied().partition(|e| held(e));
    let mut refused: Vec<&IntegrationEvent> = Vec::new();
    let mut failures: Vec<PublishFailure> = Vec::new();
    for (i, e) in held_back.iter().enumerate() {
        refused.push(e);
        failures.push(PublishFailure {
            index: i,
            code: "FaultInjection".into(),
            message: "fault injection: first publish attempt reported failed".into(),
        });
    }
    if to_send.is_empty() {
        return (refused, failures);
    }
    let batch: Vec<IntegrationEvent> = to_send.iter().map(|e| (*e).clone()).collect();
    match publisher.publish(&batch).await {
        Ok(bus_failures) => {
            for f in bus_failures {
                if let Some(e) = to_send.get(f.index) {
                    refused.push(e);
                    failures.push(f);
                }
            }
        }
        Err(e) => {
            let why = crate::error::error_chain(&e);
            refused.extend(to_send.iter().copied());
            failures.extend((0..to_send.len()).map(|index| PublishFailure {
                index,
                code: "Unavailable".into(),
                message: why.clone(),
            }));
        }
    }
    (refused, failures)
}

/// What the relay answers for a batch: an event that could not be
/// published fails the whole invocation, not just its record. A partial
/// batch response is ignored by some pollers (the local emulator
/// acknowledges the whole batch), and a lost event is worse than a
/// re-published one (event ids are stable; subscribers deduplicate).
pub fn invocation_result(response: DynamoDbEventResponse) -> Result<DynamoDbEventResponse, lambda_runtime::Error> {
    match response.batch_item_failures.first() {
        None => Ok(response),
        Some(f) => Err(lambda_runtime::Error::from(format!(
            "events of stream record {} not published; the batch is retried",
            f.item_identifier.as_deref().unwrap_or("?")
        ))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_unpublished_record_fails_the_whole_invocation() {
        assert!(super::invocation_result(DynamoDbEventResponse::default()).is_ok());
        let mut failed = DynamoDbEventResponse::default();
        let mut f = aws_lambda_events::event::streams::DynamoDbBatchItemFailure::default();
        f.item_identifier = Some("42".into());
        failed.batch_item_failures.push(f);
        let err = super::invocation_result(failed).unwrap_err();
        assert!(err.to_string().contains("42"), "{err}");
    }

    use super::*;
    use crate::domain::events::examples::{moved, one_of_each, order};
    use crate::domain::{OrderStatus, UserId};
    use crate::ports::Unavailable;
    use async_trait::async_trait;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// Takes every event except those whose id is in `refuse_once`, which
    /// it refuses the first time it sees them; records what it took.
    #[derive(Default)]
    struct FakeBus {
        refuse_once: Mutex<Vec<String>>,
        refuse_always: Vec<String>,
        down: bool,
        calls: Mutex<u32>,
        taken: Mutex<Vec<IntegrationEvent>>,
    }

    #[async_trait]
    impl EventPublisher for FakeBus {
        async fn publish(&self, events: &[IntegrationEvent]) -> Result<Vec<PublishFailure>, Unavailable> {
            *self.calls.lock().unwrap() += 1;
            if self.down {
                return Err(Unavailable::new("put events", "connection refused"));
            }
            let mut failures = Vec::new();
            for (index, e) in events.iter().enumerate() {
                let mut once = self.refuse_once.lock().unwrap();
                let id = e.event_id().to_owned();
                if let Some(pos) = once.iter().position(|x| *x == id) {
                    once.remove(pos);
                    failures.push(PublishFailure { index, code: "ThrottlingException".into(), message: "slow".into() });
                } else if self.refuse_always.contains(&id) {
                    failures.push(PublishFailure { index, code: "InternalFailure".into(), message: "no".into() });
                } else {
                    self.taken.lock().unwrap().push(e.clone());
                }
            }
            Ok(failures)
        }
    }

    fn no_wait() -> RetryPolicy {
        RetryPolicy { retries: 3, first_backoff: Duration::ZERO }
    }

    fn times_taken(bus: &FakeBus) -> HashMap<String, usize> {
        let mut n = HashMap::new();
        for e in bus.taken.lock().unwrap().iter() {
            *n.entry(e.event_id().to_owned()).or_default() += 1;
        }
        n
    }

    #[tokio::test]
    async fn entries_refused_once_are_retried_and_every_event_is_published_once() {
        let events = one_of_each();
        let refuse: Vec<String> = [1, 4].iter().map(|&i| events[i].event_id().to_owned()).collect();
        let bus = FakeBus { refuse_once: Mutex::new(refuse), ..FakeBus::default() };
        publish_all(&bus, &events, Faults::default(), no_wait()).await.unwrap();
        let taken = times_taken(&bus);
        assert_eq!(taken.len(), events.len(), "no event lost");
        assert!(taken.values().all(|&n| n == 1), "{taken:?}");
        assert_eq!(*bus.calls.lock().unwrap(), 2, "the retry sends only the refused entries");
        assert_eq!(bus.taken.lock().unwrap()[4..].len(), 2);
    }

    #[tokio::test]
    async fn an_entry_still_refused_after_the_retries_fails_the_record_transiently() {
        let events = one_of_each();
        let stuck = events[2].event_id().to_owned();
        let bus = FakeBus { refuse_always: vec![stuck.clone()], ..FakeBus::default() };
        let err = publish_all(&bus, &events, Faults::default(), no_wait()).await.unwrap_err();
        assert!(matches!(&err, RecordError::Transient(why) if why.contains(&stuck)), "{err:?}");
        assert_eq!(*bus.calls.lock().unwrap(), 4, "one attempt and three retries");
        assert_eq!(times_taken(&bus).len(), events.len() - 1, "the others went out once each");
    }

    #[tokio::test]
    async fn a_bus_that_cannot_be_reached_fails_the_record_transiently() {
        let bus = FakeBus { down: true, ..FakeBus::default() };
        let err = publish_all(&bus, &one_of_each(), Faults::default(), no_wait()).await.unwrap_err();
        assert!(matches!(err, RecordError::Transient(_)));
    }

    #[tokio::test]
    async fn the_fault_switch_holds_back_the_first_attempt_of_a_drill_orders_events_only() {
        let mut drill = order();
        drill.user_id = UserId::parse("fault-relay-1").unwrap();
        let events = vec![
            events_of_change(None, Some(&Record::Order(drill.clone()))).remove(0),
            events_of_change(None, Some(&Record::Order(order()))).remove(0),
        ];
        let bus = FakeBus::default();
        publish_all(&bus, &events, Faults::enabled(), no_wait()).await.unwrap();
        let taken = bus.taken.lock().unwrap().clone();
        assert_eq!(taken.len(), 2);
        assert_eq!(taken[0].user_id().unwrap().as_str(), "user_1", "the other order went out first");
        assert_eq!(taken[1].user_id().unwrap().as_str(), "fault-relay-1", "the drill's on the retry");

        let bus = FakeBus::default();
        publish_all(&bus, &events, Faults::default(), no_wait()).await.unwrap();
        assert_eq!(*bus.calls.lock().unwrap(), 1, "switch off: nothing held back");
    }

    /// A stream record from the release fixture with the given images.
    fn record(old: Option<serde_json::Value>, new: Option<serde_json::Value>) -> EventRecord {
        let mut r: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/relay-order-closed.json")).unwrap();
        let mut r = r["Records"][0].take();
        let to_image = |v: Option<serde_json::Value>| match v {
            Some(v) => serde_json::to_value(serde_dynamo::to_item::<_, serde_dynamo::Item>(v).unwrap()).unwrap(),
            None => serde_json::json!({}),
        };
        r["dynamodb"]["OldImage"] = to_image(old);
        r["dynamodb"]["NewImage"] = to_image(new);
        serde_json::from_value(r).unwrap()
    }

    fn order_item(o: &crate::domain::Order) -> serde_json::Value {
        let mut v = serde_json::to_value(o).unwrap();
        v["entity"] = "ORDER".into();
        v["pk"] = format!("ORDER#{}", o.order_id).into();
        v["sk"] = "ORDER".into();
        v["due_shard"] = "OPEN#3".into();
        v
    }

    #[test]
    fn a_stream_record_decodes_by_entity_and_other_entities_yield_nothing() {
        let placed = order();
        let closed = moved(&placed, OrderStatus::Closed, "2026-01-01T10:30:00.500Z", "expired unpaid");
        let events = events_of_record(&record(Some(order_item(&placed)), Some(order_item(&closed)))).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event_id(), "OrderClosed:ord_1:2");

        let stock = serde_json::json!({"pk": "SKU#a", "sk": "STOCK", "entity": "STOCK", "available": 1});
        assert!(events_of_record(&record(Some(stock.clone()), Some(stock))).unwrap().is_empty());
        let idem = serde_json::json!({"pk": "IDEM#u#k", "sk": "IDEM", "order_id": "ord_1"});
        assert!(events_of_record(&record(None, Some(idem))).unwrap().is_empty());
    }

    #[test]
    fn an_order_image_that_does_not_decode_is_permanent() {
        let bad = serde_json::json!({"pk": "ORDER#x", "sk": "ORDER", "entity": "ORDER", "status": "LOST"});
        let err = events_of_record(&record(None, Some(bad))).unwrap_err();
        assert!(matches!(err, RecordError::Permanent(_)));
    }

    #[derive(Default)]
    struct Sink(Mutex<Vec<String>>);
    #[async_trait]
    impl DeadLetters for Sink {
        async fn set_aside(&self, body: String) -> Result<(), Unavailable> {
            self.0.lock().unwrap().push(body);
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_batch_sets_aside_an_undecodable_record_and_stops_at_an_unpublished_one() {
        let placed = order();
        let closed = moved(&placed, OrderStatus::Closed, "2026-01-01T10:30:00.500Z", "expired unpaid");
        let bad = serde_json::json!({"pk": "ORDER#x", "sk": "ORDER", "entity": "ORDER", "status": "LOST"});
        let mut batch: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/relay-order-closed.json")).unwrap();
        let records = [
            record(None, Some(order_item(&placed))),
            record(None, Some(bad)),
            record(Some(order_item(&placed)), Some(order_item(&closed))),
        ];
        batch["Records"] = records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut v = serde_json::to_value(r).unwrap();
                v["dynamodb"]["SequenceNumber"] = (i + 1).to_string().into();
                v
            })
            .collect();
        let event: StreamEvent = serde_json::from_value(batch).unwrap();
        let bus = FakeBus { refuse_always: vec!["OrderClosed:ord_1:2".into()], ..FakeBus::default() };
        let sink = Sink::default();
        let resp = relay_batch(event, &bus, &sink, Faults::default(), no_wait()).await;
        let failed: Vec<_> = resp.batch_item_failures.into_iter().filter_map(|f| f.item_identifier).collect();
        assert_eq!(failed, ["3"]);
        assert_eq!(sink.0.lock().unwrap().len(), 1);
        assert_eq!(times_taken(&bus).get("OrderPlaced:ord_1"), Some(&1));
    }
}
