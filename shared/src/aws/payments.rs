//! The DynamoDB adapter of [`PaymentStore`]: payment attempts, the
//! success/refund decision written atomically with its notification dedupe
//! and channel-transaction uniqueness, and refunds.

use super::dynamo::{each_queried, each_scanned, key, keys, n, put, s, status_in, DynamoStore, Item, FINAL_ENTRIES};
use crate::domain::order::{self, on_payment_success, OrderEvent, PaymentSuccessOutcome};
use crate::domain::payment;
use crate::domain::*;
use crate::error::error_chain;
use crate::ports::Unavailable;
use crate::store::*;
use crate::usecases::refunds::REFUND_REDRIVE_AFTER;
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{
    AttributeValue as Av, ConditionCheck, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};

fn evidence_list(e: &Evidence) -> Av {
    Av::L(vec![Av::M(serde_dynamo::to_item(e).expect("serialisable"))])
}

/// How long a notification dedupe record is kept (DynamoDB TTL on
/// `expires_at_epoch`). Providers retry for hours or days, not months; a
/// replay after this still changes nothing, because a settled attempt is
/// never recorded twice.
pub const NOTIFY_DEDUPE_TTL_SECONDS: i64 = 30 * 24 * 3600;

pub fn notify_key(n: &Notification) -> String {
    format!("NOTIFY#{}#{}", n.channel, n.notify_id)
}

pub fn channel_txn_key(channel: &ChannelName, txn: &str) -> String {
    format!("CHTXN#{channel}#{txn}")
}

fn claimed_from(item: &Item) -> Result<ClaimedPayment, Unavailable> {
    let field = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
    let payment_id = field("payment_id")
        .and_then(|p| PaymentId::parse(p).ok())
        .ok_or_else(|| Unavailable::new("payment idempotency record", "record without payment_id"))?;
    Ok(ClaimedPayment { payment_id, request_hash: field("request_hash").unwrap_or_default() })
}

impl DynamoStore {
    fn notify_put(&self, n: &Notification, payment_id: &PaymentId, at: Timestamp) -> TransactWriteItem {
        let mut item = key(notify_key(n), "NOTIFY");
        item.insert("entity".into(), s("NOTIFICATION"));
        item.insert("payment_id".into(), s(payment_id.as_str()));
        item.insert("received_at".into(), s(at.to_string()));
        item.insert("expires_at_epoch".into(), super::dynamo::n(at.unix_seconds() + NOTIFY_DEDUPE_TTL_SECONDS));
        put(self.table(), item, Some("attribute_not_exists(pk)"))
    }

    /// Records `status` on an attempt, appending `e` to its evidence, if the
    /// payment state machine allows it from the attempt's current status.
    fn payment_update(
        &self,
        p: &PaymentAttempt,
        status: PaymentStatus,
        e: &Evidence,
        txn: Option<&str>,
    ) -> TransactWriteItem {
        let (from_cond, from_values) =
            status_in("#status", payment::recordable_from(status).into_iter().map(PaymentStatus::as_str));
        let mut u = Update::builder()
            .table_name(self.table())
            .set_key(Some(key(keys::order(&p.order_id), &keys::payment_sk(&p.payment_id))))
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":s", s(status.as_str()))
            .expression_attribute_values(":ev", evidence_list(e))
            .expression_attribute_values(":empty", Av::L(vec![]));
        for (k, v) in from_values {
            u = u.expression_attribute_values(k, v);
        }
        let mut set = "SET #status = :s, evidence = list_append(if_not_exists(evidence, :empty), :ev)".to_owned();
        let mut cond = format!("attribute_exists(pk) AND {from_cond}");
        if status != PaymentStatus::Succeeded {
            // A conclusion drawn from the attempt as read (e.g. "the channel
            // has no such payment": it had no channel id) holds only if the
            // channel's id is still the one read; a payment entry that
            // recorded it meanwhile has handed the payment to the buyer.
            match &p.channel_ref {
                None => cond.push_str(" AND attribute_not_exists(channel_ref)"),
                Some(r) => {
                    cond.push_str(" AND channel_ref = :cref");
                    u = u.expression_attribute_values(":cref", s(r));
                }
            }
        }
        if let Some(t) = txn {
            // A success names its channel transaction once; a report of the
            // same payment with another transaction id is a mismatch. The
            // same success again (a provider resending with a new
            // notify_id) must not grow the item: it is refused here and
            // read back as a duplicate from the old item.
            set.push_str(", channel_txn_id = :t");
            cond.push_str(
                " AND (attribute_not_exists(channel_txn_id) OR channel_txn_id = :t) \
                 AND NOT (#status = :s AND channel_txn_id = :t)",
            );
            u = u.expression_attribute_values(":t", s(t));
        }
        let u = u
            .update_expression(set)
            .condition_expression(cond)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("complete update");
        TransactWriteItem::builder().update(u).build()
    }
}

