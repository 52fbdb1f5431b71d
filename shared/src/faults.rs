//! Fault-injection switches for the drills in the test suite
//! (docs/design.md#fault-drills): a closer that dies right after claiming
//! CLOSING, a release that fails for a while. Off unless the function's
//! `FAULT_INJECTION` is `on`, and refused outright when `STAGE` is `prod`
//! (the template's rule refuses the deploy too). A fault hits only orders
//! whose `user_id` names it, so a drill never touches anyone else's orders.
//! Buyers are authenticated and their user id is the token's subject (a UUID
//! for Cognito); in a dev stack with faults on, a Cognito user whose user
//! name starts with `fault-` acts under that name instead
//! ([`crate::handlers::api::buyer`]), which is how a drill names its fault:
//!
//! - `fault-crash-closer-…`: the first close run that claims CLOSING stops
//!   right there, as if the process died (its message is gone too); only
//!   the lease running out and the sweep bring the order back.
//! - `fault-release-until-<unix seconds>-…`: the order's CLOSED stream record
//!   is lost (the release function skips it, as if its retries ran out), and
//!   the backstop's re-drives (drive-effects, from the sweep's pending
//!   effects queue) fail until that time.
//! - `fault-no-wakeup-…`: the order's wake-up is never created (as if the
//!   Scheduler was down and the stream record was given up): only a read
//!   (lazy expiry), an operator check or the sweep can close it.
//! - `fault-relay-…`: the relay's first publish attempt of each event of
//!   the order is reported as a failed entry (code `FaultInjection`)
//!   without being sent; the retries then publish it.
//! - `fault-close-sees-no-payment-…`: the close path's questions to the
//!   channel about the order's payments are answered "no such payment" (a
//!   provider that lost or has not yet indexed it: the sandbox's planted
//!   `not_found`, for any channel). Past the not-found grace the close
//!   concludes "never charged" while the payment is still open at the
//!   channel, so a buyer can pay after the close: the late-success drill.
//! - `fault-slow-channel-…`: a channel in a brownout. Every question about
//!   a sandbox payment of the order (`query`, whichever path asks: the
//!   close, a new attempt's supersede, settle, an operator check) takes
//!   [`SLOW_CHANNEL_DELAY`] (9 s, a Stripe call's operation bound) before
//!   the sandbox is asked, inside the call, so a time budget that cuts the
//!   call off cuts the delay off too. Opening and closing (`cancel`) are not
//!   slowed: the drill's buyers can still pay, and a close run that had its
//!   9 s for the question finishes (two slow calls per attempt would need an
//!   18 s share, which a full batch never gives, and the drill's orders
//!   would wait for a lone message). With it the time budgets
//!   (docs/architecture.md#time-budgets-per-function-a-channel-in-a-brownout)
//!   are drilled end to end: payment entry's supersede answers 503
//!   `channel_slow` (9 s is more than the order API's 8.5 s), a close in a
//!   full batch is held and handed on, an operator check answers
//!   `reminded_later`. The `slow-channel` loadcheck drill.
//!
//! One switch is not per user: `FAULT_LOST_ANSWER_RATE` ([`lost_answer_rate`])
//! loses the answers of that share of every function's write calls after
//! the service applied them (the SDK then sends them again), for the
//! `lost-response` drill ([`crate::aws::lost_answers`]).

use crate::domain::{Order, Timestamp};
use crate::ports::{ChannelPayment, OpenedPayment, PaymentChannel, RefundResult, Unavailable};
use crate::store::PaymentAttempt;
use async_trait::async_trait;
use std::sync::OnceLock;
use tracing::{error, warn};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    enabled: bool,
}

pub const CRASH_CLOSER: &str = "fault-crash-closer-";
pub const RELEASE_UNTIL: &str = "fault-release-until-";
pub const NO_WAKEUP: &str = "fault-no-wakeup-";
pub const RELAY_FIRST_PUBLISH: &str = "fault-relay-";
pub const CLOSE_SEES_NO_PAYMENT: &str = "fault-close-sees-no-payment-";
pub const SLOW_CHANNEL: &str = "fault-slow-channel-";

/// How long a sandbox question takes for a `fault-slow-channel-` buyer's
/// payments: a Stripe call's operation bound (three tries within 9 s),
/// more than the order API's time less its margin (10 − 1.5 s).
pub const SLOW_CHANNEL_DELAY: std::time::Duration = std::time::Duration::from_secs(9);

impl Faults {
    pub fn enabled() -> Self {
        Self { enabled: true }
    }

    fn from_env() -> Self {
        let on = std::env::var("FAULT_INJECTION").is_ok_and(|v| v == "on");
        let prod = std::env::var("STAGE").map_or(true, |s| s == "prod");
        if on && prod {
            error!("FAULT_INJECTION=on is refused in a prod stage (or with STAGE unset); faults stay off");
        }
        Self { enabled: on && !prod }
    }

    /// Whether a buyer token's user name is a drill user's (`fault-…`),
    /// who then acts under that name instead of the token's subject.
    pub fn is_drill_user(&self, user_name: &str) -> bool {
        self.enabled && user_name.starts_with("fault-")
    }

