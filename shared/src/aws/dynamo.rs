//! The DynamoDB adapter of [`OrderStore`]. The table layout is documented in
//! `docs/data-model.md`; the order-partition keys are spelled by the
//! helpers below, the payment-side ones in `payments.rs`.

use super::holdings;
use crate::domain::*;
use crate::domain::{coupon, order, reservation};
use crate::ports::Unavailable;
use crate::store::*;
use async_trait::async_trait;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::operation::scan::builders::ScanFluentBuilder;
use aws_sdk_dynamodb::types::{
    AttributeValue as Av, CancellationReason, KeysAndAttributes, Put, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem, Update,
};
use aws_sdk_dynamodb::Client;
use std::collections::HashMap;
use std::time::Duration;

pub type Item = HashMap<String, Av>;

/// The condition under which an open order may be closed: its window
/// ended, or its buyer asked to cancel (a missing attribute compares false).
const DUE: &str = "(expire_at <= :now OR cancel_requested_at <= :now)";

/// The history cause of a close without payment attempts.
fn close_cause(order: &Order) -> &'static str {
    match order.close_reason() {
        CloseReason::Expired => "expired unpaid, no payment attempt",
        CloseReason::BuyerCancelled => "cancelled by the buyer, no payment attempt",
    }
}

/// The index entries every write that makes an order final sets (values
/// from [`DynamoStore::effects_entry`]): effects pending (due index) and
/// final on this day (reconcile index, never removed).
pub(crate) const FINAL_ENTRIES: &str =
    "due_shard = :fx_shard, due_at = :fx_due, recon_part = :recon_part, recon_at = :recon_at";

/// Default number of write shards of the due index (deployment parameter
/// `DueIndexShards`, env `DUE_SHARDS`).
pub const DEFAULT_DUE_SHARDS: u32 = 16;

/// The shard layout of `due-index`. Two kinds of entry share the index:
/// open orders (`OPEN#<n>`, `due_at` = when a closer must look at them) and
/// records whose follow-up effects are still pending (`FX#<n>`, `due_at` =
/// when the backstop re-drives them if they are still there). Writers use
/// `count`; the sweep queries shards `0..sweep_count`, where
/// `sweep_count >= count` is the highest count any live record was written
/// under, so lowering the count never strands an order (see
/// `docs/data-model.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueShards {
    pub count: u32,
    pub sweep_count: u32,
}

impl Default for DueShards {
    fn default() -> Self {
        Self { count: DEFAULT_DUE_SHARDS, sweep_count: DEFAULT_DUE_SHARDS }
    }
}

impl DueShards {
    /// `DUE_SHARDS` and `DUE_SHARDS_SWEEP` from the environment (both
    /// default to 16; the sweep count is raised to at least the write count).
    pub fn from_env() -> Result<Self, String> {
        let read = |name: &str, default: u32| -> Result<u32, String> {
            match std::env::var(name) {
                Err(_) => Ok(default),
                Ok(v) => match v.trim().parse::<u32>() {
                    Ok(n) if (1..=1000).contains(&n) => Ok(n),
                    _ => Err(format!("environment variable {name} must be a whole number from 1 to 1000, got {v:?}")),
                },
            }
        };
        let count = read("DUE_SHARDS", DEFAULT_DUE_SHARDS)?;
        let sweep_count = read("DUE_SHARDS_SWEEP", count)?.max(count);
        Ok(Self { count, sweep_count })
    }
}

pub mod keys {
    use crate::domain::*;
    pub fn order(id: &OrderId) -> String {
        format!("ORDER#{id}")
    }
    pub const ORDER_SK: &str = "ORDER";
    pub fn stock_reservation_sk(sku: &Sku) -> String {
        format!("RES#STOCK#{sku}")
    }
    pub fn coupon_lock_sk(c: &CouponId) -> String {
        format!("RES#COUPON#{c}")
    }
    pub fn payment_sk(p: &PaymentId) -> String {
        format!("PAY#{p}")
    }
    pub fn refund_sk(p: &PaymentId) -> String {
        format!("REFUND#{p}")
    }
    pub fn sku(s: &Sku) -> String {
        format!("SKU#{s}")
    }
    pub const STOCK_SK: &str = "STOCK";
    /// A buyer's counters: purchase limits, points, open orders.
    pub fn buyer(u: &UserId) -> String {
        format!("BUYER#{u}")
    }
    pub fn purchase_limit_sk(s: &Sku) -> String {
        format!("LIMIT#{s}")
    }
    pub const POINTS_SK: &str = "POINTS";
    pub const OPEN_ORDERS_SK: &str = "OPEN_ORDERS";
    /// An operator's change of a buyer's points balance, by its key.
    pub fn points_change_sk(k: &IdempotencyKey) -> String {
        format!("POINTS_CHANGE#{k}")
    }
    pub const POINTS_CHANGE_PREFIX: &str = "POINTS_CHANGE#";
    /// An operator's change of the SKU, by its idempotency key.
    pub fn stock_change_sk(k: &IdempotencyKey) -> String {
        format!("{STOCK_CHANGE_PREFIX}{k}")
    }
    pub const STOCK_CHANGE_PREFIX: &str = "CHANGE#";
    pub fn coupon(c: &CouponId) -> String {
        format!("COUPON#{c}")
    }
    pub const COUPON_SK: &str = "COUPON";
    pub fn idempotency(u: &UserId, k: &IdempotencyKey) -> String {
        format!("IDEM#{u}#{k}")
    }
    pub const IDEM_SK: &str = "IDEM";
    /// A payment entry's key shares the user's key space (`IDEM#<user>#<key>`)
    /// with order creation, under its own sort key per order, so the same
    /// key used for an order and for paying it are two records.
    pub fn payment_idempotency_sk(o: &OrderId) -> String {
        format!("PAY#{o}")
    }
    /// See [`OrderId::shard`].
    pub fn shard_of(id: &OrderId, count: u32) -> u32 {
        id.shard(count)
    }
    /// The due-index partition of an open order.
    pub fn due_shard(id: &OrderId, count: u32) -> String {
        format!("{OPEN_PREFIX}{}", shard_of(id, count))
    }
    /// The due-index partition of a record whose effects are pending.
    pub fn effects_shard(id: &OrderId, count: u32) -> String {
        format!("{EFFECTS_PREFIX}{}", shard_of(id, count))
    }
    pub const OPEN_PREFIX: &str = "OPEN#";
    /// The due index's partition of refunds given up on (REFUND_FAILED)
    /// that no person has resolved yet. The sweep never queries it: its
    /// entries are a state to count and alarm on, not work to re-drive.
    pub const FAILED_REFUNDS_SHARD: &str = "FAILED#REFUND";
    pub const EFFECTS_PREFIX: &str = "FX#";
    /// The reconcile-index partition of a record that became final at
    /// `at` (`<YYYY-MM-DD>#<n>`, the UTC day, `n` of the fixed
    /// `RECONCILE_SHARDS`): a day's run reads the day's partitions and
    /// nothing older.
    pub fn day_part(id: &OrderId, at: Timestamp) -> String {
        format!("{}#{}", Day::of(at), shard_of(id, crate::usecases::reconcile_day::RECONCILE_SHARDS))
    }
    /// The reconcile-index partition listing the catalog's SKU rows, so the
    /// catalog piece reads the SKUs without scanning the orders.
    pub use crate::usecases::reconcile_day::CATALOG_PART;
}

