//! `orderctl` against the deployed local stack: the built binary, run as an
//! operator would (it finds `.local/stack.env` from the working folder),
//! with `--json` parsed for the assertions.
//!
//! The binary is `target/<profile>/orderctl`, built by `infra/local.sh
//! build` (`cargo build --workspace --bins`), which `infra/test.sh` runs
//! before the tests.

use order_core::domain::Timestamp;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;
use system_tests::*;

/// `target/<profile>/orderctl`: beside the `deps/` folder this test runs from.
fn orderctl_path() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps/<test>");
    let bin = profile_dir.join("orderctl");
    assert!(bin.is_file(), "{} is missing: run `cargo build -p orderctl` (infra/test.sh builds it)", bin.display());
    bin
}

fn orderctl(args: &[&str]) -> Output {
    std::process::Command::new(orderctl_path())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running orderctl {args:?}: {e}"))
}

/// Runs `orderctl --json …`, expecting exit code `code`, and parses stdout.
fn orderctl_json(args: &[&str], code: i32) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = orderctl(&all);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(code),
        "orderctl {all:?}: stdout {stdout}\nstderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("orderctl {all:?} printed no JSON ({e}): {stdout}"))
}

async fn seeded(api: &Api, prefix: &str, available: i64) -> String {
    let sku = unique(prefix);
    api.put_stock(&sku, available).await;
    sku
}

async fn create(api: &Api, user: &str, sku: &str) -> String {
    let r = api.create_order(&unique("key"), &order_body(user, sku, 1, None)).await;
    assert_eq!(r.status, 201, "{r:?}");
    r.body["order_id"].as_str().unwrap().to_owned()
}

/// Polls the admin view (which never nudges a close) until `done` holds.
async fn admin_until(api: &Api, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    eventually(what, settle_timeout(), || async {
        let r = api.admin_order(id).await;
        (r.status == 200 && done(&r.body)).then_some(r.body)
    })
    .await
}

/// An order whose one payment attempt failed at the channel, closed by its
/// wake-up through CLOSING (the attempt had to be checked), stock released.
async fn closed_after_a_failed_payment(api: &Api, prefix: &str) -> (String, Value) {
    let sku = seeded(api, prefix, 2).await;
    let id = create(api, &unique("octl-user"), &sku).await;
    let pay = api.start_payment(&id).await;
    assert_eq!(pay.status, 201, "{pay:?}");
    let payment_id = pay.body["payment_id"].as_str().unwrap().to_owned();
    let settled = api.settle(&payment_id, &json!({"outcome": "FAILED", "notify": true})).await;
    assert_eq!(settled.status, 200, "{settled:?}");
    let view = admin_until(api, &id, "the order to close and release its stock", |v| {
        v["status"] == "CLOSED" && v["reservations"][0]["status"] == "RELEASED"
    })
    .await;
    (id, view)
}

