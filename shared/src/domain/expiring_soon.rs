//! The heads-up before expiry: which open orders get an `OrderExpiringSoon`
//! notice, and which orders a pass over the due index looks at.
//!
//! The notice is a fact recorded on the order (`expiring_soon_at`), written
//! once by a conditional write and published by the relay like every other
//! fact; it is not a state change. The rules here are the pure half:
//! - an order whose window is shorter than twice the lead gets no notice (a
//!   buyer told "5 minutes left" 2 minutes after ordering learns nothing);
//! - a notice is due from `expire_at - lead - period` (one pass early at
//!   most, so it is never later than `lead` before expiry when the passes
//!   run on time) until `expire_at` (after that it says nothing true);
//! - a pass at `now` looks at the orders due in
//!   `(now + lead + period - 2 * period, now + lead + period]`: every order
//!   is in the range of two consecutive passes, so one missed or late pass
//!   loses no notice, and the second look finds it noticed already (a
//!   refused conditional write, never a second notice).

use super::Timestamp;
use std::time::Duration;

/// The default lead (`ExpiringSoonLeadSeconds`): five minutes.
pub const DEFAULT_LEAD: Duration = Duration::from_secs(300);

/// How often the pass runs: its schedule is `rate(1 minute)`.
pub const PASS_PERIOD: Duration = Duration::from_secs(60);

/// Whether an order with this window gets a notice at all: a lead of zero
/// turns notices off; a window shorter than twice the lead gets none.
pub fn window_gets_notice(window: Duration, lead: Duration) -> bool {
    !lead.is_zero() && window >= lead.saturating_mul(2)
}

/// The latest `created_at` an order expiring at `expire_at` may have to
/// get a notice (its window at least twice the lead): the bound the
/// conditional write checks, since the index entry carries only the due time.
pub fn latest_created_for_notice(expire_at: Timestamp, lead: Duration) -> Timestamp {
    expire_at.minus(lead.saturating_mul(2))
}

/// The due times a pass at `now` looks at: `(after, through]`.
pub fn pass_range(now: Timestamp, lead: Duration, period: Duration) -> (Timestamp, Timestamp) {
    let through = now.plus(lead).plus(period);
    (through.minus(period.saturating_mul(2)), through)
}

/// Whether an order created at `created_at`, expiring at `expire_at`, may
/// be noticed at `now`: the rule the store's conditional write enforces,
/// stated once for tests and readers.
pub fn notice_due(created_at: Timestamp, expire_at: Timestamp, now: Timestamp, lead: Duration) -> bool {
    window_gets_notice(created_at.until(expire_at), lead)
        && now < expire_at
        && now >= expire_at.minus(lead).minus(PASS_PERIOD)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_unix_millis(s * 1000)
    }
    const LEAD: Duration = Duration::from_secs(300);

    #[test]
    fn a_window_shorter_than_twice_the_lead_gets_no_notice_and_a_zero_lead_none_at_all() {
        assert!(!window_gets_notice(Duration::from_secs(599), LEAD));
        assert!(window_gets_notice(Duration::from_secs(600), LEAD));
        assert!(window_gets_notice(Duration::from_secs(1800), LEAD));
        assert!(!window_gets_notice(Duration::from_secs(1800), Duration::ZERO));
        assert_eq!(latest_created_for_notice(t(1800), LEAD), t(1200));
    }

    #[test]
    fn a_notice_is_due_from_one_period_before_the_lead_until_expiry() {
        let (created, expire) = (t(0), t(1800));
        assert!(!notice_due(created, expire, t(1439), LEAD), "more than lead + period early");
        assert!(notice_due(created, expire, t(1440), LEAD));
        assert!(notice_due(created, expire, t(1500), LEAD));
        assert!(notice_due(created, expire, t(1799), LEAD));
        assert!(!notice_due(created, expire, t(1800), LEAD), "at expiry it says nothing true");
        assert!(!notice_due(t(1300), expire, t(1500), LEAD), "a 500 s window is under twice the lead");
    }

    /// Every due time is in the range of two consecutive passes on time,
    /// and each pass that sees it can still notice it (before expiry, not
    /// earlier than the rule allows).
    #[test]
    fn every_order_is_seen_by_two_consecutive_passes_each_allowed_to_notice_it() {
        let period = PASS_PERIOD;
        for lead_s in [60u64, 120, 300, 900] {
            let lead = Duration::from_secs(lead_s);
            for expire_s in (3000..3300).step_by(7) {
                let expire = t(expire_s);
                let passes: Vec<Timestamp> = (0..100).map(|k| t(k * 60)).collect();
                let seen: Vec<&Timestamp> = passes
                    .iter()
                    .filter(|now| {
                        let (after, through) = pass_range(**now, lead, period);
                        after < expire && expire <= through
                    })
                    .collect();
                assert_eq!(seen.len(), 2, "lead {lead_s}, expire {expire_s}: {seen:?}");
                for now in seen {
                    assert!(notice_due(t(0), expire, *now, lead), "lead {lead_s} expire {expire_s} at {now}");
                    let before = now.until(expire);
                    assert!(before <= lead + period && before > lead - period, "{before:?}");
                }
            }
        }
    }
}
