//! OrderPaid (effect queue) → confirm reservations, use the coupon, cancel
//! the wake-up, close the order's other open payments.
use aws_config::SdkConfig;
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::{dynamo::DynamoStore, env, scheduler::EventBridgeWakeUps};
use order_core::channels::ConfiguredChannel;
use order_core::handlers::{batch::each_sqs_message, effects::settle_message};
use order_core::ports::SystemClock;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let store = DynamoStore::from_env(order_core::aws::clients::dynamodb(config))?;
    // Only deletes schedules: the target and role are never used here.
    let wakeups = EventBridgeWakeUps::new(
        order_core::aws::clients::scheduler(config),
        env("SCHEDULE_GROUP")?,
        String::new(),
        String::new(),
    );
    let channel = ConfiguredChannel::load(config, order_core::aws::clients::dynamodb(config)).await?;
    let (store, wakeups, channel) = (&store, &wakeups, &channel);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<_, Error>(
            each_sqs_message(event.payload, |m| async move {
                settle_message(store, wakeups, channel, &SystemClock, m.body.as_deref().unwrap_or("")).await
            })
            .await,
        )
    }))
    .await
}
