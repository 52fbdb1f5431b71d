//! The Stripe channel: one PaymentIntent per payment attempt (automatic
//! capture), closed by cancelling the intent, refunded with `/v1/refunds`,
//! and read back page by page for reconciliation.
//!
//! Every write to Stripe carries an `Idempotency-Key` derived from our own
//! ids, so a retried call (ours, the SDK's, a redelivered message's) moves
//! money at most once. A refund is also looked up by its key in our
//! metadata before one is created: Stripe keeps idempotency keys for 24
//! hours, and a refund retried after that must still find the first one.

use super::client::{CallError, StripeClient};
use super::objects::{self, intent_state, refund_state, List, PaymentIntent, Refund};
use super::StripeSettings;
use crate::domain::*;
use crate::ports::{
    ChannelPayment, ChannelStatement, OpenedPayment, PaymentChannel, RefundResult, Statement, StatementLine,
    Unavailable,
};
use crate::store::PaymentAttempt;
use async_trait::async_trait;
use std::collections::HashMap;

/// The channel name attempts and notifications carry.
pub const CHANNEL_NAME: &str = "stripe";
/// Page size of the statement's list calls (Stripe's maximum).
const PAGE: usize = 100;

#[derive(Clone, Debug)]
pub struct StripeChannel {
    client: StripeClient,
    settings: StripeSettings,
}

fn unavailable(context: &'static str, e: CallError) -> Unavailable {
    Unavailable::new(context, e)
}

/// Stripe answering 404 for an intent it created for us is not "never
/// charged": the key is another account's or of the other mode (a rotation
/// gone wrong). Unknown, so the order is held and nothing is released.
fn vanished(id: &str) -> Unavailable {
    Unavailable::new(
        "Stripe PaymentIntent",
        format!(
            "Stripe has no PaymentIntent {id}, which it created for this payment: is the secret key of another \
             account, or of the other mode (test/live)?"
        ),
    )
}

impl StripeChannel {
    pub fn new(client: StripeClient, settings: StripeSettings) -> Self {
        Self { client, settings }
    }

    pub fn publishable_key(&self) -> Option<&str> {
        self.settings.publishable_key.as_deref()
    }

    /// `GET /v1/payment_intents/{id}`; `None` when Stripe has no such intent.
    pub async fn intent(&self, id: &str) -> Result<Option<PaymentIntent>, Unavailable> {
        match self.client.get("retrieve PaymentIntent", &format!("/v1/payment_intents/{id}"), &[]).await {
            Ok(pi) => Ok(Some(pi)),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(unavailable("Stripe retrieve PaymentIntent", e)),
        }
    }

    /// The intent of `attempt`, checked to be ours: an intent whose
    /// metadata names another payment is never read as this one's answer.
    async fn attempt_intent(&self, attempt: &PaymentAttempt) -> Result<Option<PaymentIntent>, Unavailable> {
        let Some(id) = attempt.channel_ref.as_deref() else { return Ok(None) };
        let Some(pi) = self.intent(id).await? else { return Err(vanished(id)) };
        if pi.meta(objects::META_PAYMENT_ID) != Some(attempt.payment_id.as_str()) {
            return Err(Unavailable::new(
                "Stripe PaymentIntent",
                format!("{} does not carry metadata[payment_id]={}", pi.id, attempt.payment_id),
            ));
        }
        Ok(Some(pi))
    }

    /// The new intent, or `Err(why)` when Stripe refused the request itself
    /// (400: an amount below its minimum, a currency it does not take):
    /// nothing was created, and asking again cannot change that.
    async fn create_intent(&self, attempt: &PaymentAttempt) -> Result<Result<PaymentIntent, String>, Unavailable> {
        let form = [
            ("amount", attempt.amount.to_string()),
            ("currency", attempt.currency.as_str().to_ascii_lowercase()),
            ("capture_method", "automatic".to_owned()),
            ("metadata[order_id]", attempt.order_id.to_string()),
            ("metadata[payment_id]", attempt.payment_id.to_string()),
        ];
        match self
            .client
            .post("create PaymentIntent", "/v1/payment_intents", &form, Some(attempt.payment_id.as_str()))
            .await
        {
            Ok(pi) => Ok(Ok(pi)),
            Err(CallError::Api { status: 400, message, .. }) => Ok(Err(message)),
            Err(e) => Err(unavailable("Stripe create PaymentIntent", e)),
        }
    }

