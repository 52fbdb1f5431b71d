//! End to end on the deployed local stack: what a buyer's order holds
//! besides stock. The open-order cap and a SKU's purchase limit under 20
//! concurrent creates by one buyer (never passed); points held by an open
//! order, returned when it closes and spent when it is paid; a cancel that
//! gives back every kind at once.

use serde_json::{json, Value};
use std::time::Duration;
use system_tests::*;

/// The deployed stack's open-order cap (`infra/local.sh`'s
/// `MAX_OPEN_ORDERS_PER_BUYER`, written to `.local/stack.env`).
fn open_order_cap() -> usize {
    let cap: usize = deployed_number("MAX_OPEN_ORDERS_PER_BUYER");
    assert!(cap > 0, "the local stack must be deployed with an open-order cap (MAX_OPEN_ORDERS_PER_BUYER > 0)");
    cap
}

async fn credit(api: &Api, buyer: &str, points: i64) -> Reply {
    let user = api.user_id(buyer).await;
    let key = unique("credit");
    let body = json!({"currency": "EUR", "credit": points, "reason": "e2e"}).to_string();
    api.send("POST", &format!("/admin/buyers/{user}/points"), &[("Idempotency-Key", &key)], Some(&body), true).await
}

async fn points(api: &Api, buyer: &str) -> Value {
    let user = api.user_id(buyer).await;
    let r = api.send("GET", &format!("/admin/buyers/{user}/points"), &[], None, true).await;
    assert_eq!(r.status, 200, "{r:?}");
    r.body
}

async fn set_limit(api: &Api, sku: &str, limit: u32) {
    let body = json!({"purchase_limit": limit}).to_string();
    let r =
        api.send("PUT", &format!("/admin/skus/{sku}"), &[("Idempotency-Key", &unique("lim"))], Some(&body), true).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["purchase_limit"], limit);
}

/// `n` creates of `body` at once; the created order ids and the refusal codes.
async fn at_once(api: &Api, n: usize, body: &Value) -> (Vec<String>, Vec<String>) {
    let keys: Vec<String> = (0..n).map(|_| unique("key")).collect();
    let replies = futures::future::join_all(keys.iter().map(|k| api.create_order(k, body))).await;
    let mut created = Vec::new();
    let mut refused = Vec::new();
    for r in replies {
        match r.status {
            201 => created.push(r.body["order_id"].as_str().unwrap().to_owned()),
            409 => refused.push(r.error_code().to_owned()),
            _ => panic!("neither created nor refused: {r:?}"),
        }
    }
    (created, refused)
}

async fn cancel(api: &Api, id: &str) -> Reply {
    api.send_as(&api.owner(id), "POST", &format!("/orders/{id}/cancel"), &[], None).await
}

#[tokio::test]
async fn e2e_twenty_concurrent_creates_by_one_buyer_never_pass_the_open_order_cap() {
    let api = Api::new();
    let sku = unique("cap");
    api.put_stock(&sku, 500).await;
    let buyer = unique("capped");
    let cap = open_order_cap();
    // Five slots left, then twenty creates at once.
    for _ in 0..cap - 5 {
        let r = api.create_order(&unique("key"), &order_body(&buyer, &sku, 1, None)).await;
        assert_eq!(r.status, 201, "{r:?}");
    }
    let (created, refused) = at_once(&api, 20, &order_body(&buyer, &sku, 1, None)).await;
    assert_eq!(created.len(), 5, "{refused:?}");
    assert!(refused.iter().all(|c| c == "open_order_cap_reached"), "{refused:?}");
    assert_eq!(api.stock(&sku).await["reserved"], cap as i64, "the refused creates held no stock");
    // A cancelled order gives its slot back (once its release ran).
    assert_eq!(cancel(&api, &created[0]).await.status, 200);
    eventually("a slot back after the cancel", Duration::from_secs(60), || async {
        let r = api.create_order(&unique("key"), &order_body(&buyer, &sku, 1, None)).await;
        (r.status == 201).then_some(())
    })
    .await;
}

