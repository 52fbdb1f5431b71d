//! The close use case (docs/design.md#close-protocol): every wake-up — the
//! scheduled one, a swept one, a retried one — ends here, and the decision is
//! taken from the order's record and server time, never from the message.
//!
//! - Not due yet: put the reminder back for the remaining time.
//! - Due, no payment attempt: PENDING_PAYMENT → CLOSED in one conditional
//!   write. No money can be in flight, so nothing needs checking.
//! - Due with attempts: claim CLOSING with a lease (this also stops new
//!   attempts), then establish the money facts: a local success, or the
//!   channel's answer for every attempt not yet settled. Paid → PAID.
//!   Confirmed unpaid → CLOSED. Unknown → stay CLOSING, retry later,
//!   release nothing.
//! - CLOSING with an expired lease: resume from CLOSING; never revert to
//!   PENDING_PAYMENT, which would reopen payment.
//! - CLOSING with a live lease: someone is on it; this reminder ends.
//!
//! One live reminder chain per order: the only reminder a close run puts
//! back for a due order is the one that follows its own hold, and the hold
//! keeps the lease until that reminder is due, so every other reminder in
//! between finds the lease held and ends. The sweep is the net under a
//! chain that breaks (the order's due time in the index is the lease's end).

use crate::domain::order::{decide_close, CloseDecision};
use crate::domain::*;
use crate::metrics;
use crate::ports::{ChannelPayment, Clock, CloseReminders, PaymentChannel, Unavailable, MAX_REMINDER_DELAY};
use crate::store::{Cas, Evidence, OrderStore, PaymentAttempt, PaymentStore, SettleResult};
use crate::usecases::payments::REFUND_NOTICE;
use std::time::Duration;
use tracing::{info, instrument, warn};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseOutcome {
    Closed,
    Paid,
    AlreadyFinal(OrderStatus),
    NotFound,
    /// Another closer holds a live lease: it (or, if it died, the sweep
    /// once the lease runs out) carries the order on. This reminder ends
    /// here, so duplicates never grow into parallel reminder chains.
    LeftToLeaseHolder,
    /// Not due yet, and a reminder put back earlier is still on its way:
    /// this duplicate ends.
    ReminderPending,
    /// Put back: early wake-up, a live lease held by another closer, or an
    /// unknown payment state.
    RemindedLater {
        after: Duration,
        why: &'static str,
    },
}

pub struct CloseOrder<S, C, Q> {
    pub store: S,
    pub channel: C,
    pub reminders: Q,
    pub clock: Box<dyn Clock>,
    /// How long a closer may hold CLOSING before another may resume it.
    /// Longer than the function's timeout, so a live closer never loses it.
    pub lease: Duration,
    /// How old an attempt must be before the channel's "not found" is
    /// believed to mean "nothing charged".
    pub not_found_grace: Duration,
    /// How long one close run may spend asking the channel before it stops
    /// and holds: well under the function's timeout, so that a run always
    /// ends cleanly with its lease kept and its reminder sent.
    pub budget: Duration,
}

/// A due order first handled later than this after its `expire_at` counts
/// as a late wake-up (metric `LateWakeUp`). On AWS a wake-up is scheduled a
/// minute early and finishes on an SQS delay, so a healthy one is seconds
/// late; a minute means the schedule was lost or the queue backed up and
/// the sweep, or a lazy read, did the close.
pub const LATE_WAKE_UP_AFTER: Duration = Duration::from_secs(60);

/// The default [`CloseOrder::budget`] for a 30 s function timeout.
pub const DEFAULT_CLOSE_BUDGET: Duration = Duration::from_secs(15);

/// Backoff for an order held in CLOSING because its payment state is
/// unknown: doubles with the time already spent, from 5 s up to 5 minutes.
pub fn unknown_backoff(closing_for: Duration) -> Duration {
    closing_for.clamp(Duration::from_secs(5), Duration::from_secs(300))
}

/// What the money facts of a CLOSING order add up to: every success found
/// (locally or at the channel), and why anything is still unknown.
#[derive(Default)]
struct Facts {
    successes: Vec<Success>,
    unknown: Option<String>,
}

