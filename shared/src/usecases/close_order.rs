//! The close use case (seed 000 §5, §9): every wake-up — the scheduled one,
//! a swept one, a retried one — ends here, and the decision is taken from
//! the order's record and server time, never from the message.
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

use crate::domain::order::{decide_close, on_payment_success, CloseDecision, PaymentSuccessOutcome};
use crate::domain::*;
use crate::metrics;
use crate::ports::{ChannelPayment, Clock, CloseReminders, PaymentChannel, Unavailable};
use crate::store::{Cas, Evidence, OrderStore, PaymentAttempt, PaymentStore, SettleResult};
use std::time::Duration;
use tracing::{info, instrument, warn};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseOutcome {
    Closed,
    Paid,
    AlreadyFinal(OrderStatus),
    NotFound,
    /// Put back: early wake-up, a live lease held by another closer, or an
    /// unknown payment state.
    RemindedLater { after: Duration, why: &'static str },
}

pub struct CloseOrder<S, C, Q> {
    pub store: S,
    pub channel: C,
    pub reminders: Q,
    pub clock: Box<dyn Clock>,
    /// How long a closer may hold CLOSING before another may resume it.
    pub lease: Duration,
}

/// Backoff for an order held in CLOSING because its payment state is
/// unknown: doubles with the time already spent, from 5 s up to 5 minutes.
pub fn unknown_backoff(closing_for: Duration) -> Duration {
    closing_for.clamp(Duration::from_secs(5), Duration::from_secs(300))
}

/// What the money facts of a CLOSING order add up to.
enum Facts {
    Paid { payment: Box<PaymentAttempt>, channel_txn_id: String, evidence: Evidence },
    Unpaid,
    Unknown(String),
}

impl<S, C, Q> CloseOrder<S, C, Q>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
    Q: CloseReminders,
{
    /// `owner` identifies this closer in the lease (the Lambda request id).
    #[instrument(skip_all, fields(order_id = %order_id))]
    pub async fn close(&self, order_id: &OrderId, owner: &str) -> Result<CloseOutcome, Unavailable> {
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
                    return Ok(CloseOutcome::AlreadyFinal(s));
                }
                CloseDecision::NotYetDue(after) => {
                    metrics::count("EarlyWakeUp", 1);
                    return self.later(order_id, after, "not yet due").await;
                }
                CloseDecision::LeaseHeld(after) => return self.later(order_id, after, "another closer holds the lease").await,
                CloseDecision::CloseNow => match self.store.close_unpaid(&order, now).await? {
                    Cas::Applied => {
                        let lag = order.expire_at.until(now);
                        info!(expire_to_close_ms = lag.as_millis() as u64, "closed: expired with no payment attempt");
                        metrics::count("OrderClosed", 1);
                        return Ok(CloseOutcome::Closed);
                    }
                    Cas::Rejected => continue,
                },
                CloseDecision::BeginClosing | CloseDecision::ResumeClosing => {
                    let lease = ClosingLease {
                        started_at: order.closing.as_ref().map(|l| l.started_at).unwrap_or(now),
                        owner: owner.to_owned(),
                        lease_until: now.plus(self.lease),
                    };
                    if self.store.begin_closing(&order, &lease, now).await? == Cas::Rejected {
                        continue;
                    }
                    let claimed = Order {
                        status: OrderStatus::Closing,
                        version: order.version + 1,
                        closing: Some(lease),
                        ..order
                    };
                    match self.decide_with_facts(claimed).await? {
                        Some(outcome) => return Ok(outcome),
                        None => continue,
                    }
                }
            }
        }
        // Still contended after several rounds: try again shortly rather
        // than spin.
        self.later(order_id, Duration::from_secs(5), "contended").await
    }

    async fn later(&self, order_id: &OrderId, after: Duration, why: &'static str) -> Result<CloseOutcome, Unavailable> {
        self.reminders.remind_later(order_id, after).await?;
        info!(after_ms = after.as_millis() as u64, why, "reminder put back");
        Ok(CloseOutcome::RemindedLater { after, why })
    }

    /// Holding CLOSING: establish the money facts and converge. `None`
    /// means the order moved under us and the caller should re-read.
    async fn decide_with_facts(&self, order: Order) -> Result<Option<CloseOutcome>, Unavailable> {
        let record = self
            .store
            .order_record(&order.order_id)
            .await?
            .ok_or_else(|| Unavailable::new("close", "order vanished while closing"))?;
        match self.facts(&record.payments).await? {
            Facts::Paid { payment, channel_txn_id, evidence } => {
                // We hold CLOSING, so the success makes the order PAID; no
                // refund notice can be needed on this path.
                debug_assert_eq!(on_payment_success(order.status, false), PaymentSuccessOutcome::MarkPaid);
                match self.store.settle_success(&order, &payment, &channel_txn_id, evidence, None, "").await? {
                    SettleResult::Paid | SettleResult::Duplicate => {
                        info!(payment_id = %payment.payment_id, "closing found the order paid: PAID");
                        metrics::count("PaidWhileClosing", 1);
                        Ok(Some(CloseOutcome::Paid))
                    }
                    SettleResult::OrderMoved | SettleResult::RefundPending => Ok(None),
                    SettleResult::TxnIdTaken => {
                        warn!(payment_id = %payment.payment_id, "channel transaction id bound to another payment; holding");
                        metrics::count("PaymentMismatch", 1);
                        let after = unknown_backoff(self.closing_for(&order));
                        self.later(&order.order_id, after, "payment evidence conflicts").await.map(Some)
                    }
                }
            }
            Facts::Unpaid => {
                let now = self.clock.now();
                match self.store.close_after_check(&order, now, "expired; every payment attempt confirmed unpaid").await? {
                    Cas::Applied => {
                        info!("closed after confirming no payment succeeded");
                        metrics::count("OrderClosed", 1);
                        Ok(Some(CloseOutcome::Closed))
                    }
                    // Our lease was taken over or a payment landed: the
                    // next read shows which.
                    Cas::Rejected => Ok(None),
                }
            }
            Facts::Unknown(why) => {
                warn!(why = %why, "payment state unknown: order held in CLOSING, nothing released");
                metrics::count("PaymentStateUnknown", 1);
                let after = unknown_backoff(self.closing_for(&order));
                self.later(&order.order_id, after, "payment state unknown").await.map(Some)
            }
        }
    }

    fn closing_for(&self, order: &Order) -> Duration {
        let started = order.closing.as_ref().map(|l| l.started_at).unwrap_or(order.expire_at);
        started.until(self.clock.now())
    }

    /// Local facts first; the channel only for attempts that are not settled.
    async fn facts(&self, payments: &[PaymentAttempt]) -> Result<Facts, Unavailable> {
        if let Some(p) = payments.iter().find(|p| p.status == PaymentStatus::Succeeded) {
            let evidence = Evidence {
                at: self.clock.now(),
                source: "local".into(),
                status: PaymentStatus::Succeeded,
                detail: Some("success already recorded on the attempt".into()),
            };
            let txn = p.channel_txn_id.clone().unwrap_or_default();
            return Ok(Facts::Paid { payment: Box::new(p.clone()), channel_txn_id: txn, evidence });
        }
        let mut unknown = None;
        for p in payments.iter().filter(|p| !p.status.is_final()) {
            let now = self.clock.now();
            let answer = self.channel.query(&p.payment_id).await;
            let (status, detail) = match &answer {
                Ok(ChannelPayment::Succeeded { channel_txn_id, amount, currency }) => {
                    if *amount == p.amount && currency == p.currency.as_str() {
                        let evidence = Evidence {
                            at: now,
                            source: "channel_query".into(),
                            status: PaymentStatus::Succeeded,
                            detail: Some(format!("channel_txn_id {channel_txn_id}")),
                        };
                        return Ok(Facts::Paid { payment: Box::new(p.clone()), channel_txn_id: channel_txn_id.clone(), evidence });
                    }
                    // Money moved, but not the money we asked for: neither
                    // paid nor unpaid. Hold and alarm.
                    metrics::count("PaymentMismatch", 1);
                    (PaymentStatus::Unknown, format!("channel success with {amount} {currency}, expected {} {}", p.amount, p.currency))
                }
                Ok(ChannelPayment::Failed) => (PaymentStatus::Failed, "channel reports failed".to_owned()),
                Ok(ChannelPayment::NotFound) => (PaymentStatus::Failed, "channel has no such payment: nothing charged".to_owned()),
                Ok(ChannelPayment::Pending) => (PaymentStatus::Unknown, "channel reports still processing".to_owned()),
                Err(e) => (PaymentStatus::Unknown, format!("channel query failed: {e}")),
            };
            let evidence = Evidence { at: now, source: "channel_query".into(), status, detail: Some(detail.clone()) };
            self.store.record_payment_fact(p, status, evidence, None).await?;
            if status != PaymentStatus::Failed {
                unknown.get_or_insert(format!("{}: {detail}", p.payment_id));
            }
        }
        Ok(match unknown {
            Some(why) => Facts::Unknown(why),
            None => Facts::Unpaid,
        })
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
