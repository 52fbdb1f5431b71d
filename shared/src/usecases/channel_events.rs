//! Events from a provider that says only *that* a payment or a refund
//! changed (Stripe's webhooks), decided from the provider's answer when
//! asked, never from the event body: events arrive late, twice and out of
//! order, and the channel's current state is the one fact that does not.
//!
//! What is recorded goes through the same paths as every other payment
//! fact: [`handle_notification`] for a success or a cancellation (the race
//! matrix, the dedupe on the event id), [`follow_up_refund`] for a refund.

use crate::domain::*;
use crate::metrics;
use crate::ports::{ChannelPayment, Clock, PaymentChannel};
use crate::store::*;
use crate::usecases::payments::{handle_notification, NotificationResult, PaymentNotice};
use crate::usecases::refunds::{follow_up_refund, RefundOutcome};
use crate::usecases::UseCaseError;
use tracing::{info, instrument, warn};

/// A provider event, parsed at the edge into what this use case needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelEvent {
    /// Something happened to a payment: `channel_ref` is its id at the
    /// channel, `payment_id` ours as the payment's metadata carries it.
    Payment { event_id: String, channel_ref: String, payment_id: Option<String> },
    /// A refund changed; our ids as the refund's metadata carries them.
    Refund { event_id: String, payment_id: Option<String>, order_id: Option<String> },
    /// A type this system does not act on.
    Other { event_id: String, event_type: String },
}

/// Why an event was acknowledged without acting on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    UnknownType,
    /// No attempt of ours has the payment id the event names (or none is
    /// named): an intent we never opened. Reconciliation reports its money.
    UnknownPayment,
    /// The attempt exists but the channel's payment is not the one it
    /// opened (another intent carrying our id), or another channel's.
    ForeignPayment,
    /// A refund without our ids, or without a refund record of ours.
    UnknownRefund,
}

impl Ignored {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownType => "unknown_type",
            Self::UnknownPayment => "unknown_payment",
            Self::ForeignPayment => "foreign_payment",
            Self::UnknownRefund => "unknown_refund",
        }
    }
}

/// What an event changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventOutcome {
    /// A success or a cancellation, recorded (or found recorded).
    Recorded(NotificationResult),
    /// The payment is still open or processing at the channel: nothing to
    /// record (a processing payment holds its order; it never releases).
    StillOpen,
    Refund(RefundOutcome),
    Ignored(Ignored),
}

impl EventOutcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Recorded(r) => r.as_str(),
            Self::StillOpen => "still_open",
            Self::Refund(RefundOutcome::Refunded | RefundOutcome::AlreadyDone) => "refunded",
            Self::Refund(RefundOutcome::ChannelPending(_)) => "refund_pending_at_channel",
            Self::Refund(_) => "refund_not_done",
            Self::Ignored(i) => i.as_str(),
        }
    }
}

fn ignored(why: Ignored, event_id: &str) -> EventOutcome {
    info!(event_id, reason = why.as_str(), "provider event acknowledged, nothing to do");
    metrics::WEBHOOK_EVENT_IGNORED.emit(1.0, &[why.as_str()]);
    EventOutcome::Ignored(why)
}

/// Acts on one verified event of channel `channel_name`.
#[instrument(skip_all, fields(channel = %channel_name))]
pub async fn handle_channel_event<S, C>(
    store: &S,
    channel: &C,
    clock: &dyn Clock,
    merchant_id: &str,
    channel_name: &ChannelName,
    event: &ChannelEvent,
) -> Result<EventOutcome, UseCaseError>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
{
    match event {
        ChannelEvent::Other { event_id, event_type } => {
            info!(event_type, "provider event of a type this system does not handle");
            Ok(ignored(Ignored::UnknownType, event_id))
        }
        ChannelEvent::Refund { event_id, payment_id, order_id } => {
            let ids = payment_id
                .as_deref()
                .and_then(|p| PaymentId::parse(p).ok())
                .zip(order_id.as_deref().and_then(|o| OrderId::parse(o).ok()));
            let Some((payment_id, order_id)) = ids else { return Ok(ignored(Ignored::UnknownRefund, event_id)) };
            match follow_up_refund(store, channel, clock, &order_id, &payment_id).await? {
                RefundOutcome::NotFound => Ok(ignored(Ignored::UnknownRefund, event_id)),
                outcome => Ok(EventOutcome::Refund(outcome)),
            }
        }
        ChannelEvent::Payment { event_id, channel_ref, payment_id } => {
            payment_event(
                store,
                channel,
                clock,
                merchant_id,
                channel_name,
                event_id,
                channel_ref,
                payment_id.as_deref(),
            )
            .await
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn payment_event<S, C>(
    store: &S,
    channel: &C,
    clock: &dyn Clock,
    merchant_id: &str,
    channel_name: &ChannelName,
    event_id: &str,
    channel_ref: &str,
    payment_id: Option<&str>,
) -> Result<EventOutcome, UseCaseError>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
{
    let Some(payment_id) = payment_id.and_then(|p| PaymentId::parse(p).ok()) else {
        return Ok(ignored(Ignored::UnknownPayment, event_id));
    };
    let Some(mut attempt) = store.attempt(&payment_id).await? else {
        return Ok(ignored(Ignored::UnknownPayment, event_id));
    };
    if attempt.channel != *channel_name {
        warn!(payment_id = %payment_id, "event names an attempt of another channel");
        return Ok(ignored(Ignored::ForeignPayment, event_id));
    }
    let unrecorded = match attempt.channel_ref.as_deref() {
        Some(known) if known != channel_ref => {
            warn!(payment_id = %payment_id, channel_ref, known, "event names a payment that is not the attempt's");
            return Ok(ignored(Ignored::ForeignPayment, event_id));
        }
        Some(_) => false,
        // Opened at the channel, its id never recorded (the answer to
        // payment entry was lost): the signed event tells which it is.
        None => {
            attempt.channel_ref = Some(channel_ref.to_owned());
            true
        }
    };
    // The channel's answer now, not the event's: `Err` (not asked, or the
    // payment is not this attempt's) fails the call so that the provider
    // sends the event again.
    let answer = channel.query(&attempt).await?;
    if unrecorded {
        // Only once the channel confirmed the payment is this attempt's.
        let _ = store.record_channel_ref(&attempt, channel_ref).await?;
    }
    let (status, txn, amount, currency) = match answer {
        ChannelPayment::Succeeded { channel_txn_id, amount, currency } => {
            (PaymentStatus::Succeeded, channel_txn_id, amount, currency)
        }
        ChannelPayment::Failed => {
            (PaymentStatus::Failed, channel_ref.to_owned(), attempt.amount, attempt.currency.to_string())
        }
        ChannelPayment::Pending => return Ok(EventOutcome::StillOpen),
        ChannelPayment::NotFound => return Ok(ignored(Ignored::UnknownPayment, event_id)),
    };
    let notice = PaymentNotice {
        channel: channel_name.clone(),
        notify_id: event_id.to_owned(),
        payment_id,
        order_id: attempt.order_id.to_string(),
        channel_txn_id: txn,
        amount,
        currency,
        // The provider account is the merchant: there is no other to compare.
        merchant_id: merchant_id.to_owned(),
        status,
    };
    Ok(EventOutcome::Recorded(handle_notification(store, clock, merchant_id, &notice).await?))
}
