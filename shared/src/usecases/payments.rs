//! Payment entry and payment notifications (docs/design.md#race-matrix).
//!
//! The race matrix (docs/design.md#race-matrix), as implemented by
//! [`handle_notification`] and the store's `settle_success`:
//!
//! | order when the success lands | outcome |
//! |---|---|
//! | PENDING_PAYMENT | CAS → PAID |
//! | CLOSING | CAS → PAID; the closer's next conditional write fails and it stops |
//! | CLOSED | payment recorded SUCCEEDED, order stays CLOSED, one refund (REFUND_PENDING) |
//! | PAID (same payment) | duplicate, nothing changes |
//! | any, bad signature / amount / currency / merchant | rejected, counted, nothing changes |

use crate::domain::payment::MAX_PAYMENT_ATTEMPTS;
use crate::domain::*;
use crate::metrics;
use crate::ports::{Clock, IdGen, PaymentChannel, Unavailable};
use crate::store::*;
use crate::usecases::close_order::{channel_verdict, within, Verdict};
use crate::usecases::UseCaseError;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::time::Duration;
use tracing::{info, instrument, warn};

pub const REFUND_NOTICE: &str =
    "Your order was closed because its payment window ended; the amount you paid is being refunded to the original payment method.";

/// POST /orders/{order_id}/payments, with what it needs from the outside.
pub struct StartPayment<'a, S, C> {
    pub store: &'a S,
    /// `None` when this deployment has no payment channel.
    pub channel: Option<&'a C>,
    pub clock: &'a dyn Clock,
    pub ids: &'a dyn IdGen,
    pub merchant_id: &'a str,
    /// How long the channel may not know an attempt that was just recorded
    /// (the close path's `ChannelNotFoundGraceSeconds`): within it, "not
    /// found" is unknown, not unpaid.
    pub not_found_grace: Duration,
    /// When the channel's answers stop being waited for: the API
    /// invocation's deadline less its margin (`None`: the adapters' own
    /// timeouts only). A question cut off there is unknown — an earlier
    /// attempt is not set aside, an attempt not opened stays as recorded —
    /// and the buyer is told to retry (503 `channel_slow`).
    pub until: Option<std::time::Instant>,
}

/// How soon a buyer whose payment entry ran out of time is asked to retry.
pub const CHANNEL_SLOW_RETRY_AFTER: Duration = Duration::from_secs(5);

fn channel_slow(what: impl std::fmt::Display) -> UseCaseError {
    metrics::CLOSE_BUDGET_SPENT.count(1);
    warn!(what = %what, "payment entry out of time: the channel did not answer before the invocation's deadline");
    UseCaseError::try_later(
        "channel_slow",
        format!("the payment channel did not answer in time ({what}); retry with the same Idempotency-Key"),
        CHANNEL_SLOW_RETRY_AFTER,
    )
}

/// The payment attempt the buyer pays through.
#[derive(Debug, Clone, PartialEq)]
pub struct PaymentStarted {
    pub attempt: PaymentAttempt,
    /// True when the idempotency key was seen before with the same body.
    pub replayed: bool,
    /// What the buyer's client confirms the payment with at the channel
    /// (Stripe's `client_secret`); `None` for the sandbox, and for a
    /// replayed attempt that can no longer be paid.
    pub client_secret: Option<String>,
}

fn order_busy(why: impl std::fmt::Display) -> UseCaseError {
    UseCaseError::conflict("order_busy", format!("{why}; retry in a moment with the same Idempotency-Key"))
}

/// Why a previous attempt could not be set aside for a new one.
enum Supersede {
    /// Every earlier attempt is settled (failed, or closed at the channel).
    Done,
    /// An earlier attempt turned out paid and was recorded as such: the
    /// order took its normal success path.
    FoundPaid,
    /// The order changed under us; read it again.
    Moved,
    /// An earlier attempt's state at the channel is not known.
    Blocked(String),
}

