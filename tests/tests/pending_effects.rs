//! The effects backstop's consumer (issue 17): a pending effect the sweep
//! handed to the effects queue is driven through the same idempotent use
//! cases as the normal path, and a duplicate message changes nothing.
//! First on an in-memory store (no Java: the use case's own decisions,
//! with the store's conditions as the fake keeps them), then on DynamoDB
//! Local (the real conditions and transactions).

use async_trait::async_trait;
use order_core::aws::dynamo::{keys, DynamoStore};
use order_core::domain::reservation::{self, ReservationEvent};
use order_core::domain::*;
use order_core::handlers::effects::pending_effects_batch;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::close_order::{CloseOrder, CloseOutcome};
use order_core::usecases::pending_effects::{drive_pending_effect, EffectDriven, EffectPorts};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use system_tests::fakes::*;
use system_tests::fixtures::{self, eur};
use system_tests::CreateAsNamed;
use system_tests::{dynamodb_local, fresh_table};

const T0: i64 = 1_800_000_000_000;

/// The refund worker's queue, counted.
#[derive(Clone, Default)]
struct RequestedRefunds(Arc<Mutex<Vec<(OrderId, PaymentId)>>>);

#[async_trait]
impl RefundRequests for RequestedRefunds {
    async fn request_refund(&self, o: &OrderId, p: &PaymentId) -> Result<(), Unavailable> {
        self.0.lock().unwrap().push((o.clone(), p.clone()));
        Ok(())
    }
}

