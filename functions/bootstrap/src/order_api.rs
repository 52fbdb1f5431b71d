//! GET /orders/{id}, POST /orders/{id}/payments and the /admin routes.
use aws_config::SdkConfig;
use lambda_http::{service_fn, Error};
use order_core::aws::queue::SqsCloseReminders;
use order_core::aws::{dynamo::DynamoStore, env, seconds_env};
use order_core::channels::ConfiguredChannel;
use order_core::handlers::http::{order_api, OrderApi};
use order_core::ports::{RandomIds, SystemClock};
use order_core::usecases::close_order::CloseOrder;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let dynamo = order_core::aws::clients::dynamodb(config);
    let channel = ConfiguredChannel::load(config, dynamo.clone()).await?;
    let app = OrderApi {
        store: DynamoStore::from_env(dynamo.clone())?,
        channel: channel.clone(),
        clock: Box::new(SystemClock),
        ids: Box::new(RandomIds),
        merchant_id: env("MERCHANT_ID")?,
        closer: CloseOrder {
            store: DynamoStore::from_env(dynamo.clone())?,
            channel,
            reminders: SqsCloseReminders::new(order_core::aws::clients::sqs(config), env("CLOSE_QUEUE_URL")?),
            clock: Box::new(SystemClock),
            lease: seconds_env("CLOSING_LEASE_SECONDS")?,
            not_found_grace: seconds_env("CHANNEL_NOT_FOUND_GRACE_SECONDS")?,
            // An API call waits for the answer: a shorter budget than the
            // queue's closer; what is not asked in time is held and retried.
            budget: std::time::Duration::from_secs(5),
        },
        not_found_grace: seconds_env("CHANNEL_NOT_FOUND_GRACE_SECONDS")?,
    };
    let app = &app;
    lambda_http::run(service_fn(move |req| async move { Ok::<_, Error>(order_api(app, req).await) })).await
}
