//! End to end on the deployed local stack: `POST /orders/{id}/cancel`. A
//! buyer's cancel runs the same close as the order's expiry, due at once:
//! the stock and coupon return before `expire_at`, a payment that succeeded
//! wins, a PAID order cannot be cancelled, another buyer's order is not
//! found, and a repeated cancel changes nothing.

use serde_json::{json, Value};
use std::time::Duration;
use system_tests::*;

async fn cancel_as(api: &Api, who: &str, id: &str, body: Option<&str>) -> Reply {
    api.send_as(who, "POST", &format!("/orders/{id}/cancel"), &[], body).await
}

async fn cancel(api: &Api, id: &str) -> Reply {
    cancel_as(api, &api.owner(id), id, None).await
}

fn closed_at(admin: &Value) -> String {
    admin["history"].as_array().unwrap().iter().find(|h| h["to"] == "CLOSED").expect("a close entry")["at"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn e2e_a_cancelled_unpaid_order_closes_before_its_window_ends_and_gives_its_stock_and_coupon_back() {
    let api = Api::new();
    let sku = unique("cancel");
    api.put_stock(&sku, 5).await;
    let coupon = unique("cpn-cancel");
    assert_eq!(api.put_coupon(&coupon, "canceller", "2099-01-01T00:00:00Z").await.status, 200);
    let c = api.create_order(&unique("key"), &order_body("canceller", &sku, 2, Some(&coupon))).await;
    assert_eq!(c.status, 201, "{c:?}");
    let id = c.body["order_id"].as_str().unwrap().to_owned();

    let r = cancel(&api, &id).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["status"], "CLOSED");
    assert_eq!(r.body["close_reason"], "BUYER_CANCELLED");
    assert_eq!(r.body["expired_awaiting_close"], false);
    assert!(r.body["cancel_requested_at"].as_str().unwrap() < c.body["expire_at"].as_str().unwrap(), "{r:?}");

    // Closed by the cancel, before the window's end; the history says why.
    let admin = api.admin_order(&id).await.body;
    assert!(closed_at(&admin).as_str() < admin["expire_at"].as_str().unwrap(), "{admin}");
    let entry = admin["history"].as_array().unwrap().iter().find(|h| h["to"] == "CLOSED").unwrap().clone();
    assert_eq!(entry["cause"], "cancelled by the buyer, no payment attempt", "{admin}");

    // The release is the close's: stock and coupon back.
    eventually("stock and coupon back", Duration::from_secs(60), || async {
        let stock = api.stock(&sku).await;
        let view = api.get_order(&id).await.body;
        (stock["available"] == 5 && stock["reserved"] == 0 && view["coupon"]["state"] == "AVAILABLE").then_some(())
    })
    .await;
    assert_eq!(api.coupon(&coupon).await["state"], "AVAILABLE");

    // A repeated cancel answers the same and writes nothing.
    let version = api.admin_order(&id).await.body["version"].clone();
    let again = cancel(&api, &id).await;
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.body["close_reason"], "BUYER_CANCELLED");
    assert_eq!(api.admin_order(&id).await.body["version"], version, "a repeated cancel wrote to the order");
    // A cancelled order cannot be paid.
    let pay = api.start_payment(&id).await;
    assert_eq!(pay.status, 409, "{pay:?}");
    assert_eq!(pay.error_code(), "order_not_payable");
    // The stock came back once: nothing more once the expiry's wake-up has
    // come (the emulator's scheduler ticks every 10 s) and gone.
    let expire_at = order_core::domain::Timestamp::parse(c.body["expire_at"].as_str().unwrap()).unwrap();
    let now = order_core::domain::Timestamp::parse(
        &time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap(),
    )
    .unwrap();
    tokio::time::sleep(now.until(expire_at) + Duration::from_secs(20)).await;
    assert_eq!(api.stock(&sku).await["available"], 5);
    assert_eq!(api.admin_order(&id).await.body["version"], version, "the expiry's wake-up changed nothing");
}

