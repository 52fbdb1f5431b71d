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
use aws_sdk_dynamodb::types::{
    AttributeValue as Av, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};

/// The update of the SKU's record for `change`, with its condition.
/// `supplied` and `changes` move by the change's delta and by one, added
/// rather than set, so that concurrent changes of one SKU do not refuse
/// each other; only the first change of a SKU seeded before changes were
/// recorded sets them (from its baseline), and only once.
fn stock_update(store: &DynamoStore, c: &StockChangeRecord) -> Update {
    let mut u = Update::builder()
        .table_name(store.table())
        .set_key(Some(key(keys::sku(&c.sku), keys::STOCK_SK)))
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
    let mut set: Vec<&str> = Vec::new();
    let mut add: Vec<&str> = Vec::new();
    let mut conditions: Vec<&str> = Vec::new();
    match c.kind {
        StockChangeKind::Seed => {
            u = u
                .expression_attribute_values(":a", n(c.available_after.unwrap_or(c.delta)))
                .expression_attribute_values(":zero", n(0))
                .expression_attribute_values(":one", n(1))
                .expression_attribute_values(":sku", s(c.sku.as_str()))
                .expression_attribute_values(":e", s("STOCK"));
            set.extend([
                "available = :a",
                "reserved = :zero",
                "sold = :zero",
                "sku = :sku",
                "entity = :e",
                "supplied = :a",
                "changes = :one",
            ]);
            conditions.push("attribute_not_exists(pk)");
        }
        kind => {
            conditions.push("attribute_exists(pk)");
            match c.baseline {
                // The history starts here: only if no other change started it.
                Some(b) => {
                    u = u
                        .expression_attribute_values(":supplied", n(b + c.delta))
                        .expression_attribute_values(":one", n(1));
                    set.extend(["supplied = :supplied", "changes = :one"]);
                    conditions.push("attribute_not_exists(changes)");
                }
                None => {
                    u = u.expression_attribute_values(":d", n(c.delta)).expression_attribute_values(":one", n(1));
                    add.extend(["supplied :d", "changes :one"]);
                    conditions.push("attribute_exists(changes)");
                }
            }
            match kind {
                StockChangeKind::Swap => {
                    u = u
                        .expression_attribute_values(":a", n(c.available_after.unwrap_or_default()))
                        .expression_attribute_values(":was", n(c.available_before.unwrap_or_default()));
                    set.push("available = :a");
                    conditions.push("available = :was");
                }
                StockChangeKind::Adjust => {
                    // Condition expressions have no arithmetic: `available +
                    // d >= 0` is written as `available >= -d`.
                    u = u
                        .expression_attribute_values(":delta", n(c.delta))
                        .expression_attribute_values(":min", n(c.delta.saturating_neg().max(0)));
                    set.push("available = available + :delta");
                    conditions.push("available >= :min");
                }
                _ => {}
            }
        }
    }
    // Every change (re)lists the SKU in the catalog partition of the
    // reconcile index, so the day run's catalog piece finds it by a Query;
    // a SKU no operator changed since the index existed is listed by its
    // next change (docs/reconciliation.md, "Backfill").
    set.extend(["recon_part = :catalog", "recon_at = :sku_key"]);
    u = u
        .expression_attribute_values(":catalog", s(keys::CATALOG_PART))
        .expression_attribute_values(":sku_key", s(keys::sku(&c.sku)));
    if let Some(price) = &c.price {
        set.extend(["price = :price", "currency = :currency"]);
        u = u
            .expression_attribute_values(":price", n(price.amount))
            .expression_attribute_values(":currency", s(price.currency.as_str()));
    }
    let mut remove: Vec<&str> = Vec::new();
    match c.purchase_limit {
        Some(0) => remove.push("purchase_limit"),
        Some(limit) => {
            set.push("purchase_limit = :limit");
            u = u.expression_attribute_values(":limit", n(limit));
        }
        None => {}
    }
    match &c.category {
        Some(Some(category)) => {
            set.push("category = :category");
            u = u.expression_attribute_values(":category", s(category.as_str()));
        }
        Some(None) => remove.push("category"),
        None => {}
    }
    match &c.tags {
        Some(tags) if !tags.is_empty() => {
            set.push("tags = :tags");
            u = u.expression_attribute_values(":tags", Av::L(tags.iter().map(|t| s(t.as_str())).collect()));
        }
        Some(_) => remove.push("tags"),
        None => {}
    }
    let mut expr = String::new();
    if !set.is_empty() {
        expr = format!("SET {}", set.join(", "));
    }
    if !add.is_empty() {
        expr.push_str(&format!(" ADD {}", add.join(", ")));
    }
    if !remove.is_empty() {
        expr.push_str(&format!(" REMOVE {}", remove.join(", ")));
    }
    u.update_expression(expr.trim()).condition_expression(conditions.join(" AND ")).build().expect("complete update")
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

impl DynamoStore {
    /// A SKU's stock row and its change records as of one moment: the
    /// records are read before and after the row, and the three reads are
    /// kept only when no change landed in between (records are only ever
    /// added, each in the transaction that moves the row's `changes`).
    /// `None` when changes kept landing on every try.
    pub async fn stock_with_changes(
        &self,
        sku: &Sku,
    ) -> Result<Option<(Option<Stock>, Vec<StockChangeRecord>)>, Unavailable> {
        for _ in 0..3 {
            let before = self.stock_changes(sku).await?;
            let stock = crate::store::OrderStore::stock(self, sku).await?;
            let after = self.stock_changes(sku).await?;
            if before.len() == after.len() {
                return Ok(Some((stock, after)));
            }
        }
        Ok(None)
    }

    /// Replaces, in a scan's reading, each SKU whose row and records
    /// disagree on how many changes were made with a reading of one moment
    /// ([`Self::stock_with_changes`]): a scan is not a snapshot, and a
    /// change landing between its read of a SKU's records (which sort
    /// first) and of its row is not a discrepancy.
    pub(crate) async fn settle_stock_reads(
        &self,
        snapshot: &mut crate::store::TableSnapshot,
    ) -> Result<(), Unavailable> {
        use std::collections::BTreeMap;
        let mut counted: BTreeMap<Sku, usize> = BTreeMap::new();
        for c in &snapshot.stock_changes {
            *counted.entry(c.sku.clone()).or_default() += 1;
        }
        let rows: BTreeMap<Sku, u64> = snapshot.stocks.iter().map(|s| (s.sku.clone(), s.changes)).collect();
        let mut unsettled: Vec<Sku> = Vec::new();
        for (sku, n) in &counted {
            if rows.get(sku).map(|c| *c as usize) != Some(*n) {
                unsettled.push(sku.clone());
            }
        }
        for (sku, changes) in &rows {
            if *changes > 0 && !counted.contains_key(sku) {
                unsettled.push(sku.clone());
            }
        }
        for sku in unsettled {
            let Some((stock, records)) = self.stock_with_changes(&sku).await? else { continue };
            snapshot.stocks.retain(|s| s.sku != sku);
            snapshot.stock_changes.retain(|c| c.sku != sku);
            snapshot.stocks.extend(stock);
            snapshot.stock_changes.extend(records);
        }
        Ok(())
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
        Ok(out)
    }
}
