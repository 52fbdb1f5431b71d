//! The order state machine (docs/design.md#states) and the close decision
//! (docs/design.md#close-protocol).
//!
//! ```text
//! PENDING_PAYMENT ──CloseUnpaid (due, no payment attempt)──▶ CLOSED
//!        │  └──────BeginClosing (due, attempts exist)──▶ CLOSING ──ConfirmUnpaid──▶ CLOSED
//!        │                                                  │
//!        └──PaymentSucceeded──▶ PAID ◀──PaymentSucceeded────┘
//! ```
//! PAID and CLOSED are terminal: nothing leaves them. A payment that is
//! confirmed after CLOSED is not a transition at all — it becomes a refund.

use super::{CouponId, Currency, OrderId, Refused, Sku, Step, Timestamp, UserId};
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderStatus {
    PendingPayment,
    Closing,
    Paid,
    Closed,
}

impl OrderStatus {
    pub const ALL: [OrderStatus; 4] = [Self::PendingPayment, Self::Closing, Self::Paid, Self::Closed];

    pub fn is_final(self) -> bool {
        matches!(self, Self::Paid | Self::Closed)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PendingPayment => "PENDING_PAYMENT",
            Self::Closing => "CLOSING",
            Self::Paid => "PAID",
            Self::Closed => "CLOSED",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderEvent {
    /// The order is due and has no payment attempt: close it in one write.
    CloseUnpaid,
    /// The order is due and has payment attempts: claim the close decision
    /// (or resume one whose lease ran out) before asking the channel.
    BeginClosing,
    /// While CLOSING, the payment facts say nothing was paid.
    ConfirmUnpaid,
    /// A trusted payment success (verified notification or channel query).
    PaymentSucceeded,
}

impl OrderEvent {
    pub const ALL: [OrderEvent; 4] =
        [Self::CloseUnpaid, Self::BeginClosing, Self::ConfirmUnpaid, Self::PaymentSucceeded];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::CloseUnpaid => "close_unpaid",
            Self::BeginClosing => "begin_closing",
            Self::ConfirmUnpaid => "confirm_unpaid",
            Self::PaymentSucceeded => "payment_succeeded",
        }
    }
}

/// The order transition function.
pub fn apply(from: OrderStatus, event: OrderEvent) -> Result<Step<OrderStatus>, Refused> {
    use OrderEvent::*;
    use OrderStatus::*;
    let refuse = || Refused { from: from.as_str(), event: event.as_str() };
    match (from, event) {
        (PendingPayment, CloseUnpaid) => Ok(Step::Moved(Closed)),
        (PendingPayment, BeginClosing) => Ok(Step::Moved(Closing)),
        (PendingPayment, PaymentSucceeded) => Ok(Step::Moved(Paid)),
        (PendingPayment, ConfirmUnpaid) => Err(refuse()),
        // Re-claiming CLOSING is how an expired lease is resumed; the
        // status does not change, only the lease does.
        (Closing, BeginClosing) => Ok(Step::Moved(Closing)),
        (Closing, ConfirmUnpaid) => Ok(Step::Moved(Closed)),
        (Closing, PaymentSucceeded) => Ok(Step::Moved(Paid)),
        // Once someone is deciding, the shortcut close is gone: the payment
        // facts have to be checked first.
        (Closing, CloseUnpaid) => Err(refuse()),
        (Paid, PaymentSucceeded) => Ok(Step::AlreadyThere),
        (Closed, CloseUnpaid | ConfirmUnpaid) => Ok(Step::AlreadyThere),
        (Paid | Closed, _) => Err(refuse()),
    }
}

/// The states `event` moves an order out of, and the state it moves it to,
/// read off [`apply`]. The store builds its write conditions from this, so
/// the state machine is the one place that says which transitions exist.
pub fn transition(event: OrderEvent) -> (Vec<OrderStatus>, OrderStatus) {
    super::transition_of(&OrderStatus::ALL, event, apply)
}

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderLine {
    pub sku: Sku,
    pub qty: u32,
    pub unit_price: i64,
}

/// Who is deciding a CLOSING order, and until when nobody else may.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClosingLease {
    pub started_at: Timestamp,
    pub owner: String,
    pub lease_until: Timestamp,
    /// How many times a closer took over an expired lease. Counted here
    /// rather than in the history: resuming does not change the status, and
    /// a long channel outage must not grow the record without bound.
    #[serde(default)]
    pub resumes: u32,
}