struct Success {
    payment: PaymentAttempt,
    channel_txn_id: String,
    evidence: Evidence,
}

/// How long a close run may go on: its own budget on the clock, and, in a
/// batch, the real instant its share of the invocation ends.
#[derive(Debug, Clone, Copy)]
struct RunBudget {
    at: Timestamp,
    until: Option<std::time::Instant>,
}

impl RunBudget {
    fn spent(&self, now: Timestamp) -> bool {
        now >= self.at || self.until.is_some_and(|u| std::time::Instant::now() >= u)
    }
}

/// The channel's verdict on one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Paid { channel_txn_id: String, detail: String },
    Unpaid(String),
    Unknown(String),
}

impl<S, C, Q> CloseOrder<S, C, Q>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
    Q: CloseReminders,
{
    /// `owner` identifies this closer in the lease (the Lambda request id).
    pub async fn close(&self, order_id: &OrderId, owner: &str) -> Result<CloseOutcome, Unavailable> {
        self.close_until(order_id, owner, None).await
    }

    /// As [`Self::close`], with the channel's questions cut off at `until`
    /// (this message's share of the invocation's time, see
    /// `handlers::batch::each_sqs_message_within`): a question not answered
    /// by then is unknown, so the order is held and asked again later,
    /// rather than the invocation running out with the whole batch.
    #[instrument(skip_all, fields(order_id = %order_id))]
    pub async fn close_until(
        &self,
        order_id: &OrderId,
        owner: &str,
        until: Option<std::time::Instant>,
    ) -> Result<CloseOutcome, Unavailable> {
        let deadline = RunBudget { at: self.clock.now().plus(self.budget), until };
        // A rejected compare-and-swap means someone else moved the order;
        // re-read and decide again. A handful of rounds is plenty: every
        // round that fails does so because the order made progress.
        for _ in 0..5 {
            let Some(order) = self.store.order(order_id).await? else {
                warn!("close reminder for an order that does not exist");
                return Ok(CloseOutcome::NotFound);
            };
            let now = self.clock.now();
            match decide_close(&order, now) {
                CloseDecision::AlreadyFinal(s) => {
                    info!(status = s.as_str(), "already final; reminder acknowledged");
                    metrics::REDUNDANT_WAKE_UP.count(1);
                    return Ok(CloseOutcome::AlreadyFinal(s));
                }
                CloseDecision::NotYetDue(after) => return self.not_yet_due(order_id, &order, after, now).await,
                CloseDecision::LeaseHeld(left) => {
                    info!(lease_left_ms = left.as_millis() as u64, "another closer holds the lease; reminder ends");
                    metrics::REDUNDANT_WAKE_UP.count(1);
                    return Ok(CloseOutcome::LeftToLeaseHolder);
                }
                CloseDecision::CloseNow => match self.store.close_unpaid(&order, now).await? {
                    Cas::Applied => {
                        let lag = order.due_at().until(now);
                        let reason = order.close_reason().as_str();
                        info!(due_to_close_ms = lag.as_millis() as u64, reason, "closed: no payment attempt");
                        first_handled_late(&order, now);
                        closed(&order, now);
                        return Ok(CloseOutcome::Closed);
                    }
                    Cas::Rejected => continue,
                },
                CloseDecision::BeginClosing | CloseDecision::ResumeClosing => {
                    if let Some(outcome) = self.claim_and_decide(order, owner, now, deadline).await? {
                        return Ok(outcome);
                    }
                }
            }
        }
        // Still contended after several rounds: try again shortly rather
        // than spin.
        self.later(order_id, Duration::from_secs(5), "contended").await
    }

    /// Woken before the order is due: put the reminder back for when it is.
    async fn not_yet_due(
        &self,
        order_id: &OrderId,
        order: &Order,
        after: Duration,
        now: Timestamp,
    ) -> Result<CloseOutcome, Unavailable> {
        metrics::EARLY_WAKE_UP.count(1);
        // One put-back per wait: a duplicate early wake-up (the
        // schedule delivered twice, an early operator check)
        // finds the first one's note and ends.
        let until = now.plus(after.min(MAX_REMINDER_DELAY));
        if self.store.note_early_reminder(order, until, now).await? == Cas::Rejected {
            info!("an early reminder is already on its way; this one ends");
            metrics::REDUNDANT_WAKE_UP.count(1);
            return Ok(CloseOutcome::ReminderPending);
        }
        self.later(order_id, after, "not yet due").await
    }

    /// Claims CLOSING (or takes over a dead closer's lease) as `owner`, then
    /// decides on the money facts. `None` means the order moved under us
    /// and the caller should re-read.
    async fn claim_and_decide(
        &self,
        order: Order,
        owner: &str,
        now: Timestamp,
        deadline: RunBudget,
    ) -> Result<Option<CloseOutcome>, Unavailable> {
        let lease = ClosingLease {
            started_at: order.closing.as_ref().map(|l| l.started_at).unwrap_or(now),
            owner: owner.to_owned(),
            lease_until: now.plus(self.lease),
            resumes: order.closing.as_ref().map(|l| l.resumes + 1).unwrap_or(0),
        };
        if self.store.begin_closing(&order, &lease, now).await? == Cas::Rejected {
            return Ok(None);
        }
        if order.closing.is_none() {
            first_handled_late(&order, now);
        } else {
            // A dead closer's lease ran out and we took it over.
            warn!(resumes = lease.resumes, "CLOSING past its lease: resumed");
            metrics::CLOSING_PAST_LEASE.count(1);
        }
        if crate::faults::active().closer_dies_after_claim(&order) {
            warn!("fault injection: closer dies after claiming CLOSING");
            return Ok(Some(CloseOutcome::LeftToLeaseHolder));
        }
        let claimed = Order { status: OrderStatus::Closing, version: order.version + 1, closing: Some(lease), ..order };
        self.decide_with_facts(claimed, deadline).await
    }

    async fn later(&self, order_id: &OrderId, after: Duration, why: &'static str) -> Result<CloseOutcome, Unavailable> {
        self.reminders.remind_later(order_id, after).await?;
        info!(after_ms = after.as_millis() as u64, why, "reminder put back");
        Ok(CloseOutcome::RemindedLater { after, why })
    }

    /// Holding CLOSING: establish the money facts and converge. `None`
    /// means the order moved under us and the caller should re-read.
    async fn decide_with_facts(&self, order: Order, deadline: RunBudget) -> Result<Option<CloseOutcome>, Unavailable> {
        let record = self
            .store
            .order_record(&order.order_id)
            .await?
            .ok_or_else(|| Unavailable::new("close", "order vanished while closing"))?;
        let facts = self.facts(&record.order, &record.payments, deadline).await?;
        if !facts.successes.is_empty() {
            return self.settle_successes(order, facts.successes).await.map(Some);
        }
        if let Some(why) = facts.unknown {
            warn!(why = %why, "payment state unknown: order held in CLOSING, nothing released");
            metrics::PAYMENT_STATE_UNKNOWN.count(1);
            return self.hold(&order, "payment state unknown").await.map(Some);
        }
        let now = self.clock.now();
        let cause = match order.close_reason() {
            CloseReason::Expired => "expired; every payment attempt confirmed unpaid",
            CloseReason::BuyerCancelled => "cancelled by the buyer; every payment attempt confirmed unpaid",
        };
        match self.store.close_after_check(&order, now, cause).await? {
            Cas::Applied => {
                let lag = order.due_at().until(now);
                let reason = order.close_reason().as_str();
                info!(due_to_close_ms = lag.as_millis() as u64, reason, "closed after confirming no payment succeeded");
                closed(&order, now);
                Ok(Some(CloseOutcome::Closed))
            }
            // Our lease was taken over or a payment landed: the next read
            // shows which.
            Cas::Rejected => Ok(None),
        }
    }

    /// Records every success found. The first one makes the order PAID
    /// (unless a notification or another closer got there first); every
    /// other one — a second payment, or a success on an order that is
    /// already final — is recorded with its refund. A confirmed success is
    /// never dropped because the order moved under us.
    async fn settle_successes(&self, mut order: Order, successes: Vec<Success>) -> Result<CloseOutcome, Unavailable> {
        let mut paid_here = false;
        for s in successes {
            let mut settled = None;
            for _ in 0..5 {
                let r = self
                    .store
                    .settle_success(&order, &s.payment, &s.channel_txn_id, s.evidence.clone(), None, REFUND_NOTICE)
                    .await?;
                if r != SettleResult::OrderMoved {
                    settled = Some(r);
                    break;
                }
                order = self
                    .store
                    .order(&order.order_id)
                    .await?
                    .ok_or_else(|| Unavailable::new("close", "order vanished while settling"))?;
            }
            match settled {
                Some(SettleResult::Paid) => {
                    paid_here = true;
                    info!(payment_id = %s.payment.payment_id, "closing found the order paid: PAID");
                    metrics::PAID_WHILE_CLOSING.count(1);
                    metrics::ORDER_PAID.count(1);
                }
                Some(SettleResult::RefundPending) => {
                    warn!(payment_id = %s.payment.payment_id, "a success for an order already final: refund pending");
                    metrics::LATE_PAYMENT_REFUND.count(1);
                }
                Some(SettleResult::Duplicate) => {}
                Some(SettleResult::TxnIdTaken) => {
                    warn!(payment_id = %s.payment.payment_id, "channel transaction id bound to another payment; holding");
                    metrics::PAYMENT_MISMATCH.count(1);
                    return self.hold(&order, "payment evidence conflicts").await;
                }
                Some(SettleResult::OrderMoved) | None => {
                    return Err(Unavailable::new("close", "order kept changing while settling a success"));
                }
            }
            // Later successes are decided against the order as it now is.
            if let Some(o) = self.store.order(&order.order_id).await? {
                order = o;
            }
        }
        Ok(if paid_here { CloseOutcome::Paid } else { CloseOutcome::AlreadyFinal(order.status) })
    }

    /// Stays CLOSING without deciding: gives the lease up and comes back
    /// after the backoff. Nothing is released.
    async fn hold(&self, order: &Order, why: &'static str) -> Result<CloseOutcome, Unavailable> {
        let after = unknown_backoff(self.closing_for(order));
        let until = self.clock.now().plus(after);
        if self.store.hold_closing(order, until).await? == Cas::Rejected {
            // Someone else moved the order (a payment landed, or our lease
            // was taken over): they carry it on; no second chain.
            info!(why, "order moved while holding; reminder ends");
            return Ok(CloseOutcome::LeftToLeaseHolder);
        }
        self.later(&order.order_id, after, why).await
    }

    fn closing_for(&self, order: &Order) -> Duration {
        let started = order.closing.as_ref().map(|l| l.started_at).unwrap_or(order.expire_at);
        started.until(self.clock.now())
    }

    /// Local facts first; the channel for every attempt not yet settled.
    async fn facts(
        &self,
        order: &Order,
        payments: &[PaymentAttempt],
        deadline: RunBudget,
    ) -> Result<Facts, Unavailable> {
        let mut facts = Facts::default();
        for p in payments {
            let now = self.clock.now();
            let needs_channel = matches!(p.status, PaymentStatus::Processing | PaymentStatus::Unknown);
            if needs_channel && deadline.spent(now) {
                // Out of time for this run: what is not asked yet is
                // unknown, so the order is held (nothing released) and the
                // next run asks again.
                metrics::CLOSE_BUDGET_SPENT.count(1);
                facts.unknown.get_or_insert(format!("{}: the close run's time budget is spent", p.payment_id));
                continue;
            }
            let verdict = match p.status {
                PaymentStatus::Failed => continue,
                PaymentStatus::Succeeded => match &p.channel_txn_id {
                    Some(txn) => Verdict::Paid {
                        channel_txn_id: txn.clone(),
                        detail: "success already recorded on the attempt".into(),
                    },
                    None => Verdict::Unknown("a recorded success without a channel transaction id".into()),
                },
                PaymentStatus::Processing | PaymentStatus::Unknown => self.ask_channel(order, p, now, deadline).await,
            };
            let (status, detail) = match &verdict {
                Verdict::Paid { detail, .. } => (PaymentStatus::Succeeded, detail.clone()),
                Verdict::Unpaid(d) => (PaymentStatus::Failed, d.clone()),
                Verdict::Unknown(d) => (PaymentStatus::Unknown, d.clone()),
            };
            // Evidence of a change is recorded here; a success is recorded
            // by `settle_success`. An attempt that stays UNKNOWN gets no new
            // entry per retry, so a long channel outage cannot grow the
            // record without bound.
            if status != PaymentStatus::Succeeded && status != p.status {
                let evidence =
                    Evidence { at: now, source: "channel_query".into(), status, detail: Some(detail.clone()) };
                if !self.store.record_payment_fact(p, status, evidence, None).await?
                    && !self.concluded_meanwhile(p, status).await?
                {
                    // The attempt changed while the channel was asked (its
                    // channel id was recorded: the payment was handed out).
                    facts.unknown.get_or_insert(format!("{}: the attempt changed while asked", p.payment_id));
                    continue;
                }
            }
            match verdict {
                Verdict::Paid { channel_txn_id, detail } => facts.successes.push(Success {
                    payment: p.clone(),
                    channel_txn_id,
                    evidence: Evidence {
                        at: now,
                        source: if p.status == PaymentStatus::Succeeded { "local" } else { "channel_query" }.into(),
                        status: PaymentStatus::Succeeded,
                        detail: Some(detail),
                    },
                }),
                Verdict::Unpaid(_) => {}
                Verdict::Unknown(d) => {
                    facts.unknown.get_or_insert(format!("{}: {d}", p.payment_id));
                }
            }
        }
        Ok(facts)
    }

    /// Whether the fact this run concluded was recorded by someone else
    /// first (another closer): then the conclusion stands.
    async fn concluded_meanwhile(&self, p: &PaymentAttempt, status: PaymentStatus) -> Result<bool, Unavailable> {
        Ok(self.store.attempt(&p.payment_id).await?.is_some_and(|now| now.status == status))
    }

    async fn ask_channel(&self, order: &Order, p: &PaymentAttempt, now: Timestamp, budget: RunBudget) -> Verdict {
        if crate::faults::active().close_sees_no_payment(order.user_id.as_str()) {
            warn!(payment_id = %p.payment_id, "fault injection: the channel answers that it has no such payment");
            return verdict_of(Ok(ChannelPayment::NotFound), p, now, self.not_found_grace);
        }
        let channel = crate::faults::channel_for(&self.channel, order.user_id.as_str());
        match within(budget.until, channel_verdict(&channel, p, now, self.not_found_grace)).await {
            Some(verdict) => verdict,
            None => {
                metrics::CLOSE_BUDGET_SPENT.count(1);
                Verdict::Unknown("the channel did not answer within this run's share of the invocation".into())
            }
        }
    }
}

