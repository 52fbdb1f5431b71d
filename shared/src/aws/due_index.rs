//! The DynamoDB adapter of [`DueIndex`]: paginated queries of one shard of
//! the sparse `due-index` GSI, and the sweep's cursor record. Layout in
//! `docs/data-model.md#the-due-index-gsi-due-index-open-orders-and-pending-effects`.

use super::dynamo::{key, keys, n, s, DynamoStore, Item};
use crate::domain::{OrderId, PaymentId, Timestamp};
use crate::ports::Unavailable;
use crate::store::{Cas, DueCursor, DueEntry, DueIndex, DueItem, DuePage, DuePageError, SweepCursors};
use async_trait::async_trait;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{AttributeValue as Av, ReturnConsumedCapacity, ReturnValue};

pub const DUE_INDEX: &str = "due-index";
const CURSOR_PK: &str = "SWEEP#CURSORS";
const CURSOR_SK: &str = "SWEEP";

/// Reads the record an index key points at, from its `pk`/`sk`.
pub fn due_item(pk: &str, sk: &str) -> DueItem {
    let unrecognised = || DueItem::Unrecognised { pk: pk.to_owned(), sk: sk.to_owned() };
    let Some(order_id) = pk.strip_prefix("ORDER#").and_then(|id| OrderId::parse(id).ok()) else {
        return unrecognised();
    };
    if sk == keys::ORDER_SK {
        return DueItem::Open(order_id);
    }
    match sk.strip_prefix("REFUND#").map(PaymentId::parse) {
        Some(Ok(payment_id)) => DueItem::Refund(order_id, payment_id),
        _ => unrecognised(),
    }
}

/// The due time an order's own writes give its entry: the lease's end
/// while CLOSING (begin / resume / hold), `expire_at` while PENDING_PAYMENT
/// (create), or the cancel request's time if the buyer asked first, and while CLOSED or PAID the final write's time plus the
/// effects grace (`closed_at` / `paid_at` + `effects_grace`, the `:fx_due`
/// of [`DynamoStore::effects_entry`]). `None` for an image without them.
fn own_due_time(order: &Item, effects_grace: std::time::Duration) -> Option<Timestamp> {
    let text = |v: Option<&Av>| v.and_then(|v| v.as_s().ok()).and_then(|t| Timestamp::parse(t).ok());
    match order.get("status").and_then(|v| v.as_s().ok()).map(String::as_str) {
        Some("CLOSING") => text(order.get("closing").and_then(|c| c.as_m().ok()).and_then(|c| c.get("lease_until"))),
        // Due at `expire_at`, or when its buyer asked to cancel if sooner.
        Some("PENDING_PAYMENT") => {
            let expire_at = text(order.get("expire_at"));
            match (expire_at, text(order.get("cancel_requested_at"))) {
                (Some(e), Some(c)) if c < e => Some(c),
                _ => expire_at,
            }
        }
        Some("CLOSED") => text(order.get("closed_at")).map(|at| at.plus(effects_grace)),
        Some("PAID") => text(order.get("paid_at")).map(|at| at.plus(effects_grace)),
        _ => None,
    }
}

impl DynamoStore {
    /// One page of a shard of the due index, oldest first, whose `due_at`
    /// meets `due_at_condition` (its placeholders in `times`): the query of
    /// the sweep ([`DueIndex::due_page`]) and of the expiring-soon pass.
    pub(super) fn due_index_query(
        &self,
        shard: &str,
        due_at_condition: &str,
        times: &[(&str, Timestamp)],
        limit: u32,
        start: Option<&DueCursor>,
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder {
        let mut query = self
            .client()
            .query()
            .table_name(self.table())
            .index_name(DUE_INDEX)
            .key_condition_expression(format!("due_shard = :shard AND {due_at_condition}"))
            .expression_attribute_values(":shard", s(shard))
            .scan_index_forward(true)
            .limit(limit.clamp(1, 1000) as i32)
            .set_exclusive_start_key(start.map(item_of))
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        for (name, at) in times {
            query = query.expression_attribute_values(*name, s(at.to_string()));
        }
        query
    }
}

/// A page's `LastEvaluatedKey` as a cursor (every key attribute of these
/// indexes and the table is a string), and back: shared by every index
/// adapter (due, reconcile, buyer).
pub(super) fn cursor_of(item: &Item) -> DueCursor {
    item.iter().filter_map(|(k, v)| v.as_s().ok().map(|s| (k.clone(), s.clone()))).collect()
}

pub(super) fn item_of(cursor: &DueCursor) -> Item {
    cursor.iter().map(|(k, v)| (k.clone(), s(v.as_str()))).collect()
}

#[async_trait]
impl DueIndex for DynamoStore {
    fn shards(&self) -> Vec<String> {
        let count = self.shards().sweep_count;
        [keys::OPEN_PREFIX, keys::EFFECTS_PREFIX]
            .iter()
            .flat_map(|prefix| (0..count).map(move |i| format!("{prefix}{i}")))
            .collect()
    }

    fn is_open_shard(&self, shard: &str) -> bool {
        shard.starts_with(keys::OPEN_PREFIX)
    }

