//! Integration events: the facts other services may rely on, read off the
//! table stream by the relay and published on the event bus.
//!
//! Why a separate vocabulary from the records: the stream carries every
//! write (leases, reminder notes, effects bookkeeping), most of which mean
//! nothing outside this service. [`events_of_change`] keeps the business
//! facts only, and each event's detail is a versioned contract
//! (`events/schemas/<Type>.schema.json`), not a copy of the item.
//!
//! Every detail carries `schema_version`, an `event_id` that is the same
//! for every delivery of the same fact (stream retries and re-publication
//! both happen; consumers deduplicate on it), the `order_id`, the order
//! `version` the fact belongs to and `occurred_at`, the time of the fact as
//! recorded — never the time of publication. Money is integer minor units
//! with an ISO 4217 currency.

use super::{CloseReason, Timestamp, UserId};
use super::{CouponId, Currency, Order, OrderId, OrderLine, OrderStatus, PaymentId, Refund, RefundStatus, Sku};
use serde::{Deserialize, Serialize};

/// The version of every detail below. A breaking change gets a new number
/// (and, while both are live, both are published).
pub const SCHEMA_VERSION: u32 = 1;

/// The `Source` of every event this service publishes.
pub const SOURCE: &str = "order-expiry";

/// One line of an order, as other services see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventLine {
    pub sku: Sku,
    pub qty: u32,
    /// Minor units of the order's currency.
    pub unit_price: i64,
}

impl From<&OrderLine> for EventLine {
    fn from(l: &OrderLine) -> Self {
        Self { sku: l.sku.clone(), qty: l.qty, unit_price: l.unit_price }
    }
}

/// A new order, reserved and waiting for payment until `expire_at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderPlaced {
    pub schema_version: u32,
    pub event_id: String,
    pub order_id: OrderId,
    pub version: u64,
    pub occurred_at: Timestamp,
    pub user_id: UserId,
    pub items: Vec<EventLine>,
    pub amount_total: i64,
    pub currency: Currency,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coupon_id: Option<CouponId>,
    pub expire_at: Timestamp,
}

/// A heads-up: the order is still unpaid and its window ends at
/// `expire_at`, about the configured lead from `occurred_at`
/// (`ExpiringSoonLeadSeconds`). At most one per order (its `event_id` is
/// the order's), never for an order already final or whose buyer asked to
/// cancel, none when the window is shorter than twice the lead. A
/// reminder, not a promise: the order may still be paid or closed before a
/// subscriber reads it, so a notification service checks nothing else and
/// says "pay before `expire_at`".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderExpiringSoon {
    pub schema_version: u32,
    pub event_id: String,
    pub order_id: OrderId,
    pub version: u64,
    /// When the order was noticed (its `expiring_soon_at`).
    pub occurred_at: Timestamp,
    pub user_id: UserId,
    pub items: Vec<EventLine>,
    pub amount_total: i64,
    pub currency: Currency,
    pub expire_at: Timestamp,
}

/// The order closed unpaid; its stock and coupon are being released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderClosed {
    pub schema_version: u32,
    pub event_id: String,
    pub order_id: OrderId,
    pub version: u64,
    pub occurred_at: Timestamp,
    pub user_id: UserId,
    pub items: Vec<EventLine>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coupon_id: Option<CouponId>,
    /// The cause recorded on the history entry into CLOSED.
    pub cause: String,
    /// Why it closed: `EXPIRED` (its window ended) or `BUYER_CANCELLED`.
    /// Details published before the field existed had only `cause`, and
    /// read as `EXPIRED`, which every close then was.
    #[serde(default = "expired")]
    pub reason: CloseReason,
}

fn expired() -> CloseReason {
    CloseReason::Expired
}

/// The order was paid; this is final.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderPaid {
    pub schema_version: u32,
    pub event_id: String,
    pub order_id: OrderId,
    pub version: u64,
    pub occurred_at: Timestamp,
    pub user_id: UserId,
    pub paid_by: PaymentId,
    pub amount_total: i64,
    pub currency: Currency,
}

/// A payment succeeded after its order was final: it will be refunded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatePaymentRefundRequested {
    pub schema_version: u32,
    pub event_id: String,
    pub order_id: OrderId,
    pub version: u64,
    pub occurred_at: Timestamp,
    /// The buyer, so a subscriber can follow one buyer's orders (absent
    /// on refunds recorded before it was stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<UserId>,
    pub payment_id: PaymentId,
    pub amount: i64,
    pub currency: Currency,
    pub reason: String,
}

