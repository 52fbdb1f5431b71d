//! The DynamoDB adapter of [`StockLedger`]: an operator's change of a SKU
//! and its audit record (`SKU#<sku>` / `CHANGE#<key>`) in one transaction.
//!
//! The transaction is what makes a lost answer harmless: a re-send (the
//! SDK's after an attempt timed out, or the operator's after a 5xx) finds
//! the record of its key and writes nothing, where the old
//! `available = available + :d` was applied once per send.

use super::dynamo::{from_item, key, keys, n, s, to_item, unavailable, DynamoStore, Item};
use crate::domain::*;
use crate::ports::Unavailable;
use crate::store::{StockLedger, StockWritten};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update};

/// The update of the SKU's record for `change`, with its condition.
fn stock_update(store: &DynamoStore, c: &StockChangeRecord) -> Update {
    let mut u = Update::builder()
        .table_name(store.table())
        .set_key(Some(key(keys::sku(&c.sku), keys::STOCK_SK)))
        .expression_attribute_values(":supplied", n(c.supplied_after))
        .expression_attribute_values(":seq", n(c.seq))
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
    // Any change but a seed is made only to the version it was planned
    // from; a SKU seeded before changes were recorded has no `changes`.
    let version = if c.seq <= 1 {
        "attribute_not_exists(changes)".to_owned()
    } else {
        u = u.expression_attribute_values(":was_seq", n(c.seq - 1));
        "changes = :was_seq".to_owned()
    };
    let (set, condition) = match c.kind {
        StockChangeKind::Seed => {
            u = u
                .expression_attribute_values(":a", n(c.available_after.unwrap_or(c.delta)))
                .expression_attribute_values(":zero", n(0))
                .expression_attribute_values(":sku", s(c.sku.as_str()))
                .expression_attribute_values(":e", s("STOCK"));
            (
                Some("available = :a, reserved = :zero, sold = :zero, sku = :sku, entity = :e"),
                "attribute_not_exists(pk)".into(),
            )
        }
        StockChangeKind::Swap => {
            u = u
                .expression_attribute_values(":a", n(c.available_after.unwrap_or_default()))
                .expression_attribute_values(":was", n(c.available_before.unwrap_or_default()));
            (Some("available = :a"), format!("attribute_exists(pk) AND {version} AND available = :was"))
        }
        StockChangeKind::Adjust => {
            // Condition expressions have no arithmetic: `available + d >= 0`
            // is written as `available >= -d`.
            u = u
                .expression_attribute_values(":d", n(c.delta))
                .expression_attribute_values(":min", n(c.delta.saturating_neg().max(0)));
            (Some("available = available + :d"), format!("attribute_exists(pk) AND {version} AND available >= :min"))
        }
        StockChangeKind::Reprice => (None, format!("attribute_exists(pk) AND {version}")),
    };
    let mut set: Vec<&str> = set.into_iter().chain(["supplied = :supplied", "changes = :seq"]).collect();
    if let Some(price) = &c.price {
        set.extend(["price = :price", "currency = :currency"]);
        u = u
            .expression_attribute_values(":price", n(price.amount))
            .expression_attribute_values(":currency", s(price.currency.as_str()));
    }
    u.update_expression(format!("SET {}", set.join(", ")))
        .condition_expression(condition)
        .build()
        .expect("complete update")
}

/// The audit record, written only if its key was never used for the SKU.
fn record_put(store: &DynamoStore, c: &StockChangeRecord) -> Put {
    let mut item = to_item(c);
    item.extend(key(keys::sku(&c.sku), &keys::stock_change_sk(&c.key)));
    item.insert("entity".into(), s("STOCK_CHANGE"));
    Put::builder()
        .table_name(store.table())
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(pk)")
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .build()
        .expect("complete put")
}

/// An item the service handed back, decoded; an empty one (a record that
/// does not exist) is `None`.
fn decoded<T: serde::de::DeserializeOwned>(item: Option<Item>, what: &'static str) -> Result<Option<T>, Unavailable> {
    match item {
        Some(item) if !item.is_empty() => from_item(item, what).map(Some),
        _ => Ok(None),
    }
}

#[async_trait]
impl StockLedger for DynamoStore {
    async fn change_stock(&self, c: &StockChangeRecord) -> Result<StockWritten, Unavailable> {
        let items = vec![
            TransactWriteItem::builder().update(stock_update(self, c)).build(),
            TransactWriteItem::builder().put(record_put(self, c)).build(),
        ];
        let mut failed = match self.transact_items(items, "change stock").await? {
            Ok(()) => return Ok(StockWritten::Applied),
            Err(failed) => failed.into_iter(),
        };
        let (stock, record) = (failed.next().flatten(), failed.next().flatten());
        // The key's record exists: this change (or an earlier request with
        // the same key) was applied; its record says which.
        if let Some(done) = decoded::<StockChangeRecord>(record, "stock change record")? {
            return Ok(StockWritten::KeyUsed(done));
        }
        Ok(StockWritten::Moved(decoded(stock, "stock")?))
    }

    async fn stock_change(&self, sku: &Sku, k: &IdempotencyKey) -> Result<Option<StockChangeRecord>, Unavailable> {
        self.get_record(keys::sku(sku), &keys::stock_change_sk(k), "stock change record").await
    }

    async fn stock_changes(&self, sku: &Sku) -> Result<Vec<StockChangeRecord>, Unavailable> {
        let mut out: Vec<StockChangeRecord> = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client()
                .query()
                .table_name(self.table())
                .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
                .expression_attribute_values(":pk", s(keys::sku(sku)))
                .expression_attribute_values(":prefix", s(keys::STOCK_CHANGE_PREFIX))
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(unavailable("read stock changes"))?;
            for item in page.items.unwrap_or_default() {
                out.push(from_item(item, "stock change record")?);
            }
            match page.last_evaluated_key {
                Some(k) => start = Some(k),
                None => break,
            }
        }
        out.sort_by_key(|r| r.seq);
        Ok(out)
    }
}