/// An order just closed at `now` (docs/design.md#observability). Only an
/// expiry feeds `ExpiryToCloseDelay`: a buyer's cancel closes at once, and
/// its figures would hide how late the wake-ups run.
fn closed(order: &Order, now: Timestamp) {
    metrics::ORDER_CLOSED.count(1);
    if order.close_reason() == CloseReason::Expired {
        metrics::EXPIRY_TO_CLOSE_DELAY.duration(order.expire_at.until(now));
    }
}

/// The first close run of a due order (not a resumed or held one): was
/// its wake-up late? A cancel has no wake-up to be late.
fn first_handled_late(order: &Order, now: Timestamp) {
    if order.close_reason() == CloseReason::Expired && order.expire_at.until(now) > LATE_WAKE_UP_AFTER {
        metrics::LATE_WAKE_UP.count(1);
    }
}

/// Runs `call` (a question to the channel) until `until`, the instant a
/// caller's share of its invocation ends (see
/// `handlers::batch::invocation_deadline`): `None` when the time ran out
/// first, which the caller treats as unknown — never as unpaid. Without
/// `until` the call runs to its own end (its adapter's timeouts).
pub async fn within<T>(until: Option<std::time::Instant>, call: impl std::future::Future<Output = T>) -> Option<T> {
    let Some(until) = until else { return Some(call.await) };
    tokio::time::timeout(until.saturating_duration_since(std::time::Instant::now()), call).await.ok()
}

