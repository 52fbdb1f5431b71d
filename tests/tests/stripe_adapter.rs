//! The Stripe adapter against Stripe's answers (`tests/fixtures/stripe/`, in the
//! shapes of Stripe's API reference) served by a scripted local HTTP
//! server: what localstripe cannot show. An intent left `processing`,
//! Stripe's `payment_intent_unexpected_state` refusal of a cancel, a
//! pending refund, 429 and 5xx answers, `Stripe-Should-Retry`, and the
//! requests themselves: the `Idempotency-Key` on every create, the form
//! encoding, the pinned `Stripe-Version`, the statement's `created[gte]`
//! and cursor.

use order_core::domain::*;
use order_core::ports::Clock;
use order_core::ports::{ChannelPayment, ChannelStatement, PaymentChannel, RefundResult};
use order_core::store::{AttemptResult, OrderStore, PaymentAttempt, PaymentStore};
use order_core::stripe::{client::API_VERSION, SecretKey, StripeChannel, StripeClient, StripeSettings};
use order_core::usecases::close_order::{verdict_of, Verdict};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use system_tests::fixtures;
use system_tests::recorded_stripe::{fixture, ok, serve, status, Answer, Seen};

fn settings(url: &str) -> StripeSettings {
    StripeSettings {
        base_url: url.to_owned(),
        publishable_key: None,
        send_cancellation_reason: true,
        list_filter_by_created: true,
        statement_window: Duration::from_secs(35 * 86_400),
    }
}

fn channel_with(settings: StripeSettings) -> StripeChannel {
    StripeChannel::new(StripeClient::new(settings.base_url.clone(), SecretKey::new("sk_test_adapter")), settings)
}

fn channel(url: &str) -> StripeChannel {
    channel_with(settings(url))
}

const INTENT: &str = "pi_3ProcessingA1b2C3";

fn attempt(channel_ref: Option<&str>, txn: Option<&str>) -> PaymentAttempt {
    PaymentAttempt {
        payment_id: PaymentId::parse("pay_adapter").unwrap(),
        order_id: OrderId::parse("ord_adapter").unwrap(),
        channel: ChannelName::parse("stripe").unwrap(),
        amount: 2599,
        currency: Currency::parse("EUR").unwrap(),
        status: PaymentStatus::Processing,
        channel_txn_id: txn.map(str::to_owned),
        channel_ref: channel_ref.map(str::to_owned),
        created_at: Timestamp::from_unix_millis(1_796_150_000_000),
        evidence: vec![],
    }
}

fn seen(log: &Arc<Mutex<Vec<Seen>>>) -> Vec<Seen> {
    log.lock().unwrap().clone()
}

#[tokio::test]
async fn an_intent_left_processing_is_held_it_cannot_be_cancelled_and_nothing_is_released() {
    let (url, log) =
        serve(vec![ok("intent_processing"), status(400, "error_unexpected_state"), ok("intent_processing")]);
    let c = channel(&url);
    let a = attempt(Some(INTENT), None);
    assert_eq!(c.query(&a).await.unwrap(), ChannelPayment::Pending, "processing is neither paid nor unpaid");
    let after_cancel = c.cancel(&a).await;
    assert_eq!(after_cancel.as_ref().unwrap(), &ChannelPayment::Pending, "Stripe refused the cancel; read again");
    // The close protocol's verdict on that answer: unknown, so the order is
    // held in CLOSING and nothing is released.
    let now = a.created_at.plus(Duration::from_secs(3600));
    assert!(matches!(verdict_of(after_cancel, &a, now, Duration::from_secs(60)), Verdict::Unknown(_)));
    let reqs = seen(&log);
    assert_eq!(reqs.len(), 3);
    assert_eq!((reqs[1].method.as_str(), reqs[1].path()), ("POST", "/v1/payment_intents/pi_3ProcessingA1b2C3/cancel"));
    assert_eq!(reqs[1].form().get("cancellation_reason").map(String::as_str), Some("abandoned"));
    for r in &reqs {
        assert_eq!(r.headers["authorization"], "Bearer sk_test_adapter");
        assert_eq!(r.headers["stripe-version"], API_VERSION);
    }
    // Once the bank settles, the same questions answer paid.
    let (url, _) = serve(vec![ok("intent_succeeded")]);
    assert_eq!(
        channel(&url).query(&a).await.unwrap(),
        ChannelPayment::Succeeded {
            channel_txn_id: "ch_3SucceededCharge".into(),
            amount: 2599,
            currency: "EUR".into()
        }
    );
}

