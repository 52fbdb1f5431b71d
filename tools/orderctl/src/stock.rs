//! `orderctl stock SKU`: one SKU's catalog entry and counts, read from the
//! table (`SKU#<sku>`/`STOCK`) with `order_core`'s decoding.

use crate::error::{CliError, Result};
use crate::output::{print_json, table};
use crate::settings::Stack;
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::Sku;
use order_core::store::OrderStore;
use serde_json::json;

pub async fn run(stack: &Stack, sku: &str, json_out: bool) -> Result<()> {
    let sku = Sku::parse(sku).map_err(|e| CliError::new(format!("{sku:?} is not a SKU: {}", e.0), ""))?;
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&stack.sdk), stack.table()?);
    let s = store.stock(&sku).await?.ok_or_else(|| {
        CliError::new(
            format!("sku {sku} does not exist"),
            "seed it with PUT /admin/skus/{sku} {\"available\": N, \"price\": P, \"currency\": \"EUR\"}",
        )
    })?;
    let v = json!({
        "sku": s.sku, "available": s.available, "reserved": s.reserved, "sold": s.sold,
        "price": s.price, "currency": s.currency,
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
    Ok(())
}