#[tokio::test]
async fn order_show_prints_the_timeline_of_a_closed_order_with_its_real_transitions() {
    let api = Api::new();
    let (id, view) = closed_after_a_failed_payment(&api, "octl-show").await;
    let shown = orderctl_json(&["order", "show", &id], 0);

    assert_eq!(shown["order"]["order_id"], id.as_str());
    assert_eq!(shown["order"]["status"], "CLOSED");
    let timeline = shown["timeline"].as_array().unwrap();
    let status_lines: Vec<(&str, &str)> = timeline
        .iter()
        .filter(|e| e["kind"] == "status")
        .map(|e| (e["at"].as_str().unwrap(), e["what"].as_str().unwrap()))
        .collect();
    // Every status change of the record, at its time, with its cause.
    let history = view["history"].as_array().unwrap();
    assert!(history.len() >= 3, "created, CLOSING, CLOSED: {view}");
    assert_eq!(status_lines.len(), history.len(), "{status_lines:?} vs {history:?}");
    for (h, (at, what)) in history.iter().zip(&status_lines) {
        assert_eq!(h["at"].as_str().unwrap(), *at);
        assert!(what.contains(&format!("→ {}", h["to"].as_str().unwrap())), "{what} vs {h}");
        assert!(what.contains(h["cause"].as_str().unwrap()), "{what} vs {h}");
    }
    assert!(status_lines.iter().any(|(_, w)| w.starts_with("PENDING_PAYMENT → CLOSING")), "{status_lines:?}");
    assert!(status_lines.iter().any(|(_, w)| w.starts_with("CLOSING → CLOSED")), "{status_lines:?}");
    // Oldest first.
    let times: Vec<&str> = timeline.iter().map(|e| e["at"].as_str().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // The payment attempt with the channel's evidence.
    let payment_id = view["payments"][0]["payment_id"].as_str().unwrap();
    assert!(
        timeline.iter().any(|e| e["kind"] == "evidence"
            && e["what"].as_str().unwrap().starts_with(payment_id)
            && e["what"].as_str().unwrap().contains("FAILED")),
        "{timeline:?}"
    );
    // The reservation, released, with when.
    let res = &shown["reservations"][0];
    assert_eq!(res["status"], "RELEASED", "{shown}");
    let settled_at = Timestamp::parse(res["settled_at"].as_str().expect("a settled time")).unwrap();
    let closed_at = Timestamp::parse(history.last().unwrap()["at"].as_str().unwrap()).unwrap();
    assert!(settled_at >= closed_at, "released {settled_at} before the close {closed_at}");
    // The wake-up that reached it, from close-order's log lines.
    let logs = shown["logs"].as_array().unwrap();
    assert!(
        logs.iter().any(|l| l["function"] == "close-order" && l["message"] == "close reminder handled"),
        "no close reminder among the log lines naming {id}: {logs:?} (unavailable: {})",
        shown["logs_unavailable"]
    );

    // The human form names the same facts.
    let human = orderctl(&["order", "show", &id, "--no-logs"]);
    assert!(human.status.success(), "{human:?}");
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains(&id) && text.contains("CLOSING → CLOSED") && text.contains("RELEASED"), "{text}");
}

#[tokio::test]
async fn events_lists_what_the_relay_published_for_an_order() {
    let api = Api::new();
    let sku = seeded(&api, "octl-events", 1).await;
    let id = create(&api, &unique("octl-user"), &sku).await;
    admin_until(&api, &id, "the order to close", |v| v["status"] == "CLOSED").await;
    let shown = eventually("the relay's log lines for both events", Duration::from_secs(60), || async {
        let v = orderctl_json(&["events", &id], 0);
        let published: Vec<String> =
            v["published"].as_array().unwrap().iter().map(|p| p["detail_type"].as_str().unwrap().to_owned()).collect();
        (published.contains(&"OrderPlaced".to_owned()) && published.contains(&"OrderClosed".to_owned())).then_some(v)
    })
    .await;
    let implied = shown["implied_by_records"].as_array().unwrap();
    assert!(implied.iter().all(|i| i["seen_published"] == true), "{implied:?}");
    let placed = shown["published"].as_array().unwrap().iter().find(|p| p["detail_type"] == "OrderPlaced").unwrap();
    assert_eq!(placed["event_id"], format!("OrderPlaced:{id}"));
}

