//! OrderPaid (effect queue) → confirm reservations, use the coupon, cancel
//! the wake-up, close the order's other open payments.
use aws_config::SdkConfig;
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::{dynamo::DynamoStore, env, scheduler::EventBridgeWakeUps};
use order_core::channels::ConfiguredChannel;
use order_core::handlers::batch::{each_sqs_message_within, invocation_deadline, INVOCATION_MARGIN};
use order_core::handlers::effects::settle_message_until;
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
        // As the close batch: each message gets its share of what is left
        // before Lambda's deadline; a settle that runs out of it (another
        // payment not closed at the channel yet) and the messages not
        // started are handed back.
        let deadline = invocation_deadline(event.context.deadline, INVOCATION_MARGIN);
        Ok::<_, Error>(
            each_sqs_message_within(event.payload, deadline, |m, until| async move {
                let body = m.body.as_deref().unwrap_or("");
                settle_message_until(store, wakeups, channel, &SystemClock, body, Some(until)).await
            })
            .await,
        )
    }))
    .await
}