/// One entry of the order's audit trail, written in the same conditional
/// write as the status change it records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusChange {
    pub at: Timestamp,
    pub from: Option<OrderStatus>,
    pub to: OrderStatus,
    pub cause: String,
}

/// The order as the domain sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: OrderId,
    pub user_id: UserId,
    pub status: OrderStatus,
    /// Bumped by every write; the compare in compare-and-swap.
    pub version: u64,
    pub currency: Currency,
    pub items: Vec<OrderLine>,
    /// What the buyer pays: the lines' total less `points`.
    pub amount_total: i64,
    /// Loyalty points the order spends, one point per minor unit of its
    /// currency, held from the buyer's balance while it is open.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub points: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coupon_id: Option<CouponId>,
    pub created_at: Timestamp,
    /// Fixed when the order is written; never recomputed from configuration.
    pub expire_at: Timestamp,
    pub expiry_rule_version: String,
    /// When the buyer asked to cancel (`POST /orders/{id}/cancel`), if they
    /// did while the order was open and its window had not ended. From then
    /// on the order is due: the same close use case closes it, with the
    /// cause [`CloseReason::BuyerCancelled`], and no new payment may start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested_at: Option<Timestamp>,
    /// When the order was noticed as expiring soon (the heads-up pass's one
    /// conditional write; the relay publishes `OrderExpiringSoon` from it).
    /// Not a state change: it leaves `version` as it is, so a close or a
    /// payment racing the notice never has to retry for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiring_soon_at: Option<Timestamp>,
    /// Payment attempts recorded so far. Zero means the one-write close is
    /// safe: no money can be in flight for this order.
    #[serde(default)]
    pub payment_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closing: Option<ClosingLease>,
    /// The payment that made the order PAID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paid_by: Option<super::PaymentId>,
    #[serde(default)]
    pub history: Vec<StatusChange>,
    /// Operator force-checks, each with who asked and what it found. Not
    /// status changes: a check only runs the close use case. Stored as
    /// items of their own beside the order (never on the order item, which
    /// must not grow with them); filled in when the whole record is read.
    #[serde(default, skip_serializing)]
    pub checks: Vec<OperatorCheck>,
}

/// One audited `POST /admin/orders/{id}/check`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorCheck {
    pub at: Timestamp,
    /// The caller's IAM identity, from the request context.
    pub by: String,
    /// The status the check found.
    pub found: OrderStatus,
    /// What the close use case did.
    pub outcome: String,
    /// The status after the check.
    pub status: OrderStatus,
}

/// Why a CLOSED order was closed: its window ended, or its buyer cancelled
/// it first. Carried on `OrderClosed` so that subscribers (and the buyer's
/// view) can tell the two apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CloseReason {
    Expired,
    BuyerCancelled,
}

impl CloseReason {
    /// The reason a close of an order with this cancel request (or none)
    /// records: the one rule, for the order and for its list line.
    pub fn of(cancel_requested_at: Option<Timestamp>) -> Self {
        if cancel_requested_at.is_some() {
            Self::BuyerCancelled
        } else {
            Self::Expired
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "EXPIRED",
            Self::BuyerCancelled => "BUYER_CANCELLED",
        }
    }
}

impl Order {
    /// When the order becomes due for closing: its `expire_at`, or the
    /// moment its buyer asked to cancel, whichever came first.
    pub fn due_at(&self) -> Timestamp {
        match self.cancel_requested_at {
            Some(c) if c < self.expire_at => c,
            _ => self.expire_at,
        }
    }

    /// Why a close of this order closes it. A cancel is recorded only while
    /// the window is open, so a cancelled order is always closed as such.
    pub fn close_reason(&self) -> CloseReason {
        CloseReason::of(self.cancel_requested_at)
    }
}

/// What a wake-up (scheduled, swept, or retried) should do with an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseDecision {
    /// PAID or CLOSED already: acknowledge, change nothing.
    AlreadyFinal(OrderStatus),
    /// The reminder came early; try again after this long.
    NotYetDue(Duration),
    /// Due with no payment attempt: PENDING_PAYMENT → CLOSED in one write.
    CloseNow,
    /// Due with payment attempts: claim CLOSING, then check the money.
    BeginClosing,
    /// CLOSING whose lease ran out (a closer died): take it over and
    /// continue — never reopen it to PENDING_PAYMENT.
    ResumeClosing,
    /// Someone else holds a live lease; look again when it ends.
    LeaseHeld(Duration),
}

