//! Table stream (order INSERT) → one EventBridge Scheduler one-shot wake-up.
use aws_lambda_events::event::dynamodb::Event;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::queue::SqsDeadLetters;
use order_core::aws::{env, queue::SqsCloseReminders, scheduler::EventBridgeWakeUps, sdk_config};
use order_core::handlers::{batch::each_stream_record, streams::order_of};
use order_core::ports::SystemClock;
use order_core::usecases::schedule_wakeup::schedule_wake_up;

#[tokio::main]
async fn main() -> Result<(), Error> {
    order_core::init_tracing();
    let config = sdk_config().await;
    let dead_letters = &SqsDeadLetters::from_env(&config)?;
    let wakeups = EventBridgeWakeUps::new(
        aws_sdk_scheduler::Client::new(&config),
        env("SCHEDULE_GROUP")?,
        env("CLOSE_QUEUE_ARN")?,
        env("SCHEDULER_ROLE_ARN")?,
    )
    .with_dead_letter(std::env::var("WAKEUP_DLQ_ARN").ok());
    let reminders = SqsCloseReminders::new(aws_sdk_sqs::Client::new(&config), env("CLOSE_QUEUE_URL")?);
    let (wakeups, reminders) = (&wakeups, &reminders);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Event>| async move {
        Ok::<_, Error>(
            each_stream_record(event.payload, dead_letters, |record| async move {
                let order = order_of(&record)?;
                if order_core::faults::active().wake_up_lost(order.user_id.as_str()) {
                    tracing::warn!(order_id = %order.order_id, "fault injection: wake-up never created");
                    return Ok(());
                }
                schedule_wake_up(wakeups, reminders, &SystemClock, &order.order_id, order.expire_at).await?;
                Ok(())
            })
            .await,
        )
    }))
    .await
}