pub fn s(v: impl Into<String>) -> Av {
    Av::S(v.into())
}
pub fn n(v: impl ToString) -> Av {
    Av::N(v.to_string())
}

/// The primary key of a record.
pub(crate) fn key(pk: String, sk: &str) -> Item {
    HashMap::from([("pk".to_owned(), s(pk)), ("sk".to_owned(), s(sk))])
}

pub(crate) fn unavailable<E>(context: &'static str) -> impl FnOnce(E) -> Unavailable
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |e| Unavailable::new(context, e)
}

/// A transaction item that writes `item` whole, on `condition` if any.
pub(crate) fn put(table: &str, item: Item, condition: Option<&str>) -> TransactWriteItem {
    let mut p = Put::builder().table_name(table).set_item(Some(item));
    if let Some(c) = condition {
        p = p.condition_expression(c);
    }
    TransactWriteItem::builder().put(p.build().expect("complete put")).build()
}

/// One page of a query or a scan: its items, and the key the next page
/// starts after (`None`: this was the last).
type Page = (Vec<Item>, Option<Item>);

/// Reads page after page, handing each item to `each` as its page
/// arrives; the first error (the read's, or one `each` returns) ends it.
async fn each_paged<Fut, E>(
    context: &'static str,
    mut page: impl FnMut(Option<Item>) -> Fut,
    mut each: impl FnMut(Item) -> Result<(), Unavailable>,
) -> Result<(), Unavailable>
where
    Fut: std::future::Future<Output = Result<Page, E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    let mut start = None;
    loop {
        let (items, next) = page(start.take()).await.map_err(unavailable(context))?;
        for item in items {
            each(item)?;
        }
        match next {
            Some(k) => start = Some(k),
            None => return Ok(()),
        }
    }
}

/// Every item `query` finds, page by page (see [`each_paged`]).
pub(crate) async fn each_queried(
    query: QueryFluentBuilder,
    context: &'static str,
    each: impl FnMut(Item) -> Result<(), Unavailable>,
) -> Result<(), Unavailable> {
    let page = |start: Option<Item>| {
        let query = query.clone().set_exclusive_start_key(start);
        async move { query.send().await.map(|out| (out.items.unwrap_or_default(), out.last_evaluated_key)) }
    };
    each_paged(context, page, each).await
}

/// Every item `scan` finds, page by page (see [`each_paged`]).
pub(crate) async fn each_scanned(
    scan: ScanFluentBuilder,
    context: &'static str,
    each: impl FnMut(Item) -> Result<(), Unavailable>,
) -> Result<(), Unavailable> {
    let page = |start: Option<Item>| {
        let scan = scan.clone().set_exclusive_start_key(start);
        async move { scan.send().await.map(|out| (out.items.unwrap_or_default(), out.last_evaluated_key)) }
    };
    each_paged(context, page, each).await
}

/// `<attr> IN (:from0, :from1, …)` over the source states of a domain
/// transition, with the values to bind. Write conditions are built from the
/// state machines this way rather than spelled by hand.
pub(crate) fn status_in(attr: &str, states: impl IntoIterator<Item = &'static str>) -> (String, Vec<(String, Av)>) {
    let values: Vec<(String, Av)> =
        states.into_iter().enumerate().map(|(i, st)| (format!(":from{i}"), s(st))).collect();
    let names: Vec<&str> = values.iter().map(|(k, _)| k.as_str()).collect();
    (format!("{attr} IN ({})", names.join(", ")), values)
}

/// `ConditionalCheckFailedException` on a single-item write.
pub(crate) fn is_condition_failure<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> bool {
    e.as_service_error().and_then(|s| s.code()) == Some("ConditionalCheckFailedException")
}

/// What a single-item write does after the service refused it with `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SingleWriteError {
    /// The item was not in the expected state: a business answer.
    ConditionFailed,
    /// A transaction holds the item (e.g. a webhook settling the order the
    /// closer is writing). The SDK's retry policy does not cover this code,
    /// and nothing was written, so the same write is retried here rather
    /// than failing the whole invocation back to a queue timeout.
    Retry,
    /// Anything else; the SDK has already retried what is transient.
    Fail,
}

pub fn classify_single_write(code: Option<&str>) -> SingleWriteError {
    match code {
        Some("ConditionalCheckFailedException") => SingleWriteError::ConditionFailed,
        Some("TransactionConflictException") => SingleWriteError::Retry,
        _ => SingleWriteError::Fail,
    }
}

/// Jittered exponential backoff shared by transactions and single-item
/// writes: 10 ms doubling to 500 ms, at most `MAX_CONFLICT_RETRIES` waits.
struct Backoff {
    delay_ms: u64,
    waits: u32,
}

const MAX_CONFLICT_RETRIES: u32 = 8;

impl Backoff {
    fn new() -> Self {
        Self { delay_ms: 10, waits: 0 }
    }
    /// Sleeps before the next try; false when the retries are used up.
    async fn wait(&mut self) -> bool {
        if self.waits >= MAX_CONFLICT_RETRIES {
            return false;
        }
        self.waits += 1;
        let jitter = rand::random::<u64>() % self.delay_ms.max(1);
        tokio::time::sleep(Duration::from_millis(self.delay_ms + jitter)).await;
        self.delay_ms = (self.delay_ms * 2).min(500);
        true
    }
}

/// The attribute a compare-and-swap leaves on the item it wrote.
pub const WRITE_TOKEN: &str = "write_token";

/// A token no other write uses.
fn write_token() -> String {
    format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>())
}

/// `expr` with `write_token = :write_token` added to its SET clause.
fn with_write_token(expr: &str) -> String {
    match expr.strip_prefix("SET ") {
        Some(rest) => format!("SET {WRITE_TOKEN} = :write_token, {rest}"),
        None => format!("SET {WRITE_TOKEN} = :write_token {expr}").trim_end().to_owned(),
    }
}

/// Sends a single-item conditional write, retrying transaction conflicts.
/// `Ok(false)`: the condition failed (with the service error, which may carry the old item).
pub(crate) async fn send_single<T, E, R, F, Fut>(mut send: F) -> Result<Result<T, SdkError<E, R>>, SdkError<E, R>>
where
    E: ProvideErrorMetadata,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, SdkError<E, R>>>,
{
    let mut backoff = Backoff::new();
    loop {
        match send().await {
            Ok(v) => return Ok(Ok(v)),
            Err(e) => match classify_single_write(e.as_service_error().and_then(|s| s.code())) {
                SingleWriteError::ConditionFailed => return Ok(Err(e)),
                SingleWriteError::Retry if backoff.wait().await => continue,
                _ => return Err(e),
            },
        }
    }
}

