//! GET /orders/{id}, POST /orders/{id}/payments and the /admin routes.
use lambda_http::{service_fn, Error};
use order_core::aws::{dynamo::DynamoStore, env, sandbox::ConfiguredChannel, sdk_config, seconds_env};
use order_core::handlers::http::{order_api, OrderApi};
use order_core::ports::{RandomIds, SystemClock};

#[tokio::main]
async fn main() -> Result<(), Error> {
    order_core::init_tracing();
    let config = sdk_config().await;
    let dynamo = aws_sdk_dynamodb::Client::new(&config);
    let app = OrderApi {
        store: DynamoStore::new(dynamo.clone(), env("TABLE_NAME")?),
        channel: ConfiguredChannel::from_env(dynamo),
        clock: Box::new(SystemClock),
        ids: Box::new(RandomIds),
        merchant_id: env("MERCHANT_ID")?,
        not_found_grace: seconds_env("CHANNEL_NOT_FOUND_GRACE_SECONDS")?,
    };
    let app = &app;
    lambda_http::run(service_fn(move |req| async move { Ok::<_, Error>(order_api(app, req).await) })).await
}
