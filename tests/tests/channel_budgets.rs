//! The order API and settle-order inside their invocation's time while the
//! payment channel is in a brownout (every call takes a minute): payment
//! entry's supersede and open, the operator's force-check, and settle's
//! closing of a PAID order's other payments are cut off at the deadline
//! derived from the invocation's own (the Lambda context's, less a margin).
//! What was not asked stays unknown — held, never taken as unpaid — and the
//! caller gets an honest answer: 503 with `Retry-After`, a check that says
//! `reminded_later`, a settle message handed back. The close batch's own
//! budget is `close_batch_budget.rs`. DynamoDB Local, the channel faked.

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::*;
use order_core::handlers::batch::each_sqs_message_within;
use order_core::handlers::effects::settle_message_until;
use order_core::handlers::requests::{force_check_until, start_payment};
use order_core::http::error_response;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::close_order::CloseOrder;
use order_core::usecases::payments::StartPayment;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use system_tests::fakes::{FixedChannel, RecordedReminders, RecordedWakeUps};
use system_tests::fixtures::{self, one_line, sqs_batch, T0};
const SANDBOX: &[u8] = br#"{"channel":"sandbox"}"#;
/// What the tests allow a cut-off call beyond its deadline (the store's
/// writes after it, a loaded machine).
const SLACK: Duration = Duration::from_secs(8);

/// A channel in a brownout: every question takes a minute ("not found",
/// "failed" to a close); opening too while `slow_open` is set.
fn brownout() -> FixedChannel {
    FixedChannel::answering(ChannelPayment::NotFound, ChannelPayment::Failed)
        .refusing_refunds("not here")
        .taking(Duration::from_secs(60))
}

system_tests::world_of!(World, FixedChannel);

impl World {
    async fn new() -> Self {
        Self(fixtures::World::with_channel(brownout(), &["A"], 100).await)
    }

    /// A fresh order of u1 (60 s window), with one PROCESSING attempt made
    /// at T0 when `with_attempt`.
    async fn order(&self, with_attempt: bool) -> (Order, Option<PaymentAttempt>) {
        let order = self.create(Duration::from_secs(60), &one_line("u1", "A", 1, 100)).await;
        let attempt = if with_attempt { Some(self.attempt(&order).await) } else { None };
        (order, attempt)
    }

    async fn attempt(&self, order: &Order) -> PaymentAttempt {
        let order = self.now_order(order).await;
        fixtures::record_attempt(&self.store, &order, Timestamp::from_unix_millis(T0)).await
    }

    fn payment_entry(&self, until: Instant) -> StartPayment<'_, DynamoStore, FixedChannel> {
        let uc = fixtures::payment_entry(&self.store, &self.channel, &self.clock, "m1", Duration::from_secs(30));
        StartPayment { until: Some(until), ..uc }
    }

    fn closer(&self) -> CloseOrder<DynamoStore, FixedChannel, RecordedReminders> {
        CloseOrder {
            lease: Duration::from_secs(60),
            not_found_grace: Duration::from_secs(30),
            // The order API's own budget (functions/bootstrap/src/order_api.rs).
            budget: Duration::from_secs(5),
            // Reminders of its own: a test counts what this closer put back.
            reminders: RecordedReminders::default(),
            ..self.0.closer()
        }
    }

    async fn record(&self, o: &Order) -> OrderRecord {
        self.store.order_record(&o.order_id).await.unwrap().unwrap()
    }
}

/// Runs `f` under a bound well past the deadline under test, so that the
/// old behaviour (waiting for the channel) fails as an assertion, not a
/// hang of a minute.
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: still waiting for the channel 20 s later (no budget)"))
}

/// The JSON body of an answer (`lambda_http::Body` is `aws_lambda_events`'s).
fn body_of(body: &aws_lambda_events::encodings::Body) -> Value {
    serde_json::from_slice(body.as_ref()).expect("a JSON body")
}

#[tokio::test]
async fn a_new_attempt_whose_earlier_one_the_channel_cannot_close_in_time_answers_503_with_retry_after() {
    let w = World::new().await;
    let (order, earlier) = w.order(true).await;
    let earlier = earlier.unwrap();
    // Past the not-found grace: a new attempt must first set the earlier
    // one aside at the channel, which does not answer.
    w.clock.set(T0 + 40_000);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(2);
    let uc = w.payment_entry(deadline);
    let r = bounded("payment entry", start_payment(&uc, &order.user_id, order.order_id.as_str(), Some("k2"), SANDBOX))
        .await;
    let took = started.elapsed();
    let err = r.expect_err("no attempt can be started while the earlier one is unknown");
    let resp = error_response(&err);
    println!("answered {} after {took:?}: {}", resp.status(), body_of(resp.body()));
    assert!(took < Duration::from_secs(2) + SLACK, "answered at the deadline, not the channel's minute: {took:?}");
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("5"));
    assert_eq!(body_of(resp.body())["error"]["code"], "channel_slow");
    let rec = w.record(&order).await;
    assert_eq!(rec.payments.len(), 1, "no new attempt was recorded");
    assert_eq!(rec.payments[0].payment_id, earlier.payment_id);
    assert_eq!(rec.payments[0].status, PaymentStatus::Processing, "the earlier attempt is not taken as unpaid");
    assert_eq!(rec.order.status, OrderStatus::PendingPayment);
}

