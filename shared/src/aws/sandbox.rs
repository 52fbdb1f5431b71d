//! The sandbox payment channel: a provider's test mode with its own ledger
//! (a DynamoDB table of its own, `payment_id` keyed). It keeps the channel's
//! facts — what was paid, what was refunded — apart from the order's, which
//! is what reconciliation compares. Faults can be planted per payment so
//! that tests can drive every branch of the close and refund paths.

use super::dynamo::{each_scanned, is_condition_failure, s};
use crate::domain::*;
use crate::ports::{
    ChannelPayment, ChannelStatement, OpenedPayment, PaymentChannel, RefundResult, Statement, StatementLine,
    Unavailable,
};
use crate::store::PaymentAttempt;
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue as Av, ReturnValue};
use aws_sdk_dynamodb::Client;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// How the sandbox misbehaves when asked about (or told to close) a payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueryFault {
    /// Fail as if the channel did not answer.
    Timeout,
    /// Answer that the channel has no such payment (a provider that lost or
    /// has not yet indexed it).
    NotFound,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<QueryFault>,
    /// How many refund calls fail before one succeeds.
    #[serde(default)]
    pub refund_failures: u32,
}

/// One row of the sandbox's ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub payment_id: PaymentId,
    pub order_id: OrderId,
    pub merchant_id: String,
    pub amount: i64,
    pub currency: Currency,
    /// PROCESSING, SUCCEEDED or FAILED.
    pub status: PaymentStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_txn_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refund_id: Option<String>,
    #[serde(default)]
    pub refunded_amount: i64,
    #[serde(default)]
    pub faults: Faults,
    /// When the payment was opened here (absent on rows written before it
    /// was recorded, and on the close markers of payments never opened).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Timestamp>,
}

#[derive(Clone)]
pub struct SandboxChannel {
    client: Client,
    table: String,
}

impl SandboxChannel {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self { client, table: table.into() }
    }

    fn key(payment_id: &PaymentId) -> HashMap<String, Av> {
        HashMap::from([("payment_id".to_owned(), s(payment_id.as_str()))])
    }

    pub async fn entry(&self, payment_id: &PaymentId) -> Result<Option<LedgerEntry>, Unavailable> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(payment_id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| Unavailable::new("sandbox ledger get", e))?;
        out.item
            .map(|i| serde_dynamo::from_item(i).map_err(|e| Unavailable::new("sandbox ledger decode", e)))
            .transpose()
    }

    /// Every ledger row (reconciliation reads the channel's side from here).
    pub async fn entries(&self) -> Result<Vec<LedgerEntry>, Unavailable> {
        let scan = self.client.scan().table_name(&self.table).consistent_read(true);
        let mut all = Vec::new();
        each_scanned(scan, "sandbox ledger scan", |i| {
            all.push(serde_dynamo::from_item(i).map_err(|e| Unavailable::new("sandbox ledger decode", e))?);
            Ok(())
        })
        .await?;
        Ok(all)
    }

    /// Records the channel's outcome for a payment (first outcome wins) and
    /// any planted faults. Returns the row as it now stands, or `None` when
    /// the payment was never opened at the channel.
    pub async fn settle(
        &self,
        payment_id: &PaymentId,
        outcome: Option<PaymentStatus>,
        faults: Option<&Faults>,
    ) -> Result<Option<LedgerEntry>, Unavailable> {
        let mut sets = Vec::new();
        let mut u = self.client.update_item().table_name(&self.table).set_key(Some(Self::key(payment_id)));
        let mut cond = "attribute_exists(payment_id)".to_owned();
        if let Some(o) = outcome {
            sets.push("#status = :s, channel_txn_id = if_not_exists(channel_txn_id, :t)");
            // Once settled, a payment's outcome at the channel is fixed.
            cond.push_str(" AND (#status = :processing OR #status = :s)");
            u = u
                .expression_attribute_names("#status", "status")
                .expression_attribute_values(":s", s(o.as_str()))
                .expression_attribute_values(":processing", s("PROCESSING"))
                .expression_attribute_values(":t", s(format!("sbx_txn_{payment_id}")));
        }
        if let Some(f) = faults {
            sets.push("faults = :f");
            u = u.expression_attribute_values(":f", Av::M(serde_dynamo::to_item(f).expect("serialisable")));
        }
        if sets.is_empty() {
            return self.entry(payment_id).await;
        }
        let res = u
            .update_expression(format!("SET {}", sets.join(", ")))
            .condition_expression(cond)
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match res {
            Ok(out) => out
                .attributes
                .map(|i| serde_dynamo::from_item(i).map_err(|e| Unavailable::new("sandbox ledger decode", e)))
                .transpose(),
            Err(e) if is_condition_failure(&e) => self.entry(payment_id).await,
            Err(e) => Err(Unavailable::new("sandbox settle", e)),
        }
    }

    /// Writes the closed marker of a payment never opened here: `true` when
    /// written, `false` when a row exists (the payment was opened meanwhile).
    async fn close_unopened(&self, attempt: &PaymentAttempt) -> Result<bool, Unavailable> {
        let marker = LedgerEntry {
            payment_id: attempt.payment_id.clone(),
            order_id: attempt.order_id.clone(),
            // Not known to a close; the row never moves money.
            merchant_id: String::new(),
            amount: attempt.amount,
            currency: attempt.currency.clone(),
            status: PaymentStatus::Failed,
            channel_txn_id: None,
            refund_id: None,
            refunded_amount: 0,
            faults: Faults::default(),
            created_at: None,
        };
        let mut item: HashMap<String, Av> = serde_dynamo::to_item(&marker).expect("serialisable");
        item.insert("closed_by_merchant".into(), Av::Bool(true));
        item.insert("closed_unopened".into(), Av::Bool(true));
        let res = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(payment_id)")
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failure(&e) => Ok(false),
            Err(e) => Err(Unavailable::new("sandbox close unopened payment", e)),
        }
    }
}

