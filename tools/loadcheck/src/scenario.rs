//! What one order of the run goes through, and what the public surface
//! must answer on the way. Each scenario names the outcome it allows; the
//! invariant check afterwards judges the records, this module only drives
//! the traffic and notes refusals that did not come (a forged notification
//! accepted, a payment opened after expiry, a replay that made a new order).
//! With `--channel stripe` the paying scenarios pay through Stripe instead
//! ([`by_stripe`]); what needs no payment is driven the same either way.

mod by_stripe;

use crate::client::{Auth, Client};
use crate::stripe::StripeApi;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use system_tests::Reply;
use time::OffsetDateTime;

/// The everyday mix (weights printed at start). `--only <scenario>` gives
/// every everyday order one of them (its kebab-case name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Scenario {
    /// Created, never paid: closes at expiry, stock and coupon back.
    NeverPaid,
    /// Paid well inside the window, notified at once.
    PaidInTime,
    /// Settled at the channel at `expire_at` (as close as the run can aim)
    /// and notified: PAID, or CLOSED with the success refunded.
    SettledAtExpiry,
    /// The channel knows, the notification comes a few seconds after
    /// `expire_at` (the close's query usually finds it first).
    NotifiedLate,
    /// Notified, then the same notification twice more and once under a
    /// new notify id: all duplicates.
    NotifiedTwice,
    /// The channel knows and never notifies: the close's query finds it.
    NeverNotified,
    /// A first attempt, then a second one that pays; the first is closed at
    /// the channel (a success on it later would be refunded).
    SecondAttempt,
    /// Forged signature, wrong amount and wrong merchant notifications:
    /// refused, nothing changes; the order then closes unpaid.
    ForgedNotifications,
    /// A payment started after `expire_at`: refused.
    PaymentAfterExpiry,
    /// The create sent again under the same key: the same order back.
    ReplayedCreate,
    /// Paid in time with a coupon: the coupon is USED.
    CouponPaid,
    /// Never paid, with a coupon: the coupon comes back.
    CouponUnpaid,
    /// Cancelled by its buyer right after create: CLOSED (BUYER_CANCELLED)
    /// long before `expire_at`, everything it held back.
    Cancelled,
    /// Spends some of the buyer's points and is paid: the points spent.
    PointsPaid,
    /// Spends some of the buyer's points, never paid: the points back.
    PointsUnpaid,
    /// Asks for more of the run's limited SKU than its purchase limit
    /// (refused 409 `purchase_limit_reached`, nothing held), then for one
    /// unit of it (taken, or refused as the buyer's other open orders of
    /// it already hold the limit), never paid.
    OverTheLimit,
}

pub const MIX: &[(Scenario, u32)] = &[
    (Scenario::NeverPaid, 26),
    (Scenario::PaidInTime, 18),
    (Scenario::SettledAtExpiry, 6),
    (Scenario::NotifiedLate, 6),
    (Scenario::NotifiedTwice, 6),
    (Scenario::NeverNotified, 6),
    (Scenario::SecondAttempt, 6),
    (Scenario::ForgedNotifications, 5),
    (Scenario::PaymentAfterExpiry, 5),
    (Scenario::ReplayedCreate, 6),
    (Scenario::CouponPaid, 5),
    (Scenario::CouponUnpaid, 5),
    (Scenario::Cancelled, 5),
    (Scenario::PointsPaid, 4),
    (Scenario::PointsUnpaid, 4),
    (Scenario::OverTheLimit, 3),
];

/// Points each buyer of a points scenario is credited at setup, and what
/// one order of theirs spends (less than any order's total).
pub const POINTS_CREDIT: i64 = 1_000_000;
pub const POINTS_SPENT: u32 = 100;
/// The purchase limit of the run's limited SKU (`lc-<run>-limited`).
pub const PURCHASE_LIMIT: u32 = 2;