    /// The charge a refund of `attempt` goes against.
    async fn charge_of(&self, attempt: &PaymentAttempt) -> Result<Option<String>, Unavailable> {
        if let Some(txn) = attempt.channel_txn_id.as_deref().filter(|t| t.starts_with("ch_") || t.starts_with("py_")) {
            return Ok(Some(txn.to_owned()));
        }
        Ok(self.attempt_intent(attempt).await?.and_then(|pi| pi.charge_id().map(str::to_owned)))
    }

    /// Every refund of `charge`, following the cursor.
    async fn refunds_of(&self, charge: &str) -> Result<Vec<Refund>, Unavailable> {
        let mut all = Vec::new();
        let mut starting_after: Option<String> = None;
        loop {
            let mut q = vec![("charge", charge.to_owned()), ("limit", PAGE.to_string())];
            if let Some(s) = starting_after.take() {
                q.push(("starting_after", s));
            }
            let page: List<Refund> = self
                .client
                .get("list refunds", "/v1/refunds", &q)
                .await
                .map_err(|e| unavailable("Stripe list refunds", e))?;
            let next = page.data.last().map(|r| r.id.clone());
            all.extend(page.data);
            match next {
                Some(id) if page.has_more => starting_after = Some(next_cursor(&q, &id)?),
                _ => return Ok(all),
            }
        }
    }

    /// Every object of a list endpoint created at or after `since` (unix
    /// seconds), following `starting_after` cursors.
    async fn list_since<T>(
        &self,
        what: &'static str,
        path: &str,
        since: i64,
        until: Option<i64>,
    ) -> Result<Vec<T>, Unavailable>
    where
        T: serde::de::DeserializeOwned + Created,
    {
        let mut all = Vec::new();
        let mut starting_after: Option<String> = None;
        loop {
            let mut q = vec![("limit", PAGE.to_string())];
            if self.settings.list_filter_by_created {
                q.push(("created[gte]", since.to_string()));
                if let Some(until) = until {
                    q.push(("created[lt]", until.to_string()));
                }
            }
            if let Some(s) = starting_after.take() {
                q.push(("starting_after", s));
            }
            let page: List<T> = self.client.get(what, path, &q).await.map_err(|e| unavailable(what, e))?;
            let next = page.data.last().map(|o| o.id().to_owned());
            all.extend(page.data.into_iter().filter(|o| o.created() >= since && until.is_none_or(|u| o.created() < u)));
            match next {
                Some(id) if page.has_more => starting_after = Some(next_cursor(&q, &id)?),
                _ => return Ok(all),
            }
        }
    }
}

/// The cursor of the next page; a server that answers the same last object
/// again (with `has_more`) would page for ever, so that is an error.
fn next_cursor(query: &[(&str, String)], last: &str) -> Result<String, Unavailable> {
    if query.iter().any(|(k, v)| *k == "starting_after" && v == last) {
        return Err(Unavailable::new("Stripe list", format!("the page after {last} starts at {last} again")));
    }
    Ok(last.to_owned())
}

/// What the statement's pagination needs of a listed object.
trait Created {
    fn id(&self) -> &str;
    fn created(&self) -> i64;
}
impl Created for PaymentIntent {
    fn id(&self) -> &str {
        &self.id
    }
    fn created(&self) -> i64 {
        self.created
    }
}
impl Created for Refund {
    fn id(&self) -> &str {
        &self.id
    }
    fn created(&self) -> i64 {
        self.created
    }
}

fn answer(pi: Option<PaymentIntent>) -> Result<ChannelPayment, Unavailable> {
    match pi {
        None => Ok(ChannelPayment::NotFound),
        Some(pi) => intent_state(&pi).map_err(|why| Unavailable::new("Stripe PaymentIntent", why)),
    }
}

