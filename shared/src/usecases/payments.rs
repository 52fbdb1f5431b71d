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

use crate::domain::*;
use crate::error::{json_object, ApiError};
use crate::metrics;
use crate::ports::{Clock, IdGen, PaymentChannel, Unavailable};
use crate::store::*;
use serde::Deserialize;
use serde_json::{json, Value};
use tracing::{info, instrument, warn};

pub const REFUND_NOTICE: &str =
    "Your order was closed because its payment window ended; the amount you paid is being refunded to the original payment method.";

/// POST /orders/{order_id}/payments
#[instrument(skip_all, fields(order_id = %order_id))]
pub async fn start_payment<S, C>(
    store: &S,
    channel: Option<&C>,
    clock: &dyn Clock,
    ids: &dyn IdGen,
    merchant_id: &str,
    order_id: &str,
    body: &[u8],
) -> Result<Value, ApiError>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
{
    let obj = json_object(body)?;
    let channel_name = obj
        .get("channel")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("channel is required and must be a string"))?;
    let channel = match (channel_name, channel) {
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
    let order_id = OrderId::parse(order_id).map_err(|_| ApiError::not_found(format!("order {order_id}")))?;
    let mut order = store.order(&order_id).await?.ok_or_else(|| ApiError::not_found(format!("order {order_id}")))?;
    for _ in 0..5 {
        let now = clock.now();
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
        let attempt = PaymentAttempt {
            payment_id: PaymentId::parse(ids.new_id("pay", now)).expect("generated ids are valid"),
            order_id: order_id.clone(),
            channel: ChannelName::parse("sandbox").expect("valid"),
            amount: order.amount_total,
            currency: order.currency.clone(),
            status: PaymentStatus::Processing,
            channel_txn_id: None,
            created_at: now,
            evidence: vec![],
        };
        match store.record_attempt(&order, &attempt).await? {
            AttemptResult::Recorded => {
                // Recorded first, opened second: if opening fails the
                // channel has never seen the payment, which the close path
                // reads as "nothing charged" once the not-found grace has
                // passed (a payment being opened right now is unknown).
                channel.open(&attempt, merchant_id).await?;
                info!(payment_id = %attempt.payment_id, "payment attempt recorded");
                return Ok(json!({
                    "payment_id": attempt.payment_id, "order_id": order_id, "channel": attempt.channel,
                    "amount": attempt.amount, "currency": attempt.currency, "status": attempt.status,
                }));
            }
            AttemptResult::NotFound => return Err(ApiError::not_found(format!("order {order_id}"))),
            // The order changed (another attempt, a close): decide again on
            // the order as it is now.
            AttemptResult::NotPayable(now) => order = *now,
        }
    }
    Err(Unavailable::new("start payment", "order kept changing").into())
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
        metrics::count("PaymentMismatch", 1);
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
                info!(order_id = %order.order_id, payment_id = %payment_id, from = order.status.as_str(), "order PAID");
                return Ok(json!({"result": "paid"}));
            }
            SettleResult::Duplicate => return Ok(json!({"result": "duplicate"})),
            SettleResult::RefundPending => {
                warn!(order_id = %order.order_id, payment_id = %payment_id, status = order.status.as_str(), "payment for a final order: refund pending");
                metrics::count("LatePaymentRefund", 1);
                return Ok(json!({"result": "refund_pending"}));
            }
            SettleResult::TxnIdTaken => {
                metrics::count("PaymentMismatch", 1);
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
