//! `orderctl stock SKU`: one SKU's catalog entry and counts, read from the
//! table (`SKU#<sku>`/`STOCK`) with `order_core`'s decoding, with the
//! operators' audited changes (`CHANGE#<key>`) and whether the counts agree
//! with them.

use crate::error::{CliError, Result};
use crate::output::{print_json, table};
use crate::settings::Stack;
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::catalog::{audit_disagreements, with_supply};
use order_core::domain::Sku;
use serde_json::json;

pub async fn run(stack: &Stack, sku: &str, json_out: bool) -> Result<()> {
    let sku = Sku::parse(sku).map_err(|e| CliError::new(format!("{sku:?} is not a SKU: {}", e.0), ""))?;
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&stack.sdk), stack.table()?);
    let (s, history) = store
        .stock_with_changes(&sku)
        .await?
        .ok_or_else(|| CliError::new(format!("sku {sku} kept changing while it was read"), "run the command again"))?;
    let s = s.ok_or_else(|| {
        CliError::new(
            format!("sku {sku} does not exist"),
            "seed it with PUT /admin/skus/{sku} {\"available\": N, \"price\": P, \"currency\": \"EUR\"}",
        )
    })?;
    let disagreements = audit_disagreements(&s, &history);
    let v = json!({
        "sku": s.sku, "available": s.available, "reserved": s.reserved, "sold": s.sold,
        "price": s.price, "currency": s.currency, "purchase_limit": s.purchase_limit,
        "supplied": s.supplied, "changes": history,
        "disagreements": disagreements,
    });
    if json_out {
        return print_json(&v);
    }
    let mut t = table(&["sku", "available", "reserved", "sold", "price"]);
    let price = match (&s.price, &s.currency) {
        (Some(p), Some(c)) => format!("{p} {c}"),
        _ => "not for sale (no price)".into(),
    };
    t.add_row(vec![s.sku.to_string(), s.available.to_string(), s.reserved.to_string(), s.sold.to_string(), price]);
    println!("{t}");
    if let Some(limit) = s.purchase_limit {
        println!("purchase limit: {limit} per buyer (open and paid orders together)");
    }
    print_history(&history);
    if disagreements.is_empty() {
        println!("available + reserved + sold = {} = the sum of {} audited changes", s.supplied, history.len());
    }
    for d in &disagreements {
        println!("DISAGREES: {d} (runbook: DiscrepancyStockSupplyMismatchAlarm)");
    }
    Ok(())
}

/// The audited changes in the order they were made, with the supply
/// before and after each (the last 20 when there are more).
fn print_history(history: &[order_core::domain::StockChangeRecord]) {
    if history.is_empty() {
        println!("no audited changes (seeded before changes were recorded)");
        return;
    }
    let rows = with_supply(history);
    let mut t = table(&["at", "by", "change", "delta", "supplied", "key"]);
    let skip = rows.len().saturating_sub(20);
    for (before, after, c) in &rows[skip..] {
        t.add_row(vec![
            c.at.to_string(),
            c.by.clone(),
            c.request.clone(),
            format!("{:+}", c.delta),
            format!("{before} -> {after}"),
            c.key.to_string(),
        ]);
    }
    if skip > 0 {
        println!("({skip} older changes not shown; --json lists every one)");
    }
    println!("{t}");
}
