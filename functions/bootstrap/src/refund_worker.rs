//! Refund queue → each refund through the channel, with backoff.
use aws_config::SdkConfig;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::{dynamo::DynamoStore, env, queue::SqsRefundRetries};
use order_core::channels::ConfiguredChannel;
use order_core::handlers::refunds::{handle, RefundWorker};
use order_core::ports::SystemClock;
use serde_json::Value;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let dynamo = order_core::aws::clients::dynamodb(config);
    let worker = RefundWorker {
        store: DynamoStore::from_env(dynamo.clone())?,
        channel: ConfiguredChannel::load(config, dynamo).await?,
        retries: SqsRefundRetries::new(
            order_core::aws::clients::sqs(config),
            env("REFUND_QUEUE_URL")?,
            env("REFUND_DLQ_URL")?,
        ),
        clock: Box::new(SystemClock),
    };
    let worker = &worker;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move { handle(worker, event.payload).await }))
        .await
}