/// Asks the channel about one attempt. A payment the channel still
/// calls processing is closed at the channel (query or close; see
/// docs/design.md#close-money-facts), so that an abandoned payment cannot
/// hold the order forever; if it was paid meanwhile, closing it reports the
/// success.
pub(crate) async fn channel_verdict<C: PaymentChannel>(
    channel: &C,
    p: &PaymentAttempt,
    now: Timestamp,
    not_found_grace: Duration,
) -> Verdict {
    let mut answer = channel.query(p).await;
    let never_charged = |a: &Result<ChannelPayment, Unavailable>| {
        matches!(a, Ok(ChannelPayment::NotFound)) && p.created_at.plus(not_found_grace) <= now
    };
    if matches!(answer, Ok(ChannelPayment::Pending)) || never_charged(&answer) {
        // "Not found" past the grace is about to be concluded "never
        // charged": close it at the channel first, so that a channel that
        // keeps a marker (the sandbox) refuses to open or pay it later — a
        // replay opening it right now finds it closed. If it was opened
        // meanwhile, the close answers what it is (closed, or paid).
        answer = channel.cancel(p).await;
    }
    let outcome = match &answer {
        Ok(ChannelPayment::Succeeded { .. }) => "succeeded",
        Ok(ChannelPayment::Failed) => "failed",
        Ok(ChannelPayment::NotFound) => "not_found",
        Ok(ChannelPayment::Pending) => "pending",
        Err(_) => "unavailable",
    };
    metrics::CHANNEL_QUERY.emit(1.0, &[outcome]);
    verdict_of(answer, p, now, not_found_grace)
}

