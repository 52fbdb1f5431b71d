//! POST /payments/{channel}/notify: signed payment notifications.
use lambda_http::{service_fn, Error};
use order_core::aws::{dynamo::DynamoStore, env, sdk_config, webhook_secrets};
use order_core::handlers::http::{payment_webhook, Webhook};
use order_core::ports::SystemClock;

#[tokio::main]
async fn main() -> Result<(), Error> {
    order_core::init_tracing();
    let config = sdk_config().await;
    let app = Webhook {
        store: DynamoStore::from_env(aws_sdk_dynamodb::Client::new(&config))?,
        clock: Box::new(SystemClock),
        secrets: webhook_secrets(&config).await?,
        merchant_id: env("MERCHANT_ID")?,
    };
    let app = &app;
    lambda_http::run(service_fn(move |req| async move { Ok::<_, Error>(payment_webhook(app, req).await) })).await
}
