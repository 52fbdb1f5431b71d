//! EventBridge adapter of [`EventPublisher`]: `PutEvents` on the bus named
//! by `EVENT_BUS_NAME`, ten entries to a call (the API's limit).
//!
//! Each entry's `Time` is the event's `occurred_at`, so rules and archives
//! see when the fact happened, not when the relay got to it.

use crate::domain::events::{IntegrationEvent, SOURCE};
use crate::error::error_chain;
use crate::ports::{EventPublisher, PublishFailure, Unavailable};
use async_trait::async_trait;
use aws_sdk_eventbridge::primitives::DateTime;
use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use aws_sdk_eventbridge::Client;

/// `PutEvents` takes at most ten entries. The relay already hands over one
/// call's worth; the chunks keep any other caller within the limit.
pub const MAX_ENTRIES_PER_CALL: usize = crate::ports::MAX_EVENTS_PER_PUBLISH;

pub struct EventBridgePublisher {
    client: Client,
    bus_name: String,
}

impl EventBridgePublisher {
    pub fn new(client: Client, bus_name: String) -> Self {
        Self { client, bus_name }
    }
    /// From the SDK configuration and `EVENT_BUS_NAME`.
    pub fn from_env(config: &aws_config::SdkConfig) -> Result<Self, lambda_runtime::Error> {
        Ok(Self::new(super::clients::eventbridge(config), super::env("EVENT_BUS_NAME")?))
    }

    fn entry(&self, event: &IntegrationEvent) -> PutEventsRequestEntry {
        PutEventsRequestEntry::builder()
            .event_bus_name(&self.bus_name)
            .source(SOURCE)
            .detail_type(event.detail_type())
            .detail(event.detail_json())
            .time(DateTime::from_millis(event.occurred_at().unix_millis()))
            .build()
    }
}

#[async_trait]
impl EventPublisher for EventBridgePublisher {
    /// A call that fails as a whole (timeout, throttle on the call) reports
    /// its entries as failed, with the error as the message, and the later
    /// chunks are still sent: the caller retries exactly what did not go.
    async fn publish(&self, events: &[IntegrationEvent]) -> Result<Vec<PublishFailure>, Unavailable> {
        let mut failures = Vec::new();
        for (chunk_no, chunk) in events.chunks(MAX_ENTRIES_PER_CALL).enumerate() {
            let offset = chunk_no * MAX_ENTRIES_PER_CALL;
            let sent =
                self.client.put_events().set_entries(Some(chunk.iter().map(|e| self.entry(e)).collect())).send().await;
            match sent {
                Ok(out) => {
                    for (i, result) in out.entries().iter().enumerate() {
                        if let Some(code) = result.error_code() {
                            failures.push(PublishFailure {
                                index: offset + i,
                                code: code.to_owned(),
                                message: result.error_message().unwrap_or_default().to_owned(),
                            });
                        }
                    }
                    // An answer with fewer entries than were sent names no
                    // outcome for the rest: count them as not taken.
                    for i in out.entries().len()..chunk.len() {
                        failures.push(PublishFailure {
                            index: offset + i,
                            code: "MissingResult".into(),
                            message: "PutEvents answered without a result for this entry".into(),
                        });
                    }
                }
                Err(e) => {
                    let why = error_chain(&Unavailable::new("put events", e));
                    failures.extend((0..chunk.len()).map(|i| PublishFailure {
                        index: offset + i,
                        code: "RequestFailed".into(),
                        message: why.clone(),
                    }));
                }
            }
        }
        Ok(failures)
    }
}