/// A fault drill's share of orders: the buyer name plants it (see
/// `shared/src/faults.rs`), or the sandbox's settle body does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Drilled {
    /// `fault-crash-closer-`: the first closer dies right after CLOSING.
    CrashCloser,
    /// The channel's query times out until the run clears the fault,
    /// 20 s after `expire_at` (settling FAILED or SUCCEEDED then).
    ChannelTimeout,
    /// The channel says "not found" at the close; the money moves later
    /// and is notified: CLOSED and refunded once.
    ChannelNotFound,
    /// `fault-no-wakeup-`: orders created while the Scheduler's target is
    /// "down" (a window of the create phase) get no wake-up.
    SchedulerDown,
    /// `fault-release-until-<t>-`: the release fails until `t`.
    ReleaseFails,
    /// `fault-no-wakeup-` orders whose only closer is the paused sweep.
    SweepBacklog,
    /// `fault-relay-`: the relay's first publish of each event fails.
    RelayFails,
    /// `fault-slow-channel-`: the sandbox takes 9 s per question about the
    /// order's payments. Even orders: a second key's payment
    /// entry must answer 503 `channel_slow` inside the API's time (the
    /// earlier attempt cannot be closed in time), then the first attempt is
    /// paid: PAID. Odd orders: never paid; an operator check after expiry
    /// must answer 200 inside the API's time; the close holds the order
    /// until a run has the time to ask: CLOSED.
    SlowChannel,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Self::NeverPaid => "never_paid",
            Self::PaidInTime => "paid_in_time",
            Self::SettledAtExpiry => "settled_at_expiry",
            Self::NotifiedLate => "notified_late",
            Self::NotifiedTwice => "notified_twice",
            Self::NeverNotified => "never_notified",
            Self::SecondAttempt => "second_attempt",
            Self::ForgedNotifications => "forged_notifications",
            Self::PaymentAfterExpiry => "payment_after_expiry",
            Self::ReplayedCreate => "replayed_create",
            Self::CouponPaid => "coupon_paid",
            Self::CouponUnpaid => "coupon_unpaid",
            Self::Cancelled => "cancelled",
            Self::PointsPaid => "points_paid",
            Self::PointsUnpaid => "points_unpaid",
            Self::OverTheLimit => "over_the_limit",
        }
    }

    pub fn uses_coupon(self) -> bool {
        matches!(self, Self::CouponPaid | Self::CouponUnpaid)
    }

    pub fn uses_points(self) -> bool {
        matches!(self, Self::PointsPaid | Self::PointsUnpaid)
    }
}

impl Drilled {
    pub fn name(self) -> &'static str {
        match self {
            Self::CrashCloser => "drill:crash_closer",
            Self::ChannelTimeout => "drill:channel_timeout",
            Self::ChannelNotFound => "drill:channel_not_found",
            Self::SchedulerDown => "drill:scheduler_down",
            Self::ReleaseFails => "drill:release_fails",
            Self::SweepBacklog => "drill:sweep_backlog",
            Self::RelayFails => "drill:relay_fails",
            Self::SlowChannel => "drill:slow_channel",
        }
    }
}

/// What an order does: an everyday scenario, or a drill's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Plan {
    Mix(Scenario),
    Drill(Drilled),
}

impl Plan {
    pub fn name(self) -> &'static str {
        match self {
            Plan::Mix(s) => s.name(),
            Plan::Drill(d) => d.name(),
        }
    }

    /// The final statuses and refund counts the order `index` of this plan
    /// may end with, when every step of it was made (a step the stack
    /// refused or failed changes what it can end as). `None`: any outcome
    /// the invariants allow. `stripe`: paid through Stripe, where the
    /// scenarios that pay at or after `expire_at` race the close's cancel
    /// of the intent (one outcome, never a refund: see `by_stripe`).
    pub fn expected(self, index: usize, stripe: bool) -> Option<(&'static [&'static str], &'static [usize])> {
        const PAID: &[&str] = &["PAID"];
        const CLOSED: &[&str] = &["CLOSED"];
        const NONE: &[usize] = &[0];
        match self {
            Plan::Mix(Scenario::SettledAtExpiry | Scenario::NeverNotified | Scenario::PaymentAfterExpiry) if stripe => {
                Some((&["PAID", "CLOSED"], NONE))
            }
            Plan::Mix(
                Scenario::PaidInTime
                | Scenario::CouponPaid
                | Scenario::NotifiedTwice
                | Scenario::NeverNotified
                | Scenario::NotifiedLate
                | Scenario::SecondAttempt
                | Scenario::PointsPaid,
            ) => Some((PAID, NONE)),
            Plan::Mix(
                Scenario::NeverPaid
                | Scenario::Cancelled
                | Scenario::PointsUnpaid
                | Scenario::OverTheLimit
                | Scenario::CouponUnpaid
                | Scenario::ForgedNotifications
                | Scenario::PaymentAfterExpiry
                | Scenario::ReplayedCreate,
            ) => Some((CLOSED, NONE)),
            Plan::Mix(Scenario::SettledAtExpiry) => None,
            Plan::Drill(
                Drilled::CrashCloser | Drilled::SchedulerDown | Drilled::SweepBacklog | Drilled::ReleaseFails,
            ) => Some((CLOSED, NONE)),
            Plan::Drill(Drilled::RelayFails | Drilled::ChannelTimeout | Drilled::SlowChannel) if index % 2 == 0 => {
                Some((PAID, NONE))
            }
            Plan::Drill(Drilled::RelayFails | Drilled::ChannelTimeout | Drilled::SlowChannel) => Some((CLOSED, NONE)),
            // Closed and refunded; PAID only had the close not run by the
            // time the money moved.
            Plan::Drill(Drilled::ChannelNotFound) => Some((&["CLOSED", "PAID"], &[0, 1])),
        }
    }
}

