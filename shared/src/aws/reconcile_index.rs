//! The DynamoDB adapter of a day's reconciliation: queries of the sparse
//! `reconcile-index` GSI (a day's shard, the catalog) and of the due index,
//! order partitions read by key, and the runs' records (`RECON#<day>`).
//! Layout in
//! `docs/data-model.md#the-reconcile-index-gsi-reconcile-index-what-a-days-run-reads`.

use super::due_index::{cursor_of, item_of};
use super::dynamo::{each_queried, key, s, DynamoStore, Item};
use crate::domain::{Day, OrderId, Sku, UserId};
use crate::error::error_chain;
use crate::ports::Unavailable;
use crate::store::{
    Cas, CatalogEntry, DayIndex, DayRuns, DueCursor, IndexPage, PointsEntry, ReadCost, RecordsRead, UndecodableRow,
};
use crate::usecases::reconcile_day::{DayReport, DayRun, PartialReport};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::ReturnConsumedCapacity;
use futures_util::{stream, StreamExt, TryStreamExt};

pub const RECONCILE_INDEX: &str = "reconcile-index";
/// Order partitions read at once by a piece.
const READS_IN_FLIGHT: usize = 8;

fn text(item: &Item, attr: &str) -> String {
    item.get(attr).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default()
}

fn run_pk(day: Day) -> String {
    format!("RECON#{day}")
}

impl DynamoStore {
    /// One page of a partition of a KEYS_ONLY index, whatever its range.
    async fn index_keys(
        &self,
        (index, hash): (&str, &str),
        value: &str,
        limit: u32,
        start: Option<DueCursor>,
    ) -> Result<IndexPage, Unavailable> {
        let out = self
            .client()
            .query()
            .table_name(self.table())
            .index_name(index)
            .key_condition_expression("#part = :part")
            .expression_attribute_names("#part", hash)
            .expression_attribute_values(":part", s(value))
            .limit(limit.clamp(1, 1000) as i32)
            .set_exclusive_start_key(start.as_ref().map(item_of))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Unavailable::new("query an index partition", e))?;
        Ok(IndexPage {
            keys: out.items().iter().map(|i| (text(i, "pk"), text(i, "sk"))).collect(),
            next: out.last_evaluated_key().map(cursor_of),
            cost: ReadCost {
                items: out.items().len() as u64,
                capacity_units: out.consumed_capacity().and_then(|c| c.capacity_units()).unwrap_or(0.0),
            },
        })
    }

    /// Every item of one order partition, with what reading it cost.
    async fn partition(&self, order_id: &OrderId) -> Result<(Vec<Item>, ReadCost), Unavailable> {
        let (mut items, mut cost, mut start) = (Vec::new(), ReadCost::default(), None);
        loop {
            let out = self
                .client()
                .query()
                .table_name(self.table())
                .key_condition_expression("pk = :pk")
                .expression_attribute_values(":pk", s(super::dynamo::keys::order(order_id)))
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map_err(|e| Unavailable::new("query an order partition", e))?;
            cost.add(ReadCost {
                items: out.items().len() as u64,
                capacity_units: out.consumed_capacity().and_then(|c| c.capacity_units()).unwrap_or(0.0),
            });
            items.extend(out.items.unwrap_or_default());
            match out.last_evaluated_key {
                Some(k) => start = Some(k),
                None => return Ok((items, cost)),
            }
        }
    }
}

#[async_trait]
impl DayIndex for DynamoStore {
    async fn reconcile_page(&self, part: &str, limit: u32, start: Option<DueCursor>) -> Result<IndexPage, Unavailable> {
        self.index_keys((RECONCILE_INDEX, "recon_part"), part, limit, start).await
    }

    async fn in_flight_page(
        &self,
        shard: &str,
        limit: u32,
        start: Option<DueCursor>,
    ) -> Result<IndexPage, Unavailable> {
        self.index_keys((super::due_index::DUE_INDEX, "due_shard"), shard, limit, start).await
    }

