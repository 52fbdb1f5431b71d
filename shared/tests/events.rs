//! The sample events in `events/` decode into the runtime's event types and
//! into the domain records the handlers read from them.

use aws_lambda_events::event::dynamodb::Event as StreamEvent;
use aws_lambda_events::event::sqs::SqsEvent;
use order_core::aws::queue::CloseMessage;
use order_core::handlers::effects::EffectMessage;
use order_core::handlers::refunds::RefundMessage;
use order_core::handlers::relay::events_of_record;

fn event(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../events/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn stream_events_map_to_the_integration_events_the_relay_publishes() {
    for (file, detail_type) in [
        ("relay-order-inserted.json", "OrderPlaced"),
        ("relay-order-closed.json", "OrderClosed"),
        ("relay-order-paid.json", "OrderPaid"),
        ("relay-refund-inserted.json", "LatePaymentRefundRequested"),
    ] {
        let e: StreamEvent = serde_json::from_str(&event(file)).unwrap();
        let events = events_of_record(&e.records[0]).unwrap();
        let types: Vec<&str> = events.iter().map(|e| e.detail_type()).collect();
        assert_eq!(types, [detail_type], "{file}");
        assert_eq!(events[0].order_id().as_str(), "ord_example", "{file}");
    }
}

#[test]
fn queue_events_carry_close_and_refund_messages() {
    let e: SqsEvent = serde_json::from_str(&event("close-order.json")).unwrap();
    let msg: CloseMessage = serde_json::from_str(e.records[0].body.as_deref().unwrap()).unwrap();
    assert_eq!(msg.order_id.as_str(), "ord_example");
    for (file, trigger) in [
        ("schedule-wakeup.json", "OrderPlaced"),
        ("release-order.json", "OrderClosed"),
        ("settle-order.json", "OrderPaid"),
    ] {
        let e: SqsEvent = serde_json::from_str(&event(file)).unwrap();
        let msg: EffectMessage = serde_json::from_str(e.records[0].body.as_deref().unwrap()).unwrap();
        assert_eq!((msg.order_id.as_str(), msg.trigger.as_deref()), ("ord_example", Some(trigger)), "{file}");
    }
    let e: SqsEvent = serde_json::from_str(&event("refund-worker-sqs.json")).unwrap();
    let msg: RefundMessage = serde_json::from_str(e.records[0].body.as_deref().unwrap()).unwrap();
    assert_eq!((msg.order_id.as_str(), msg.payment_id.as_str()), ("ord_example", "pay_example"));
}

#[test]
fn the_reconcile_schedule_event_is_an_eventbridge_event() {
    let e: serde_json::Value = serde_json::from_str(&event("reconcile.json")).unwrap();
    assert_eq!(e["detail-type"], "Scheduled Event");
}

#[test]
fn http_events_decode_as_api_gateway_v2_requests() {
    for f in [
        "create-order.json",
        "order-api-get-order.json",
        "order-api-start-payment.json",
        "order-api-put-stock.json",
        "payment-webhook.json",
        "stripe-webhook.json",
        "sandbox-channel-settle.json",
    ] {
        let req: aws_lambda_events::event::apigw::ApiGatewayV2httpRequest = serde_json::from_str(&event(f)).unwrap();
        assert!(req.route_key.is_some(), "{f}");
    }
}

#[test]
fn the_stripe_webhook_event_carries_a_stripe_event_about_our_payment() {
    let req: aws_lambda_events::event::apigw::ApiGatewayV2httpRequest =
        serde_json::from_str(&event("stripe-webhook.json")).unwrap();
    assert!(req.headers.contains_key("stripe-signature"));
    let parsed = order_core::stripe::events::parse_event(req.body.unwrap().as_bytes()).unwrap();
    assert!(matches!(
        parsed,
        order_core::usecases::channel_events::ChannelEvent::Payment { ref payment_id, .. } if payment_id.as_deref() == Some("pay_example")
    ));
}
