//! End to end on the deployed local stack: create → wake-up at expire_at →
//! close → release, through API Gateway, Lambda, DynamoDB Streams,
//! EventBridge Scheduler and SQS on the emulator.

use serde_json::{json, Value};
use std::time::Duration;
use system_tests::*;

async fn seeded(api: &Api, prefix: &str, available: i64) -> String {
    let sku = unique(prefix);
    api.put_stock(&sku, available).await;
    sku
}

fn far_future() -> &'static str {
    "2099-01-01T00:00:00Z"
}

#[tokio::test]
async fn an_unpaid_order_closes_after_its_window_and_its_stock_and_coupon_return() {
    let api = Api::new();
    let sku = seeded(&api, "e2e-close", 5).await;
    let coupon = unique("cpn");
    assert_eq!(api.put_coupon(&coupon, "alice", far_future()).await.status, 200);

    let r = api.create_order(&unique("key"), &order_body("alice", &sku, 2, Some(&coupon))).await;
    assert_eq!(r.status, 201, "{r:?}");
    let id = r.body["order_id"].as_str().unwrap().to_owned();
    assert_eq!(r.body["status"], "PENDING_PAYMENT");
    assert_eq!(r.body["amount_total"], 2598);
    assert!(r.body["expire_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        api.stock(&sku).await,
        json!({"sku": sku, "available": 3, "reserved": 2, "sold": 0, "price": system_tests::PRICE, "currency": "EUR"})
    );
    assert_eq!(api.coupon(&coupon).await["state"], "LOCKED");

    // The outbox consumer gave the order its one-shot wake-up.
    let scheduler = aws_sdk_scheduler::Client::new(&stack_config().await);
    let schedule = eventually("the wake-up schedule", Duration::from_secs(20), || async {
        scheduler
            .get_schedule()
            .group_name(stack_env("SCHEDULE_GROUP_NAME"))
            .name(format!("order-{id}"))
            .send()
            .await
            .ok()
    })
    .await;
    // at() a little before expire_at (the start of the minute before it,
    // or as early as a short window allows), never after it: the close run
    // puts the reminder back for the seconds left.
    let expire_at = order_core::domain::Timestamp::parse(r.body["expire_at"].as_str().unwrap()).unwrap();
    let expr = schedule.schedule_expression().unwrap();
    let at =
        expr.strip_prefix("at(").and_then(|e| e.strip_suffix(')')).unwrap_or_else(|| panic!("not an at(): {expr}"));
    let at = order_core::domain::Timestamp::parse(&format!("{at}Z")).unwrap();
    let early_by_ms = expire_at.unix_millis() - at.unix_millis();
    assert!((0..120_000).contains(&early_by_ms), "{expr} for expire_at {expire_at}");
    assert_eq!(schedule.flexible_time_window().unwrap().mode().as_str(), "OFF");
    assert_eq!(schedule.action_after_completion().map(|a| a.as_str()), Some("DELETE"));
    let target = schedule.target().unwrap();
    assert_eq!(target.arn(), stack_env("CLOSE_QUEUE_ARN"));
    assert_eq!(
        serde_json::from_str::<Value>(target.input().unwrap()).unwrap(),
        json!({"order_id": id, "trigger": "schedule"})
    );

    let closed = api.wait_status(&id, "CLOSED", settle_timeout()).await;
    let back = eventually("stock and coupon back", Duration::from_secs(60), || async {
        let view = api.get_order(&id).await.body;
        let stock = api.stock(&sku).await;
        (stock["available"] == 5
            && view["items"][0]["reservation"] == "RELEASED"
            && view["coupon"]["state"] == "AVAILABLE")
            .then_some((view, stock))
    })
    .await;
    assert_eq!(back.1["reserved"], 0);
    assert_eq!(api.coupon(&coupon).await["state"], "AVAILABLE");

    // How long from expire_at to CLOSED, from the order's own audit trail.
    let admin = api.admin_order(&id).await;
    assert_eq!(admin.status, 200);
    let closed_at =
        admin.body["history"].as_array().unwrap().iter().find(|h| h["to"] == "CLOSED").unwrap()["at"].clone();
    println!("expire_at {} -> CLOSED at {}", closed["expire_at"], closed_at);
    assert!(closed_at.as_str().unwrap() >= closed["expire_at"].as_str().unwrap(), "never closed early");
}

#[tokio::test]
async fn a_duplicate_close_message_and_a_duplicate_closed_event_change_nothing() {
    let api = Api::new();
    let sku = seeded(&api, "e2e-dup", 4).await;
    let id = api.create_order(&unique("key"), &order_body("bob", &sku, 3, None)).await.body["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    api.wait_status(&id, "CLOSED", settle_timeout()).await;
    eventually("stock back", Duration::from_secs(60), || async {
        (api.stock(&sku).await["available"] == 4).then_some(())
    })
    .await;
    let before = api.admin_order(&id).await.body;

    // A second wake-up for the same order.
    send_close_message(&id).await;
    // A redelivered OrderClosed message, straight to the release function.
    let record = release_record(&id);
    let resp = invoke(&stack_env("RELEASE_ORDER_FUNCTION_NAME"), &record).await;
    assert_eq!(resp["batchItemFailures"], json!([]), "{resp}");
    tokio::time::sleep(Duration::from_secs(8)).await;

    assert_eq!(api.admin_order(&id).await.body["version"], before["version"], "no write to the order");
    assert_eq!(
        api.stock(&sku).await,
        json!({"sku": sku, "available": 4, "reserved": 0, "sold": 0, "price": system_tests::PRICE, "currency": "EUR"}),
        "stock added once"
    );
}

/// A CLOSED transition record shaped as the table stream delivers it.
fn release_record(order_id: &str) -> Value {
    let mut event: Value = serde_json::from_str(include_str!("../../events/release-order.json")).unwrap();
    event["Records"][0]["body"] = json!(json!({"order_id": order_id, "trigger": "OrderClosed"}).to_string());
    event
}

#[tokio::test]
async fn an_early_wake_up_does_not_close_and_is_put_back_until_expiry() {
    let api = Api::new();
    let sku = seeded(&api, "e2e-early", 1).await;
    let id = api.create_order(&unique("key"), &order_body("carol", &sku, 1, None)).await.body["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Take the scheduled wake-up away, so that only the early reminder can
    // ever close this order: it must be put back, not dropped or obeyed.
    let scheduler = aws_sdk_scheduler::Client::new(&stack_config().await);
    let group = stack_env("SCHEDULE_GROUP_NAME");
    let name = format!("order-{id}");
    eventually("the wake-up schedule", Duration::from_secs(20), || async {
        scheduler.get_schedule().group_name(&group).name(&name).send().await.ok()
    })
    .await;
    scheduler.delete_schedule().group_name(&group).name(&name).send().await.unwrap();

    send_close_message(&id).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let view = api.get_order(&id).await.body;
    assert_eq!(view["status"], "PENDING_PAYMENT", "closed before expire_at: {view}");
    assert_eq!(api.stock(&sku).await["available"], 0);

    // The reminder came back at expire_at and closed it.
    let closed = api.wait_status(&id, "CLOSED", settle_timeout()).await;
    let history = api.admin_order(&id).await.body["history"].clone();
    let closed_at = history.as_array().unwrap().iter().find(|h| h["to"] == "CLOSED").unwrap()["at"].clone();
    assert!(closed_at.as_str().unwrap() >= closed["expire_at"].as_str().unwrap(), "never early: {history}");
}

#[tokio::test]
async fn bad_requests_get_their_4xx_and_write_nothing() {
    let api = Api::new();
    let sku = seeded(&api, "e2e-bad", 2).await;
    let coupon = unique("cpn");
    api.put_coupon(&coupon, "dave", far_future()).await;
    let body = order_body("dave", &sku, 1, None);

    // No Idempotency-Key.
    let r = api.send_as("dave", "POST", "/orders", &[], Some(&body.to_string())).await;
    assert_eq!((r.status, r.error_code()), (400, "invalid_request"), "{r:?}");
    assert!(r.body["error"]["message"].as_str().unwrap().contains("Idempotency-Key"));

    // Malformed bodies, each naming the problem.
    for (bad, names) in [
        ("{not json", "JSON"),
        (r#"[1,2]"#, "object"),
        (r#"{"user_id":"dave","currency":"EUR"}"#, "items"),
        (r#"{"user_id":"dave","currency":"euro","items":[{"sku":"x","qty":1,"unit_price":1}]}"#, "currency"),
        (r#"{"user_id":"dave","currency":"EUR","items":[{"sku":"x","qty":-1,"unit_price":1}]}"#, "items[0].qty"),
        (
            r#"{"user_id":"dave","currency":"EUR","items":[{"sku":"x","qty":1,"unit_price":9.99}]}"#,
            "items[0].unit_price",
        ),
    ] {
        let key = unique("bad");
        let r = api.send_as("dave", "POST", "/orders", &[("Idempotency-Key", &key)], Some(bad)).await;
        assert_eq!((r.status, r.error_code()), (400, "invalid_request"), "{bad}: {r:?}");
        assert!(r.body["error"]["message"].as_str().unwrap().contains(names), "{bad}: {r:?}");
    }

    // Out of stock, naming the SKU; the key was not consumed.
    let key = unique("oos");
    let r = api.create_order(&key, &order_body("dave", &sku, 3, None)).await;
    assert_eq!((r.status, r.error_code()), (409, "out_of_stock"), "{r:?}");
    assert!(r.body["error"]["message"].as_str().unwrap().contains(&sku));

    // A coupon of another user, and one that does not exist.
    for c in [coupon.as_str(), "no-such-coupon"] {
        let r = api.create_order(&unique("cpn"), &order_body("erin", &sku, 1, Some(c))).await;
        assert_eq!((r.status, r.error_code()), (409, "coupon_unavailable"), "{r:?}");
    }
    assert_eq!(
        api.stock(&sku).await,
        json!({"sku": sku, "available": 2, "reserved": 0, "sold": 0, "price": system_tests::PRICE, "currency": "EUR"}),
        "nothing reserved"
    );
    assert_eq!(api.coupon(&coupon).await["state"], "AVAILABLE");

    // The key of the refused request is still free: it creates an order now.
    let r = api.create_order(&key, &body).await;
    assert_eq!(r.status, 201, "{r:?}");
    // Same key, same body: the same order, nothing new.
    let again = api.create_order(&key, &body).await;
    assert_eq!((again.status, &again.body["order_id"]), (201, &r.body["order_id"]));
    // Same key, another body.
    let other = api.create_order(&key, &order_body("dave", &sku, 2, None)).await;
    assert_eq!((other.status, other.error_code()), (409, "idempotency_key_reused"));
    assert_eq!(api.stock(&sku).await["available"], 1);

    // Unknown order, unsigned admin call.
    assert_eq!(api.get_order("ord_nope").await.status, 404);
    assert_eq!(api.get_order("ord_nope").await.error_code(), "not_found");
    let unsigned = api.send("GET", &format!("/admin/skus/{sku}"), &[], None, false).await;
    assert_eq!(unsigned.status, 403);
}

#[tokio::test]
async fn twenty_concurrent_orders_on_ten_units_leave_ten_orders_and_the_stock_returns_after_expiry() {
    let api = Api::new();
    let sku = seeded(&api, "e2e-hot", 10).await;
    let replies = futures::future::join_all((0..20).map(|i| {
        let (api, sku) = (api.clone(), sku.clone());
        async move { api.create_order(&unique("hot"), &order_body(&format!("buyer{i}"), &sku, 1, None)).await }
    }))
    .await;
    let created: Vec<String> =
        replies.iter().filter(|r| r.status == 201).map(|r| r.body["order_id"].as_str().unwrap().to_owned()).collect();
    let refused = replies.iter().filter(|r| r.status == 409 && r.error_code() == "out_of_stock").count();
    assert_eq!((created.len(), refused), (10, 10), "{replies:?}");
    assert_eq!(
        api.stock(&sku).await,
        json!({"sku": sku, "available": 0, "reserved": 10, "sold": 0, "price": system_tests::PRICE, "currency": "EUR"})
    );

    for id in &created {
        api.wait_status(id, "CLOSED", settle_timeout()).await;
    }
    eventually("all stock back", Duration::from_secs(90), || async {
        (api.stock(&sku).await == json!({"sku": sku, "available": 10, "reserved": 0, "sold": 0, "price": system_tests::PRICE, "currency": "EUR"})).then_some(())
    })
    .await;
}
