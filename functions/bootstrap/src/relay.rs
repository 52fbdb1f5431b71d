//! Table stream → integration events on the event bus (`EVENT_BUS_NAME`).
use aws_config::SdkConfig;
use aws_lambda_events::event::dynamodb::Event;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::{event_bus::EventBridgePublisher, queue::SqsDeadLetters};
use order_core::handlers::relay::{invocation_result, relay_batch, RetryPolicy};

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let dead_letters = &SqsDeadLetters::from_env(config)?;
    let publisher = &EventBridgePublisher::from_env(config)?;
    let faults = order_core::faults::active();
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Event>| async move {
        invocation_result(relay_batch(event.payload, publisher, dead_letters, faults, RetryPolicy::default()).await)
    }))
    .await
}
