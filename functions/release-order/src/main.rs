//! Table stream (order → CLOSED) → release reservations and the coupon lock.
use aws_lambda_events::event::dynamodb::Event;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::queue::SqsDeadLetters;
use order_core::aws::{dynamo::DynamoStore, sdk_config};
use order_core::handlers::{batch::each_stream_record, streams::order_of};
use order_core::ports::SystemClock;
use order_core::usecases::release_order::release_order;

#[tokio::main]
async fn main() -> Result<(), Error> {
    order_core::init_tracing();
    let config = sdk_config().await;
    let dead_letters = &SqsDeadLetters::from_env(&config)?;
    let store = DynamoStore::from_env(aws_sdk_dynamodb::Client::new(&config))?;
    let store = &store;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Event>| async move {
        Ok::<_, Error>(
            each_stream_record(event.payload, dead_letters, |record| async move {
                let order = order_of(&record)?;
                if order_core::faults::active()
                    .release_fails(&order, order_core::ports::Clock::now(&SystemClock))
                    .is_some()
                {
                    tracing::warn!(order_id = %order.order_id, "fault injection: CLOSED record lost");
                    return Ok(());
                }
                release_order(store, &SystemClock, &order.order_id).await?;
                Ok(())
            })
            .await,
        )
    }))
    .await
}
