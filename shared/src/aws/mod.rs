//! AWS adapters: the only code that touches the SDK.

pub mod buyer_index;
pub mod call_count;
pub mod catalog;
pub mod clients;
pub mod due_index;
pub mod dynamo;
pub mod event_bus;
pub mod expiring_soon;
pub mod expiry_rules;
pub mod holdings;
pub mod lost_answers;
pub mod payments;
pub mod points;
pub mod queue;
pub mod reconcile_index;
pub mod redrive;
pub mod sandbox;
pub mod scheduler;
pub mod sigv4;

use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};

/// Loads the SDK configuration once per cold start, with one rustls (ring)
/// HTTPS client shared by every service client. `AWS_ENDPOINT_URL` in the
/// environment points everything at a local emulator.
pub async fn sdk_config() -> aws_config::SdkConfig {
    with_client_defaults(aws_config::defaults(aws_config::BehaviorVersion::latest())).load().await
}

/// How long one SDK request may take to connect: a live endpoint on the same
/// network (or host) answers a connect in milliseconds.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// How long one attempt (send, wait, read the whole response) may take before
/// the standard retry policy tries again on a fresh connection.
pub const ATTEMPT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long one SDK operation may take with all its attempts: below the
/// shortest function Timeout in template.yaml (10 s), so a call whose answer
/// is lost fails the invocation with an error its trigger retries, instead of
/// holding it until Lambda kills it.
pub const OPERATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(9);

/// The client settings every function shares: the HTTP client above, the
/// standard retry policy, and bounded connect/attempt/operation times. The
/// SDK's defaults bound only the connect, so a request whose response never
/// comes (a connection cut mid-request, an endpoint that stops answering)
/// would wait for as long as the invocation lives.
pub fn with_client_defaults(loader: aws_config::ConfigLoader) -> aws_config::ConfigLoader {
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(ATTEMPT_TIMEOUT)
        .operation_timeout(OPERATION_TIMEOUT)
        .build();
    loader.http_client(http_client()).retry_config(aws_config::retry::RetryConfig::standard()).timeout_config(timeouts)
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

/// A secret (a SecureString) read once at cold start from the SSM
/// parameter `name`. The error names the parameter, never the value.
pub async fn ssm_text(client: &aws_sdk_ssm::Client, name: &str) -> Result<String, lambda_runtime::Error> {
    let bytes = ssm_secret(client, name).await?;
    let text = String::from_utf8(bytes).map_err(|_| format!("SSM parameter {name} is not UTF-8 text"))?;
    // A value pasted with its line end (`echo key | aws ssm put-parameter`)
    // would make every request header invalid; the key itself has no spaces.
    Ok(text.trim().to_owned())
}

async fn ssm_secret(client: &aws_sdk_ssm::Client, name: &str) -> Result<Vec<u8>, lambda_runtime::Error> {
    let out = client
        .get_parameter()
        .name(name)
        .with_decryption(true)
        .send()
        .await
        .map_err(|e| format!("reading a secret from SSM parameter {name}: {}", crate::error::error_chain(&e)))?;
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
    use super::{parse_secret_parameters, with_client_defaults, ATTEMPT_TIMEOUT, OPERATION_TIMEOUT};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    /// An endpoint that accepts connections and never answers: what a
    /// function sees when its request reached an emulator that then stops
    /// responding (or a response lost on a cut connection).
    fn silent_endpoint() -> (String, Arc<AtomicUsize>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        std::thread::spawn(move || {
            // Held, never read or written: the client waits for a response.
            let mut open = Vec::new();
            for stream in listener.incoming().flatten() {
                counter.fetch_add(1, Ordering::SeqCst);
                open.push(stream);
            }
        });
        (url, accepted)
    }

    #[tokio::test]
    async fn a_request_nobody_answers_times_out_within_the_operation_bound_after_a_retry() {
        let (url, accepted) = silent_endpoint();
        let config = with_client_defaults(aws_config::defaults(aws_config::BehaviorVersion::latest()))
            .endpoint_url(url)
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_dynamodb::config::Credentials::new("test", "test", None, None, "test"))
            .load()
            .await;
        let client = aws_sdk_dynamodb::Client::new(&config);

        let started = Instant::now();
        // Any operation will do; one the functions make (infra/template_check.py's
        // code check lists every SDK call in the source, tests included).
        let outcome = client
            .get_item()
            .table_name("orders")
            .key("pk", aws_sdk_dynamodb::types::AttributeValue::S("ORDER#x".into()))
            .send()
            .await;
        let took = started.elapsed();

        let err = outcome.expect_err("a silent endpoint cannot produce a response");
        assert!(matches!(err, aws_sdk_dynamodb::error::SdkError::TimeoutError(_)), "expected a timeout, got {err:?}");
        // Bounded by the operation timeout (plus scheduling slack), and not
        // before the first attempt's own bound ran out.
        assert!(took >= ATTEMPT_TIMEOUT, "gave up after {took:?}, before one attempt's bound");
        assert!(took < OPERATION_TIMEOUT + std::time::Duration::from_secs(2), "took {took:?}");
        // The timed-out attempt was retried on a new connection.
        assert!(accepted.load(Ordering::SeqCst) >= 2, "{} connection(s)", accepted.load(Ordering::SeqCst));
    }

    #[test]
    fn secret_parameters_are_channel_name_pairs() {
        let pairs = parse_secret_parameters("provider=/a/b, sandbox=/c").unwrap();
        assert_eq!(pairs, vec![("provider".into(), "/a/b".into()), ("sandbox".into(), "/c".into())]);
        for bad in ["", "provider", "provider=a/b", "=/a", "p=/a,p=/b"] {
            assert!(parse_secret_parameters(bad).is_err(), "{bad:?}");
        }
    }
}