#[async_trait]
impl PaymentChannel for StripeChannel {
    fn names(&self) -> Vec<&'static str> {
        vec![CHANNEL_NAME]
    }

    async fn open(&self, attempt: &PaymentAttempt, _merchant_id: &str) -> Result<OpenedPayment, Unavailable> {
        // Opened before: the same intent again (its client_secret is only
        // ever handed to the buyer whose attempt it is).
        let pi = match self.attempt_intent(attempt).await? {
            Some(pi) => pi,
            None => match self.create_intent(attempt).await? {
                Ok(pi) => pi,
                Err(refused) => return Ok(OpenedPayment { refused: Some(refused), ..Default::default() }),
            },
        };
        Ok(OpenedPayment { channel_ref: Some(pi.id), client_secret: pi.client_secret, refused: None })
    }

    async fn query(&self, attempt: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        // Without a recorded intent id nobody was handed a client_secret:
        // nothing can have been paid through it (the close path's write of
        // that conclusion is conditional on the id still being absent).
        answer(self.attempt_intent(attempt).await?)
    }

    async fn cancel(&self, attempt: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        let Some(id) = attempt.channel_ref.as_deref() else { return Ok(ChannelPayment::NotFound) };
        let form: Vec<(&str, String)> = if self.settings.send_cancellation_reason {
            vec![("cancellation_reason", "abandoned".to_owned())]
        } else {
            vec![]
        };
        match self
            .client
            .post::<PaymentIntent>("cancel PaymentIntent", &format!("/v1/payment_intents/{id}/cancel"), &form, None)
            .await
        {
            Ok(pi) if pi.meta(objects::META_PAYMENT_ID) == Some(attempt.payment_id.as_str()) => answer(Some(pi)),
            Ok(pi) => {
                Err(Unavailable::new("Stripe cancel", format!("{} is not payment {}", pi.id, attempt.payment_id)))
            }
            Err(e) if e.status() == Some(404) => Err(vanished(id)),
            // Stripe refuses to cancel an intent that succeeded or is
            // processing (and one already cancelled): read what it is.
            Err(e) if matches!(e.status(), Some(400 | 409)) => answer(self.attempt_intent(attempt).await?),
            Err(e) => Err(unavailable("Stripe cancel PaymentIntent", e)),
        }
    }

    async fn refund(&self, attempt: &PaymentAttempt, amount: i64, key: &str) -> Result<RefundResult, Unavailable> {
        let Some(charge) = self.charge_of(attempt).await? else {
            return Ok(RefundResult::Failed(format!("payment {} has no Stripe charge to refund", attempt.payment_id)));
        };
        let refunds = self.refunds_of(&charge).await?;
        let request = match refund_to_make(&refunds, amount, key) {
            RefundStep::Found(r) => return Ok(refund_state(r)),
            RefundStep::Make { idempotency_key } => idempotency_key,
        };
        let form = [
            ("charge", charge),
            ("amount", amount.to_string()),
            ("metadata[order_id]", attempt.order_id.to_string()),
            ("metadata[payment_id]", attempt.payment_id.to_string()),
            ("metadata[refund_key]", key.to_owned()),
        ];
        match self.client.post::<Refund>("create refund", "/v1/refunds", &form, Some(&request)).await {
            Ok(r) => Ok(refund_state(&r)),
            // Refused (already refunded in full, a disputed charge…): a
            // failed try, counted; a person sees it after the last one.
            Err(CallError::Api { status, code, message, .. }) if (400..500).contains(&status) => {
                Ok(RefundResult::Failed(format!(
                    "Stripe refused the refund ({status}{}): {message}",
                    code.map(|c| format!(", {c}")).unwrap_or_default()
                )))
            }
            Err(e) => Err(unavailable("Stripe create refund", e)),
        }
    }
}

/// What a refund try does, from the charge's refunds as Stripe lists them.
#[derive(Debug, PartialEq)]
enum RefundStep<'a> {
    /// A refund that answers for this one: ours, not failed (its state is
    /// the answer), or, without one of ours, refunds made by hand (the
    /// dashboard) that already gave the whole amount back.
    Found(&'a Refund),
    /// A new refund, under this idempotency key: `key` the first time, and a
    /// key of its own after each refund of ours that Stripe failed or
    /// cancelled (no money moved), so a try after a failure is not answered
    /// with the failed refund for ever, while concurrent tries still make
    /// one refund.
    Make { idempotency_key: String },
}

