//! End to end on the deployed local stack: `GET /orders`, a buyer's own
//! orders newest first through API Gateway and the buyer index: two pages,
//! a status filter, and the refusals (a foreign or malformed cursor, an
//! unknown status, a limit out of range).

use serde_json::Value;
use system_tests::*;

async fn list(api: &Api, who: &str, query: &str) -> Reply {
    api.send_as(who, "GET", &format!("/orders{query}"), &[], None).await
}

fn ids(r: &Reply) -> Vec<String> {
    r.body["orders"].as_array().unwrap().iter().map(|o| o["order_id"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn e2e_a_buyer_lists_their_orders_in_two_pages_and_by_status() {
    let api = Api::new();
    let sku = unique("list");
    api.put_stock(&sku, 10).await;
    // A buyer of their own for this run: the stack keeps earlier runs' orders.
    let buyer = unique("lister");
    let mut made = Vec::new();
    for _ in 0..3 {
        let c = api.create_order(&unique("key"), &order_body(&buyer, &sku, 1, None)).await;
        assert_eq!(c.status, 201, "{c:?}");
        made.push(c.body["order_id"].as_str().unwrap().to_owned());
    }
    let cancelled = api.send_as(&buyer, "POST", &format!("/orders/{}/cancel", made[1]), &[], None).await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
    let newest_first: Vec<String> = made.iter().rev().cloned().collect();

    let first = list(&api, &buyer, "?limit=2").await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(ids(&first), newest_first[..2]);
    let line = &first.body["orders"][0];
    assert_eq!(line["status"], "PENDING_PAYMENT");
    assert!(line["seconds_left"].as_u64().unwrap() <= window_seconds(), "{line}");
    assert_eq!(line["expired_awaiting_close"], false);
    assert_eq!(first.body["orders"][1]["close_reason"], "BUYER_CANCELLED");
    let cursor = first.body["next_cursor"].as_str().expect("a next page").to_owned();

    let second = list(&api, &buyer, &format!("?limit=2&cursor={cursor}")).await;
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(ids(&second), newest_first[2..]);
    assert_eq!(second.body.get("next_cursor"), None, "{second:?}");

    let closed = list(&api, &buyer, "?status=CLOSED").await;
    assert_eq!(ids(&closed), [made[1].clone()]);
    let open = list(&api, &buyer, "?status=PENDING_PAYMENT").await;
    assert_eq!(ids(&open), [made[2].clone(), made[0].clone()]);

    // Another buyer sees none of them, and cannot use this buyer's cursor.
    let stranger = unique("stranger");
    let theirs = list(&api, &stranger, "").await;
    assert_eq!(theirs.status, 200);
    assert_eq!(theirs.body["orders"], Value::Array(vec![]));
    let foreign = list(&api, &stranger, &format!("?limit=2&cursor={cursor}")).await;
    assert_eq!(foreign.status, 400, "{foreign:?}");
    assert!(foreign.body["error"]["message"].as_str().unwrap().contains("not issued to this buyer"), "{foreign:?}");
}

#[tokio::test]
async fn e2e_a_bad_list_request_gets_a_400_that_names_the_problem() {
    let api = Api::new();
    let buyer = unique("bad-lister");
    for (query, names) in [
        ("?status=OPEN", "status"),
        ("?limit=0", "limit"),
        ("?limit=101", "limit"),
        ("?limit=many", "limit"),
        ("?cursor=not-a-cursor", "cursor"),
        ("?cursor=7b7d", "cursor"),
        ("?page=2", "page"),
    ] {
        let r = list(&api, &buyer, query).await;
        assert_eq!(r.status, 400, "{query}: {r:?}");
        assert_eq!(r.error_code(), "invalid_request", "{query}");
        assert!(r.body["error"]["message"].as_str().unwrap().contains(names), "{query}: {r:?}");
    }
}