#[tokio::test]
async fn e2e_a_cancel_of_another_buyers_order_or_with_a_body_is_refused_and_writes_nothing() {
    let api = Api::new();
    let sku = unique("cancel-foreign");
    api.put_stock(&sku, 3).await;
    let c = api.create_order(&unique("key"), &order_body("owner-of-order", &sku, 1, None)).await;
    assert_eq!(c.status, 201, "{c:?}");
    let id = c.body["order_id"].as_str().unwrap().to_owned();
    let version = api.admin_order(&id).await.body["version"].clone();

    let foreign = cancel_as(&api, "someone-else", &id, None).await;
    assert_eq!(foreign.status, 404, "{foreign:?}");
    assert_eq!(foreign.error_code(), "not_found");

    let with_body = cancel_as(&api, "owner-of-order", &id, Some(r#"{"reason": "changed my mind"}"#)).await;
    assert_eq!(with_body.status, 400, "{with_body:?}");
    assert!(with_body.body["error"]["message"].as_str().unwrap().contains("reason"), "{with_body:?}");
    let not_json = cancel_as(&api, "owner-of-order", &id, Some("cancel please")).await;
    assert_eq!(not_json.status, 400, "{not_json:?}");

    let unknown = cancel_as(&api, "owner-of-order", "ord_doesnotexist", None).await;
    assert_eq!(unknown.status, 404, "{unknown:?}");
    let malformed = cancel_as(&api, "owner-of-order", "not%20an%20id", None).await;
    assert_eq!(malformed.status, 404, "{malformed:?}");

    let after = api.admin_order(&id).await.body;
    assert_eq!(after["version"], version, "a refused cancel wrote to the order: {after}");
    assert_eq!(after["status"], "PENDING_PAYMENT");
    assert!(after.get("cancel_requested_at").is_none(), "{after}");
    assert_eq!(api.stock(&sku).await["reserved"], 1);
}

#[tokio::test]
async fn e2e_a_paid_order_cannot_be_cancelled() {
    let api = Api::new();
    let sku = unique("cancel-paid");
    api.put_stock(&sku, 2).await;
    let c = api.create_order(&unique("key"), &order_body("paid-canceller", &sku, 1, None)).await;
    let id = c.body["order_id"].as_str().unwrap().to_owned();
    let pay = api.start_payment(&id).await;
    assert_eq!(pay.status, 201, "{pay:?}");
    let settled =
        api.settle(pay.body["payment_id"].as_str().unwrap(), &json!({"outcome": "SUCCEEDED", "notify": true})).await;
    assert_eq!(settled.status, 200, "{settled:?}");
    api.wait_status(&id, "PAID", settle_timeout()).await;
    let version = api.admin_order(&id).await.body["version"].clone();

    let r = cancel(&api, &id).await;
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(r.error_code(), "order_paid");
    let after = api.admin_order(&id).await.body;
    assert_eq!(after["status"], "PAID");
    assert_eq!(after["version"], version);
}

/// The cancel and the payment's notification (a success or a failure) at
/// the same moment, on many orders: each ends PAID or CLOSED, once, as its
/// money says, with its stock sold or back, and reconciliation finds
/// nothing.
#[tokio::test]
async fn e2e_a_cancel_racing_a_payment_success_ends_in_one_outcome() {
    let n = 8;
    let api = Api::new();
    let sku = unique("cancel-race");
    api.put_stock(&sku, n as i64).await;
    // Created and paid at once, so that every race runs well inside the
    // test stack's short window.
    let orders: Vec<(String, String)> = futures::future::join_all((0..n).map(|i| {
        let (api, sku) = (api.clone(), sku.clone());
        async move {
            let c = api.create_order(&unique("key"), &order_body(&format!("cancel-racer{i}"), &sku, 1, None)).await;
            assert_eq!(c.status, 201, "{c:?}");
            let id = c.body["order_id"].as_str().unwrap().to_owned();
            let pay = api.start_payment(&id).await;
            assert_eq!(pay.status, 201, "{pay:?}");
            (id, pay.body["payment_id"].as_str().unwrap().to_owned())
        }
    }))
    .await;
    // Half the payments succeed and half fail, each notified while the
    // cancel runs: the successes must win, the failures must close.
    let races = futures::future::join_all(orders.iter().enumerate().map(|(i, (id, pay))| {
        let api = api.clone();
        async move {
            let outcome = if i % 2 == 0 { "SUCCEEDED" } else { "FAILED" };
            let settle = json!({"outcome": outcome, "notify": true});
            let (settled, cancelled) = tokio::join!(api.settle(pay, &settle), cancel(&api, id));
            // The channel refuses a payment the close already closed there.
            let succeeded = match settled.status {
                200 => settled.body["status"] == "SUCCEEDED",
                409 => false,
                _ => panic!("settle: {settled:?}"),
            };
            // `order_closing`: on a machine slow enough that the window ended
            // first, the expiry's close got there before the cancel.
            assert!(
                matches!(cancelled.status, 200 | 202)
                    || ["order_paid", "order_closing"].contains(&cancelled.error_code()),
                "cancel: {cancelled:?}"
            );
            succeeded
        }
    }))
    .await;

    let (mut paid, mut closed, mut cancelled_closes) = (0, 0, 0);
    for ((id, pay), succeeded) in orders.iter().zip(&races) {
        let v = eventually(&format!("order {id} final"), settle_timeout(), || async {
            let v = api.admin_order(id).await.body;
            (v["status"] == "PAID" || v["status"] == "CLOSED").then_some(v)
        })
        .await;
        let finals = v["history"].as_array().unwrap().iter().filter(|h| h["to"] == "PAID" || h["to"] == "CLOSED");
        assert_eq!(finals.count(), 1, "exactly one final transition: {v}");
        if v["status"] == "PAID" {
            paid += 1;
            assert!(succeeded, "PAID without a successful payment: {v}");
            assert_eq!(v["paid_by"], json!(pay));
        } else {
            closed += 1;
            assert!(v["close_reason"] == "BUYER_CANCELLED" || v["close_reason"] == "EXPIRED", "{v}");
            cancelled_closes += usize::from(v["close_reason"] == "BUYER_CANCELLED");
            // A success the close could not see first is refunded, never revived.
            if *succeeded {
                assert_eq!(v["refunds"].as_array().map(Vec::len), Some(1), "{v}");
                eventually(&format!("{id} refunded"), settle_timeout(), || async {
                    (api.admin_order(id).await.body["refunds"][0]["status"] == "REFUNDED").then_some(())
                })
                .await;
            }
        }
    }
    println!("cancel race: {n} orders, {paid} PAID, {closed} CLOSED ({cancelled_closes} by the cancel)");
    assert_eq!(paid, races.iter().filter(|s| **s).count(), "every success, and only a success, made its order PAID");
    assert!(cancelled_closes > 0, "no cancel ran inside the window: every order expired first");
    eventually("stock settled", Duration::from_secs(90), || async {
        let s = api.stock(&sku).await;
        (s["reserved"] == 0 && s["sold"] == paid && s["available"] == closed).then_some(())
    })
    .await;
    let report = reconcile().await;
    for (id, _) in &orders {
        assert!(reconcile_kinds(&report, id).is_empty(), "{id}: {report}");
    }
}
