//! The DynamoDB adapter of [`ExpiringSoonNotices`]: a range read of one
//! OPEN shard of the due index, and the notice's conditional write on the
//! order item. Layout in `docs/data-model.md#access-patterns` ("the heads-up
//! before expiry").

use super::due_index::{cursor_of, due_item};
use super::dynamo::{key, keys, s, send_single, DynamoStore};
use crate::domain::{OrderId, OrderStatus, Timestamp};
use crate::ports::Unavailable;
use crate::store::{Cas, DueCursor, DueEntry, DuePage, ExpiringSoonNotices};
use async_trait::async_trait;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure;

#[async_trait]
impl ExpiringSoonNotices for DynamoStore {
    async fn due_between(
        &self,
        shard: &str,
        after: Timestamp,
        through: Timestamp,
        limit: u32,
        start: Option<DueCursor>,
    ) -> Result<DuePage, Unavailable> {
        let range = [(":after", after), (":through", through)];
        let out = self
            .due_index_query(shard, "due_at BETWEEN :after AND :through", &range, limit, start.as_ref())
            .send()
            .await
            .map_err(|e| Unavailable::new("query due index for orders expiring soon", e))?;
        let entries = out
            .items()
            .iter()
            .filter_map(|item| {
                let get = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).map(String::as_str).unwrap_or("");
                // An entry whose due time does not parse cannot be matched
                // against the order's `expire_at`: left to the sweep.
                let due_at = Timestamp::parse(get("due_at")).ok()?;
                Some(DueEntry { item: due_item(get("pk"), get("sk")), due_at, key: cursor_of(item) })
            })
            .collect();
        Ok(DuePage {
            entries,
            next: out.last_evaluated_key().map(cursor_of),
            consumed_capacity: out.consumed_capacity().and_then(|c| c.capacity_units()).unwrap_or(0.0),
        })
    }

    async fn notice_expiring_soon(
        &self,
        order_id: &OrderId,
        expire_at: Timestamp,
        latest_created: Timestamp,
        now: Timestamp,
    ) -> Result<Cas, Unavailable> {
        // Timestamps are stored in one fixed RFC 3339 form (UTC,
        // milliseconds), so comparing the strings compares the times.
        // Why no version bump: the notice is not a state change, and a
        // close or a payment that read the order before it must not fail
        // its compare-and-swap (and retry) for a reminder's sake.
        let req = self
            .client()
            .update_item()
            .table_name(self.table())
            .set_key(Some(key(keys::order(order_id), keys::ORDER_SK)))
            .update_expression("SET expiring_soon_at = :now")
            .condition_expression(
                "#status = :pending AND expire_at = :expire AND expire_at > :now AND created_at <= :latest \
                 AND attribute_not_exists(expiring_soon_at) AND attribute_not_exists(cancel_requested_at)",
            )
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":pending", s(OrderStatus::PendingPayment.as_str()))
            .expression_attribute_values(":expire", s(expire_at.to_string()))
            .expression_attribute_values(":now", s(now.to_string()))
            .expression_attribute_values(":latest", s(latest_created.to_string()))
            // On a refusal, the item as it is: a write whose answer was
            // lost and that the SDK sent again finds its own notice there.
            // (Not the `write_token` of `cas`: overwriting it would hide
            // another writer's lost answer from that writer.)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        // `send_single`: a transaction holding the order (a payment being
        // recorded) is waited out, as for every single-item write.
        match send_single(|| req.clone().send()).await {
            Ok(Ok(_)) => Ok(Cas::Applied),
            Ok(Err(e)) => {
                let stored = e.as_service_error().and_then(|s| match s {
                    UpdateItemError::ConditionalCheckFailedException(c) => {
                        c.item().and_then(|i| i.get("expiring_soon_at")).and_then(|v| v.as_s().ok()).cloned()
                    }
                    _ => None,
                });
                Ok(if stored == Some(now.to_string()) { Cas::Applied } else { Cas::Rejected })
            }
            Err(e) => Err(Unavailable::new("notice an order expiring soon", e)),
        }
    }
}
