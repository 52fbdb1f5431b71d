//! A buyer's order list on the real store (DynamoDB Local, the production
//! schema with its buyer index): newest first, page by page with the index
//! key as the cursor, a status filter, only the buyer's own orders, and a
//! cursor issued to another buyer refused.

use order_core::aws::dynamo::DynamoStore;
use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::my_orders::{list_orders, ListQuery, OrderList};
use order_core::usecases::UseCaseError;
use serde_json::json;
use std::time::Duration;
use system_tests::fakes::*;
use system_tests::fixtures::{self, eur};
use system_tests::CreateAsNamed;
use system_tests::{dynamodb_local, fresh_table};

const T0: i64 = 1_800_000_000_000;
const WINDOW_MS: i64 = 60_000;

async fn store() -> DynamoStore {
    let store = fresh_table(&dynamodb_local().await).await;
    system_tests::fixtures::seed_stock(&store, &Sku::parse("A").unwrap(), 100, &eur(100)).await.unwrap();
    store
}

/// An order of `user`, created at `at`.
async fn order(store: &DynamoStore, user: &str, at: i64) -> Order {
    let uc = fixtures::creator(store, &FixedClock::at(at), Duration::from_millis(WINDOW_MS as u64), "t");
    let body = json!({"user_id": user, "currency": "EUR", "items": [{"sku": "A", "qty": 1, "unit_price": 100}]});
    uc.execute_as_named(Some(&format!("k{}", rand::random::<u64>())), body.to_string().as_bytes()).await.unwrap().order
}

fn ids(list: &OrderList) -> Vec<OrderId> {
    list.orders.iter().map(|l| l.summary.order_id.clone()).collect()
}

async fn all_pages(
    store: &DynamoStore,
    clock: &FixedClock,
    user: &UserId,
    status: Option<OrderStatus>,
    limit: u32,
) -> (Vec<OrderId>, usize) {
    let (mut out, mut pages, mut after) = (Vec::new(), 0, None);
    loop {
        let page = list_orders(store, clock, user, ListQuery { status, limit, after }).await.unwrap();
        pages += 1;
        out.extend(ids(&page));
        match page.next {
            Some(n) => after = Some(n),
            None => return (out, pages),
        }
        assert!(pages < 50, "the pages never end");
    }
}

#[tokio::test]
async fn a_buyers_orders_come_newest_first_page_by_page_and_only_their_own() {
    let store = store().await;
    let mut mine = Vec::new();
    for i in 0..5 {
        mine.push(order(&store, "lister", T0 + i * 1_000).await);
        order(&store, "someone-else", T0 + i * 1_000 + 500).await;
    }
    let user = mine[0].user_id.clone();
    let clock = FixedClock::at(T0 + 10_000);
    let newest_first: Vec<OrderId> = mine.iter().rev().map(|o| o.order_id.clone()).collect();

    let first = list_orders(&store, &clock, &user, ListQuery { status: None, limit: 2, after: None }).await.unwrap();
    assert_eq!(ids(&first), newest_first[..2]);
    assert!(first.next.is_some());
    let (every, pages) = all_pages(&store, &clock, &user, None, 2).await;
    assert_eq!(every, newest_first, "every order once, newest first");
    assert_eq!(pages, 3);

    // What a line shows: the window left, from server time.
    let line = &first.orders[0];
    assert_eq!(line.summary.status, OrderStatus::PendingPayment);
    assert_eq!(line.summary.amount_total, 100);
    assert_eq!(line.summary.expire_at, Timestamp::from_unix_millis(T0 + 4_000 + WINDOW_MS));
    assert_eq!(line.seconds_left, Some(54));
    assert!(!line.expired_awaiting_close);
    let later = FixedClock::at(T0 + 4_000 + WINDOW_MS + 1);
    let past = list_orders(&store, &later, &user, ListQuery { status: None, limit: 1, after: None }).await.unwrap();
    assert_eq!((past.orders[0].seconds_left, past.orders[0].expired_awaiting_close), (None, true));
}

