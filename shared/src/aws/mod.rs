//! AWS adapters: the only code that touches the SDK.

pub mod due_index;
pub mod dynamo;
pub mod event_bus;
pub mod payments;
pub mod queue;
pub mod redrive;
pub mod sandbox;
pub mod scheduler;

use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};

/// Loads the SDK configuration once per cold start, with one rustls (ring)
/// HTTPS client shared by every service client. `AWS_ENDPOINT_URL` in the
/// environment points everything at a local emulator.
pub async fn sdk_config() -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http_client()).load().await
}

/// The SDK's HTTP client: rustls with ring, built explicitly because the
/// SDK crates are compiled without their default (two-TLS-stack) features.
pub fn http_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    aws_smithy_http_client::Builder::new().tls_provider(tls::Provider::Rustls(CryptoMode::Ring)).build_https()
}

/// Reads a required environment variable, naming it when it is missing.
pub fn env(name: &str) -> Result<String, lambda_runtime::Error> {
    std::env::var(name).map_err(|_| format!("environment variable {name} is not set").into())
}

/// The webhook signing secret, read once at cold start from the SSM
/// SecureString named by `WEBHOOK_SECRET_PARAMETER` (the local stack puts
/// its value into the emulator's SSM the same way).
pub async fn webhook_secret(config: &aws_config::SdkConfig) -> Result<Vec<u8>, lambda_runtime::Error> {
    let name = env("WEBHOOK_SECRET_PARAMETER")?;
    let out = aws_sdk_ssm::Client::new(config)
        .get_parameter()
        .name(&name)
        .with_decryption(true)
        .send()
        .await
        .map_err(|e| format!("reading the webhook secret from SSM parameter {name}: {e}"))?;
    out.parameter
        .and_then(|p| p.value)
        .filter(|v| !v.is_empty())
        .map(String::into_bytes)
        .ok_or_else(|| format!("SSM parameter {name} is empty").into())
}

/// Reads a required environment variable holding whole seconds.
pub fn seconds_env(name: &str) -> Result<std::time::Duration, lambda_runtime::Error> {
    let v = env(name)?;
    v.parse()
        .map(std::time::Duration::from_secs)
        .map_err(|_| format!("environment variable {name} must be whole seconds, got {v:?}").into())
}
