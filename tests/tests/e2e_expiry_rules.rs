//! End to end on the deployed local stack: payment windows by rule. Two
//! orders of one SKU created under two published versions of the rules
//! keep their own windows and versions, and show both to the buyer; a rule
//! on a campaign tag gives the window of a classified SKU; a rule on
//! something rules cannot match is a 400 that publishes nothing.
//!
//! The rules are the stack's, shared by every test running beside this
//! one: these name only this test's own SKUs and set no default, so no
//! other test's orders change; another test publishing in between replaces
//! them, so each step retries until its order was made under its version.

use serde_json::{json, Value};
use std::time::Duration;
use system_tests::*;

async fn publish(api: &Api, rules: Value) -> Value {
    let body = json!({"rules": rules}).to_string();
    let r = api.send("PUT", "/admin/expiry-rules", &[], Some(&body), true).await;
    assert_eq!(r.status, 200, "{r:?}");
    r.body
}

/// Publishes `rules` and creates an order of `sku` under them (again, if
/// another publication came in between): the order's view.
async fn order_under(api: &Api, buyer: &str, sku: &str, rules: Value) -> (Value, Value) {
    for _ in 0..5 {
        let published = publish(api, rules.clone()).await;
        let mut body = order_body(buyer, sku, 1, None);
        body["items"][0].as_object_mut().unwrap().remove("unit_price");
        let c = api.create_order(&unique("key"), &body).await;
        assert_eq!(c.status, 201, "{c:?}");
        if c.body["expiry_rule_version"] == published["expiry_rule_version"] {
            return (c.body, published);
        }
    }
    panic!("another publication kept coming between this test's publication and its order");
}

fn window_of(order: &Value) -> i64 {
    let at = |k: &str| {
        time::OffsetDateTime::parse(order[k].as_str().unwrap(), &time::format_description::well_known::Rfc3339).unwrap()
    };
    (at("expire_at") - at("created_at")).whole_seconds()
}

#[tokio::test]
async fn e2e_two_orders_under_two_rule_versions_keep_their_own_windows() {
    let api = Api::new();
    let sku = unique("rules");
    api.put_stock(&sku, 10).await;
    let buyer = unique("rules-buyer");
    let (first, v1) = order_under(&api, &buyer, &sku, json!([{"sku": sku, "window_seconds": 45}])).await;
    let (second, v2) = order_under(&api, &buyer, &sku, json!([{"sku": sku, "window_seconds": 75}])).await;
    assert!(v2["version"].as_u64() > v1["version"].as_u64());
    let id1 = first["order_id"].as_str().unwrap();
    let id2 = second["order_id"].as_str().unwrap();
    // The buyer sees each order's window and the rule that gave it.
    let one = api.get_order(id1).await.body;
    let two = api.get_order(id2).await.body;
    assert_eq!((window_of(&one), &one["expiry_rule_version"]), (45, &v1["expiry_rule_version"]), "{one}");
    assert_eq!((window_of(&two), &two["expiry_rule_version"]), (75, &v2["expiry_rule_version"]), "{two}");
    // Each version stays readable by its number.
    let n = v1["version"].as_u64().unwrap();
    let r = api.send("GET", &format!("/admin/expiry-rules/{n}"), &[], None, true).await;
    assert_eq!((r.status, r.body["rules"][0]["window_seconds"].as_i64()), (200, Some(45)), "{r:?}");
    // The first order closes at its own window's end, not the later one's.
    let closed = api.wait_status(id1, "CLOSED", Duration::from_secs(45 + 90)).await;
    assert_eq!(closed["close_reason"], "EXPIRED");
    assert_eq!(api.get_order(id2).await.body["expire_at"], two["expire_at"]);
    for id in [id2] {
        api.send_as(&buyer, "POST", &format!("/orders/{id}/cancel"), &[], None).await;
    }
}

#[tokio::test]
async fn e2e_a_campaign_tag_rule_gives_a_classified_sku_its_window_and_an_unknown_target_is_refused() {
    let api = Api::new();
    let sku = unique("tagged");
    api.put_stock(&sku, 10).await;
    let tag = unique("campaign");
    let body = json!({"tags": [tag]}).to_string();
    let r =
        api.send("PUT", &format!("/admin/skus/{sku}"), &[("Idempotency-Key", &unique("tag"))], Some(&body), true).await;
    assert_eq!((r.status, &r.body["tags"]), (200, &json!([tag])), "{r:?}");
    let buyer = unique("tag-buyer");
    let (order, _) = order_under(&api, &buyer, &sku, json!([{"tag": tag, "window_seconds": 50}])).await;
    let id = order["order_id"].as_str().unwrap();
    let view = api.get_order(id).await.body;
    assert_eq!(window_of(&view), 50, "{view}");
    api.send_as(&buyer, "POST", &format!("/orders/{id}/cancel"), &[], None).await;

    let before = api.send("GET", "/admin/expiry-rules", &[], None, true).await.body["version"].clone();
    let bad = json!({"rules": [{"brand": "acme", "window_seconds": 60}]}).to_string();
    let r = api.send("PUT", "/admin/expiry-rules", &[], Some(&bad), true).await;
    assert_eq!((r.status, r.error_code()), (400, "invalid_request"), "{r:?}");
    assert!(r.body["error"]["message"].as_str().unwrap().contains("brand is not a known field"), "{r:?}");
    let after = api.send("GET", "/admin/expiry-rules", &[], None, true).await.body["version"].clone();
    assert!(after.as_u64() >= before.as_u64(), "a refused publication published nothing of its own");
}