#[tokio::test]
async fn e2e_twenty_concurrent_creates_by_one_buyer_never_pass_the_purchase_limit_and_a_cancel_gives_every_holding_back(
) {
    let api = Api::new();
    let sku = unique("limited");
    api.put_stock(&sku, 100).await;
    set_limit(&api, &sku, 2).await;
    let buyer = unique("limit-buyer");
    assert_eq!(credit(&api, &buyer, 1000).await.status, 200);
    let mut body = order_body(&buyer, &sku, 1, None);
    body["points"] = json!(100);
    let (created, refused) = at_once(&api, 20, &body).await;
    assert_eq!(created.len(), 2, "{refused:?}");
    assert!(refused.iter().all(|c| c == "purchase_limit_reached"), "{refused:?}");
    assert_eq!(api.stock(&sku).await["reserved"], 2);
    let p = points(&api, &buyer).await;
    assert_eq!((p["available"].as_i64(), p["held"].as_i64()), (Some(800), Some(200)), "{p}");

    // The admin view lists every kind the order holds.
    let admin = api.admin_order(&created[0]).await.body;
    let kinds: Vec<&str> =
        admin["reservations"].as_array().unwrap().iter().map(|r| r["resource_type"].as_str().unwrap()).collect();
    for kind in ["STOCK", "PURCHASE_LIMIT", "POINTS", "OPEN_ORDERS"] {
        assert!(kinds.contains(&kind), "{kind} missing from {admin}");
    }

    // Cancelled: CLOSED as BUYER_CANCELLED; stock, limit, points and slot back.
    let r = cancel(&api, &created[0]).await;
    assert_eq!((r.status, r.body["close_reason"].as_str()), (200, Some("BUYER_CANCELLED")), "{r:?}");
    eventually("every holding released", Duration::from_secs(60), || async {
        let admin = api.admin_order(&created[0]).await.body;
        admin["reservations"].as_array().unwrap().iter().all(|r| r["status"] == "RELEASED").then_some(())
    })
    .await;
    assert_eq!(api.stock(&sku).await["reserved"], 1);
    let p = points(&api, &buyer).await;
    assert_eq!((p["available"].as_i64(), p["held"].as_i64()), (Some(900), Some(100)), "{p}");
    // The limit has room for one again, and only one.
    let (again, refused) = at_once(&api, 5, &body).await;
    assert_eq!(again.len(), 1, "{refused:?}");
}

#[tokio::test]
async fn e2e_points_are_held_while_open_returned_on_close_and_spent_on_pay() {
    let api = Api::new();
    let sku = unique("pts");
    api.put_stock(&sku, 10).await;
    let buyer = unique("points-buyer");
    let credited = credit(&api, &buyer, 500).await;
    assert_eq!(credited.status, 200, "{credited:?}");
    // Not enough points: refused, nothing held.
    let mut body = order_body(&buyer, &sku, 1, None);
    body["points"] = json!(600);
    let r = api.create_order(&unique("key"), &body).await;
    assert_eq!((r.status, r.error_code()), (409, "not_enough_points"), "{r:?}");

    // Held by an order left to expire, then back.
    body["points"] = json!(300);
    let expiring = api.create_order(&unique("key"), &body).await;
    assert_eq!(expiring.status, 201, "{expiring:?}");
    assert_eq!(expiring.body["amount_total"], PRICE - 300);
    assert_eq!(points(&api, &buyer).await["held"], 300);
    let id = expiring.body["order_id"].as_str().unwrap().to_owned();
    api.wait_status(&id, "CLOSED", settle_timeout()).await;
    eventually("the points back", Duration::from_secs(60), || async {
        let p = points(&api, &buyer).await;
        (p["available"] == 500 && p["held"] == 0).then_some(())
    })
    .await;

    // Spent by a paid one.
    body["points"] = json!(200);
    let paid = api.create_order(&unique("key"), &body).await;
    let id = paid.body["order_id"].as_str().unwrap().to_owned();
    let start = api.start_payment(&id).await;
    assert_eq!(start.status, 201, "{start:?}");
    assert_eq!(start.body["amount"], PRICE - 200, "the channel is asked for what is left to pay");
    let payment = start.body["payment_id"].as_str().unwrap().to_owned();
    let settled = api.settle(&payment, &json!({"outcome": "SUCCEEDED", "notify": true})).await;
    assert_eq!(settled.status, 200, "{settled:?}");
    api.wait_status(&id, "PAID", settle_timeout()).await;
    eventually("the points spent", Duration::from_secs(60), || async {
        let p = points(&api, &buyer).await;
        (p["available"] == 300 && p["held"] == 0 && p["spent"] == 200).then_some(p)
    })
    .await;
    let p = points(&api, &buyer).await;
    assert_eq!(p["credits"].as_array().unwrap().len(), 1, "{p}");
    assert_eq!(p["credited"], 500);
}