    async fn order_records(&self, orders: &[OrderId]) -> Result<RecordsRead, Unavailable> {
        type Read<'a> = std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(Vec<Item>, ReadCost), Unavailable>> + Send + 'a>,
        >;
        let reads: Vec<Read<'_>> = orders.iter().map(|id| Box::pin(self.partition(id)) as Read<'_>).collect();
        let partitions: Vec<(Vec<Item>, ReadCost)> =
            stream::iter(reads).buffer_unordered(READS_IN_FLIGHT).try_collect().await?;
        let mut read = RecordsRead::default();
        for (items, cost) in partitions {
            read.cost.add(cost);
            let (record, bad) = DynamoStore::assemble_tolerant(items);
            read.records.extend(record);
            read.undecodable.extend(bad.iter().map(|(item, e)| UndecodableRow {
                pk: text(item, "pk"),
                sk: text(item, "sk"),
                error: error_chain(e),
            }));
        }
        // Partitions come back in the order they answered; the use case
        // must not see that order.
        read.records.sort_by(|a, b| a.order.order_id.cmp(&b.order.order_id));
        read.undecodable.sort_by(|a, b| (&a.pk, &a.sk).cmp(&(&b.pk, &b.sk)));
        Ok(read)
    }

    async fn catalog_entry(&self, sku: &Sku) -> Result<CatalogEntry, Unavailable> {
        let Some((stock, changes)) = self.stock_with_changes(sku).await? else {
            return Err(Unavailable::new("read a SKU and its changes", "the SKU kept changing during the read"));
        };
        let cost = ReadCost { items: u64::from(stock.is_some()) + changes.len() as u64, capacity_units: 0.0 };
        Ok(CatalogEntry { stock, changes, cost })
    }

    /// The credits are read before and after the balance, and kept only
    /// when no credit landed in between (each credit adds its record in
    /// the transaction that moves the balance's `changes`).
    async fn points_entry(&self, user: &UserId) -> Result<PointsEntry, Unavailable> {
        use crate::store::PointsLedger;
        for _ in 0..3 {
            let before = self.points_credits(user).await?;
            let balance = self.points_balance(user).await?;
            let credits = self.points_credits(user).await?;
            if before.len() == credits.len() {
                let cost = ReadCost { items: u64::from(balance.is_some()) + credits.len() as u64, capacity_units: 0.0 };
                return Ok(PointsEntry { balance, credits, cost });
            }
        }
        Err(Unavailable::new("read a points balance and its credits", "credits kept landing during the read"))
    }
}

/// A conditional put of a new record: `Rejected` if it exists.
async fn put_new(store: &DynamoStore, mut item: Item, what: &'static str) -> Result<Cas, Unavailable> {
    item.insert("entity".into(), s(what));
    let res = store
        .client()
        .put_item()
        .table_name(store.table())
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(pk)")
        .send()
        .await;
    match res {
        Ok(_) => Ok(Cas::Applied),
        Err(e) if super::dynamo::is_condition_failure(&e) => Ok(Cas::Rejected),
        Err(e) => Err(Unavailable::new(what, e)),
    }
}

/// A record whose body is one JSON attribute: the reports are read whole
/// and never queried by field.
fn json_item<T: serde::Serialize>(day: Day, sk: String, body: &T) -> Item {
    let mut item = key(run_pk(day), &sk);
    item.insert("body".into(), s(serde_json::to_string(body).expect("serialisable")));
    item
}

fn from_json<T: serde::de::DeserializeOwned>(item: &Item, what: &'static str) -> Result<T, Unavailable> {
    serde_json::from_str(&text(item, "body")).map_err(|e| Unavailable::new(what, e))
}

impl DynamoStore {
    /// Every record of `day` whose sort key starts with `prefix`.
    async fn day_records(&self, day: Day, prefix: &str) -> Result<Vec<Item>, Unavailable> {
        let query = self
            .client()
            .query()
            .table_name(self.table())
            .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
            .expression_attribute_values(":pk", s(run_pk(day)))
            .expression_attribute_values(":prefix", s(prefix))
            .consistent_read(true);
        let mut items = Vec::new();
        each_queried(query, "query a day's reconciliation records", |item| {
            items.push(item);
            Ok(())
        })
        .await?;
        Ok(items)
    }
}

#[async_trait]
impl DayRuns for DynamoStore {
    async fn start_run(&self, run: &DayRun) -> Result<Cas, Unavailable> {
        put_new(self, json_item(run.day, format!("RUN#{}", run.run_id), run), "RECON_RUN").await
    }

    async fn day_run(&self, day: Day, run_id: Option<&str>) -> Result<Option<DayRun>, Unavailable> {
        let prefix = match run_id {
            Some(id) => format!("RUN#{id}"),
            None => "RUN#".to_owned(),
        };
        // Run ids sort as their start times: the last one is the latest.
        let runs = self.day_records(day, &prefix).await?;
        runs.iter()
            .rfind(|i| run_id.is_none() || text(i, "sk") == prefix)
            .map(|i| from_json(i, "decode a day run"))
            .transpose()
    }

    async fn save_part(&self, part: &PartialReport) -> Result<Cas, Unavailable> {
        let day = part.day.ok_or_else(|| Unavailable::new("save a piece's report", "a report without its day"))?;
        put_new(self, json_item(day, format!("PART#{}#{}", part.run_id, part.piece), part), "RECON_PART").await
    }

    async fn parts(&self, day: Day, run_id: &str) -> Result<Vec<PartialReport>, Unavailable> {
        let items = self.day_records(day, &format!("PART#{run_id}#")).await?;
        items.iter().map(|i| from_json(i, "decode a piece's report")).collect()
    }

    async fn save_report(&self, report: &DayReport) -> Result<Cas, Unavailable> {
        put_new(self, json_item(report.day, format!("REPORT#{}", report.run_id), report), "RECON_REPORT").await
    }
}
