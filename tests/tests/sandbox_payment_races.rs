//! The sandbox channel under the races of a payment entry replayed while a
//! second key or a close concludes "not found": an attempt recorded FAILED
//! here must never stay payable at the channel. The close that concludes
//! "never charged" first closes the payment at the sandbox, which keeps a
//! FAILED marker that refuses a later open or payment; a replay re-reads
//! its attempt after opening and closes what it opened if the attempt was
//! concluded meanwhile. The Stripe side is `stripe_payment_races.rs`.
//! DynamoDB Local, the real sandbox adapter on a ledger table of its own.

use async_trait::async_trait;
use order_core::aws::dynamo::DynamoStore;
use order_core::aws::sandbox::SandboxChannel;
use order_core::domain::*;
use order_core::error::ApiError;
use order_core::handlers::requests::start_payment;
use order_core::ports::*;
use order_core::store::{Evidence, OrderStore, PaymentAttempt, PaymentStore};
use std::sync::Mutex;
use std::time::Duration;
use system_tests::fakes::{FixedClock, OpenFails};
use system_tests::fixtures::{one_unit_order, payment_entry};

const GRACE: Duration = Duration::from_secs(30);
const SANDBOX: &[u8] = br#"{"channel":"sandbox"}"#;
const MERCHANT: &str = "merchant-local";

struct World {
    store: DynamoStore,
    sandbox: SandboxChannel,
    clock: FixedClock,
    t0: i64,
    order: Order,
}

/// A fresh table and ledger, one order of one unit created at t0 with a
/// 30-minute payment window.
async fn world() -> World {
    let client = system_tests::dynamodb_local().await;
    let store = system_tests::fresh_table(&client).await;
    let sandbox = system_tests::fresh_sandbox_ledger(&client).await;
    let t0 = 1_800_000_000_000;
    let clock = FixedClock::at(t0);
    let order = one_unit_order(&store, &clock, "SBX", 1299, Duration::from_secs(1800), "k-order").await;
    World { store, sandbox, clock, t0, order }
}

impl World {
    async fn pay(
        &self,
        ch: &impl PaymentChannel,
        key: &str,
    ) -> Result<order_core::usecases::payments::PaymentStarted, ApiError> {
        start_payment(
            &payment_entry(&self.store, ch, &self.clock, MERCHANT, GRACE),
            &self.order.user_id,
            self.order.order_id.as_str(),
            Some(key),
            SANDBOX,
        )
        .await
    }

    /// The buyer's first request, whose opening at the channel never got an
    /// answer (it answered 500): the attempt is recorded, the ledger has no
    /// row of it.
    async fn first_request_lost(&self) -> PaymentId {
        let r = self.pay(&lost_open(&self.sandbox), "k1").await;
        assert!(matches!(r, Err(ApiError::Internal(_))), "the first request answers 500: {r:?}");
        let rec = self.store.order_record(&self.order.order_id).await.unwrap().unwrap();
        assert_eq!(rec.payments.len(), 1);
        assert!(self.sandbox.entry(&rec.payments[0].payment_id).await.unwrap().is_none());
        rec.payments[0].payment_id.clone()
    }

    /// Every attempt recorded FAILED here, with its ledger row: none may be
    /// payable there — the buyer tries to pay each at the sandbox.
    async fn failed_here_and_payable_there(&self) -> Vec<String> {
        let rec = self.store.order_record(&self.order.order_id).await.unwrap().unwrap();
        let mut payable = Vec::new();
        for p in rec.payments.iter().filter(|p| p.status == PaymentStatus::Failed) {
            let before = self.sandbox.entry(&p.payment_id).await.unwrap();
            let paid = self.sandbox.settle(&p.payment_id, Some(PaymentStatus::Succeeded), None).await.unwrap();
            println!(
                "{} FAILED here; at the sandbox before {:?}, after the buyer pays {:?}",
                p.payment_id,
                before.as_ref().map(|e| e.status),
                paid.as_ref().map(|e| e.status)
            );
            if paid.is_some_and(|e| e.status == PaymentStatus::Succeeded) {
                payable.push(p.payment_id.to_string());
            }
        }
        payable
    }
}

/// The sandbox as a lost answer leaves it: the open never reached it.
fn lost_open(sandbox: &SandboxChannel) -> OpenFails<SandboxChannel> {
    OpenFails { inner: sandbox.clone(), what: "sandbox open payment", why: "timed out" }
}

/// The second key's channel: the sandbox answers "not found" about the
/// first attempt, and before that answer is acted on, the buyer's retry of
/// the first key runs to the end (it opens the attempt at the sandbox).
struct ReplayAfterNotFound<'w> {
    w: &'w World,
    replayed: Mutex<Option<Result<PaymentStatus, String>>>,
}
#[async_trait]
impl PaymentChannel for ReplayAfterNotFound<'_> {
    async fn open(&self, a: &PaymentAttempt, m: &str) -> Result<OpenedPayment, Unavailable> {
        self.w.sandbox.open(a, m).await
    }
    async fn query(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        let answer = self.w.sandbox.query(a).await;
        if matches!(answer, Ok(ChannelPayment::NotFound)) && self.replayed.lock().unwrap().is_none() {
            let r = self.w.pay(&self.w.sandbox, "k1").await;
            println!("the replay of k1 while k2 holds \"not found\": {r:?}");
            *self.replayed.lock().unwrap() = Some(r.map(|s| s.attempt.status).map_err(|e| e.to_string()));
        }
        answer
    }
    async fn cancel(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        self.w.sandbox.cancel(a).await
    }
    async fn refund(&self, a: &PaymentAttempt, amt: i64, k: &str) -> Result<RefundResult, Unavailable> {
        self.w.sandbox.refund(a, amt, k).await
    }
}

