//! The webhook's refusals of junk, through the production handler
//! (`handlers::http::payment_webhook`) without a stack: the source list
//! (`WebhookSourceCidrs`) is applied before the size and the signature (and
//! not to the sandbox channel; without a list every address reaches the
//! signature check), a refusal is a 4xx `{"error":{"code","message"}}`, and
//! none of them reaches the store (its client points at a closed port, so a
//! call would fail the request with 500). The cost of each refusal is
//! measured by `tests/benches/webhook_reject.rs`.

use lambda_http::Request;
use order_core::aws::dynamo::DynamoStore;
use order_core::channels::ConfiguredChannel;
use order_core::handlers::http::{payment_webhook, Webhook};
use order_core::signature;
use order_core::source_allowlist::SourceAllowlist;
use serde_json::Value;
use std::collections::HashMap;
use system_tests::fakes::FixedClock;

const NOW: i64 = 1_795_946_400;
const STRIPE_IP: &str = "3.18.12.63";

async fn webhook(sources: &str) -> Webhook {
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url("http://127.0.0.1:9")
        .credentials_provider(aws_credential_types::Credentials::new("t", "t", None, None, "test"))
        .load()
        .await;
    Webhook {
        store: DynamoStore::new(aws_sdk_dynamodb::Client::new(&config), "never-reached"),
        channel: ConfiguredChannel::default(),
        clock: Box::new(FixedClock::at(NOW * 1000)),
        secrets: HashMap::from([
            ("stripe".to_owned(), b"whsec_current,whsec_previous".to_vec()),
            ("sandbox".to_owned(), b"sandbox-secret".to_vec()),
        ]),
        merchant_id: "merchant-test".to_owned(),
        sources: SourceAllowlist::parse(sources).unwrap(),
    }
}

/// events/stripe-webhook.json on `channel`'s route with `body`, `header`
/// (name, value) and `source_ip`.
fn request(channel: &str, body: &str, header: Option<(&str, &str)>, source_ip: &str) -> Request {
    let mut e: Value = serde_json::from_str(include_str!("../../events/stripe-webhook.json")).unwrap();
    e["body"] = Value::String(body.to_owned());
    e["isBase64Encoded"] = Value::Bool(false);
    e["pathParameters"]["channel"] = Value::String(channel.to_owned());
    e["rawPath"] = Value::String(format!("/payments/{channel}/notify"));
    let headers = e["headers"].as_object_mut().unwrap();
    headers.remove("stripe-signature");
    if let Some((k, v)) = header {
        headers.insert(k.to_owned(), Value::String(v.to_owned()));
    }
    e["requestContext"]["http"]["sourceIp"] = Value::String(source_ip.to_owned());
    lambda_http::request::from_str(&e.to_string()).unwrap()
}

async fn answer(app: &Webhook, req: Request) -> (u16, Value) {
    let resp = payment_webhook(app, req).await;
    let status = resp.status().as_u16();
    let body: Value = serde_json::from_slice(resp.body().as_ref()).unwrap_or(Value::Null);
    (status, body)
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn a_notification_from_outside_the_source_list_is_refused_before_its_size_or_signature_is_looked_at() {
    let app = webhook("3.18.12.63/32, 3.130.192.0/24").await;
    let body = r#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;
    let good = signature::sign(b"whsec_current", NOW, body.as_bytes());
    let oversized = "x".repeat(64 * 1024 + 1);
    for (case, b, h) in [
        ("signed", body, Some(("stripe-signature", good.as_str()))),
        ("unsigned", body, None),
        ("oversized", oversized.as_str(), Some(("stripe-signature", good.as_str()))),
    ] {
        let (status, reply) = answer(&app, request("stripe", b, h, "198.51.100.7")).await;
        assert_eq!((status, code(&reply)), (403, "forbidden_source"), "{case}: {reply}");
        assert!(reply["error"]["message"].as_str().is_some_and(|m| !m.contains("198.51.100.7")), "{reply}");
    }
    // A listed source goes on to the usual checks.
    let (status, reply) = answer(&app, request("stripe", body, None, STRIPE_IP)).await;
    assert_eq!((status, code(&reply)), (401, "bad_signature"), "{reply}");
    let (status, reply) = answer(&app, request("stripe", &oversized, None, "3.130.192.231")).await;
    assert_eq!((status, code(&reply)), (413, "payload_too_large"), "{reply}");
}

#[tokio::test]
async fn without_a_source_list_every_address_reaches_the_signature_check() {
    let app = webhook("").await;
    let body = r#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;
    let forged = format!("t={NOW},v1={}", "ab".repeat(32));
    let (status, reply) =
        answer(&app, request("stripe", body, Some(("stripe-signature", &forged)), "198.51.100.7")).await;
    assert_eq!((status, code(&reply)), (401, "bad_signature"), "{reply}");
}

#[tokio::test]
async fn the_sandbox_channel_is_not_held_to_the_providers_source_list() {
    let app = webhook("3.18.12.63/32").await;
    let body = r#"{"notify_id":"n-1"}"#;
    let (status, reply) = answer(&app, request("sandbox", body, None, "198.51.100.7")).await;
    assert_eq!((status, code(&reply)), (401, "bad_signature"), "the sandbox's own signature check answers: {reply}");
}
