//! The DynamoDB adapter of [`StockLedger`]: an operator's change of a SKU
//! and its audit record (`SKU#<sku>` / `CHANGE#<key>`) in one transaction.
//!
//! The transaction is what makes a lost answer harmless: a re-send (the
//! SDK's after an attempt timed out, or the operator's after a 5xx) finds
//! the record of its key and writes nothing, where the old
//! `available = available + :d` was applied once per send.

use super::dynamo::{from_item, key, keys, n, s, to_item, DynamoStore, Item};
use crate::domain::*;
use crate::ports::Unavailable;
use crate::store::{StockLedger, StockWritten};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::builders::UpdateBuilder;
use aws_sdk_dynamodb::types::{AttributeValue as Av, ReturnValuesOnConditionCheckFailure, Update};

/// The update of the SKU's record for `change`, with its condition.
/// `supplied` and `changes` move by the change's delta and by one, added
/// rather than set, so that concurrent changes of one SKU do not refuse
/// each other; only the first change of a SKU seeded before changes were
/// recorded sets them (from its baseline), and only once.
fn stock_update(store: &DynamoStore, c: &StockChangeRecord) -> Update {
    let mut w = StockWrite {
        u: Update::builder()
            .table_name(store.table())
            .set_key(Some(key(keys::sku(&c.sku), keys::STOCK_SK)))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld),
        set: Vec::new(),
        add: Vec::new(),
        remove: Vec::new(),
        conditions: Vec::new(),
    };
    match c.kind {
        StockChangeKind::Seed => w.seed(c),
        kind => w.change(c, kind),
    }
    w.catalog_entry(c);
    w.build()
}

/// An update of a SKU's stock record as it is put together: the clauses of
/// its expression and its conditions, in the order they are written, and
/// the builder holding the values they bind.
struct StockWrite {
    u: UpdateBuilder,
    set: Vec<&'static str>,
    add: Vec<&'static str>,
    remove: Vec<&'static str>,
    conditions: Vec<&'static str>,
}

impl StockWrite {
    fn value(&mut self, name: &str, value: Av) {
        self.u = std::mem::take(&mut self.u).expression_attribute_values(name, value);
    }

    /// A new SKU: its counters start at the seeded stock.
    fn seed(&mut self, c: &StockChangeRecord) {
        self.value(":a", n(c.available_after.unwrap_or(c.delta)));
        self.value(":zero", n(0));
        self.value(":one", n(1));
        self.value(":sku", s(c.sku.as_str()));
        self.value(":e", s("STOCK"));
        self.set.extend([
            "available = :a",
            "reserved = :zero",
            "sold = :zero",
            "sku = :sku",
            "entity = :e",
            "supplied = :a",
            "changes = :one",
        ]);
        self.conditions.push("attribute_not_exists(pk)");
    }

    /// A change of an existing SKU: its history, and its available stock
    /// swapped or adjusted.
    fn change(&mut self, c: &StockChangeRecord, kind: StockChangeKind) {
        self.conditions.push("attribute_exists(pk)");
        match c.baseline {
            // The history starts here: only if no other change started it.
            Some(b) => {
                self.value(":supplied", n(b + c.delta));
                self.value(":one", n(1));
                self.set.extend(["supplied = :supplied", "changes = :one"]);
                self.conditions.push("attribute_not_exists(changes)");
            }
            None => {
                self.value(":d", n(c.delta));
                self.value(":one", n(1));
                self.add.extend(["supplied :d", "changes :one"]);
                self.conditions.push("attribute_exists(changes)");
            }
        }
        match kind {
            StockChangeKind::Swap => {
                self.value(":a", n(c.available_after.unwrap_or_default()));
                self.value(":was", n(c.available_before.unwrap_or_default()));
                self.set.push("available = :a");
                self.conditions.push("available = :was");
            }
            StockChangeKind::Adjust => {
                // Condition expressions have no arithmetic: `available +
                // d >= 0` is written as `available >= -d`.
                self.value(":delta", n(c.delta));
                self.value(":min", n(c.delta.saturating_neg().max(0)));
                self.set.push("available = available + :delta");
                self.conditions.push("available >= :min");
            }
            _ => {}
        }
    }

    /// The SKU's listing in the catalog: its reconcile-index entry, and the
    /// price, purchase limit, category and tags the change sets or clears.
    fn catalog_entry(&mut self, c: &StockChangeRecord) {
        // Every change (re)lists the SKU in the catalog partition of the
        // reconcile index, so the day run's catalog piece finds it by a Query;
        // a SKU no operator changed since the index existed is listed by its
        // next change (docs/reconciliation.md, "Backfill").
        self.set.extend(["recon_part = :catalog", "recon_at = :sku_key"]);
        self.value(":catalog", s(keys::CATALOG_PART));
        self.value(":sku_key", s(keys::sku(&c.sku)));
        if let Some(price) = &c.price {
            self.set.extend(["price = :price", "currency = :currency"]);
            self.value(":price", n(price.amount));
            self.value(":currency", s(price.currency.as_str()));
        }
        match c.purchase_limit {
            Some(0) => self.remove.push("purchase_limit"),
            Some(limit) => {
                self.set.push("purchase_limit = :limit");
                self.value(":limit", n(limit));
            }
            None => {}
        }
        match &c.category {
            Some(Some(category)) => {
                self.set.push("category = :category");
                self.value(":category", s(category.as_str()));
            }
            Some(None) => self.remove.push("category"),
            None => {}
        }
        match &c.tags {
            Some(tags) if !tags.is_empty() => {
                self.set.push("tags = :tags");
                self.value(":tags", Av::L(tags.iter().map(|t| s(t.as_str())).collect()));
            }
            Some(_) => self.remove.push("tags"),
            None => {}
        }
    }

    fn build(self) -> Update {
        let mut expr = String::new();
        if !self.set.is_empty() {
            expr = format!("SET {}", self.set.join(", "));
        }
        if !self.add.is_empty() {
            expr.push_str(&format!(" ADD {}", self.add.join(", ")));
        }
        if !self.remove.is_empty() {
            expr.push_str(&format!(" REMOVE {}", self.remove.join(", ")));
        }
        self.u
            .update_expression(expr.trim())
            .condition_expression(self.conditions.join(" AND "))
            .build()
            .expect("complete update")
    }
}

/// The audit record, written only if its key was never used for the SKU
/// (see [`DynamoStore::write_with_record`]).
fn record_item(c: &StockChangeRecord) -> Item {
    let mut item = to_item(c);
    item.extend(key(keys::sku(&c.sku), &keys::stock_change_sk(&c.key)));
    item.insert("entity".into(), s("STOCK_CHANGE"));
    item
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
        let Some((stock, record)) =
            self.write_with_record(stock_update(self, c), record_item(c), "change stock").await?
        else {
            return Ok(StockWritten::Applied);
        };
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
        self.records_under(keys::sku(sku), keys::STOCK_CHANGE_PREFIX, "read stock changes", "stock change record").await
    }
}