/// The channel confirmed the refund.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefundCompleted {
    pub schema_version: u32,
    pub event_id: String,
    pub order_id: OrderId,
    pub version: u64,
    pub occurred_at: Timestamp,
    /// The buyer, so a subscriber can follow one buyer's orders (absent
    /// on refunds recorded before it was stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<UserId>,
    pub payment_id: PaymentId,
    pub amount: i64,
    pub currency: Currency,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_refund_id: Option<String>,
}

/// The refund ran out of tries; an operator redrive may still complete it
/// (then a `RefundCompleted` follows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefundFailed {
    pub schema_version: u32,
    pub event_id: String,
    pub order_id: OrderId,
    pub version: u64,
    pub occurred_at: Timestamp,
    /// The buyer, so a subscriber can follow one buyer's orders (absent
    /// on refunds recorded before it was stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<UserId>,
    pub payment_id: PaymentId,
    pub amount: i64,
    pub currency: Currency,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// One integration event. The variant is the bus's `DetailType`; the
/// payload, serialised alone, is the `Detail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntegrationEvent {
    OrderPlaced(OrderPlaced),
    OrderExpiringSoon(OrderExpiringSoon),
    OrderClosed(OrderClosed),
    OrderPaid(OrderPaid),
    LatePaymentRefundRequested(LatePaymentRefundRequested),
    RefundCompleted(RefundCompleted),
    RefundFailed(RefundFailed),
}

/// A detail that does not decode as the type it was published under.
#[derive(Debug, thiserror::Error)]
pub enum InvalidEvent {
    #[error("unknown detail type {0:?}")]
    UnknownType(String),
    #[error("detail does not match {detail_type}: {source}")]
    Detail {
        detail_type: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

macro_rules! each_event {
    ($self:expr, $e:ident => $body:expr) => {
        match $self {
            IntegrationEvent::OrderPlaced($e) => $body,
            IntegrationEvent::OrderExpiringSoon($e) => $body,
            IntegrationEvent::OrderClosed($e) => $body,
            IntegrationEvent::OrderPaid($e) => $body,
            IntegrationEvent::LatePaymentRefundRequested($e) => $body,
            IntegrationEvent::RefundCompleted($e) => $body,
            IntegrationEvent::RefundFailed($e) => $body,
        }
    };
}

impl IntegrationEvent {
    /// Every detail type, in the order of the enum.
    pub const DETAIL_TYPES: [&'static str; 7] = [
        "OrderPlaced",
        "OrderExpiringSoon",
        "OrderClosed",
        "OrderPaid",
        "LatePaymentRefundRequested",
        "RefundCompleted",
        "RefundFailed",
    ];

    /// The type name: the bus's `DetailType` and the schema's file name.
    pub fn detail_type(&self) -> &'static str {
        match self {
            Self::OrderPlaced(_) => "OrderPlaced",
            Self::OrderExpiringSoon(_) => "OrderExpiringSoon",
            Self::OrderClosed(_) => "OrderClosed",
            Self::OrderPaid(_) => "OrderPaid",
            Self::LatePaymentRefundRequested(_) => "LatePaymentRefundRequested",
            Self::RefundCompleted(_) => "RefundCompleted",
            Self::RefundFailed(_) => "RefundFailed",
        }
    }
    pub fn event_id(&self) -> &str {
        each_event!(self, e => &e.event_id)
    }
    pub fn order_id(&self) -> &OrderId {
        each_event!(self, e => &e.order_id)
    }
    pub fn version(&self) -> u64 {
        each_event!(self, e => e.version)
    }
    pub fn occurred_at(&self) -> Timestamp {
        each_event!(self, e => e.occurred_at)
    }
    /// The buyer, on order events (refund records do not carry it).
    pub fn user_id(&self) -> Option<&UserId> {
        match self {
            Self::OrderPlaced(e) => Some(&e.user_id),
            Self::OrderExpiringSoon(e) => Some(&e.user_id),
            Self::OrderClosed(e) => Some(&e.user_id),
            Self::OrderPaid(e) => Some(&e.user_id),
            Self::LatePaymentRefundRequested(e) => e.user_id.as_ref(),
            Self::RefundCompleted(e) => e.user_id.as_ref(),
            Self::RefundFailed(e) => e.user_id.as_ref(),
        }
    }
    /// The detail as JSON (the payload alone, no type tag).
    pub fn detail(&self) -> serde_json::Value {
        each_event!(self, e => serde_json::to_value(e).expect("an event serialises"))
    }
    /// The detail as a JSON string, as published.
    pub fn detail_json(&self) -> String {
        each_event!(self, e => serde_json::to_string(e).expect("an event serialises"))
    }
    /// Decodes a published event from its `DetailType` and `Detail` (for
    /// consumers and tests). Unknown fields are refused.
    pub fn from_detail(detail_type: &str, detail: serde_json::Value) -> Result<Self, InvalidEvent> {
        fn de<T: serde::de::DeserializeOwned>(t: &'static str, v: serde_json::Value) -> Result<T, InvalidEvent> {
            serde_json::from_value(v).map_err(|source| InvalidEvent::Detail { detail_type: t, source })
        }
        Ok(match detail_type {
            "OrderPlaced" => Self::OrderPlaced(de("OrderPlaced", detail)?),
            "OrderExpiringSoon" => Self::OrderExpiringSoon(de("OrderExpiringSoon", detail)?),
            "OrderClosed" => Self::OrderClosed(de("OrderClosed", detail)?),
            "OrderPaid" => Self::OrderPaid(de("OrderPaid", detail)?),
            "LatePaymentRefundRequested" => Self::LatePaymentRefundRequested(de("LatePaymentRefundRequested", detail)?),
            "RefundCompleted" => Self::RefundCompleted(de("RefundCompleted", detail)?),
            "RefundFailed" => Self::RefundFailed(de("RefundFailed", detail)?),
            other => return Err(InvalidEvent::UnknownType(other.to_owned())),
        })
    }
}

/// A stream image, decoded by the caller according to its `entity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Order(Order),
    Refund(Refund),
}