fn refund_to_make<'a>(refunds: &'a [Refund], amount: i64, key: &str) -> RefundStep<'a> {
    let is_ours = |r: &&Refund| r.metadata.get(objects::META_REFUND_KEY).map(String::as_str) == Some(key);
    let dead = |r: &Refund| matches!(r.status.as_str(), "failed" | "canceled");
    let ours: Vec<&Refund> = refunds.iter().filter(is_ours).collect();
    if let Some(live) = ours.iter().find(|r| !dead(r)) {
        return RefundStep::Found(live);
    }
    let by_hand: Vec<&Refund> = refunds
        .iter()
        .filter(|r| r.status == "succeeded" && !r.metadata.contains_key(objects::META_REFUND_KEY))
        .collect();
    if by_hand.iter().map(|r| r.amount).sum::<i64>() >= amount {
        if let Some(first) = by_hand.first() {
            return RefundStep::Found(first);
        }
    }
    let idempotency_key = if ours.is_empty() { key.to_owned() } else { format!("{key}-after-{}", ours.len()) };
    RefundStep::Make { idempotency_key }
}

/// One line per intent of ours (metadata `payment_id` and `order_id`)
/// created in the window, with the refunds of its charge.
fn statement_lines(intents: Vec<PaymentIntent>, refunds: &[Refund]) -> Vec<StatementLine> {
    let mut refunded: HashMap<&str, (i64, &str)> = HashMap::new();
    for r in refunds.iter().filter(|r| r.status == "succeeded") {
        for target in [r.charge.as_deref(), r.payment_intent.as_deref()].into_iter().flatten() {
            let e = refunded.entry(target).or_insert((0, r.id.as_str()));
            e.0 += r.amount;
        }
    }
    intents
        .into_iter()
        .filter_map(|pi| {
            let payment_id = PaymentId::parse(pi.meta(objects::META_PAYMENT_ID)?).ok()?;
            let order_id = OrderId::parse(pi.meta(objects::META_ORDER_ID)?).ok()?;
            let currency = Currency::parse(pi.currency.to_ascii_uppercase()).ok()?;
            let status = match pi.status.as_str() {
                "succeeded" => PaymentStatus::Succeeded,
                "canceled" => PaymentStatus::Failed,
                _ => PaymentStatus::Processing,
            };
            let refund = pi.charge_id().and_then(|c| refunded.get(c)).or_else(|| refunded.get(pi.id.as_str()));
            Some(StatementLine {
                payment_id,
                order_id,
                amount: pi.amount,
                currency,
                status,
                refund_id: refund.map(|(_, id)| (*id).to_owned()),
                refunded_amount: refund.map(|(a, _)| *a).unwrap_or(0),
                created_at: Some(Timestamp::from_unix_millis(pi.created.saturating_mul(1000))),
            })
        })
        .collect()
}

#[async_trait]
impl ChannelStatement for StripeChannel {
    async fn statement(&self, now: Timestamp) -> Result<Statement, Unavailable> {
        let since = now.minus(self.settings.statement_window);
        let secs = since.unix_seconds();
        let intents = self.list_since("Stripe list PaymentIntents", "/v1/payment_intents", secs, None).await?;
        let refunds: Vec<Refund> = self.list_since("Stripe list refunds", "/v1/refunds", secs, None).await?;
        // Stripe's `created` is whole seconds: the window starts at one.
        let since = Timestamp::from_unix_millis(secs * 1000);
        Ok(Statement { since: Some(since), until: None, lines: statement_lines(intents, &refunds) })
    }