    async fn due_page(
        &self,
        shard: &str,
        cutoff: Timestamp,
        limit: u32,
        start: Option<DueCursor>,
    ) -> Result<DuePage, DuePageError> {
        let out = self
            .due_index_query(shard, "due_at <= :cutoff", &[(":cutoff", cutoff)], limit, start.as_ref())
            .send()
            .await
            .map_err(|e| {
                // The query is the same with or without a start key, so a
                // ValidationException with one is about the key: DynamoDB
                // says "The provided starting key is outside query
                // boundaries based on provided conditions", DynamoDB Local
                // "… does not match the range key predicate" (a cutoff
                // before the key), or "Exclusive Start Key must have same
                // size as table's key schema" (not a key of the index).
                let refused =
                    start.is_some() && e.as_service_error().and_then(|s| s.code()) == Some("ValidationException");
                let e = Unavailable::new("query due index", e);
                if refused {
                    DuePageError::CursorRejected(e)
                } else {
                    DuePageError::Unavailable(e)
                }
            })?;
        let is_open = shard.starts_with(keys::OPEN_PREFIX);
        let entries = out
            .items()
            .iter()
            .map(|item| {
                let get = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).map(String::as_str).unwrap_or("");
                let mut entry = due_item(get("pk"), get("sk"));
                // The same order key means "close it" in an OPEN shard and
                // "settle its effects" in an FX shard.
                if let (false, DueItem::Open(id)) = (is_open, &entry) {
                    entry = DueItem::OrderEffects(id.clone());
                }
                let due_at = Timestamp::parse(get("due_at")).unwrap_or(cutoff);
                DueEntry { item: entry, due_at, key: cursor_of(item) }
            })
            .collect();
        Ok(DuePage {
            entries,
            next: out.last_evaluated_key().map(cursor_of),
            consumed_capacity: out.consumed_capacity().and_then(|c| c.capacity_units()).unwrap_or(0.0),
        })
    }

    async fn snooze(&self, shard: &str, entry: &DueEntry, until: Timestamp) -> Result<Option<Timestamp>, Unavailable> {
        let (Some(pk), Some(sk), Some(seen)) = (entry.key.get("pk"), entry.key.get("sk"), entry.key.get("due_at"))
        else {
            return Ok(None);
        };
        // The condition compares the stored strings: the entry is exactly
        // the one the sweep read (same shard, same due time), so a lease
        // taken or held since, a final write, or (for an effects entry)
        // the effects done, which removes it, is never overwritten.
        let res = self
            .client()
            .update_item()
            .table_name(self.table())
            .key("pk", s(pk.as_str()))
            .key("sk", s(sk.as_str()))
            .update_expression("SET due_at = :until")
            .condition_expression("due_shard = :shard AND due_at = :seen")
            .expression_attribute_values(":until", s(until.to_string()))
            .expression_attribute_values(":shard", s(shard))
            .expression_attribute_values(":seen", s(seen.as_str()))
            // The order as it was, to tell the sweep how long it has really
            // been due (returned values cost no read capacity).
            .return_values(ReturnValue::AllOld)
            .send()
            .await;
        match res {
            Ok(out) => {
                let none = Item::new();
                let old = out.attributes().unwrap_or(&none);
                Ok(Some(own_due_time(old, self.effects_grace()).unwrap_or(entry.due_at)))
            }
            Err(e) if super::dynamo::is_condition_failure(&e) => Ok(None),
            Err(e) => Err(Unavailable::new("snooze a due-index entry", e)),
        }
    }

    async fn sweep_cursors(&self) -> Result<SweepCursors, Unavailable> {
        let Some(item) = self.get_item(CURSOR_PK.into(), CURSOR_SK).await? else {
            return Ok(SweepCursors::default());
        };
        let version = item.get("version").and_then(|v| v.as_n().ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
        let shards = match item.get("shards") {
            Some(Av::M(m)) => {
                m.iter().filter_map(|(shard, c)| c.as_m().ok().map(|c| (shard.clone(), cursor_of(c)))).collect()
            }
            _ => Default::default(),
        };
        Ok(SweepCursors { version, shards })
    }

    async fn save_sweep_cursors(&self, cursors: &SweepCursors) -> Result<Cas, Unavailable> {
        let shards = cursors.shards.iter().map(|(k, c)| (k.clone(), Av::M(item_of(c)))).collect();
        let mut item = key(CURSOR_PK.into(), CURSOR_SK);
        item.insert("entity".into(), s("SWEEP_CURSORS"));
        item.insert("version".into(), n(cursors.version + 1));
        item.insert("shards".into(), Av::M(shards));
        let res = self
            .client()
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk) OR version = :v")
            .expression_attribute_values(":v", n(cursors.version))
            .send()
            .await;
        match res {
            Ok(_) => Ok(Cas::Applied),
            Err(e) if super::dynamo::is_condition_failure(&e) => Ok(Cas::Rejected),
            Err(e) => Err(Unavailable::new("save sweep cursors", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_keys_name_the_record_they_point_at() {
        let o = OrderId::parse("ord_1").unwrap();
        assert_eq!(due_item("ORDER#ord_1", "ORDER"), DueItem::Open(o.clone()));
        assert_eq!(due_item("ORDER#ord_1", "REFUND#pay_9"), DueItem::Refund(o, PaymentId::parse("pay_9").unwrap()));
        assert!(matches!(due_item("SKU#x", "STOCK"), DueItem::Unrecognised { .. }));
        assert!(matches!(due_item("ORDER#ord_1", "RES#STOCK#x"), DueItem::Unrecognised { .. }));
    }

    #[test]
    fn an_open_order_is_due_at_its_expiry_or_at_its_buyers_cancel_if_sooner() {
        let s = |v: &str| Av::S(v.to_owned());
        let mut o: Item = [("status", s("PENDING_PAYMENT")), ("expire_at", s("2026-12-04T10:30:00.000Z"))]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let grace = std::time::Duration::from_secs(120);
        assert_eq!(own_due_time(&o, grace), Timestamp::parse("2026-12-04T10:30:00.000Z").ok());
        o.insert("cancel_requested_at".into(), s("2026-12-04T10:02:00.000Z"));
        assert_eq!(own_due_time(&o, grace), Timestamp::parse("2026-12-04T10:02:00.000Z").ok());
    }
}