/// One order to drive.
#[derive(Debug, Clone)]
pub struct OrderPlan {
    pub index: usize,
    pub plan: Plan,
    pub buyer: String,
    pub sku: String,
    pub qty: u32,
    pub coupon: Option<String>,
    /// Points the order spends (0: none).
    pub points: u32,
    pub idempotency_key: String,
}

/// What driving one order produced.
#[derive(Debug, Clone, Default)]
pub struct Driven {
    pub order_id: Option<String>,
    pub expire_at: Option<OffsetDateTime>,
    /// Creates answered as replays of an accepted one (same key).
    pub replays: u32,
    /// Answers the surface must not have given (a refusal that did not
    /// come, a replay with another order): invariant failures of the run.
    pub wrong_answers: Vec<String>,
    /// Calls that failed after their retries (transport, 5xx): the run
    /// could not do what it planned.
    pub errors: Vec<String>,
    pub create_ms: Option<u64>,
    /// With Stripe: whether the confirmation that decides the order's
    /// outcome succeeded (`true`: it must end PAID) or was refused by
    /// Stripe (`false`: CLOSED), neither with a refund.
    pub stripe_confirmed: Option<bool>,
    /// The over-the-limit probe's one-unit create was refused by the
    /// limit (the buyer's other open orders of the SKU held it): no order.
    pub refused_by_cap: bool,
}

pub const PRICE: i64 = system_tests::PRICE;

pub fn order_body(p: &OrderPlan) -> String {
    let mut b = json!({"currency": "EUR", "items": [{"sku": p.sku, "qty": p.qty, "unit_price": PRICE}]});
    if let Some(c) = &p.coupon {
        b["coupon_id"] = json!(c);
    }
    if p.points > 0 {
        b["points"] = json!(p.points);
    }
    b.to_string()
}

fn now_unix() -> i64 {
    OffsetDateTime::now_utc().unix_timestamp()
}

async fn sleep_until(t: OffsetDateTime) {
    let left = (t - OffsetDateTime::now_utc()).whole_milliseconds();
    if left > 0 {
        tokio::time::sleep(Duration::from_millis(left as u64)).await;
    }
}

/// A payment attempt the run opened.
struct Attempt {
    payment_id: String,
    amount: i64,
    /// Stripe: the PaymentIntent its `client_secret` belongs to, and the
    /// publishable key handed out beside it.
    intent: Option<String>,
    publishable_key: Option<String>,
}

struct Driver<'a> {
    client: &'a Client,
    on_created: &'a (dyn Fn() + Sync),
    plan: &'a OrderPlan,
    /// The channel payment entry names (`sandbox`, `stripe`).
    channel: &'static str,
    out: Driven,
}