/// The close decision is made from the order's own record and server time;
/// the message that triggered it carries no authority
/// (docs/design.md#reminder-not-truth).
pub fn decide_close(order: &Order, now: Timestamp) -> CloseDecision {
    match order.status {
        s @ (OrderStatus::Paid | OrderStatus::Closed) => CloseDecision::AlreadyFinal(s),
        OrderStatus::PendingPayment if now < order.due_at() => CloseDecision::NotYetDue(now.until(order.due_at())),
        OrderStatus::PendingPayment if order.payment_attempts == 0 => CloseDecision::CloseNow,
        OrderStatus::PendingPayment => CloseDecision::BeginClosing,
        OrderStatus::Closing => match &order.closing {
            Some(lease) if now < lease.lease_until => CloseDecision::LeaseHeld(now.until(lease.lease_until)),
            _ => CloseDecision::ResumeClosing,
        },
    }
}

/// What a trusted payment success means for the order it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentSuccessOutcome {
    /// PENDING_PAYMENT or CLOSING: the order becomes PAID.
    MarkPaid,
    /// The order is PAID by this same payment: a duplicate.
    Duplicate,
    /// The order is CLOSED, or PAID by a different payment: the money must
    /// go back; the order is never revived (docs/design.md#no-revival).
    Refund,
}

