//! POST /orders → one transaction: order, reservations, coupon lock.
use aws_config::SdkConfig;
use lambda_http::{service_fn, Error};
use order_core::aws::{dynamo::DynamoStore, env, seconds_env};
use order_core::ports::{RandomIds, SystemClock};
use order_core::usecases::create_order::CreateOrder;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let uc = CreateOrder {
        store: DynamoStore::from_env(order_core::aws::clients::dynamodb(config))?,
        clock: Box::new(SystemClock),
        ids: Box::new(RandomIds),
        window: seconds_env("PAYMENT_WINDOW_SECONDS")?,
        expiry_rule_version: env("EXPIRY_RULE_VERSION")?,
        open_order_cap: open_order_cap()?,
    };
    let uc = &uc;
    lambda_http::run(service_fn(move |req| async move {
        Ok::<_, Error>(order_core::handlers::http::create_order(uc, req).await)
    }))
    .await
}

/// `MAX_OPEN_ORDERS_PER_BUYER`: a whole number, 0 for no cap.
fn open_order_cap() -> Result<Option<u32>, Error> {
    let v = env("MAX_OPEN_ORDERS_PER_BUYER")?;
    match v.trim().parse::<u32>() {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(_) => {
            Err(format!("environment variable MAX_OPEN_ORDERS_PER_BUYER must be a whole number (0: no cap), got {v:?}")
                .into())
        }
    }
}
