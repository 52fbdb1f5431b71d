//! A small Stripe API client: the handful of endpoints the channel calls,
//! form-encoded as Stripe expects, over reqwest (rustls), with the same
//! bounds as the AWS SDK clients (connect 3 s, attempt 5 s, operation 9 s).
//!
//! Retries follow Stripe's own guidance: a connection error, a timeout, a
//! 409 lock conflict, a 429 or a 5xx is tried again with jittered backoff,
//! unless Stripe answers `Stripe-Should-Retry: false` (and a `true` there
//! is retried whatever the status). A POST is retried only under the same
//! `Idempotency-Key`, or when it is idempotent by its effect (a cancel).
//!
//! Why not a Stripe crate: `async-stripe` generates the whole API (hundreds
//! of thousands of lines); measured in BENCHMARKS.md ("The Stripe client"),
//! its build cost is far beyond what five endpoints need.

use super::objects::ErrorBody;
use crate::aws::{ATTEMPT_TIMEOUT, CONNECT_TIMEOUT, OPERATION_TIMEOUT};
use serde::de::DeserializeOwned;
use std::time::{Duration, Instant};
use tracing::warn;

/// The API version every request pins, so that answers keep the shapes
/// `objects.rs` reads (`latest_charge` as an id since 2022-11-15).
pub const API_VERSION: &str = "2024-06-20";
pub const DEFAULT_BASE_URL: &str = "https://api.stripe.com";
/// Tries of one call, the first included.
const MAX_TRIES: u32 = 3;

/// A Stripe secret key. Its `Debug` never prints it.
#[derive(Clone)]
pub struct SecretKey(String);

impl SecretKey {
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_live(&self) -> bool {
        self.0.starts_with("sk_live_") || self.0.starts_with("rk_live_")
    }
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = if self.is_live() { "live" } else { "test" };
        write!(f, "SecretKey({mode}, redacted)")
    }
}

/// Why a call did not produce the object asked for.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Stripe answered with an error status (after the retries it allows).
    #[error("Stripe answered {status} to {what}: {}{}", .message, .code.as_deref().map(|c| format!(" ({c})")).unwrap_or_default())]
    Api { what: &'static str, status: u16, code: Option<String>, message: String },
    /// No answer: connection, timeout, or a body that does not decode.
    #[error("Stripe {what}: {source}")]
    Transport {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl CallError {
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            Self::Transport { .. } => None,
        }
    }
}

#[derive(Clone)]
pub struct StripeClient {
    http: reqwest::Client,
    base: String,
    key: SecretKey,
}

impl std::fmt::Debug for StripeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StripeClient").field("base", &self.base).field("key", &self.key).finish()
    }
}

/// Whether a failed try may be tried again.
fn retryable(status: Option<u16>, should_retry: Option<bool>) -> bool {
    match (should_retry, status) {
        (Some(answer), _) => answer,
        (None, None) => true,
        (None, Some(s)) => s == 409 || s == 429 || s >= 500,
    }
}

/// Backoff before try `n` (1-based, after a failure): 0.5 s, 1 s, … with
/// jitter, so that many functions retrying after one brownout spread out.
fn backoff(n: u32) -> Duration {
    use rand::Rng;
    let base = 500u64 << (n - 1).min(4);
    Duration::from_millis(base / 2 + rand::thread_rng().gen_range(0..=base / 2))
}

