//! OrderClosed (effect queue) → release reservations and the coupon lock.
use aws_config::SdkConfig;
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::dynamo::DynamoStore;
use order_core::handlers::{batch::each_sqs_message, effects::release_message};
use order_core::ports::SystemClock;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let store = DynamoStore::from_env(order_core::aws::clients::dynamodb(config))?;
    let store = &store;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<_, Error>(
            each_sqs_message(event.payload, |m| async move {
                release_message(store, &SystemClock, m.body.as_deref().unwrap_or("")).await
            })
            .await,
        )
    }))
    .await
}
