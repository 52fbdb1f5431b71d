//! The Stripe server the stack's Stripe channel talks to (localstripe
//! locally, `STRIPE_API_BASE_URL`), as loadcheck uses it: the buyer's side
//! of a card payment, done the way Stripe.js does it with the intent's
//! `client_secret` (a card payment method, set on the intent, then a
//! confirmation with no parameters), and the reads the check makes (the
//! intent, the refunds of its charge).
//!
//! localstripe is one single-threaded Python process that the stack's
//! functions call too, so every call here waits for a permit of its own,
//! bounded semaphore (`--stripe-concurrency`), apart from the API's, and is
//! counted, so the run can print how hard it leaned on it. Like `client`,
//! nothing here panics: a failed call is an error the run records.

use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Stripe test-mode cards (localstripe knows the same numbers).
pub const CARD_OK: &str = "4242424242424242";
/// Attaches fine, declined when the intent is confirmed (402, and the
/// intent goes back to `requires_payment_method`).
pub const CARD_DECLINED: &str = "4000000000000341";
/// Tries of a call that is safe to repeat (a read, setting the payment
/// method, creating a payment method nobody uses yet).
const TRIES: u32 = 4;

/// What the buyer's confirmation got.
#[derive(Debug, Clone)]
pub enum Confirmed {
    /// 200 and `succeeded`: the intent as Stripe answered it.
    Succeeded(Value),
    /// 402: the card was declined.
    Declined,
    /// Any other answer (400 for an intent the close cancelled).
    Refused(u16, Value),
}

impl std::fmt::Display for Confirmed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Succeeded(pi) => write!(f, "200 succeeded ({})", pi["id"].as_str().unwrap_or("?")),
            Self::Declined => write!(f, "402 card declined"),
            Self::Refused(0, why) => write!(f, "refused: {}", why.as_str().unwrap_or_default()),
            Self::Refused(status, body) => {
                let message = body["error"]["message"].as_str().map_or_else(|| body.to_string(), str::to_owned);
                write!(f, "{status} {message}")
            }
        }
    }
}

/// Counters over the run's calls, for the progress line and the summary.
#[derive(Debug, Default)]
pub struct Stats {
    pub calls: AtomicU64,
    pub failed: AtomicU64,
    pub busy_ms: AtomicU64,
    pub max_ms: AtomicU64,
    pub confirmed: AtomicU64,
    pub refused: AtomicU64,
    pub declined: AtomicU64,
}

pub struct StripeApi {
    base: String,
    key: String,
    /// The stack's Stripe webhook signing secret, to sign the events the
    /// run sends itself (late and duplicate deliveries, forgeries).
    pub webhook_secret: Option<String>,
    /// The publishable key the stack is configured with, if known.
    pub publishable_key: Option<String>,
    http: reqwest::Client,
    in_flight: tokio::sync::Semaphore,
    pub concurrency: usize,
    pub stats: Stats,
    started: Instant,
}