/// The business facts in one change of a record: `old` and `new` are the
/// stream record's images (`None` for an INSERT's old image, a REMOVE's new
/// one). Status changes are facts, and so is the heads-up notice appearing
/// on an order still waiting for payment; any other write that leaves the
/// status as it was (a lease, a reminder note, effects bookkeeping, a
/// counted refund try) yields nothing. The result depends on the images alone, so a
/// re-delivered record yields the very same events (and event ids).
pub fn events_of_change(old: Option<&Record>, new: Option<&Record>) -> Vec<IntegrationEvent> {
    match (old, new) {
        (None, Some(Record::Order(o))) => vec![order_placed(o)],
        // A final outcome is published once: a move out of a final status
        // (which one outcome per order rules out) is not a second fact.
        (Some(Record::Order(before)), Some(Record::Order(o))) if before.status != o.status => match o.status {
            _ if before.status.is_final() => vec![],
            OrderStatus::Closed => vec![order_closed(o)],
            OrderStatus::Paid => order_paid(o).into_iter().collect(),
            OrderStatus::PendingPayment | OrderStatus::Closing => vec![],
        },
        (Some(Record::Order(before)), Some(Record::Order(o)))
            if before.expiring_soon_at.is_none()
                && o.status == OrderStatus::PendingPayment
                && o.cancel_requested_at.is_none() =>
        {
            order_expiring_soon(o).into_iter().collect()
        }
        (None, Some(Record::Refund(r))) => vec![refund_requested(r)],
        (Some(Record::Refund(before)), Some(Record::Refund(r))) if before.status != r.status => match r.status {
            RefundStatus::Refunded => vec![refund_completed(r)],
            RefundStatus::RefundFailed => vec![refund_failed(r)],
            RefundStatus::RefundPending => vec![],
        },
        _ => vec![],
    }
}

/// The last history entry into `to`: when and why the order got there.
/// An order without one (written before the history existed) falls back
/// to its creation, which is still a recorded time, never "now".
fn entry_into(o: &Order, to: OrderStatus) -> (Timestamp, String) {
    o.history
        .iter()
        .rev()
        .find(|h| h.to == to)
        .map(|h| (h.at, h.cause.clone()))
        .unwrap_or_else(|| (o.created_at, String::new()))
}

fn order_placed(o: &Order) -> IntegrationEvent {
    IntegrationEvent::OrderPlaced(OrderPlaced {
        schema_version: SCHEMA_VERSION,
        event_id: format!("OrderPlaced:{}", o.order_id),
        order_id: o.order_id.clone(),
        version: o.version,
        occurred_at: o.created_at,
        user_id: o.user_id.clone(),
        items: o.items.iter().map(EventLine::from).collect(),
        amount_total: o.amount_total,
        currency: o.currency.clone(),
        coupon_id: o.coupon_id.clone(),
        expire_at: o.expire_at,
    })
}

