//! AWS adapters: the only code that touches the SDK.

pub mod due_index;
pub mod dynamo;
pub mod event_bus;
pub mod payments;
pub mod queue;
pub mod redrive;
pub mod sandbox;
pub mod scheduler;
pub mod sigv4;

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

/// The sandbox channel's signing secret, read once at cold start from the
/// SSM SecureString named by `WEBHOOK_SECRET_PARAMETER` (the local stack
/// puts its value into the emulator's SSM the same way).
pub async fn webhook_secret(config: &aws_config::SdkConfig) -> Result<Vec<u8>, lambda_runtime::Error> {
    ssm_secret(&aws_sdk_ssm::Client::new(config), &env("WEBHOOK_SECRET_PARAMETER")?).await
}

/// The webhook's secret per channel, read once at cold start from
/// `WEBHOOK_SECRET_PARAMETERS` (`channel=/ssm/name,channel=/ssm/name`): a
/// notification is checked with its own channel's secret only, so the
/// sandbox's secret can never vouch for the provider's channel.
pub async fn webhook_secrets(
    config: &aws_config::SdkConfig,
) -> Result<std::collections::HashMap<String, Vec<u8>>, lambda_runtime::Error> {
    let client = aws_sdk_ssm::Client::new(config);
    let mut secrets = std::collections::HashMap::new();
    for (channel, name) in parse_secret_parameters(&env("WEBHOOK_SECRET_PARAMETERS")?)? {
        secrets.insert(channel, ssm_secret(&client, &name).await?);
    }
    Ok(secrets)
}

fn parse_secret_parameters(spec: &str) -> Result<Vec<(String, String)>, lambda_runtime::Error> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (channel, name) = pair
            .split_once('=')
            .filter(|(c, n)| !c.is_empty() && n.starts_with('/'))
            .ok_or_else(|| format!("WEBHOOK_SECRET_PARAMETERS: {pair:?} is not channel=/ssm/parameter"))?;
        if pairs.iter().any(|(c, _)| c == channel) {
            return Err(format!("WEBHOOK_SECRET_PARAMETERS names channel {channel} twice").into());
        }
        pairs.push((channel.to_owned(), name.to_owned()));
    }
    if pairs.is_empty() {
        return Err("WEBHOOK_SECRET_PARAMETERS names no channel".into());
    }
    Ok(pairs)
}

async fn ssm_secret(client: &aws_sdk_ssm::Client, name: &str) -> Result<Vec<u8>, lambda_runtime::Error> {
    let out = client
        .get_parameter()
        .name(name)
        .with_decryption(true)
        .send()
        .await
        .map_err(|e| format!("reading a webhook secret from SSM parameter {name}: {e}"))?;
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

#[cfg(test)]
mod tests {
    use super::parse_secret_parameters;

    #[test]
    fn secret_parameters_are_channel_name_pairs() {
        let pairs = parse_secret_parameters("provider=/a/b, sandbox=/c").unwrap();
        assert_eq!(pairs, vec![("provider".into(), "/a/b".into()), ("sandbox".into(), "/c".into())]);
        for bad in ["", "provider", "provider=a/b", "=/a", "p=/a,p=/b"] {
            assert!(parse_secret_parameters(bad).is_err(), "{bad:?}");
        }
    }
}