#[tokio::test]
async fn a_replayed_payment_entry_racing_a_second_key_leaves_no_payable_attempt_that_is_failed_here() {
    let w = world().await;
    let a = w.first_request_lost().await;
    // Past the not-found grace: the buyer's client retries the first key
    // while a second tab starts a new attempt.
    w.clock.set(w.t0 + 120_000);
    let second = ReplayAfterNotFound { w: &w, replayed: Mutex::new(None) };
    let r2 = w.pay(&second, "k2").await;
    println!("k2: {r2:?}");
    assert!(second.replayed.lock().unwrap().is_some(), "the replay ran inside the race");
    let rec = w.store.order_record(&w.order.order_id).await.unwrap().unwrap();
    let att_a = rec.payments.iter().find(|p| p.payment_id == a).unwrap();
    println!(
        "attempt A {:?} here, {:?} at the sandbox",
        att_a.status,
        w.sandbox.entry(&a).await.unwrap().map(|e| e.status)
    );
    let payable = w.failed_here_and_payable_there().await;
    assert!(payable.is_empty(), "attempts FAILED here that the buyer could still pay at the channel: {payable:?}");
    // At most one attempt can take the buyer's money.
    let rec = w.store.order_record(&w.order.order_id).await.unwrap().unwrap();
    let open_here = rec.payments.iter().filter(|p| p.status == PaymentStatus::Processing).count();
    assert!(open_here <= 1, "{open_here} attempts open");
}

#[tokio::test]
async fn a_payment_concluded_never_charged_cannot_be_opened_or_paid_at_the_sandbox_later() {
    let w = world().await;
    let a = w.first_request_lost().await;
    w.clock.set(w.t0 + 120_000);
    // A second key sets A aside: "not found" past the grace.
    let b = w.pay(&w.sandbox, "k2").await.expect("the second attempt starts");
    let att_a = w.store.attempt(&a).await.unwrap().unwrap();
    assert_eq!(att_a.status, PaymentStatus::Failed);
    let marker = w.sandbox.entry(&a).await.unwrap();
    println!("A's row at the sandbox after the conclusion: {marker:?}");
    assert_eq!(marker.map(|e| e.status), Some(PaymentStatus::Failed), "the sandbox keeps a closed marker");
    // A late open of A (a replay that read A before the conclusion) is refused ...
    let opened = w.sandbox.open(&PaymentAttempt { status: PaymentStatus::Processing, ..att_a.clone() }, MERCHANT).await;
    println!("late open of A: {opened:?}");
    assert!(opened.unwrap().refused.is_some(), "opening a closed payment is refused");
    // ... and so is paying it.
    let paid = w.sandbox.settle(&a, Some(PaymentStatus::Succeeded), None).await.unwrap().unwrap();
    assert_eq!(paid.status, PaymentStatus::Failed, "paying a closed payment is refused");
    // B, the live one, can still be paid.
    let paid_b = w.sandbox.settle(&b.attempt.payment_id, Some(PaymentStatus::Succeeded), None).await.unwrap().unwrap();
    assert_eq!(paid_b.status, PaymentStatus::Succeeded);
}

/// A concluder that keeps no marker at the channel (as a provider that
/// cannot close what it never saw): the attempt is recorded FAILED while the
/// replay's open is on its way to the sandbox.
struct ConcludedDuringOpen<'w> {
    w: &'w World,
}
#[async_trait]
impl PaymentChannel for ConcludedDuringOpen<'_> {
    async fn open(&self, a: &PaymentAttempt, m: &str) -> Result<OpenedPayment, Unavailable> {
        let ev = Evidence {
            at: self.w.clock.now(),
            source: "channel_query".into(),
            status: PaymentStatus::Failed,
            detail: Some("the channel has no such payment: nothing charged".into()),
        };
        assert!(self.w.store.record_payment_fact(a, PaymentStatus::Failed, ev, None).await?);
        self.w.sandbox.open(a, m).await
    }
    async fn query(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        self.w.sandbox.query(a).await
    }
    async fn cancel(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        self.w.sandbox.cancel(a).await
    }
    async fn refund(&self, a: &PaymentAttempt, amt: i64, k: &str) -> Result<RefundResult, Unavailable> {
        self.w.sandbox.refund(a, amt, k).await
    }
}

#[tokio::test]
async fn a_replay_whose_attempt_was_concluded_while_it_opened_closes_what_it_opened() {
    let w = world().await;
    let a = w.first_request_lost().await;
    w.clock.set(w.t0 + 120_000);
    let r = w.pay(&ConcludedDuringOpen { w: &w }, "k1").await;
    println!("the replay: {r:?}; A at the sandbox: {:?}", w.sandbox.entry(&a).await.unwrap().map(|e| e.status));
    assert!(
        matches!(&r, Err(ApiError::Refused { code: "order_busy", .. })),
        "a payment concluded FAILED is not handed out: {r:?}"
    );
    let payable = w.failed_here_and_payable_there().await;
    assert!(payable.is_empty(), "attempts FAILED here that the buyer could still pay at the channel: {payable:?}");
}