#[tokio::test]
async fn an_attempt_whose_opening_is_cut_off_answers_503_and_the_retry_opens_the_same_attempt() {
    let w = World::new().await;
    let (order, _) = w.order(false).await;
    w.clock.set(T0 + 1_000);
    w.channel.slow_open.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let uc = w.payment_entry(started + Duration::from_secs(2));
    let r = bounded("payment entry", start_payment(&uc, &order.user_id, order.order_id.as_str(), Some("k1"), SANDBOX))
        .await;
    let took = started.elapsed();
    let resp = error_response(&r.expect_err("the channel did not open it in time"));
    println!("answered {} after {took:?}: {}", resp.status(), body_of(resp.body()));
    assert!(took < Duration::from_secs(2) + SLACK, "{took:?}");
    assert_eq!(resp.status(), 503);
    assert_eq!(body_of(resp.body())["error"]["code"], "channel_slow");
    let rec = w.record(&order).await;
    assert_eq!(rec.payments.len(), 1, "the attempt was recorded before it was opened");
    assert_eq!(rec.payments[0].status, PaymentStatus::Processing, "held as recorded: not concluded");
    // The channel recovers; the buyer retries with the same key, as told.
    w.channel.slow_open.store(false, Ordering::SeqCst);
    let uc = w.payment_entry(Instant::now() + Duration::from_secs(2));
    let again = start_payment(&uc, &order.user_id, order.order_id.as_str(), Some("k1"), SANDBOX).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.attempt.payment_id, rec.payments[0].payment_id, "the same attempt, opened now");
}

#[tokio::test]
async fn an_operator_check_with_a_slow_channel_answers_inside_the_invocation_and_releases_nothing() {
    let w = World::new().await;
    let (order, _) = w.order(true).await;
    w.clock.set(T0 + 61_000);
    let closer = w.closer();
    let started = Instant::now();
    let v = bounded(
        "force-check",
        force_check_until(&closer, order.order_id.as_str(), "ops", Some(started + Duration::from_secs(2))),
    )
    .await
    .expect("the check answers");
    let took = started.elapsed();
    println!("check after {took:?}: {v}");
    assert!(took < Duration::from_secs(2) + SLACK, "{took:?}");
    assert_eq!(v["outcome"], "reminded_later", "{v}");
    let rec = w.record(&order).await;
    assert_eq!(rec.order.status, OrderStatus::Closing, "held: the payment is unknown");
    // UNKNOWN when the question was cut off; still PROCESSING when the time
    // was spent before it could be asked (a loaded machine): never FAILED.
    let status = rec.payments[0].status;
    assert!(matches!(status, PaymentStatus::Unknown | PaymentStatus::Processing), "not concluded unpaid: {status:?}");
    assert!(rec.reservations.iter().all(|r| r.status == ReservationStatus::Reserved), "nothing released");
    assert_eq!(closer.reminders.0.lock().unwrap().len(), 1, "asked again later");
}

#[tokio::test]
async fn a_settle_batch_hands_back_the_order_whose_other_payment_could_not_be_closed_in_time() {
    let w = World::new().await;
    // Paid by its second attempt; the first is still open at the channel.
    let (slow, first) = w.order(true).await;
    let first = first.unwrap();
    let second = w.attempt(&slow).await;
    let paid = |o: &Order, a: &PaymentAttempt| {
        let (store, o, a) = (w.store.clone(), o.clone(), a.clone());
        async move {
            let o = store.order(&o.order_id).await.unwrap().unwrap();
            let ev = Evidence { at: o.created_at, source: "t".into(), status: PaymentStatus::Succeeded, detail: None };
            let tx = format!("tx-{}", a.payment_id);
            assert_eq!(store.settle_success(&o, &a, &tx, ev, None, "n").await.unwrap(), SettleResult::Paid);
        }
    };
    paid(&slow, &second).await;
    // An order of the same batch paid by its only attempt.
    let (plain, only) = w.order(true).await;
    paid(&plain, &only.unwrap()).await;
    let wakeups = RecordedWakeUps::default();
    // Eight seconds for the two: the slow one's share (half) ends while the
    // channel is still "thinking", and leaves the other its share.
    let started = Instant::now();
    let response = bounded(
        "settle batch",
        each_sqs_message_within(
            sqs_batch(&[&slow, &plain], "OrderPaid"),
            started + Duration::from_secs(8),
            |m, until| {
                let (w, wakeups) = (&w, &wakeups);
                async move {
                    let body = m.body.as_deref().unwrap_or("");
                    settle_message_until(&w.store, wakeups, &w.channel, &w.clock, body, Some(until)).await
                }
            },
        ),
    )
    .await;
    let took = started.elapsed();
    let failed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    println!("batch after {took:?}, handed back {failed:?}");
    assert!(took < Duration::from_secs(8) + SLACK, "{took:?}");
    assert_eq!(failed, [format!("m-{}", slow.order_id)], "only the unfinished settle comes back");
    let rec = w.record(&slow).await;
    let open = rec.payments.iter().find(|p| p.payment_id == first.payment_id).unwrap();
    assert_eq!(open.status, PaymentStatus::Processing, "not asked in time: left as it is, never taken as unpaid");
    assert!(rec.reservations.iter().all(|r| r.status == ReservationStatus::Confirmed), "the stock is sold");
    let plain = w.record(&plain).await;
    assert!(plain.reservations.iter().all(|r| r.status == ReservationStatus::Confirmed), "the other settle ran");
}