/// Whether `order` may get a new payment attempt at `now`: still
/// PENDING_PAYMENT, not cancelled by its buyer, within its payment window,
/// and with attempts left.
fn payable(order: &Order, now: Timestamp) -> Result<(), UseCaseError> {
    if order.status != OrderStatus::PendingPayment {
        return Err(UseCaseError::conflict(
            "order_not_payable",
            format!("the order is {} and can no longer be paid", order.status.as_str()),
        ));
    }
    if order.cancel_requested_at.is_some() {
        return Err(UseCaseError::conflict(
            "order_cancelled",
            "the buyer cancelled this order; it is being closed and can no longer be paid",
        ));
    }
    if now >= order.expire_at {
        return Err(UseCaseError::conflict(
            "order_expired",
            format!("the payment window ended at {}", order.expire_at),
        ));
    }
    if order.payment_attempts >= MAX_PAYMENT_ATTEMPTS {
        return Err(UseCaseError::conflict(
            "too_many_attempts",
            format!("the order already had {MAX_PAYMENT_ATTEMPTS} payment attempts; no more can be started"),
        ));
    }
    Ok(())
}

/// What the idempotency hash of a payment request is taken over: its JSON
/// form, `{"channel":"…"}`, so a retry hashes the same however it was
/// formatted.
#[derive(Serialize)]
struct CanonicalPaymentRequest<'a> {
    channel: &'a str,
}

