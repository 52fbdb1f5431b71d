//! `orderctl points USER_ID`: a buyer's loyalty points — the balance, the
//! audited credits that made it, whether they agree, and the points each
//! of the buyer's orders still holds (the buyer index, newest first), so an
//! operator can tell a `points_balance_mismatch` from a release on its way.

use crate::error::{CliError, Result};
use crate::output::{print_json, table};
use crate::settings::Stack;
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::points::audit_disagreements;
use order_core::domain::{ReservationStatus, ResourceType, UserId};
use order_core::store::{BuyerOrders, OrderStore, PointsLedger};
use serde_json::json;

/// How many of the buyer's newest orders are read for their holdings.
const ORDERS_READ: usize = 500;

pub async fn run(stack: &Stack, user: &str, json_out: bool) -> Result<()> {
    let user = UserId::parse(user).map_err(|e| CliError::new(format!("{user:?} is not a user id: {}", e.0), ""))?;
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&stack.sdk), stack.table()?);
    let balance = store.points_balance(&user).await?;
    let credits = store.points_credits(&user).await?;
    let holding = holding_orders(&store, &user).await?;
    let held_by_orders: i64 = holding.iter().map(|(_, _, points)| points).sum();
    let disagreements = match &balance {
        Some(b) => {
            let mut d = audit_disagreements(b, &credits);
            if b.held != held_by_orders {
                d.push(format!("held {}, the buyer's orders hold {held_by_orders} points", b.held));
            }
            d
        }
        None if held_by_orders != 0 => vec![format!("no balance, but the orders hold {held_by_orders} points")],
        None => vec![],
    };
    if json_out {
        return print_json(&json!({
            "user_id": user, "balance": balance, "credits": credits,
            "holding_orders": holding.iter().map(|(id, status, points)| json!({
                "order_id": id, "status": status, "points": points,
            })).collect::<Vec<_>>(),
            "disagreements": disagreements,
        }));
    }
    let Some(b) = balance else {
        println!("buyer {user} has no points balance (never credited: POST /admin/buyers/{user}/points)");
        return Ok(());
    };
    let mut t = table(&["user", "available", "held", "spent", "credited", "credits"]);
    t.add_row(vec![
        user.to_string(),
        b.available.to_string(),
        b.held.to_string(),
        b.spent.to_string(),
        b.credited.to_string(),
        b.changes.to_string(),
    ]);
    println!("{t}");
    let mut c = table(&["at", "by", "credit", "reason", "key"]);
    for r in &credits {
        c.add_row(vec![r.at.to_string(), r.by.clone(), format!("{:+}", r.delta), r.reason.clone(), r.key.to_string()]);
    }
    println!("{c}");
    for (id, status, points) in &holding {
        println!("held: {points} points by order {id} ({status})");
    }
    if disagreements.is_empty() {
        println!("available + held + spent = credited = the sum of {} audited credits", credits.len());
    }
    for d in &disagreements {
        println!("DISAGREES: {d} (runbook: DiscrepancyPointsBalanceMismatchAlarm)");
    }
    Ok(())
}

/// The buyer's orders (the newest [`ORDERS_READ`]) whose points holding is
/// still RESERVED: `(order id, status, points)`.
async fn holding_orders(store: &DynamoStore, user: &UserId) -> Result<Vec<(String, String, i64)>> {
    let mut out = Vec::new();
    let (mut after, mut read) = (None, 0usize);
    loop {
        let page = store.buyer_orders(user, None, 100, after).await?;
        for line in &page.orders {
            read += 1;
            let Some(r) = store.order_record(&line.order_id).await? else { continue };
            let held: i64 = r
                .reservations
                .iter()
                .filter(|h| h.resource_type == ResourceType::Points && h.status == ReservationStatus::Reserved)
                .map(|h| i64::from(h.qty))
                .sum();
            if held > 0 {
                out.push((line.order_id.to_string(), r.order.status.as_str().to_owned(), held));
            }
        }
        match page.next {
            Some(next) if read < ORDERS_READ => after = Some(next),
            _ => break,
        }
    }
    Ok(out)
}