/// `None` unless the order carries its notice time.
fn order_expiring_soon(o: &Order) -> Option<IntegrationEvent> {
    Some(IntegrationEvent::OrderExpiringSoon(OrderExpiringSoon {
        schema_version: SCHEMA_VERSION,
        event_id: format!("OrderExpiringSoon:{}", o.order_id),
        order_id: o.order_id.clone(),
        version: o.version,
        occurred_at: o.expiring_soon_at?,
        user_id: o.user_id.clone(),
        items: o.items.iter().map(EventLine::from).collect(),
        amount_total: o.amount_total,
        currency: o.currency.clone(),
        expire_at: o.expire_at,
    }))
}

fn order_closed(o: &Order) -> IntegrationEvent {
    let (at, cause) = entry_into(o, OrderStatus::Closed);
    IntegrationEvent::OrderClosed(OrderClosed {
        schema_version: SCHEMA_VERSION,
        event_id: format!("OrderClosed:{}:{}", o.order_id, o.version),
        order_id: o.order_id.clone(),
        version: o.version,
        occurred_at: at,
        user_id: o.user_id.clone(),
        items: o.items.iter().map(EventLine::from).collect(),
        coupon_id: o.coupon_id.clone(),
        cause,
        reason: o.close_reason(),
    })
}

/// `None` for a PAID order without `paid_by`, which the store never
/// writes; there is no payment to name, so there is no fact to publish.
fn order_paid(o: &Order) -> Option<IntegrationEvent> {
    let (at, _) = entry_into(o, OrderStatus::Paid);
    Some(IntegrationEvent::OrderPaid(OrderPaid {
        schema_version: SCHEMA_VERSION,
        event_id: format!("OrderPaid:{}:{}", o.order_id, o.version),
        order_id: o.order_id.clone(),
        version: o.version,
        occurred_at: at,
        user_id: o.user_id.clone(),
        paid_by: o.paid_by.clone()?,
        amount_total: o.amount_total,
        currency: o.currency.clone(),
    }))
}

fn refund_requested(r: &Refund) -> IntegrationEvent {
    IntegrationEvent::LatePaymentRefundRequested(LatePaymentRefundRequested {
        schema_version: SCHEMA_VERSION,
        event_id: format!("LatePaymentRefundRequested:{}", r.payment_id),
        order_id: r.order_id.clone(),
        user_id: r.user_id.clone(),
        version: r.order_version,
        occurred_at: r.created_at,
        payment_id: r.payment_id.clone(),
        amount: r.amount,
        currency: r.currency.clone(),
        reason: r.reason.clone(),
    })
}

fn refund_completed(r: &Refund) -> IntegrationEvent {
    IntegrationEvent::RefundCompleted(RefundCompleted {
        schema_version: SCHEMA_VERSION,
        event_id: format!("RefundCompleted:{}", r.payment_id),
        order_id: r.order_id.clone(),
        user_id: r.user_id.clone(),
        version: r.order_version,
        occurred_at: r.refunded_at.or(r.updated_at).unwrap_or(r.created_at),
        payment_id: r.payment_id.clone(),
        amount: r.amount,
        currency: r.currency.clone(),
        channel_refund_id: r.channel_refund_id.clone(),
    })
}

/// A refund enters REFUND_FAILED once (later failed redrives keep the
/// status and only count tries), so the payment id names the fact.
fn refund_failed(r: &Refund) -> IntegrationEvent {
    IntegrationEvent::RefundFailed(RefundFailed {
        schema_version: SCHEMA_VERSION,
        event_id: format!("RefundFailed:{}", r.payment_id),
        order_id: r.order_id.clone(),
        user_id: r.user_id.clone(),
        version: r.order_version,
        occurred_at: r.updated_at.unwrap_or(r.created_at),
        payment_id: r.payment_id.clone(),
        amount: r.amount,
        currency: r.currency.clone(),
        last_error: r.last_error.clone(),
    })
}

/// Example events, one per type, for schema tests and fixtures.
pub mod examples {
    use super::*;
    use crate::domain::{ChannelName, ClosingLease, StatusChange};

    pub fn ts(s: &str) -> Timestamp {
        Timestamp::parse(s).expect("a valid timestamp")
    }