impl From<LedgerEntry> for StatementLine {
    fn from(e: LedgerEntry) -> Self {
        Self {
            payment_id: e.payment_id,
            order_id: e.order_id,
            amount: e.amount,
            currency: e.currency,
            status: e.status,
            refund_id: e.refund_id,
            refunded_amount: e.refunded_amount,
            created_at: e.created_at,
        }
    }
}

/// The sandbox's statement is its whole ledger.
#[async_trait]
impl ChannelStatement for SandboxChannel {
    async fn statement(&self, _now: Timestamp) -> Result<Statement, Unavailable> {
        Ok(Statement {
            since: None,
            until: None,
            lines: self.entries().await?.into_iter().map(StatementLine::from).collect(),
        })
    }

    /// The sandbox is a stand-in for a provider's API, and its ledger holds
    /// only what tests and demos made: it filters one read of the ledger
    /// by `created_at`. A real channel filters at the source (Stripe's
    /// `created` range).
    async fn statement_between(&self, since: Timestamp, until: Timestamp) -> Result<Statement, Unavailable> {
        let lines = self
            .entries()
            .await?
            .into_iter()
            .filter(|e| e.created_at.is_some_and(|at| since <= at && at < until))
            .map(StatementLine::from)
            .collect();
        Ok(Statement { since: Some(since), until: Some(until), lines })
    }
}

/// What the sandbox tells a caller about a ledger row, planted faults first.
fn answer(entry: Option<LedgerEntry>, context: &'static str) -> Result<ChannelPayment, Unavailable> {
    let Some(e) = entry else {
        return Ok(ChannelPayment::NotFound);
    };
    match e.faults.query {
        Some(QueryFault::Timeout) => return Err(Unavailable::new(context, "timed out (injected fault)")),
        Some(QueryFault::NotFound) => return Ok(ChannelPayment::NotFound),
        None => {}
    }
    Ok(match e.status {
        PaymentStatus::Succeeded => ChannelPayment::Succeeded {
            channel_txn_id: e.channel_txn_id.unwrap_or_default(),
            amount: e.amount,
            currency: e.currency.to_string(),
        },
        PaymentStatus::Failed => ChannelPayment::Failed,
        PaymentStatus::Processing | PaymentStatus::Unknown => ChannelPayment::Pending,
    })
}

