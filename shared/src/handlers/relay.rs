//! The relay: the one reader of the table stream that publishes business
//! facts on the event bus, so that other services subscribe to the bus and
//! never to the table.
//!
//! Per stream batch: decode every record's images by `entity` (an image
//! that does not decode is set aside through [`each_stream_record`]), map
//! them to integration events ([`events_of_change`]), and publish the
//! batch's events together, packed into calls the bus takes whole (ten
//! entries, under 256 KB: [`MAX_EVENTS_PER_PUBLISH`], [`MAX_PUBLISH_BYTES`])
//! rather than one call per record: a call costs the same round trip for
//! one entry or ten, and that round trip was the relay's ceiling per shard.
//! The entries the bus refuses are tried again a few times within the
//! invocation, alone; an entry the bus took is never sent again.
//!
//! Then the records are walked in order: a record is acknowledged only when
//! every one of its events is on the bus, and the first that is not is the
//! checkpoint the batch response names (the function then fails the
//! invocation: `functions/bootstrap/src/relay.rs`, [`invocation_result`]),
//! so the mapping delivers it again and the relay publishes its events
//! again. The records after it were published too, and will be again: that
//! is safe because a record always maps to the same event ids and
//! consumers deduplicate on them; it also means delivery is at least once,
//! never exactly once.

use super::batch::{decode_image, each_stream_record, RecordError};
use crate::domain::events::{events_of_change, IntegrationEvent, Record};
use crate::error::error_chain;
use crate::faults::Faults;
use crate::metrics;
use crate::ports::{
    publish_size, DeadLetters, EventPublisher, PublishFailure, MAX_EVENTS_PER_PUBLISH, MAX_PUBLISH_BYTES,
};
use aws_lambda_events::event::dynamodb::{Event as StreamEvent, EventRecord};
use aws_lambda_events::event::streams::DynamoDbEventResponse;
use futures_util::stream::{self, StreamExt};
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

/// How many calls of one attempt are in flight at once. The mapping's
/// batch (`BatchSize` 50 records, at most one event each today) packs into
/// five calls, so a batch costs one round trip rather than five; the bound
/// keeps one invocation from spending the account's `PutEvents` rate alone
/// when a larger batch comes.
pub const CALLS_IN_FLIGHT: usize = 5;

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
    let decoded: Vec<_> = event.records.iter().map(events_of_record).collect();
    relay_decoded_batch(event, decoded, publisher, dead_letters, faults, policy).await
}