pub(crate) fn to_item<T: serde::Serialize>(v: &T) -> Item {
    serde_dynamo::to_item(v).expect("domain records serialise to DynamoDB items")
}

pub(crate) fn from_item<T: serde::de::DeserializeOwned>(item: Item, what: &'static str) -> Result<T, Unavailable> {
    serde_dynamo::from_item(item).map_err(unavailable(what))
}

fn history_entry(at: Timestamp, from: OrderStatus, to: OrderStatus, cause: &str) -> Av {
    Av::L(vec![Av::M(to_item(&StatusChange { at, from: Some(from), to, cause: cause.to_owned() }))])
}

/// Why a transaction was cancelled.
enum Cancelled {
    /// Per item: `Some(old item)` when that item's condition failed.
    Conditions(Vec<Option<Item>>),
    /// Another transaction touched the same items, or throttling: safe to
    /// retry as is.
    Retryable,
    /// Anything else (a validation error): retrying cannot help.
    Other,
}

fn cancellation(reasons: &[CancellationReason]) -> Cancelled {
    let code = |r: &CancellationReason| r.code().unwrap_or("None").to_owned();
    if reasons.iter().any(|r| code(r) == "ConditionalCheckFailed") {
        return Cancelled::Conditions(
            reasons
                .iter()
                .map(|r| (code(r) == "ConditionalCheckFailed").then(|| r.item().cloned().unwrap_or_default()))
                .collect(),
        );
    }
    let retryable = ["None", "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"];
    if reasons.iter().all(|r| retryable.contains(&code(r).as_str())) {
        Cancelled::Retryable
    } else {
        Cancelled::Other
    }
}

#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    shards: DueShards,
    effects_grace: Duration,
}

/// How long after an order becomes final its effects may take through the
/// stream before the sweep re-drives them (env `EFFECTS_REDRIVE_AFTER_SECONDS`).
pub const DEFAULT_EFFECTS_GRACE: Duration = Duration::from_secs(120);

impl DynamoStore {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self { client, table: table.into(), shards: DueShards::default(), effects_grace: DEFAULT_EFFECTS_GRACE }
    }
    /// The store configured from the environment: `TABLE_NAME`, the shard
    /// layout and the effects grace.
    pub fn from_env(client: Client) -> Result<Self, lambda_runtime::Error> {
        let grace = match std::env::var("EFFECTS_REDRIVE_AFTER_SECONDS") {
            Ok(_) => crate::aws::seconds_env("EFFECTS_REDRIVE_AFTER_SECONDS")?,
            Err(_) => DEFAULT_EFFECTS_GRACE,
        };
        Ok(Self::new(client, crate::aws::env("TABLE_NAME")?)
            .with_shards(DueShards::from_env()?)
            .with_effects_grace(grace))
    }
    /// How long after its final write an order's effects entry is due.
    pub(crate) fn effects_grace(&self) -> Duration {
        self.effects_grace
    }
    pub fn with_effects_grace(mut self, grace: Duration) -> Self {
        self.effects_grace = grace;
        self
    }
    /// The values of [`FINAL_ENTRIES`]: the order's entry in the effects
    /// part of the due index, and its entry in the reconcile index under
    /// the day it became final, both written in the same write that makes
    /// it final.
    pub(crate) fn effects_entry(&self, order_id: &OrderId, now: Timestamp) -> [(&'static str, Av); 4] {
        [
            (":fx_shard", s(keys::effects_shard(order_id, self.shards.count))),
            (":fx_due", s(now.plus(self.effects_grace).to_string())),
            (":recon_part", s(keys::day_part(order_id, now))),
            (":recon_at", s(now.to_string())),
        ]
    }
    /// The same store writing and sweeping with another shard layout.
    pub fn with_shards(mut self, shards: DueShards) -> Self {
        self.shards = shards;
        self
    }
    pub fn shards(&self) -> DueShards {
        self.shards
    }
    pub fn client(&self) -> &Client {
        &self.client
    }
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Runs a transaction, retrying conflicts (a concurrent transaction on the
    /// same items, e.g. many orders on one SKU) and throttling with jittered
    /// backoff. Condition failures come back to the caller.
    pub(crate) async fn transact_items(
        &self,
        items: Vec<TransactWriteItem>,
        context: &'static str,
    ) -> Result<Result<(), Vec<Option<Item>>>, Unavailable> {
        let mut backoff = Backoff::new();
        loop {
            let res = self.client.transact_write_items().set_transact_items(Some(items.clone())).send().await;
            let err = match res {
                Ok(_) => return Ok(Ok(())),
                Err(e) => e,
            };
            let reasons = err.as_service_error().and_then(|s| match s {
                aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(c) => {
                    Some(cancellation(c.cancellation_reasons()))
                }
                _ => None,
            });
            match reasons {
                Some(Cancelled::Conditions(c)) => return Ok(Err(c)),
                Some(Cancelled::Retryable) if backoff.wait().await => {}
                // Out of retries, a validation error, or not a cancellation
                // at all (the SDK already retried transient failures).
                _ => return Err(Unavailable::new(context, err)),
            }
        }
    }

    /// A ledger's write: the update of its row (`row`) and the change's
    /// audit record (`record`, with its key), in one transaction; the
    /// record is written only if its key was never used, and handed back
    /// when it was. `None` when both were written; when cancelled, the
    /// row's and the record's old items (`None`, or empty, where the engine
    /// returned none).
    pub(crate) async fn write_with_record(
        &self,
        row: Update,
        record: Item,
        context: &'static str,
    ) -> Result<Option<(Option<Item>, Option<Item>)>, Unavailable> {
        let record = Put::builder()
            .table_name(&self.table)
            .set_item(Some(record))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("complete put");
        let items =
            vec![TransactWriteItem::builder().update(row).build(), TransactWriteItem::builder().put(record).build()];
        match self.transact_items(items, context).await? {
            Ok(()) => Ok(None),
            Err(failed) => {
                let mut failed = failed.into_iter();
                Ok(Some((failed.next().flatten(), failed.next().flatten())))
            }
        }
    }

    fn order_item(&self, order: &Order) -> Item {
        let mut item = to_item(order);
        item.extend(key(keys::order(&order.order_id), keys::ORDER_SK));
        item.insert("entity".into(), s("ORDER"));
        if !order.status.is_final() {
            item.insert("due_shard".into(), s(keys::due_shard(&order.order_id, self.shards.count)));
            item.insert("due_at".into(), s(order.expire_at.to_string()));
        }
        item
    }

    /// An update of the order item guarded by its version, appending to the
    /// history in the same write.
    fn order_update(
        &self,
        order: &Order,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.order_item_update(&order.order_id)
            .expression_attribute_values(":v", n(order.version))
            .expression_attribute_values(":one", n(1))
    }

    /// An update of `order_id`'s order item, `#status` naming its status.
    fn order_item_update(
        &self,
        order_id: &OrderId,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(keys::order(order_id), keys::ORDER_SK)))
            .expression_attribute_names("#status", "status")
    }

    /// A compare-and-swap that knows its own write. Each write carries a
    /// fresh `write_token`; when its condition fails, the item as it now
    /// is (`ALL_OLD`) is read: if it carries this write's token, the write
    /// was applied by an earlier send whose answer was lost (the SDK sent it
    /// again after a timeout or a 5xx), and that is `Applied`, not somebody
    /// else's change. (A third writer between the lost answer and the
    /// re-send still reads as `Rejected`: then the item has moved on anyway.)
    pub(crate) async fn cas(
        &self,
        req: aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder,
        context: &'static str,
    ) -> Result<Cas, Unavailable> {
        let token = write_token();
        let expr = with_write_token(req.get_update_expression().as_deref().unwrap_or_default());
        let req = req
            .update_expression(expr)
            .expression_attribute_values(":write_token", s(&token))
            .return_values_on_condition_check_failure(
                aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
            );
        match send_single(|| req.clone().send()).await {
            Ok(Ok(_)) => Ok(Cas::Applied),
            Ok(Err(e)) => {
                let current = e.as_service_error().and_then(|s| match s {
                    aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c) => {
                        c.item()
                    }
                    _ => None,
                });
                let mine = current.and_then(|i| i.get(WRITE_TOKEN)).and_then(|v| v.as_s().ok()) == Some(&token);
                Ok(if mine { Cas::Applied } else { Cas::Rejected })
            }
            Err(e) => Err(Unavailable::new(context, e)),
        }
    }

    /// Every record of partition `pk` whose sort key starts with `prefix`
    /// (strongly consistent reads), decoded, in sort-key order.
    pub(crate) async fn records_under<T: serde::de::DeserializeOwned>(
        &self,
        pk: String,
        prefix: &str,
        context: &'static str,
        what: &'static str,
    ) -> Result<Vec<T>, Unavailable> {
        let query = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
            .expression_attribute_values(":pk", s(pk))
            .expression_attribute_values(":prefix", s(prefix))
            .consistent_read(true);
        let mut out = Vec::new();
        each_queried(query, context, |item| {
            out.push(from_item(item, what)?);
            Ok(())
        })
        .await?;
        Ok(out)
    }

    /// A strongly consistent read of one record, decoded.
    pub(crate) async fn get_record<T: serde::de::DeserializeOwned>(
        &self,
        pk: String,
        sk: &str,
        what: &'static str,
    ) -> Result<Option<T>, Unavailable> {
        self.get(pk, sk, what).await?.map(|item| from_item(item, what)).transpose()
    }

    /// One item as stored (consistent read), for tools and tests that look at a
    /// counter or record directly.
    pub async fn get_item(&self, pk: String, sk: &str) -> Result<Option<Item>, Unavailable> {
        self.get(pk, sk, "get item").await
    }

    async fn get(&self, pk: String, sk: &str, context: &'static str) -> Result<Option<Item>, Unavailable> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(pk, sk)))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable(context))?;
        Ok(out.item)
    }
}