#[tokio::test]
async fn a_cancelled_intent_answers_failed_and_a_cancel_that_finds_it_paid_answers_succeeded() {
    let (url, _) = serve(vec![ok("intent_canceled")]);
    assert_eq!(channel(&url).cancel(&attempt(Some(INTENT), None)).await.unwrap(), ChannelPayment::Failed);
    let (url, log) = serve(vec![status(400, "error_unexpected_state"), ok("intent_succeeded")]);
    let answer = channel(&url).cancel(&attempt(Some(INTENT), None)).await.unwrap();
    assert!(matches!(answer, ChannelPayment::Succeeded { .. }), "{answer:?}: the race path, paid wins");
    assert_eq!(seen(&log)[1].method, "GET");
}

#[tokio::test]
async fn opening_sends_the_payment_id_as_idempotency_key_and_retries_429_and_5xx_under_it() {
    let (url, log) =
        serve(vec![status(429, "error_rate_limit"), status(500, "error_api"), ok("intent_requires_payment_method")]);
    let opened = channel(&url).open(&attempt(None, None), "merchant").await.unwrap();
    assert_eq!(opened.channel_ref.as_deref(), Some(INTENT));
    assert_eq!(opened.client_secret.as_deref(), Some("pi_3ProcessingA1b2C3_secret_ZZ9"));
    let reqs = seen(&log);
    assert_eq!(reqs.len(), 3, "two retries");
    for r in &reqs {
        assert_eq!((r.method.as_str(), r.path()), ("POST", "/v1/payment_intents"));
        assert_eq!(r.headers["idempotency-key"], "pay_adapter", "the same key on every try");
        assert_eq!(r.headers["content-type"], "application/x-www-form-urlencoded");
        let f = r.form();
        for (k, v) in [
            ("amount", "2599"),
            ("currency", "eur"),
            ("capture_method", "automatic"),
            ("metadata[payment_id]", "pay_adapter"),
            ("metadata[order_id]", "ord_adapter"),
        ] {
            assert_eq!(f.get(k).map(String::as_str), Some(v), "{k} in {}", r.body);
        }
    }
    assert_eq!(reqs[0].body, reqs[2].body, "a retry sends the same request");
}

#[tokio::test]
async fn an_attempt_opened_before_gets_its_own_intent_back_without_a_new_one() {
    let (url, log) = serve(vec![ok("intent_requires_payment_method")]);
    let opened = channel(&url).open(&attempt(Some(INTENT), None), "merchant").await.unwrap();
    assert_eq!(opened.client_secret.as_deref(), Some("pi_3ProcessingA1b2C3_secret_ZZ9"));
    let reqs = seen(&log);
    assert_eq!(
        (reqs.len(), reqs[0].method.as_str(), reqs[0].path()),
        (1, "GET", "/v1/payment_intents/pi_3ProcessingA1b2C3")
    );
}

#[tokio::test]
async fn stripe_should_retry_false_and_a_client_error_are_not_retried() {
    let no_retry = Answer { status: 503, headers: vec![("Stripe-Should-Retry", "false")], body: fixture("error_api") };
    let (url, log) = serve(vec![no_retry]);
    assert!(channel(&url).open(&attempt(None, None), "m").await.is_err());
    assert_eq!(seen(&log).len(), 1, "Stripe said not to retry");
    // A 400 on the create is Stripe refusing the request itself: not
    // retried, and told as a refusal (nothing was created), not an outage.
    let (url, log) = serve(vec![status(400, "error_unexpected_state")]);
    let opened = channel(&url).open(&attempt(None, None), "m").await.unwrap();
    assert!(opened.refused.as_deref().is_some_and(|r| r.contains("You cannot cancel")), "{opened:?}");
    assert!(opened.channel_ref.is_none() && opened.client_secret.is_none());
    assert_eq!(seen(&log).len(), 1);
    let retry = Answer { status: 400, headers: vec![("Stripe-Should-Retry", "true")], body: fixture("error_api") };
    let (url, log) = serve(vec![retry, ok("intent_requires_payment_method")]);
    assert!(channel(&url).open(&attempt(None, None), "m").await.is_ok());
    assert_eq!(seen(&log).len(), 2, "Stripe said to retry");
}

