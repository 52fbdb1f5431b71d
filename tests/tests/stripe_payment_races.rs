//! The Stripe channel under races and failures: a payment entry replayed
//! while a close or a second attempt concludes "not found" never leaves a
//! payable intent behind an attempt recorded FAILED, and an intent handed
//! out is never closed; an intent Stripe denies after a key change holds
//! the order (and its event is failed so that Stripe sends it again); an
//! amount Stripe refuses is a 422 naming why; an event naming another
//! payment's intent pins nothing on the attempt; a refund Stripe failed is
//! made again under a key of its own. Needs DynamoDB Local; the ones that
//! pay run against the local stack's localstripe (`.local/stack.env`), the
//! others against recorded Stripe answers.

use async_trait::async_trait;
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::*;
use order_core::error::ApiError;
use order_core::handlers::requests::start_payment;
use order_core::ports::*;
use order_core::store::{AttemptResult, OrderStore, PaymentAttempt, PaymentStore};
use order_core::stripe::{SecretKey, StripeChannel, StripeClient, StripeSettings};
use order_core::usecases::channel_events::{handle_channel_event, ChannelEvent};
use order_core::usecases::close_order::{CloseOrder, CloseOutcome};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use system_tests::fakes::{FixedClock, OpenFails, RecordedReminders};
use system_tests::fixtures::{self, one_unit_order, payment_entry};
use system_tests::recorded_stripe::{fixture, serve, Answer};
use system_tests::stripe::{intent_of, Stripe, CARD_OK};
use tokio::sync::Notify;

const GRACE: Duration = Duration::from_secs(60);
const STRIPE_BODY: &[u8] = br#"{"channel":"stripe"}"#;
const MERCHANT: &str = "merchant-local";

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn stripe_channel(base: &str, key: &str, localstripe: bool) -> StripeChannel {
    let s = StripeSettings {
        base_url: base.to_owned(),
        publishable_key: None,
        send_cancellation_reason: !localstripe,
        list_filter_by_created: !localstripe,
        statement_window: Duration::from_secs(35 * 86_400),
    };
    StripeChannel::new(StripeClient::new(base.to_owned(), SecretKey::new(key)), s)
}

/// The real Stripe adapter against the stack's localstripe.
fn localstripe() -> StripeChannel {
    stripe_channel(&system_tests::stack_env("STRIPE_API_BASE_URL"), &system_tests::stack_env("STRIPE_SECRET_KEY"), true)
}

struct World {
    store: DynamoStore,
    clock: FixedClock,
    t0: i64,
    order: Order,
}

/// A fresh table, one SKU at `price` EUR cents, one order of one unit
/// created at t0 with a payment window of `window`.
async fn world(window: Duration, price: i64) -> World {
    let store = system_tests::fresh_table(&system_tests::dynamodb_local().await).await;
    let t0 = now_ms();
    let clock = FixedClock::at(t0);
    let key = format!("k-{}", rand::random::<u32>());
    let order = one_unit_order(&store, &clock, "ATK", price, window, &key).await;
    World { store, clock, t0, order }
}

/// Stripe as it is during a 5xx/429 storm: the create never lands (the
/// buyer's first request answers 500, the attempt is recorded, no intent id).
fn storm_on_open(stripe: StripeChannel) -> OpenFails<StripeChannel> {
    OpenFails { inner: stripe, what: "Stripe create PaymentIntent", why: "Stripe answered 503 three times" }
}

async fn first_request_lost_in_a_storm(w: &World) -> PaymentId {
    let storm = storm_on_open(localstripe());
    let r = start_payment(
        &payment_entry(&w.store, &storm, &w.clock, MERCHANT, GRACE),
        &w.order.user_id,
        w.order.order_id.as_str(),
        Some("k1"),
        STRIPE_BODY,
    )
    .await;
    assert!(matches!(r, Err(ApiError::Internal(_))), "the first request answers 500: {r:?}");
    let rec = w.store.order_record(&w.order.order_id).await.unwrap().unwrap();
    assert_eq!(rec.payments.len(), 1);
    assert!(rec.payments[0].channel_ref.is_none());
    rec.payments[0].payment_id.clone()
}

