//! The Stripe payment channel (PaymentIntents, automatic capture).
//!
//! # Layout
//! - [`client`]: the HTTP client (form bodies, retries, bounds, the key).
//! - [`objects`]: the PaymentIntent and Refund fields we read, and what
//!   each Stripe state means to the close protocol and the refund worker.
//! - [`channel`]: [`StripeChannel`], the `PaymentChannel` and
//!   `ChannelStatement` of Stripe.
//! - [`events`]: webhook events parsed into
//!   [`crate::usecases::channel_events::ChannelEvent`].
//!
//! The settings come from the function's environment ([`StripeSettings::from_env`]),
//! the secret key from SSM (read once at cold start, `crate::channels`).
//! docs/payments.md explains the whole flow and where localstripe, the
//! server the tests run against, differs from Stripe.

pub mod channel;
pub mod client;
pub mod events;
pub mod objects;

pub use channel::{StripeChannel, CHANNEL_NAME};
pub use client::{SecretKey, StripeClient};

use std::time::Duration;

/// How the channel talks to its server, from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeSettings {
    pub base_url: String,
    /// Handed to the buyer beside the intent's client_secret.
    pub publishable_key: Option<String>,
    /// Stripe's `cancellation_reason=abandoned` on a cancel (localstripe
    /// refuses the parameter).
    pub send_cancellation_reason: bool,
    /// The statement's list calls filter with `created[gte]` (localstripe
    /// refuses the filter; the channel then filters the pages itself).
    pub list_filter_by_created: bool,
    /// How far back reconciliation reads intents and refunds.
    pub statement_window: Duration,
}

/// The test server the stack talks to instead of Stripe (dev only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestServer {
    None,
    /// localstripe: no `cancellation_reason`, no `created` list filter.
    Localstripe,
}

/// The environment the settings are read from, named so the rules can be
/// tested without touching the process's environment.
#[derive(Debug, Clone, Default)]
pub struct StripeEnv {
    pub stage: String,
    pub base_url: Option<String>,
    pub test_server: Option<String>,
    pub publishable_key: Option<String>,
    pub capture_method: Option<String>,
    pub statement_days: Option<String>,
}

impl StripeEnv {
    pub fn from_process() -> Self {
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
        Self {
            stage: var("STAGE").unwrap_or_else(|| "prod".into()),
            base_url: var("STRIPE_API_BASE_URL"),
            test_server: var("STRIPE_TEST_SERVER"),
            publishable_key: var("STRIPE_PUBLISHABLE_KEY"),
            capture_method: var("STRIPE_CAPTURE_METHOD"),
            statement_days: var("STRIPE_STATEMENT_DAYS"),
        }
    }
}

