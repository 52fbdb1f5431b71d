//! OrderPlaced (effect queue) → one EventBridge Scheduler one-shot wake-up.
use aws_config::SdkConfig;
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::{dynamo::DynamoStore, env, queue::SqsCloseReminders, scheduler::EventBridgeWakeUps};
use order_core::handlers::{batch::each_sqs_message, effects::wake_up_message};
use order_core::ports::SystemClock;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let store = DynamoStore::from_env(order_core::aws::clients::dynamodb(config))?;
    let wakeups = EventBridgeWakeUps::new(
        order_core::aws::clients::scheduler(config),
        env("SCHEDULE_GROUP")?,
        env("CLOSE_QUEUE_ARN")?,
        env("SCHEDULER_ROLE_ARN")?,
    )
    .with_dead_letter(std::env::var("WAKEUP_DLQ_ARN").ok());
    let reminders = SqsCloseReminders::new(order_core::aws::clients::sqs(config), env("CLOSE_QUEUE_URL")?);
    let (store, wakeups, reminders) = (&store, &wakeups, &reminders);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<_, Error>(
            each_sqs_message(event.payload, |m| async move {
                wake_up_message(store, wakeups, reminders, &SystemClock, m.body.as_deref().unwrap_or("")).await
            })
            .await,
        )
    }))
    .await
}