impl DynamoStore {
    /// Builds an order record from the items of one order partition.
    pub(crate) fn assemble(items: Vec<Item>) -> Result<Option<OrderRecord>, Unavailable> {
        let (record, bad) = Self::assemble_tolerant(items);
        match bad.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(record),
        }
    }

    /// Like [`Self::assemble`], but a row that does not decode is skipped
    /// and handed back with its error (an undecodable order row leaves no
    /// record at all: its rows cannot be checked against it).
    pub(crate) fn assemble_tolerant(items: Vec<Item>) -> (Option<OrderRecord>, Vec<(Item, Unavailable)>) {
        let mut order = None;
        let mut reservations = Vec::new();
        let mut coupon_lock = None;
        let mut payments = Vec::new();
        let mut refunds = Vec::new();
        let mut checks = Vec::new();
        let mut bad = Vec::new();
        fn take<T: serde::de::DeserializeOwned>(
            item: Item,
            what: &'static str,
            bad: &mut Vec<(Item, Unavailable)>,
        ) -> Option<T> {
            match serde_dynamo::from_item(item.clone()) {
                Ok(v) => Some(v),
                Err(e) => {
                    bad.push((item, Unavailable::new(what, e)));
                    None
                }
            }
        }
        for item in items {
            match status_of(&item, "entity").as_deref() {
                Some("ORDER") => order = take(item, "decode order", &mut bad),
                Some("RESERVATION") => reservations.extend(take(item, "decode reservation", &mut bad)),
                Some("COUPON_LOCK") => coupon_lock = take(item, "decode coupon lock", &mut bad).or(coupon_lock),
                Some("PAYMENT") => payments.extend(take(item, "decode payment", &mut bad)),
                Some("REFUND") => refunds.extend(take(item, "decode refund", &mut bad)),
                Some("OPERATOR_CHECK") => checks.extend(take(item, "decode operator check", &mut bad)),
                _ => {}
            }
        }
        // Checks live in their own items (sk `CHECK#…`, in time order), so
        // however many an operator runs, the order item never grows.
        let order = order.map(|o: Order| Order { checks, ..o });
        (order.map(|order| OrderRecord { order, reservations, coupon_lock, payments, refunds }), bad)
    }
}

pub(crate) fn status_of(item: &Item, attr: &str) -> Option<String> {
    item.get(attr).and_then(|v| v.as_s().ok()).cloned()
}

#[async_trait]
impl OrderStore for DynamoStore {
    async fn create_order(
        &self,
        order: &Order,
        caps: &Caps,
        claim: &IdempotencyClaim,
    ) -> Result<CreateResult, Unavailable> {
        let now = order.created_at;
        let mut items = Vec::with_capacity(2 + 2 * order.items.len() + 2);
        items.push(self.claim_put(order, claim));
        items.push(put(&self.table, self.new_order_item(order), Some("attribute_not_exists(pk)")));
        // Index of the transaction item that decrements each SKU's stock,
        // so a cancellation reason can be traced back to the SKU.
        let mut stock_index = Vec::new();
        for line in &order.items {
            stock_index.push((items.len(), line));
            items.push(TransactWriteItem::builder().update(self.take_stock(order, line, caps)).build());
        }
        // The buyer's counters (purchase limits, points, the open-order
        // slot), each with the refusal its condition means.
        let mut buyer_index = Vec::new();
        let holdings = caps.holdings(order);
        for r in &holdings {
            if let Some((update, refused)) = holdings::take(&self.table, r, caps, &order.currency) {
                buyer_index.push((items.len(), refused));
                items.push(TransactWriteItem::builder().update(update).build());
            }
        }
        for r in &holdings {
            items.push(put(&self.table, reservation_item(order, r, now), None));
        }
        let mut coupon_index = None;
        if let Some(coupon_id) = &order.coupon_id {
            coupon_index = Some(items.len());
            items.push(TransactWriteItem::builder().update(self.lock_coupon(order, coupon_id)).build());
            items.push(put(&self.table, coupon_lock_item(order, coupon_id, now), None));
        }

        match self.transact_items(items, "create order transaction").await? {
            Ok(()) => Ok(CreateResult::Created),
            Err(failed) => {
                let at = TakenAt { stock: &stock_index, coupon: coupon_index, buyer: &buyer_index };
                self.create_refusal(order, caps, claim, &failed, &at).await
            }
        }
    }

