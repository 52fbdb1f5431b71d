//! The scenarios with `--channel stripe`: the order pays through a
//! PaymentIntent, and the buyer's part is what Stripe.js does with the
//! intent's `client_secret` (a card set on the intent, then a
//! confirmation). There is no settle route to aim with: Stripe decides,
//! and sends its own webhook about a second after a success. So each
//! sandbox scenario maps onto what a buyer and Stripe can do (`--help`
//! lists the mapping):
//!
//! - a payment at or after `expire_at` races the close, which cancels the
//!   intent: Stripe then refuses the confirmation. Either the confirmation
//!   won (PAID) or Stripe refused it (CLOSED), and never a refund: the
//!   answer the buyer got is recorded (`Driven::stripe_confirmed`) and the
//!   order's outcome must match it;
//! - late, duplicate and forged notifications are events the run signs
//!   (or fails to sign) itself with the stack's webhook secret, since
//!   localstripe's own delivery cannot be delayed or repeated;
//! - the late success (drill channel-not-found) needs a close that does
//!   not cancel the intent: `fault-close-sees-no-payment-` buyers.

use super::{sleep_until, Attempt, Drilled, DriveOptions, Driver, Plan, Scenario};
use crate::stripe::{Confirmed, StripeApi, CARD_DECLINED, CARD_OK};
use serde_json::{json, Value};
use std::time::Duration;
use time::OffsetDateTime;

/// How an unpaid order's intent is left by its buyer.
#[derive(Clone, Copy)]
enum Left {
    /// Opened, nothing more (the checkout page never used).
    Untouched,
    /// A card set, never confirmed.
    CardSet,
    /// A card declined at confirmation, never tried again.
    Declined,
}