    /// A PENDING_PAYMENT order with one line and a coupon, version 1.
    pub fn order() -> Order {
        Order {
            order_id: OrderId::parse("ord_1").unwrap(),
            user_id: UserId::parse("user_1").unwrap(),
            status: OrderStatus::PendingPayment,
            version: 1,
            currency: Currency::parse("EUR").unwrap(),
            items: vec![OrderLine { sku: Sku::parse("SKU-1").unwrap(), qty: 2, unit_price: 1250 }],
            amount_total: 2500,
            coupon_id: Some(CouponId::parse("cpn_1").unwrap()),
            created_at: ts("2026-01-01T10:00:00.000Z"),
            expire_at: ts("2026-01-01T10:30:00.000Z"),
            expiry_rule_version: "v1".into(),
            cancel_requested_at: None,
            expiring_soon_at: None,
            points: 0,
            payment_attempts: 0,
            closing: None,
            paid_by: None,
            history: vec![StatusChange {
                at: ts("2026-01-01T10:00:00.000Z"),
                from: None,
                to: OrderStatus::PendingPayment,
                cause: "created".into(),
            }],
            checks: vec![],
        }
    }

    /// `order` moved to `to` at `at` by `cause`, one version later.
    pub fn moved(order: &Order, to: OrderStatus, at: &str, cause: &str) -> Order {
        let mut o = order.clone();
        o.history.push(StatusChange { at: ts(at), from: Some(o.status), to, cause: cause.into() });
        o.status = to;
        o.version += 1;
        if to == OrderStatus::Closing {
            o.closing = Some(ClosingLease {
                started_at: ts(at),
                owner: "closer".into(),
                lease_until: ts(at).plus(std::time::Duration::from_secs(35)),
                resumes: 0,
            });
        }
        o
    }

    /// A REFUND_PENDING refund decided on order version 3.
    pub fn refund() -> Refund {
        Refund {
            payment_id: PaymentId::parse("pay_1").unwrap(),
            order_id: OrderId::parse("ord_1").unwrap(),
            channel: ChannelName::parse("sandbox").unwrap(),
            amount: 2500,
            currency: Currency::parse("EUR").unwrap(),
            status: RefundStatus::RefundPending,
            reason: "payment succeeded after the order closed".into(),
            tries: 0,
            created_at: ts("2026-01-01T10:31:00.000Z"),
            refunded_at: None,
            channel_refund_id: None,
            last_error: None,
            notification: "Your payment will be refunded.".into(),
            user_id: Some(UserId::parse("u1").unwrap()),
            order_version: 3,
            updated_at: None,
            resolved_by: None,
            resolved_at: None,
            resolution: None,
        }
    }

