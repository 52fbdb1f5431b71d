//! The production profile's edges, end to end on the deployed local stack
//! (dev stage): buyers are authenticated by the API's JWT authorizer and act
//! only as themselves (their own orders and coupons, whatever a body names),
//! oversized bodies are refused before any work, the sandbox's settle route
//! takes signed callers only, each payment channel's notifications are
//! checked with that channel's own secret, a price the buyer saw that is
//! not the catalog's is a 409, and a catalog price change leaves existing
//! orders and their payment amount alone.

use order_core::signature;
use serde_json::json;
use std::time::{SystemTime, UNIX_EPOCH};
use system_tests::*;

/// A fresh SKU with `units` and an order of one unit on it by `buyer`.
async fn order_of(api: &Api, buyer: &str, units: i64) -> (String, String) {
    let sku = unique("auth");
    api.put_stock(&sku, units).await;
    let r = api.create_order(&unique("key"), &order_body(buyer, &sku, 1, None)).await;
    assert_eq!(r.status, 201, "{r:?}");
    (r.body["order_id"].as_str().unwrap().to_owned(), sku)
}

#[tokio::test]
async fn without_a_valid_token_every_buyer_route_answers_401_and_writes_nothing() {
    let api = Api::new();
    let owner = unique("auth-owner");
    let (id, sku) = order_of(&api, &owner, 5).await;
    let body = order_body(&owner, &sku, 1, None).to_string();
    let forged = {
        // A real token with its payload swapped: the signature no longer holds.
        let real = api.buyer(&owner).await.access_token;
        let parts: Vec<&str> = real.split('.').collect();
        format!("{}.{}.{}", parts[0], parts[1].chars().rev().collect::<String>(), parts[2])
    };
    for auth in [None, Some("Bearer not-a-jwt".to_owned()), Some(format!("Bearer {forged}"))] {
        let mut hs = vec![("Idempotency-Key", "k-unauth")];
        if let Some(a) = &auth {
            hs.push(("Authorization", a));
        }
        for (method, path, body) in [
            ("POST", "/orders".to_owned(), Some(body.as_str())),
            ("GET", format!("/orders/{id}"), None),
            ("POST", format!("/orders/{id}/payments"), Some(r#"{"channel":"sandbox"}"#)),
        ] {
            let r = api.send(method, &path, &hs, body, false).await;
            assert_eq!(r.status, 401, "{method} {path} with {auth:?}: {r:?}");
        }
    }
    let stock = api.stock(&sku).await;
    assert_eq!((stock["available"].as_i64(), stock["reserved"].as_i64()), (Some(4), Some(1)), "{stock}");
    assert_eq!(api.admin_order(&id).await.body["payment_attempts"], 0);
}

#[tokio::test]
async fn another_buyers_order_answers_404_like_a_missing_one_and_nothing_is_written() {
    let api = Api::new();
    let (id, _) = order_of(&api, &unique("auth-victim"), 5).await;
    let intruder = unique("auth-intruder");
    let before = api.admin_order(&id).await.body;

    let read = api.send_as(&intruder, "GET", &format!("/orders/{id}"), &[], None).await;
    let missing = api.send_as(&intruder, "GET", "/orders/ord_does_not_exist", &[], None).await;
    assert_eq!((read.status, read.error_code()), (404, "not_found"), "{read:?}");
    assert_eq!((missing.status, missing.error_code()), (404, "not_found"), "{missing:?}");
    assert_eq!(
        read.body["error"]["message"].as_str().unwrap().replace(&id, "ID"),
        missing.body["error"]["message"].as_str().unwrap().replace("ord_does_not_exist", "ID"),
        "another buyer's order must look exactly like a missing one"
    );

    let pay = api
        .send_as(
            &intruder,
            "POST",
            &format!("/orders/{id}/payments"),
            &[("Idempotency-Key", "intruder-pay")],
            Some(r#"{"channel":"sandbox"}"#),
        )
        .await;
    assert_eq!((pay.status, pay.error_code()), (404, "not_found"), "{pay:?}");

    let after = api.admin_order(&id).await.body;
    assert_eq!(after["version"], before["version"], "nothing written: {after}");
    assert_eq!(after["payment_attempts"], 0, "{after}");
    assert_eq!(after["payments"], json!([]), "{after}");
}

#[tokio::test]
async fn the_order_belongs_to_the_tokens_subject_whatever_user_id_the_body_names() {
    let api = Api::new();
    let victim = unique("auth-named");
    let caller = unique("auth-caller");
    let sku = unique("auth-body");
    api.put_stock(&sku, 3).await;
    // The body names the victim; the token is the caller's.
    let body = order_body(&victim, &sku, 1, None).to_string();
    let r = api.send_as(&caller, "POST", "/orders", &[("Idempotency-Key", &unique("k"))], Some(&body)).await;
    assert_eq!(r.status, 201, "{r:?}");
    let id = r.body["order_id"].as_str().unwrap();
    let admin = api.admin_order(id).await.body;
    assert_eq!(admin["user_id"], json!(api.user_id(&caller).await), "{admin}");
    assert_ne!(admin["user_id"], json!(api.user_id(&victim).await));
    // The caller reads it; the buyer the body named cannot.
    assert_eq!(api.send_as(&caller, "GET", &format!("/orders/{id}"), &[], None).await.status, 200);
    assert_eq!(api.send_as(&victim, "GET", &format!("/orders/{id}"), &[], None).await.status, 404);
}

#[tokio::test]
async fn a_coupon_issued_to_another_buyer_cannot_be_locked_by_naming_them() {
    let api = Api::new();
    let holder = unique("auth-holder");
    let thief = unique("auth-thief");
    let sku = unique("auth-cpn");
    api.put_stock(&sku, 3).await;
    let coupon = unique("CPN");
    assert_eq!(api.put_coupon(&coupon, &holder, "2099-01-01T00:00:00Z").await.status, 200);
    // The thief names the holder in the body: the order is still the thief's.
    let body = order_body(&holder, &sku, 1, Some(&coupon)).to_string();
    let r = api.send_as(&thief, "POST", "/orders", &[("Idempotency-Key", &unique("k"))], Some(&body)).await;
    assert_eq!((r.status, r.error_code()), (409, "coupon_unavailable"), "{r:?}");
    assert_eq!(api.coupon(&coupon).await["state"], "AVAILABLE");
    assert_eq!(api.stock(&sku).await["available"], 3);
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_with_413_and_writes_nothing() {
    let api = Api::new();
    let buyer = unique("auth-big");
    let (id, sku) = order_of(&api, &buyer, 5).await;
    let huge = format!(r#"{{"currency":"EUR","items":[],"pad":"{}"}}"#, "x".repeat(20 * 1024));
    let create = api.send_as(&buyer, "POST", "/orders", &[("Idempotency-Key", "k-huge")], Some(&huge)).await;
    let pay = api
        .send_as(&buyer, "POST", &format!("/orders/{id}/payments"), &[("Idempotency-Key", "p-huge")], Some(&huge))
        .await;
    let notify = api.send("POST", "/payments/sandbox/notify", &[], Some(&huge), false).await;
    for r in [&create, &pay, &notify] {
        assert_eq!((r.status, r.error_code()), (413, "payload_too_large"), "{r:?}");
        assert!(r.body["error"]["message"].as_str().unwrap().contains("16384"), "{r:?}");
    }
    assert_eq!(api.stock(&sku).await["reserved"], 1, "only the first order holds stock");
    assert_eq!(api.admin_order(&id).await.body["payment_attempts"], 0);
}

#[tokio::test]
async fn the_sandbox_settle_route_refuses_unsigned_callers_even_in_dev() {
    let api = Api::new();
    let buyer = unique("auth-settle");
    let (id, _) = order_of(&api, &buyer, 2).await;
    let pay = api.start_payment(&id).await;
    assert_eq!(pay.status, 201, "{pay:?}");
    let path = format!("/sandbox/payments/{}/settle", pay.body["payment_id"].as_str().unwrap());
    let unsigned = api.send("POST", &path, &[], Some(r#"{"outcome":"SUCCEEDED","notify":true}"#), false).await;
    assert_eq!(unsigned.status, 403, "{unsigned:?}");
    // (On AWS a buyer's bearer token is no SigV4 signature either; the
    // emulator lets any Authorization header through an AWS_IAM route, so
    // that case is not asserted here.)
    let admin = api.admin_order(&id).await.body;
    assert_eq!(admin["status"], "PENDING_PAYMENT", "{admin}");
    assert_eq!(admin["payments"][0]["status"], "PROCESSING", "{admin}");
}

#[tokio::test]
async fn each_channel_is_checked_with_its_own_secret_only() {
    let api = Api::new();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    let body = json!({"notify_id": "n-1", "payment_id": "pay_x", "order_id": "ord_x", "channel_txn_id": "t",
                      "amount": 1, "currency": "EUR", "merchant_id": "merchant-local", "status": "SUCCEEDED"})
    .to_string();
    let signed_by_sandbox = signature::sign(webhook_secret().as_bytes(), now, body.as_bytes());
    // The sandbox's secret cannot vouch for the provider's channel (Stripe
    // on this stack), in either channel's header.
    for header in ["X-Signature", "Stripe-Signature"] {
        let provider =
            api.send("POST", "/payments/stripe/notify", &[(header, &signed_by_sandbox)], Some(&body), false).await;
        assert_eq!((provider.status, provider.error_code()), (401, "bad_signature"), "{header}: {provider:?}");
    }
    // A channel this stack does not have is not found, whatever the signature.
    let unknown =
        api.send("POST", "/payments/nowhere/notify", &[("X-Signature", &signed_by_sandbox)], Some(&body), false).await;
    assert_eq!((unknown.status, unknown.error_code()), (404, "not_found"), "{unknown:?}");
}

#[tokio::test]
async fn a_price_the_buyer_saw_that_differs_from_the_catalog_is_409_and_writes_nothing() {
    let api = Api::new();
    let buyer = unique("price-guard");
    let sku = unique("price");
    api.put_stock(&sku, 5).await; // catalog: PRICE EUR
    let stale = json!({"currency": "EUR", "items": [{"sku": sku, "qty": 1, "unit_price": PRICE - 100}]}).to_string();
    let r = api.send_as(&buyer, "POST", "/orders", &[("Idempotency-Key", &unique("k"))], Some(&stale)).await;
    assert_eq!((r.status, r.error_code()), (409, "price_changed"), "{r:?}");
    assert!(r.body["error"]["message"].as_str().unwrap().contains(&sku), "{r:?}");
    let stock = api.stock(&sku).await;
    assert_eq!((stock["available"].as_i64(), stock["reserved"].as_i64()), (Some(5), Some(0)), "{stock}");
    // Without a guard the catalog price is charged, whatever the buyer wished.
    let free = json!({"currency": "EUR", "items": [{"sku": sku, "qty": 2}]}).to_string();
    let ok = api.send_as(&buyer, "POST", "/orders", &[("Idempotency-Key", &unique("k"))], Some(&free)).await;
    assert_eq!(ok.status, 201, "{ok:?}");
    assert_eq!(
        (ok.body["amount_total"].as_i64(), ok.body["items"][0]["unit_price"].as_i64()),
        (Some(2 * PRICE), Some(PRICE))
    );
}

#[tokio::test]
async fn a_catalog_price_change_leaves_existing_orders_and_their_payment_amount_alone() {
    let api = Api::new();
    let buyer = unique("price-keep");
    let (id, sku) = order_of(&api, &buyer, 5).await;
    let changed = api
        .send(
            "PUT",
            &format!("/admin/skus/{sku}"),
            &[],
            Some(&json!({"price": PRICE * 3, "currency": "EUR"}).to_string()),
            true,
        )
        .await;
    assert_eq!(changed.status, 200, "{changed:?}");
    assert_eq!(changed.body["price"], PRICE * 3);
    let order = api.get_order(&id).await.body;
    assert_eq!(
        (order["amount_total"].as_i64(), order["items"][0]["unit_price"].as_i64()),
        (Some(PRICE), Some(PRICE)),
        "{order}"
    );
    let pay = api.start_payment(&id).await;
    assert_eq!((pay.status, pay.body["amount"].as_i64()), (201, Some(PRICE)), "{pay:?}");
    // A new order pays the new price; the stock counts were not touched by the change.
    let new = api.create_order(&unique("k"), &order_body(&buyer, &sku, 1, None)).await;
    assert_eq!((new.status, new.error_code()), (409, "price_changed"), "order_body still shows the old price: {new:?}");
    let stock = api.stock(&sku).await;
    assert_eq!((stock["available"].as_i64(), stock["reserved"].as_i64()), (Some(4), Some(1)), "{stock}");
}