    /// The intents created in the window (`created[gte]`/`created[lt]`),
    /// and every refund created since the window opened: a refund of one of
    /// its payments may come days after it.
    async fn statement_between(&self, since: Timestamp, until: Timestamp) -> Result<Statement, Unavailable> {
        // Whole seconds: the window widens to the seconds that hold it.
        let (from, to) = (since.unix_seconds(), (until.unix_millis() + 999).div_euclid(1000));
        let intents = self.list_since("Stripe list PaymentIntents", "/v1/payment_intents", from, Some(to)).await?;
        let refunds: Vec<Refund> = self.list_since("Stripe list refunds", "/v1/refunds", from, None).await?;
        let (since, until) = (Timestamp::from_unix_millis(from * 1000), Timestamp::from_unix_millis(to * 1000));
        Ok(Statement { since: Some(since), until: Some(until), lines: statement_lines(intents, &refunds) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pi(id: &str, status: &str, payment: &str, charge: Option<&str>) -> PaymentIntent {
        serde_json::from_value(serde_json::json!({
            "id": id, "status": status, "amount": 500, "currency": "eur", "latest_charge": charge,
            "metadata": {"payment_id": payment, "order_id": "ord_1"}
        }))
        .unwrap()
    }

    fn refund(id: &str, amount: i64, status: &str, key: Option<&str>) -> Refund {
        let metadata = key.map(|k| [("refund_key".to_owned(), k.to_owned())].into_iter().collect()).unwrap_or_default();
        Refund {
            id: id.into(),
            amount,
            status: status.into(),
            charge: Some("ch_1".into()),
            payment_intent: None,
            metadata,
            failure_reason: None,
            created: 0,
        }
    }

    #[test]
    fn a_refund_is_found_made_or_made_again_after_a_failure_and_never_twice() {
        let key = "refund-pay_1";
        assert_eq!(refund_to_make(&[], 500, key), RefundStep::Make { idempotency_key: key.into() });
        let pending = [refund("re_1", 500, "pending", Some(key))];
        assert_eq!(refund_to_make(&pending, 500, key), RefundStep::Found(&pending[0]));
        // Failed at Stripe: no money moved, a new refund under a key of its own.
        let failed = [refund("re_1", 500, "failed", Some(key))];
        assert_eq!(refund_to_make(&failed, 500, key), RefundStep::Make { idempotency_key: format!("{key}-after-1") });
        let again = [refund("re_2", 500, "succeeded", Some(key)), refund("re_1", 500, "failed", Some(key))];
        assert_eq!(refund_to_make(&again, 500, key), RefundStep::Found(&again[0]));
        // Refunded by hand in full: done; in part: ours is still made.
        let by_hand = [refund("re_9", 500, "succeeded", None)];
        assert_eq!(refund_to_make(&by_hand, 500, key), RefundStep::Found(&by_hand[0]));
        let part = [refund("re_9", 100, "succeeded", None)];
        assert_eq!(refund_to_make(&part, 500, key), RefundStep::Make { idempotency_key: key.into() });
        // Another payment's refund on the same charge is not ours.
        let other = [refund("re_7", 500, "succeeded", Some("refund-pay_2"))];
        assert_eq!(refund_to_make(&other, 500, key), RefundStep::Make { idempotency_key: key.into() });
    }

    #[test]
    fn a_statement_line_carries_the_intent_its_refunds_and_skips_foreign_intents() {
        let foreign: PaymentIntent = serde_json::from_value(
            serde_json::json!({"id": "pi_x", "status": "succeeded", "amount": 1, "currency": "eur", "metadata": {}}),
        )
        .unwrap();
        let intents = vec![
            pi("pi_1", "succeeded", "pay_1", Some("ch_1")),
            pi("pi_2", "canceled", "pay_2", None),
            pi("pi_3", "requires_payment_method", "pay_3", None),
            foreign,
        ];
        let refunds: Vec<Refund> = serde_json::from_value(serde_json::json!([
            {"id": "re_1", "amount": 500, "status": "succeeded", "charge": "ch_1"},
            {"id": "re_2", "amount": 500, "status": "failed", "charge": "ch_1"}
        ]))
        .unwrap();
        let lines = statement_lines(intents, &refunds);
        assert_eq!(lines.len(), 3, "the intent without our metadata is not ours");
        assert_eq!(lines[0].status, PaymentStatus::Succeeded);
        assert_eq!(
            (lines[0].refund_id.as_deref(), lines[0].refunded_amount),
            (Some("re_1"), 500),
            "a failed refund is not money back"
        );
        assert_eq!(lines[0].currency.as_str(), "EUR");
        assert_eq!(lines[1].status, PaymentStatus::Failed);
        assert_eq!(lines[2].status, PaymentStatus::Processing);
        assert!(lines[1].refund_id.is_none() && lines[2].refunded_amount == 0);
    }
}
