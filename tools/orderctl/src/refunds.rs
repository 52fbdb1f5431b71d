//! `orderctl refunds failed` and `orderctl refunds resolve`: the refunds
//! given up on (REFUND_FAILED) that wait for a person, read from the due
//! index's failed refunds' partition, and the record that one was dealt
//! with (refunded by hand at the provider, or found not owed), which takes
//! it out of that partition and so clears `RefundsFailedAlarm` once it is
//! the last one.

use crate::error::{CliError, Result};
use crate::output::{print_json, table};
use crate::settings::Stack;
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::{OrderId, PaymentId, RefundStatus};
use order_core::ports::{Clock, SystemClock};
use order_core::store::{Cas, PaymentStore};
use serde_json::json;

fn store(stack: &Stack) -> Result<DynamoStore> {
    Ok(DynamoStore::new(aws_sdk_dynamodb::Client::new(&stack.sdk), stack.table()?))
}

pub async fn failed(stack: &Stack, json_out: bool) -> Result<()> {
    let store = store(stack)?;
    let mut rows = Vec::new();
    for (order_id, payment_id) in store.failed_refunds().await? {
        match store.refund(&order_id, &payment_id).await? {
            Some(r) => rows.push(r),
            None => eprintln!("orderctl: {order_id}/{payment_id} is in the failed refunds' index but has no refund"),
        }
    }
    if json_out {
        return print_json(&json!({ "failed_refunds": rows }));
    }
    if rows.is_empty() {
        println!("no refund waits for a person");
        return Ok(());
    }
    let mut t = table(&["order", "payment", "amount", "tries", "last error"]);
    for r in &rows {
        let amount = format!("{} {}", r.amount, r.currency);
        let error = r.last_error.clone().unwrap_or_default().chars().take(80).collect::<String>();
        t.add_row(vec![r.order_id.to_string(), r.payment_id.to_string(), amount, r.tries.to_string(), error]);
    }
    println!("{t}");
    println!("runbook: RefundsFailedAlarm (orderctl refunds resolve ORDER PAYMENT --note … once dealt with)");
    Ok(())
}

pub async fn resolve(stack: &Stack, order_id: &str, payment_id: &str, note: &str, by: Option<String>) -> Result<()> {
    let bad = |what: &str, e: String| {
        CliError::new(format!("{what} is not valid: {e}"), "copy it from `orderctl refunds failed`")
    };
    let order_id = OrderId::parse(order_id).map_err(|e| bad("the order id", e.0))?;
    let payment_id = PaymentId::parse(payment_id).map_err(|e| bad("the payment id", e.0))?;
    if note.trim().is_empty() {
        return Err(CliError::new(
            "--note is empty",
            "say how the refund was dealt with (e.g. refunded by hand, re_…)",
        ));
    }
    let by = by.or_else(|| std::env::var("USER").ok()).unwrap_or_else(|| "unknown".into());
    let store = store(stack)?;
    let refund = store.refund(&order_id, &payment_id).await?.ok_or_else(|| {
        CliError::new(format!("no refund of payment {payment_id} on order {order_id}"), "check both ids")
    })?;
    if refund.status != RefundStatus::RefundFailed {
        return Err(CliError::new(
            format!("the refund is {}, not REFUND_FAILED", refund.status.as_str()),
            "only a refund given up on waits for a person",
        ));
    }
    let now = SystemClock.now();
    match store.resolve_failed_refund(&refund, &by, note, now).await? {
        Cas::Applied => println!("resolved by {by}: {order_id}/{payment_id} ({note})"),
        Cas::Rejected => println!("already resolved (or no longer REFUND_FAILED): nothing changed"),
    }
    Ok(())
}
