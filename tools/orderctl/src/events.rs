//! `orderctl events ID`: the integration events of one order.
//!
//! An EventBridge bus keeps no history that can be queried per order (the
//! archive can only be replayed), so this reads what the relay logged: one
//! `event published` line per event taken by the bus, with its detail-type,
//! event id, order version and time of the fact. Beside them it lists the
//! events the order's records imply (placed; closed or paid; each refund
//! requested and completed or failed), so an event the relay never
//! published, or whose log line has expired, stands out.

use crate::error::{CliError, Result};
use crate::logs;
use crate::output::{print_json, spinner, table};
use crate::settings::Stack;
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::{OrderId, OrderStatus, RefundStatus};
use order_core::store::{OrderRecord, OrderStore};
use serde::Serialize;
use serde_json::json;
use std::time::Duration;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Published {
    pub detail_type: String,
    pub event_id: String,
    pub version: String,
    pub occurred_at: String,
    pub published_at: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Implied {
    pub detail_type: &'static str,
    /// The event id when the records fix it (refund events and OrderPlaced).
    pub event_id: Option<String>,
    pub occurred_at: String,
    pub seen_published: bool,
}

pub async fn run(stack: &Stack, id: &str, json_out: bool) -> Result<()> {
    let bus = stack.get("ORDER_EVENT_BUS_NAME").map_err(|_| {
        CliError::new(
            format!("{} has no order event bus", stack.source),
            "this stack predates the relay and its bus: there are no integration events to show",
        )
    })?;
    let events = aws_sdk_eventbridge::Client::new(&stack.sdk);
    events.describe_event_bus().name(bus).send().await.map_err(|e| {
        CliError::new(
            format!("the event bus {bus} cannot be read: {}", crate::error::chain(&e)),
            "check that the stack is deployed and the credentials may call events:DescribeEventBus",
        )
    })?;
    let order_id = OrderId::parse(id)
        .map_err(|_| CliError::new(format!("{id:?} is not an order id"), "order ids look like ord_…"))?;
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&stack.sdk), stack.table()?);
    let record = store
        .order_record(&order_id)
        .await?
        .ok_or_else(|| CliError::new(format!("order {order_id} not found"), "check the id and --stack"))?;
    let since = record.order.created_at.minus(Duration::from_secs(60));
    let pb = spinner(json_out, "reading the relay's log lines for the order");
    let found = logs::lines_naming(stack, order_id.as_str(), since, Some("relay")).await;
    pb.finish_and_clear();
    let (lines, notes) = found?;
    let published: Vec<Published> = lines
        .iter()
        .filter(|l| l.message == "event published")
        .map(|l| {
            let field =
                |k: &str| l.fields.split(' ').find_map(|kv| kv.strip_prefix(&format!("{k}="))).unwrap_or("").to_owned();
            Published {
                detail_type: field("detail_type"),
                event_id: field("event_id"),
                version: field("version"),
                occurred_at: field("occurred_at"),
                published_at: l.at.clone(),
            }
        })
        .collect();
    let implied = implied(&record, &published);
    if json_out {
        return print_json(&json!({
            "order_id": order_id, "bus": bus, "published": published, "implied_by_records": implied,
            "logs_unavailable": notes,
        }));
    }
    println!("integration events of {order_id} on bus {bus}");
    let mut t = table(&["published at", "detail-type", "event id", "version", "occurred at"]);
    for p in &published {
        t.add_row(vec![&p.published_at, &p.detail_type, &p.event_id, &p.version, &p.occurred_at]);
    }
    println!("{t}");
    let missing: Vec<&Implied> = implied.iter().filter(|i| !i.seen_published).collect();
    if missing.is_empty() {
        println!("every event the records imply was published");
    } else {
        println!("implied by the records but not seen in the relay's logs (not published yet, or the log expired):");
        for m in missing {
            println!(
                "  {} at {}{}",
                m.detail_type,
                m.occurred_at,
                m.event_id.as_ref().map(|i| format!(" ({i})")).unwrap_or_default()
            );
        }
    }
    for n in notes {
        println!("  logs of {n}");
    }
    Ok(())
}

/// The events the records say must exist, each marked as seen or not.
pub fn implied(r: &OrderRecord, published: &[Published]) -> Vec<Implied> {
    let o = &r.order;
    let mut out = vec![Implied {
        detail_type: "OrderPlaced",
        event_id: Some(format!("OrderPlaced:{}", o.order_id)),
        occurred_at: o.created_at.to_string(),
        seen_published: false,
    }];
    for h in &o.history {
        let detail_type = match h.to {
            OrderStatus::Closed => "OrderClosed",
            OrderStatus::Paid => "OrderPaid",
            _ => continue,
        };
        out.push(Implied { detail_type, event_id: None, occurred_at: h.at.to_string(), seen_published: false });
    }
    for f in &r.refunds {
        out.push(Implied {
            detail_type: "LatePaymentRefundRequested",
            event_id: Some(format!("LatePaymentRefundRequested:{}", f.payment_id)),
            occurred_at: f.created_at.to_string(),
            seen_published: false,
        });
        let done = match f.status {
            RefundStatus::Refunded => Some("RefundCompleted"),
            RefundStatus::RefundFailed => Some("RefundFailed"),
            _ => None,
        };
        if let Some(detail_type) = done {
            out.push(Implied {
                detail_type,
                event_id: Some(format!("{detail_type}:{}", f.payment_id)),
                occurred_at: f.refunded_at.or(f.updated_at).map(|t| t.to_string()).unwrap_or_default(),
                seen_published: false,
            });
        }
    }
    for i in &mut out {
        i.seen_published = published.iter().any(|p| match &i.event_id {
            Some(id) => &p.event_id == id,
            None => p.detail_type == i.detail_type,
        });
    }
    out
}