impl Driver<'_> {
    fn wrong(&mut self, what: String) {
        self.out.wrong_answers.push(format!("{} ({}): {what}", self.plan.plan.name(), self.plan.buyer));
    }

    fn error(&mut self, what: String) {
        self.out.errors.push(format!("{} ({}): {what}", self.plan.plan.name(), self.plan.buyer));
    }

    async fn create(&mut self) -> Option<(String, OffsetDateTime, i64)> {
        let body = order_body(self.plan);
        let started = std::time::Instant::now();
        let key = self.plan.idempotency_key.clone();
        let r = self
            .client
            .buyer_retried(&self.plan.buyer, "POST", "/orders", &[("Idempotency-Key", &key)], Some(&body))
            .await;
        self.out.create_ms = Some(started.elapsed().as_millis() as u64);
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                self.error(format!("create: {e}"));
                return None;
            }
        };
        if r.status != 201 {
            self.error(format!("create answered {} {}", r.status, r.body));
            return None;
        }
        if r.body["_replayed"] == true {
            // A retried create whose first try was accepted: still one order.
            self.out.replays += 1;
        }
        let id = r.body["order_id"].as_str()?.to_owned();
        let expire_at = r.body["expire_at"]
            .as_str()
            .and_then(|s| OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok())?;
        let amount = r.body["amount_total"].as_i64().unwrap_or(0);
        self.out.order_id = Some(id.clone());
        self.out.expire_at = Some(expire_at);
        (self.on_created)();
        Some((id, expire_at, amount))
    }

    fn payment_body(&self) -> String {
        json!({"channel": self.channel}).to_string()
    }

    async fn start_payment(&mut self, order_id: &str, amount: i64, key: &str) -> Option<Attempt> {
        let path = format!("/orders/{order_id}/payments");
        let body = self.payment_body();
        let r =
            self.client.buyer_retried(&self.plan.buyer, "POST", &path, &[("Idempotency-Key", key)], Some(&body)).await;
        match r {
            Ok(r) if r.status == 201 => {
                let intent = r.body["client_secret"].as_str().and_then(crate::stripe::intent_of).map(str::to_owned);
                Some(Attempt {
                    payment_id: r.body["payment_id"].as_str().unwrap_or("").to_owned(),
                    amount,
                    intent,
                    publishable_key: r.body["publishable_key"].as_str().map(str::to_owned),
                })
            }
            // The order may legitimately be past its window already on a
            // loaded stack; the run notes it but it is no violation.
            Ok(r) if r.status == 409 => {
                self.error(format!("payment entry refused: {} {}", r.status, r.body));
                None
            }
            Ok(r) => {
                self.error(format!("payment entry answered {} {}", r.status, r.body));
                None
            }
            Err(e) => {
                self.error(format!("payment entry: {e}"));
                None
            }
        }
    }

    async fn settle(&mut self, a: &Attempt, body: Value) -> Option<Value> {
        let path = format!("/sandbox/payments/{}/settle", a.payment_id);
        match self.client.admin("POST", &path, Some(&body.to_string())).await {
            Ok(r) if r.status == 200 => Some(r.body),
            Ok(r) => {
                self.error(format!("settle {body} answered {} {}", r.status, r.body));
                None
            }
            Err(e) => {
                self.error(format!("settle: {e}"));
                None
            }
        }
    }

    fn notification(&self, order_id: &str, a: &Attempt, settled: &Value, notify_id: &str) -> Value {
        json!({
            "notify_id": notify_id, "payment_id": a.payment_id, "order_id": order_id,
            "channel_txn_id": settled["channel_txn_id"], "amount": a.amount, "currency": "EUR",
            "merchant_id": self.client.merchant_id, "status": "SUCCEEDED",
        })
    }

    /// Sends a notification and checks the answer's result is one of `ok`.
    async fn notify_expect(&mut self, body: &Value, ok: &[&str]) {
        match self.client.notify(body, None, now_unix()).await {
            Ok(r) if r.status == 200 && ok.iter().any(|o| r.body["result"] == *o) => {}
            Ok(r) => self.wrong(format!("notification answered {} {} (expected one of {ok:?})", r.status, r.body)),
            Err(e) => self.error(format!("notify: {e}")),
        }
    }

    async fn pay_in_time(&mut self, id: &str, amount: i64, key: &str) {
        let Some(a) = self.start_payment(id, amount, key).await else { return };
        if let Some(s) = self.settle(&a, json!({"outcome": "SUCCEEDED", "notify": true})).await {
            // `duplicate`: a retried settle (its first answer lost, e.g. in
            // the emulator's restart) notified the same success again; the
            // order's outcome is checked after the drain.
            if !(s["webhook_response"]["result"] == "paid" || s["webhook_response"]["result"] == "duplicate") {
                self.wrong(format!("an in-time payment's notification answered {s}"));
            }
        }
    }

    /// The over-the-limit probe's first ask: more units of the limited SKU
    /// than its limit, which must be refused with nothing held. Then the
    /// plan's own create (one unit) may be refused too, when the buyer's
    /// other open orders of the SKU already hold the limit: `false` then,
    /// and the plan has no order.
    async fn over_the_limit(&mut self) -> bool {
        let over = json!({"currency": "EUR", "items": [{"sku": self.plan.sku, "qty": PURCHASE_LIMIT + 1}]});
        let key = format!("{}-over", self.plan.idempotency_key);
        let r = self
            .client
            .buyer_retried(&self.plan.buyer, "POST", "/orders", &[("Idempotency-Key", &key)], Some(&over.to_string()))
            .await;
        match r {
            Ok(r) if r.status == 409 && r.body["error"]["code"] == "purchase_limit_reached" => {}
            Ok(r) => self.wrong(format!(
                "{} units over a limit of {PURCHASE_LIMIT} answered {} {}",
                PURCHASE_LIMIT + 1,
                r.status,
                r.body
            )),
            Err(e) => self.error(format!("create over the limit: {e}")),
        }
        match self.create_as_planned().await {
            Ok(r) if r.status == 409 && r.body["error"]["code"] == "purchase_limit_reached" => {
                self.out.refused_by_cap = true;
                false
            }
            _ => true,
        }
    }

    async fn cancel(&mut self, id: &str) {
        let path = format!("/orders/{id}/cancel");
        match self.client.buyer_retried(&self.plan.buyer, "POST", &path, &[], None).await {
            Ok(r) if r.status == 200 && r.body["close_reason"] == "BUYER_CANCELLED" => {}
            // Its close is waiting on the channel: nothing was paid, so it
            // closes; the drain checks it.
            Ok(r) if r.status == 202 => {}
            Ok(r) => self.wrong(format!("a cancel of an unpaid order answered {} {}", r.status, r.body)),
            Err(e) => self.error(format!("cancel: {e}")),
        }
    }

    async fn drive(&mut self, opts: &DriveOptions) {
        if self.plan.plan == Plan::Mix(Scenario::OverTheLimit) && !self.over_the_limit().await {
            return;
        }
        let Some((id, expire_at, amount)) = self.create().await else { return };
        if let Some(stripe) = opts.stripe.as_deref() {
            if self.drive_stripe(stripe, opts, &id, expire_at, amount).await {
                return;
            }
        }
        let pay_key = format!("{}-pay1", self.plan.idempotency_key);
        let (id, key) = (id.as_str(), pay_key.as_str());
        match self.plan.plan {
            Plan::Mix(
                Scenario::NeverPaid | Scenario::CouponUnpaid | Scenario::PointsUnpaid | Scenario::OverTheLimit,
            ) => {}
            Plan::Mix(Scenario::Cancelled) => self.cancel(id).await,
            Plan::Drill(Drilled::CrashCloser | Drilled::SchedulerDown | Drilled::SweepBacklog) => {}
            Plan::Drill(Drilled::ReleaseFails) => {}
            // Half the relay drill's orders are paid, so the paid path's
            // events meet the failing publish too.
            Plan::Drill(Drilled::RelayFails) if self.plan.index % 2 == 1 => {}
            Plan::Drill(Drilled::RelayFails) => self.pay_in_time(id, amount, key).await,
            Plan::Mix(Scenario::ReplayedCreate) => self.replayed_create(id).await,
            Plan::Mix(Scenario::PaidInTime | Scenario::CouponPaid | Scenario::PointsPaid) => {
                self.pay_in_time(id, amount, key).await
            }
            Plan::Mix(Scenario::SettledAtExpiry) => self.settled_at_expiry(id, amount, key, expire_at).await,
            Plan::Mix(Scenario::NotifiedLate) => self.notified_late(id, amount, key, expire_at).await,
            Plan::Mix(Scenario::NotifiedTwice) => self.notified_twice(id, amount, key).await,
            Plan::Mix(Scenario::NeverNotified) => {
                let Some(a) = self.start_payment(id, amount, key).await else { return };
                self.settle(&a, json!({"outcome": "SUCCEEDED", "notify": false})).await;
            }
            Plan::Mix(Scenario::SecondAttempt) => self.second_attempt(id, amount, key).await,
            Plan::Mix(Scenario::ForgedNotifications) => self.forged_notifications(id, amount, key).await,
            Plan::Mix(Scenario::PaymentAfterExpiry) => {
                sleep_until(expire_at + Duration::from_millis(300)).await;
                self.payment_after_expiry(id, key).await;
            }
            Plan::Drill(Drilled::ChannelTimeout) => {
                self.channel_timeout(id, amount, key, expire_at + opts.channel_outage).await
            }
            Plan::Drill(Drilled::SlowChannel) => self.slow_channel(id, amount, key, expire_at).await,
            Plan::Drill(Drilled::ChannelNotFound) => {
                self.channel_not_found(id, amount, key, expire_at + opts.channel_outage).await
            }
        }
    }
}