#[tokio::test]
async fn an_intent_stripe_denies_or_of_another_payment_is_unknown_and_without_an_id_none_was_made() {
    // An intent Stripe gave us and now denies: the key changed (another
    // account, the other mode), never "nothing was charged".
    let (url, _) = serve(vec![status(404, "error_no_such_intent"), status(404, "error_no_such_intent")]);
    let err = channel(&url).query(&attempt(Some("pi_missing"), None)).await.unwrap_err();
    assert!(err.to_string().contains("is the secret key of another account"), "{err}");
    let err = channel(&url).cancel(&attempt(Some("pi_missing"), None)).await.unwrap_err();
    assert!(err.to_string().contains("pi_missing"), "{err}");
    assert_eq!(
        channel(&url).query(&attempt(None, None)).await.unwrap(),
        ChannelPayment::NotFound,
        "no id: never handed out"
    );
    let other = fixture("intent_succeeded").replace("pay_adapter", "pay_someone_else");
    let (url, _) = serve(vec![Answer { status: 200, headers: vec![], body: other }]);
    let err = channel(&url).query(&attempt(Some(INTENT), None)).await.unwrap_err();
    assert!(err.to_string().contains("does not carry metadata[payment_id]=pay_adapter"), "{err}");
}

#[tokio::test]
async fn a_refund_made_under_our_key_is_found_and_never_made_twice() {
    let (url, log) = serve(vec![ok("refunds_with_ours")]);
    let r = channel(&url).refund(&attempt(Some(INTENT), Some("ch_3SucceededCharge")), 2599, "refund-pay_adapter").await;
    assert_eq!(r.unwrap(), RefundResult::Refunded { channel_refund_id: "re_3OurRefund".into() });
    let reqs = seen(&log);
    assert_eq!(reqs.len(), 1, "found by its key: no second refund is created");
    assert_eq!((reqs[0].method.as_str(), reqs[0].path()), ("GET", "/v1/refunds"));
    assert_eq!(reqs[0].query().get("charge").map(String::as_str), Some("ch_3SucceededCharge"));
}

#[tokio::test]
async fn a_new_refund_is_made_under_our_key_and_a_pending_one_is_followed_up_not_assumed() {
    let (url, log) = serve(vec![ok("refunds_empty"), ok("refund_pending")]);
    let r = channel(&url).refund(&attempt(Some(INTENT), Some("ch_3SucceededCharge")), 2599, "refund-pay_adapter").await;
    assert_eq!(r.unwrap(), RefundResult::Pending { channel_refund_id: "re_3PendingRefund".into() });
    let post = &seen(&log)[1];
    assert_eq!((post.method.as_str(), post.path()), ("POST", "/v1/refunds"));
    assert_eq!(post.headers["idempotency-key"], "refund-pay_adapter");
    let f = post.form();
    assert_eq!(f["charge"], "ch_3SucceededCharge");
    assert_eq!(f["amount"], "2599");
    assert_eq!(f["metadata[refund_key]"], "refund-pay_adapter");
}

#[tokio::test]
async fn the_statement_reads_every_page_of_its_window() {
    let (url, log) = serve(vec![ok("intents_page_1"), ok("intents_page_2"), ok("refunds_empty")]);
    let now = Timestamp::from_unix_millis(1_796_151_000_000);
    let statement = channel(&url).statement(now).await.unwrap();
    let ids: Vec<&str> = statement.lines.iter().map(|l| l.payment_id.as_str()).collect();
    assert_eq!(ids, ["pay_new", "pay_old"]);
    let since = now.minus(Duration::from_secs(35 * 86_400)).unix_seconds();
    assert_eq!(statement.since, Some(Timestamp::from_unix_millis(since * 1000)));
    let reqs = seen(&log);
    assert_eq!(reqs[0].query().get("created[gte]"), Some(&since.to_string()));
    assert_eq!(reqs[0].query().get("limit").map(String::as_str), Some("100"));
    assert_eq!(reqs[1].query().get("starting_after").map(String::as_str), Some("pi_new"), "the cursor");
    assert_eq!(reqs[2].path(), "/v1/refunds");
}

