//! `orderctl reconcile`: runs the stack's reconcile function now (a
//! synchronous Lambda Invoke, the same run as the daily schedule's) and
//! prints its report by kind. The function reads both sides (the table
//! and the channel's ledger) and only reports; it writes nothing.

use crate::error::{CliError, Result};
use crate::output::{print_json, spinner, table};
use crate::settings::Stack;
use crate::signed::Signed;
use serde_json::Value;

/// What the run found: the process exit code says it to scripts.
pub enum Found {
    Clean,
    Discrepancies,
}

pub async fn run(stack: &Stack, json_out: bool) -> Result<Found> {
    let function = stack.get("RECONCILE_FUNCTION_NAME")?;
    let signed = Signed::new(&stack.sdk)?;
    let url = format!("{}/2015-03-31/functions/{function}/invocations", signed.endpoint("lambda"));
    let headers = [("content-type", "application/json")];
    let pb = spinner(json_out, format!("reconciling ({function} scans the table and the channel's ledger)"));
    let sent = signed.send_full("lambda", "POST", &url, &headers, b"{}".to_vec()).await;
    pb.finish_and_clear();
    let (status, response_headers, text) = sent?;
    if !(200..300).contains(&status) {
        return Err(CliError::new(
            format!("invoking {function} failed (HTTP {status}): {}", text.chars().take(300).collect::<String>()),
            "the caller needs lambda:InvokeFunction on it; check the credentials and the stack",
        ));
    }
    let report: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if response_headers.contains_key("x-amz-function-error") {
        return Err(CliError::new(
            format!("the reconcile run failed: {}", report["errorMessage"].as_str().unwrap_or(&text)),
            format!("read the function's logs (/aws/lambda/{function}); the run is safe to repeat"),
        ));
    }
    let discrepancies = report["discrepancies"].as_array().cloned().unwrap_or_default();
    if json_out {
        print_json(&report)?;
    } else {
        print_report(&report, &discrepancies);
    }
    Ok(if discrepancies.is_empty() { Found::Clean } else { Found::Discrepancies })
}

fn print_report(report: &Value, discrepancies: &[Value]) {
    let n = |k: &str| report[k].as_u64().unwrap_or(0);
    println!(
        "checked {} orders, {} payments ({}), {} SKUs; {} refund(s) still pending",
        n("orders_checked"),
        n("payments_checked"),
        if report["channel_checked"].as_bool() == Some(true) {
            "against the channel's ledger"
        } else {
            "no channel ledger: local checks only"
        },
        n("stocks_checked"),
        n("refunds_pending"),
    );
    if discrepancies.is_empty() {
        println!("clean: no discrepancy of any kind");
        return;
    }
    let mut t = table(&["kind", "count"]);
    for (kind, count) in report["counts"].as_object().into_iter().flatten() {
        t.add_row(vec![kind.clone(), count.to_string()]);
    }
    println!("{t}");
    let mut t = table(&["kind", "order", "payment / key", "detail"]);
    for d in discrepancies {
        let s = |k: &str| d[k].as_str().unwrap_or("").to_owned();
        let which = if s("payment_id").is_empty() { s("key") } else { s("payment_id") };
        t.add_row(vec![s("kind"), s("order_id"), which, s("detail")]);
    }
    println!("{t}");
}
