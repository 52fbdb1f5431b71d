//! Stock reservations (docs/design.md#holdings). Stock moves because a
//! reservation changes state, never because a message arrived: a duplicate
//! release finds RELEASED and adds nothing.

use super::{Refused, Step};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReservationStatus {
    Reserved,
    Released,
    Confirmed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservationEvent {
    /// The order closed: give the stock back.
    Release,
    /// The order was paid: the stock is sold.
    Confirm,
}

impl ReservationStatus {
    pub const ALL: [Self; 3] = [Self::Reserved, Self::Released, Self::Confirmed];
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "RESERVED",
            Self::Released => "RELEASED",
            Self::Confirmed => "CONFIRMED",
        }
    }
}

/// A CONFIRMED reservation refuses `Release` — releasing sold stock would
/// oversell; callers log it as an invariant breach and count it.
pub fn apply(from: ReservationStatus, event: ReservationEvent) -> Result<Step<ReservationStatus>, Refused> {
    use ReservationEvent::*;
    use ReservationStatus::*;
    match (from, event) {
        (Reserved, Release) => Ok(Step::Moved(Released)),
        (Reserved, Confirm) => Ok(Step::Moved(Confirmed)),
        (Released, Release) | (Confirmed, Confirm) => Ok(Step::AlreadyThere),
        (Released, Confirm) => Err(Refused { from: "RELEASED", event: "confirm" }),
        (Confirmed, Release) => Err(Refused { from: "CONFIRMED", event: "release" }),
    }
}

/// The states `event` moves a reservation out of, and the one it moves it
/// to, read off [`apply`] (the store's write condition).
pub fn transition(event: ReservationEvent) -> (Vec<ReservationStatus>, ReservationStatus) {
    super::transition_of(&ReservationStatus::ALL, event, apply)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReservationEvent::*;
    use ReservationStatus::*;

    #[test]
    fn only_a_reserved_reservation_moves() {
        assert_eq!(transition(Release), (vec![Reserved], Released));
        assert_eq!(transition(Confirm), (vec![Reserved], Confirmed));
    }

    #[test]
    fn every_state_and_event() {
        let cases = [
            (Reserved, Release, Ok(Step::Moved(Released))),
            (Reserved, Confirm, Ok(Step::Moved(Confirmed))),
            (Released, Release, Ok(Step::AlreadyThere)),
            (Released, Confirm, Err(())),
            (Confirmed, Confirm, Ok(Step::AlreadyThere)),
            (Confirmed, Release, Err(())),
        ];
        for (s, e, want) in cases {
            assert_eq!(apply(s, e).map_err(|_| ()), want, "{s:?} + {e:?}");
        }
    }
}