#[tokio::test]
async fn without_a_created_filter_the_statement_drops_what_is_older_than_its_window() {
    let (url, log) = serve(vec![ok("intents_page_1"), ok("intents_page_2"), ok("refunds_empty")]);
    let mut s = settings(&url);
    s.list_filter_by_created = false;
    s.statement_window = Duration::from_secs(600);
    let now = Timestamp::from_unix_millis(1_796_151_000_000);
    let statement = channel_with(s).statement(now).await.unwrap();
    let ids: Vec<&str> = statement.lines.iter().map(|l| l.payment_id.as_str()).collect();
    assert_eq!(ids, ["pay_new"], "pay_old was created before the window");
    assert!(seen(&log).iter().all(|r| !r.target.contains("created")));
}

/// The whole close use case on DynamoDB Local with the Stripe adapter
/// answering from Stripe's recorded states: an intent left `processing` at
/// expiry holds the order in CLOSING with its stock still reserved, run
/// after run; when the bank settles, the next run finds it succeeded and
/// the order is PAID — it never closes, nothing is ever released.
#[tokio::test]
async fn a_processing_intent_holds_its_order_until_it_resolves_and_then_the_order_is_paid() {
    use order_core::usecases::close_order::CloseOutcome;
    use system_tests::fakes::{FixedClock, RecordedReminders};
    use system_tests::CreateAsNamed;

    const T0: i64 = 1_796_150_000_000;
    let store = system_tests::fresh_table(&system_tests::dynamodb_local().await).await;
    let sku = Sku::parse("S").unwrap();
    system_tests::fixtures::seed_stock(&store, &sku, 5, &system_tests::fixtures::eur(2599)).await.unwrap();
    let clock = FixedClock::at(T0);
    let create = fixtures::creator(&store, &clock, Duration::from_secs(60), "t");
    let body =
        serde_json::json!({"user_id": "u1", "currency": "EUR", "items": [{"sku": "S", "qty": 1, "unit_price": 2599}]});
    let order = create.execute_as_named(Some("k-processing"), body.to_string().as_bytes()).await.unwrap().order;
    let mut a = attempt(Some(INTENT), None);
    a.order_id = order.order_id.clone();
    a.payment_id = PaymentId::parse(format!("pay_{}", rand::random::<u32>())).unwrap();
    a.created_at = clock.now();
    assert_eq!(store.record_attempt(&order, &a).await.unwrap(), AttemptResult::Recorded);
    let ours = |name: &str| Answer {
        status: 200,
        headers: vec![],
        body: fixture(name)
            .replace("pay_adapter", a.payment_id.as_str())
            .replace("ord_adapter", order.order_id.as_str()),
    };
    // Two close runs see it processing (query, refused cancel, read again);
    // the third finds it succeeded.
    let refused = || status(400, "error_unexpected_state");
    let (url, _) = serve(vec![
        ours("intent_processing"),
        refused(),
        ours("intent_processing"),
        ours("intent_processing"),
        refused(),
        ours("intent_processing"),
        ours("intent_succeeded"),
    ]);
    let closer = fixtures::closer(&store, channel(&url), RecordedReminders::default(), &clock);
    let reserved = || async { store.stock(&sku).await.unwrap().unwrap().reserved };
    for minutes in [1, 3] {
        clock.set(T0 + minutes * 60_000 + 1);
        let outcome = closer.close(&order.order_id, "wake-up").await.unwrap();
        assert!(matches!(outcome, CloseOutcome::RemindedLater { .. }), "held, asked again later: {outcome:?}");
        let now = store.order(&order.order_id).await.unwrap().unwrap();
        assert_eq!(now.status, OrderStatus::Closing, "held while the bank decides");
        assert_eq!(reserved().await, 1, "nothing released while the payment is unknown");
    }
    clock.set(T0 + 10 * 60_000);
    closer.close(&order.order_id, "wake-up").await.unwrap();
    let paid = store.order(&order.order_id).await.unwrap().unwrap();
    assert_eq!(paid.status, OrderStatus::Paid, "the bank's success wins over the timeout");
    assert_eq!(paid.paid_by.as_ref(), Some(&a.payment_id));
}

#[test]
fn the_local_stack_and_the_docs_subscribe_every_event_the_webhook_handles() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for file in ["infra/local.sh", "README.md", "docs/payments.md"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for event in order_core::stripe::events::SUBSCRIBED {
            assert!(text.contains(event), "{file} does not name the Stripe event {event}");
        }
    }
}
