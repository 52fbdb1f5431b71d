//! Rate schedule → the sweep over the due index (the backstop): overdue open
//! orders get a close reminder, pending effects and refunds are handed to
//! the effects queue (drive-effects runs them).
use aws_config::SdkConfig;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::queue::{SqsCloseReminders, SqsPendingEffects};
use order_core::aws::redrive::AwsRedrive;
use order_core::aws::{dynamo::DynamoStore, env};
use order_core::handlers::sweep::{config_from_env, run_sweep};
use order_core::ports::SystemClock;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let store = DynamoStore::from_env(order_core::aws::clients::dynamodb(config))?;
    let sqs = order_core::aws::clients::sqs(config);
    let redrive = AwsRedrive {
        reminders: SqsCloseReminders::new(sqs.clone(), env("CLOSE_QUEUE_URL")?),
        effects: SqsPendingEffects::new(sqs, env("PENDING_EFFECTS_QUEUE_URL")?),
    };
    let cfg = config_from_env()?;
    let (store, redrive, cfg) = (&store, &redrive, &cfg);
    lambda_runtime::run(service_fn(move |_: LambdaEvent<serde_json::Value>| async move {
        run_sweep(store, redrive, &SystemClock, cfg).await
    }))
    .await
}