#[tokio::test]
async fn check_goes_through_the_audited_route_and_its_record_names_the_caller() {
    let api = Api::new();
    let sku = seeded(&api, "octl-check", 1).await;
    let id = create(&api, &unique("octl-user"), &sku).await;
    let checked = orderctl_json(&["check", &id], 0);
    assert_eq!(checked["order_id"], id.as_str());
    assert_eq!(checked["found"], "PENDING_PAYMENT", "{checked}");
    assert_eq!(checked["status"], "PENDING_PAYMENT", "not due yet: nothing may change: {checked}");
    let by = checked["checked_by"].as_str().unwrap();
    assert!(!by.is_empty() && !by.starts_with("unknown"), "{checked}");

    // The audit item in the order's partition, read from the table itself.
    let dynamo = aws_sdk_dynamodb::Client::new(&stack_config().await);
    let items = dynamo
        .query()
        .table_name(stack_env("ORDERS_TABLE_NAME"))
        .key_condition_expression("pk = :pk AND begins_with(sk, :check)")
        .expression_attribute_values(":pk", aws_sdk_dynamodb::types::AttributeValue::S(format!("ORDER#{id}")))
        .expression_attribute_values(":check", aws_sdk_dynamodb::types::AttributeValue::S("CHECK#".into()))
        .consistent_read(true)
        .send()
        .await
        .expect("query the check items");
    assert_eq!(items.count(), 1, "{items:?}");
    let item = &items.items()[0];
    let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
    assert_eq!(text("entity"), "OPERATOR_CHECK");
    assert_eq!(text("by"), by);
    assert_eq!(text("found"), "PENDING_PAYMENT");
    assert_eq!(text("at"), checked["checked_at"].as_str().unwrap());

    // A missing order: an error that says what to do, exit 1.
    let missing = orderctl(&["check", "ord_does_not_exist"]);
    assert_eq!(missing.status.code(), Some(1));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("not found") && err.contains("what to do"), "{err}");
}

#[tokio::test]
async fn stuck_shows_a_planted_dlq_message_and_redrive_moves_it_back_to_its_source() {
    let api = Api::new();
    let sku = seeded(&api, "octl-redrive", 1).await;
    let id = create(&api, &unique("octl-user"), &sku).await;
    admin_until(&api, &id, "the order to close", |v| v["status"] == "CLOSED").await;
    // A wake-up Scheduler "could not deliver": its body is a close message.
    let trigger = unique("octl-redrive");
    let body = json!({"order_id": id, "trigger": trigger}).to_string();
    let sqs = aws_sdk_sqs::Client::new(&stack_config().await);
    sqs.send_message().queue_url(stack_env("WAKEUP_DLQ_URL")).message_body(&body).send().await.expect("plant");

    let stuck = orderctl_json(&["stuck", "--peek", "10"], 0);
    let dlqs = stuck["dead_letter_queues"].as_array().unwrap();
    let wakeup = dlqs.iter().find(|d| d["queue"] == "wakeup-dlq").expect("wakeup-dlq listed");
    assert!(wakeup["visible"].as_u64().unwrap() >= 1, "{wakeup}");
    assert!(wakeup["peeked"].as_array().unwrap().iter().any(|p| p["body"] == body.as_str()), "{wakeup}");
    assert_eq!(stuck["anything_stuck"], true);
    for d in ["close-dlq", "refund-dlq", "order-placed-dlq", "order-closed-dlq", "order-paid-dlq", "reconcile-failure"]
    {
        let q = dlqs.iter().find(|q| q["queue"] == d).unwrap_or_else(|| panic!("{d} missing: {dlqs:?}"));
        assert!(q["unavailable"].is_null(), "{q}");
    }

    let moved = orderctl_json(&["redrive", "wakeup-dlq"], 0);
    assert!(moved["moved"].as_u64().unwrap() >= 1, "{moved}");
    assert_eq!(moved["failed"], 0);
    assert!(moved["to"].as_str().unwrap() == stack_env("CLOSE_QUEUE_URL"), "{moved}");
    // Gone from the DLQ…
    let left = sqs
        .receive_message()
        .queue_url(stack_env("WAKEUP_DLQ_URL"))
        .max_number_of_messages(10)
        .visibility_timeout(0)
        .send()
        .await
        .expect("receive");
    assert!(left.messages().iter().all(|m| m.body() != Some(body.as_str())), "still in the DLQ");
    // …and delivered: close-order handled it (the order is already final).
    eventually("close-order to log the redriven reminder", Duration::from_secs(60), || async {
        let shown = orderctl_json(&["order", "show", &id], 0);
        shown["logs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["function"] == "close-order" && l["fields"].as_str().unwrap().contains(&trigger))
            .then_some(())
    })
    .await;

    // The human form prints the count.
    sqs.send_message().queue_url(stack_env("WAKEUP_DLQ_URL")).message_body(&body).send().await.expect("plant");
    let human = orderctl(&["redrive", "wakeup-dlq"]);
    assert!(human.status.success(), "{human:?}");
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("moved ") && text.contains("from wakeup-dlq"), "{text}");

    // A queue that is not one: exit 1, the valid names listed.
    let bad = orderctl(&["redrive", "nope"]);
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("close-dlq") && err.contains("refund-dlq"), "{err}");
}

