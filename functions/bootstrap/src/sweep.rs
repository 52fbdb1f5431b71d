//! Rate schedule → the sweep over the due index (the backstop): overdue open
//! orders get a close reminder, pending effects and refunds are re-driven.
use aws_config::SdkConfig;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::queue::SqsCloseReminders;
use order_core::aws::redrive::AwsRedrive;
use order_core::aws::{dynamo::DynamoStore, env, scheduler::EventBridgeWakeUps};
use order_core::channels::ConfiguredChannel;
use order_core::handlers::sweep::{config_from_env, run_sweep};
use order_core::ports::SystemClock;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let dynamo = order_core::aws::clients::dynamodb(config);
    let sqs = order_core::aws::clients::sqs(config);
    let store = DynamoStore::from_env(dynamo.clone())?;
    let redrive = AwsRedrive {
        store: store.clone(),
        // Settle only deletes schedules: target and role are never used.
        wakeups: EventBridgeWakeUps::new(
            order_core::aws::clients::scheduler(config),
            env("SCHEDULE_GROUP")?,
            String::new(),
            String::new(),
        ),
        channel: ConfiguredChannel::load(config, dynamo).await?,
        reminders: SqsCloseReminders::new(sqs.clone(), env("CLOSE_QUEUE_URL")?),
        sqs,
        refund_queue_url: env("REFUND_QUEUE_URL")?,
        clock: Box::new(SystemClock),
    };
    let cfg = config_from_env()?;
    let (store, redrive, cfg) = (&store, &redrive, &cfg);
    lambda_runtime::run(service_fn(move |_: LambdaEvent<serde_json::Value>| async move {
        run_sweep(store, redrive, &SystemClock, cfg).await
    }))
    .await
}
