//! Coupon locks (docs/design.md#coupon-rule). An order locks a coupon when it
//! is created; when the order ends, the lock ends in one of four outcomes
//! with a reason: AVAILABLE (given back), EXPIRED (its own validity passed
//! meanwhile), VOID (cancelled by an operator rule) or USED (the order was
//! paid).

use super::{Refused, Step};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CouponLockStatus {
    Locked,
    Available,
    Expired,
    Void,
    Used,
}

/// The state of the coupon itself, as the coupon service shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CouponState {
    Available,
    Locked,
    Used,
    Expired,
    Void,
}

impl CouponState {
    /// The state's name as stored and shown (its serde form).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Available => "AVAILABLE",
            Self::Locked => "LOCKED",
            Self::Used => "USED",
            Self::Expired => "EXPIRED",
            Self::Void => "VOID",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CouponLockEvent {
    /// The order closed; `still_valid` says whether the coupon's own
    /// validity has not yet passed.
    Release {
        still_valid: bool,
    },
    Void,
    Use,
}

impl CouponLockStatus {
    pub const ALL: [Self; 5] = [Self::Locked, Self::Available, Self::Expired, Self::Void, Self::Used];
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Locked => "LOCKED",
            Self::Available => "AVAILABLE",
            Self::Expired => "EXPIRED",
            Self::Void => "VOID",
            Self::Used => "USED",
        }
    }
}

impl CouponLockEvent {
    fn as_str(self) -> &'static str {
        match self {
            Self::Release { .. } => "release",
            Self::Void => "void",
            Self::Use => "use",
        }
    }
}

pub fn apply(from: CouponLockStatus, event: CouponLockEvent) -> Result<Step<CouponLockStatus>, Refused> {
    use CouponLockEvent as E;
    use CouponLockStatus::*;
    match (from, event) {
        (Locked, E::Release { still_valid: true }) => Ok(Step::Moved(Available)),
        (Locked, E::Release { still_valid: false }) => Ok(Step::Moved(Expired)),
        (Locked, E::Void) => Ok(Step::Moved(Void)),
        (Locked, E::Use) => Ok(Step::Moved(Used)),
        // A repeated release is a duplicate whichever way the first went.
        (Available | Expired, E::Release { .. }) | (Void, E::Void) | (Used, E::Use) => Ok(Step::AlreadyThere),
        (from, e) => Err(Refused { from: from.as_str(), event: e.as_str() }),
    }
}

/// The states `event` moves a coupon lock out of, and the one it moves it
/// to, read off [`apply`] (the store's write condition).
pub fn transition(event: CouponLockEvent) -> (Vec<CouponLockStatus>, CouponLockStatus) {
    super::transition_of(&CouponLockStatus::ALL, event, apply)
}

/// The event that ends a lock in `to`.
pub fn event_for(to: CouponLockStatus) -> Option<CouponLockEvent> {
    match to {
        CouponLockStatus::Available => Some(CouponLockEvent::Release { still_valid: true }),
        CouponLockStatus::Expired => Some(CouponLockEvent::Release { still_valid: false }),
        CouponLockStatus::Void => Some(CouponLockEvent::Void),
        CouponLockStatus::Used => Some(CouponLockEvent::Use),
        CouponLockStatus::Locked => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CouponLockStatus::*;

    #[test]
    fn every_state_and_event() {
        let events = [
            CouponLockEvent::Release { still_valid: true },
            CouponLockEvent::Release { still_valid: false },
            CouponLockEvent::Void,
            CouponLockEvent::Use,
        ];
        for s in CouponLockStatus::ALL {
            for e in events {
                let got = apply(s, e).map_err(|_| ());
                let want = match (s, e) {
                    (Locked, CouponLockEvent::Release { still_valid: true }) => Ok(Step::Moved(Available)),
                    (Locked, CouponLockEvent::Release { still_valid: false }) => Ok(Step::Moved(Expired)),
                    (Locked, CouponLockEvent::Void) => Ok(Step::Moved(Void)),
                    (Locked, CouponLockEvent::Use) => Ok(Step::Moved(Used)),
                    (Available | Expired, CouponLockEvent::Release { .. }) => Ok(Step::AlreadyThere),
                    (Void, CouponLockEvent::Void) | (Used, CouponLockEvent::Use) => Ok(Step::AlreadyThere),
                    _ => Err(()),
                };
                assert_eq!(got, want, "{s:?} + {e:?}");
            }
        }
    }

    #[test]
    fn only_a_locked_coupon_lock_ends() {
        for to in [Available, Expired, Void, Used] {
            assert_eq!(transition(event_for(to).unwrap()), (vec![Locked], to));
        }
        assert_eq!(event_for(Locked), None);
    }

    #[test]
    fn a_used_coupon_is_never_given_back() {
        assert!(apply(Used, CouponLockEvent::Release { still_valid: true }).is_err());
    }
}
