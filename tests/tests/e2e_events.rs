//! Integration events end to end on the local stack: the relay turns the
//! table's business facts into versioned events on the order bus; every
//! lifecycle produces exactly its event types, with increasing versions,
//! each valid against its schema in `events/schemas/`; a relay retry loses
//! nothing and duplicates no effect; the example subscriber stack
//! (`infra/subscriber.yaml`) receives its buyers' events, the heads-up
//! before expiry (`OrderExpiringSoon`) among them, once and before the
//! close, and none for an order paid before it.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use system_tests::*;

/// A subscriber of one buyer's events: a queue and a rule on the bus, as
/// another service would set them up (`infra/subscriber.yaml` is the same
/// thing as a template).
struct Subscriber {
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    events: Vec<Value>,
}

impl Subscriber {
    async fn for_user(user: &str) -> Self {
        let config = stack_config().await;
        let sqs = aws_sdk_sqs::Client::new(&config);
        let eb = aws_sdk_eventbridge::Client::new(&config);
        let name = unique("sub");
        let queue_url = sqs.create_queue().queue_name(&name).send().await.unwrap().queue_url.unwrap();
        let arn = sqs
            .get_queue_attributes()
            .queue_url(&queue_url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap()[&aws_sdk_sqs::types::QueueAttributeName::QueueArn]
            .clone();
        let bus = stack_env("ORDER_EVENT_BUS_NAME");
        eb.put_rule()
            .name(&name)
            .event_bus_name(&bus)
            .event_pattern(json!({"source": ["order-expiry"], "detail": {"user_id": [user]}}).to_string())
            .send()
            .await
            .unwrap();
        eb.put_targets()
            .rule(&name)
            .event_bus_name(&bus)
            .targets(aws_sdk_eventbridge::types::Target::builder().id("q").arn(arn).build().unwrap())
            .send()
            .await
            .unwrap();
        Self { sqs, queue_url, events: Vec::new() }
    }

    async fn existing(queue_url: String) -> Self {
        Self { sqs: aws_sdk_sqs::Client::new(&stack_config().await), queue_url, events: Vec::new() }
    }

    /// Receives until the events of `order_id` include every type in
    /// `want` (or the timeout passes), and returns that order's events.
    async fn wait_for(&mut self, order_id: &str, want: &[&str], timeout: Duration) -> Vec<Value> {
        let start = std::time::Instant::now();
        loop {
            let out = self
                .sqs
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .send()
                .await
                .unwrap();
            for m in out.messages.unwrap_or_default() {
                self.events.push(serde_json::from_str(m.body.as_deref().unwrap()).unwrap());
                self.sqs
                    .delete_message()
                    .queue_url(&self.queue_url)
                    .receipt_handle(m.receipt_handle.unwrap())
                    .send()
                    .await
                    .unwrap();
            }
            let mine: Vec<Value> =
                self.events.iter().filter(|e| e["detail"]["order_id"] == order_id).cloned().collect();
            let types: Vec<&str> = mine.iter().filter_map(|e| e["detail-type"].as_str()).collect();
            if want.iter().all(|w| types.contains(w)) || start.elapsed() > timeout {
                return mine;
            }
        }
    }
}

/// One event per distinct `event_id` (duplicates are allowed by the
/// contract), in order of version; each valid against its schema.
fn distinct_valid(events: &[Value]) -> Vec<Value> {
    let mut by_id = BTreeMap::new();
    for e in events {
        validate_event(e);
        assert_eq!(e["source"], "order-expiry");
        by_id.entry(e["detail"]["event_id"].as_str().unwrap().to_owned()).or_insert_with(|| e.clone());
    }
    let mut out: Vec<Value> = by_id.into_values().collect();
    out.sort_by_key(|e| {
        (e["detail"]["version"].as_u64().unwrap(), e["detail"]["occurred_at"].as_str().unwrap().to_owned())
    });
    out
}

fn types(events: &[Value]) -> Vec<String> {
    events.iter().map(|e| e["detail-type"].as_str().unwrap().to_owned()).collect()
}

/// The versions of an order's state events increase. The heads-up is a
/// reminder, not a state: it carries the version the order had when
/// noticed (the notice is no state change), so it is left out.
fn versions_increase(events: &[Value]) {
    let order_events: Vec<u64> = events
        .iter()
        .filter(|e| e["detail-type"].as_str().unwrap().starts_with("Order") && e["detail-type"] != "OrderExpiringSoon")
        .map(|e| e["detail"]["version"].as_u64().unwrap())
        .collect();
    assert!(order_events.windows(2).all(|w| w[0] < w[1]), "versions {order_events:?}");
}

async fn seeded(api: &Api, prefix: &str) -> String {
    let sku = unique(prefix);
    api.put_stock(&sku, 3).await;
    sku
}

/// The stack's heads-up lead (`ExpiringSoonLeadSeconds`).
fn lead_seconds() -> u64 {
    deployed_number("EXPIRING_SOON_LEAD_SECONDS")
}

/// Two orders of `user` for `sku` made under a published rule giving it a
/// window of twice the lead (the shortest that gets a heads-up). The rules
/// are shared with the tests running beside this one, which may publish
/// in between: then both are made again until both are under this rule.
async fn two_orders_with_a_heads_up_window(api: &Api, user: &str, sku: &str) -> (Value, Value) {
    let window = 2 * lead_seconds();
    for _ in 0..5 {
        let body = json!({"rules": [{"sku": sku, "window_seconds": window}]}).to_string();
        let published = api.send("PUT", "/admin/expiry-rules", &[], Some(&body), true).await;
        assert_eq!(published.status, 200, "{published:?}");
        let mut orders = Vec::new();
        for _ in 0..2 {
            let mut body = order_body(user, sku, 1, None);
            body["items"][0].as_object_mut().unwrap().remove("unit_price");
            let r = api.create_order(&unique("key"), &body).await;
            assert_eq!(r.status, 201, "{r:?}");
            orders.push(r.body);
        }
        if orders.iter().all(|o| o["expiry_rule_version"] == published.body["expiry_rule_version"]) {
            let second = orders.pop().unwrap();
            return (orders.pop().unwrap(), second);
        }
    }
    panic!("another publication kept coming between this test's publication and its orders");
}

fn at(v: &Value) -> time::OffsetDateTime {
    time::OffsetDateTime::parse(v.as_str().unwrap(), &time::format_description::well_known::Rfc3339).unwrap()
}

/// The example subscriber (infra/subscriber.yaml, deployed by the local run
/// for one buyer) is read by this test alone: two tests reading one queue
/// would take each other's messages.
#[tokio::test]
async fn an_unpaid_order_publishes_placed_expiring_soon_then_closed_to_the_example_subscriber_and_a_paid_one_no_heads_up(
) {
    let api = Api::new();
    let sku = seeded(&api, "ev-unpaid").await;
    let user = stack_env("SUBSCRIBER_BUYER");
    let (unpaid, paid) = two_orders_with_a_heads_up_window(&api, &user, &sku).await;
    let id = unpaid["order_id"].as_str().unwrap().to_owned();
    let paid_id = paid["order_id"].as_str().unwrap().to_owned();
    let pay = api.start_payment(&paid_id).await;
    assert_eq!(pay.status, 201, "{pay:?}");
    let s =
        api.settle(pay.body["payment_id"].as_str().unwrap(), &json!({"outcome": "SUCCEEDED", "notify": true})).await;
    assert_eq!(s.status, 200, "{s:?}");

    let mut sub = Subscriber::existing(stack_env("SUBSCRIBER_QUEUE_URL")).await;
    let timeout = Duration::from_secs(2 * lead_seconds()) + settle_timeout();
    let got = sub.wait_for(&id, &["OrderPlaced", "OrderExpiringSoon", "OrderClosed"], timeout).await;
    let events = distinct_valid(&got);
    assert_eq!(types(&events), ["OrderPlaced", "OrderExpiringSoon", "OrderClosed"], "{events:#?}");
    versions_increase(&events);
    // The heads-up arrived once (one event id, however often delivered),
    // before the close, about the lead before expire_at.
    let received: Vec<&str> = got.iter().filter_map(|e| e["detail-type"].as_str()).collect();
    let first = |t: &str| received.iter().position(|r| *r == t).unwrap();
    assert!(first("OrderExpiringSoon") < first("OrderClosed"), "received in the order {received:?}");
    let heads_up = &events[1]["detail"];
    assert_eq!(heads_up["event_id"], json!(format!("OrderExpiringSoon:{id}")));
    assert_eq!((&heads_up["expire_at"], &heads_up["amount_total"]), (&unpaid["expire_at"], &unpaid["amount_total"]));
    let before = (at(&unpaid["expire_at"]) - at(&heads_up["occurred_at"])).whole_seconds();
    // A pass a minute, which looks a minute ahead; the emulator's scheduler
    // ticks every 10 s.
    let lead = lead_seconds() as i64;
    assert!(before > 0 && before <= lead + 60 + 15, "noticed {before} s before expire_at (lead {lead} s)");
    let admin = api.admin_order(&id).await.body;
    assert_eq!(admin["expiring_soon_at"], heads_up["occurred_at"], "the notice is on the record");

    let placed = &events[0]["detail"];
    assert_eq!((placed["version"].clone(), placed["user_id"].clone()), (json!(1), json!(api.user_id(&user).await)));
    assert_eq!(placed["expire_at"], unpaid["expire_at"]);
    let closed = &events[2]["detail"];
    assert_eq!(closed["items"][0]["qty"], 1);
    assert!(closed["cause"].as_str().unwrap().contains("expired"), "{closed}");
    // The fact's own time, not the publication time: the CLOSED history entry.
    let into_closed = admin["history"].as_array().unwrap().iter().find(|h| h["to"] == "CLOSED").unwrap().clone();
    assert_eq!(closed["occurred_at"], into_closed["at"]);
    assert_eq!(closed["version"], admin["version"]);

    // The paid order, made with it, is past its heads-up time by now: it
    // published its payment and never a heads-up.
    let got = sub.wait_for(&paid_id, &["OrderPlaced", "OrderPaid"], settle_timeout()).await;
    let paid_events = distinct_valid(&got);
    assert_eq!(types(&paid_events), ["OrderPlaced", "OrderPaid"], "{paid_events:#?}");
    assert_eq!(api.admin_order(&paid_id).await.body["expiring_soon_at"], Value::Null);
}

#[tokio::test]
async fn a_paid_order_publishes_placed_then_paid_and_no_close() {
    let api = Api::new();
    let sku = seeded(&api, "ev-paid").await;
    let user = unique("ev-paid-user");
    let mut sub = Subscriber::for_user(&api.user_id(&user).await).await;
    let r = api.create_order(&unique("key"), &order_body(&user, &sku, 1, None)).await;
    let id = r.body["order_id"].as_str().unwrap().to_owned();
    let pay = api.start_payment(&id).await;
    assert_eq!(pay.status, 201, "{pay:?}");
    let payment_id = pay.body["payment_id"].as_str().unwrap().to_owned();
    let s = api.settle(&payment_id, &json!({"outcome": "SUCCEEDED", "notify": true})).await;
    assert_eq!(s.status, 200, "{s:?}");
    let got = sub.wait_for(&id, &["OrderPlaced", "OrderPaid"], settle_timeout()).await;
    // Past its window too: a paid order never produces OrderClosed.
    tokio::time::sleep(Duration::from_secs(window_seconds() + 5)).await;
    let got = [got, sub.wait_for(&id, &["never"], Duration::from_secs(2)).await].concat();
    let events = distinct_valid(&got);
    assert_eq!(types(&events), ["OrderPlaced", "OrderPaid"], "{events:#?}");
    versions_increase(&events);
    assert_eq!(events[1]["detail"]["paid_by"], json!(payment_id));
    assert_eq!(events[1]["detail"]["amount_total"], r.body["amount_total"]);
}

#[tokio::test]
async fn a_late_payment_publishes_closed_then_refund_requested_then_completed() {
    let api = Api::new();
    let sku = seeded(&api, "ev-late").await;
    let user = unique("ev-late-user");
    let mut sub = Subscriber::for_user(&api.user_id(&user).await).await;
    let r = api.create_order(&unique("key"), &order_body(&user, &sku, 1, None)).await;
    let id = r.body["order_id"].as_str().unwrap().to_owned();
    let pay = api.start_payment(&id).await;
    let payment_id = pay.body["payment_id"].as_str().unwrap().to_owned();
    // The channel does not know the payment when the close asks; later the
    // money moves and the provider notifies: a refund.
    api.settle(&payment_id, &json!({"faults": {"query": "not_found"}})).await;
    api.wait_status(&id, "CLOSED", settle_timeout() + Duration::from_secs(60)).await;
    let s = api.settle(&payment_id, &json!({"outcome": "SUCCEEDED", "notify": true})).await;
    assert_eq!(s.status, 200, "{s:?}");
    let want = ["OrderPlaced", "OrderClosed", "LatePaymentRefundRequested", "RefundCompleted"];
    let got = sub.wait_for(&id, &want, Duration::from_secs(120)).await;
    let events = distinct_valid(&got);
    assert_eq!(types(&events), want, "{events:#?}");
    versions_increase(&events);
    for e in &events[2..] {
        assert_eq!(e["detail"]["payment_id"], json!(payment_id));
        assert_eq!(e["detail"]["amount"], r.body["amount_total"]);
    }
}

#[tokio::test]
async fn a_relay_retry_loses_no_event_and_duplicates_no_effect() {
    let api = Api::new();
    let sku = seeded(&api, "ev-relay").await;
    // The relay's first publish of every event of this buyer's orders fails
    // (fault switch, dev stage only); its retry must deliver each.
    let user = unique("fault-relay-u");
    let mut sub = Subscriber::for_user(&api.user_id(&user).await).await;
    let r = api.create_order(&unique("key"), &order_body(&user, &sku, 2, None)).await;
    let id = r.body["order_id"].as_str().unwrap().to_owned();
    let got = sub.wait_for(&id, &["OrderPlaced", "OrderClosed"], settle_timeout()).await;
    let events = distinct_valid(&got);
    assert_eq!(types(&events), ["OrderPlaced", "OrderClosed"], "{events:#?}");
    let stock = eventually("stock back once", Duration::from_secs(90), || async {
        let s = api.stock(&sku).await;
        (s["reserved"] == 0).then_some(s)
    })
    .await;
    assert_eq!(stock["available"], 3, "released exactly once");
    let admin = api.admin_order(&id).await.body;
    assert_eq!(admin["history"].as_array().unwrap().iter().filter(|h| h["to"] == "CLOSED").count(), 1);
}

#[test]
fn the_table_stream_has_at_most_two_readers() {
    let template = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml")).unwrap();
    // Stream readers are explicit event source mappings: a SAM `DynamoDB`
    // event would attach a managed policy on every stream of the account.
    let sam_events = template.lines().filter(|l| l.trim() == "Type: DynamoDB").count();
    assert_eq!(sam_events, 0, "a SAM DynamoDB event; declare an AWS::Lambda::EventSourceMapping");
    let readers = template.lines().filter(|l| l.trim() == "EventSourceArn: !GetAtt OrdersTable.StreamArn").count();
    assert!((1..=2).contains(&readers), "{readers} stream readers; AWS advises at most two per shard");
}
