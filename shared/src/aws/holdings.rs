//! The counters an order's holdings move, one per kind, and the updates
//! that move them: taken in the create transaction (conditional on the
//! counter's bound), given back or kept in the transaction that moves the
//! holding RESERVED → RELEASED or CONFIRMED. Adding a kind of holding is a
//! counter key and three updates here (docs/extending.md).
//!
//! | kind            | counter                     | take (create)                  | release          | confirm (paid)        |
//! |-----------------|-----------------------------|--------------------------------|------------------|-----------------------|
//! | STOCK           | `SKU#<sku>` / `STOCK`       | available → reserved           | reserved → available | reserved → sold   |
//! | PURCHASE_LIMIT  | `BUYER#<user>` / `LIMIT#<sku>` | used, held += q (used ≤ limit) | used, held −= q | held → bought (used stays) |
//! | POINTS          | `BUYER#<user>` / `POINTS`   | available → held               | held → available | held → spent          |
//! | OPEN_ORDERS     | `BUYER#<user>` / `OPEN_ORDERS` | open += 1 (open < cap)      | open −= 1        | open −= 1             |
//!
//! Condition expressions have no arithmetic, so "used + q ≤ limit" is sent
//! as `used <= :room` with the room worked out here.

use super::dynamo::{key, keys, n, Item};
use crate::domain::*;
use crate::store::Caps;
use aws_sdk_dynamodb::types::{ReturnValuesOnConditionCheckFailure, Update};

/// The counter item a holding moves.
pub fn counter_key(r: &Reservation) -> Item {
    match (r.resource_type, r.sku(), r.user()) {
        (ResourceType::Stock, Some(sku), _) => key(keys::sku(&sku), keys::STOCK_SK),
        (ResourceType::PurchaseLimit, Some(sku), Some(user)) => key(keys::buyer(&user), &keys::purchase_limit_sk(&sku)),
        (ResourceType::Points, _, Some(user)) => key(keys::buyer(&user), keys::POINTS_SK),
        (ResourceType::OpenOrders, _, Some(user)) => key(keys::buyer(&user), keys::OPEN_ORDERS_SK),
        // A key that does not parse was never written by create; the
        // update below fails its condition on a counter that does not
        // exist and the move reports the record as inconsistent.
        _ => key(format!("BROKEN#{}", r.resource_key), r.resource_type.as_str()),
    }
}

/// Why a buyer counter refused a create, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeRefused {
    PurchaseLimit { sku: Sku, limit: u32 },
    Points,
    OpenOrders { cap: u32 },
}

/// The create transaction's update of a buyer counter for `r` (stock is
/// taken by the create itself, with its price condition), and the refusal
/// its failed condition means; `None` for stock, or a limit the line can
/// never fit (the use case refuses that before the transaction).
pub fn take(table: &str, r: &Reservation, caps: &Caps, currency: &Currency) -> Option<(Update, TakeRefused)> {
    let q = n(r.qty);
    let u = Update::builder()
        .table_name(table)
        .set_key(Some(counter_key(r)))
        .expression_attribute_values(":q", q)
        .expression_attribute_values(":zero", n(0))
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
    let (u, refused) = match r.resource_type {
        ResourceType::Stock => return None,
        ResourceType::PurchaseLimit => {
            let sku = r.sku()?;
            let limit = *caps.purchase_limits.get(&sku)?;
            let room = limit.checked_sub(r.qty)?;
            let u = u
                .update_expression("SET used = if_not_exists(used, :zero) + :q, held = if_not_exists(held, :zero) + :q")
                .condition_expression("attribute_not_exists(used) OR used <= :room")
                .expression_attribute_values(":room", n(room));
            (u, TakeRefused::PurchaseLimit { sku, limit })
        }
        ResourceType::Points => {
            // A point is a minor unit of the balance's currency: spent
            // only on an order in it.
            let u = u
                .update_expression("SET available = available - :q, held = if_not_exists(held, :zero) + :q")
                .condition_expression("available >= :q AND currency = :cur")
                .expression_attribute_values(":cur", aws_sdk_dynamodb::types::AttributeValue::S(currency.to_string()));
            (u, TakeRefused::Points)
        }
        ResourceType::OpenOrders => {
            let cap = caps.open_orders?;
            let u = u
                .update_expression("SET #open = if_not_exists(#open, :zero) + :q")
                .condition_expression("attribute_not_exists(#open) OR #open < :cap")
                .expression_attribute_names("#open", "open")
                .expression_attribute_values(":cap", n(cap));
            (u, TakeRefused::OpenOrders { cap })
        }
    };
    Some((u.build().expect("complete update"), refused))
}