/// A channel that answers, slowly: every question takes `delay` ("not
/// found"), closing answers at once.
#[derive(Clone)]
struct SlowChannel {
    delay: Duration,
}
#[async_trait::async_trait]
impl PaymentChannel for SlowChannel {
    async fn open(&self, _: &PaymentAttempt, _: &str) -> Result<OpenedPayment, Unavailable> {
        Ok(OpenedPayment::default())
    }
    async fn query(&self, _: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        tokio::time::sleep(self.delay).await;
        Ok(ChannelPayment::NotFound)
    }
    async fn cancel(&self, _: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        Ok(ChannelPayment::Failed)
    }
    async fn refund(&self, _: &PaymentAttempt, _: i64, _: &str) -> Result<RefundResult, Unavailable> {
        Ok(RefundResult::Failed("not here".into()))
    }
}

struct NoRefunds;
#[async_trait::async_trait]
impl RefundRequests for NoRefunds {
    async fn request_refund(&self, _: &OrderId, _: &PaymentId) -> Result<(), Unavailable> {
        unreachable!("no refund in this batch")
    }
}

/// A settle re-driven by the backstop (drive-effects) in a full batch of
/// ten, while the channel takes 3 s to answer about the order's other
/// payment. A fair share of the batch's 20 s is 2 s, so the settle used to
/// be handed back on every receive until its message reached the DLQ; it
/// now runs again with the half of the invocation kept back for such
/// effects, and finishes.
#[tokio::test]
async fn a_settle_in_a_full_effects_batch_gets_the_time_to_close_a_slow_channels_payment() {
    use order_core::handlers::effects::pending_effects_batch;
    use order_core::usecases::pending_effects::{drive_pending_effect, EffectPorts};
    let w = World::new().await;
    let (order, first) = w.order(true).await;
    let first = first.unwrap();
    let second = w.attempt(&order).await;
    let o = w.store.order(&order.order_id).await.unwrap().unwrap();
    let ev = Evidence { at: o.created_at, source: "t".into(), status: PaymentStatus::Succeeded, detail: None };
    assert_eq!(w.store.settle_success(&o, &second, "tx-2", ev, None, "n").await.unwrap(), SettleResult::Paid);
    // The settle, then nine effects that take no time (orders that are
    // gone: a full batch's other messages).
    let mut bodies = vec![json!({"kind": "order_effects", "order_id": order.order_id})];
    bodies.extend((0..9).map(|i| json!({"kind": "order_effects", "order_id": format!("ord_gone{i}")})));
    let mut event = SqsEvent::default();
    event.records = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut m = SqsMessage::default();
            m.message_id = Some(format!("m{i}"));
            m.body = Some(b.to_string());
            m
        })
        .collect();
    let (channel, wakeups) = (SlowChannel { delay: Duration::from_secs(3) }, RecordedWakeUps::default());
    let ports =
        EffectPorts { store: &w.store, wakeups: &wakeups, channel: &channel, refunds: &NoRefunds, clock: &w.clock };
    let started = Instant::now();
    let response = bounded(
        "effects batch",
        pending_effects_batch(event, started + Duration::from_secs(20), |effect, until| {
            let ports = &ports;
            async move { drive_pending_effect(ports, &effect, Some(until)).await }
        }),
    )
    .await;
    let took = started.elapsed();
    let failed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    println!("effects batch after {took:?}, handed back {failed:?}");
    assert!(failed.is_empty(), "the settle finished: {failed:?}");
    assert!(took < Duration::from_secs(20) + SLACK, "{took:?}");
    let rec = w.record(&order).await;
    let other = rec.payments.iter().find(|p| p.payment_id == first.payment_id).unwrap();
    assert_eq!(other.status, PaymentStatus::Failed, "the other payment closed at the channel");
    assert!(rec.reservations.iter().all(|r| r.status == ReservationStatus::Confirmed), "the stock is sold");
}