#[tokio::test]
async fn a_status_filter_pages_through_the_buyers_orders_and_finds_only_that_status() {
    let store = store().await;
    let mut mine = Vec::new();
    for i in 0..6 {
        mine.push(order(&store, "filterer", T0 + i * 1_000).await);
    }
    // The second and fifth close (their window ended).
    let clock = FixedClock::at(T0 + 10 * WINDOW_MS);
    for o in [&mine[1], &mine[4]] {
        let now = store.order(&o.order_id).await.unwrap().unwrap();
        assert_eq!(store.close_unpaid(&now, clock.now()).await.unwrap(), Cas::Applied);
    }
    let user = mine[0].user_id.clone();
    let (closed, pages) = all_pages(&store, &clock, &user, Some(OrderStatus::Closed), 2).await;
    assert_eq!(closed, vec![mine[4].order_id.clone(), mine[1].order_id.clone()]);
    // Six entries read two at a time, the filter applied after: three full
    // pages, and a fourth (empty) if DynamoDB cannot tell the third was last.
    assert!((3..=4).contains(&pages), "{pages} page(s)");
    let (open, _) = all_pages(&store, &clock, &user, Some(OrderStatus::PendingPayment), 4).await;
    assert_eq!(open.len(), 4);
    assert!(!open.contains(&mine[1].order_id) && !open.contains(&mine[4].order_id));
}

#[tokio::test]
async fn a_cursor_issued_to_another_buyer_is_refused() {
    let store = store().await;
    for i in 0..3 {
        order(&store, "owner-a", T0 + i * 1_000).await;
    }
    let b = order(&store, "owner-b", T0).await;
    let a = order(&store, "owner-a", T0 + 5_000).await;
    let clock = FixedClock::at(T0 + 10_000);
    let page =
        list_orders(&store, &clock, &a.user_id, ListQuery { status: None, limit: 1, after: None }).await.unwrap();
    let cursor = page.next.expect("more than one page");
    let refused =
        list_orders(&store, &clock, &b.user_id, ListQuery { status: None, limit: 1, after: Some(cursor) }).await;
    match refused {
        Err(UseCaseError::Invalid(m)) => assert!(m.contains("not issued to this buyer"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A late payment's refund carries its buyer and its time too, so it sits
/// in the buyer's index partition: the list leaves it out, a page that ends
/// on it still hands out a cursor the API takes, and every order comes once.
#[tokio::test]
async fn a_refund_in_the_buyers_index_partition_is_skipped_and_its_key_is_a_valid_cursor() {
    use aws_sdk_dynamodb::types::AttributeValue as Av;
    let store = store().await;
    let first = order(&store, "refunded-buyer", T0).await;
    let second = order(&store, "refunded-buyer", T0 + 1_000).await;
    // Newer than both orders, as the refund writer shapes it.
    store
        .client()
        .put_item()
        .table_name(store.table())
        .item("pk", Av::S(format!("ORDER#{}", first.order_id)))
        .item("sk", Av::S("REFUND#pay_late1".into()))
        .item("entity", Av::S("REFUND".into()))
        .item("user_id", Av::S(first.user_id.to_string()))
        .item("created_at", Av::S(Timestamp::from_unix_millis(T0 + 5_000).to_string()))
        .item("status", Av::S("REFUND_PENDING".into()))
        .send()
        .await
        .unwrap();
    let clock = FixedClock::at(T0 + 10_000);
    let (mut seen, mut pages, mut cursor) = (Vec::new(), 0, None::<String>);
    loop {
        let mut params = vec![("limit".to_owned(), "1".to_owned())];
        if let Some(c) = &cursor {
            params.push(("cursor".to_owned(), c.clone()));
        }
        let page = order_core::handlers::requests::list_orders(&store, &clock, &first.user_id, &params).await.unwrap();
        pages += 1;
        seen.extend(page["orders"].as_array().unwrap().iter().map(|o| o["order_id"].as_str().unwrap().to_owned()));
        match page.get("next_cursor").and_then(|c| c.as_str()) {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
        assert!(pages < 10);
    }
    assert_eq!(seen, [second.order_id.to_string(), first.order_id.to_string()]);
    assert!(pages >= 3, "the refund's page came back empty with a cursor: {pages} pages");
}
