//! A buyer's loyalty points: the balance (`BUYER#<user>` / `POINTS`) and
//! the operators' audited credits (`BUYER#<user>` / `POINTS_CHANGE#<key>`).
//!
//! Orders move points between `available`, `held` and `spent` and never
//! make or destroy one (an order's points are a holding: held at create,
//! back to `available` when it closes, `spent` when it is paid); only an
//! operator's credit changes `credited`, written with its record in one
//! transaction. So `available + held + spent = credited` always, and
//! `credited` is the sum of the records: reconciliation checks both, and
//! `held` against the points the open orders hold.

use super::*;
use serde::{Deserialize, Serialize};

/// The balance as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PointsBalance {
    pub user_id: UserId,
    /// The currency whose minor unit one point is worth, fixed by the
    /// first credit: points are spent only on orders in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<Currency>,
    #[serde(default)]
    pub available: i64,
    #[serde(default)]
    pub held: i64,
    #[serde(default)]
    pub spent: i64,
    /// The sum of the operators' credits.
    #[serde(default)]
    pub credited: i64,
    /// How many credit records there are.
    #[serde(default)]
    pub changes: u64,
}

/// One operator's credit (negative: a debit) of a buyer's points.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PointsCredit {
    pub user_id: UserId,
    /// The balance's currency (one point = one minor unit of it).
    pub currency: Currency,
    pub key: IdempotencyKey,
    pub delta: i64,
    /// Why, as the operator gave it (shown in the admin view).
    pub reason: String,
    /// The caller (the IAM identity of the admin route).
    pub by: String,
    pub at: Timestamp,
}

impl PointsCredit {
    /// Two requests with one key are the same credit when these agree.
    pub fn same_request(&self, other: &PointsCredit) -> bool {
        self.user_id == other.user_id
            && self.currency == other.currency
            && self.delta == other.delta
            && self.reason == other.reason
    }
}

/// What does not add up on a balance: `available + held + spent` against
/// `credited`, and `credited` and `changes` against the records.
pub fn audit_disagreements(b: &PointsBalance, records: &[PointsCredit]) -> Vec<String> {
    let mut out = Vec::new();
    let sum = b.available + b.held + b.spent;
    if sum != b.credited {
        out.push(format!(
            "available {} + held {} + spent {} = {sum}, not the credited {}",
            b.available, b.held, b.spent, b.credited
        ));
    }
    let total: i64 = records.iter().map(|r| r.delta).sum();
    if total != b.credited || records.len() as u64 != b.changes {
        out.push(format!(
            "credited {} over {} changes, but {} audit records add up to {total}",
            b.credited,
            b.changes,
            records.len()
        ));
    }
    if b.available < 0 || b.held < 0 || b.spent < 0 {
        out.push("a count is negative".to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credit(delta: i64) -> PointsCredit {
        PointsCredit {
            user_id: UserId::parse("u").unwrap(),
            currency: Currency::parse("EUR").unwrap(),
            key: IdempotencyKey::parse("k").unwrap(),
            delta,
            reason: "r".into(),
            by: "ops".into(),
            at: Timestamp::from_unix_millis(0),
        }
    }

    #[test]
    fn a_balance_that_adds_up_has_no_disagreement() {
        let b = PointsBalance {
            user_id: UserId::parse("u").unwrap(),
            currency: None,
            available: 50,
            held: 30,
            spent: 20,
            credited: 100,
            changes: 2,
        };
        assert!(audit_disagreements(&b, &[credit(120), credit(-20)]).is_empty());
    }

    #[test]
    fn each_way_a_balance_can_disagree_is_named() {
        let base = PointsBalance {
            user_id: UserId::parse("u").unwrap(),
            currency: None,
            available: 50,
            held: 30,
            spent: 20,
            credited: 100,
            changes: 1,
        };
        let held_more = PointsBalance { held: 31, ..base.clone() };
        assert!(audit_disagreements(&held_more, &[credit(100)])[0].contains("not the credited 100"));
        let unrecorded = PointsBalance { available: 60, credited: 110, ..base.clone() };
        assert!(audit_disagreements(&unrecorded, &[credit(100)])[0].contains("add up to 100"));
        assert!(audit_disagreements(&base, &[credit(100), credit(0)])[0].contains("2 audit records"));
    }
}