impl<'a, S, C> StartPayment<'a, S, C>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
{
    /// The channel a payment request names, if this deployment has it.
    /// Checked before anything else about the order is read.
    pub fn channel(&self, name: &str) -> Result<&'a C, UseCaseError> {
        match self.channel {
            Some(c) if c.names().contains(&name) => Ok(c),
            Some(c) if !c.names().is_empty() => {
                let names: Vec<String> = c.names().iter().map(|n| format!("{n:?}")).collect();
                Err(UseCaseError::invalid(format!("channel {name:?} is not enabled; use {}", names.join(" or "))))
            }
            _ => Err(UseCaseError::invalid(format!(
                "channel {name:?} is not enabled; this deployment has no payment channel"
            ))),
        }
    }

    /// Starts a payment of `order_id` for `buyer` through the channel
    /// named `channel_name`, under the buyer's idempotency `key`.
    #[instrument(skip_all, fields(order_id = %order_id))]
    pub async fn execute(
        &self,
        buyer: &UserId,
        order_id: &OrderId,
        key: IdempotencyKey,
        channel_name: &str,
    ) -> Result<PaymentStarted, UseCaseError> {
        let channel = self.channel(channel_name)?;
        // The canonical body: the only field that shapes the attempt.
        let canonical = serde_json::to_vec(&CanonicalPaymentRequest { channel: channel_name }).expect("serialisable");
        let claim = PaymentClaim { key, request_hash: hex::encode(Sha256::digest(canonical)) };
        let not_found = || UseCaseError::not_found(format!("order {order_id}"));
        let mut record = self.store.order_record(order_id).await?.ok_or_else(not_found)?;
        // Another buyer's order is answered as missing, before anything is
        // written or the channel is asked.
        if record.order.user_id != *buyer {
            return Err(not_found());
        }
        // A key seen before is answered before any status check: the client
        // is asking for the attempt it already has, not for a new one.
        if let Some(claimed) = self.store.claimed_payment(&record.order, &claim.key).await? {
            return self.replay(channel, &record.order, &claim, claimed).await;
        }
        for _ in 0..5 {
            let order = &record.order;
            let now = self.clock.now();
            payable(order, now)?;
            match self.supersede(channel, &record).await? {
                Supersede::Done => {}
                Supersede::FoundPaid | Supersede::Moved => {
                    record = self.store.order_record(order_id).await?.ok_or_else(not_found)?;
                    continue;
                }
                Supersede::Blocked(why) => return Err(order_busy(why)),
            }
            let attempt = self.new_attempt(order_id, order, channel_name, now)?;
            match self.store.record_keyed_attempt(order, &attempt, Some(&claim)).await? {
                AttemptResult::Recorded => {
                    // Recorded first, opened second: if opening fails the
                    // channel has never seen the payment, which the close path
                    // reads as "nothing charged" once the not-found grace has
                    // passed (a payment being opened right now is unknown).
                    let (attempt, client_secret) = self.open(channel, attempt).await?;
                    info!(payment_id = %attempt.payment_id, "payment attempt recorded");
                    return Ok(PaymentStarted { attempt, replayed: false, client_secret });
                }
                AttemptResult::Replay(claimed) => return self.replay(channel, order, &claim, claimed).await,
                AttemptResult::NotFound => return Err(not_found()),
                // The order changed (another attempt, a close): decide again
                // on the order as it is now, with its attempts.
                AttemptResult::NotPayable(_) => {
                    record = self.store.order_record(order_id).await?.ok_or_else(not_found)?;
                }
            }
        }
        // Contention, not a failure: other requests kept changing the order.
        Err(order_busy("the order is being changed by other requests"))
    }

    /// A new attempt to pay `order` through `channel_name`, as it is
    /// recorded before the channel is asked to open it.
    fn new_attempt(
        &self,
        order_id: &OrderId,
        order: &Order,
        channel_name: &str,
        now: Timestamp,
    ) -> Result<PaymentAttempt, UseCaseError> {
        Ok(PaymentAttempt {
            payment_id: PaymentId::parse(self.ids.new_id("pay", now)).expect("generated ids are valid"),
            order_id: order_id.clone(),
            channel: ChannelName::parse(channel_name).map_err(|e| UseCaseError::invalid(e.to_string()))?,
            amount: order.amount_total,
            currency: order.currency.clone(),
            status: PaymentStatus::Processing,
            channel_txn_id: None,
            channel_ref: None,
            created_at: now,
            evidence: vec![],
        })
    }

    /// The same key again: the same attempt, nothing new opened.
    async fn replay(
        &self,
        channel: &C,
        order: &Order,
        claim: &PaymentClaim,
        claimed: ClaimedPayment,
    ) -> Result<PaymentStarted, UseCaseError> {
        if claimed.request_hash != claim.request_hash {
            return Err(UseCaseError::conflict(
                "idempotency_key_reused",
                "this Idempotency-Key was already used on this order with a different request body; use a new key",
            ));
        }
        let attempt = self
            .store
            .attempt(&claimed.payment_id)
            .await?
            .ok_or_else(|| Unavailable::new("idempotent payment replay", "attempt of the key is missing"))?;
        // The first call may have failed between recording the attempt and
        // opening it at the channel (it answered 500, and the client retries
        // as told). Opening is idempotent at the channel; only an attempt
        // that can still be paid is opened (not on an order its buyer asked
        // to cancel).
        let (attempt, client_secret) = if attempt.status == PaymentStatus::Processing
            && order.status == OrderStatus::PendingPayment
            && order.cancel_requested_at.is_none()
            && self.clock.now() < order.expire_at
        {
            self.open(channel, attempt).await?
        } else {
            (attempt, None)
        };
        info!(payment_id = %attempt.payment_id, "idempotent payment replay");
        Ok(PaymentStarted { attempt, replayed: true, client_secret })
    }

    /// Opens a recorded attempt at the channel (or finds it opened) and
    /// records the channel's id of it before anything is handed to the
    /// buyer: a payment the close path cannot find is one nobody can pay.
    async fn open(
        &self,
        channel: &C,
        mut attempt: PaymentAttempt,
    ) -> Result<(PaymentAttempt, Option<String>), UseCaseError> {
        let opened = within(self.until, channel.open(&attempt, self.merchant_id))
            .await
            .ok_or_else(|| channel_slow(format_args!("opening payment {}", attempt.payment_id)))??;
        if let Some(why) = opened.refused {
            // Nothing exists at the channel: the attempt is over, and the
            // buyer is told why (a new attempt would be refused the same way).
            let evidence = Evidence {
                at: self.clock.now(),
                source: "channel refused to open".into(),
                status: PaymentStatus::Failed,
                detail: Some(why.clone()),
            };
            self.store.record_payment_fact(&attempt, PaymentStatus::Failed, evidence, None).await?;
            warn!(payment_id = %attempt.payment_id, why = %why, "the channel refused to open the payment");
            return Err(UseCaseError::unprocessable(
                "payment_refused",
                format!("the payment channel refused this payment: {why}"),
            ));
        }
        if let Some(r) = opened.channel_ref {
            if attempt.channel_ref.as_deref() != Some(r.as_str()) {
                if self.store.record_channel_ref(&attempt, &r).await? == Cas::Rejected {
                    // Concluded meanwhile (closed as never paid, superseded):
                    // its payment must not be handed out any more.
                    return Err(UseCaseError::conflict(
                        "order_not_payable",
                        format!("payment {} was closed before it could be handed out", attempt.payment_id),
                    ));
                }
                attempt.channel_ref = Some(r);
            }
        } else if self.concluded_meanwhile(&attempt).await? {
            // A channel that keys payments by our id (the sandbox) has no id
            // to record, so nothing above refused: the attempt was concluded
            // FAILED while it was being opened (a close or a new attempt
            // found it "not found"). Close at the channel what was just
            // opened, so that no payment FAILED here stays payable there.
            let closed = within(self.until, channel.cancel(&attempt)).await;
            warn!(payment_id = %attempt.payment_id, closed = ?closed, "an attempt concluded FAILED while it was opened: closed at the channel");
            closed.ok_or_else(|| channel_slow(format_args!("closing payment {}", attempt.payment_id)))??;
            // Another request (a new attempt, a close) concluded it: the
            // retry with the same key answers with the attempt as it now is.
            return Err(order_busy(format_args!(
                "payment {} was closed by another request while it was being opened",
                attempt.payment_id
            )));
        }
        Ok((attempt, opened.client_secret))
    }

    /// Whether `attempt`, read again, was concluded FAILED since it was read.
    async fn concluded_meanwhile(&self, attempt: &PaymentAttempt) -> Result<bool, UseCaseError> {
        let now = self.store.attempt(&attempt.payment_id).await?;
        Ok(now.is_some_and(|a| a.status == PaymentStatus::Failed))
    }

    /// Closes, at the channel, every earlier attempt not yet settled, so an
    /// order has at most one payable attempt. A success found on the way is
    /// recorded through the normal success path (the order becomes PAID),
    /// never dropped.
    async fn supersede(&self, channel: &C, record: &OrderRecord) -> Result<Supersede, UseCaseError> {
        for p in record.payments.iter().filter(|p| !p.status.is_final()) {
            let now = self.clock.now();
            let channel = crate::faults::channel_for(channel, record.order.user_id.as_str());
            let verdict = within(self.until, channel_verdict(&channel, p, now, self.not_found_grace))
                .await
                .ok_or_else(|| channel_slow(format_args!("closing earlier payment {}", p.payment_id)))?;
            match verdict {
                Verdict::Paid { channel_txn_id, detail } => {
                    let evidence = Evidence {
                        at: now,
                        source: "channel_close (new attempt)".into(),
                        status: PaymentStatus::Succeeded,
                        detail: Some(detail),
                    };
                    let r = self
                        .store
                        .settle_success(&record.order, p, &channel_txn_id, evidence, None, REFUND_NOTICE)
                        .await?;
                    info!(payment_id = %p.payment_id, result = ?r, "an earlier attempt was paid");
                    if r == SettleResult::Paid {
                        metrics::ORDER_PAID.count(1);
                    }
                    return Ok(match r {
                        SettleResult::OrderMoved => Supersede::Moved,
                        SettleResult::TxnIdTaken => {
                            metrics::PAYMENT_MISMATCH.count(1);
                            Supersede::Blocked(format!("earlier payment {} could not be recorded", p.payment_id))
                        }
                        _ => Supersede::FoundPaid,
                    });
                }
                Verdict::Unpaid(detail) => {
                    let evidence = Evidence {
                        at: now,
                        source: "superseded by a new attempt".into(),
                        status: PaymentStatus::Failed,
                        detail: Some(detail),
                    };
                    if !self.store.record_payment_fact(p, PaymentStatus::Failed, evidence, None).await? {
                        // The attempt changed while asked (a replay recorded
                        // its channel id): decide again on it as it is now.
                        return Ok(Supersede::Moved);
                    }
                }
                Verdict::Unknown(why) => {
                    return Ok(Supersede::Blocked(format!(
                        "earlier payment {} is still open at the channel ({why})",
                        p.payment_id
                    )));
                }
            }
        }
        Ok(Supersede::Done)
    }
}