    async fn current_expiry_rules(&self) -> Result<Option<crate::domain::expiry_rules::ExpiryRuleSet>, Unavailable> {
        self.read_expiry_rules(super::expiry_rules::CURRENT_SK).await
    }

    async fn claimed_order(&self, user_id: &UserId, key: &IdempotencyKey) -> Result<Option<ClaimedOrder>, Unavailable> {
        let Some(item) = self.get(keys::idempotency(user_id, key), keys::IDEM_SK, "idempotency key").await? else {
            return Ok(None);
        };
        match (status_of(&item, "order_id").and_then(|o| OrderId::parse(o).ok()), status_of(&item, "request_hash")) {
            (Some(order_id), Some(request_hash)) => Ok(Some(ClaimedOrder { order_id, request_hash })),
            _ => Err(Unavailable::new("idempotency record", "record without order_id or request_hash")),
        }
    }

    async fn order(&self, order_id: &OrderId) -> Result<Option<Order>, Unavailable> {
        self.get_record(keys::order(order_id), keys::ORDER_SK, "order").await
    }

    async fn order_record(&self, order_id: &OrderId) -> Result<Option<OrderRecord>, Unavailable> {
        let query = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(keys::order(order_id)))
            .consistent_read(true);
        let mut items = Vec::new();
        each_queried(query, "query order record", |item| {
            items.push(item);
            Ok(())
        })
        .await?;
        Self::assemble(items)
    }

    async fn close_unpaid(&self, order: &Order, now: Timestamp) -> Result<Cas, Unavailable> {
        let (from, to) = order::transition(OrderEvent::CloseUnpaid);
        let (from_cond, from_values) = status_in("#status", from.iter().map(|s| s.as_str()));
        let mut req = self
            .order_update(order)
            .update_expression(format!(
                "SET #status = :to, version = version + :one, closed_at = :now, \
                 history = list_append(history, :h), {FINAL_ENTRIES}",
            ))
            .condition_expression(format!("{from_cond} AND version = :v AND payment_attempts = :zero AND {DUE}"))
            .expression_attribute_values(":to", s(to.as_str()))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":now", s(now.to_string()))
            .expression_attribute_values(":h", history_entry(now, order.status, to, close_cause(order)));
        for (k, v) in
            from_values.into_iter().chain(self.effects_entry(&order.order_id, now).map(|(k, v)| (k.to_owned(), v)))
        {
            req = req.expression_attribute_values(k, v);
        }
        self.cas(req, "close unpaid order").await
    }

    async fn begin_closing(&self, order: &Order, lease: &ClosingLease, now: Timestamp) -> Result<Cas, Unavailable> {
        // Only the move out of PENDING_PAYMENT is a status change for the
        // history; a takeover of an expired lease is counted on the lease.
        let (set, cause) = if order.status == OrderStatus::Closing {
            ("SET version = version + :one, closing = :lease, due_at = :until", None)
        } else {
            (
                "SET #status = :closing, version = version + :one, closing = :lease, due_at = :until, \
                 history = list_append(history, :h)",
                Some(format!("close started by {}", lease.owner)),
            )
        };
        let mut req = self
            .order_update(order)
            .update_expression(set)
            .condition_expression(format!(
                "version = :v AND ((#status = :pending AND {DUE}) OR \
                     (#status = :closing AND (attribute_not_exists(closing) OR closing.lease_until <= :now)))"
            ))
            .expression_attribute_values(":closing", s("CLOSING"))
            .expression_attribute_values(":pending", s("PENDING_PAYMENT"))
            .expression_attribute_values(":lease", Av::M(to_item(lease)))
            // While CLOSING, the order is due (for the sweep) when its lease
            // runs out: that is when a dead closer must be taken over.
            .expression_attribute_values(":until", s(lease.lease_until.to_string()))
            .expression_attribute_values(":now", s(now.to_string()));
        if let Some(cause) = cause {
            req = req.expression_attribute_values(":h", history_entry(now, order.status, OrderStatus::Closing, &cause));
        }
        self.cas(req, "begin closing").await
    }

    async fn hold_closing(&self, order: &Order, until: Timestamp) -> Result<Cas, Unavailable> {
        let owner = order.closing.as_ref().map(|l| l.owner.clone()).unwrap_or_default();
        let req = self
            .order_update(order)
            .update_expression("SET closing.lease_until = :until, due_at = :until, version = version + :one")
            .condition_expression("#status = :closing AND version = :v AND closing.#owner = :owner")
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":closing", s("CLOSING"))
            .expression_attribute_values(":owner", s(owner))
            .expression_attribute_values(":until", s(until.to_string()));
        self.cas(req, "hold closing").await
    }

    async fn request_cancel(&self, order: &Order, now: Timestamp) -> Result<Cas, Unavailable> {
        let req = self
            .order_update(order)
            .update_expression("SET cancel_requested_at = :now, due_at = :now, version = version + :one")
            .condition_expression(
                "#status = :pending AND version = :v AND expire_at > :now AND attribute_not_exists(cancel_requested_at)",
            )
            .expression_attribute_values(":pending", s(OrderStatus::PendingPayment.as_str()))
            .expression_attribute_values(":now", s(now.to_string()));
        self.cas(req, "request cancel").await
    }

    async fn note_lazy_reminder(&self, order: &Order, now: Timestamp, every: Duration) -> Result<Cas, Unavailable> {
        let req = self
            .order_item_update(&order.order_id)
            .update_expression("SET lazy_reminder_at = :now")
            .condition_expression(format!(
                "#status = :pending AND {DUE} AND \
                 (attribute_not_exists(lazy_reminder_at) OR lazy_reminder_at <= :before)"
            ))
            .expression_attribute_values(":pending", s(OrderStatus::PendingPayment.as_str()))
            .expression_attribute_values(":now", s(now.to_string()))
            .expression_attribute_values(":before", s(now.minus(every).to_string()));
        self.cas(req, "note lazy reminder").await
    }

    async fn note_early_reminder(&self, order: &Order, until: Timestamp, now: Timestamp) -> Result<Cas, Unavailable> {
        let req = self
            .order_item_update(&order.order_id)
            .update_expression("SET early_reminder_until = :until")
            .condition_expression(
                "#status = :pending AND (attribute_not_exists(early_reminder_until) OR early_reminder_until <= :now)",
            )
            .expression_attribute_values(":pending", s(OrderStatus::PendingPayment.as_str()))
            .expression_attribute_values(":until", s(until.to_string()))
            .expression_attribute_values(":now", s(now.to_string()));
        self.cas(req, "note early reminder").await
    }

    async fn record_check(&self, order_id: &OrderId, check: &OperatorCheck) -> Result<Cas, Unavailable> {
        let mut item = to_item(check);
        let sk = format!("CHECK#{}#{:08x}", check.at, rand::random::<u32>());
        item.extend(key(keys::order(order_id), &sk));
        item.insert("entity".into(), s("OPERATOR_CHECK"));
        let req = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)");
        match req.send().await {
            Ok(_) => Ok(Cas::Applied),
            Err(e) if is_condition_failure(&e) => Ok(Cas::Rejected),
            Err(e) => Err(Unavailable::new("record operator check", e)),
        }
    }

    async fn effects_done(&self, order_id: &OrderId, status: OrderStatus) -> Result<Cas, Unavailable> {
        let req = self
            .order_item_update(order_id)
            .update_expression("REMOVE due_shard, due_at")
            .condition_expression("#status = :final AND begins_with(due_shard, :fx)")
            .expression_attribute_values(":final", s(status.as_str()))
            .expression_attribute_values(":fx", s(keys::EFFECTS_PREFIX));
        self.cas(req, "mark effects done").await
    }

    async fn close_after_check(&self, order: &Order, now: Timestamp, cause: &str) -> Result<Cas, Unavailable> {
        let owner = order.closing.as_ref().map(|l| l.owner.clone()).unwrap_or_default();
        let (from, to) = order::transition(OrderEvent::ConfirmUnpaid);
        let (from_cond, from_values) = status_in("#status", from.iter().map(|s| s.as_str()));
        let mut req = self
            .order_update(order)
            .update_expression(format!(
                "SET #status = :to, version = version + :one, closed_at = :now, \
                 history = list_append(history, :h), {FINAL_ENTRIES}",
            ))
            .condition_expression(format!("{from_cond} AND version = :v AND closing.#owner = :owner"))
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":to", s(to.as_str()))
            .expression_attribute_values(":owner", s(owner))
            .expression_attribute_values(":now", s(now.to_string()))
            .expression_attribute_values(":h", history_entry(now, order.status, to, cause));
        for (k, v) in
            from_values.into_iter().chain(self.effects_entry(&order.order_id, now).map(|(k, v)| (k.to_owned(), v)))
        {
            req = req.expression_attribute_values(k, v);
        }
        self.cas(req, "close after payment check").await
    }

    async fn release_reservation(
        &self,
        order_id: &OrderId,
        r: &Reservation,
        now: Timestamp,
    ) -> Result<Moved<ReservationStatus>, Unavailable> {
        self.move_reservation(order_id, r, ReservationEvent::Release, now).await
    }

    async fn confirm_reservation(
        &self,
        order_id: &OrderId,
        r: &Reservation,
        now: Timestamp,
    ) -> Result<Moved<ReservationStatus>, Unavailable> {
        self.move_reservation(order_id, r, ReservationEvent::Confirm, now).await
    }

    async fn end_coupon_lock(
        &self,
        order_id: &OrderId,
        coupon_id: &CouponId,
        to: CouponLockStatus,
        reason: &str,
        now: Timestamp,
    ) -> Result<Moved<CouponLockStatus>, Unavailable> {
        let Some(event) = coupon::event_for(to) else {
            return Ok(Err(Refused { from: "LOCKED", event: "lock" }));
        };
        let (from, _) = coupon::transition(event);
        let lock = self
            .record_move(order_id, &keys::coupon_lock_sk(coupon_id), from.iter().map(|s| s.as_str()))
            .update_expression("SET #status = :to, reason = :reason, ended_at = :now")
            .expression_attribute_values(":to", s(to.as_str()))
            .expression_attribute_values(":reason", s(reason))
            .expression_attribute_values(":now", s(now.to_string()))
            .build()
            .expect("complete update");
        let coupon = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(keys::coupon(coupon_id), keys::COUPON_SK)))
            .update_expression("SET #state = :to, reason = :reason REMOVE locked_by")
            .condition_expression("locked_by = :o")
            .expression_attribute_names("#state", "state")
            .expression_attribute_values(":to", s(to.as_str()))
            .expression_attribute_values(":reason", s(reason))
            .expression_attribute_values(":o", s(order_id.as_str()))
            .build()
            .expect("complete update");
        let apply = |from| coupon::apply(from, event);
        self.move_with(lock, coupon, to, apply, "end coupon lock", "the lock or the coupon is missing").await
    }

    async fn stock(&self, sku: &Sku) -> Result<Option<Stock>, Unavailable> {
        self.get_record(keys::sku(sku), keys::STOCK_SK, "stock").await
    }

    async fn stocks(&self, skus: &[Sku]) -> Result<Vec<Stock>, Unavailable> {
        // BatchGetItem refuses a key listed twice and takes 100 keys a call.
        let mut wanted: Vec<&Sku> = skus.iter().collect();
        wanted.sort();
        wanted.dedup();
        let mut found = Vec::with_capacity(wanted.len());
        for chunk in wanted.chunks(100) {
            let keys_and_attributes = KeysAndAttributes::builder()
                .set_keys(Some(chunk.iter().map(|sku| key(keys::sku(sku), keys::STOCK_SK)).collect()))
                .consistent_read(true)
                .build()
                .expect("complete keys");
            let mut pending = Some(HashMap::from([(self.table.clone(), keys_and_attributes)]));
            let mut backoff = Backoff::new();
            while let Some(request) = pending.take().filter(|r| !r.is_empty()) {
                let out = self
                    .client
                    .batch_get_item()
                    .set_request_items(Some(request))
                    .send()
                    .await
                    .map_err(unavailable("read stock"))?;
                for item in out.responses.unwrap_or_default().remove(&self.table).unwrap_or_default() {
                    found.push(from_item(item, "stock")?);
                }
                // Keys the service did not get to (throttling, size) come
                // back to be asked again.
                pending = out.unprocessed_keys.filter(|u| !u.is_empty());
                if pending.is_some() && !backoff.wait().await {
                    return Err(Unavailable::new("read stock", "keys left unprocessed after retries"));
                }
            }
        }
        Ok(found)
    }

    async fn put_coupon(&self, coupon: &Coupon) -> Result<PutCoupon, Unavailable> {
        let mut item = to_item(coupon);
        item.extend(key(keys::coupon(&coupon.coupon_id), keys::COUPON_SK));
        item.insert("entity".into(), s("COUPON"));
        let req = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            // Only a new or AVAILABLE coupon may be (re)written. A LOCKED
            // one is held by an order (overwriting it would break the lock);
            // USED, EXPIRED and VOID are outcomes, and setting one back to
            // AVAILABLE would let a second order spend the same coupon.
            .condition_expression("attribute_not_exists(pk) OR #state = :available")
            .expression_attribute_names("#state", "state")
            .expression_attribute_values(":available", s("AVAILABLE"))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        match send_single(|| req.clone().send()).await {
            Ok(Ok(_)) => Ok(PutCoupon::Stored),
            Ok(Err(e)) => {
                use aws_sdk_dynamodb::operation::put_item::PutItemError;
                let old = match e.as_service_error() {
                    Some(PutItemError::ConditionalCheckFailedException(c)) => c.item().cloned(),
                    _ => None,
                };
                let state = old
                    .and_then(|item| status_of(&item, "state"))
                    .and_then(|st| serde_json::from_value::<CouponState>(serde_json::Value::String(st)).ok());
                match state {
                    Some(CouponState::Locked) => Ok(PutCoupon::Locked),
                    Some(st) => Ok(PutCoupon::Final(st)),
                    None => Err(Unavailable::new("put coupon", "condition failed on an unreadable coupon")),
                }
            }
            Err(e) => Err(Unavailable::new("put coupon", e)),
        }
    }

    async fn coupon(&self, coupon_id: &CouponId) -> Result<Option<Coupon>, Unavailable> {
        self.get_record(keys::coupon(coupon_id), keys::COUPON_SK, "coupon").await
    }
}

