//! Stripe's webhook events, parsed into the channel-neutral
//! [`ChannelEvent`]. Only the event's id, its type and the object's ids
//! are read: what the payment or refund *is* comes from the API.

use crate::usecases::channel_events::ChannelEvent;
use serde::Deserialize;
use std::collections::HashMap;

/// The events the webhook endpoint is registered for
/// (docs/payments.md#payment-providers); any other type is acknowledged and
/// counted.
pub const SUBSCRIBED: [&str; 8] = [
    "payment_intent.succeeded",
    "payment_intent.processing",
    "payment_intent.payment_failed",
    "payment_intent.canceled",
    "refund.created",
    "refund.updated",
    "refund.failed",
    // Before API version 2024-10-28, card refunds are told only this way.
    "charge.refund.updated",
];

#[derive(Deserialize)]
struct Event {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    data: EventData,
}

#[derive(Deserialize)]
struct EventData {
    object: EventObject,
}

#[derive(Deserialize)]
struct EventObject {
    /// Absent on a few types (`balance.available`): those are not acted on.
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    object: String,
    #[serde(default)]
    metadata: HashMap<String, String>,
}

/// The signing secrets of the webhook endpoint, from the one SSM value:
/// `whsec_new` or, while a secret is rotated, `whsec_new,whsec_old`.
pub fn signing_secrets(value: &[u8]) -> Vec<Vec<u8>> {
    value.split(|b| *b == b',').map(|s| s.trim_ascii().to_vec()).filter(|s| !s.is_empty()).collect()
}

/// Parses a verified event body; `Err` names what is wrong with it.
pub fn parse_event(body: &[u8]) -> Result<ChannelEvent, String> {
    let e: Event = serde_json::from_slice(body)
        .map_err(|err| format!("the body is not a Stripe event (id, type, data.object): {err}"))?;
    let object = e.data.object;
    let meta = |k: &str| object.metadata.get(k).cloned();
    Ok(match (e.kind.split_once('.').map(|(prefix, _)| prefix), object.object.as_str(), object.id.clone()) {
        (Some("payment_intent"), "payment_intent", Some(id)) => {
            ChannelEvent::Payment { event_id: e.id, channel_ref: id, payment_id: meta(super::objects::META_PAYMENT_ID) }
        }
        (Some("refund" | "charge"), "refund", _) => ChannelEvent::Refund {
            event_id: e.id,
            payment_id: meta(super::objects::META_PAYMENT_ID),
            order_id: meta(super::objects::META_ORDER_ID),
        },
        _ => ChannelEvent::Other { event_id: e.id, event_type: e.kind },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_parameter_holds_one_secret_or_two_while_rotating() {
        assert_eq!(signing_secrets(b"whsec_a"), vec![b"whsec_a".to_vec()]);
        assert_eq!(signing_secrets(b"whsec_a, whsec_b,"), vec![b"whsec_a".to_vec(), b"whsec_b".to_vec()]);
        assert!(signing_secrets(b" , ").is_empty());
    }

    #[test]
    fn payment_intent_and_refund_events_name_the_object_and_our_ids() {
        let pi = br#"{"id":"evt_1","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","object":"payment_intent","metadata":{"payment_id":"pay_1","order_id":"ord_1"}}}}"#;
        assert_eq!(
            parse_event(pi).unwrap(),
            ChannelEvent::Payment {
                event_id: "evt_1".into(),
                channel_ref: "pi_1".into(),
                payment_id: Some("pay_1".into())
            }
        );
        let refund = br#"{"id":"evt_2","type":"charge.refund.updated","data":{"object":{"id":"re_1","object":"refund","metadata":{"payment_id":"pay_1","order_id":"ord_1"}}}}"#;
        assert_eq!(
            parse_event(refund).unwrap(),
            ChannelEvent::Refund {
                event_id: "evt_2".into(),
                payment_id: Some("pay_1".into()),
                order_id: Some("ord_1".into())
            }
        );
        let other = br#"{"id":"evt_3","type":"customer.created","data":{"object":{"id":"cus_1","object":"customer"}}}"#;
        assert_eq!(
            parse_event(other).unwrap(),
            ChannelEvent::Other { event_id: "evt_3".into(), event_type: "customer.created".into() }
        );
        // A payment_intent type whose object is not an intent is not acted on.
        let odd =
            br#"{"id":"evt_4","type":"payment_intent.succeeded","data":{"object":{"id":"ch_1","object":"charge"}}}"#;
        assert!(matches!(parse_event(odd).unwrap(), ChannelEvent::Other { .. }));
        assert!(parse_event(b"{}").unwrap_err().contains("not a Stripe event"));
        // An object without an id (balance.available) is acknowledged, not refused.
        let no_id = br#"{"id":"evt_5","type":"balance.available","data":{"object":{"object":"balance"}}}"#;
        assert!(matches!(parse_event(no_id).unwrap(), ChannelEvent::Other { .. }));
    }
}
