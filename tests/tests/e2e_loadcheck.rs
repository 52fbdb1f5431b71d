//! The invariant run of issue 9 (`tools/loadcheck`) in the test command,
//! small: a few hundred orders of the whole scenario mix with two fault
//! drills on the deployed local stack, through the built binary exactly as
//! an operator runs it. Then the check is shown to be able to fail: one
//! record of the finished run is changed by a direct write and the check,
//! run again over the same scope, must exit non-zero naming a violation.
//! A second, smaller run pays through Stripe (localstripe) and is failed
//! the same way by a refund made at Stripe behind the system's back.

use aws_sdk_dynamodb::types::AttributeValue as Av;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use system_tests::*;

fn loadcheck_binary() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    let bin = target.join("debug/loadcheck");
    assert!(bin.exists(), "{} is missing: `infra/local.sh build` builds every workspace binary", bin.display());
    bin
}

fn run(args: &[&str]) -> (i32, String) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(loadcheck_binary())
        .args(args)
        .current_dir(&root)
        .output()
        .unwrap_or_else(|e| panic!("running loadcheck: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("loadcheck {}:\n{stdout}{stderr}", args.join(" "));
    (out.status.code().unwrap_or(-1), stdout)
}

/// Adds `delta` to a SKU's `available` count behind the API's back.
async fn tamper_stock(sku: &str, delta: i64) {
    let ddb = aws_sdk_dynamodb::Client::new(&stack_config().await);
    ddb.update_item()
        .table_name(stack_env("TABLE_NAME"))
        .key("pk", Av::S(format!("SKU#{sku}")))
        .key("sk", Av::S("STOCK".into()))
        .update_expression("SET available = available + :d")
        .expression_attribute_values(":d", Av::N(delta.to_string()))
        .send()
        .await
        .expect("tampering with the stock record");
}

#[tokio::test]
async fn a_small_loadcheck_with_two_drills_holds_every_invariant_and_a_tampered_record_fails_the_check() {
    let out = std::env::temp_dir().join(unique("loadcheck"));
    let out_s = out.to_str().unwrap().to_owned();
    let (code, stdout) = run(&[
        "--orders",
        "150",
        "--rate",
        "10",
        "--concurrency",
        "8",
        "--drills",
        "channel-not-found,relay-fails",
        "--drill-share",
        "0.06",
        "--drain-timeout",
        "240",
        "--quiet",
        "--out",
        &out_s,
    ]);
    assert_eq!(code, 0, "the run must pass");
    assert!(stdout.contains("result: PASS"), "{stdout}");
    for scenario in
        ["never_paid", "paid_in_time", "forged_notifications", "drill:channel_not_found", "drill:relay_fails"]
    {
        assert!(stdout.lines().any(|l| l.starts_with(scenario)), "the summary has a line for {scenario}");
    }
    // The relay drill was checked at a subscriber of the bus, not skipped:
    // its orders' final events were counted there.
    assert!(
        stdout.lines().any(|l| l.trim_start().starts_with("final_event_undelivered") && l.contains(" pass ")),
        "{stdout}"
    );
    assert!(stdout.contains("events.OrderClosed="), "{stdout}");
    for file in ["delays.csv", "delays.png", "scope.json", "summary.txt"] {
        assert!(out.join(file).exists(), "{file} written");
    }
    let csv = std::fs::read_to_string(out.join("delays.csv")).unwrap();
    assert!(csv.lines().count() > 100, "one line per order: {csv}");

    // One unit appears out of nowhere on a SKU of the run: stock is no
    // longer conserved, and the check must say so.
    let scope: Value = serde_json::from_str(&std::fs::read_to_string(out.join("scope.json")).unwrap()).unwrap();
    let sku = scope["skus"].as_object().unwrap().keys().next().unwrap().clone();
    tamper_stock(&sku, 1).await;
    let scope_path = out.join("scope.json");
    let (code, stdout) = run(&["--check", scope_path.to_str().unwrap()]);
    tamper_stock(&sku, -1).await;
    assert_eq!(code, 1, "a tampered stock record fails the check");
    assert!(stdout.contains("VIOLATION") && stdout.contains(&sku), "{stdout}");
    // The run removed its subscriber queue when it ended: the re-check says
    // it skipped that invariant rather than passing it.
    assert!(stdout.contains("final_event_undelivered skipped"), "{stdout}");

    // A relay batch given up on (the mapping's on-failure record: a shard
    // and sequence numbers, no order id) arrives after the run started: the
    // check must fail on it. Against a scope that started after the message
    // was sent, the same message is someone else's and the check passes,
    // which shows the message's SentTimestamp is what decides.
    let mut later = scope.clone();
    let later_path = out.join("scope-later.json");
    let planted = StreamFailure::plant().await;
    let (code, stdout) = run(&["--check", scope_path.to_str().unwrap()]);
    let in_a_minute = time::OffsetDateTime::now_utc() + time::Duration::minutes(1);
    later["started_at"] = in_a_minute.format(&time::format_description::well_known::Rfc3339).unwrap().into();
    std::fs::write(&later_path, later.to_string()).unwrap();
    let (later_code, later_stdout) = run(&["--check", later_path.to_str().unwrap()]);
    planted.remove().await;
    assert_eq!(code, 1, "a stream failure during the run fails the check");
    assert!(stdout.contains("VIOLATION stream_failure STREAM_FAILURE_QUEUE_URL"), "{stdout}");
    assert!(stdout.contains("shardId-e2e"), "the finding says what the message says: {stdout}");
    assert_eq!(later_code, 0, "a message sent before the scope's start is not the run's: {later_stdout}");
    let _ = std::fs::remove_dir_all(&out);
}

#[tokio::test]
async fn a_small_loadcheck_paying_through_stripe_holds_every_invariant_and_a_refund_behind_its_back_fails_the_check() {
    // The same run with the orders paying at localstripe as a buyer's
    // Stripe.js would, and the late-success drill (its payment refunded at
    // Stripe); the check reads every intent and refund back from Stripe.
    let out = std::env::temp_dir().join(unique("loadcheck-stripe"));
    let out_s = out.to_str().unwrap().to_owned();
    let (code, stdout) = run(&[
        "--channel",
        "stripe",
        "--orders",
        "30",
        "--rate",
        "5",
        "--concurrency",
        "8",
        "--drills",
        "channel-not-found",
        "--drill-share",
        "0.1",
        "--drain-timeout",
        "240",
        "--quiet",
        "--out",
        &out_s,
    ]);
    assert_eq!(code, 0, "the run must pass");
    assert!(stdout.contains("result: PASS"), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("drill:channel_not_found")), "{stdout}");
    for inv in ["stripe_intent_state", "stripe_refunds", "paid_without_success", "funds_identity"] {
        assert!(stdout.lines().any(|l| l.trim_start().starts_with(inv) && l.contains(" pass ")), "{inv}: {stdout}");
    }
    assert!(stdout.contains("stripe.intent.succeeded=") && stdout.contains("stripe.intent.canceled="), "{stdout}");
    let scope_path = out.join("scope.json");

    // A PAID order's charge refunded at Stripe behind the system's back:
    // the buyer has the money back and keeps the goods, and the check must say so.
    let csv = std::fs::read_to_string(out.join("delays.csv")).unwrap();
    let paid = csv
        .lines()
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|fields| fields.get(2) == Some(&"PAID"))
        .map(|fields| fields[0].to_owned())
        .expect("a PAID order in the run");
    let admin = Api::new().admin_order(&paid).await.body;
    let attempt = admin["payments"].as_array().unwrap().iter().find(|p| p["payment_id"] == admin["paid_by"]).unwrap();
    let charge = attempt["channel_txn_id"].as_str().expect("the paying attempt names its charge");
    let (status, refund) = stripe::Stripe::new().call("POST", "/v1/refunds", &[("charge", charge)]).await;
    assert_eq!(status, 200, "{refund}");
    let (code, stdout) = run(&["--check", scope_path.to_str().unwrap()]);
    assert_eq!(code, 1, "a refund at Stripe of a paying charge fails the check");
    assert!(stdout.contains("stripe check: reading"), "the check alone reads Stripe again: {stdout}");
    assert!(stdout.contains(&format!("VIOLATION stripe_refunds {paid}")), "{stdout}");
    assert!(stdout.contains(&format!("VIOLATION funds_identity {paid}")), "{stdout}");
    let _ = std::fs::remove_dir_all(&out);
}