impl RequestedRefunds {
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

// ------------------------------------------------------------- in memory

/// What the in-memory store holds: one order's record, its SKU's stock,
/// whether it is in the effects shard, and refunds with their due time.
#[derive(Debug, Clone, PartialEq)]
struct Tables {
    record: OrderRecord,
    available: i64,
    reserved: i64,
    in_effects_shard: bool,
    refunds: HashMap<PaymentId, (Refund, Timestamp)>,
}

/// The store as the effects path uses it, each write conditional on the
/// state it reads in the same critical section (the table's conditions);
/// the paths the effects consumer never takes are unreachable.
#[derive(Clone)]
struct MemoryStore(Arc<Mutex<Tables>>);

impl MemoryStore {
    fn snapshot(&self) -> Tables {
        self.0.lock().unwrap().clone()
    }
}

#[async_trait]
impl OrderStore for MemoryStore {
    async fn order(&self, id: &OrderId) -> Result<Option<Order>, Unavailable> {
        let t = self.0.lock().unwrap();
        Ok((t.record.order.order_id == *id).then(|| t.record.order.clone()))
    }
    async fn order_record(&self, id: &OrderId) -> Result<Option<OrderRecord>, Unavailable> {
        let t = self.0.lock().unwrap();
        Ok((t.record.order.order_id == *id).then(|| t.record.clone()))
    }
    async fn release_reservation(
        &self,
        _: &OrderId,
        r: &Reservation,
        _: Timestamp,
    ) -> Result<Moved<ReservationStatus>, Unavailable> {
        let mut t = self.0.lock().unwrap();
        let slot =
            t.record.reservations.iter_mut().find(|x| x.sort_key() == r.sort_key()).expect("the order's reservation");
        let step = reservation::apply(slot.status, ReservationEvent::Release);
        if let Ok(Step::Moved(to)) = &step {
            slot.status = *to;
            t.available += i64::from(r.qty);
            t.reserved -= i64::from(r.qty);
        }
        Ok(step)
    }
    async fn effects_done(&self, _: &OrderId, status: OrderStatus) -> Result<Cas, Unavailable> {
        let mut t = self.0.lock().unwrap();
        if t.record.order.status != status || !t.in_effects_shard {
            return Ok(Cas::Rejected);
        }
        t.in_effects_shard = false;
        Ok(Cas::Applied)
    }
    async fn coupon(&self, _: &CouponId) -> Result<Option<Coupon>, Unavailable> {
        Ok(None)
    }
    async fn create_order(&self, _: &Order, _: &Caps, _: &IdempotencyClaim) -> Result<CreateResult, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn claimed_order(&self, _: &UserId, _: &IdempotencyKey) -> Result<Option<ClaimedOrder>, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn close_unpaid(&self, _: &Order, _: Timestamp) -> Result<Cas, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn begin_closing(&self, _: &Order, _: &ClosingLease, _: Timestamp) -> Result<Cas, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn hold_closing(&self, _: &Order, _: Timestamp) -> Result<Cas, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn request_cancel(&self, _: &Order, _: Timestamp) -> Result<Cas, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn note_lazy_reminder(&self, _: &Order, _: Timestamp, _: Duration) -> Result<Cas, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn note_early_reminder(&self, _: &Order, _: Timestamp, _: Timestamp) -> Result<Cas, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn record_check(&self, _: &OrderId, _: &OperatorCheck) -> Result<Cas, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn close_after_check(&self, _: &Order, _: Timestamp, _: &str) -> Result<Cas, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn confirm_reservation(
        &self,
        _: &OrderId,
        _: &Reservation,
        _: Timestamp,
    ) -> Result<Moved<ReservationStatus>, Unavailable> {
        unreachable!("the order here is CLOSED: never confirmed")
    }
    async fn end_coupon_lock(
        &self,
        _: &OrderId,
        _: &CouponId,
        _: CouponLockStatus,
        _: &str,
        _: Timestamp,
    ) -> Result<Moved<CouponLockStatus>, Unavailable> {
        unreachable!("the order here has no coupon")
    }
    async fn stock(&self, _: &Sku) -> Result<Option<Stock>, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn stocks(&self, _: &[Sku]) -> Result<Vec<Stock>, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn put_coupon(&self, _: &Coupon) -> Result<PutCoupon, Unavailable> {
        unreachable!("not on the effects path")
    }
}

#[async_trait]
impl PaymentStore for MemoryStore {
    async fn refund(&self, _: &OrderId, p: &PaymentId) -> Result<Option<Refund>, Unavailable> {
        Ok(self.0.lock().unwrap().refunds.get(p).map(|(r, _)| r.clone()))
    }
    async fn redrive_refund(&self, refund: &Refund, now: Timestamp) -> Result<Cas, Unavailable> {
        let mut t = self.0.lock().unwrap();
        let Some((r, due)) = t.refunds.get_mut(&refund.payment_id) else { return Ok(Cas::Rejected) };
        // The table's condition: still pending and still due.
        if r.status != RefundStatus::RefundPending || *due > now {
            return Ok(Cas::Rejected);
        }
        *due = now.plus(order_core::usecases::refunds::REFUND_REDRIVE_AFTER);
        Ok(Cas::Applied)
    }
    async fn undo_refund_redrive(&self, refund: &Refund, pushed_at: Timestamp) -> Result<Cas, Unavailable> {
        let mut t = self.0.lock().unwrap();
        let Some((r, due)) = t.refunds.get_mut(&refund.payment_id) else { return Ok(Cas::Rejected) };
        // The table's condition: still pending, and the budget that push set.
        if r.status != RefundStatus::RefundPending
            || *due != pushed_at.plus(order_core::usecases::refunds::REFUND_REDRIVE_AFTER)
        {
            return Ok(Cas::Rejected);
        }
        *due = pushed_at;
        Ok(Cas::Applied)
    }
    async fn record_keyed_attempt(
        &self,
        _: &Order,
        _: &PaymentAttempt,
        _: Option<&PaymentClaim>,
    ) -> Result<AttemptResult, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn claimed_payment(&self, _: &Order, _: &IdempotencyKey) -> Result<Option<ClaimedPayment>, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn attempt(&self, _: &PaymentId) -> Result<Option<PaymentAttempt>, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn record_channel_ref(&self, _: &PaymentAttempt, _: &str) -> Result<Cas, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn settle_success(
        &self,
        _: &Order,
        _: &PaymentAttempt,
        _: &str,
        _: Evidence,
        _: Option<&Notification>,
        _: &str,
    ) -> Result<SettleResult, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn record_payment_fact(
        &self,
        _: &PaymentAttempt,
        _: PaymentStatus,
        _: Evidence,
        _: Option<&Notification>,
    ) -> Result<bool, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn update_refund(
        &self,
        _: &Refund,
        _: RefundStatus,
        _: Option<&str>,
        _: Option<&str>,
        _: Timestamp,
    ) -> Result<Cas, Unavailable> {
        unreachable!("the consumer hands refunds on; the refund worker tries them")
    }
    async fn failed_refunds(&self) -> Result<Vec<(OrderId, PaymentId)>, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn resolve_failed_refund(&self, _: &Refund, _: &str, _: &str, _: Timestamp) -> Result<Cas, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn scan_order_records(&self) -> Result<Vec<OrderRecord>, Unavailable> {
        unreachable!("not on the effects path")
    }
    async fn scan_snapshot(&self) -> Result<TableSnapshot, Unavailable> {
        unreachable!("not on the effects path")
    }
}

/// A CLOSED order holding 3 of SKU A (stock 10 available, 3 reserved), in
/// the effects shard, with a late payment's refund pending and due.
fn closed_order_with_a_pending_refund() -> (MemoryStore, OrderId, PaymentId) {
    let at = Timestamp::from_unix_millis(T0);
    let order: Order = serde_json::from_value(json!({
        "order_id": "ord_mem1", "user_id": "u1", "status": "CLOSED", "version": 2, "currency": "EUR",
        "items": [{"sku": "A", "qty": 3, "unit_price": 100}], "amount_total": 300,
        "created_at": at.to_string(), "expire_at": at.to_string(), "expiry_rule_version": "w60",
    }))
    .unwrap();
    let refund: Refund = serde_json::from_value(json!({
        "payment_id": "pay_mem1", "order_id": "ord_mem1", "channel": "sandbox", "amount": 300,
        "currency": "EUR", "status": "REFUND_PENDING", "reason": "late payment", "created_at": at.to_string(),
        "notification": "refunded",
    }))
    .unwrap();
    let (order_id, payment_id) = (order.order_id.clone(), refund.payment_id.clone());
    let record = OrderRecord {
        order,
        reservations: vec![Reservation::stock(&Sku::parse("A").unwrap(), 3)],
        coupon_lock: None,
        payments: vec![],
        refunds: vec![],
    };
    let tables = Tables {
        record,
        available: 10,
        reserved: 3,
        in_effects_shard: true,
        refunds: HashMap::from([(payment_id.clone(), (refund, at))]),
    };
    (MemoryStore(Arc::new(Mutex::new(tables))), order_id, payment_id)
}

#[tokio::test]
async fn a_duplicate_order_effects_message_returns_the_stock_once_and_changes_nothing() {
    let (store, order_id, _) = closed_order_with_a_pending_refund();
    let (refunds, clock) = (RequestedRefunds::default(), FixedClock::at(T0 + 60_000));
    let (wakeups, channel) = (RecordedWakeUps::default(), ScriptedChannel::default());
    let ports = EffectPorts { store: &store, wakeups: &wakeups, channel: &channel, refunds: &refunds, clock: &clock };
    let effect = PendingEffect::Order(order_id);

    let first = drive_pending_effect(&ports, &effect, None).await.unwrap();
    assert!(matches!(&first, EffectDriven::Resources(r) if r.moved == 1 && r.already == 0), "{first:?}");
    let after_first = store.snapshot();
    assert_eq!((after_first.available, after_first.reserved), (13, 0), "the 3 units back in stock");
    assert!(!after_first.in_effects_shard, "effects done: out of the index");

    let second = drive_pending_effect(&ports, &effect, None).await.unwrap();
    assert!(matches!(&second, EffectDriven::Resources(r) if r.moved == 0 && r.already == 1), "{second:?}");
    assert_eq!(store.snapshot(), after_first, "the duplicate changed nothing");
    assert!(wakeups.0.lock().unwrap().is_empty() && refunds.count() == 0);
}

#[tokio::test]
async fn a_duplicate_refund_redrive_message_queues_the_refund_once() {
    let (store, order_id, payment_id) = closed_order_with_a_pending_refund();
    let (refunds, clock) = (RequestedRefunds::default(), FixedClock::at(T0 + 60_000));
    let (wakeups, channel) = (RecordedWakeUps::default(), ScriptedChannel::default());
    let ports = EffectPorts { store: &store, wakeups: &wakeups, channel: &channel, refunds: &refunds, clock: &clock };
    let effect = PendingEffect::Refund(order_id, payment_id);

    assert_eq!(drive_pending_effect(&ports, &effect, None).await.unwrap(), EffectDriven::RefundRequested);
    let after_first = store.snapshot();
    assert_eq!(drive_pending_effect(&ports, &effect, None).await.unwrap(), EffectDriven::RefundNotDue);
    assert_eq!(refunds.count(), 1, "one refund request for two deliveries");
    assert_eq!(store.snapshot(), after_first, "the duplicate changed nothing");
}

/// The refund worker's queue refusing the first request, counting the rest.
#[derive(Clone, Default)]
struct RefundQueueDownOnce(Arc<Mutex<(bool, usize)>>);

#[async_trait]
impl RefundRequests for RefundQueueDownOnce {
    async fn request_refund(&self, _: &OrderId, _: &PaymentId) -> Result<(), Unavailable> {
        let mut s = self.0.lock().unwrap();
        if !s.0 {
            s.0 = true;
            return Err(Unavailable::new("send refund", "queue unavailable"));
        }
        s.1 += 1;
        Ok(())
    }
}

impl RefundQueueDownOnce {
    fn sent(&self) -> usize {
        self.0.lock().unwrap().1
    }
}

/// The re-drive pushes the refund's budget, then the send to RefundQueue
/// fails, so the message fails and comes back after the queue's
/// visibility timeout. It used to find the refund "not due" (the budget
/// pushed) and be acknowledged: nothing queued until the pushed budget
/// (15 min) had passed and the sweep handed the refund on again.
#[tokio::test]
async fn a_refund_redrive_whose_send_failed_is_requested_on_the_redelivery() {
    let (store, order_id, payment_id) = closed_order_with_a_pending_refund();
    let (refunds, clock) = (RefundQueueDownOnce::default(), FixedClock::at(T0 + 60_000));
    let (wakeups, channel) = (RecordedWakeUps::default(), ScriptedChannel::default());
    let ports = EffectPorts { store: &store, wakeups: &wakeups, channel: &channel, refunds: &refunds, clock: &clock };
    let effect = PendingEffect::Refund(order_id, payment_id);
    assert!(drive_pending_effect(&ports, &effect, None).await.is_err(), "the send failed: the message fails");
    clock.set(T0 + 60_000 + 180_000); // the queue's visibility timeout later
    let again = drive_pending_effect(&ports, &effect, None).await.unwrap();
    assert_eq!(again, EffectDriven::RefundRequested, "the redelivery requests the refund");
    assert_eq!(refunds.sent(), 1);
    assert_eq!(drive_pending_effect(&ports, &effect, None).await.unwrap(), EffectDriven::RefundNotDue, "once");
}

// ------------------------------------------------------------- DynamoDB Local

/// An order created at T0 with 3 of SKU A (stock 1,000), closed unpaid at
/// its expiry: CLOSED, its reservation still RESERVED, in the effects shard.
async fn closed_order(store: &DynamoStore, clock: &FixedClock) -> OrderId {
    system_tests::fixtures::seed_stock(store, &Sku::parse("A").unwrap(), 1_000, &eur(100)).await.unwrap();
    let creator = fixtures::creator(store, clock, Duration::from_secs(60), "w60");
    let body = json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "A", "qty": 3, "unit_price": 100}]});
    let order = creator.execute_as_named(Some("k-effects"), body.to_string().as_bytes()).await.unwrap().order;
    clock.set(T0 + 61_000);
    let closer = CloseOrder {
        not_found_grace: Duration::from_secs(30),
        ..fixtures::closer(store, ScriptedChannel::default(), RecordedReminders::default(), clock)
    };
    assert_eq!(closer.close(&order.order_id, "test").await.unwrap(), CloseOutcome::Closed);
    order.order_id
}