/// The second request's channel: while it is asking about attempt A (read
/// without an intent id), the buyer's retry of the first key runs to the end.
struct ReplayDuringSupersede {
    inner: StripeChannel,
    store: DynamoStore,
    clock: FixedClock,
    order: Order,
    replay_secret: Mutex<Option<Option<String>>>,
}
#[async_trait]
impl PaymentChannel for ReplayDuringSupersede {
    fn names(&self) -> Vec<&'static str> {
        vec!["stripe"]
    }
    async fn open(&self, a: &PaymentAttempt, m: &str) -> Result<OpenedPayment, Unavailable> {
        self.inner.open(a, m).await
    }
    async fn query(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        if a.channel_ref.is_none() && self.replay_secret.lock().unwrap().is_none() {
            let r = start_payment(
                &payment_entry(&self.store, &self.inner, &self.clock, MERCHANT, GRACE),
                &self.order.user_id,
                self.order.order_id.as_str(),
                Some("k1"),
                STRIPE_BODY,
            )
            .await
            .expect("the replay of the first key succeeds");
            assert!(r.replayed);
            *self.replay_secret.lock().unwrap() = Some(r.client_secret);
        }
        // Asked with the attempt as the second request read it.
        self.inner.query(a).await
    }
    async fn cancel(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        self.inner.cancel(a).await
    }
    async fn refund(&self, a: &PaymentAttempt, amt: i64, k: &str) -> Result<RefundResult, Unavailable> {
        self.inner.refund(a, amt, k).await
    }
}

#[tokio::test]
async fn a_second_attempt_racing_a_replay_never_leaves_two_payable_intents() {
    let w = world(Duration::from_secs(1800), 1299).await;
    let a = first_request_lost_in_a_storm(&w).await;
    // Past the not-found grace: the buyer's client retries, and a second tab
    // starts a new attempt (another key) at the same moment.
    w.clock.set(w.t0 + 120_000);
    let second = ReplayDuringSupersede {
        inner: localstripe(),
        store: w.store.clone(),
        clock: w.clock.clone(),
        order: w.order.clone(),
        replay_secret: Mutex::new(None),
    };
    let r2 = start_payment(
        &payment_entry(&w.store, &second, &w.clock, MERCHANT, GRACE),
        &w.order.user_id,
        w.order.order_id.as_str(),
        Some("k2"),
        STRIPE_BODY,
    )
    .await
    .expect("the second attempt starts");
    // The supersede found A changed under it (its intent id recorded by the
    // replay), asked again and cancelled A's intent at Stripe.
    let secret_a = second.replay_secret.lock().unwrap().clone().flatten().expect("the replay handed A's secret out");
    let secret_b = r2.client_secret.clone().expect("B's secret");
    let rec = w.store.order_record(&w.order.order_id).await.unwrap().unwrap();
    let att_a = rec.payments.iter().find(|p| p.payment_id == a).unwrap();
    println!("attempt A: status {:?}, channel_ref {:?}", att_a.status, att_a.channel_ref);
    let stripe = Stripe::new();
    let (pi_a, pi_b) = (intent_of(&secret_a), intent_of(&secret_b));
    assert_eq!(att_a.status, PaymentStatus::Failed, "A is superseded");
    assert_eq!(att_a.channel_ref.as_deref(), Some(pi_a.as_str()));
    assert_eq!(stripe.intent(&pi_a).await["status"], "canceled", "A's intent can no longer be paid");
    // The buyer tries both tabs: A's intent is refused by Stripe, B's pays.
    stripe.attach_card(&pi_a, CARD_OK).await;
    let (_, paid_a) = stripe.confirm(&pi_a).await;
    let paid_b = stripe.pay(&pi_b, CARD_OK).await;
    // Stripe's events, decided from the intents as retrieved.
    let ch = localstripe();
    let name = ChannelName::parse("stripe").unwrap();
    let mut results = vec![];
    for (evt, pi, pay) in [("evt_a", &pi_a, a.clone()), ("evt_b", &pi_b, r2.attempt.payment_id.clone())] {
        let e = ChannelEvent::Payment {
            event_id: format!("{evt}-{}", rand::random::<u32>()),
            channel_ref: pi.clone(),
            payment_id: Some(pay.to_string()),
        };
        results.push(handle_channel_event(&w.store, &ch, &w.clock, MERCHANT, &name, &e).await.unwrap());
    }
    println!("events: {results:?}");
    let rec = w.store.order_record(&w.order.order_id).await.unwrap().unwrap();
    println!("order {:?} paid_by {:?}, refunds {}", rec.order.status, rec.order.paid_by, rec.refunds.len());
    let charged = [&paid_a, &paid_b].iter().filter(|p| p["status"] == "succeeded").count();
    assert!(charged <= 1, "one order, {charged} successful charges");
    assert_eq!(rec.order.status, OrderStatus::Paid);
    assert!(rec.refunds.is_empty(), "one charge, nothing to refund");
}

