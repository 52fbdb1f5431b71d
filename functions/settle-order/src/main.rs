//! Table stream (order → PAID) → confirm reservations, use the coupon,
//! cancel the wake-up, close the order's other open payments.
use aws_lambda_events::event::dynamodb::Event;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::queue::SqsDeadLetters;
use order_core::aws::{
    dynamo::DynamoStore, env, sandbox::ConfiguredChannel, scheduler::EventBridgeWakeUps, sdk_config,
};
use order_core::handlers::{batch::each_stream_record, streams::order_of};
use order_core::ports::SystemClock;
use order_core::usecases::release_order::settle_order;

#[tokio::main]
async fn main() -> Result<(), Error> {
    order_core::init_tracing();
    let config = sdk_config().await;
    let dead_letters = &SqsDeadLetters::from_env(&config)?;
    let store = DynamoStore::from_env(aws_sdk_dynamodb::Client::new(&config))?;
    // Only deletes schedules: the target and role are never used here.
    let wakeups = EventBridgeWakeUps::new(
        aws_sdk_scheduler::Client::new(&config),
        env("SCHEDULE_GROUP")?,
        String::new(),
        String::new(),
    );
    let channel = ConfiguredChannel::from_env(aws_sdk_dynamodb::Client::new(&config));
    let (store, wakeups, channel) = (&store, &wakeups, &channel);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Event>| async move {
        Ok::<_, Error>(
            each_stream_record(event.payload, dead_letters, |record| async move {
                let order = order_of(&record)?;
                settle_order(store, wakeups, channel, &SystemClock, &order.order_id).await?;
                Ok(())
            })
            .await,
        )
    }))
    .await
}