/// `bodies` as one SQS batch (messages m0, m1, …) of the effects queue.
fn batch(bodies: &[String]) -> aws_lambda_events::event::sqs::SqsEvent {
    let records: Vec<_> = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| json!({"messageId": format!("m{i}"), "body": b, "eventSource": "aws:sqs"}))
        .collect();
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

async fn stock_of_a(store: &DynamoStore) -> (i64, i64) {
    let s = store.stock(&Sku::parse("A").unwrap()).await.unwrap().unwrap();
    (s.available, s.reserved)
}

async fn in_effects_shard(store: &DynamoStore, id: &OrderId) -> bool {
    let item = fixtures::raw_item(store, keys::order(id), keys::ORDER_SK).await.unwrap();
    item.contains_key("due_shard")
}

#[tokio::test]
async fn a_batch_holding_the_same_order_effects_message_twice_releases_the_stock_once_on_the_table() {
    let store = fresh_table(&dynamodb_local().await).await;
    let clock = FixedClock::at(T0);
    let order_id = closed_order(&store, &clock).await;
    assert_eq!(stock_of_a(&store).await, (997, 3));
    assert!(in_effects_shard(&store, &order_id).await, "closed with its release pending");

    let (refunds, wakeups, channel) =
        (RequestedRefunds::default(), RecordedWakeUps::default(), ScriptedChannel::default());
    let ports = EffectPorts { store: &store, wakeups: &wakeups, channel: &channel, refunds: &refunds, clock: &clock };
    let body = json!({"kind": "order_effects", "order_id": order_id}).to_string();
    let reports = Mutex::new(Vec::new());
    let response =
        pending_effects_batch(batch(&[body.clone(), body]), Instant::now() + Duration::from_secs(20), |e, until| {
            let (ports, reports) = (&ports, &reports);
            async move {
                let out = drive_pending_effect(ports, &e, Some(until)).await;
                reports.lock().unwrap().push(format!("{out:?}"));
                out
            }
        })
        .await;
    assert!(response.batch_item_failures.is_empty(), "both deliveries succeed: {:?}", reports.lock().unwrap());
    assert_eq!(stock_of_a(&store).await, (1_000, 0), "the 3 units back once, not twice");
    assert!(!in_effects_shard(&store, &order_id).await, "effects done: out of the index");
    let record = store.order_record(&order_id).await.unwrap().unwrap();
    assert!(record.reservations.iter().all(|r| r.status == ReservationStatus::Released));
    let reports = reports.into_inner().unwrap();
    assert!(reports[1].contains("moved: 0") && reports[1].contains("already: 1"), "{reports:?}");
}