    /// One event of each type, in the order of [`IntegrationEvent::DETAIL_TYPES`].
    pub fn one_of_each() -> Vec<IntegrationEvent> {
        let placed = order();
        let closed = moved(&placed, OrderStatus::Closed, "2026-01-01T10:30:00.500Z", "expired unpaid");
        let mut paid = moved(&placed, OrderStatus::Paid, "2026-01-01T10:10:00.000Z", "payment pay_0 succeeded");
        paid.paid_by = Some(PaymentId::parse("pay_0").unwrap());
        let noticed = Order { expiring_soon_at: Some(ts("2026-01-01T10:24:10.000Z")), ..placed.clone() };
        let pending = refund();
        let done = Refund {
            status: RefundStatus::Refunded,
            refunded_at: Some(ts("2026-01-01T10:32:00.000Z")),
            updated_at: Some(ts("2026-01-01T10:32:00.000Z")),
            channel_refund_id: Some("rf_1".into()),
            ..pending.clone()
        };
        let failed = Refund {
            status: RefundStatus::RefundFailed,
            tries: 5,
            updated_at: Some(ts("2026-01-01T11:00:00.000Z")),
            last_error: Some("channel refused".into()),
            ..pending.clone()
        };
        let o = |x: &Order| Record::Order(x.clone());
        let r = |x: &Refund| Record::Refund(x.clone());
        [
            events_of_change(None, Some(&o(&placed))),
            events_of_change(Some(&o(&placed)), Some(&o(&noticed))),
            events_of_change(Some(&o(&placed)), Some(&o(&closed))),
            events_of_change(Some(&o(&placed)), Some(&o(&paid))),
            events_of_change(None, Some(&r(&pending))),
            events_of_change(Some(&r(&pending)), Some(&r(&done))),
            events_of_change(Some(&r(&pending)), Some(&r(&failed))),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::examples::*;
    use super::*;
    use serde_json::json;

    fn o(x: &Order) -> Record {
        Record::Order(x.clone())
    }
    fn r(x: &Refund) -> Record {
        Record::Refund(x.clone())
    }
    fn one(events: Vec<IntegrationEvent>) -> IntegrationEvent {
        assert_eq!(events.len(), 1, "{events:?}");
        events.into_iter().next().unwrap()
    }

    #[test]
    fn an_order_insert_is_order_placed_at_its_creation() {
        let e = one(events_of_change(None, Some(&o(&order()))));
        assert_eq!(
            e.detail(),
            json!({
                "schema_version": 1, "event_id": "OrderPlaced:ord_1", "order_id": "ord_1", "version": 1,
                "occurred_at": "2026-01-01T10:00:00.000Z", "user_id": "user_1",
                "items": [{"sku": "SKU-1", "qty": 2, "unit_price": 1250}],
                "amount_total": 2500, "currency": "EUR", "coupon_id": "cpn_1",
                "expire_at": "2026-01-01T10:30:00.000Z"
            })
        );
        assert_eq!(e.detail_type(), "OrderPlaced");
    }

    #[test]
    fn a_close_is_order_closed_with_the_cause_and_time_of_its_history_entry() {
        let closing = moved(&order(), OrderStatus::Closing, "2026-01-01T10:30:00.000Z", "due; checking payments");
        let closed = moved(&closing, OrderStatus::Closed, "2026-01-01T10:30:02.000Z", "channel: not paid");
        let e = one(events_of_change(Some(&o(&closing)), Some(&o(&closed))));
        let IntegrationEvent::OrderClosed(c) = &e else { panic!("{e:?}") };
        assert_eq!(c.event_id, "OrderClosed:ord_1:3");
        assert_eq!(c.version, 3);
        assert_eq!(c.occurred_at, ts("2026-01-01T10:30:02.000Z"));
        assert_eq!(c.cause, "channel: not paid");
        assert_eq!(c.coupon_id.as_ref().map(|c| c.as_str()), Some("cpn_1"));
        assert_eq!(c.items.len(), 1);
        assert_eq!(c.reason, CloseReason::Expired);
    }

    #[test]
    fn a_buyers_cancel_is_order_closed_with_the_reason_buyer_cancelled() {
        let mut asked = order();
        asked.cancel_requested_at = Some(ts("2026-01-01T10:05:00.000Z"));
        let closed = moved(&asked, OrderStatus::Closed, "2026-01-01T10:05:00.100Z", "cancelled by the buyer");
        let e = one(events_of_change(Some(&o(&asked)), Some(&o(&closed))));
        let IntegrationEvent::OrderClosed(c) = &e else { panic!("{e:?}") };
        assert_eq!(c.reason, CloseReason::BuyerCancelled);
        assert_eq!(e.detail()["reason"], "BUYER_CANCELLED");
        // A detail published before the field existed reads as an expiry.
        let mut old = e.detail();
        old.as_object_mut().unwrap().remove("reason");
        let read: OrderClosed = serde_json::from_value(old).unwrap();
        assert_eq!(read.reason, CloseReason::Expired);
    }

    #[test]
    fn a_payment_is_order_paid_with_the_payment_and_the_amount() {
        let mut paid = moved(&order(), OrderStatus::Paid, "2026-01-01T10:10:00.000Z", "payment pay_0 succeeded");
        paid.paid_by = Some(PaymentId::parse("pay_0").unwrap());
        let e = one(events_of_change(Some(&o(&order())), Some(&o(&paid))));
        let IntegrationEvent::OrderPaid(p) = &e else { panic!("{e:?}") };
        assert_eq!(p.event_id, "OrderPaid:ord_1:2");
        assert_eq!(p.paid_by.as_str(), "pay_0");
        assert_eq!((p.amount_total, p.currency.as_str()), (2500, "EUR"));
        assert_eq!(p.occurred_at, ts("2026-01-01T10:10:00.000Z"));
    }

    #[test]
    fn a_notice_appearing_on_an_unpaid_order_is_order_expiring_soon_once() {
        let placed = order();
        let noticed = Order { expiring_soon_at: Some(ts("2026-01-01T10:24:10.000Z")), ..placed.clone() };
        let e = one(events_of_change(Some(&o(&placed)), Some(&o(&noticed))));
        assert_eq!(
            e.detail(),
            json!({
                "schema_version": 1, "event_id": "OrderExpiringSoon:ord_1", "order_id": "ord_1", "version": 1,
                "occurred_at": "2026-01-01T10:24:10.000Z", "user_id": "user_1",
                "items": [{"sku": "SKU-1", "qty": 2, "unit_price": 1250}],
                "amount_total": 2500, "currency": "EUR", "expire_at": "2026-01-01T10:30:00.000Z"
            })
        );
        // Any later write of the noticed order (a payment attempt, a lease,
        // the close) is not a second notice.
        let mut attempted = noticed.clone();
        attempted.payment_attempts = 1;
        attempted.version += 1;
        assert!(events_of_change(Some(&o(&noticed)), Some(&o(&attempted))).is_empty());
        let closing = moved(&noticed, OrderStatus::Closing, "2026-01-01T10:30:00.000Z", "due");
        assert!(events_of_change(Some(&o(&noticed)), Some(&o(&closing))).is_empty());
        let closed = moved(&closing, OrderStatus::Closed, "2026-01-01T10:30:01.000Z", "not paid");
        assert_eq!(one(events_of_change(Some(&o(&closing)), Some(&o(&closed)))).detail_type(), "OrderClosed");
        // A notice is never published for an order no longer waiting for
        // payment (the store refuses to write one; the relay agrees).
        let closing_noticed = Order { expiring_soon_at: Some(ts("2026-01-01T10:30:00.500Z")), ..closing.clone() };
        assert!(events_of_change(Some(&o(&closing)), Some(&o(&closing_noticed))).is_empty());
    }

    #[test]
    fn a_modify_that_is_not_a_business_fact_emits_nothing() {
        let placed = order();
        // A reminder note or a version bump without a status change.
        let mut noted = placed.clone();
        noted.version += 1;
        assert!(events_of_change(Some(&o(&placed)), Some(&o(&noted))).is_empty());
        // Claiming CLOSING, and resuming it (a new lease, same status).
        let closing = moved(&placed, OrderStatus::Closing, "2026-01-01T10:30:00.000Z", "due");
        assert!(events_of_change(Some(&o(&placed)), Some(&o(&closing))).is_empty());
        let mut resumed = closing.clone();
        resumed.version += 1;
        resumed.closing.as_mut().unwrap().resumes = 1;
        assert!(events_of_change(Some(&o(&closing)), Some(&o(&resumed))).is_empty());
        // Effects bookkeeping on a CLOSED order (the due entry removed).
        let closed = moved(&closing, OrderStatus::Closed, "2026-01-01T10:30:02.000Z", "not paid");
        let mut settled = closed.clone();
        settled.version += 1;
        assert!(events_of_change(Some(&o(&closed)), Some(&o(&settled))).is_empty());
        // A counted refund try, and a failed redrive of a failed refund.
        let pending = refund();
        let tried = Refund { tries: 1, last_error: Some("timeout".into()), ..pending.clone() };
        assert!(events_of_change(Some(&r(&pending)), Some(&r(&tried))).is_empty());
        let failed = Refund { status: RefundStatus::RefundFailed, tries: 5, ..pending.clone() };
        let failed_again = Refund { tries: 6, ..failed.clone() };
        assert!(events_of_change(Some(&r(&failed)), Some(&r(&failed_again))).is_empty());
        // A move out of a final status (one outcome per order rules it
        // out) is never a second outcome on the bus.
        let mut paid_after_close = moved(&closed, OrderStatus::Paid, "2026-01-01T10:31:00.000Z", "impossible");
        paid_after_close.paid_by = Some(PaymentId::parse("pay_9").unwrap());
        assert!(events_of_change(Some(&o(&closed)), Some(&o(&paid_after_close))).is_empty());
        // Removals, and a change whose images are not the same entity.
        assert!(events_of_change(Some(&o(&placed)), None).is_empty());
        assert!(events_of_change(Some(&r(&pending)), None).is_empty());
        assert!(events_of_change(Some(&o(&placed)), Some(&r(&pending))).is_empty());
        assert!(events_of_change(None, None).is_empty());
    }

    #[test]
    fn a_refund_insert_is_a_late_payment_refund_request_on_the_decided_order_version() {
        let e = one(events_of_change(None, Some(&r(&refund()))));
        let IntegrationEvent::LatePaymentRefundRequested(q) = &e else { panic!("{e:?}") };
        assert_eq!(q.event_id, "LatePaymentRefundRequested:pay_1");
        assert_eq!(q.version, 3);
        assert_eq!(q.occurred_at, ts("2026-01-01T10:31:00.000Z"));
        assert_eq!((q.amount, q.currency.as_str()), (2500, "EUR"));
        assert_eq!(q.reason, "payment succeeded after the order closed");
        assert_eq!(e.user_id().map(|u| u.as_str()), Some("u1"), "refund events carry the buyer");
    }

    #[test]
    fn a_refund_without_an_order_version_reads_zero() {
        let mut item = serde_json::to_value(refund()).unwrap();
        item.as_object_mut().unwrap().remove("order_version");
        let old: Refund = serde_json::from_value(item).unwrap();
        let e = one(events_of_change(None, Some(&r(&old))));
        assert_eq!(e.version(), 0);
    }

    #[test]
    fn a_refund_into_refunded_is_refund_completed_also_after_a_redrive_of_a_failed_one() {
        let pending = refund();
        let done = Refund {
            status: RefundStatus::Refunded,
            refunded_at: Some(ts("2026-01-01T10:32:00.000Z")),
            updated_at: Some(ts("2026-01-01T10:32:00.000Z")),
            channel_refund_id: Some("rf_1".into()),
            ..pending.clone()
        };
        let e = one(events_of_change(Some(&r(&pending)), Some(&r(&done))));
        let IntegrationEvent::RefundCompleted(c) = &e else { panic!("{e:?}") };
        assert_eq!(c.event_id, "RefundCompleted:pay_1");
        assert_eq!(c.occurred_at, ts("2026-01-01T10:32:00.000Z"));
        assert_eq!(c.channel_refund_id.as_deref(), Some("rf_1"));

        let failed = Refund { status: RefundStatus::RefundFailed, tries: 5, ..pending.clone() };
        let redriven = Refund { refunded_at: Some(ts("2026-01-02T09:00:00.000Z")), ..done.clone() };
        let e = one(events_of_change(Some(&r(&failed)), Some(&r(&redriven))));
        assert_eq!(e.detail_type(), "RefundCompleted");
        assert_eq!(e.event_id(), "RefundCompleted:pay_1");
        assert_eq!(e.occurred_at(), ts("2026-01-02T09:00:00.000Z"));
    }

    #[test]
    fn a_refund_into_refund_failed_is_refund_failed_at_its_last_write() {
        let pending = refund();
        let failed = Refund {
            status: RefundStatus::RefundFailed,
            tries: 5,
            updated_at: Some(ts("2026-01-01T11:00:00.000Z")),
            last_error: Some("channel refused".into()),
            ..pending.clone()
        };
        let e = one(events_of_change(Some(&r(&pending)), Some(&r(&failed))));
        let IntegrationEvent::RefundFailed(f) = &e else { panic!("{e:?}") };
        assert_eq!(f.event_id, "RefundFailed:pay_1");
        assert_eq!(f.occurred_at, ts("2026-01-01T11:00:00.000Z"));
        assert_eq!(f.last_error.as_deref(), Some("channel refused"));
    }

    #[test]
    fn the_same_record_twice_gives_the_same_events_and_ids() {
        let placed = order();
        let closed = moved(&placed, OrderStatus::Closed, "2026-01-01T10:30:00.500Z", "expired unpaid");
        for (old, new) in [(None, Some(o(&placed))), (Some(o(&placed)), Some(o(&closed))), (None, Some(r(&refund())))] {
            let first = events_of_change(old.as_ref(), new.as_ref());
            let again = events_of_change(old.as_ref(), new.as_ref());
            assert_eq!(first, again);
            assert_eq!(first[0].event_id(), again[0].event_id());
        }
    }

    #[test]
    fn every_type_round_trips_through_its_detail() {
        let all = one_of_each();
        let types: Vec<_> = all.iter().map(|e| e.detail_type()).collect();
        assert_eq!(types, IntegrationEvent::DETAIL_TYPES);
        for e in all {
            assert_eq!(e.detail()["schema_version"], json!(1));
            let back = IntegrationEvent::from_detail(e.detail_type(), e.detail()).unwrap();
            assert_eq!(back, e);
        }
        assert!(IntegrationEvent::from_detail("OrderShipped", json!({})).is_err());
        let mut extra = one_of_each()[0].detail();
        extra["surprise"] = json!(1);
        assert!(IntegrationEvent::from_detail("OrderPlaced", extra).is_err());
    }
}