impl StripeApi {
    /// From the stack's outputs; `None` when it names no Stripe server
    /// (`STRIPE_SECRET_KEY` unset: a stack without the Stripe channel).
    pub fn from_stack(stack: &crate::stack::Stack, concurrency: usize) -> Option<Self> {
        let key = stack.get_opt("STRIPE_SECRET_KEY")?.to_owned();
        let base = stack.get_opt("STRIPE_API_BASE_URL").unwrap_or("http://127.0.0.1:8420");
        let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("an HTTP client");
        Some(Self {
            base: base.trim_end_matches('/').to_owned(),
            key,
            webhook_secret: stack.get_opt("STRIPE_WEBHOOK_SECRET").map(str::to_owned),
            publishable_key: stack.get_opt("STRIPE_PUBLISHABLE_KEY").map(str::to_owned),
            http,
            in_flight: tokio::sync::Semaphore::new(concurrency.max(1)),
            concurrency: concurrency.max(1),
            stats: Stats::default(),
            started: Instant::now(),
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// One call: `(status, body)`; form parameters for a POST, the query
    /// for a GET. `Err` only when no answer came.
    async fn call(&self, method: &str, path: &str, params: &[(&str, &str)]) -> Result<(u16, Value), String> {
        let url = format!("{}{path}", self.base);
        let mut req = match method {
            "POST" => self.http.post(&url).form(params),
            _ => self.http.get(&url).query(params),
        };
        req = req.bearer_auth(&self.key);
        let _permit = self.in_flight.acquire().await.map_err(|e| e.to_string())?;
        let t = Instant::now();
        let sent = req.send().await;
        let answered = match sent {
            Ok(resp) => {
                let status = resp.status().as_u16();
                resp.json::<Value>().await.map(|b| (status, b)).or(Ok((status, Value::Null)))
            }
            Err(e) => Err(format!("{method} {path} at {}: {e}", self.base)),
        };
        let ms = t.elapsed().as_millis() as u64;
        self.stats.calls.fetch_add(1, Relaxed);
        self.stats.busy_ms.fetch_add(ms, Relaxed);
        self.stats.max_ms.fetch_max(ms, Relaxed);
        if answered.as_ref().map_or(true, |(s, _)| *s >= 500) {
            self.stats.failed.fetch_add(1, Relaxed);
        }
        answered
    }

    /// `call`, tried again on no answer or a 5xx: only for calls that are
    /// safe to repeat.
    async fn call_retried(&self, method: &str, path: &str, params: &[(&str, &str)]) -> Result<(u16, Value), String> {
        let mut last = String::new();
        for attempt in 0..TRIES {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(300 << attempt)).await;
            }
            match self.call(method, path, params).await {
                Ok((s, b)) if s < 500 => return Ok((s, b)),
                Ok((s, b)) => last = format!("{method} {path}: {s} {b}"),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// What Stripe.js does with the card the buyer typed: a card payment
    /// method, set on the intent (not confirmed yet). `Ok(false)`: Stripe
    /// refused to set it (an intent that can no longer be paid).
    pub async fn attach_card(&self, intent: &str, card: &str) -> Result<bool, String> {
        let card_form = [
            ("type", "card"),
            ("card[number]", card),
            ("card[exp_month]", "12"),
            ("card[exp_year]", "2034"),
            ("card[cvc]", "123"),
        ];
        let (status, pm) = self.call_retried("POST", "/v1/payment_methods", &card_form).await?;
        let pm_id = match pm["id"].as_str() {
            Some(id) if status == 200 => id.to_owned(),
            _ => return Err(format!("creating a card payment method answered {status} {pm}")),
        };
        let path = format!("/v1/payment_intents/{intent}");
        let (status, body) = self.call_retried("POST", &path, &[("payment_method", &pm_id)]).await?;
        match status {
            200 => Ok(true),
            400..=499 => Ok(false),
            _ => Err(format!("setting the card on {intent} answered {status} {body}")),
        }
    }

    /// The buyer's confirmation, with no parameters, as Stripe.js sends it.
    /// Not retried: a confirmation that got no answer may have charged.
    pub async fn confirm(&self, intent: &str) -> Result<Confirmed, String> {
        let (status, body) = self.call("POST", &format!("/v1/payment_intents/{intent}/confirm"), &[]).await?;
        let answer = match status {
            200 if body["status"] == "succeeded" => Confirmed::Succeeded(body),
            402 => Confirmed::Declined,
            _ => Confirmed::Refused(status, body),
        };
        let counter = match &answer {
            Confirmed::Succeeded(_) => &self.stats.confirmed,
            Confirmed::Declined => &self.stats.declined,
            Confirmed::Refused(..) => &self.stats.refused,
        };
        counter.fetch_add(1, Relaxed);
        Ok(answer)
    }

    /// Card set and confirmed: `Refused(0, …)` when Stripe would not even
    /// take the card.
    pub async fn pay(&self, intent: &str, card: &str) -> Result<Confirmed, String> {
        if !self.attach_card(intent, card).await? {
            self.stats.refused.fetch_add(1, Relaxed);
            return Ok(Confirmed::Refused(0, json!("the card could not be set on the intent")));
        }
        self.confirm(intent).await
    }

    /// `GET /v1/payment_intents/{id}`; `None` when Stripe has no such intent.
    pub async fn intent(&self, id: &str) -> Result<Option<Value>, String> {
        match self.call_retried("GET", &format!("/v1/payment_intents/{id}"), &[]).await? {
            (200, body) => Ok(Some(body)),
            (404, _) => Ok(None),
            (status, body) => Err(format!("retrieving {id} answered {status} {body}")),
        }
    }

    /// Every refund of a charge (`GET /v1/refunds?charge=`, page by page;
    /// localstripe answers 500 to the `payment_intent=` filter).
    pub async fn refunds_of(&self, charge: &str) -> Result<Vec<Value>, String> {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut q = vec![("charge", charge), ("limit", "100")];
            if let Some(a) = after.as_deref() {
                q.push(("starting_after", a));
            }
            let (status, page) = self.call_retried("GET", "/v1/refunds", &q).await?;
            if status != 200 {
                return Err(format!("the refunds of {charge} answered {status} {page}"));
            }
            let data = page["data"].as_array().cloned().unwrap_or_default();
            let next = data.last().and_then(|r| r["id"].as_str()).map(str::to_owned);
            all.extend(data);
            match next {
                Some(id) if page["has_more"] == true => after = Some(id),
                _ => return Ok(all),
            }
        }
    }

    /// A webhook event's body as Stripe sends it, about `object` (an
    /// intent as retrieved, or a made-up one for a forgery).
    pub fn event(event_id: &str, event_type: &str, object: &Value) -> String {
        json!({
            "id": event_id, "object": "event", "type": event_type, "api_version": "2024-06-20",
            "created": time::OffsetDateTime::now_utc().unix_timestamp(), "data": {"object": object},
        })
        .to_string()
    }

    /// One line on how the run used the server so far.
    pub fn progress(&self) -> String {
        let s = &self.stats;
        let calls = s.calls.load(Relaxed);
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let mut line = format!(
            "{calls} calls to {} ({:.1}/s, ≤{} in flight, mean {:.0} ms, max {} ms, {} failed)",
            self.base,
            calls as f64 / secs,
            self.concurrency,
            s.busy_ms.load(Relaxed) as f64 / calls.max(1) as f64,
            s.max_ms.load(Relaxed),
            s.failed.load(Relaxed),
        );
        let (ok, refused, declined) = (s.confirmed.load(Relaxed), s.refused.load(Relaxed), s.declined.load(Relaxed));
        if ok + refused + declined > 0 {
            line += &format!("; buyer confirmations: {ok} succeeded, {refused} refused, {declined} declined");
        }
        line
    }
}

/// The intent a `client_secret` (`pi_…_secret_…`) belongs to.
pub fn intent_of(client_secret: &str) -> Option<&str> {
    client_secret.split_once("_secret_").map(|(pi, _)| pi).filter(|pi| pi.starts_with("pi_"))
}

/// The charge of an intent: `latest_charge` is an id at Stripe and the
/// expanded object at localstripe.
pub fn charge_of(intent: &Value) -> Option<&str> {
    let c = &intent["latest_charge"];
    c.as_str().or_else(|| c["id"].as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_intent_is_the_client_secrets_head_and_the_charge_either_shape() {
        assert_eq!(intent_of("pi_123_secret_abc"), Some("pi_123"));
        assert_eq!(intent_of("seti_1_secret_x"), None);
        assert_eq!(intent_of("pi_123"), None);
        assert_eq!(charge_of(&json!({"latest_charge": "ch_1"})), Some("ch_1"));
        assert_eq!(charge_of(&json!({"latest_charge": {"id": "ch_2", "object": "charge"}})), Some("ch_2"));
        assert_eq!(charge_of(&json!({"latest_charge": null})), None);
    }
}
