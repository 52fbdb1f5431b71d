//! POST /payments/{channel}/notify: signed payment notifications.
use aws_config::SdkConfig;
use lambda_http::{service_fn, Error};
use order_core::aws::{dynamo::DynamoStore, env, webhook_secrets};
use order_core::channels::ConfiguredChannel;
use order_core::handlers::http::{payment_webhook, Webhook};
use order_core::ports::SystemClock;
use order_core::source_allowlist::SourceAllowlist;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let dynamo = order_core::aws::clients::dynamodb(config);
    let app = Webhook {
        store: DynamoStore::from_env(dynamo.clone())?,
        // Stripe's events are decided from the intent as the API answers it.
        channel: ConfiguredChannel::load(config, dynamo).await?,
        clock: Box::new(SystemClock),
        secrets: webhook_secrets(config).await?,
        merchant_id: env("MERCHANT_ID")?,
        // Unset or empty: every source (the template always sets it).
        sources: SourceAllowlist::parse(&std::env::var("WEBHOOK_SOURCE_CIDRS").unwrap_or_default())
            .map_err(|e| format!("WEBHOOK_SOURCE_CIDRS: {e}"))?,
    };
    let app = &app;
    lambda_http::run(service_fn(move |req| async move { Ok::<_, Error>(payment_webhook(app, req).await) })).await
}
