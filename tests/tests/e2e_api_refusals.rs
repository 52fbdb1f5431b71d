//! The API's refusals through the deployed stack (HTTP API → Lambda →
//! DynamoDB): what the handlers answer to bad input, not only what the use
//! cases decide.

use serde_json::json;
use system_tests::{order_body, unique, Api};

async fn order(api: &Api, prefix: &str) -> String {
    let sku = unique(prefix);
    api.put_stock(&sku, 3).await;
    let r = api.create_order(&unique("k"), &order_body("holes", &sku, 1, None)).await;
    assert_eq!(r.status, 201, "{r:?}");
    r.body["order_id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_payment_replayed_with_its_key_answers_the_same_attempt_and_a_missing_key_is_400() {
    let api = Api::new();
    let id = order(&api, "replay").await;
    let first = api.start_payment_with_key(&id, "pay-replay").await;
    let again = api.start_payment_with_key(&id, "pay-replay").await;
    assert_eq!((first.status, again.status), (201, 201), "{first:?} {again:?}");
    assert_eq!(first.body["payment_id"], again.body["payment_id"]);
    let admin = api.admin_order(&id).await.body;
    assert_eq!(admin["payment_attempts"], 1, "{admin}");
    let missing = api
        .send_as(&api.owner(&id), "POST", &format!("/orders/{id}/payments"), &[], Some(r#"{"channel":"sandbox"}"#))
        .await;
    assert_eq!((missing.status, missing.error_code()), (400, "invalid_request"), "{missing:?}");
    assert!(missing.body["error"]["message"].as_str().unwrap().contains("Idempotency-Key"));
}

#[tokio::test]
async fn a_blind_stock_set_of_a_live_sku_answers_409_naming_what_to_send() {
    let api = Api::new();
    let sku = unique("live");
    api.put_stock(&sku, 5).await;
    let path = format!("/admin/skus/{sku}");
    let blind = api.send("PUT", &path, &[], Some(r#"{"available": 50, "price": 1299, "currency": "EUR"}"#), true).await;
    assert_eq!((blind.status, blind.error_code()), (409, "stock_exists"), "{blind:?}");
    let adjusted = api.send("PUT", &path, &[], Some(r#"{"adjust": -2}"#), true).await;
    assert_eq!((adjusted.status, &adjusted.body["available"]), (200, &json!(3)), "{adjusted:?}");
    assert_eq!(
        api.stock(&sku).await,
        json!({"sku": sku, "available": 3, "reserved": 0, "sold": 0, "price": system_tests::PRICE, "currency": "EUR"})
    );
}

#[tokio::test]
async fn a_sandbox_settle_body_of_the_wrong_type_is_refused_naming_the_field() {
    let api = Api::new();
    let id = order(&api, "settle").await;
    let pay = api.start_payment(&id).await;
    let payment_id = pay.body["payment_id"].as_str().unwrap().to_owned();
    for (body, field) in
        [(json!({"outcome": 1}), "outcome"), (json!({"outcome": "SUCCEEDED", "notify": "yes"}), "notify")]
    {
        let r = api.settle(&payment_id, &body).await;
        assert_eq!(r.status, 400, "{body}: {r:?}");
        assert!(r.body["error"]["message"].as_str().unwrap().contains(field), "{r:?}");
    }
    assert_eq!(api.get_order(&id).await.body["payments"][0]["status"], "PROCESSING", "nothing settled");
}

#[tokio::test]
async fn the_catalog_sets_the_price_a_stale_shown_price_is_409_and_a_price_change_spares_open_orders() {
    let api = Api::new();
    let sku = unique("price");
    api.put_stock(&sku, 5).await;
    let open = api.create_order(&unique("k"), &order_body("pricey", &sku, 2, None)).await;
    assert_eq!((open.status, &open.body["amount_total"]), (201, &json!(2 * system_tests::PRICE)), "{open:?}");
    let id = open.body["order_id"].as_str().unwrap().to_owned();

    let path = format!("/admin/skus/{sku}");
    let changed = api.send("PUT", &path, &[], Some(r#"{"price": 1500, "currency": "EUR"}"#), true).await;
    assert_eq!(changed.status, 200, "{changed:?}");
    let after = json!({"sku": sku, "available": 3, "reserved": 2, "sold": 0, "price": 1500, "currency": "EUR"});
    assert_eq!(changed.body, after, "only the price moved");
    let kept = api.get_order(&id).await.body;
    assert_eq!((&kept["amount_total"], &kept["items"][0]["unit_price"]), (&json!(2598), &json!(1299)), "{kept}");

    // A buyer still shown the old price: refused, naming the new one; nothing written.
    let stale = api.create_order(&unique("k"), &order_body("pricey", &sku, 1, None)).await;
    assert_eq!((stale.status, stale.error_code()), (409, "price_changed"), "{stale:?}");
    let message = stale.body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&sku) && message.contains("1500 EUR"), "{message}");
    assert_eq!(api.stock(&sku).await, after);

    // Without a shown price the catalog's is taken.
    let mut unguarded = order_body("pricey", &sku, 1, None);
    unguarded["items"][0].as_object_mut().unwrap().remove("unit_price");
    let fresh = api.create_order(&unique("k"), &unguarded).await;
    assert_eq!((fresh.status, &fresh.body["amount_total"]), (201, &json!(1500)), "{fresh:?}");

    // A price alone never creates a SKU.
    let missing = api
        .send("PUT", &format!("/admin/skus/{}", unique("none")), &[], Some(r#"{"price": 1, "currency": "EUR"}"#), true)
        .await;
    assert_eq!((missing.status, missing.error_code()), (404, "not_found"), "{missing:?}");
}