/// [`relay_batch`] once each record is decoded: `decoded[i]` is what
/// `event.records[i]` yields (its events, or why it can never be
/// processed). Publishes every event of the batch, then walks the records
/// in order through [`each_stream_record`]: a record whose events are all
/// on the bus is acknowledged, one that can never be processed is set
/// aside, and the first with an event not published stops the walk.
pub async fn relay_decoded_batch<P, D>(
    event: StreamEvent,
    decoded: Vec<Result<Vec<IntegrationEvent>, RecordError>>,
    publisher: &P,
    dead_letters: &D,
    faults: Faults,
    policy: RetryPolicy,
) -> DynamoDbEventResponse
where
    P: EventPublisher + ?Sized,
    D: DeadLetters + ?Sized,
{
    assert_eq!(decoded.len(), event.records.len(), "one decoding per stream record");
    let events: Vec<&[IntegrationEvent]> = decoded.iter().map(|d| d.as_deref().unwrap_or_default()).collect();
    let published = publish_records(publisher, &events, faults, policy).await;
    let mut outcomes = decoded.iter().zip(published).map(|(d, p)| d.as_ref().map_err(Clone::clone).and(p));
    // `each_stream_record` hands the records over in the batch's order,
    // the order `outcomes` is in.
    each_stream_record(event, dead_letters, move |_record| {
        std::future::ready(outcomes.next().expect("one outcome per stream record"))
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

/// One event of the batch on its way to the bus.
struct Entry<'e> {
    /// The position of its stream record in the batch.
    record: usize,
    event: &'e IntegrationEvent,
    /// Its size as the bus counts it ([`publish_size`]), for packing.
    size: usize,
}

/// An entry the bus did not take: its index among the batch's entries,
/// and why.
type Refusal = (usize, PublishFailure);

/// Publishes the events of a batch's records (`records[i]`: the events of
/// record `i`), retrying the refused entries up to `policy.retries` times.
/// Each attempt sends only what is still unpublished, so an event is
/// published once per invocation. Answers per record: `Ok` once all its
/// events are on the bus, otherwise a transient failure naming the events
/// still refused.
///
/// Counts `EventsPublished` (taken by the bus), `EventPublishRetried`
/// (entries refused and tried again) and `EventPublishFailed` (entries
/// still refused when their records are handed back), and logs one `event
/// published` line per event as the bus takes it.
pub async fn publish_records<P: EventPublisher + ?Sized>(
    publisher: &P,
    records: &[&[IntegrationEvent]],
    faults: Faults,
    policy: RetryPolicy,
) -> Vec<Result<(), RecordError>> {
    let entries: Vec<Entry> = records
        .iter()
        .enumerate()
        .flat_map(|(record, events)| events.iter().map(move |event| Entry { record, event, size: publish_size(event) }))
        .collect();
    let mut pending: Vec<usize> = (0..entries.len()).collect();
    let mut refused: Vec<Refusal> = Vec::new();
    let mut backoff = policy.first_backoff;
    for attempt in 0..=policy.retries {
        if pending.is_empty() {
            break;
        }
        if attempt > 0 {
            metrics::EVENT_PUBLISH_RETRIED.count(pending.len() as u64);
            tokio::time::sleep(backoff).await;
            backoff = backoff.saturating_mul(2);
        }
        refused = attempt_once(publisher, &entries, &pending, faults, attempt).await;
        let taken: Vec<usize> = pending.iter().copied().filter(|i| !refused.iter().any(|(r, _)| r == i)).collect();
        taken_by_the_bus(&entries, &taken);
        for (_, f) in &refused {
            warn!(attempt, code = %f.code, error = %f.message, "event not taken by the bus");
        }
        pending = refused.iter().map(|(i, _)| *i).collect();
    }
    if !pending.is_empty() {
        metrics::EVENT_PUBLISH_FAILED.count(pending.len() as u64);
    }
    outcomes_by_record(records.len(), &entries, &refused, policy.retries + 1)
}

/// What the bus took: counted, and one line per event naming its order,
/// which is what `orderctl events ID` reads back from the relay's log group
/// (the bus keeps no history one could query per order).
fn taken_by_the_bus(entries: &[Entry], taken: &[usize]) {
    if taken.is_empty() {
        return;
    }
    metrics::EVENTS_PUBLISHED.count(taken.len() as u64);
    for e in taken.iter().map(|&i| entries[i].event) {
        info!(order_id = %e.order_id(), detail_type = e.detail_type(), event_id = e.event_id(),
              version = e.version(), occurred_at = %e.occurred_at(), "event published");
    }
}

/// Per record, `Ok` unless one of its entries is in `refused` (the last
/// attempt's refusals): then a transient failure naming those events.
fn outcomes_by_record(
    records: usize,
    entries: &[Entry],
    refused: &[Refusal],
    attempts: u32,
) -> Vec<Result<(), RecordError>> {
    (0..records)
        .map(|record| {
            let mine: Vec<&Refusal> = refused.iter().filter(|(i, _)| entries[*i].record == record).collect();
            if mine.is_empty() {
                return Ok(());
            }
            let ids: Vec<&str> = mine.iter().map(|(i, _)| entries[*i].event.event_id()).collect();
            let codes: Vec<&str> = mine.iter().map(|(_, f)| f.code.as_str()).collect();
            Err(RecordError::Transient(format!(
                "{} event(s) not published after {attempts} attempts: {ids:?} ({codes:?})",
                mine.len()
            )))
        })
        .collect()
}

/// One attempt at the `pending` entries: those the fault switch holds back
/// on a first attempt are reported refused without being sent; the rest go
/// in calls packed to the bus's limits, up to [`CALLS_IN_FLIGHT`] at once.
/// Returns the entries not taken, in the batch's order.
async fn attempt_once<P: EventPublisher + ?Sized>(
    publisher: &P,
    entries: &[Entry<'_>],
    pending: &[usize],
    faults: Faults,
    attempt: u32,
) -> Vec<Refusal> {
    let held =
        |i: &usize| attempt == 0 && entries[*i].event.user_id().is_some_and(|u| faults.first_publish_fails(u.as_str()));
    let (held_back, to_send): (Vec<usize>, Vec<usize>) = pending.iter().copied().partition(held);
    let mut refused: Vec<Refusal> = held_back
        .into_iter()
        .enumerate()
        .map(|(index, i)| {
            let message = "fault injection: first publish attempt reported failed".to_owned();
            (i, PublishFailure { index, code: "FaultInjection".into(), message })
        })
        .collect();
    let answers: Vec<Vec<Refusal>> = stream::iter(pack_calls(entries, &to_send))
        .map(|call| send_call(publisher, entries, call))
        .buffered(CALLS_IN_FLIGHT)
        .collect()
        .await;
    refused.extend(answers.into_iter().flatten());
    refused.sort_by_key(|(i, _)| *i);
    // A bus naming one entry twice still refused it once.
    refused.dedup_by_key(|(i, _)| *i);
    refused
}

/// The entries `to_send`, in order, packed into calls the bus takes whole:
/// a call is closed when the next entry would make it more than
/// [`MAX_EVENTS_PER_PUBLISH`] entries or reach [`MAX_PUBLISH_BYTES`]. An
/// entry too big on its own goes alone, for the bus to refuse (an order
/// has at most 40 lines, so its events stay far below the limit).
fn pack_calls(entries: &[Entry], to_send: &[usize]) -> Vec<Vec<usize>> {
    let mut calls: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0;
    for &i in to_send {
        let size = entries[i].size;
        match calls.last_mut() {
            Some(call) if call.len() < MAX_EVENTS_PER_PUBLISH && bytes + size < MAX_PUBLISH_BYTES => {
                call.push(i);
                bytes += size;
            }
            _ => {
                calls.push(vec![i]);
                bytes = size;
            }
        }
    }
    calls
}

/// One call to the bus with the entries `call`; answers those it did not
/// take. A call that could not be made at all refuses every entry in it.
async fn send_call<P: EventPublisher + ?Sized>(publisher: &P, entries: &[Entry<'_>], call: Vec<usize>) -> Vec<Refusal> {
    let events: Vec<IntegrationEvent> = call.iter().map(|&i| entries[i].event.clone()).collect();
    match publisher.publish(&events).await {
        Ok(failures) => failures.into_iter().filter_map(|f| call.get(f.index).map(|&i| (i, f))).collect(),
        Err(e) => {
            let why = error_chain(&e);
            call.iter()
                .enumerate()
                .map(|(index, &i)| (i, PublishFailure { index, code: "Unavailable".into(), message: why.clone() }))
                .collect()
        }
    }
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
    /// it refuses the first time it sees them, and those in
    /// `refuse_always`; records each call's event ids and what it took.
    #[derive(Default)]
    struct FakeBus {
        refuse_once: Mutex<Vec<String>>,
        refuse_always: Vec<String>,
        down: bool,
        calls: Mutex<Vec<Vec<String>>>,
        taken: Mutex<Vec<IntegrationEvent>>,
    }

    impl FakeBus {
        fn calls(&self) -> Vec<Vec<String>> {
            self.calls.lock().unwrap().clone()
        }
    }

    #[async_trait]
    impl EventPublisher for FakeBus {
        async fn publish(&self, events: &[IntegrationEvent]) -> Result<Vec<PublishFailure>, Unavailable> {
            self.calls.lock().unwrap().push(events.iter().map(|e| e.event_id().to_owned()).collect());
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

    /// The events of one record, published as a batch of one record.
    async fn publish_all(
        bus: &FakeBus,
        events: &[IntegrationEvent],
        faults: Faults,
        policy: RetryPolicy,
    ) -> Result<(), RecordError> {
        publish_records(bus, &[events], faults, policy).await.remove(0)
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
        let bus = FakeBus { refuse_once: Mutex::new(refuse.clone()), ..FakeBus::default() };
        publish_all(&bus, &events, Faults::default(), no_wait()).await.unwrap();
        let taken = times_taken(&bus);
        assert_eq!(taken.len(), events.len(), "no event lost");
        assert!(taken.values().all(|&n| n == 1), "{taken:?}");
        assert_eq!(bus.calls().len(), 2, "the retry sends only the refused entries");
        // The refused two went out last, in the retry.
        let last: Vec<String> =
            bus.taken.lock().unwrap()[events.len() - 2..].iter().map(|e| e.event_id().to_owned()).collect();
        assert_eq!(last, refuse);
    }

    #[tokio::test]
    async fn an_entry_still_refused_after_the_retries_fails_the_record_transiently() {
        let events = one_of_each();
        let stuck = events[2].event_id().to_owned();
        let bus = FakeBus { refuse_always: vec![stuck.clone()], ..FakeBus::default() };
        let err = publish_all(&bus, &events, Faults::default(), no_wait()).await.unwrap_err();
        assert!(matches!(&err, RecordError::Transient(why) if why.contains(&stuck)), "{err:?}");
        assert_eq!(bus.calls().len(), 4, "one attempt and three retries");
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
        assert_eq!(bus.calls().len(), 1, "switch off: nothing held back");
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
        let event = stream_batch(&[
            record(None, Some(order_item(&placed))),
            record(None, Some(bad)),
            record(Some(order_item(&placed)), Some(order_item(&closed))),
        ]);
        let bus = FakeBus { refuse_always: vec!["OrderClosed:ord_1:2".into()], ..FakeBus::default() };
        let sink = Sink::default();
        let resp = relay_batch(event, &bus, &sink, Faults::default(), no_wait()).await;
        let failed: Vec<_> = resp.batch_item_failures.into_iter().filter_map(|f| f.item_identifier).collect();
        assert_eq!(failed, ["3"]);
        assert_eq!(sink.0.lock().unwrap().len(), 1);
        assert_eq!(times_taken(&bus).get("OrderPlaced:ord_1"), Some(&1));
    }

    #[tokio::test]
    async fn an_unpublished_record_before_an_undecodable_one_is_the_checkpoint_and_nothing_is_set_aside_yet() {
        let placed = order();
        let closed = moved(&placed, OrderStatus::Closed, "2026-01-01T10:30:00.500Z", "expired unpaid");
        let bad = serde_json::json!({"pk": "ORDER#x", "sk": "ORDER", "entity": "ORDER", "status": "LOST"});
        let event = stream_batch(&[
            record(None, Some(order_item(&placed))),
            record(Some(order_item(&placed)), Some(order_item(&closed))),
            record(None, Some(bad)),
            record(None, Some(order_item(&order_no(7)))),
        ]);
        let bus = FakeBus { refuse_always: vec!["OrderClosed:ord_1:2".into()], ..FakeBus::default() };
        let sink = Sink::default();
        let resp = relay_batch(event, &bus, &sink, Faults::default(), no_wait()).await;
        assert_eq!(failed_records(resp), ["2"]);
        assert_eq!(sink.0.lock().unwrap().len(), 0, "the walk stopped before the undecodable record");
        let taken = times_taken(&bus);
        assert_eq!(taken.get(&placed_id(7)), Some(&1), "a later record went out beside it");
    }

    #[tokio::test]
    async fn an_undecodable_record_that_cannot_be_set_aside_is_the_checkpoint_though_a_later_one_failed_too() {
        let placed = order();
        let closed = moved(&placed, OrderStatus::Closed, "2026-01-01T10:30:00.500Z", "expired unpaid");
        let bad = serde_json::json!({"pk": "ORDER#x", "sk": "ORDER", "entity": "ORDER", "status": "LOST"});
        let event =
            stream_batch(&[record(None, Some(bad)), record(Some(order_item(&placed)), Some(order_item(&closed)))]);
        let bus = FakeBus { refuse_always: vec!["OrderClosed:ord_1:2".into()], ..FakeBus::default() };
        let sink = BrokenSink;
        let resp = relay_batch(event, &bus, &sink, Faults::default(), no_wait()).await;
        assert_eq!(failed_records(resp), ["1"]);
    }

    struct BrokenSink;
    #[async_trait]
    impl DeadLetters for BrokenSink {
        async fn set_aside(&self, _: String) -> Result<(), Unavailable> {
            Err(Unavailable::new("dlq", "down"))
        }
    }

    /// `records` as one stream batch, with sequence numbers 1, 2, 3, …
    fn stream_batch(records: &[EventRecord]) -> StreamEvent {
        let mut batch: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/relay-order-closed.json")).unwrap();
        batch["Records"] = records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut v = serde_json::to_value(r).unwrap();
                v["dynamodb"]["SequenceNumber"] = (i + 1).to_string().into();
                v
            })
            .collect();
        serde_json::from_value(batch).unwrap()
    }

    /// A new order `ord_{i}`.
    fn order_no(i: usize) -> crate::domain::Order {
        let mut o = order();
        o.order_id = crate::domain::OrderId::parse(format!("ord_{i}")).unwrap();
        o
    }

    /// The stream record of order `ord_{i}`'s INSERT (its OrderPlaced).
    fn placed_record(i: usize) -> EventRecord {
        record(None, Some(order_item(&order_no(i))))
    }

    /// The OrderPlaced event of order `ord_{i}`.
    fn placed_event(i: usize) -> IntegrationEvent {
        events_of_change(None, Some(&Record::Order(order_no(i)))).remove(0)
    }

    fn placed_id(i: usize) -> String {
        format!("OrderPlaced:ord_{i}")
    }

    fn failed_records(resp: DynamoDbEventResponse) -> Vec<String> {
        resp.batch_item_failures.into_iter().filter_map(|f| f.item_identifier).collect()
    }

    #[tokio::test]
    async fn an_entry_refused_in_a_call_of_ten_is_sent_again_alone_and_the_other_nine_go_once() {
        let event = stream_batch(&(0..10).map(placed_record).collect::<Vec<_>>());
        let bus = FakeBus { refuse_once: Mutex::new(vec![placed_id(4)]), ..FakeBus::default() };
        let resp = relay_batch(event, &bus, &Sink::default(), Faults::default(), no_wait()).await;
        assert_eq!(failed_records(resp), Vec::<String>::new(), "every record acknowledged");
        let all: Vec<String> = (0..10).map(placed_id).collect();
        assert_eq!(bus.calls(), [all, vec![placed_id(4)]], "one call of ten, then the refused entry alone");
        let taken = times_taken(&bus);
        assert_eq!(taken.len(), 10, "none lost: {taken:?}");
        assert!(taken.values().all(|&n| n == 1), "none duplicated: {taken:?}");
    }

    #[tokio::test]
    async fn a_record_whose_event_keeps_failing_is_the_checkpoint_though_later_records_went_out_beside_it() {
        let event = stream_batch(&(0..12).map(placed_record).collect::<Vec<_>>());
        let bus = FakeBus { refuse_always: vec![placed_id(5)], ..FakeBus::default() };
        let resp = relay_batch(event, &bus, &Sink::default(), Faults::default(), no_wait()).await;
        assert_eq!(failed_records(resp), ["6"], "ord_5's record (the 6th) is where the mapping resumes");
        let calls = bus.calls();
        assert_eq!(calls.iter().map(Vec::len).collect::<Vec<_>>(), [10, 2, 1, 1, 1], "{calls:?}");
        assert!(calls[2..].iter().all(|c| *c == [placed_id(5)]), "the retries send only the refused entry");
        let taken = times_taken(&bus);
        assert_eq!(taken.get(&placed_id(5)), None);
        for i in (0..12).filter(|&i| i != 5) {
            assert_eq!(taken.get(&placed_id(i)), Some(&1), "ord_{i} went out once: {taken:?}");
        }
        assert!(super::invocation_result(failed_batch("6")).is_err(), "and the invocation fails");
    }

    fn failed_batch(seq: &str) -> DynamoDbEventResponse {
        let mut resp = DynamoDbEventResponse::default();
        let mut f = aws_lambda_events::event::streams::DynamoDbBatchItemFailure::default();
        f.item_identifier = Some(seq.into());
        resp.batch_item_failures.push(f);
        resp
    }

    /// Records 1 and 2 carry four events each, record 3 three (entries 9,
    /// 10 and 11: across the first call's end), record 4 one.
    fn three_events_across_a_call() -> (StreamEvent, Vec<Result<Vec<IntegrationEvent>, RecordError>>) {
        let event = stream_batch(&(0..4).map(placed_record).collect::<Vec<_>>());
        let decoded = [0..4, 4..8, 8..11, 11..12].into_iter().map(|r| Ok(r.map(placed_event).collect())).collect();
        (event, decoded)
    }

    #[tokio::test]
    async fn a_records_three_events_across_two_calls_are_published_once_each_and_the_record_acknowledged() {
        let (event, decoded) = three_events_across_a_call();
        let bus = FakeBus::default();
        let resp = relay_decoded_batch(event, decoded, &bus, &Sink::default(), Faults::default(), no_wait()).await;
        assert_eq!(failed_records(resp), Vec::<String>::new());
        let calls = bus.calls();
        assert_eq!(calls[0], (0..10).map(placed_id).collect::<Vec<_>>(), "the first call is full");
        assert_eq!(calls[1], [placed_id(10), placed_id(11)]);
        assert_eq!(calls.len(), 2);
        let taken = times_taken(&bus);
        assert!(taken.len() == 12 && taken.values().all(|&n| n == 1), "{taken:?}");
    }

    #[tokio::test]
    async fn a_record_with_one_of_its_three_events_refused_is_the_checkpoint_and_its_others_are_not_resent() {
        let (event, decoded) = three_events_across_a_call();
        // ord_10: record 3's third event, in the second call; its first
        // two went out in the first call.
        let bus = FakeBus { refuse_always: vec![placed_id(10)], ..FakeBus::default() };
        let resp = relay_decoded_batch(event, decoded, &bus, &Sink::default(), Faults::default(), no_wait()).await;
        assert_eq!(failed_records(resp), ["3"], "record 3 is not acknowledged, nor record 4 after it");
        let calls = bus.calls();
        assert_eq!(calls.len(), 5, "two calls, then three retries: {calls:?}");
        assert!(calls[2..].iter().all(|c| *c == [placed_id(10)]), "only the refused entry is sent again: {calls:?}");
        let taken = times_taken(&bus);
        assert_eq!((taken.get(&placed_id(8)), taken.get(&placed_id(9))), (Some(&1), Some(&1)));
        assert_eq!(taken.get(&placed_id(10)), None);
    }

    #[tokio::test]
    async fn a_call_stays_under_the_bus_request_size() {
        // Orders of 2,200 lines: about 90 KB of detail each, so three do
        // not fit one request though ten entries would.
        let big = |i: usize| {
            let mut o = order_no(i);
            o.items = vec![o.items[0].clone(); 2200];
            events_of_change(None, Some(&Record::Order(o))).remove(0)
        };
        let events: Vec<IntegrationEvent> = (0..3).map(big).collect();
        let size = publish_size(&events[0]);
        assert!(size * 2 < MAX_PUBLISH_BYTES && size * 3 >= MAX_PUBLISH_BYTES, "{size} bytes an event");
        let event = stream_batch(&[placed_record(0)]);
        let bus = FakeBus::default();
        let resp =
            relay_decoded_batch(event, vec![Ok(events)], &bus, &Sink::default(), Faults::default(), no_wait()).await;
        assert_eq!(failed_records(resp), Vec::<String>::new());
        assert_eq!(bus.calls(), [vec![placed_id(0), placed_id(1)], vec![placed_id(2)]]);
    }
}