/// A late payment's refund on the table, REFUND_PENDING and past its retry
/// budget by 30 s at `clock`.
async fn late_refund_past_its_budget(store: &DynamoStore, clock: &FixedClock) -> Refund {
    use order_core::usecases::refunds::REFUND_REDRIVE_AFTER;
    system_tests::fixtures::seed_stock(store, &Sku::parse("A").unwrap(), 10, &eur(100)).await.unwrap();
    let creator = fixtures::creator(store, clock, Duration::from_secs(60), "w60");
    let body = json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "A", "qty": 1, "unit_price": 100}]});
    let order = creator.execute_as_named(Some("k-refund"), body.to_string().as_bytes()).await.unwrap().order;
    let attempt = system_tests::fixtures::processing_attempt(&order, clock.now());
    assert_eq!(store.record_attempt(&order, &attempt).await.unwrap(), AttemptResult::Recorded);
    // Closed as "never charged", then the payment succeeds: a late success,
    // recorded with its refund.
    let order = store.order(&order.order_id).await.unwrap().unwrap();
    let closed = fixtures::close_at_expiry(store, &order).await;
    let evidence = Evidence { at: clock.now(), source: "late".into(), status: PaymentStatus::Succeeded, detail: None };
    let settled = store.settle_success(&closed, &attempt, "txn-late", evidence, None, "refunded").await.unwrap();
    assert_eq!(settled, SettleResult::RefundPending);
    let refund = store.refund(&order.order_id, &attempt.payment_id).await.unwrap().unwrap();
    clock.set(refund.created_at.plus(REFUND_REDRIVE_AFTER).plus(Duration::from_secs(30)).unix_millis());
    refund
}