impl DynamoStore {
    /// The settle transaction's claim of the channel's transaction id for
    /// this payment: a second payment reporting the same id is refused.
    fn channel_txn_put(&self, payment: &PaymentAttempt, channel_txn_id: &str) -> TransactWriteItem {
        let mut txn = key(channel_txn_key(&payment.channel, channel_txn_id), "CHTXN");
        txn.insert("entity".into(), s("CHANNEL_TXN"));
        txn.insert("payment_id".into(), s(payment.payment_id.as_str()));
        let p = Put::builder()
            .table_name(self.table())
            .set_item(Some(txn))
            .condition_expression("attribute_not_exists(pk) OR payment_id = :p")
            .expression_attribute_values(":p", s(payment.payment_id.as_str()))
            .build()
            .expect("complete put");
        TransactWriteItem::builder().put(p).build()
    }

    /// The settle transaction's move of the order to PAID by `payment`, on
    /// the order's version as read.
    fn mark_paid(&self, order: &Order, payment: &PaymentAttempt, evidence: &Evidence) -> TransactWriteItem {
        let now = evidence.at;
        let cause = format!("payment {} succeeded ({})", payment.payment_id, evidence.source);
        let (from, to) = order::transition(OrderEvent::PaymentSucceeded);
        let (from_cond, from_values) = status_in("#status", from.iter().map(|s| s.as_str()));
        let h = Av::L(vec![Av::M(
            serde_dynamo::to_item(StatusChange { at: now, from: Some(order.status), to, cause }).expect("serialisable"),
        )]);
        let mut u = Update::builder()
            .table_name(self.table())
            .set_key(Some(key(keys::order(&order.order_id), keys::ORDER_SK)))
            .update_expression(format!(
                "SET #status = :paid, paid_by = :p, paid_at = :now, version = version + :one, \
                 history = list_append(history, :h), {FINAL_ENTRIES}",
            ))
            .condition_expression(format!("{from_cond} AND version = :v"))
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":paid", s(to.as_str()))
            .expression_attribute_values(":p", s(payment.payment_id.as_str()))
            .expression_attribute_values(":now", s(now.to_string()))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":h", h)
            .expression_attribute_values(":v", n(order.version));
        for (k, v) in from_values {
            u = u.expression_attribute_values(k, v);
        }
        // PAID moves the order from the open part of the due index
        // to the effects part, until settle has confirmed its stock.
        for (k, v) in self.effects_entry(&order.order_id, now) {
            u = u.expression_attribute_values(k, v);
        }
        TransactWriteItem::builder().update(u.build().expect("complete update")).build()
    }

    /// The settle transaction's check that the order is still as read: a
    /// duplicate or a refund rests on the order being final as read, and
    /// the check makes the transaction fail if it is not any more.
    fn order_unchanged(&self, order: &Order) -> TransactWriteItem {
        let c = ConditionCheck::builder()
            .table_name(self.table())
            .set_key(Some(key(keys::order(&order.order_id), keys::ORDER_SK)))
            .condition_expression("version = :v")
            .expression_attribute_values(":v", n(order.version))
            .build()
            .expect("complete check");
        TransactWriteItem::builder().condition_check(c).build()
    }

    /// The refund of `payment`, which succeeded on an order that is closed
    /// or paid by another payment: a new REFUND_PENDING record.
    fn refund_put(
        &self,
        order: &Order,
        payment: &PaymentAttempt,
        now: Timestamp,
        refund_notice: &str,
    ) -> TransactWriteItem {
        let reason = if order.status == OrderStatus::Closed {
            "payment succeeded after the order closed"
        } else {
            "order already paid by another payment"
        };
        let refund = Refund {
            payment_id: payment.payment_id.clone(),
            order_id: order.order_id.clone(),
            user_id: Some(order.user_id.clone()),
            channel: payment.channel.clone(),
            amount: payment.amount,
            currency: payment.currency.clone(),
            status: RefundStatus::RefundPending,
            reason: reason.into(),
            tries: 0,
            created_at: now,
            refunded_at: None,
            channel_refund_id: None,
            last_error: None,
            notification: refund_notice.into(),
            order_version: order.version,
            updated_at: None,
            resolved_by: None,
            resolved_at: None,
            resolution: None,
        };
        let mut item: Item = serde_dynamo::to_item(&refund).expect("serialisable");
        item.extend(key(keys::order(&order.order_id), &keys::refund_sk(&payment.payment_id)));
        item.insert("entity".into(), s("REFUND"));
        // The backstop entry (see
        // docs/data-model.md#the-due-index-gsi-due-index-open-orders-and-pending-effects):
        // if the stream record or the queue message that should drive this
        // refund is lost, the sweep finds it here.
        item.insert("due_shard".into(), s(keys::effects_shard(&order.order_id, self.shards().count)));
        item.insert("due_at".into(), s(now.plus(REFUND_REDRIVE_AFTER).to_string()));
        put(self.table(), item, Some("attribute_not_exists(pk)"))
    }

    /// An update of `refund`'s record.
    fn refund_update(
        &self,
        refund: &Refund,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.client()
            .update_item()
            .table_name(self.table())
            .set_key(Some(key(keys::order(&refund.order_id), &keys::refund_sk(&refund.payment_id))))
            .expression_attribute_names("#status", "status")
    }
}

