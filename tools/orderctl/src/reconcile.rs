//! `orderctl reconcile`: runs the stack's reconcile function now (a
//! synchronous Lambda Invoke of the full read) and prints its report by
//! kind. The function reads both sides (the table and the channel's
//! ledger) and only reports; it writes nothing.
//!
//! `orderctl reconcile --day D`: invokes the day run's coordinator for D
//! (as the daily schedule does for yesterday), then reads the run's piece
//! reports from the table and merges them with `order_core`'s merge until
//! every piece has reported or `--wait` runs out. `--show` only reads.

use crate::error::{CliError, Result};
use crate::output::{print_json, spinner, table};
use crate::settings::Stack;
use crate::signed::Signed;
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::Day;
use order_core::usecases::reconcile_day::{day_report, DayReport};
use serde_json::Value;
use std::time::{Duration, Instant};

/// What the run found: the process exit code says it to scripts.
pub enum Found {
    Clean,
    Discrepancies,
}

/// A synchronous invoke of one of the stack's functions, its answer as JSON.
async fn invoke(stack: &Stack, function: &str, body: &Value, spin: Option<String>) -> Result<Value> {
    let signed = Signed::new(&stack.sdk)?;
    let url = format!("{}/2015-03-31/functions/{function}/invocations", signed.endpoint("lambda"));
    let headers = [("content-type", "application/json")];
    let pb = spinner(spin.is_none(), spin.unwrap_or_default());
    let sent = signed.send_full("lambda", "POST", &url, &headers, body.to_string().into_bytes()).await;
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
    Ok(report)
}

pub async fn run(stack: &Stack, json_out: bool) -> Result<Found> {
    let function = stack.get("RECONCILE_FUNCTION_NAME")?;
    let spin = (!json_out).then(|| format!("reconciling ({function} scans the table and the channel's ledger)"));
    let report = invoke(stack, function, &Value::Object(Default::default()), spin).await?;
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
    print_report_body(report, discrepancies);
}

fn print_report_body(report: &Value, discrepancies: &[Value]) {
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

/// `--day`: start the day's run (unless `show`), wait for its pieces, print
/// the merged report. Pieces still missing at the end are an error (exit
/// 1), after the report is printed.
pub async fn day(stack: &Stack, day: &str, show: bool, wait: Duration, json_out: bool) -> Result<Found> {
    let day = Day::parse(day)
        .map_err(|e| CliError::new(format!("{day:?} is not a day: {e}"), "give it as YYYY-MM-DD (UTC)"))?;
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&stack.sdk), stack.table()?);
    let run_id = match show {
        true => None,
        false => {
            let function = stack.get("RECONCILE_DAY_FUNCTION_NAME")?;
            let spin = (!json_out).then(|| format!("starting the run of {day} ({function})"));
            let run = invoke(stack, function, &serde_json::json!({ "day": day }), spin).await?;
            Some(run["run_id"].as_str().map(str::to_owned).ok_or_else(|| {
                CliError::new(format!("{function} answered without a run id: {run}"), "check the stack's version")
            })?)
        }
    };
    let report = wait_for(&store, day, run_id.as_deref(), if show { Duration::ZERO } else { wait }, json_out).await?;
    if json_out {
        print_json(&report)?;
    } else {
        print_day(&report);
    }
    if !report.complete {
        return Err(CliError::new(
            format!("the run {} of {day} is missing {}", report.run_id, report.pieces_missing.join(", ")),
            "docs/runbooks.md, ReconcilePieceDLQAlarm; `orderctl reconcile --day DAY --show` again later",
        ));
    }
    Ok(if report.discrepancies.is_empty() { Found::Clean } else { Found::Discrepancies })
}

/// The run's report, read every 2 s until complete or `wait` has passed;
/// progress on stderr.
async fn wait_for(
    store: &DynamoStore,
    day: Day,
    run_id: Option<&str>,
    wait: Duration,
    quiet: bool,
) -> Result<DayReport> {
    let until = Instant::now() + wait;
    loop {
        let report = day_report(store, day, run_id).await?.ok_or_else(|| {
            CliError::new(format!("no run of {day} is recorded"), format!("start one: orderctl reconcile --day {day}"))
        })?;
        let total = report.pieces_missing.len();
        if report.complete || Instant::now() >= until {
            return Ok(report);
        }
        if !quiet {
            eprintln!("{day} run {}: {total} piece(s) still to report", report.run_id);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn print_day(r: &DayReport) {
    println!(
        "{} (run {}): {} orders and {} payments checked ({}), {} SKUs; {} items read, {:.1} read units",
        r.day,
        r.run_id,
        r.orders_checked,
        r.payments_checked,
        if r.channel_checked { "against the channel's statement of the day" } else { "local checks only" },
        r.stocks_checked,
        r.cost.items,
        r.cost.capacity_units,
    );
    if !r.complete {
        println!("INCOMPLETE: pieces missing: {} (stock comparison skipped)", r.pieces_missing.join(", "));
    }
    let as_json = serde_json::to_value(r).unwrap_or(Value::Null);
    let discrepancies = as_json["discrepancies"].as_array().cloned().unwrap_or_default();
    print_report_body(&as_json, &discrepancies);
}