#[tokio::test]
async fn reconcile_runs_the_function_and_reports_by_kind() {
    let api = Api::new();
    let sku = seeded(&api, "octl-reconcile", 1).await;
    create(&api, &unique("octl-user"), &sku).await;
    // Other tests share the stack and plant discrepancies on purpose: the
    // exit code must agree with the report, whichever it is.
    let out = orderctl(&["--json", "reconcile"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    assert!(report["orders_checked"].as_u64().unwrap() >= 1, "{report}");
    let discrepancies = report["discrepancies"].as_array().unwrap();
    let counts = report["counts"].as_object().unwrap();
    assert_eq!(out.status.code(), Some(if discrepancies.is_empty() { 0 } else { 3 }), "{report}");
    for d in discrepancies {
        assert!(counts.contains_key(d["kind"].as_str().unwrap()), "{d} not counted in {counts:?}");
    }
    // The human form: the totals, then "clean" or a table by kind (the
    // second run may find other discrepancies than the first).
    let human = orderctl(&["reconcile"]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.starts_with("checked "), "{text}");
    match human.status.code() {
        Some(0) => assert!(text.contains("clean: no discrepancy"), "{text}"),
        Some(3) => assert!(text.contains("kind") && text.contains("count"), "{text}"),
        other => panic!("exit {other:?}: {text} {}", String::from_utf8_lossy(&human.stderr)),
    }
}

#[tokio::test]
async fn stock_reads_a_skus_counts_from_the_table() {
    let api = Api::new();
    let sku = seeded(&api, "octl-stock", 5).await;
    create(&api, &unique("octl-user"), &sku).await;
    let v = orderctl_json(&["stock", &sku], 0);
    assert_eq!((v["available"].as_i64(), v["reserved"].as_i64(), v["sold"].as_i64()), (Some(4), Some(1), Some(0)));
    assert_eq!((v["price"].as_i64(), v["currency"].as_str()), (Some(PRICE), Some("EUR")));
    let missing = orderctl(&["stock", "no-such-sku-x"]);
    assert_eq!(missing.status.code(), Some(1));
}

#[tokio::test]
async fn e2e_orderctl_points_shows_the_balance_its_credits_and_the_open_order_holding_points() {
    let api = Api::new();
    let buyer = unique("ctl-points");
    let user = api.user_id(&buyer).await;
    let body = json!({"currency": "EUR", "credit": 800, "reason": "goodwill"}).to_string();
    let path = format!("/admin/buyers/{user}/points");
    let r = api.send("POST", &path, &[("Idempotency-Key", &unique("c"))], Some(&body), true).await;
    assert_eq!(r.status, 200, "{r:?}");
    let sku = unique("ctl-points");
    api.put_stock(&sku, 5).await;
    let mut order = order_body(&buyer, &sku, 1, None);
    order["points"] = json!(300);
    let created = api.create_order(&unique("key"), &order).await;
    assert_eq!(created.status, 201, "{created:?}");

    let shown = orderctl_json(&["points", &user], 0);
    assert_eq!(shown["balance"]["available"], 500, "{shown}");
    assert_eq!(shown["balance"]["held"], 300, "{shown}");
    assert_eq!(shown["credits"][0]["reason"], "goodwill");
    assert_eq!(shown["holding_orders"][0]["order_id"], created.body["order_id"]);
    assert_eq!(shown["holding_orders"][0]["points"], 300);
    assert_eq!(shown["disagreements"], json!([]), "{shown}");
    // The human form names the same facts.
    let out = orderctl(&["points", &user]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("goodwill") && text.contains("300 points by order"), "{text}");
}