#[async_trait]
impl PaymentChannel for SandboxChannel {
    async fn open(&self, attempt: &PaymentAttempt, merchant_id: &str) -> Result<OpenedPayment, Unavailable> {
        let entry = LedgerEntry {
            payment_id: attempt.payment_id.clone(),
            order_id: attempt.order_id.clone(),
            merchant_id: merchant_id.to_owned(),
            amount: attempt.amount,
            currency: attempt.currency.clone(),
            status: PaymentStatus::Processing,
            channel_txn_id: None,
            refund_id: None,
            refunded_amount: 0,
            faults: Faults::default(),
            created_at: Some(attempt.created_at),
        };
        let res = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(serde_dynamo::to_item(&entry).expect("serialisable")))
            .condition_expression("attribute_not_exists(payment_id)")
            .send()
            .await;
        match res {
            // The sandbox keys payments by our payment_id: no id of its own,
            // and the buyer pays through its settle route, not a secret.
            Ok(_) => Ok(OpenedPayment::default()),
            // Opened before (a replay): the same payment again — unless it
            // was closed at the channel (concluded never charged, or failed):
            // that one can never be opened again.
            Err(e) if is_condition_failure(&e) => match self.entry(&attempt.payment_id).await? {
                Some(e) if e.status == PaymentStatus::Failed => Ok(OpenedPayment {
                    refused: Some("the payment was closed at the channel and cannot be opened again".into()),
                    ..Default::default()
                }),
                _ => Ok(OpenedPayment::default()),
            },
            Err(e) => Err(Unavailable::new("sandbox open payment", e)),
        }
    }

    async fn query(&self, attempt: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        answer(self.entry(&attempt.payment_id).await?, "sandbox query")
    }

    async fn cancel(&self, attempt: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        let payment_id = &attempt.payment_id;
        // The planted faults stand for an unreachable or lagging channel:
        // they apply to closing a payment as much as to asking about it.
        let entry = match self.entry(payment_id).await? {
            Some(entry) => entry,
            // Never opened here: closed all the same, as a marker row
            // (FAILED, closed by the merchant), so that an open or a payment
            // of it arriving later is refused. Opened meanwhile: close that.
            None => match self.close_unopened(attempt).await? {
                true => return Ok(ChannelPayment::Failed),
                false => self.entry(payment_id).await?.ok_or_else(|| {
                    Unavailable::new("sandbox cancel", "the payment's row vanished while it was closed")
                })?,
            },
        };
        if entry.faults.query.is_some() || entry.status != PaymentStatus::Processing {
            return answer(Some(entry), "sandbox cancel");
        }
        let res = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(payment_id)))
            .update_expression("SET #status = :failed, closed_by_merchant = :yes")
            .condition_expression("#status = :processing")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":failed", s("FAILED"))
            .expression_attribute_values(":processing", s("PROCESSING"))
            .expression_attribute_values(":yes", Av::Bool(true))
            .send()
            .await;
        match res {
            Ok(_) => Ok(ChannelPayment::Failed),
            // Settled in the meantime: report what it settled to.
            Err(e) if is_condition_failure(&e) => answer(self.entry(payment_id).await?, "sandbox cancel"),
            Err(e) => Err(Unavailable::new("sandbox cancel", e)),
        }
    }

    async fn refund(
        &self,
        attempt: &PaymentAttempt,
        amount: i64,
        idempotency_key: &str,
    ) -> Result<RefundResult, Unavailable> {
        let payment_id = &attempt.payment_id;
        // A planted failure is consumed one call at a time.
        let failing = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(payment_id)))
            .update_expression("SET faults.refund_failures = faults.refund_failures - :one")
            .condition_expression("faults.refund_failures > :zero")
            .expression_attribute_values(":one", Av::N("1".into()))
            .expression_attribute_values(":zero", Av::N("0".into()))
            .send()
            .await;
        match failing {
            Ok(_) => return Ok(RefundResult::Failed("refund rejected by the channel (injected fault)".into())),
            Err(e) if is_condition_failure(&e) => {}
            Err(e) => return Err(Unavailable::new("sandbox refund", e)),
        }
        let res = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(payment_id)))
            .update_expression(
                "SET refund_id = if_not_exists(refund_id, :rid), refund_key = if_not_exists(refund_key, :k), \
                 refunded_amount = :a",
            )
            // Same key: the same refund again (idempotent). Another key, or
            // more than was paid: refused.
            .condition_expression(
                "#status = :succeeded AND amount >= :a AND (attribute_not_exists(refund_key) OR refund_key = :k)",
            )
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":succeeded", s("SUCCEEDED"))
            .expression_attribute_values(":rid", s(format!("sbx_refund_{payment_id}")))
            .expression_attribute_values(":k", s(idempotency_key))
            .expression_attribute_values(":a", Av::N(amount.to_string()))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match res {
            Ok(out) => {
                let id = out
                    .attributes
                    .and_then(|a| a.get("refund_id").and_then(|v| v.as_s().ok()).cloned())
                    .unwrap_or_default();
                Ok(RefundResult::Refunded { channel_refund_id: id })
            }
            Err(e) if is_condition_failure(&e) => {
                Ok(RefundResult::Failed("the channel refused the refund (not paid, amount or key mismatch)".into()))
            }
            Err(e) => Err(Unavailable::new("sandbox refund", e)),
        }
    }
}