/// The steps after the create of the scenarios and drills without Stripe.
impl Driver<'_> {
    /// The plan's own create (its body, its idempotency key), retried.
    async fn create_as_planned(&self) -> Result<Reply, String> {
        let body = order_body(self.plan);
        let key = self.plan.idempotency_key.clone();
        self.client.buyer_retried(&self.plan.buyer, "POST", "/orders", &[("Idempotency-Key", &key)], Some(&body)).await
    }

    /// The create sent twice more under its key: the same order back.
    async fn replayed_create(&mut self, id: &str) {
        for _ in 0..2 {
            match self.create_as_planned().await {
                Ok(r) if r.status == 201 && r.body["order_id"] == id && r.body["_replayed"] == true => {
                    self.out.replays += 1
                }
                Ok(r) => self.wrong(format!("replayed create answered {} {}", r.status, r.body)),
                Err(e) => self.error(format!("replayed create: {e}")),
            }
        }
    }

    async fn settled_at_expiry(&mut self, id: &str, amount: i64, key: &str, expire_at: OffsetDateTime) {
        let Some(a) = self.start_payment(id, amount, key).await else { return };
        sleep_until(expire_at).await;
        let path = format!("/sandbox/payments/{}/settle", a.payment_id);
        let body = json!({"outcome": "SUCCEEDED", "notify": true}).to_string();
        match self.client.admin("POST", &path, Some(&body)).await {
            // The close got there first and closed the attempt at the
            // channel: the success never happens (the race's other side).
            Ok(r) if r.status == 409 && r.body["error"]["code"] == "already_settled" => {}
            Ok(r) if r.status == 200 => {
                let result = &r.body["webhook_response"]["result"];
                if !(result == "paid" || result == "refund_pending" || result == "duplicate") {
                    self.wrong(format!("a success at expiry was answered {}", r.body));
                }
            }
            Ok(r) => self.error(format!("settle at expiry answered {} {}", r.status, r.body)),
            Err(e) => self.error(format!("settle at expiry: {e}")),
        }
    }

    async fn notified_late(&mut self, id: &str, amount: i64, key: &str, expire_at: OffsetDateTime) {
        let Some(a) = self.start_payment(id, amount, key).await else { return };
        let Some(s) = self.settle(&a, json!({"outcome": "SUCCEEDED", "notify": false})).await else { return };
        sleep_until(expire_at + Duration::from_secs(3 + (self.plan.index % 6) as u64)).await;
        let n = self.notification(id, &a, &s, &format!("late-{}", a.payment_id));
        // The close's query found the success first (duplicate) or the
        // notification wins (paid); a refund would mean the order
        // was closed over a payment the channel knew: wrong.
        self.notify_expect(&n, &["paid", "duplicate"]).await;
    }

    async fn notified_twice(&mut self, id: &str, amount: i64, key: &str) {
        let Some(a) = self.start_payment(id, amount, key).await else { return };
        let Some(s) = self.settle(&a, json!({"outcome": "SUCCEEDED", "notify": true})).await else { return };
        if !(s["webhook_response"]["result"] == "paid" || s["webhook_response"]["result"] == "duplicate") {
            self.wrong(format!("the first notification answered {s}"));
        }
        let again = self.notification(id, &a, &s, &format!("dup-{}", a.payment_id));
        self.notify_expect(&again, &["duplicate"]).await;
        self.notify_expect(&again, &["duplicate"]).await;
        let resent = self.notification(id, &a, &s, &format!("dup2-{}", a.payment_id));
        self.notify_expect(&resent, &["duplicate"]).await;
    }

    async fn second_attempt(&mut self, id: &str, amount: i64, key: &str) {
        let Some(first) = self.start_payment(id, amount, key).await else { return };
        let key2 = format!("{}-pay2", self.plan.idempotency_key);
        let Some(second) = self.start_payment(id, amount, &key2).await else { return };
        if second.payment_id == first.payment_id {
            self.wrong("a second key opened no new attempt".into());
        }
        if let Some(s) = self.settle(&second, json!({"outcome": "SUCCEEDED", "notify": true})).await {
            if !(s["webhook_response"]["result"] == "paid" || s["webhook_response"]["result"] == "duplicate") {
                self.wrong(format!("the second attempt's notification answered {s}"));
            }
        }
        // The first attempt was closed at the channel when the second
        // opened: settling it now is refused there (409), or, if the
        // channel still took it, its success must be refunded.
        let path = format!("/sandbox/payments/{}/settle", first.payment_id);
        let body = json!({"outcome": "SUCCEEDED", "notify": true}).to_string();
        match self.client.admin("POST", &path, Some(&body)).await {
            Ok(r) if r.status == 409 => {}
            Ok(r) if r.status == 200 && r.body["webhook_response"]["result"] == "refund_pending" => {}
            Ok(r) => self.wrong(format!("a success on the superseded attempt answered {} {}", r.status, r.body)),
            Err(e) => self.error(format!("settle first attempt: {e}")),
        }
    }

    async fn forged_notifications(&mut self, id: &str, amount: i64, key: &str) {
        let Some(a) = self.start_payment(id, amount, key).await else { return };
        let fake = json!({"channel_txn_id": format!("forged-{}", a.payment_id)});
        let good = self.notification(id, &a, &fake, &format!("forged-{}", a.payment_id));
        let t = now_unix();
        let checks: [(Value, Option<&str>, i64, u16); 4] = [
            (good.clone(), Some("not-the-secret"), t, 401),
            (good.clone(), None, t - 600, 401),
            (
                {
                    let mut b = good.clone();
                    b["amount"] = json!(a.amount - 1);
                    b
                },
                None,
                t,
                422,
            ),
            (
                {
                    let mut b = good.clone();
                    b["merchant_id"] = json!("someone-else");
                    b
                },
                None,
                t,
                422,
            ),
        ];
        for (body, secret, at, want) in checks {
            match self.client.notify(&body, secret, at).await {
                Ok(r) if r.status == want => {}
                Ok(r) => self.wrong(format!("a forged notification answered {} {} (want {want})", r.status, r.body)),
                Err(e) => self.error(format!("forged notify: {e}")),
            }
        }
    }

    /// A payment whose channel answers the close's query with `query` (a
    /// fault) until `until`: the attempt, once that time has come.
    async fn channel_fault(
        &mut self,
        id: &str,
        amount: i64,
        key: &str,
        query: &str,
        until: OffsetDateTime,
    ) -> Option<Attempt> {
        let a = self.start_payment(id, amount, key).await?;
        self.settle(&a, json!({"faults": {"query": query}})).await;
        sleep_until(until).await;
        Some(a)
    }

    async fn channel_timeout(&mut self, id: &str, amount: i64, key: &str, until: OffsetDateTime) {
        let Some(a) = self.channel_fault(id, amount, key, "timeout", until).await else { return };
        // The channel comes back with an answer: half paid, half failed.
        let outcome = if self.plan.index % 2 == 0 { "SUCCEEDED" } else { "FAILED" };
        self.settle(&a, json!({"outcome": outcome, "notify": false, "faults": {}})).await;
    }

    async fn channel_not_found(&mut self, id: &str, amount: i64, key: &str, until: OffsetDateTime) {
        let Some(a) = self.channel_fault(id, amount, key, "not_found", until).await else { return };
        // The money moves after all and the provider says so: the
        // order was closed, so it is refunded (or PAID, had the
        // close not run yet on a loaded stack).
        if let Some(s) = self.settle(&a, json!({"outcome": "SUCCEEDED", "notify": true})).await {
            let result = &s["webhook_response"]["result"];
            if !(result == "refund_pending" || result == "paid" || result == "duplicate") {
                self.wrong(format!("a success after 'not found' answered {s}"));
            }
        }
    }
}