/// What the channel's answer (after the cancel of a payment still
/// processing) means for one attempt. Pure, so that the protocol model
/// (`model/tests/protocol_model.rs`) decides with the very same rule.
pub fn verdict_of(
    answer: Result<ChannelPayment, Unavailable>,
    p: &PaymentAttempt,
    now: Timestamp,
    not_found_grace: Duration,
) -> Verdict {
    match answer {
        Ok(ChannelPayment::Succeeded { channel_txn_id, amount, currency }) => {
            if amount == p.amount && currency == p.currency.as_str() {
                Verdict::Paid { detail: format!("channel_txn_id {channel_txn_id}"), channel_txn_id }
            } else {
                // Money moved, but not the money asked for: neither paid
                // nor unpaid. Hold and alarm.
                metrics::PAYMENT_MISMATCH.count(1);
                Verdict::Unknown(format!(
                    "channel success with {amount} {currency}, expected {} {}",
                    p.amount, p.currency
                ))
            }
        }
        Ok(ChannelPayment::Failed) => Verdict::Unpaid("failed or closed at the channel".into()),
        // "Not found" means nothing was charged only once the channel
        // has had time to learn about the payment: an attempt is
        // recorded before it is opened at the channel, and providers
        // index new payments with some lag.
        Ok(ChannelPayment::NotFound) if p.created_at.plus(not_found_grace) <= now => {
            Verdict::Unpaid("the channel has no such payment: nothing charged".into())
        }
        Ok(ChannelPayment::NotFound) => Verdict::Unknown("the channel does not know the payment yet".into()),
        Ok(ChannelPayment::Pending) => {
            Verdict::Unknown("still processing and could not be closed at the channel".into())
        }
        Err(e) => Verdict::Unknown(format!("channel did not answer: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_backoff_grows_with_time_spent_and_is_bounded() {
        assert_eq!(unknown_backoff(Duration::ZERO), Duration::from_secs(5));
        assert_eq!(unknown_backoff(Duration::from_secs(40)), Duration::from_secs(40));
        assert_eq!(unknown_backoff(Duration::from_secs(4000)), Duration::from_secs(300));
    }
}
