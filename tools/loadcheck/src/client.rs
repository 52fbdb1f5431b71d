//! The stack's public surface as the run uses it: buyer routes with a
//! Cognito access token, IAM-signed admin and sandbox routes, and signed
//! provider notifications. Unlike the test helpers, nothing here panics:
//! a run of thousands of orders records a failed call and goes on.

use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use system_tests::Reply;

/// Tries of a retried call: the backoff (0.5, 1, 2, then 4 s) adds up to
/// about 40 s, enough to ride out an emulator restart.
const RETRIES: u32 = 12;

pub struct Client {
    base: String,
    /// The notification API (`NOTIFY_API_BASE_URL`): the stack serves the
    /// providers' `/payments/{channel}/notify` there, apart from the buyer API.
    notify_base: String,
    http: reqwest::Client,
    /// Buyer name → (access token, user id), signed in once per run.
    tokens: Mutex<HashMap<String, (String, String)>>,
    /// Requests in flight at most (`--concurrency`).
    in_flight: tokio::sync::Semaphore,
    webhook_secret: String,
    pub merchant_id: String,
}

/// How a request is authenticated.
pub enum Auth<'a> {
    Buyer(&'a str),
    Iam,
    /// A payment provider's notification, sent to the notification API.
    Provider,
}

impl Client {
    pub fn new(base: &str, notify_base: &str, webhook_secret: String, merchant_id: String, concurrency: usize) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(64)
            .build()
            .expect("an HTTP client");
        Self {
            base: base.trim_end_matches('/').to_owned(),
            notify_base: notify_base.trim_end_matches('/').to_owned(),
            http,
            tokens: Default::default(),
            in_flight: tokio::sync::Semaphore::new(concurrency.max(1)),
            webhook_secret,
            merchant_id,
        }
    }

    /// Signs buyer `name` in (creating the user first time) and returns
    /// its user id. The helper panics on a refusal, so it runs on its own
    /// task.
    pub async fn sign_in(&self, name: &str) -> Result<String, String> {
        if let Some((_, user_id)) = self.tokens.lock().unwrap().get(name) {
            return Ok(user_id.clone());
        }
        let owned = name.to_owned();
        let buyer = tokio::spawn(async move { system_tests::sign_in(&owned).await })
            .await
            .map_err(|e| format!("signing in {name}: {e}"))?;
        self.tokens.lock().unwrap().insert(name.to_owned(), (buyer.access_token, buyer.user_id.clone()));
        Ok(buyer.user_id)
    }

    /// What [`send`](Self::send)'s error ends with when the request timed
    /// out (no answer within the client's 60 s), as opposed to a connection
    /// that was refused or dropped.
    pub const TIMED_OUT: &'static str = " (timed out)";

    /// One request. Transport failures and 5xx answers are retried (up to
    /// `tries` times) only by callers whose request is idempotent.
    pub async fn send(
        &self,
        auth: Auth<'_>,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Result<Reply, String> {
        let base = if matches!(auth, Auth::Provider) { &self.notify_base } else { &self.base };
        let url = format!("{base}{path}");
        let mut hs: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        if body.is_some() {
            hs.push(("content-type".into(), "application/json".into()));
        }
        match auth {
            Auth::Buyer(name) => {
                let token = self.tokens.lock().unwrap().get(name).map(|(t, _)| t.clone());
                let token = token.ok_or_else(|| format!("buyer {name} is not signed in"))?;
                hs.push(("authorization".into(), format!("Bearer {token}")));
            }
            Auth::Iam => {
                let signed = system_tests::sigv4(method, &url, &hs, body.unwrap_or("").as_bytes(), "execute-api");
                hs.extend(signed);
            }
            Auth::Provider => {}
        }
        let mut req = self.http.request(method.parse().map_err(|e| format!("{method}: {e}"))?, &url);
        for (k, v) in &hs {
            req = req.header(k, v);
        }
        if let Some(b) = body {
            req = req.body(b.to_owned());
        }
        let _permit = self.in_flight.acquire().await.map_err(|e| e.to_string())?;
        let resp = req.send().await.map_err(|e| {
            let timed_out = if e.is_timeout() { Self::TIMED_OUT } else { "" };
            format!("{method} {path}: {e}{timed_out}")
        })?;
        let status = resp.status().as_u16();
        let replayed = resp.headers().get("idempotent-replayed").is_some();
        let text = resp.text().await.map_err(|e| format!("{method} {path}: {e}"))?;
        let mut body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if replayed {
            // Carried in the body so callers need not see headers.
            body["_replayed"] = Value::Bool(true);
        }
        Ok(Reply { status, body })
    }

    /// `send`, retried on transport errors and 5xx answers: only for
    /// requests the API makes idempotent (an `Idempotency-Key`, a read, a
    /// settle the sandbox answers the same way twice).
    pub async fn send_retried<'a>(
        &self,
        auth: impl Fn() -> Auth<'a>,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Result<Reply, String> {
        let mut last = String::new();
        for attempt in 0..RETRIES {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(250 << attempt.min(4))).await;
            }
            match self.send(auth(), method, path, headers, body).await {
                Ok(r) if r.status < 500 => return Ok(r),
                Ok(r) => last = format!("{method} {path}: {} {}", r.status, r.body),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    pub async fn buyer_retried(
        &self,
        buyer: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Result<Reply, String> {
        self.send_retried(|| Auth::Buyer(buyer), method, path, headers, body).await
    }

    pub async fn admin(&self, method: &str, path: &str, body: Option<&str>) -> Result<Reply, String> {
        self.send_retried(|| Auth::Iam, method, path, &[], body).await
    }

    /// A provider notification for a payment, signed with `secret` at unix
    /// time `t` (the stack's sandbox secret unless a drill forges one).
    pub async fn notify(&self, body: &Value, secret: Option<&str>, t: i64) -> Result<Reply, String> {
        let body = body.to_string();
        let secret = secret.unwrap_or(&self.webhook_secret);
        let sig = order_core::signature::sign(secret.as_bytes(), t, body.as_bytes());
        self.send_retried(|| Auth::Provider, "POST", "/payments/sandbox/notify", &[("X-Signature", &sig)], Some(&body))
            .await
    }

    /// A Stripe webhook delivery of `body` with `signature` as its
    /// `Stripe-Signature` header (`None`: sent without one). Retried like
    /// Stripe retries: the endpoint dedupes on the event id.
    pub async fn notify_stripe(&self, body: &str, signature: Option<&str>) -> Result<Reply, String> {
        let headers: Vec<(&str, &str)> = signature.map(|s| ("Stripe-Signature", s)).into_iter().collect();
        self.send_retried(|| Auth::Provider, "POST", "/payments/stripe/notify", &headers, Some(body)).await
    }
}
