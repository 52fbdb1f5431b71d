//! POST /sandbox/payments/{payment_id}/settle: the sandbox provider's
//! control endpoint (deployed only with EnableSandboxChannel=true).
use aws_config::SdkConfig;
use lambda_http::{service_fn, Error};
use order_core::aws::{env, sandbox::SandboxChannel, webhook_secret};
use order_core::handlers::sandbox::{settle, Sandbox};
use order_core::ports::SystemClock;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let app = Sandbox {
        // The provider's stand-in: its ledger is not ours, so the lost-response
        // drill leaves its writes alone.
        ledger: SandboxChannel::new(aws_sdk_dynamodb::Client::new(config), env("SANDBOX_LEDGER_TABLE")?),
        clock: Box::new(SystemClock),
        secret: webhook_secret(config).await?,
        merchant_id: env("MERCHANT_ID")?,
        webhook_url: env("WEBHOOK_URL")?,
        http: reqwest::Client::new(),
    };
    let app = &app;
    lambda_http::run(service_fn(move |req| async move { Ok::<_, Error>(settle(app, req).await) })).await
}
