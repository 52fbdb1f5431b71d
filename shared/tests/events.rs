//! The sample events in `events/` decode into the runtime's event types and
//! into the domain records the handlers read from them.

use aws_lambda_events::event::dynamodb::Event as StreamEvent;
use aws_lambda_events::event::sqs::SqsEvent;
use order_core::aws::queue::CloseMessage;
use order_core::domain::{Order, OrderStatus};
use order_core::handlers::effects::EffectMessage;
use order_core::handlers::refunds::RefundMessage;
use order_core::handlers::streams::{order_of, refund_ids_of};

fn event(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../events/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn stream_events_carry_decodable_orders() {
    for (file, status) in [
        ("relay-order-inserted.json", OrderStatus::PendingPayment),
        ("relay-order-closed.json", OrderStatus::Closed),
        ("relay-order-paid.json", OrderStatus::Paid),
    ] {
        let e: StreamEvent = serde_json::from_str(&event(file)).unwrap();
        let order: Order = order_of(&e.records[0]).unwrap();
        assert_eq!(order.status, status, "{file}");
        assert_eq!(order.order_id.as_str(), "ord_example");
    }
    let e: StreamEvent = serde_json::from_str(&event("relay-refund-inserted.json")).unwrap();
    let (o, p) = refund_ids_of(&e.records[0]).unwrap();
    assert_eq!((o.as_str(), p.as_str()), ("ord_example", "pay_example"));
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
        "sandbox-channel-settle.json",
    ] {
        let req: aws_lambda_events::event::apigw::ApiGatewayV2httpRequest = serde_json::from_str(&event(f)).unwrap();
        assert!(req.route_key.is_some(), "{f}");
    }
}