impl Driver<'_> {
    /// Drives the order's scenario through Stripe once it is created.
    /// `false`: the scenario makes no payment, and the common path drives it.
    pub(super) async fn drive_stripe(
        &mut self,
        s: &StripeApi,
        opts: &DriveOptions,
        id: &str,
        expire_at: OffsetDateTime,
        amount: i64,
    ) -> bool {
        let key = format!("{}-pay1", self.plan.idempotency_key);
        let index = self.plan.index;
        match self.plan.plan {
            // What needs no payment is driven as with the sandbox.
            Plan::Mix(
                Scenario::ReplayedCreate | Scenario::Cancelled | Scenario::PointsUnpaid | Scenario::OverTheLimit,
            ) => return false,
            Plan::Mix(Scenario::NeverPaid) if index % 2 == 0 => return false,
            Plan::Mix(Scenario::NeverPaid) => self.leave_unpaid(s, id, amount, &key, Left::Declined).await,
            Plan::Mix(Scenario::CouponUnpaid) => self.leave_unpaid(s, id, amount, &key, Left::CardSet).await,
            // The close each drill tests (resumed after a crash, by the
            // sweep, the release retried) must cancel an open intent too.
            Plan::Drill(
                Drilled::CrashCloser | Drilled::SchedulerDown | Drilled::SweepBacklog | Drilled::ReleaseFails,
            ) => self.leave_unpaid(s, id, amount, &key, Left::Untouched).await,
            Plan::Drill(Drilled::RelayFails) if index % 2 == 1 => {
                self.leave_unpaid(s, id, amount, &key, Left::Untouched).await
            }
            Plan::Drill(Drilled::RelayFails)
            | Plan::Mix(Scenario::PaidInTime | Scenario::CouponPaid | Scenario::PointsPaid) => {
                self.pay_in_time_stripe(s, id, amount, &key, expire_at).await;
            }
            Plan::Mix(Scenario::SettledAtExpiry) => self.confirm_at(s, id, amount, &key, expire_at).await,
            Plan::Mix(Scenario::NeverNotified) => {
                self.confirm_at(s, id, amount, &key, expire_at - Duration::from_secs(1)).await
            }
            Plan::Mix(Scenario::PaymentAfterExpiry) => self.late_payer(s, id, amount, expire_at).await,
            Plan::Mix(Scenario::NotifiedLate) => self.notified_late_stripe(s, id, amount, &key, expire_at).await,
            Plan::Mix(Scenario::NotifiedTwice) => self.notified_twice_stripe(s, id, amount, &key, expire_at).await,
            Plan::Mix(Scenario::SecondAttempt) => self.second_attempt_stripe(s, id, amount, expire_at).await,
            Plan::Mix(Scenario::ForgedNotifications) => self.forged_stripe(s, id, amount, &key).await,
            Plan::Drill(Drilled::ChannelNotFound) => self.late_success(s, opts, id, amount, &key, expire_at).await,
            // Not planned with Stripe (the run drops the drill, saying so).
            Plan::Drill(Drilled::ChannelTimeout) => self.error("channel-timeout has no Stripe fault".into()),
            Plan::Drill(Drilled::SlowChannel) => self.error("slow-channel has no Stripe fault".into()),
        }
        true
    }

    /// Payment entry through Stripe: the attempt with its intent, checked
    /// to come with what the buyer's client needs.
    async fn open_stripe(&mut self, s: &StripeApi, id: &str, amount: i64, key: &str) -> Option<(Attempt, String)> {
        let a = self.start_payment(id, amount, key).await?;
        let Some(intent) = a.intent.clone() else {
            self.wrong(format!("the Stripe payment entry of {} answered no pi_…_secret_… client_secret", a.payment_id));
            return None;
        };
        if s.publishable_key.is_some() && a.publishable_key != s.publishable_key {
            self.wrong(format!("the Stripe payment entry answered publishable_key {:?}", a.publishable_key));
        }
        Some((a, intent))
    }

    /// The buyer's good card set on the intent inside the window (Stripe
    /// refusing it there is a wrong answer); `false` if it was not set.
    async fn set_card(&mut self, s: &StripeApi, intent: &str) -> bool {
        match s.attach_card(intent, CARD_OK).await {
            Ok(true) => return true,
            Ok(false) => self.wrong(format!("Stripe would not set a card on {intent} inside the window")),
            Err(e) => self.error(format!("setting a card on {intent}: {e}")),
        }
        false
    }

    /// The buyer pays with `card`; `None` (an error noted) when Stripe
    /// gave no answer.
    async fn pay_card(&mut self, s: &StripeApi, intent: &str, card: &str) -> Option<Confirmed> {
        match s.pay(intent, card).await {
            Ok(c) => Some(c),
            Err(e) => {
                self.error(format!("paying {intent} at Stripe: {e}"));
                None
            }
        }
    }

    async fn leave_unpaid(&mut self, s: &StripeApi, id: &str, amount: i64, key: &str, how: Left) {
        let Some((_, intent)) = self.open_stripe(s, id, amount, key).await else { return };
        match how {
            Left::Untouched => {}
            Left::CardSet => {
                self.set_card(s, &intent).await;
            }
            Left::Declined => match self.pay_card(s, &intent, CARD_DECLINED).await {
                Some(Confirmed::Declined) | None => {}
                Some(other) => self.wrong(format!("the declined test card on {intent} was answered {other}")),
            },
        }
    }

    /// Paid in the window; the intent as confirmed (for the events the
    /// run sends about it), `None` if it was not paid.
    async fn pay_in_time_stripe(
        &mut self,
        s: &StripeApi,
        id: &str,
        amount: i64,
        key: &str,
        expire_at: OffsetDateTime,
    ) -> Option<Value> {
        let (_, intent) = self.open_stripe(s, id, amount, key).await?;
        match self.pay_card(s, &intent, CARD_OK).await? {
            Confirmed::Succeeded(pi) => {
                self.out.stripe_confirmed = Some(true);
                Some(pi)
            }
            other => {
                // Refused inside the window: Stripe took the intent away
                // from a payable order. After it: the run was too slow.
                let what = format!("the in-time confirmation of {intent} was answered {other}");
                if OffsetDateTime::now_utc() < expire_at {
                    self.wrong(what);
                } else {
                    self.error(format!("{what}, after expire_at (lower --rate or lengthen the window)"));
                }
                None
            }
        }
    }

    /// Records a confirmation whose outcome decides the order: a success
    /// (PAID) or Stripe's refusal (CLOSED); anything else is no outcome.
    fn note_deciding_confirm(&mut self, intent: &str, answer: Result<Confirmed, String>) {
        match answer {
            Ok(Confirmed::Succeeded(_)) => self.out.stripe_confirmed = Some(true),
            Ok(Confirmed::Refused(status, _)) if status == 0 || (400..500).contains(&status) => {
                self.out.stripe_confirmed = Some(false)
            }
            Ok(other) => self.wrong(format!("the confirmation of {intent} was answered {other}")),
            Err(e) => self.error(format!("confirming {intent}: {e}")),
        }
    }

    /// The card set in time, the confirmation sent at `at`: the race with
    /// the close's cancel when `at` is about `expire_at`.
    async fn confirm_at(&mut self, s: &StripeApi, id: &str, amount: i64, key: &str, at: OffsetDateTime) {
        let Some((_, intent)) = self.open_stripe(s, id, amount, key).await else { return };
        if !self.set_card(s, &intent).await {
            return;
        }
        sleep_until(at).await;
        let answer = s.confirm(&intent).await;
        self.note_deciding_confirm(&intent, answer);
    }

    /// The late payer: a new payment entry after `expire_at` is refused,
    /// and confirming the intent opened in time is refused by Stripe once
    /// the close cancelled it (or wins, if the close had not run yet).
    async fn late_payer(&mut self, s: &StripeApi, id: &str, amount: i64, expire_at: OffsetDateTime) {
        let key = format!("{}-pay1", self.plan.idempotency_key);
        let Some((_, intent)) = self.open_stripe(s, id, amount, &key).await else { return };
        if !self.set_card(s, &intent).await {
            return;
        }
        let late = Duration::from_millis(300 + (self.plan.index % 6) as u64 * 900);
        sleep_until(expire_at + late).await;
        self.payment_after_expiry(id, &format!("{}-pay2", self.plan.idempotency_key)).await;
        let answer = s.confirm(&intent).await;
        self.note_deciding_confirm(&intent, answer);
    }

    /// A Stripe event about `object`, signed with the stack's secret now,
    /// whose answer's `result` must be one of `ok`.
    async fn send_event(&mut self, s: &StripeApi, event_id: &str, object: &Value, ok: &[&str]) {
        let Some(secret) = s.webhook_secret.as_deref() else {
            return self.error("STRIPE_WEBHOOK_SECRET is not among the stack's outputs".into());
        };
        let body = StripeApi::event(event_id, "payment_intent.succeeded", object);
        let sig = order_core::signature::sign(secret.as_bytes(), super::now_unix(), body.as_bytes());
        match self.client.notify_stripe(&body, Some(&sig)).await {
            Ok(r) if r.status == 200 && ok.iter().any(|o| r.body["result"] == *o) => {}
            Ok(r) => {
                self.wrong(format!("Stripe event {event_id} answered {} {} (expected one of {ok:?})", r.status, r.body))
            }
            Err(e) => self.error(format!("Stripe event {event_id}: {e}")),
        }
    }

    /// Paid in time; Stripe's success told again 3-8 s after `expire_at`.
    async fn notified_late_stripe(
        &mut self,
        s: &StripeApi,
        id: &str,
        amount: i64,
        key: &str,
        expire_at: OffsetDateTime,
    ) {
        let Some(pi) = self.pay_in_time_stripe(s, id, amount, key, expire_at).await else { return };
        sleep_until(expire_at + Duration::from_secs(3 + (self.plan.index % 6) as u64)).await;
        let event_id = format!("evt_lclate_{}", pi["id"].as_str().unwrap_or("?"));
        // The success is Stripe's, so the order is PAID by now or by this.
        self.send_event(s, &event_id, &pi, &["paid", "duplicate"]).await;
    }

    /// Paid; one event about the success three times, then another id.
    async fn notified_twice_stripe(
        &mut self,
        s: &StripeApi,
        id: &str,
        amount: i64,
        key: &str,
        expire_at: OffsetDateTime,
    ) {
        let Some(pi) = self.pay_in_time_stripe(s, id, amount, key, expire_at).await else { return };
        let pi_id = pi["id"].as_str().unwrap_or("?").to_owned();
        // The first may beat Stripe's own delivery of the success.
        self.send_event(s, &format!("evt_lcdup_{pi_id}"), &pi, &["paid", "duplicate"]).await;
        self.send_event(s, &format!("evt_lcdup_{pi_id}"), &pi, &["duplicate"]).await;
        self.send_event(s, &format!("evt_lcdup_{pi_id}"), &pi, &["duplicate"]).await;
        self.send_event(s, &format!("evt_lcdup2_{pi_id}"), &pi, &["duplicate"]).await;
    }

    /// A first intent whose card is declined, a second attempt that pays;
    /// the first, cancelled when the second opened, cannot be paid after.
    async fn second_attempt_stripe(&mut self, s: &StripeApi, id: &str, amount: i64, expire_at: OffsetDateTime) {
        let key1 = format!("{}-pay1", self.plan.idempotency_key);
        let Some((first, pi1)) = self.open_stripe(s, id, amount, &key1).await else { return };
        match self.pay_card(s, &pi1, CARD_DECLINED).await {
            Some(Confirmed::Declined) => {}
            Some(other) => return self.wrong(format!("the declined test card on {pi1} was answered {other}")),
            None => return,
        }
        let key2 = format!("{}-pay2", self.plan.idempotency_key);
        if self.pay_in_time_stripe(s, id, amount, &key2, expire_at).await.is_none() {
            return;
        }
        match self.pay_card(s, &pi1, CARD_OK).await {
            Some(Confirmed::Refused(..)) | None => {}
            Some(other) => {
                self.wrong(format!("the superseded intent {pi1} of {} could still be paid: {other}", first.payment_id))
            }
        }
    }

    /// Refused deliveries (401: another secret, stale, a body changed after
    /// signing, unsigned) and a signed event claiming a success Stripe does
    /// not have: decided from the intent as Stripe answers it, still open.
    async fn forged_stripe(&mut self, s: &StripeApi, id: &str, amount: i64, key: &str) {
        let Some((a, intent)) = self.open_stripe(s, id, amount, key).await else { return };
        let Some(secret) = s.webhook_secret.clone() else {
            return self.error("STRIPE_WEBHOOK_SECRET is not among the stack's outputs".into());
        };
        let claimed = json!({"id": intent, "object": "payment_intent", "status": "succeeded", "amount": amount,
            "currency": "eur", "metadata": {"order_id": id, "payment_id": a.payment_id}});
        let body = StripeApi::event(&format!("evt_lcforged_{intent}"), "payment_intent.succeeded", &claimed);
        let t = super::now_unix();
        let sign =
            |secret: &str, t: i64, body: &str| order_core::signature::sign(secret.as_bytes(), t, body.as_bytes());
        let changed = body.replacen("\"succeeded\"", "\"processing\"", 1);
        let cases = [
            ("another secret", Some(sign("whsec_not_the_stacks", t, &body)), body.clone(), 401),
            ("stale", Some(sign(&secret, t - 600, &body)), body.clone(), 401),
            ("changed after signing", Some(sign(&secret, t, &body)), changed, 401),
            ("unsigned", None, body.clone(), 401),
        ];
        for (case, sig, b, want) in cases {
            match self.client.notify_stripe(&b, sig.as_deref()).await {
                Ok(r) if r.status == want => {}
                Ok(r) => self.wrong(format!("a Stripe event {case} answered {} {} (want {want})", r.status, r.body)),
                Err(e) => self.error(format!("forged Stripe event: {e}")),
            }
        }
        self.send_event(s, &format!("evt_lcforged_{intent}"), &claimed, &["still_open"]).await;
    }

    /// The late success: the close hears "no such payment" (the fault) and
    /// closes without cancelling the intent; once CLOSED, the buyer pays.
    async fn late_success(
        &mut self,
        s: &StripeApi,
        opts: &DriveOptions,
        id: &str,
        amount: i64,
        key: &str,
        expire_at: OffsetDateTime,
    ) {
        let Some((_, intent)) = self.open_stripe(s, id, amount, key).await else { return };
        if !self.set_card(s, &intent).await {
            return;
        }
        sleep_until(expire_at).await;
        // The close waits out the not-found grace first (30 s locally).
        let deadline = expire_at + opts.channel_outage + Duration::from_secs(150);
        while OffsetDateTime::now_utc() < deadline {
            match super::admin_view(self.client, id).await {
                Ok(v) if v["status"] == "CLOSED" => break,
                Ok(_) => {}
                Err(e) => return self.error(e),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        match s.confirm(&intent).await {
            Ok(Confirmed::Succeeded(_)) => {}
            Ok(other) => self.wrong(format!("the intent {intent} the close left open could not be paid: {other}")),
            Err(e) => self.error(format!("confirming {intent}: {e}")),
        }
    }
}