/// A string attribute of a scanned row (empty when it has none).
fn row_key(item: &Item, attr: &str) -> String {
    item.get(attr).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default()
}

/// A row the reconciliation scan could not decode, and why.
fn undecodable_row(item: &Item, e: &dyn std::error::Error) -> UndecodableRow {
    UndecodableRow { pk: row_key(item, "pk"), sk: row_key(item, "sk"), error: error_chain(e) }
}

/// A scanned row decoded onto `rows`, or, when it does not decode, listed
/// in `undecodable`.
fn decode_onto<T: serde::de::DeserializeOwned>(item: &Item, rows: &mut Vec<T>, undecodable: &mut Vec<UndecodableRow>) {
    match serde_dynamo::from_item(item.clone()) {
        Ok(row) => rows.push(row),
        Err(e) => undecodable.push(undecodable_row(item, &e)),
    }
}

/// Where the settle transaction's items are: which one failed says what
/// the cancellation means.
struct SettleAt {
    notify: Option<usize>,
    txn: usize,
    payment: usize,
    order: usize,
    refund: Option<usize>,
}

/// What a cancelled settle transaction means, from the items whose
/// condition failed (`failed`, with the old item of each).
fn settle_refusal(failed: &[Option<Item>], at: &SettleAt, channel_txn_id: &str) -> Result<SettleResult, Unavailable> {
    let hit = |i: Option<usize>| i.is_some_and(|i| matches!(failed.get(i), Some(Some(_))));
    // The attempt already holds this very success: whatever the
    // order is, that success was written together with its
    // outcome (PAID or the refund), so nothing is left to do.
    let same_success = failed.get(at.payment).cloned().flatten().is_some_and(|old| {
        let attr = |n: &str| old.get(n).and_then(|v| v.as_s().ok()).cloned();
        attr("status").as_deref() == Some(PaymentStatus::Succeeded.as_str())
            && attr("channel_txn_id").as_deref() == Some(channel_txn_id)
    });
    // Checked before the refund and the order: a resent success
    // on a CLOSED order also finds its refund already there, and
    // must read as the duplicate it is, not as a new late payment.
    Ok(if hit(at.notify) || same_success {
        SettleResult::Duplicate
    } else if hit(at.refund) {
        SettleResult::RefundPending
    } else if hit(Some(at.order)) {
        // Decided on a stale order: the caller re-reads it and
        // decides again.
        SettleResult::OrderMoved
    } else if hit(Some(at.txn)) || hit(Some(at.payment)) {
        SettleResult::TxnIdTaken
    } else {
        return Err(Unavailable::new("settle payment success", "cancelled on an unexpected condition"));
    })
}