/// A stream-failure-shaped message on the stack's `StreamFailureQueue`,
/// taken off again afterwards (other runs on the stack must not see it).
struct StreamFailure {
    sqs: aws_sdk_sqs::Client,
    url: String,
    body: String,
}

impl StreamFailure {
    async fn plant() -> Self {
        let sqs = aws_sdk_sqs::Client::new(&stack_config().await);
        let url = stack_env("STREAM_FAILURE_QUEUE_URL");
        let body = serde_json::json!({
            "requestContext": {"condition": "RecordAgeExceeded", "functionArn": unique("lc-relay")},
            "DDBStreamBatchInfo": {"shardId": "shardId-e2e", "startSequenceNumber": "1", "endSequenceNumber": "2",
                "batchSize": 2, "approximateArrivalOfFirstRecord": "2026-11-30T00:00:00Z"}
        })
        .to_string();
        sqs.send_message().queue_url(&url).message_body(&body).send().await.expect("planting a stream failure");
        Self { sqs, url, body }
    }

    async fn remove(self) {
        // The check only peeked (visibility 0), so the message is there.
        for _ in 0..20 {
            let got = self
                .sqs
                .receive_message()
                .queue_url(&self.url)
                .max_number_of_messages(10)
                .send()
                .await
                .expect("receive");
            let mut removed = false;
            for m in got.messages().iter().filter(|m| m.body() == Some(self.body.as_str())) {
                self.sqs
                    .delete_message()
                    .queue_url(&self.url)
                    .receipt_handle(m.receipt_handle().unwrap())
                    .send()
                    .await
                    .expect("removing the planted message");
                removed = true;
            }
            if removed {
                return;
            }
        }
        panic!("the planted stream failure message was not found again");
    }
}