struct ReplaySide {
    inner: StripeChannel,
    in_open: Arc<Notify>,
    closer_asked: Arc<Notify>,
}
#[async_trait]
impl PaymentChannel for ReplaySide {
    fn names(&self) -> Vec<&'static str> {
        vec!["stripe"]
    }
    async fn open(&self, a: &PaymentAttempt, m: &str) -> Result<OpenedPayment, Unavailable> {
        // The create call is on its way to Stripe (a slow Stripe) ...
        self.in_open.notify_one();
        self.closer_asked.notified().await;
        self.inner.open(a, m).await
    }
    async fn query(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        self.inner.query(a).await
    }
    async fn cancel(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        self.inner.cancel(a).await
    }
    async fn refund(&self, a: &PaymentAttempt, amt: i64, k: &str) -> Result<RefundResult, Unavailable> {
        self.inner.refund(a, amt, k).await
    }
}

struct CloserSide {
    inner: StripeChannel,
    store: DynamoStore,
    closer_asked: Arc<Notify>,
}
#[async_trait]
impl PaymentChannel for CloserSide {
    async fn open(&self, a: &PaymentAttempt, m: &str) -> Result<OpenedPayment, Unavailable> {
        self.inner.open(a, m).await
    }
    async fn query(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        if a.channel_ref.is_none() {
            self.closer_asked.notify_one();
            // The closer's question is in flight while the replay records the intent id.
            let until = Instant::now() + Duration::from_secs(20);
            while self.store.attempt(&a.payment_id).await?.and_then(|p| p.channel_ref).is_none() {
                assert!(Instant::now() < until, "the replay never recorded the intent");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.inner.query(a).await
    }
    async fn cancel(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        self.inner.cancel(a).await
    }
    async fn refund(&self, a: &PaymentAttempt, amt: i64, k: &str) -> Result<RefundResult, Unavailable> {
        self.inner.refund(a, amt, k).await
    }
}

#[tokio::test]
async fn a_close_racing_a_replay_never_closes_an_order_whose_intent_was_handed_out() {
    let window = Duration::from_secs(300);
    let w = world(window, 1299).await;
    let a = first_request_lost_in_a_storm(&w).await;
    let expire = w.order.expire_at.unix_millis();
    let replay_clock = FixedClock::at(expire - 1_000);
    let closer_clock = FixedClock::at(expire + 1_000);
    let (in_open, closer_asked) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let replay_ch = ReplaySide { inner: localstripe(), in_open: in_open.clone(), closer_asked: closer_asked.clone() };
    let closer = CloseOrder {
        lease: Duration::from_secs(60),
        not_found_grace: GRACE,
        ..fixtures::closer(
            &w.store,
            CloserSide { inner: localstripe(), store: w.store.clone(), closer_asked: closer_asked.clone() },
            RecordedReminders::default(),
            &closer_clock,
        )
    };
    let replay_uc = payment_entry(&w.store, &replay_ch, &replay_clock, MERCHANT, GRACE);
    let (replayed, closed) = tokio::join!(
        start_payment(&replay_uc, &w.order.user_id, w.order.order_id.as_str(), Some("k1"), STRIPE_BODY),
        async {
            in_open.notified().await;
            closer.close(&w.order.order_id, "wake-up").await
        }
    );
    let replayed = replayed.expect("the replay answers 201");
    let closed = closed.unwrap();
    let secret = replayed.client_secret.clone().expect("the replay handed a client_secret out");
    let rec = w.store.order_record(&w.order.order_id).await.unwrap().unwrap();
    println!(
        "close: {closed:?}; order {:?}; attempt {:?} ref {:?}",
        rec.order.status, rec.payments[0].status, rec.payments[0].channel_ref
    );
    let pi = intent_of(&secret);
    let stripe = Stripe::new();
    let before = stripe.intent(&pi).await["status"].clone();
    println!("intent {pi} after the close: {before}");
    // The closer's "not found" was drawn from the attempt before the id was
    // recorded: its write is refused, the order is held, and the next run
    // asks Stripe about the intent, cancels it and closes.
    assert!(matches!(closed, CloseOutcome::RemindedLater { .. }), "{closed:?}");
    assert_eq!(rec.order.status, OrderStatus::Closing, "held, nothing released");
    assert_eq!(rec.payments[0].status, PaymentStatus::Processing);
    assert_eq!(before, "requires_payment_method");
    let next = CloseOrder { clock: Box::new(FixedClock::at(expire + 120_000)), ..closer };
    let again = next.close(&w.order.order_id, "wake-up").await.unwrap();
    assert!(matches!(again, CloseOutcome::Closed), "{again:?}");
    assert_eq!(stripe.intent(&pi).await["status"], "canceled", "closed at Stripe before the order closed");
    let _ = (a, MERCHANT);
}

fn no_such_intent() -> Answer {
    Answer {
        status: 404,
        headers: vec![],
        body: r#"{"error":{"code":"resource_missing","message":"No such payment_intent: 'pi_3Live'; a similar object exists in live mode, but a test mode key was used to make this request.","param":"intent","type":"invalid_request_error"}}"#.into(),
    }
}

async fn order_with_recorded_intent(window: Duration) -> (World, PaymentAttempt) {
    let w = world(window, 2599).await;
    let a = PaymentAttempt {
        payment_id: PaymentId::parse(format!("pay_{}", rand::random::<u32>())).unwrap(),
        order_id: w.order.order_id.clone(),
        channel: ChannelName::parse("stripe").unwrap(),
        amount: w.order.amount_total,
        currency: w.order.currency.clone(),
        status: PaymentStatus::Processing,
        channel_txn_id: None,
        channel_ref: Some("pi_3Live".into()),
        created_at: w.clock.now(),
        evidence: vec![],
    };
    assert_eq!(w.store.record_attempt(&w.order, &a).await.unwrap(), AttemptResult::Recorded);
    (w, a)
}

#[tokio::test]
async fn an_intent_stripe_denies_holds_the_order_instead_of_closing_it() {
    let (w, _a) = order_with_recorded_intent(Duration::from_secs(120)).await;
    let (url, seen) = serve(vec![no_such_intent(), no_such_intent(), no_such_intent()]);
    let closer = CloseOrder {
        lease: Duration::from_secs(60),
        not_found_grace: GRACE,
        ..fixtures::closer(
            &w.store,
            stripe_channel(&url, "sk_test_rotated", false),
            RecordedReminders::default(),
            &FixedClock::at(w.order.expire_at.unix_millis() + 1_000),
        )
    };
    let out = closer.close(&w.order.order_id, "wake-up").await.unwrap();
    let requests: Vec<String> = seen.lock().unwrap().iter().map(|s| format!("{} {}", s.method, s.path())).collect();
    println!("close outcome {out:?}; Stripe saw {requests:?}");
    assert!(
        matches!(out, CloseOutcome::RemindedLater { .. }),
        "an intent id Stripe itself gave us answered 404 and the order was {out:?}: closed as unpaid, stock released"
    );
}

#[tokio::test]
async fn an_event_for_an_intent_stripe_denies_fails_so_that_stripe_sends_it_again() {
    let (w, a) = order_with_recorded_intent(Duration::from_secs(120)).await;
    let (url, _) = serve(vec![no_such_intent()]);
    let e = ChannelEvent::Payment {
        event_id: "evt_live_success".into(),
        channel_ref: "pi_3Live".into(),
        payment_id: Some(a.payment_id.to_string()),
    };
    let out = handle_channel_event(
        &w.store,
        &stripe_channel(&url, "sk_test_rotated", false),
        &w.clock,
        MERCHANT,
        &ChannelName::parse("stripe").unwrap(),
        &e,
    )
    .await;
    println!("{out:?}");
    assert!(
        out.is_err(),
        "a signed payment_intent.succeeded for OUR recorded intent was answered {out:?} (HTTP 200): Stripe never \
         sends it again"
    );
}

#[tokio::test]
async fn an_amount_stripe_refuses_is_a_422_naming_why_and_leaves_no_payable_attempt() {
    let w = world(Duration::from_secs(1800), 0).await;
    assert_eq!(w.order.amount_total, 0, "a free order is accepted at creation");
    let ch = localstripe();
    let mut answers = vec![];
    for i in 0..6 {
        let r = start_payment(
            &payment_entry(&w.store, &ch, &w.clock, MERCHANT, GRACE),
            &w.order.user_id,
            w.order.order_id.as_str(),
            Some(&format!("free-{i}")),
            STRIPE_BODY,
        )
        .await;
        answers.push(match &r {
            Ok(_) => "201".to_owned(),
            Err(ApiError::Internal(e)) => format!("500 ({e})"),
            Err(e) => format!("{} {}", e.code(), e),
        });
    }
    let rec = w.store.order_record(&w.order.order_id).await.unwrap().unwrap();
    assert!(answers.iter().all(|a| !a.starts_with("500")), "{answers:?}");
    assert!(answers[0].starts_with("payment_refused"), "{answers:?}");
    assert!(
        rec.payments.iter().all(|p| p.status == PaymentStatus::Failed && p.channel_ref.is_none()),
        "an attempt Stripe refused is over and has nothing at Stripe: {:?}",
        rec.payments
    );
}

#[tokio::test]
async fn an_event_whose_intent_is_another_payments_pins_nothing_on_the_attempt() {
    let w = world(Duration::from_secs(1800), 2599).await;
    let a = first_request_lost_in_a_storm_offline(&w).await;
    let foreign = fixture("intent_requires_payment_method").replace("pay_adapter", "pay_someone_else");
    let (url, _) = serve(vec![Answer { status: 200, headers: vec![], body: foreign }]);
    let e = ChannelEvent::Payment {
        event_id: "evt_x".into(),
        channel_ref: "pi_3ProcessingA1b2C3".into(),
        payment_id: Some(a.to_string()),
    };
    let out = handle_channel_event(
        &w.store,
        &stripe_channel(&url, "sk_test_x", false),
        &w.clock,
        MERCHANT,
        &ChannelName::parse("stripe").unwrap(),
        &e,
    )
    .await;
    let after = w.store.attempt(&a).await.unwrap().unwrap();
    assert!(out.is_err(), "the intent is not this attempt's: unknown, Stripe sends the event again: {out:?}");
    assert!(
        after.channel_ref.is_none(),
        "an intent that is not the attempt's (metadata names pay_someone_else) is now the attempt's channel_ref"
    );
}

/// As `first_request_lost_in_a_storm`, without localstripe.
async fn first_request_lost_in_a_storm_offline(w: &World) -> PaymentId {
    let storm = storm_on_open(stripe_channel("http://127.0.0.1:9", "sk_test_x", false));
    let r = start_payment(
        &payment_entry(&w.store, &storm, &w.clock, MERCHANT, GRACE),
        &w.order.user_id,
        w.order.order_id.as_str(),
        Some("k1"),
        STRIPE_BODY,
    )
    .await;
    assert!(matches!(r, Err(ApiError::Internal(_))), "{r:?}");
    w.store.order_record(&w.order.order_id).await.unwrap().unwrap().payments[0].payment_id.clone()
}

#[tokio::test]
async fn a_refund_stripe_failed_is_made_again_under_a_key_of_its_own() {
    let failed = fixture("refunds_with_ours").replace("\"succeeded\"", "\"failed\"");
    assert!(failed.contains("\"failed\""), "the fixture has a status to change");
    let list = Answer { status: 200, headers: vec![], body: failed.clone() };
    let made = Answer { status: 200, headers: vec![], body: fixture("refund_pending") };
    let (url, seen) = serve(vec![list, made]);
    let ch = stripe_channel(&url, "sk_test_x", false);
    let a = PaymentAttempt {
        payment_id: PaymentId::parse("pay_adapter").unwrap(),
        order_id: OrderId::parse("ord_adapter").unwrap(),
        channel: ChannelName::parse("stripe").unwrap(),
        amount: 2599,
        currency: Currency::parse("EUR").unwrap(),
        status: PaymentStatus::Succeeded,
        channel_txn_id: Some("ch_3SucceededCharge".into()),
        channel_ref: Some("pi_3ProcessingA1b2C3".into()),
        created_at: Timestamp::from_unix_millis(1_796_150_000_000),
        evidence: vec![],
    };
    let r = ch.refund(&a, 2599, "refund-pay_adapter").await.unwrap();
    assert_eq!(r, RefundResult::Pending { channel_refund_id: "re_3PendingRefund".into() });
    let seen = seen.lock().unwrap();
    let post = seen.iter().find(|s| s.method == "POST").expect("a new refund is made");
    assert_eq!(post.headers["idempotency-key"], "refund-pay_adapter-after-1", "a key of its own, after the failed one");
    assert_eq!(post.form()["metadata[refund_key]"], "refund-pay_adapter", "found by the same key next time");
}
