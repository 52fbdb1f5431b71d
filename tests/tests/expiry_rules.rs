//! Payment windows by rule on the real store (DynamoDB Local): a version of
//! the rules published, an order created under it, a new version
//! published, and the first order keeps its window and version; the
//! shortest matching rule over the lines (SKU, category, tag) applies; no
//! rules: the stack's window; a publication over a version no longer in
//! force, or with a bad rule, is refused and publishes nothing.

use order_core::domain::*;
use order_core::error::ApiError;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::queries::{put_stock, StockRequest};
use serde_json::{json, Value};
use std::time::Duration;
use system_tests::fixtures::{self, fresh_key};

const STACK_WINDOW: Duration = Duration::from_secs(1800);

system_tests::world_of!(World);

impl World {
    async fn new() -> Self {
        Self(fixtures::World::new(&["A", "B", "C"], 100).await)
    }

    async fn publish(&self, body: Value) -> Result<Value, ApiError> {
        order_core::handlers::requests::publish_expiry_rules(
            &self.store,
            &self.clock,
            "ops".into(),
            body.to_string().as_bytes(),
        )
        .await
    }

    async fn order(&self, skus: &[&str]) -> Order {
        let items: Vec<Value> = skus.iter().map(|s| json!({"sku": s, "qty": 1})).collect();
        let body = json!({"user_id": "u1", "currency": "EUR", "items": items});
        fixtures::create(&self.creator(STACK_WINDOW, "window-1800s"), &fresh_key(), &body).await
    }

    async fn classify(&self, sku: &str, change: StockChange) {
        let req = StockRequest {
            change,
            key: Some(IdempotencyKey::parse(format!("c-{sku}-{}", rand::random::<u32>())).unwrap()),
            by: "ops".into(),
        };
        put_stock(&self.store, &self.clock, &RandomIds, &Sku::parse(sku).unwrap(), req).await.unwrap();
    }
}

fn window(o: &Order) -> Duration {
    o.created_at.until(o.expire_at)
}

#[tokio::test]
async fn an_order_keeps_the_window_and_version_it_was_created_with_when_new_rules_are_published() {
    let w = World::new().await;
    // No rules yet: the stack's window and version.
    let before = w.order(&["A"]).await;
    assert_eq!((window(&before), before.expiry_rule_version.as_str()), (STACK_WINDOW, "window-1800s"));

    let v1 = w.publish(json!({"if_version": 0, "rules": [{"sku": "A", "window_seconds": 120}]})).await.unwrap();
    assert_eq!((v1["version"].as_u64(), v1["expiry_rule_version"].as_str()), (Some(1), Some("rules-v1")));
    let first = w.order(&["A"]).await;
    assert_eq!((window(&first), first.expiry_rule_version.as_str()), (Duration::from_secs(120), "rules-v1"));

    w.publish(json!({"if_version": 1, "rules": [{"sku": "A", "window_seconds": 300}]})).await.unwrap();
    let second = w.order(&["A"]).await;
    assert_eq!((window(&second), second.expiry_rule_version.as_str()), (Duration::from_secs(300), "rules-v2"));
    // The first order, read back, is as it was created.
    let again = w.store.order(&first.order_id).await.unwrap().unwrap();
    assert_eq!((again.expire_at, again.expiry_rule_version.as_str()), (first.expire_at, "rules-v1"));
    // A SKU no rule matches: the stack's window, under the version in force.
    let other = w.order(&["C"]).await;
    assert_eq!((window(&other), other.expiry_rule_version.as_str()), (STACK_WINDOW, "rules-v2"));
    // Each version stays readable.
    let v1_again = order_core::usecases::expiry_rules::version(&w.store, 1).await.unwrap();
    assert_eq!(v1_again.rules[0].window_seconds, 120);
}

#[tokio::test]
async fn the_shortest_rule_matching_any_line_by_sku_category_or_tag_applies() {
    let w = World::new().await;
    let label = |s: &str| order_core::domain::expiry_rules::Label::parse(s).unwrap();
    w.classify("B", StockChange::Classify { category: Some(Some(label("fresh"))), tags: Some(vec![label("flash")]) })
        .await;
    let stock = w.store.stock(&Sku::parse("B").unwrap()).await.unwrap().unwrap();
    assert_eq!((stock.category, stock.tags), (Some(label("fresh")), vec![label("flash")]));
    w.publish(json!({"default_seconds": 900, "rules": [
        {"sku": "A", "window_seconds": 600},
        {"category": "fresh", "window_seconds": 400},
        {"tag": "flash", "window_seconds": 90},
    ]}))
    .await
    .unwrap();
    assert_eq!(window(&w.order(&["A"]).await), Duration::from_secs(600));
    assert_eq!(window(&w.order(&["A", "B"]).await), Duration::from_secs(90), "the tag's 90 s is the shortest");
    assert_eq!(window(&w.order(&["C"]).await), Duration::from_secs(900), "no match: the set's default");
    // The tag cleared: the category's window applies to B.
    w.classify("B", StockChange::Classify { category: None, tags: Some(vec![]) }).await;
    assert_eq!(window(&w.order(&["B"]).await), Duration::from_secs(400));
}

#[tokio::test]
async fn a_publication_over_another_version_or_with_a_bad_rule_is_refused_and_publishes_nothing() {
    let w = World::new().await;
    w.publish(json!({"rules": [{"sku": "A", "window_seconds": 120}]})).await.unwrap();
    let stale = w.publish(json!({"if_version": 0, "rules": []})).await.unwrap_err();
    assert_eq!(stale.code(), "rules_changed");
    for (body, names) in [
        (json!({"rules": [{"brand": "acme", "window_seconds": 60}]}), "rules[0]: brand is not a known field"),
        (json!({"rules": [{"sku": "A", "tag": "x", "window_seconds": 60}]}), "exactly one of sku, category or tag"),
        (json!({"rules": [{"sku": "A", "window_seconds": 1}]}), "rules[0].window_seconds 1 is out of range"),
        (json!({"rules": [{"tag": "has space", "window_seconds": 60}]}), "rules[0].tag"),
        (
            json!({"rules": [{"sku": "A", "window_seconds": 60}, {"sku": "A", "window_seconds": 90}]}),
            "rules[1] repeats",
        ),
        (json!({"default_seconds": -5, "rules": []}), "default_seconds must be a whole number"),
        (json!({"rules": {"sku": "A"}}), "rules is required"),
        (json!({"rules": [], "extra": 1}), "extra"),
    ] {
        let e = w.publish(body.clone()).await.unwrap_err();
        assert_eq!(e.code(), "invalid_request", "{body}");
        assert!(e.to_string().contains(names), "{body}: {e}");
    }
    let current = order_core::usecases::expiry_rules::current(&w.store).await.unwrap();
    assert_eq!(current.version, 1, "nothing was published by the refusals");
}
