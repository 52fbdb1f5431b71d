//! The few Stripe objects the channel reads, and what each state means to
//! the close protocol. Pure: no HTTP here, so every mapping is tested
//! against recorded Stripe answers (`shared/tests/fixtures/stripe/`).
//!
//! Only the fields we use are declared; Stripe adds fields freely, and
//! serde ignores what it does not know. Requests pin `Stripe-Version`
//! ([`super::client::API_VERSION`]) so the shapes below stay put.

use crate::ports::{ChannelPayment, RefundResult};
use serde::Deserialize;
use std::collections::HashMap;

/// `metadata` keys the channel writes on every PaymentIntent and Refund.
pub const META_PAYMENT_ID: &str = "payment_id";
pub const META_ORDER_ID: &str = "order_id";
pub const META_REFUND_KEY: &str = "refund_key";

/// A PaymentIntent, as `GET /v1/payment_intents/{id}` answers it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct PaymentIntent {
    pub id: String,
    pub status: String,
    pub amount: i64,
    #[serde(default)]
    pub amount_received: Option<i64>,
    /// Lower case at Stripe (`"eur"`).
    pub currency: String,
    #[serde(default)]
    pub client_secret: Option<String>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    /// An id at Stripe; localstripe answers the expanded object.
    #[serde(default)]
    pub latest_charge: Option<Expandable>,
    #[serde(default)]
    pub capture_method: Option<String>,
    #[serde(default)]
    pub created: i64,
}

/// A field Stripe answers either as an id or, expanded, as the object.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Expandable {
    Id(String),
    Object { id: String },
}

impl Expandable {
    pub fn id(&self) -> &str {
        match self {
            Self::Id(id) | Self::Object { id } => id,
        }
    }
}

impl PaymentIntent {
    pub fn charge_id(&self) -> Option<&str> {
        self.latest_charge.as_ref().map(Expandable::id)
    }

    pub fn meta(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(String::as_str)
    }
}

/// What a PaymentIntent's status means for the close protocol (ask the
/// channel before closing; docs/design.md#close-money-facts). An intent that
/// is still open — waiting for a payment method, a confirmation, 3-D Secure,
/// or the bank (`processing`) — is `Pending`: the closer then cancels it, and
/// Stripe refuses to cancel one that is processing, which holds the order.
/// A status this code does not know is an error: unknown, so held.
pub fn intent_state(pi: &PaymentIntent) -> Result<ChannelPayment, String> {
    Ok(match pi.status.as_str() {
        "succeeded" => ChannelPayment::Succeeded {
            // The charge is what the buyer's statement and a refund name;
            // an intent without one (never seen) falls back to its own id.
            channel_txn_id: pi.charge_id().unwrap_or(&pi.id).to_owned(),
            amount: pi.amount_received.filter(|a| *a > 0).unwrap_or(pi.amount),
            currency: pi.currency.to_ascii_uppercase(),
        },
        "canceled" => ChannelPayment::Failed,
        "processing" | "requires_payment_method" | "requires_confirmation" | "requires_action" => {
            ChannelPayment::Pending
        }
        // Only manual capture leads here, which the configuration refuses;
        // an authorisation is money held, never "unpaid".
        "requires_capture" => ChannelPayment::Pending,
        other => return Err(format!("PaymentIntent {} has a status this code does not know: {other:?}", pi.id)),
    })
}

/// A Refund, as `POST /v1/refunds` and `GET /v1/refunds` answer it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Refund {
    pub id: String,
    pub amount: i64,
    pub status: String,
    #[serde(default)]
    pub charge: Option<String>,
    #[serde(default)]
    pub payment_intent: Option<String>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    #[serde(default)]
    pub failure_reason: Option<String>,
    #[serde(default)]
    pub created: i64,
}

/// A Stripe refund's state, as the refund worker counts it. `pending` and
/// `requires_action` are followed up (the worker asks again; a
/// `refund.updated` webhook also does), never taken as done.
pub fn refund_state(r: &Refund) -> RefundResult {
    match r.status.as_str() {
        "succeeded" => RefundResult::Refunded { channel_refund_id: r.id.clone() },
        "pending" | "requires_action" => RefundResult::Pending { channel_refund_id: r.id.clone() },
        other => RefundResult::Failed(format!(
            "Stripe refund {} is {other}{}",
            r.id,
            r.failure_reason.as_deref().map(|f| format!(" ({f})")).unwrap_or_default()
        )),
    }
}

/// A page of a list endpoint.
#[derive(Debug, Clone, Deserialize)]
pub struct List<T> {
    pub data: Vec<T>,
    #[serde(default)]
    pub has_more: bool,
}

/// The error body of a 4xx/5xx answer.
#[derive(Debug, Clone, Deserialize)]
pub struct ErrorBody {
    pub error: ApiErrorDetail,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ApiErrorDetail {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(status: &str) -> PaymentIntent {
        serde_json::from_value(serde_json::json!({
            "id": "pi_1", "status": status, "amount": 1999, "amount_received": 1999, "currency": "eur",
            "latest_charge": "ch_1", "metadata": {"payment_id": "pay_1"}
        }))
        .unwrap()
    }

    #[test]
    fn every_intent_status_maps_to_one_close_protocol_answer() {
        assert_eq!(
            intent_state(&intent("succeeded")).unwrap(),
            ChannelPayment::Succeeded { channel_txn_id: "ch_1".into(), amount: 1999, currency: "EUR".into() }
        );
        assert_eq!(intent_state(&intent("canceled")).unwrap(), ChannelPayment::Failed);
        for open in
            ["processing", "requires_payment_method", "requires_confirmation", "requires_action", "requires_capture"]
        {
            assert_eq!(intent_state(&intent(open)).unwrap(), ChannelPayment::Pending, "{open}");
        }
        let err = intent_state(&intent("requires_source")).unwrap_err();
        assert!(err.contains("requires_source"), "{err}");
    }

    #[test]
    fn latest_charge_is_read_as_an_id_or_an_expanded_object() {
        let expanded: PaymentIntent = serde_json::from_value(serde_json::json!({
            "id": "pi_2", "status": "succeeded", "amount": 5, "currency": "usd", "latest_charge": {"id": "ch_9", "object": "charge"}
        }))
        .unwrap();
        assert_eq!(expanded.charge_id(), Some("ch_9"));
        assert_eq!(intent("succeeded").charge_id(), Some("ch_1"));
    }

    #[test]
    fn every_refund_status_maps_and_a_pending_one_is_never_done() {
        let refund = |status: &str| Refund {
            id: "re_1".into(),
            amount: 10,
            status: status.into(),
            charge: None,
            payment_intent: None,
            metadata: HashMap::new(),
            failure_reason: Some("expired_or_canceled_card".into()),
            created: 0,
        };
        assert_eq!(refund_state(&refund("succeeded")), RefundResult::Refunded { channel_refund_id: "re_1".into() });
        for pending in ["pending", "requires_action"] {
            assert_eq!(refund_state(&refund(pending)), RefundResult::Pending { channel_refund_id: "re_1".into() });
        }
        for failed in ["failed", "canceled"] {
            let RefundResult::Failed(why) = refund_state(&refund(failed)) else { panic!("{failed}") };
            assert!(why.contains(failed) && why.contains("expired_or_canceled_card"), "{why}");
        }
    }
}