/// The record of a holding the new order reserved, in the order's partition.
fn reservation_item(order: &Order, r: &Reservation, now: Timestamp) -> Item {
    let mut res = to_item(r);
    res.extend(key(keys::order(&order.order_id), &r.sort_key()));
    res.insert("entity".into(), s("RESERVATION"));
    res.insert("version".into(), n(1));
    res.insert("reserved_at".into(), s(now.to_string()));
    res
}

/// The record of the new order's lock on its coupon, in the order's partition.
fn coupon_lock_item(order: &Order, coupon_id: &CouponId, now: Timestamp) -> Item {
    let mut lock =
        to_item(&CouponLock { coupon_id: coupon_id.clone(), status: CouponLockStatus::Locked, reason: None });
    lock.extend(key(keys::order(&order.order_id), &keys::coupon_lock_sk(coupon_id)));
    lock.insert("entity".into(), s("COUPON_LOCK"));
    lock.insert("locked_at".into(), s(now.to_string()));
    lock
}

/// Where the create transaction's conditional items are, by kind: which
/// one failed says why the create was refused.
struct TakenAt<'a> {
    stock: &'a [(usize, &'a OrderLine)],
    coupon: Option<usize>,
    buyer: &'a [(usize, holdings::TakeRefused)],
}

impl DynamoStore {
    /// Why the create transaction was cancelled, from the items whose
    /// condition failed (`failed`, the old item of each when the engine
    /// returns it): a replay of the key, a SKU's stock, price or limit, the
    /// coupon, a buyer counter.
    async fn create_refusal(
        &self,
        order: &Order,
        caps: &Caps,
        claim: &IdempotencyClaim,
        failed: &[Option<Item>],
        at: &TakenAt<'_>,
    ) -> Result<CreateResult, Unavailable> {
        let failed_at = |i: usize| match failed.get(i) {
            Some(Some(old)) => Some(old),
            _ => None,
        };
        if let Some(old) = failed_at(0) {
            let order_id = status_of(old, "order_id")
                .and_then(|o| OrderId::parse(o).ok())
                .ok_or_else(|| Unavailable::new("idempotency record", "record without order_id"))?;
            let same_request = status_of(old, "request_hash").as_deref() == Some(claim.request_hash.as_str());
            return Ok(CreateResult::Replay { order_id, same_request });
        }
        if let Some((i, line)) = at.stock.iter().find(|(i, _)| failed_at(*i).is_some()) {
            // The stock item as the transaction saw it. An empty one means
            // it does not exist, or an engine that does not return old
            // items of a transaction: a read (which changes nothing) tells
            // them apart.
            let now: Option<Stock> = match failed_at(*i) {
                Some(old) if !old.is_empty() => Some(from_item(old.clone(), "stock")?),
                _ => self.stock(&line.sku).await?,
            };
            let sku = line.sku.clone();
            let line_price = Price { amount: line.unit_price, currency: order.currency.clone() };
            return Ok(match now {
                None => CreateResult::OutOfStock(sku),
                Some(s) if s.catalog_price().as_ref() != Some(&line_price) => {
                    CreateResult::PriceChanged { sku, now: s.catalog_price() }
                }
                Some(s) if s.purchase_limit != caps.purchase_limits.get(&sku).copied() => {
                    CreateResult::PurchaseLimitChanged(sku)
                }
                Some(_) => CreateResult::OutOfStock(sku),
            });
        }
        if at.coupon.is_some_and(|i| failed_at(i).is_some()) {
            return Ok(CreateResult::CouponUnavailable);
        }
        if let Some((i, refused)) = at.buyer.iter().find(|(i, _)| failed_at(*i).is_some()) {
            return Ok(match refused.clone() {
                holdings::TakeRefused::PurchaseLimit { sku, limit } => {
                    CreateResult::PurchaseLimitReached { sku, limit }
                }
                holdings::TakeRefused::Points => match failed_at(*i).and_then(|old| status_of(old, "currency")) {
                    Some(c) if c != order.currency.as_str() => CreateResult::PointsCurrencyMismatch {
                        currency: Currency::parse(c).map_err(|e| Unavailable::new("points balance", e.0))?,
                    },
                    _ => CreateResult::NotEnoughPoints,
                },
                holdings::TakeRefused::OpenOrders { cap } => CreateResult::OpenOrderCapReached { cap },
            });
        }
        Err(Unavailable::new("create order transaction", "cancelled on an unexpected condition"))
    }