    /// Whether a closer that just claimed CLOSING for `order` (taken from
    /// PENDING_PAYMENT, not a resume) must play dead.
    pub fn closer_dies_after_claim(&self, order: &Order) -> bool {
        self.enabled && order.closing.is_none() && order.user_id.as_str().starts_with(CRASH_CLOSER)
    }

    /// Whether the close path must hear "no such payment" from the channel
    /// about the payments of an order of `user_id`.
    pub fn close_sees_no_payment(&self, user_id: &str) -> bool {
        self.enabled && user_id.starts_with(CLOSE_SEES_NO_PAYMENT)
    }

    /// How long the sandbox takes to answer about a payment of an order of
    /// `user_id`: `None` for everyone but drill users.
    pub fn channel_delay(&self, user_id: &str) -> Option<std::time::Duration> {
        (self.enabled && user_id.starts_with(SLOW_CHANNEL)).then_some(SLOW_CHANNEL_DELAY)
    }

    /// Whether the wake-up of an order of `user_id` is lost at create.
    pub fn wake_up_lost(&self, user_id: &str) -> bool {
        self.enabled && user_id.starts_with(NO_WAKEUP)
    }

    /// Whether the relay's first publish attempt of an event about an order
    /// of `user_id` must be reported failed without sending it.
    pub fn first_publish_fails(&self, user_id: &str) -> bool {
        self.enabled && user_id.starts_with(RELAY_FIRST_PUBLISH)
    }

    /// `Some(why)` while releasing `order` must fail.
    pub fn release_fails(&self, order: &Order, now: Timestamp) -> Option<String> {
        if !self.enabled {
            return None;
        }
        let rest = order.user_id.as_str().strip_prefix(RELEASE_UNTIL)?;
        let until: i64 = rest.split('-').next()?.parse().ok()?;
        (now.unix_millis() < until * 1000).then(|| format!("fault injection: release fails until {until}"))
    }
}

/// The share of write calls (to DynamoDB, SQS, Scheduler, EventBridge)
/// whose answer is lost after the request reached the service
/// (`FAULT_LOST_ANSWER_RATE`, from 0 to 0.5; the `lost-response` drill):
/// `None` unless fault injection is active and the rate is above 0. Unlike
/// the drills above it hits every order: a write applied twice, or an own
/// write read as somebody else's, breaks an invariant whoever's order it is.
pub fn lost_answer_rate() -> Option<f64> {
    static RATE: OnceLock<Option<f64>> = OnceLock::new();
    *RATE.get_or_init(|| {
        let raw = std::env::var("FAULT_LOST_ANSWER_RATE").ok()?;
        let rate: f64 = match raw.trim().parse() {
            Ok(r) if (0.0..=0.5).contains(&r) => r,
            _ => {
                error!(value = %raw, "FAULT_LOST_ANSWER_RATE must be a number from 0 to 0.5; no answers are lost");
                return None;
            }
        };
        (rate > 0.0 && active().enabled).then_some(rate)
    })
}

/// The switches of this process, read once from the environment.
pub fn active() -> Faults {
    static FAULTS: OnceLock<Faults> = OnceLock::new();
    *FAULTS.get_or_init(Faults::from_env)
}

/// A channel as the payments of one buyer's order meet it: the channel
/// itself, unless the buyer is a `fault-slow-channel-` drill user, whose
/// sandbox payments are asked about [`SLOW_CHANNEL_DELAY`] late.
pub struct ChannelFor<'a, C> {
    channel: &'a C,
    delay: Option<std::time::Duration>,
}

/// `channel`, as the payments of an order of `user_id` meet it.
pub fn channel_for<'a, C: PaymentChannel>(channel: &'a C, user_id: &str) -> ChannelFor<'a, C> {
    ChannelFor { channel, delay: active().channel_delay(user_id) }
}

impl<C: PaymentChannel> ChannelFor<'_, C> {
    async fn brownout(&self, attempt: &PaymentAttempt, call: &'static str) {
        if let Some(delay) = self.delay.filter(|_| attempt.channel.as_str() == "sandbox") {
            warn!(payment_id = %attempt.payment_id, call, delay_ms = delay.as_millis() as u64, "fault injection: the sandbox answers slowly");
            tokio::time::sleep(delay).await;
        }
    }
}

#[async_trait]
impl<C: PaymentChannel> PaymentChannel for ChannelFor<'_, C> {
    fn names(&self) -> Vec<&'static str> {
        self.channel.names()
    }
    async fn open(&self, attempt: &PaymentAttempt, merchant_id: &str) -> Result<OpenedPayment, Unavailable> {
        self.channel.open(attempt, merchant_id).await
    }
    async fn query(&self, attempt: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        self.brownout(attempt, "query").await;
        self.channel.query(attempt).await
    }
    async fn cancel(&self, attempt: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        self.channel.cancel(attempt).await
    }
    async fn refund(&self, attempt: &PaymentAttempt, amount: i64, key: &str) -> Result<RefundResult, Unavailable> {
        self.channel.refund(attempt, amount, key).await
    }
}
