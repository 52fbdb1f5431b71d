//! Rate schedules → the passes over the due index. The backstop sweep:
//! overdue open orders get a close reminder, pending effects and refunds
//! are handed to the effects queue (drive-effects runs them). The
//! expiring-soon pass (input `{"pass":"expiring-soon"}`): open orders about
//! to expire are noticed, and the relay publishes `OrderExpiringSoon`.
use aws_config::SdkConfig;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::queue::{SqsCloseReminders, SqsPendingEffects};
use order_core::aws::redrive::AwsRedrive;
use order_core::aws::{dynamo::DynamoStore, env};
use order_core::handlers::sweep::{
    config_from_env, notice_config_from_env, pass_of, run_expiring_soon_pass, run_sweep, Pass,
};
use order_core::ports::SystemClock;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let store = DynamoStore::from_env(order_core::aws::clients::dynamodb(config))?;
    let sqs = order_core::aws::clients::sqs(config);
    let redrive = AwsRedrive {
        reminders: SqsCloseReminders::new(sqs.clone(), env("CLOSE_QUEUE_URL")?),
        effects: SqsPendingEffects::new(sqs, env("PENDING_EFFECTS_QUEUE_URL")?),
    };
    let cfg = config_from_env()?;
    // A wrong lead stops the expiring-soon pass only (alarmed by its
    // missing completions), never the backstop sweep.
    let notice = notice_config_from_env();
    let (store, redrive, cfg, notice) = (&store, &redrive, &cfg, &notice);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| async move {
        match pass_of(&event.payload)? {
            Pass::Sweep => run_sweep(store, redrive, &SystemClock, cfg).await,
            Pass::ExpiringSoon => run_expiring_soon_pass(store, &SystemClock, notice.as_ref()).await,
        }
    }))
    .await
}