    /// The create transaction's claim of the buyer's idempotency key: only
    /// if the key was never used; a replay gets the old record back.
    fn claim_put(&self, order: &Order, claim: &IdempotencyClaim) -> TransactWriteItem {
        let mut idem = key(keys::idempotency(&claim.user_id, &claim.key), keys::IDEM_SK);
        idem.insert("entity".into(), s("IDEMPOTENCY_KEY"));
        idem.insert("request_hash".into(), s(&claim.request_hash));
        idem.insert("order_id".into(), s(order.order_id.as_str()));
        idem.insert("created_at".into(), s(order.created_at.to_string()));
        let p = Put::builder()
            .table_name(&self.table)
            .set_item(Some(idem))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("complete put");
        TransactWriteItem::builder().put(p).build()
    }

    /// The new order's item, its history starting with its creation.
    fn new_order_item(&self, order: &Order) -> Item {
        let mut item = self.order_item(order);
        item.insert(
            "history".into(),
            Av::L(vec![Av::M(to_item(&StatusChange {
                at: order.created_at,
                from: None,
                to: OrderStatus::PendingPayment,
                cause: "created".into(),
            }))]),
        );
        item
    }

    /// The create transaction's lock of the order's coupon: only an
    /// AVAILABLE coupon of the buyer's, still valid.
    fn lock_coupon(&self, order: &Order, coupon_id: &CouponId) -> Update {
        Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(keys::coupon(coupon_id), keys::COUPON_SK)))
            .update_expression("SET #state = :locked, locked_by = :o")
            .condition_expression("#state = :available AND user_id = :u AND valid_until > :now")
            .expression_attribute_names("#state", "state")
            .expression_attribute_values(":locked", s("LOCKED"))
            .expression_attribute_values(":available", s("AVAILABLE"))
            .expression_attribute_values(":o", s(order.order_id.as_str()))
            .expression_attribute_values(":u", s(order.user_id.as_str()))
            .expression_attribute_values(":now", s(order.created_at.to_string()))
            .build()
            .expect("complete update")
    }

    /// The create transaction's stock decrement for `line`. The price the
    /// use case read from the catalog must still be the catalog's: a
    /// change in between cancels the order instead of writing it at a
    /// price the catalog no longer has.
    fn take_stock(&self, order: &Order, line: &OrderLine, caps: &Caps) -> Update {
        // The purchase limit the order is checked against must still be
        // the SKU's: an operator's change applies from the next order.
        let (limit_cond, limit) = match caps.purchase_limits.get(&line.sku) {
            Some(l) => ("purchase_limit = :limit", Some(*l)),
            None => ("attribute_not_exists(purchase_limit)", None),
        };
        let mut u = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(keys::sku(&line.sku), keys::STOCK_SK)))
            .update_expression("SET available = available - :q, reserved = reserved + :q")
            .condition_expression(format!(
                "attribute_exists(pk) AND available >= :q AND price = :price AND currency = :currency AND {limit_cond}"
            ));
        if let Some(l) = limit {
            u = u.expression_attribute_values(":limit", n(l));
        }
        u.expression_attribute_values(":q", n(line.qty))
            .expression_attribute_values(":price", n(line.unit_price))
            .expression_attribute_values(":currency", s(order.currency.as_str()))
            // The old item tells which condition failed.
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("complete update")
    }

    async fn move_reservation(
        &self,
        order_id: &OrderId,
        r: &Reservation,
        event: ReservationEvent,
        now: Timestamp,
    ) -> Result<Moved<ReservationStatus>, Unavailable> {
        let (from, to) = reservation::transition(event);
        let reservation = self
            .record_move(order_id, &r.sort_key(), from.iter().map(|s| s.as_str()))
            .update_expression("SET #status = :to, version = version + :one, updated_at = :now")
            .expression_attribute_values(":to", s(to.as_str()))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":now", s(now.to_string()))
            .build()
            .expect("complete update");
        let counter = holdings::settle(&self.table, r, event);
        let apply = |from| reservation::apply(from, event);
        let missing = "the reservation is missing or its counter does not hold it";
        self.move_with(reservation, counter, to, apply, "move reservation", missing).await
    }

    /// The update of a record in `order_id`'s partition (sort key `sk`) out
    /// of one of the states `from`; when refused, it hands back the record
    /// as it is. The caller adds what the move sets.
    fn record_move(
        &self,
        order_id: &OrderId,
        sk: &str,
        from: impl IntoIterator<Item = &'static str>,
    ) -> aws_sdk_dynamodb::types::builders::UpdateBuilder {
        let (from_cond, from_values) = status_in("#status", from);
        let mut u = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(keys::order(order_id), sk)))
            .condition_expression(from_cond)
            .expression_attribute_names("#status", "status")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        for (k, v) in from_values {
            u = u.expression_attribute_values(k, v);
        }
        u
    }

    /// A record's move (`record`, from [`Self::record_move`]) to `to`
    /// together with the counter or coupon that follows it (`follower`),
    /// in one transaction. When refused, the status the record has now
    /// goes through the domain's state machine (`apply`), which tells
    /// "already there" from a refusal; `missing` when the record has no
    /// status to read (it, or the follower's hold, is gone).
    async fn move_with<S: serde::de::DeserializeOwned>(
        &self,
        record: Update,
        follower: Update,
        to: S,
        apply: impl FnOnce(S) -> Moved<S>,
        context: &'static str,
        missing: &'static str,
    ) -> Result<Moved<S>, Unavailable> {
        let items = vec![
            TransactWriteItem::builder().update(record).build(),
            TransactWriteItem::builder().update(follower).build(),
        ];
        match self.transact_items(items, context).await? {
            Ok(()) => Ok(Ok(Step::Moved(to))),
            Err(failed) => {
                let found = failed
                    .first()
                    .cloned()
                    .flatten()
                    .and_then(|item| status_of(&item, "status"))
                    .and_then(|st| serde_json::from_value::<S>(serde_json::Value::String(st)).ok());
                match found {
                    Some(from) => Ok(apply(from)),
                    None => Err(Unavailable::new(context, missing)),
                }
            }
        }
    }
}

