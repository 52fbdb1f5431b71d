//! An operator's credit of a buyer's loyalty points (`POST
//! /admin/buyers/{user_id}/points`) and the balance with its audited
//! credits (`GET`). Orders hold, return and spend points through the
//! holding protocol ([`crate::store::Caps::holdings`]); only this use case
//! adds points to a balance or takes them away.

use crate::domain::points::{PointsBalance, PointsCredit};
use crate::domain::*;
use crate::ports::Clock;
use crate::store::{PointsLedger, PointsWritten};
use crate::usecases::UseCaseError;
use tracing::info;

/// The largest credit or debit one request makes.
pub const MAX_CREDIT: i64 = 1_000_000_000;

/// What an operator asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreditRequest {
    pub user_id: UserId,
    /// The balance's currency: one point is one minor unit of it.
    pub currency: Currency,
    pub key: IdempotencyKey,
    /// Points to add (negative: to take away).
    pub delta: i64,
    pub reason: String,
    pub by: String,
}

/// A balance and the credits that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointsView {
    pub balance: PointsBalance,
    pub credits: Vec<PointsCredit>,
}

/// Applies the credit once per key: a re-sent request (its answer lost)
/// answers as the first did, with the balance as it is now; the key used
/// again for another credit is refused.
pub async fn credit_points<S: PointsLedger>(
    store: &S,
    clock: &dyn Clock,
    req: CreditRequest,
) -> Result<(PointsBalance, bool), UseCaseError> {
    let credit = PointsCredit {
        user_id: req.user_id.clone(),
        currency: req.currency,
        key: req.key,
        delta: req.delta,
        reason: req.reason,
        by: req.by,
        at: clock.now(),
    };
    let done = match store.points_credit(&credit.user_id, &credit.key).await? {
        Some(done) => Some(done),
        None => match store.credit_points(&credit).await? {
            PointsWritten::Applied => {
                info!(user_id = %credit.user_id, delta = credit.delta, by = %credit.by, key = %credit.key, "points credited");
                None
            }
            PointsWritten::KeyUsed(done) => Some(done),
            PointsWritten::CurrencyMismatch { currency } => {
                return Err(UseCaseError::conflict(
                    "points_currency_mismatch",
                    format!(
                        "buyer {}'s points are kept in {currency}, not {}: credit them in {currency}",
                        credit.user_id, credit.currency
                    ),
                ))
            }
            PointsWritten::Insufficient { available } => {
                return Err(UseCaseError::conflict(
                    "not_enough_points",
                    format!(
                        "buyer {} has {available} points available (points held by open orders are not), fewer \
                         than the {} to take away",
                        credit.user_id, -credit.delta
                    ),
                ))
            }
        },
    };
    if let Some(done) = &done {
        if !done.same_request(&credit) {
            return Err(UseCaseError::conflict(
                "idempotency_key_reused",
                format!(
                    "this Idempotency-Key was already used for another credit of buyer {} ({} points: {}); use a \
                     new key",
                    done.user_id, done.delta, done.reason
                ),
            ));
        }
    }
    let balance = balance_of(store, &credit.user_id).await?;
    Ok((balance, done.is_some()))
}

/// The buyer's balance (all zero before any credit) and its credits.
pub async fn points_view<S: PointsLedger>(store: &S, user: &UserId) -> Result<PointsView, UseCaseError> {
    let balance = balance_of(store, user).await?;
    let credits = store.points_credits(user).await?;
    Ok(PointsView { balance, credits })
}

async fn balance_of<S: PointsLedger>(store: &S, user: &UserId) -> Result<PointsBalance, UseCaseError> {
    Ok(store.points_balance(user).await?.unwrap_or(PointsBalance {
        user_id: user.clone(),
        currency: None,
        available: 0,
        held: 0,
        spent: 0,
        credited: 0,
        changes: 0,
    }))
}
