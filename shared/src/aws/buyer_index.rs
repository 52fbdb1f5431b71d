//! The DynamoDB adapter of a buyer's order list: the `buyer-index` GSI,
//! keyed by the order item's own `user_id` (hash) and `created_at` (range).
//! Order items carry both attributes (every order, including those written
//! before the index existed: DynamoDB fills a new GSI from the table), and
//! so do refunds, which the query's filter on `entity` leaves out. It
//! projects what a list line shows; its reads are eventually consistent.
//! Layout in `docs/data-model.md#the-buyer-index-gsi-buyer-index-a-buyers-own-orders`.

use super::due_index::{cursor_of, item_of};
use super::dynamo::{s, DynamoStore};
use crate::domain::{OrderStatus, UserId};
use crate::ports::Unavailable;
use crate::store::{BuyerOrders, BuyerOrdersPage, DueCursor, OrderSummary};
use async_trait::async_trait;

pub const BUYER_INDEX: &str = "buyer-index";

/// The most orders one page may ask for.
pub const MAX_PAGE: u32 = 100;

#[async_trait]
impl BuyerOrders for DynamoStore {
    async fn buyer_orders(
        &self,
        user: &UserId,
        status: Option<OrderStatus>,
        limit: u32,
        after: Option<DueCursor>,
    ) -> Result<BuyerOrdersPage, Unavailable> {
        let mut filter = "entity = :order".to_owned();
        let mut req = self
            .client()
            .query()
            .table_name(self.table())
            .index_name(BUYER_INDEX)
            .key_condition_expression("user_id = :u")
            .expression_attribute_values(":u", s(user.as_str()))
            .expression_attribute_values(":order", s("ORDER"))
            // Newest first.
            .scan_index_forward(false)
            .limit(limit.clamp(1, MAX_PAGE) as i32)
            .set_exclusive_start_key(after.as_ref().map(item_of));
        if let Some(st) = status {
            filter.push_str(" AND #status = :status");
            req = req
                .expression_attribute_names("#status", "status")
                .expression_attribute_values(":status", s(st.as_str()));
        }
        let out =
            req.filter_expression(filter).send().await.map_err(|e| Unavailable::new("query the buyer index", e))?;
        let orders = out
            .items()
            .iter()
            .map(|i| serde_dynamo::from_item::<_, OrderSummary>(i.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Unavailable::new("decode an order summary", e))?;
        Ok(BuyerOrdersPage { orders, next: out.last_evaluated_key().map(cursor_of) })
    }
}
