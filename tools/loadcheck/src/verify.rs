//! The invariant check after a run (issue 9 item 1). It reads the records
//! directly (the orders table, the sandbox ledger, the queues) and checks
//! them on its own terms, without the domain crate's decoding or the
//! reconcile use case's logic, so that a bug there cannot hide a violation
//! here; it also runs reconciliation and requires it clean for the run.
//!
//! (Being written: the interface below is fixed; the body is not yet.)

use crate::stack::Stack;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use time::OffsetDateTime;

/// What the run created: only these are checked, so other traffic on the
/// same stack (the end-to-end tests) never counts against the run.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// The order ids the API answered with (every accepted create).
    pub orders: BTreeSet<String>,
    /// The run's SKUs with the stock each was seeded with (reserved and
    /// sold 0 at seed time, and nothing else sells them).
    pub skus: BTreeMap<String, i64>,
    /// The run's coupons (each issued AVAILABLE to one buyer of the run).
    pub coupons: BTreeSet<String>,
    /// How long past `expire_at` an order may still be open before that is
    /// a violation: the sweep's period + grace + the CLOSING lease, and the
    /// run's own slack.
    pub open_bound: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant, short and stable (e.g. `two_final_transitions`).
    pub invariant: &'static str,
    /// What it is about (an order id, `SKU#…`, a queue name).
    pub subject: String,
    pub detail: String,
}

/// One order as found after the run.
#[derive(Debug, Clone)]
pub struct OrderOutcome {
    pub order_id: String,
    /// Its status (PAID, CLOSED, or whatever it is stuck in).
    pub status: String,
    pub expire_at: OffsetDateTime,
    /// When it became final (its history's final transition), if it did.
    pub final_at: Option<OffsetDateTime>,
    /// Whether a late payment of it was refunded (a REFUND record exists).
    pub refunds: usize,
}

impl OrderOutcome {
    /// `final_at - expire_at` in milliseconds (negative for an order paid
    /// before its window ended).
    pub fn delay_ms(&self) -> Option<i64> {
        self.final_at.map(|f| ((f - self.expire_at).whole_milliseconds()) as i64)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    pub orders: Vec<OrderOutcome>,
    /// Figures for the summary: e.g. `orders.PAID`, `refunds.REFUNDED`,
    /// `channel.successes`, `dlq.<name>`, `reconcile.<kind>`.
    pub counts: BTreeMap<String, i64>,
}

/// Checks every invariant over the run's records. Call it after the drain
/// (every order final, every effect settled), or it reports what is not.
pub async fn verify(_stack: &Stack, _scope: &Scope) -> Result<Verdict, String> {
    Err("the invariant check is not written yet".into())
}