impl Driver<'_> {
    /// The slow-channel drill (see [`Drilled::SlowChannel`]). Its calls are
    /// not retried on a 5xx: that is the answer under test (a gateway
    /// timeout means a budget did not hold), not a hiccup. The one
    /// exception is a function process that died under the call (see
    /// [`send_unless_killed`](Self::send_unless_killed)).
    async fn slow_channel(&mut self, id: &str, amount: i64, key: &str, expire_at: OffsetDateTime) {
        let Some(first) = self.start_payment(id, amount, key).await else { return };
        if self.plan.index % 2 == 0 {
            let path = format!("/orders/{id}/payments");
            let key2 = format!("{}-pay2", self.plan.idempotency_key);
            let body = self.payment_body();
            let started = std::time::Instant::now();
            let buyer = self.plan.buyer.clone();
            match self
                .send_unless_killed(|| Auth::Buyer(&buyer), "POST", &path, &[("Idempotency-Key", &key2)], Some(&body))
                .await
            {
                // The earlier attempt could not be closed in the API's time:
                // an honest "retry later", nothing concluded.
                Ok(r) if r.status == 503 && r.body["error"]["code"] == "channel_slow" => {}
                Ok(r) => self.wrong(format!(
                    "a second key with the channel in a brownout answered {} {} after {:?} (want 503 channel_slow)",
                    r.status,
                    r.body,
                    started.elapsed()
                )),
                Err(e) => self.error(format!("second key: {e}")),
            }
            self.settle(&first, json!({"outcome": "SUCCEEDED", "notify": true})).await;
        } else {
            sleep_until(expire_at + Duration::from_secs(2)).await;
            let path = format!("/admin/orders/{id}/check");
            match self.send_unless_killed(|| Auth::Iam, "POST", &path, &[], None).await {
                Ok(r) if r.status == 200 => {}
                Ok(r) => self.wrong(format!("an operator check in a brownout answered {} {}", r.status, r.body)),
                Err(e) => self.error(format!("operator check: {e}")),
            }
        }
    }

    /// One request, sent again (same headers, so the same idempotency key)
    /// only when the function's process exited before answering or the
    /// connection was refused or dropped: the emulator-restart drill kills
    /// every runtime with a call in flight and the gateway with it, which
    /// tells nothing about a time budget. A budget that did not hold
    /// answers a gateway timeout or an error of the function's own (or no
    /// answer within the client's timeout), and those are returned as they
    /// are.
    async fn send_unless_killed<'a>(
        &self,
        auth: impl Fn() -> Auth<'a>,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Result<Reply, String> {
        let mut answer = self.client.send(auth(), method, path, headers, body).await;
        for _ in 0..3 {
            match &answer {
                Ok(r) if r.status >= 500 && r.body["errorType"] == "Runtime.ExitError" => {}
                Err(e) if !e.ends_with(Client::TIMED_OUT) => {}
                _ => break,
            }
            // The restart takes 10-20 s.
            tokio::time::sleep(Duration::from_secs(10)).await;
            answer = self.client.send(auth(), method, path, headers, body).await;
        }
        answer
    }

    /// A payment entry after `expire_at`: refused, whatever the channel.
    async fn payment_after_expiry(&mut self, id: &str, key: &str) {
        let path = format!("/orders/{id}/payments");
        let body = self.payment_body();
        match self.client.buyer_retried(&self.plan.buyer, "POST", &path, &[("Idempotency-Key", key)], Some(&body)).await
        {
            Ok(r)
                if r.status == 409
                    && matches!(r.body["error"]["code"].as_str(), Some("order_expired" | "order_not_payable")) => {}
            Ok(r) => self.wrong(format!("a payment after expiry answered {} {}", r.status, r.body)),
            Err(e) => self.error(format!("payment after expiry: {e}")),
        }
    }
}

pub struct DriveOptions {
    /// How long past `expire_at` a planted channel fault lasts.
    pub channel_outage: Duration,
    /// The Stripe server, when the paying scenarios pay through Stripe.
    pub stripe: Option<Arc<StripeApi>>,
}

/// Drives one order; `on_created` runs once its create is accepted.
pub async fn drive(client: &Client, plan: &OrderPlan, opts: &DriveOptions, on_created: &(dyn Fn() + Sync)) -> Driven {
    let channel = if opts.stripe.is_some() { "stripe" } else { "sandbox" };
    let mut d = Driver { client, plan, channel, out: Driven::default(), on_created };
    d.drive(opts).await;
    d.out
}

/// Reads the order's admin view (it never nudges a close).
pub async fn admin_view(client: &Client, order_id: &str) -> Result<Value, String> {
    let r = client.send_retried(|| Auth::Iam, "GET", &format!("/admin/orders/{order_id}"), &[], None).await?;
    if r.status == 200 {
        Ok(r.body)
    } else {
        Err(format!("admin view of {order_id}: {} {}", r.status, r.body))
    }
}