/// The update of `r`'s counter when the holding moves by `event`: what
/// was held goes back (release) or is used up (confirm). Each is
/// conditional on the counter still holding at least `qty`, so a counter
/// that does not hold what the record says fails the move loudly instead
/// of going negative.
pub fn settle(table: &str, r: &Reservation, event: ReservationEvent) -> Update {
    use ReservationEvent::*;
    let (expr, held) = match (r.resource_type, event) {
        (ResourceType::Stock, Release) => ("SET available = available + :q, reserved = reserved - :q", "reserved"),
        (ResourceType::Stock, Confirm) => {
            ("SET reserved = reserved - :q, sold = if_not_exists(sold, :zero) + :q", "reserved")
        }
        (ResourceType::PurchaseLimit, Release) => ("SET used = used - :q, held = held - :q", "held"),
        (ResourceType::PurchaseLimit, Confirm) => {
            ("SET held = held - :q, bought = if_not_exists(bought, :zero) + :q", "held")
        }
        (ResourceType::Points, Release) => ("SET available = available + :q, held = held - :q", "held"),
        (ResourceType::Points, Confirm) => ("SET held = held - :q, spent = if_not_exists(spent, :zero) + :q", "held"),
        (ResourceType::OpenOrders, Release | Confirm) => ("SET #held = #held - :q", "#held"),
    };
    let mut u = Update::builder()
        .table_name(table)
        .set_key(Some(counter_key(r)))
        .update_expression(expr)
        .condition_expression(format!("{held} >= :q"))
        .expression_attribute_values(":q", n(r.qty));
    if expr.contains(":zero") {
        u = u.expression_attribute_values(":zero", n(0));
    }
    if held == "#held" {
        u = u.expression_attribute_names("#held", "open");
    }
    u.build().expect("complete update")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> UserId {
        UserId::parse("u1").unwrap()
    }
    fn sku() -> Sku {
        Sku::parse("A").unwrap()
    }
    fn eur() -> Currency {
        Currency::parse("EUR").unwrap()
    }

    #[test]
    fn each_kind_has_its_own_counter() {
        let pk_sk = |r: &Reservation| {
            let k = counter_key(r);
            (k["pk"].as_s().unwrap().clone(), k["sk"].as_s().unwrap().clone())
        };
        assert_eq!(pk_sk(&Reservation::stock(&sku(), 2)), ("SKU#A".into(), "STOCK".into()));
        assert_eq!(pk_sk(&Reservation::purchase_limit(&user(), &sku(), 2)), ("BUYER#u1".into(), "LIMIT#A".into()));
        assert_eq!(pk_sk(&Reservation::points(&user(), 50)), ("BUYER#u1".into(), "POINTS".into()));
        assert_eq!(pk_sk(&Reservation::open_order_slot(&user())), ("BUYER#u1".into(), "OPEN_ORDERS".into()));
    }

    #[test]
    fn a_limit_the_line_can_never_fit_is_not_sent() {
        let caps = Caps { purchase_limits: [(sku(), 2)].into(), open_orders: None };
        assert!(take("t", &Reservation::purchase_limit(&user(), &sku(), 3), &caps, &eur()).is_none());
        let (u, refused) = take("t", &Reservation::purchase_limit(&user(), &sku(), 2), &caps, &eur()).unwrap();
        assert_eq!(refused, TakeRefused::PurchaseLimit { sku: sku(), limit: 2 });
        assert_eq!(u.expression_attribute_values().unwrap()[":room"].as_n().unwrap(), "0");
        assert!(take("t", &Reservation::open_order_slot(&user()), &caps, &eur()).is_none(), "no cap, no slot");
    }
}
