//! Payment entry and payment notifications (seed 000 §6, seed 003).
//!
//! The race matrix of seed 000 §6.1, as implemented by
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
use crate::error::{json_object, ApiError};
use crate::metrics;
use crate::ports::{Clock, IdGen, PaymentChannel, Unavailable};
use crate::store::*;
use crate::usecases::close_order::{channel_verdict, Verdict};
use serde::Deserialize;
use serde_json::{json, Value};
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
}

/// A payment attempt as the buyer sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PaymentStarted {
    pub view: Value,
    /// True when the idempotency key was seen before with the same body.
    pub replayed: bool,
}

fn attempt_view(a: &PaymentAttempt) -> Value {
    json!({
        "payment_id": a.payment_id, "order_id": a.order_id, "channel": a.channel,
        "amount": a.amount, "currency": a.currency, "status": a.status,
    })
}

fn order_busy(why: impl std::fmt::Display) -> ApiError {
    ApiError::conflict("order_busy", format!("{why}; retry in a moment with the same Idempotency-Key"))
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

impl<S, C> StartPayment<'_, S, C>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
{
    #[instrument(skip_all, fields(order_id = %order_id))]
    pub async fn execute(
        &self,
        buyer: &UserId,
        order_id: &str,
        idempotency_key: Option<&str>,
        body: &[u8],
    ) -> Result<PaymentStarted, ApiError> {
        let key = match idempotency_key {
            None => return Err(ApiError::invalid("the Idempotency-Key header is required")),
            Some(k) => IdempotencyKey::parse(k).map_err(|e| ApiError::invalid(e.0))?,
        };
        let obj = json_object(body)?;
        let channel_name = obj
            .get("channel")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid("channel is required and must be a string"))?;
        let channel = match (channel_name, self.channel) {
            ("sandbox", Some(c)) => c,
            (_, Some(_)) => {
                return Err(ApiError::invalid(format!("channel {channel_name:?} is not enabled; use \"sandbox\"")));
            }
            (_, None) => {
                return Err(ApiError::invalid(format!(
                    "channel {channel_name:?} is not enabled; this deployment has no payment channel"
                )));
            }
        };
        // The canonical body: the only field that shapes the attempt.
        let claim = PaymentClaim {
            key,
            request_hash: hex::encode(Sha256::digest(json!({"channel": channel_name}).to_string())),
        };
        let order_id = OrderId::parse(order_id).map_err(|_| ApiError::not_found(format!("order {order_id}")))?;
        let not_found = || ApiError::not_found(format!("order {order_id}"));
        let mut record = self.store.order_record(&order_id).await?.ok_or_else(not_found)?;
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
            if order.status != OrderStatus::PendingPayment {
                return Err(ApiError::conflict(
                    "order_not_payable",
                    format!("the order is {} and can no longer be paid", order.status.as_str()),
                ));
            }
            if now >= order.expire_at {
                return Err(ApiError::conflict(
                    "order_expired",
                    format!("the payment window ended at {}", order.expire_at),
                ));
            }
            if order.payment_attempts >= MAX_PAYMENT_ATTEMPTS {
                return Err(ApiError::conflict(
                    "too_many_attempts",
                    format!("the order already had {MAX_PAYMENT_ATTEMPTS} payment attempts; no more can be started"),
                ));
            }
            match self.supersede(channel, &record).await? {
                Supersede::Done => {}
                Supersede::FoundPaid | Supersede::Moved => {
                    record = self.store.order_record(&order_id).await?.ok_or_else(not_found)?;
                    continue;
                }
                Supersede::Blocked(why) => return Err(order_busy(why)),
            }
            let attempt = PaymentAttempt {
                payment_id: PaymentId::parse(self.ids.new_id("pay", now)).expect("generated ids are valid"),
                order_id: order_id.clone(),
                channel: ChannelName::parse("sandbox").expect("valid"),
                amount: order.amount_total,
                currency: order.currency.clone(),
                status: PaymentStatus::Processing,
                channel_txn_id: None,
                created_at: now,
                evidence: vec![],
            };
            match self.store.record_keyed_attempt(order, &attempt, Some(&claim)).await? {
                AttemptResult::Recorded => {
                    // Recorded first, opened second: if opening fails the
                    // channel has never seen the payment, which the close path
                    // reads as "nothing charged" once the not-found grace has
                    // passed (a payment being opened right now is unknown).
                    channel.open(&attempt, self.merchant_id).await?;
                    info!(payment_id = %attempt.payment_id, "payment attempt recorded");
                    return Ok(PaymentStarted { view: attempt_view(&attempt), replayed: false });
                }
                AttemptResult::Replay(claimed) => return self.replay(channel, order, &claim, claimed).await,
                AttemptResult::NotFound => return Err(not_found()),
                // The order changed (another attempt, a close): decide again
                // on the order as it is now, with its attempts.
                AttemptResult::NotPayable(_) => {
                    record = self.store.order_record(&order_id).await?.ok_or_else(not_found)?;
                }
            }
        }
        // Contention, not a failure: other requests kept changing the order.
        Err(order_busy("the order is being changed by other requests"))
    }

    /// The same key again: the same attempt, nothing new opened.
    async fn replay(
        &self,
        channel: &C,
        order: &Order,
        claim: &PaymentClaim,
        claimed: ClaimedPayment,
    ) -> Result<PaymentStarted, ApiError> {
        if claimed.request_hash != claim.request_hash {
            return Err(ApiError::conflict(
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
        // that can still be paid is opened.
        if attempt.status == PaymentStatus::Processing
            && order.status == OrderStatus::PendingPayment
            && self.clock.now() < order.expire_at
        {
            channel.open(&attempt, self.merchant_id).await?;
        }
        info!(payment_id = %attempt.payment_id, "idempotent payment replay");
        Ok(PaymentStarted { view: attempt_view(&attempt), replayed: true })
    }

    /// Closes, at the channel, every earlier attempt not yet settled, so an
    /// order has at most one payable attempt. A success found on the way is
    /// recorded through the normal success path (the order becomes PAID),
    /// never dropped.
    async fn supersede(&self, channel: &C, record: &OrderRecord) -> Result<Supersede, ApiError> {
        for p in record.payments.iter().filter(|p| !p.status.is_final()) {
            let now = self.clock.now();
            match channel_verdict(channel, p, now, self.not_found_grace).await {
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
                    self.store.record_payment_fact(p, PaymentStatus::Failed, evidence, None).await?;
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

/// The body a payment provider posts to the webhook.
#[derive(Debug, Clone, Deserialize)]
pub struct PaymentNotification {
    pub notify_id: String,
    pub payment_id: String,
    pub order_id: String,
    pub channel_txn_id: String,
    pub amount: i64,
    pub currency: String,
    pub merchant_id: String,
    pub status: String,
}

/// POST /payments/{channel}/notify, after the signature was verified.
#[instrument(skip_all, fields(channel = channel))]
pub async fn handle_notification<S: OrderStore + PaymentStore>(
    store: &S,
    clock: &dyn Clock,
    merchant_id: &str,
    channel: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    let n: PaymentNotification =
        serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("notification body: {e}")))?;
    let channel = ChannelName::parse(channel).map_err(|e| ApiError::invalid(e.0))?;
    if n.notify_id.is_empty() || n.notify_id.len() > 128 || n.channel_txn_id.is_empty() || n.channel_txn_id.len() > 128
    {
        return Err(ApiError::invalid("notify_id and channel_txn_id must be 1 to 128 characters"));
    }
    let status = match n.status.as_str() {
        "SUCCEEDED" => PaymentStatus::Succeeded,
        "FAILED" => PaymentStatus::Failed,
        other => return Err(ApiError::invalid(format!("status {other:?} must be SUCCEEDED or FAILED"))),
    };
    let payment_id =
        PaymentId::parse(n.payment_id.clone()).map_err(|_| ApiError::not_found(format!("payment {}", n.payment_id)))?;
    let payment =
        store.attempt(&payment_id).await?.ok_or_else(|| ApiError::not_found(format!("payment {payment_id}")))?;
    let mismatch = if payment.order_id.as_str() != n.order_id {
        Some("order_id")
    } else if payment.channel != channel {
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
        return Err(ApiError::unprocessable(
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
        return Ok(json!({"result": if recorded { "recorded" } else { "duplicate" }}));
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
                return Ok(json!({"result": "paid"}));
            }
            SettleResult::Duplicate => return Ok(json!({"result": "duplicate"})),
            SettleResult::RefundPending => {
                warn!(order_id = %order.order_id, payment_id = %payment_id, status = order.status.as_str(), trigger = "webhook", outcome = "refund_pending", "payment for a final order: refund pending");
                metrics::LATE_PAYMENT_REFUND.count(1);
                return Ok(json!({"result": "refund_pending"}));
            }
            SettleResult::TxnIdTaken => {
                metrics::PAYMENT_MISMATCH.count(1);
                return Err(ApiError::unprocessable(
                    "mismatch",
                    "channel_txn_id is already bound to another payment; nothing was recorded",
                ));
            }
            SettleResult::OrderMoved => continue,
        }
    }
    Err(Unavailable::new("notification", "order kept changing").into())
}