#[tokio::test]
async fn a_duplicate_refund_redrive_on_the_table_pushes_the_budget_once_and_queues_the_refund_once() {
    let store = fresh_table(&dynamodb_local().await).await;
    let clock = FixedClock::at(T0);
    // Past its retry budget: the sweep hands it on, twice (two runs, or a
    // redelivery), and both messages are delivered.
    let refund = late_refund_past_its_budget(&store, &clock).await;
    let (order_id, payment_id) = (refund.order_id.clone(), refund.payment_id.clone());
    let (refunds, wakeups, channel) =
        (RequestedRefunds::default(), RecordedWakeUps::default(), ScriptedChannel::default());
    let ports = EffectPorts { store: &store, wakeups: &wakeups, channel: &channel, refunds: &refunds, clock: &clock };
    let effect = PendingEffect::Refund(order_id, payment_id);
    assert_eq!(drive_pending_effect(&ports, &effect, None).await.unwrap(), EffectDriven::RefundRequested);
    assert_eq!(drive_pending_effect(&ports, &effect, None).await.unwrap(), EffectDriven::RefundNotDue);
    assert_eq!(refunds.count(), 1, "one refund request for two deliveries");
    // The store's own condition says why: the budget was pushed once.
    assert_eq!(store.redrive_refund(&refund, clock.now()).await.unwrap(), Cas::Rejected, "not due any more");
}