/// A payment provider's notification, checked field by field (the
/// signature was verified before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentNotice {
    pub channel: ChannelName,
    pub notify_id: String,
    pub payment_id: PaymentId,
    /// As the channel sent them: compared with the attempt's, never trusted.
    pub order_id: String,
    pub channel_txn_id: String,
    pub amount: i64,
    pub currency: String,
    pub merchant_id: String,
    /// SUCCEEDED or FAILED.
    pub status: PaymentStatus,
}

/// What a notification changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotificationResult {
    /// A failure was recorded on the attempt.
    Recorded,
    /// Seen before, or already settled: nothing changed.
    Duplicate,
    /// The order went to PAID.
    Paid,
    /// The order was final without this payment: one refund is pending.
    RefundPending,
}

impl NotificationResult {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Recorded => "recorded",
            Self::Duplicate => "duplicate",
            Self::Paid => "paid",
            Self::RefundPending => "refund_pending",
        }
    }
}

/// POST /payments/{channel}/notify, after the signature was verified.
#[instrument(skip_all, fields(channel = %n.channel))]
pub async fn handle_notification<S: OrderStore + PaymentStore>(
    store: &S,
    clock: &dyn Clock,
    merchant_id: &str,
    n: &PaymentNotice,
) -> Result<NotificationResult, UseCaseError> {
    let (channel, payment_id, status) = (&n.channel, &n.payment_id, n.status);
    let payment =
        store.attempt(payment_id).await?.ok_or_else(|| UseCaseError::not_found(format!("payment {payment_id}")))?;
    let mismatch = if payment.order_id.as_str() != n.order_id {
        Some("order_id")
    } else if payment.channel != *channel {
        Some("channel")
    } else if payment.amount != n.amount {
        Some("amount")
    } else if payment.currency.as_str() != n.currency {
        Some("currency")
    } else if merchant_id != n.merchant_id {
        Some("merchant_id")
    } else {
        None
    };
    if let Some(field) = mismatch {
        warn!(payment_id = %payment_id, field, "notification does not match the payment attempt; rejected");
        metrics::PAYMENT_MISMATCH.count(1);
        return Err(UseCaseError::unprocessable(
            "mismatch",
            format!("{field} does not match the payment attempt; nothing was recorded"),
        ));
    }
    let notification = Notification { channel: channel.clone(), notify_id: n.notify_id.clone() };
    let evidence = Evidence {
        at: clock.now(),
        source: format!("notification {}", n.notify_id),
        status,
        detail: Some(format!("channel_txn_id {}", n.channel_txn_id)),
    };
    if status == PaymentStatus::Failed {
        let recorded = store.record_payment_fact(&payment, status, evidence, Some(&notification)).await?;
        return Ok(if recorded { NotificationResult::Recorded } else { NotificationResult::Duplicate });
    }
    for _ in 0..5 {
        let order = store
            .order(&payment.order_id)
            .await?
            .ok_or_else(|| Unavailable::new("notification", "payment without order"))?;
        let result = store
            .settle_success(&order, &payment, &n.channel_txn_id, evidence.clone(), Some(&notification), REFUND_NOTICE)
            .await?;
        match result {
            SettleResult::Paid => {
                info!(order_id = %order.order_id, payment_id = %payment_id, from = order.status.as_str(), trigger = "webhook", outcome = "paid", "order PAID");
                metrics::ORDER_PAID.count(1);
                return Ok(NotificationResult::Paid);
            }
            SettleResult::Duplicate => return Ok(NotificationResult::Duplicate),
            SettleResult::RefundPending => {
                warn!(order_id = %order.order_id, payment_id = %payment_id, status = order.status.as_str(), trigger = "webhook", outcome = "refund_pending", "payment for a final order: refund pending");
                metrics::LATE_PAYMENT_REFUND.count(1);
                return Ok(NotificationResult::RefundPending);
            }
            SettleResult::TxnIdTaken => {
                metrics::PAYMENT_MISMATCH.count(1);
                return Err(UseCaseError::unprocessable(
                    "mismatch",
                    "channel_txn_id is already bound to another payment; nothing was recorded",
                ));
            }
            SettleResult::OrderMoved => continue,
        }
    }
    Err(Unavailable::new("notification", "order kept changing").into())
}