#[cfg(test)]
mod write_token_tests {
    use super::with_write_token;

    #[test]
    fn the_write_token_joins_the_set_clause_or_makes_one() {
        assert_eq!(with_write_token("SET a = :a REMOVE b"), "SET write_token = :write_token, a = :a REMOVE b");
        assert_eq!(
            with_write_token("REMOVE due_shard, due_at"),
            "SET write_token = :write_token REMOVE due_shard, due_at"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transaction_conflicts_are_retried_on_single_item_writes() {
        assert_eq!(classify_single_write(Some("TransactionConflictException")), SingleWriteError::Retry);
        assert_eq!(classify_single_write(Some("ConditionalCheckFailedException")), SingleWriteError::ConditionFailed);
        for other in [
            Some("ValidationException"),
            Some("ResourceNotFoundException"),
            Some("ItemCollectionSizeLimitExceededException"),
            // Throttling is retried by the SDK's own policy before it gets here.
            Some("ProvisionedThroughputExceededException"),
            None,
        ] {
            assert_eq!(classify_single_write(other), SingleWriteError::Fail, "{other:?}");
        }
    }

    #[tokio::test]
    async fn a_single_item_write_is_sent_again_after_a_transaction_conflict() {
        use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
        use aws_sdk_dynamodb::types::error::TransactionConflictException;
        let calls = std::sync::atomic::AtomicU32::new(0);
        let res: Result<Result<u32, _>, _> = send_single(|| async {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if n < 2 {
                let err = UpdateItemError::TransactionConflictException(
                    TransactionConflictException::builder()
                        .message("conflict")
                        .meta(
                            aws_sdk_dynamodb::error::ErrorMetadata::builder()
                                .code("TransactionConflictException")
                                .build(),
                        )
                        .build(),
                );
                Err(SdkError::<UpdateItemError, ()>::service_error(err, ()))
            } else {
                Ok(n)
            }
        })
        .await;
        assert_eq!(res.ok().and_then(|r| r.ok()), Some(2));
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}