impl StripeClient {
    pub fn new(base: impl Into<String>, key: SecretKey) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(ATTEMPT_TIMEOUT)
            .user_agent(concat!("order-expiry/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("a TLS client with default settings builds");
        Self { http, base: base.into().trim_end_matches('/').to_owned(), key }
    }

    /// `GET {path}?{query}`.
    pub async fn get<T: DeserializeOwned>(
        &self,
        what: &'static str,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T, CallError> {
        self.call(what, reqwest::Method::GET, path, query, None).await
    }

    /// `POST {path}` with a form body. `idempotency_key` makes a retry
    /// (ours, or a later call's) answer what the first one did.
    pub async fn post<T: DeserializeOwned>(
        &self,
        what: &'static str,
        path: &str,
        form: &[(&str, String)],
        idempotency_key: Option<&str>,
    ) -> Result<T, CallError> {
        self.call(what, reqwest::Method::POST, path, form, idempotency_key).await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        what: &'static str,
        method: reqwest::Method,
        path: &str,
        params: &[(&str, String)],
        idempotency_key: Option<&str>,
    ) -> Result<T, CallError> {
        let deadline = Instant::now() + OPERATION_TIMEOUT;
        let url = format!("{}{path}", self.base);
        let mut tries = 0;
        loop {
            tries += 1;
            let mut req = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(self.key.expose())
                .header("Stripe-Version", API_VERSION);
            req = if method == reqwest::Method::GET { req.query(params) } else { req.form(params) };
            if let Some(k) = idempotency_key {
                req = req.header("Idempotency-Key", k);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let outcome = match req.timeout(ATTEMPT_TIMEOUT.min(remaining)).send().await {
                Ok(resp) => Self::read(what, resp).await,
                Err(e) => Err((CallError::Transport { what, source: e.into() }, None)),
            };
            let (err, should_retry) = match outcome {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let pause = backoff(tries);
            if tries >= MAX_TRIES || !retryable(err.status(), should_retry) || Instant::now() + pause >= deadline {
                return Err(err);
            }
            warn!(what, tries, error = %err, "Stripe call failed; retrying");
            tokio::time::sleep(pause).await;
        }
    }

    /// The answer's object, or the error with Stripe's `Stripe-Should-Retry`.
    async fn read<T: DeserializeOwned>(
        what: &'static str,
        resp: reqwest::Response,
    ) -> Result<T, (CallError, Option<bool>)> {
        let status = resp.status().as_u16();
        let should_retry = resp
            .headers()
            .get("stripe-should-retry")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.eq_ignore_ascii_case("true"));
        let body = resp.bytes().await.map_err(|e| (CallError::Transport { what, source: e.into() }, None))?;
        if (200..300).contains(&status) {
            return serde_json::from_slice(&body)
                .map_err(|e| (CallError::Transport { what, source: e.into() }, Some(false)));
        }
        let detail = serde_json::from_slice::<ErrorBody>(&body).map(|b| b.error).unwrap_or_default();
        let message = detail.message.unwrap_or_else(|| format!("HTTP {status}"));
        Err((CallError::Api { what, status, code: detail.code, message }, should_retry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_retried_follows_stripe_guidance() {
        assert!(retryable(None, None), "no answer at all");
        for s in [409, 429, 500, 502, 503] {
            assert!(retryable(Some(s), None), "{s}");
        }
        for s in [400, 401, 402, 403, 404] {
            assert!(!retryable(Some(s), None), "{s}");
        }
        assert!(!retryable(Some(503), Some(false)), "Stripe-Should-Retry: false wins");
        assert!(retryable(Some(400), Some(true)), "Stripe-Should-Retry: true wins");
    }

    #[test]
    fn backoff_grows_and_stays_within_the_operation_bound() {
        for n in 1..=MAX_TRIES {
            let b = backoff(n);
            assert!(b >= Duration::from_millis(250 << (n - 1)) && b <= Duration::from_millis(500 << (n - 1)), "{b:?}");
        }
        let worst: Duration = (1..MAX_TRIES).map(|n| Duration::from_millis(500 << (n - 1))).sum();
        assert!(worst < OPERATION_TIMEOUT);
    }

    #[test]
    fn a_secret_key_never_prints() {
        let k = SecretKey::new("sk_test_abcdef123");
        assert_eq!(format!("{k:?}"), "SecretKey(test, redacted)");
        let c = StripeClient::new("http://x", k);
        assert!(!format!("{c:?}").contains("abcdef"));
        assert!(SecretKey::new("sk_live_x").is_live() && SecretKey::new("rk_live_x").is_live());
    }
}
