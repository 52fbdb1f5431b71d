//! `orderctl check ID`: the audited operator force-check. It calls the
//! stack's `POST /admin/orders/{id}/check` route, signed with SigV4 under
//! the caller's own credentials, so the API records who asked (the IAM
//! identity API Gateway verified) in the order's `CHECK#…` item. The route
//! runs the close use case, which can only do what a wake-up could do;
//! nothing here writes to the table.

use crate::error::{CliError, Result};
use crate::output::{print_json, table};
use crate::settings::Stack;
use crate::signed::Signed;
use serde_json::Value;

pub async fn run(stack: &Stack, id: &str, json_out: bool) -> Result<()> {
    let signed = Signed::new(&stack.sdk)?;
    let url = format!("{}/admin/orders/{}/check", stack.api_base_url()?, crate::signed::form_encode(id));
    let (status, text) = signed.send("execute-api", "POST", &url, &[], Vec::new()).await?;
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    match status {
        200 => {}
        404 => {
            return Err(CliError::new(
                format!("order {id} not found by the API"),
                "check the id, and that --stack / --env-file point at the stack that took the order",
            ))
        }
        401 | 403 => {
            return Err(CliError::new(
                format!("the admin route refused the call (HTTP {status})"),
                "the caller needs execute-api:Invoke on the stack's /admin/* routes; check which credentials \
                 are in use (`aws sts get-caller-identity`)",
            ))
        }
        _ => {
            return Err(CliError::new(
                format!("the check failed (HTTP {status}): {}", text.chars().take(300).collect::<String>()),
                "a 5xx is retryable: run the check again; if it persists, read the order-api function's logs",
            ))
        }
    }
    if json_out {
        return print_json(&body);
    }
    let field = |k: &str| match &body[k] {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let mut t = table(&["order", "found", "outcome", "status now", "checked at", "checked by"]);
    t.add_row(vec![
        field("order_id"),
        field("found"),
        field("outcome"),
        field("status"),
        field("checked_at"),
        field("checked_by"),
    ]);
    println!("{t}");
    if !body["retry_after_seconds"].is_null() {
        println!("the close use case will look again in {}s: {}", field("retry_after_seconds"), field("why"));
    }
    println!("recorded on the order as an operator check (see `orderctl order show {id}`)");
    Ok(())
}
