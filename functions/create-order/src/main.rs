//! POST /orders → one transaction: order, reservations, coupon lock.
use lambda_http::{service_fn, Error};
use order_core::aws::{dynamo::DynamoStore, env, sdk_config};
use order_core::ports::{RandomIds, SystemClock};
use order_core::usecases::create_order::CreateOrder;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Error> {
    order_core::init_tracing();
    let config = sdk_config().await;
    let window: u64 = env("PAYMENT_WINDOW_SECONDS")?.parse().map_err(|_| "PAYMENT_WINDOW_SECONDS must be whole seconds")?;
    let uc = CreateOrder {
        store: DynamoStore::new(aws_sdk_dynamodb::Client::new(&config), env("TABLE_NAME")?),
        clock: Box::new(SystemClock),
        ids: Box::new(RandomIds),
        window: Duration::from_secs(window),
        expiry_rule_version: env("EXPIRY_RULE_VERSION")?,
    };
    let uc = &uc;
    lambda_http::run(service_fn(move |req| async move {
        Ok::<_, Error>(order_core::handlers::http::create_order(uc, req).await)
    }))
    .await
}