#[tokio::test]
async fn a_refund_redrive_whose_send_failed_is_requested_on_the_redelivery_on_the_table() {
    let store = fresh_table(&dynamodb_local().await).await;
    let clock = FixedClock::at(T0);
    let refund = late_refund_past_its_budget(&store, &clock).await;
    let (refunds, wakeups, channel) =
        (RefundQueueDownOnce::default(), RecordedWakeUps::default(), ScriptedChannel::default());
    let ports = EffectPorts { store: &store, wakeups: &wakeups, channel: &channel, refunds: &refunds, clock: &clock };
    let effect = PendingEffect::Refund(refund.order_id.clone(), refund.payment_id.clone());
    assert!(drive_pending_effect(&ports, &effect, None).await.is_err(), "the send failed: the message fails");
    // The budget is due again (the push undone by its own condition), so
    // the redelivery, a visibility timeout later, sends the refund.
    clock.set(clock.now().unix_millis() + 180_000);
    assert_eq!(drive_pending_effect(&ports, &effect, None).await.unwrap(), EffectDriven::RefundRequested);
    assert_eq!(refunds.sent(), 1);
    assert_eq!(drive_pending_effect(&ports, &effect, None).await.unwrap(), EffectDriven::RefundNotDue, "once");
    // An undo of a push that is not the current one changes nothing.
    assert_eq!(store.undo_refund_redrive(&refund, Timestamp::from_unix_millis(T0)).await.unwrap(), Cas::Rejected);
}
