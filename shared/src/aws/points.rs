//! The DynamoDB adapter of [`PointsLedger`]: an operator's credit of a
//! buyer's points and its audit record in one transaction, keyed by the
//! request's idempotency key, so a credit whose answer was lost and is
//! sent again is applied once.

use super::dynamo::{from_item, key, keys, n, s, to_item, DynamoStore, Item};
use crate::domain::points::{PointsBalance, PointsCredit};
use crate::domain::*;
use crate::ports::Unavailable;
use crate::store::{PointsLedger, PointsWritten};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{ReturnValuesOnConditionCheckFailure, Update};

/// The reconcile-index partition listing every points balance, so the day
/// run's catalog piece finds them by a Query (each credit lists its
/// balance; a balance exists only once credited).
pub use crate::usecases::reconcile_day::POINTS_PART;

/// The balance's update for `c`: the delta added to `available` and to
/// `credited`, one more change; a debit only while `available` covers it
/// (points held by open orders are not available).
fn balance_update(store: &DynamoStore, c: &PointsCredit) -> Update {
    let mut u = Update::builder()
        .table_name(store.table())
        .set_key(Some(key(keys::buyer(&c.user_id), keys::POINTS_SK)))
        .update_expression(
            "SET available = if_not_exists(available, :zero) + :d, held = if_not_exists(held, :zero), \
             spent = if_not_exists(spent, :zero), user_id = :u, currency = :cur, entity = :e, recon_part = :part, \
             recon_at = :pk ADD credited :d, changes :one",
        )
        .expression_attribute_values(":cur", s(c.currency.as_str()))
        .expression_attribute_values(":d", n(c.delta))
        .expression_attribute_values(":zero", n(0))
        .expression_attribute_values(":one", n(1))
        .expression_attribute_values(":u", s(c.user_id.as_str()))
        .expression_attribute_values(":e", s("POINTS"))
        .expression_attribute_values(":part", s(POINTS_PART))
        .expression_attribute_values(":pk", s(keys::buyer(&c.user_id)))
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
    // One currency per balance, fixed by its first credit.
    let same_currency = "(attribute_not_exists(currency) OR currency = :cur)";
    u = if c.delta < 0 {
        u.condition_expression(format!("{same_currency} AND available >= :min"))
            .expression_attribute_values(":min", n(-c.delta))
    } else {
        u.condition_expression(same_currency)
    };
    u.build().expect("complete update")
}

/// The credit's audit record, written only if its key was never used for
/// the buyer (see [`DynamoStore::write_with_record`]).
fn record_item(c: &PointsCredit) -> Item {
    let mut item = to_item(c);
    item.extend(key(keys::buyer(&c.user_id), &keys::points_change_sk(&c.key)));
    item.insert("entity".into(), s("POINTS_CHANGE"));
    item
}

fn present(item: Option<Item>) -> Option<Item> {
    item.filter(|i| !i.is_empty())
}

#[async_trait]
impl PointsLedger for DynamoStore {
    async fn credit_points(&self, c: &PointsCredit) -> Result<PointsWritten, Unavailable> {
        let Some((balance, record)) =
            self.write_with_record(balance_update(self, c), record_item(c), "credit points").await?
        else {
            return Ok(PointsWritten::Applied);
        };
        if let Some(done) = present(record) {
            return Ok(PointsWritten::KeyUsed(from_item(done, "points change record")?));
        }
        // The debit's condition: an engine that does not hand back the old
        // item of a transaction leaves it empty; a read tells how many
        // points there are (it changes nothing).
        let found = match present(balance) {
            Some(item) => Some(from_item::<PointsBalance>(item, "points balance")?),
            None => self.points_balance(&c.user_id).await?,
        };
        Ok(match found {
            Some(PointsBalance { currency: Some(cur), .. }) if cur != c.currency => {
                PointsWritten::CurrencyMismatch { currency: cur }
            }
            found => PointsWritten::Insufficient { available: found.map_or(0, |b| b.available) },
        })
    }

    async fn points_credit(&self, user: &UserId, k: &IdempotencyKey) -> Result<Option<PointsCredit>, Unavailable> {
        self.get_record(keys::buyer(user), &keys::points_change_sk(k), "points change record").await
    }

    async fn points_balance(&self, user: &UserId) -> Result<Option<PointsBalance>, Unavailable> {
        self.get_record(keys::buyer(user), keys::POINTS_SK, "points balance").await
    }

    async fn points_credits(&self, user: &UserId) -> Result<Vec<PointsCredit>, Unavailable> {
        let mut out: Vec<PointsCredit> = self
            .records_under(keys::buyer(user), keys::POINTS_CHANGE_PREFIX, "read points changes", "points change record")
            .await?;
        out.sort_by(|a, b| (a.at, a.key.as_str()).cmp(&(b.at, b.key.as_str())));
        Ok(out)
    }
}