pub fn on_payment_success(status: OrderStatus, paid_by_same_payment: bool) -> PaymentSuccessOutcome {
    match status {
        OrderStatus::PendingPayment | OrderStatus::Closing => PaymentSuccessOutcome::MarkPaid,
        OrderStatus::Paid if paid_by_same_payment => PaymentSuccessOutcome::Duplicate,
        OrderStatus::Paid | OrderStatus::Closed => PaymentSuccessOutcome::Refund,
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use OrderEvent::*;
    use OrderStatus::*;

    #[test]
    fn every_state_and_event_has_the_specified_outcome() {
        let expected = |s, e| -> Result<Step<OrderStatus>, ()> {
            match (s, e) {
                (PendingPayment, CloseUnpaid) => Ok(Step::Moved(Closed)),
                (PendingPayment, BeginClosing) => Ok(Step::Moved(Closing)),
                (PendingPayment, PaymentSucceeded) => Ok(Step::Moved(Paid)),
                (PendingPayment, ConfirmUnpaid) => Err(()),
                (Closing, CloseUnpaid) => Err(()),
                (Closing, BeginClosing) => Ok(Step::Moved(Closing)),
                (Closing, ConfirmUnpaid) => Ok(Step::Moved(Closed)),
                (Closing, PaymentSucceeded) => Ok(Step::Moved(Paid)),
                (Paid, PaymentSucceeded) => Ok(Step::AlreadyThere),
                (Paid, _) => Err(()),
                (Closed, CloseUnpaid | ConfirmUnpaid) => Ok(Step::AlreadyThere),
                (Closed, _) => Err(()),
            }
        };
        for s in OrderStatus::ALL {
            for e in OrderEvent::ALL {
                assert_eq!(apply(s, e).map_err(|_| ()), expected(s, e), "{s:?} + {e:?}");
            }
        }
    }

    #[test]
    fn each_event_has_its_sources_and_one_target() {
        assert_eq!(transition(CloseUnpaid), (vec![PendingPayment], Closed));
        assert_eq!(transition(BeginClosing), (vec![PendingPayment, Closing], Closing));
        assert_eq!(transition(ConfirmUnpaid), (vec![Closing], Closed));
        assert_eq!(transition(PaymentSucceeded), (vec![PendingPayment, Closing], Paid));
    }

    #[test]
    fn terminal_states_never_move() {
        for s in [Paid, Closed] {
            for e in OrderEvent::ALL {
                if let Ok(Step::Moved(to)) = apply(s, e) {
                    panic!("{s:?} moved to {to:?} on {e:?}");
                }
            }
        }
    }

    #[test]
    fn a_payment_after_close_is_refunded_never_revived() {
        assert_eq!(on_payment_success(Closed, false), PaymentSuccessOutcome::Refund);
        assert_eq!(on_payment_success(Paid, false), PaymentSuccessOutcome::Refund);
        assert_eq!(on_payment_success(Paid, true), PaymentSuccessOutcome::Duplicate);
        assert_eq!(on_payment_success(Closing, false), PaymentSuccessOutcome::MarkPaid);
        assert_eq!(on_payment_success(PendingPayment, false), PaymentSuccessOutcome::MarkPaid);
    }

    pub(crate) fn order(status: OrderStatus, expire_ms: i64, attempts: u32) -> Order {
        Order {
            order_id: OrderId::parse("ord_1").unwrap(),
            user_id: UserId::parse("u1").unwrap(),
            status,
            version: 1,
            currency: Currency::parse("EUR").unwrap(),
            items: vec![],
            amount_total: 100,
            coupon_id: None,
            created_at: Timestamp::from_unix_millis(0),
            expire_at: Timestamp::from_unix_millis(expire_ms),
            expiry_rule_version: "v1".into(),
            cancel_requested_at: None,
            expiring_soon_at: None,
            points: 0,
            payment_attempts: attempts,
            closing: None,
            paid_by: None,
            history: vec![],
            checks: vec![],
        }
    }

    #[test]
    fn an_early_wake_up_never_closes() {
        let o = order(PendingPayment, 10_000, 0);
        assert_eq!(
            decide_close(&o, Timestamp::from_unix_millis(4_000)),
            CloseDecision::NotYetDue(Duration::from_secs(6))
        );
    }

    #[test]
    fn a_due_order_without_attempts_closes_in_one_step_and_with_attempts_goes_through_closing() {
        let now = Timestamp::from_unix_millis(10_000);
        assert_eq!(decide_close(&order(PendingPayment, 10_000, 0), now), CloseDecision::CloseNow);
        assert_eq!(decide_close(&order(PendingPayment, 10_000, 2), now), CloseDecision::BeginClosing);
    }

    #[test]
    fn a_cancel_request_makes_an_open_order_due_at_once_and_names_the_close() {
        let mut o = order(PendingPayment, 10_000, 0);
        assert_eq!(o.close_reason(), CloseReason::Expired);
        o.cancel_requested_at = Some(Timestamp::from_unix_millis(4_000));
        assert_eq!(o.due_at(), Timestamp::from_unix_millis(4_000));
        assert_eq!(o.close_reason(), CloseReason::BuyerCancelled);
        assert_eq!(
            decide_close(&o, Timestamp::from_unix_millis(3_999)),
            CloseDecision::NotYetDue(Duration::from_millis(1))
        );
        assert_eq!(decide_close(&o, Timestamp::from_unix_millis(4_000)), CloseDecision::CloseNow);
        o.payment_attempts = 1;
        assert_eq!(decide_close(&o, Timestamp::from_unix_millis(4_000)), CloseDecision::BeginClosing);
        // A cancel never moves the due time later than the window's end.
        o.cancel_requested_at = Some(Timestamp::from_unix_millis(20_000));
        assert_eq!(o.due_at(), Timestamp::from_unix_millis(10_000));
        // Nor does it reopen a final order.
        for s in [Paid, Closed] {
            let mut f = order(s, 10_000, 1);
            f.cancel_requested_at = Some(Timestamp::from_unix_millis(1));
            assert_eq!(decide_close(&f, Timestamp::from_unix_millis(5_000)), CloseDecision::AlreadyFinal(s));
        }
    }

    #[test]
    fn final_orders_are_acknowledged() {
        let now = Timestamp::from_unix_millis(0);
        assert_eq!(decide_close(&order(Paid, 10, 1), now), CloseDecision::AlreadyFinal(Paid));
        assert_eq!(decide_close(&order(Closed, 10, 0), now), CloseDecision::AlreadyFinal(Closed));
    }

    #[test]
    fn a_live_lease_is_respected_and_an_expired_one_is_resumed() {
        let mut o = order(Closing, 0, 1);
        o.closing = Some(ClosingLease {
            started_at: Timestamp::from_unix_millis(0),
            owner: "a".into(),
            lease_until: Timestamp::from_unix_millis(5_000),
            resumes: 0,
        });
        assert_eq!(
            decide_close(&o, Timestamp::from_unix_millis(2_000)),
            CloseDecision::LeaseHeld(Duration::from_secs(3))
        );
        assert_eq!(decide_close(&o, Timestamp::from_unix_millis(5_000)), CloseDecision::ResumeClosing);
        o.closing = None;
        assert_eq!(decide_close(&o, Timestamp::from_unix_millis(0)), CloseDecision::ResumeClosing);
    }
}