impl StripeSettings {
    /// Checks the settings and the key together; every refusal says what
    /// to change. Called once at cold start: a function with a wrong
    /// setting fails its init instead of taking a payment wrongly.
    pub fn from_env(env: &StripeEnv, key: &SecretKey) -> Result<Self, String> {
        let dev = env.stage == "dev";
        let k = key.expose();
        if k.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("the Stripe secret key contains a space or a line break; store the key alone".into());
        }
        if !["sk_test_", "sk_live_", "rk_test_", "rk_live_"].iter().any(|p| k.starts_with(p)) {
            return Err("the Stripe secret key must be a secret or restricted key (sk_… or rk_…), not a publishable \
                        key or a webhook secret; check the SSM parameter StripeSecretKeyParameterName names"
                .into());
        }
        if dev && key.is_live() {
            return Err(
                "a dev stage must not run with a live Stripe key (sk_live_…): use a test-mode key (sk_test_…)".into()
            );
        }
        if !dev && (env.base_url.is_some() || env.test_server.is_some()) {
            return Err("STRIPE_API_BASE_URL and STRIPE_TEST_SERVER are for dev stages only (a test server); a prod \
                        stage talks to api.stripe.com"
                .into());
        }
        match env.capture_method.as_deref() {
            None | Some("automatic") => {}
            Some("manual") => {
                return Err("manual capture is not supported: an authorised, uncaptured PaymentIntent \
                            (requires_capture) is neither paid nor unpaid for the close protocol; set \
                            STRIPE_CAPTURE_METHOD to automatic"
                    .into())
            }
            Some(other) => return Err(format!("STRIPE_CAPTURE_METHOD must be automatic, got {other:?}")),
        }
        let test_server = match env.test_server.as_deref() {
            None => TestServer::None,
            Some("localstripe") => TestServer::Localstripe,
            Some(other) => return Err(format!("STRIPE_TEST_SERVER must be empty or localstripe, got {other:?}")),
        };
        let days = match env.statement_days.as_deref() {
            None => 35,
            Some(d) => d
                .parse::<u64>()
                .ok()
                .filter(|d| (1..=400).contains(d))
                .ok_or_else(|| format!("STRIPE_STATEMENT_DAYS must be whole days from 1 to 400, got {d:?}"))?,
        };
        if let Some(pk) = &env.publishable_key {
            if !pk.starts_with("pk_test_") && !pk.starts_with("pk_live_") {
                return Err("STRIPE_PUBLISHABLE_KEY must be a publishable key (pk_…)".into());
            }
            if pk.starts_with("pk_live_") != key.is_live() {
                return Err("the publishable key and the secret key are of different modes (live and test)".into());
            }
        }
        Ok(Self {
            base_url: env.base_url.clone().unwrap_or_else(|| client::DEFAULT_BASE_URL.to_owned()),
            publishable_key: env.publishable_key.clone(),
            send_cancellation_reason: test_server != TestServer::Localstripe,
            list_filter_by_created: test_server != TestServer::Localstripe,
            statement_window: Duration::from_secs(days * 86_400),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(stage: &str) -> StripeEnv {
        StripeEnv { stage: stage.into(), ..Default::default() }
    }

    #[test]
    fn a_prod_stage_talks_to_stripe_with_any_real_key() {
        let s = StripeSettings::from_env(&env("prod"), &SecretKey::new("sk_live_1")).unwrap();
        assert_eq!(s.base_url, "https://api.stripe.com");
        assert!(s.send_cancellation_reason && s.list_filter_by_created);
        assert!(StripeSettings::from_env(&env("prod"), &SecretKey::new("sk_test_1")).is_ok(), "test mode in prod");
        assert_eq!(s.statement_window, Duration::from_secs(35 * 86_400));
    }

    #[test]
    fn the_settings_refuse_what_could_take_money_wrongly() {
        let live = SecretKey::new("sk_live_1");
        let test = SecretKey::new("sk_test_1");
        let refused = |e: StripeEnv, k: &SecretKey, needle: &str| {
            let err = StripeSettings::from_env(&e, k).unwrap_err();
            assert!(err.contains(needle), "{err}");
        };
        refused(env("dev"), &live, "live Stripe key");
        refused(StripeEnv { base_url: Some("http://x".into()), ..env("prod") }, &live, "dev stages only");
        refused(StripeEnv { test_server: Some("localstripe".into()), ..env("prod") }, &test, "dev stages only");
        refused(StripeEnv { capture_method: Some("manual".into()), ..env("dev") }, &test, "manual capture");
        refused(StripeEnv { test_server: Some("mock".into()), ..env("dev") }, &test, "localstripe");
        refused(StripeEnv { statement_days: Some("0".into()), ..env("dev") }, &test, "STRIPE_STATEMENT_DAYS");
        refused(StripeEnv { publishable_key: Some("pk_live_1".into()), ..env("dev") }, &test, "different modes");
        refused(env("dev"), &SecretKey::new("whsec_1"), "secret or restricted key");
        refused(env("dev"), &SecretKey::new("pk_test_1"), "secret or restricted key");
        refused(env("dev"), &SecretKey::new("sk_test_1\n"), "line break");
    }

    #[test]
    fn localstripe_in_dev_drops_what_it_refuses() {
        let e = StripeEnv {
            base_url: Some("http://127.0.0.1:8420".into()),
            test_server: Some("localstripe".into()),
            publishable_key: Some("pk_test_local".into()),
            ..env("dev")
        };
        let s = StripeSettings::from_env(&e, &SecretKey::new("sk_test_local")).unwrap();
        assert_eq!(s.base_url, "http://127.0.0.1:8420");
        assert!(!s.send_cancellation_reason && !s.list_filter_by_created);
        assert_eq!(s.publishable_key.as_deref(), Some("pk_test_local"));
    }
}