#[async_trait]
impl PaymentStore for DynamoStore {
    async fn record_keyed_attempt(
        &self,
        order: &Order,
        attempt: &PaymentAttempt,
        claim: Option<&PaymentClaim>,
    ) -> Result<AttemptResult, Unavailable> {
        let now = attempt.created_at;
        let order_update = Update::builder()
            .table_name(self.table())
            .set_key(Some(key(keys::order(&order.order_id), keys::ORDER_SK)))
            .update_expression("SET payment_attempts = payment_attempts + :one, version = version + :one")
            .condition_expression(
                "#status = :pending AND version = :v AND expire_at > :now AND payment_attempts < :max \
                 AND attribute_not_exists(cancel_requested_at)",
            )
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":max", n(payment::MAX_PAYMENT_ATTEMPTS))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":pending", s("PENDING_PAYMENT"))
            .expression_attribute_values(":v", n(order.version))
            .expression_attribute_values(":now", s(now.to_string()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("complete update");
        let mut pay: Item = serde_dynamo::to_item(attempt).expect("serialisable");
        pay.extend(key(keys::order(&order.order_id), &keys::payment_sk(&attempt.payment_id)));
        pay.insert("entity".into(), s("PAYMENT"));
        let mut pointer = key(format!("PAYMENT#{}", attempt.payment_id), "PAYMENT");
        pointer.insert("entity".into(), s("PAYMENT_POINTER"));
        pointer.insert("order_id".into(), s(order.order_id.as_str()));
        let mut items = vec![
            TransactWriteItem::builder().update(order_update).build(),
            put(self.table(), pay, Some("attribute_not_exists(pk)")),
            put(self.table(), pointer, Some("attribute_not_exists(pk)")),
        ];
        if let Some(c) = claim {
            let mut idem =
                key(keys::idempotency(&order.user_id, &c.key), &keys::payment_idempotency_sk(&order.order_id));
            idem.insert("entity".into(), s("IDEMPOTENCY_KEY"));
            idem.insert("request_hash".into(), s(&c.request_hash));
            idem.insert("payment_id".into(), s(attempt.payment_id.as_str()));
            idem.insert("created_at".into(), s(now.to_string()));
            let p = Put::builder()
                .table_name(self.table())
                .set_item(Some(idem))
                .condition_expression("attribute_not_exists(pk)")
                .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                .build()
                .expect("complete put");
            items.push(TransactWriteItem::builder().put(p).build());
        }
        match self.transact_items(items, "record payment attempt").await? {
            Ok(()) => Ok(AttemptResult::Recorded),
            Err(failed) => {
                // The key first: a replay is answered whatever the order
                // became since.
                if let Some(Some(old)) = failed.get(3) {
                    return Ok(AttemptResult::Replay(claimed_from(old)?));
                }
                // The order's condition failed: the order as it is now came
                // back with the cancellation (ALL_OLD), so no second read is
                // needed.
                match failed.into_iter().next().flatten() {
                    Some(old) if old.contains_key("pk") => Ok(AttemptResult::NotPayable(Box::new(
                        serde_dynamo::from_item(old).map_err(|e| Unavailable::new("decode order", e))?,
                    ))),
                    _ => Ok(AttemptResult::NotFound),
                }
            }
        }
    }

    async fn claimed_payment(
        &self,
        order: &Order,
        key: &IdempotencyKey,
    ) -> Result<Option<ClaimedPayment>, Unavailable> {
        self.get_item(keys::idempotency(&order.user_id, key), &keys::payment_idempotency_sk(&order.order_id))
            .await?
            .map(|item| claimed_from(&item))
            .transpose()
    }

    async fn attempt(&self, payment_id: &PaymentId) -> Result<Option<PaymentAttempt>, Unavailable> {
        let Some(pointer) = self.get_item(format!("PAYMENT#{payment_id}"), "PAYMENT").await? else {
            return Ok(None);
        };
        let Some(order_id) =
            pointer.get("order_id").and_then(|v| v.as_s().ok()).and_then(|o| OrderId::parse(o.clone()).ok())
        else {
            return Err(Unavailable::new("payment pointer", "pointer without order_id"));
        };
        self.get_record(keys::order(&order_id), &keys::payment_sk(payment_id), "payment").await
    }

    async fn settle_success(
        &self,
        order: &Order,
        payment: &PaymentAttempt,
        channel_txn_id: &str,
        evidence: Evidence,
        notification: Option<&Notification>,
        refund_notice: &str,
    ) -> Result<SettleResult, Unavailable> {
        let now = evidence.at;
        let mut items = Vec::new();
        let notify_at = notification.map(|n| {
            items.push(self.notify_put(n, &payment.payment_id, now));
            items.len() - 1
        });
        let txn_at = items.len();
        items.push(self.channel_txn_put(payment, channel_txn_id));
        let payment_at = items.len();
        items.push(self.payment_update(payment, PaymentStatus::Succeeded, &evidence, Some(channel_txn_id)));
        let paid_by_same = order.paid_by.as_ref() == Some(&payment.payment_id);
        let outcome = on_payment_success(order.status, paid_by_same);
        let order_at = items.len();
        let mut refund_at = None;
        match outcome {
            PaymentSuccessOutcome::MarkPaid => items.push(self.mark_paid(order, payment, &evidence)),
            PaymentSuccessOutcome::Duplicate | PaymentSuccessOutcome::Refund => {
                items.push(self.order_unchanged(order));
                if outcome == PaymentSuccessOutcome::Refund {
                    refund_at = Some(items.len());
                    items.push(self.refund_put(order, payment, now, refund_notice));
                }
            }
        }
        match self.transact_items(items, "settle payment success").await? {
            Ok(()) => Ok(match outcome {
                PaymentSuccessOutcome::MarkPaid => SettleResult::Paid,
                PaymentSuccessOutcome::Duplicate => SettleResult::Duplicate,
                PaymentSuccessOutcome::Refund => SettleResult::RefundPending,
            }),
            Err(failed) => {
                let at = SettleAt {
                    notify: notify_at,
                    txn: txn_at,
                    payment: payment_at,
                    order: order_at,
                    refund: refund_at,
                };
                settle_refusal(&failed, &at, channel_txn_id)
            }
        }
    }

    async fn record_channel_ref(&self, attempt: &PaymentAttempt, channel_ref: &str) -> Result<Cas, Unavailable> {
        let res = self
            .client()
            .update_item()
            .table_name(self.table())
            .set_key(Some(key(keys::order(&attempt.order_id), &keys::payment_sk(&attempt.payment_id))))
            .update_expression("SET channel_ref = :r")
            .condition_expression(
                "attribute_exists(pk) AND #status = :processing AND (attribute_not_exists(channel_ref) OR channel_ref = :r)",
            )
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":processing", s(PaymentStatus::Processing.as_str()))
            .expression_attribute_values(":r", s(channel_ref))
            .send()
            .await;
        match res {
            Ok(_) => Ok(Cas::Applied),
            Err(e) if super::dynamo::is_condition_failure(&e) => Ok(Cas::Rejected),
            Err(e) => Err(Unavailable::new("record channel ref", e)),
        }
    }

    async fn record_payment_fact(
        &self,
        payment: &PaymentAttempt,
        status: PaymentStatus,
        evidence: Evidence,
        notification: Option<&Notification>,
    ) -> Result<bool, Unavailable> {
        let mut items = Vec::new();
        if let Some(n) = notification {
            items.push(self.notify_put(n, &payment.payment_id, evidence.at));
        }
        items.push(self.payment_update(payment, status, &evidence, None));
        Ok(self.transact_items(items, "record payment fact").await?.is_ok())
    }

    async fn refund(&self, order_id: &OrderId, payment_id: &PaymentId) -> Result<Option<Refund>, Unavailable> {
        self.get_record(keys::order(order_id), &keys::refund_sk(payment_id), "refund").await
    }

    async fn update_refund(
        &self,
        refund: &Refund,
        to: RefundStatus,
        channel_refund_id: Option<&str>,
        error: Option<&str>,
        now: Timestamp,
    ) -> Result<Cas, Unavailable> {
        let mut u = self
            .refund_update(refund)
            .expression_attribute_values(":from", s(refund.status.as_str()))
            .expression_attribute_values(":now", s(now.to_string()));
        // Compare-and-swap on the state the caller read. A counted try also
        // compares the count it read, so that two deliveries of the same
        // refund cannot both count one try (nor both record a give-up).
        if error.is_some() {
            u = u
                .condition_expression("#status = :from AND tries = :tries")
                .expression_attribute_values(":tries", n(refund.tries));
        } else {
            u = u.condition_expression("#status = :from");
        }
        let mut set = vec!["updated_at = :now"];
        if to != refund.status {
            set.push("#status = :to");
            u = u.expression_attribute_values(":to", s(to.as_str()));
        }
        if to == RefundStatus::Refunded {
            set.push("refunded_at = :now");
        }
        if let Some(id) = channel_refund_id {
            set.push("channel_refund_id = :rid");
            u = u.expression_attribute_values(":rid", s(id));
        }
        if let Some(e) = error {
            set.push("tries = tries + :one, last_error = :err");
            u = u.expression_attribute_values(":one", n(1)).expression_attribute_values(":err", s(e));
        }
        // Out of REFUND_PENDING the refund leaves the effects shards in the
        // same write: nothing is left for the backstop to re-drive. A
        // give-up moves it to the failed refunds' partition instead, where
        // it stays (and its alarm with it) until it is REFUNDED or a person
        // resolves it.
        // A refund that ends (REFUNDED or REFUND_FAILED) is listed under the
        // day it ended in the reconcile index, in the same write; a later
        // REFUNDED after a give-up lists it again under its own day.
        if to != RefundStatus::RefundPending && to != refund.status {
            set.extend(["recon_part = :recon_part", "recon_at = :now"]);
            u = u.expression_attribute_values(":recon_part", s(keys::day_part(&refund.order_id, now)));
        }
        let remove = match to {
            RefundStatus::RefundPending => "",
            RefundStatus::RefundFailed => {
                set.extend(["due_shard = :failed_shard", "due_at = :now"]);
                u = u.expression_attribute_values(":failed_shard", s(keys::FAILED_REFUNDS_SHARD));
                ""
            }
            _ => " REMOVE due_shard, due_at",
        };
        u = u.update_expression(format!("SET {}{remove}", set.join(", ")));
        self.cas(u, "update refund").await
    }

    async fn failed_refunds(&self) -> Result<Vec<(OrderId, PaymentId)>, Unavailable> {
        let query = self
            .client()
            .query()
            .table_name(self.table())
            .index_name(super::due_index::DUE_INDEX)
            .key_condition_expression("due_shard = :failed")
            .expression_attribute_values(":failed", s(keys::FAILED_REFUNDS_SHARD));
        let mut out = Vec::new();
        each_queried(query, "read failed refunds", |item| {
            let field = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
            let (pk, sk) = (field("pk"), field("sk"));
            let ids = pk.strip_prefix("ORDER#").zip(sk.strip_prefix("REFUND#"));
            match ids.map(|(o, p)| (OrderId::parse(o), PaymentId::parse(p))) {
                Some((Ok(o), Ok(p))) => out.push((o, p)),
                _ => tracing::warn!(pk, sk, "an entry in the failed refunds' partition that is not a refund"),
            }
            Ok(())
        })
        .await?;
        Ok(out)
    }

    async fn resolve_failed_refund(
        &self,
        refund: &Refund,
        by: &str,
        note: &str,
        now: Timestamp,
    ) -> Result<Cas, Unavailable> {
        let req = self
            .refund_update(refund)
            .update_expression("SET resolved_by = :by, resolved_at = :now, resolution = :note REMOVE due_shard, due_at")
            // Not on the failed refunds' partition: a refund given up on
            // before it existed is resolved the same way.
            .condition_expression("#status = :failed AND attribute_not_exists(resolved_at)")
            .expression_attribute_values(":failed", s(RefundStatus::RefundFailed.as_str()))
            .expression_attribute_values(":by", s(by))
            .expression_attribute_values(":note", s(note))
            .expression_attribute_values(":now", s(now.to_string()));
        self.cas(req, "resolve failed refund").await
    }

    async fn redrive_refund(&self, refund: &Refund, now: Timestamp) -> Result<Cas, Unavailable> {
        let req = self
            .refund_update(refund)
            // A refund created before the backstop existed has no shard yet;
            // re-driving it puts it under the sweep from now on.
            .update_expression("SET due_at = :due, due_shard = if_not_exists(due_shard, :shard)")
            // Still due, not only still pending: a second delivery of the
            // same re-drive (a duplicate effects message, two overlapping
            // sweeps) finds the due time already pushed and changes nothing,
            // rather than pushing it again and queueing the refund twice.
            .condition_expression("#status = :pending AND (attribute_not_exists(due_at) OR due_at <= :now)")
            .expression_attribute_values(":pending", s(RefundStatus::RefundPending.as_str()))
            .expression_attribute_values(":now", s(now.to_string()))
            .expression_attribute_values(":due", s(now.plus(REFUND_REDRIVE_AFTER).to_string()))
            .expression_attribute_values(":shard", s(keys::effects_shard(&refund.order_id, self.shards().count)));
        self.cas(req, "redrive refund").await
    }

    async fn undo_refund_redrive(&self, refund: &Refund, pushed_at: Timestamp) -> Result<Cas, Unavailable> {
        let req = self
            .refund_update(refund)
            .update_expression("SET due_at = :before")
            // Only the budget that push set: a later re-drive's, or a refund
            // that left REFUND_PENDING (and the effects shard), stays as is.
            .condition_expression("#status = :pending AND due_at = :pushed")
            .expression_attribute_values(":pending", s(RefundStatus::RefundPending.as_str()))
            .expression_attribute_values(":pushed", s(pushed_at.plus(REFUND_REDRIVE_AFTER).to_string()))
            .expression_attribute_values(":before", s(pushed_at.to_string()));
        self.cas(req, "undo refund redrive").await
    }

    async fn scan_order_records(&self) -> Result<Vec<OrderRecord>, Unavailable> {
        let mut by_order: std::collections::BTreeMap<String, Vec<Item>> = Default::default();
        let scan = self
            .client()
            .scan()
            .table_name(self.table())
            .filter_expression("begins_with(pk, :p)")
            .expression_attribute_values(":p", s("ORDER#"))
            .consistent_read(true);
        each_scanned(scan, "scan orders", |item| {
            let pk = item.get("pk").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
            by_order.entry(pk).or_default().push(item);
            Ok(())
        })
        .await?;
        by_order.into_values().filter_map(|items| DynamoStore::assemble(items).transpose()).collect()
    }

    async fn scan_snapshot(&self) -> Result<TableSnapshot, Unavailable> {
        let mut by_order: std::collections::BTreeMap<String, Vec<Item>> = Default::default();
        let mut snapshot = TableSnapshot::default();
        let scan = self
            .client()
            .scan()
            .table_name(self.table())
            .filter_expression(
                "begins_with(pk, :o) OR (begins_with(pk, :sku) AND (sk = :stock OR begins_with(sk, :change))) \
                 OR (begins_with(pk, :buyer) AND (sk = :points OR begins_with(sk, :credit)))",
            )
            .expression_attribute_values(":buyer", s("BUYER#"))
            .expression_attribute_values(":points", s(keys::POINTS_SK))
            .expression_attribute_values(":credit", s(keys::POINTS_CHANGE_PREFIX))
            .expression_attribute_values(":o", s("ORDER#"))
            .expression_attribute_values(":sku", s("SKU#"))
            .expression_attribute_values(":stock", s(keys::STOCK_SK))
            .expression_attribute_values(":change", s(keys::STOCK_CHANGE_PREFIX))
            .consistent_read(true);
        each_scanned(scan, "scan for reconciliation", |item| {
            let pk = row_key(&item, "pk");
            let bad = &mut snapshot.undecodable;
            if pk.starts_with("BUYER#") {
                if row_key(&item, "sk") == keys::POINTS_SK {
                    decode_onto(&item, &mut snapshot.points, bad);
                } else {
                    decode_onto(&item, &mut snapshot.points_credits, bad);
                }
            } else if pk.starts_with("SKU#") && row_key(&item, "sk").starts_with(keys::STOCK_CHANGE_PREFIX) {
                decode_onto(&item, &mut snapshot.stock_changes, bad);
            } else if pk.starts_with("SKU#") {
                decode_onto(&item, &mut snapshot.stocks, bad);
            } else {
                by_order.entry(pk).or_default().push(item);
            }
            Ok(())
        })
        .await?;
        for items in by_order.into_values() {
            let (record, bad) = DynamoStore::assemble_tolerant(items);
            snapshot.orders.extend(record);
            snapshot.undecodable.extend(bad.iter().map(|(item, e)| undecodable_row(item, e)));
        }
        self.settle_stock_reads(&mut snapshot).await?;
        Ok(snapshot)
    }
}
