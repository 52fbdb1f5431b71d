//! The pure domain: identifiers, money, time and the state machines of an
//! order's life: the order, its stock reservations and coupon lock
//! (`apply` + `transition`), and what may be recorded on a payment attempt
//! (`payment::may_record`), the refund record, and the integration events
//! other services see (`events`). Nothing here knows about AWS; every transition is a function from
//! a state and an event to the next state or a typed refusal.

pub mod catalog;
pub mod coupon;
pub mod events;
pub mod expiring_soon;
pub mod expiry_rules;
pub mod ids;
pub mod money;
pub mod order;
pub mod payment;
pub mod points;
pub mod records;
pub mod refund;
pub mod reservation;
pub mod time;

pub use catalog::{StockChange, StockChangeKind, StockChangeRecord};
pub use coupon::{CouponLockEvent, CouponLockStatus, CouponState};
pub use ids::{ChannelName, CouponId, IdempotencyKey, OrderId, PaymentId, Sku, UserId};
pub use money::{Currency, Price};
pub use order::{
    decide_close, CloseDecision, CloseReason, ClosingLease, OperatorCheck, Order, OrderEvent, OrderLine, OrderStatus,
    PaymentSuccessOutcome, StatusChange,
};
pub use payment::{PaymentStatus, RefundStatus};
pub use records::{Coupon, CouponLock, Evidence, OrderRecord, PaymentAttempt, Reservation, ResourceType, Stock};
pub use refund::Refund;
pub use reservation::{ReservationEvent, ReservationStatus};
pub use time::{Day, Timestamp};

/// The result of applying an event to a state: either the state moves, or
/// the thing already happened and applying it again changes nothing. Keeping
/// "already there" apart from "moved" is what makes duplicate deliveries
/// harmless: the caller acknowledges them without writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<S> {
    Moved(S),
    AlreadyThere,
}

/// The states `event` moves out of, and the one state it moves them to,
/// read off a machine's `apply` over all of its states. Shared by the order,
/// reservation and coupon-lock machines; the store builds its write
/// conditions from the result.
pub(crate) fn transition_of<S: Copy + PartialEq, E: Copy>(
    all: &[S],
    event: E,
    apply: fn(S, E) -> Result<Step<S>, Refused>,
) -> (Vec<S>, S) {
    let moves: Vec<(S, S)> = all
        .iter()
        .filter_map(|&s| match apply(s, event) {
            Ok(Step::Moved(to)) => Some((s, to)),
            _ => None,
        })
        .collect();
    let to = moves.first().map(|m| m.1).expect("every event moves some state");
    debug_assert!(moves.iter().all(|m| m.1 == to), "one target per event");
    (moves.into_iter().map(|m| m.0).collect(), to)
}

/// A transition the state machine does not allow. Terminal states refuse
/// everything that would leave them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{event} is not allowed from {from}")]
pub struct Refused {
    pub from: &'static str,
    pub event: &'static str,
}
