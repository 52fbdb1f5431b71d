//! The refund worker under duplicate deliveries of one refund (a
//! redelivered stream record, a duplicate queue message, the backstop's
//! re-drive running beside a live message): on DynamoDB Local with the
//! channel faked, each delivery's steps held back until the test lets it on.

use order_core::aws::dynamo::DynamoStore;
use order_core::domain::*;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::refunds::{process_refund, RefundOutcome, MAX_REFUND_TRIES};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use system_tests::fakes::FixedClock;
use system_tests::fixtures::{open_order, paid_twice, T0};
use system_tests::{dynamodb_local, fresh_table};

/// A REFUND_PENDING refund: the order was paid by one payment and a second
/// success arrived for it. Returns the store and the refund as created.
async fn pending_refund(clock: &FixedClock) -> (DynamoStore, Refund) {
    let store = fresh_table(&dynamodb_local().await).await;
    let order = open_order(&store, clock).await;
    let (attempts, first, second) = paid_twice(&store, clock, &order).await;
    assert_eq!(first, SettleResult::Paid);
    assert_eq!(second, SettleResult::RefundPending);
    let refund = store.refund(&order.order_id, &attempts[1].payment_id).await.unwrap().unwrap();
    (store, refund)
}

/// Counts tries onto a refund the way failed deliveries do, one at a time.
async fn fail_tries(store: &DynamoStore, refund: &Refund, n: u32) {
    for i in 0..n {
        let now = store.refund(&refund.order_id, &refund.payment_id).await.unwrap().unwrap();
        let at = Timestamp::from_unix_millis(T0 + i64::from(i));
        assert_eq!(store.update_refund(&now, now.status, None, Some("declined"), at).await.unwrap(), Cas::Applied);
    }
}

/// A point deliveries wait at until `need` of them have arrived.
#[derive(Default)]
struct Gate {
    arrived: AtomicUsize,
}
impl Gate {
    async fn arrive_and_wait(&self, need: usize) {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        self.wait_for(need).await;
    }
    async fn wait_for(&self, need: usize) {
        while self.arrived.load(Ordering::SeqCst) < need {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    fn open(&self) {
        self.arrived.fetch_add(1, Ordering::SeqCst);
    }
}

/// A channel whose refund waits at `before` (until `need` arrive) and then
/// answers `answer`; `entered` is opened when the call starts.
struct HeldChannel {
    entered: Arc<Gate>,
    before: Arc<Gate>,
    need: usize,
    answer: RefundResult,
}
#[async_trait::async_trait]
impl PaymentChannel for HeldChannel {
    async fn open(&self, _: &PaymentAttempt, _: &str) -> Result<OpenedPayment, Unavailable> {
        Ok(OpenedPayment::default())
    }
    async fn query(&self, _: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        Ok(ChannelPayment::NotFound)
    }
    async fn cancel(&self, _: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        Ok(ChannelPayment::NotFound)
    }
    async fn refund(&self, _: &PaymentAttempt, _: i64, _: &str) -> Result<RefundResult, Unavailable> {
        self.entered.open();
        self.before.arrive_and_wait(self.need).await;
        Ok(self.answer.clone())
    }
}

fn declined() -> RefundResult {
    RefundResult::Failed("declined".into())
}

/// Two deliveries that both read the refund before either records its try.
async fn two_failing_deliveries(store: &DynamoStore, clock: &FixedClock, refund: &Refund) -> [RefundOutcome; 2] {
    let both_read = Arc::new(Gate::default());
    let channel =
        || HeldChannel { entered: Arc::new(Gate::default()), before: both_read.clone(), need: 2, answer: declined() };
    let (c1, c2) = (channel(), channel());
    let (a, b) = tokio::join!(
        process_refund(store, &c1, clock, &refund.order_id, &refund.payment_id),
        process_refund(store, &c2, clock, &refund.order_id, &refund.payment_id),
    );
    [a.unwrap(), b.unwrap()]
}

#[tokio::test]
async fn a_refund_the_channel_paid_ends_refunded_even_if_a_duplicate_gave_up_meanwhile() {
    let clock = FixedClock::at(T0);
    let (store, refund) = pending_refund(&clock).await;
    fail_tries(&store, &refund, MAX_REFUND_TRIES - 1).await;
    // Delivery A reads PENDING and reaches the channel, which refunds; its
    // answer is held until delivery B, reading the same PENDING, has failed
    // its last try and recorded the give-up.
    let a_entered = Arc::new(Gate::default());
    let b_done = Arc::new(Gate::default());
    let a_channel = HeldChannel {
        entered: a_entered.clone(),
        before: b_done.clone(),
        need: 2,
        answer: RefundResult::Refunded { channel_refund_id: "r-1".into() },
    };
    let b_channel =
        HeldChannel { entered: Arc::new(Gate::default()), before: a_entered.clone(), need: 1, answer: declined() };
    let (a, b) =
        tokio::join!(process_refund(&store, &a_channel, &clock, &refund.order_id, &refund.payment_id), async {
            let out = process_refund(&store, &b_channel, &clock, &refund.order_id, &refund.payment_id).await;
            b_done.open();
            out
        },);
    assert!(matches!(b.unwrap(), RefundOutcome::GiveUp(_)), "B spent the last try");
    assert_eq!(a.unwrap(), RefundOutcome::Refunded);
    let now = store.refund(&refund.order_id, &refund.payment_id).await.unwrap().unwrap();
    assert_eq!(
        (now.status, now.channel_refund_id.as_deref()),
        (RefundStatus::Refunded, Some("r-1")),
        "the money went back: the record says so, over the give-up"
    );
}

#[tokio::test]
async fn two_deliveries_of_one_refund_count_one_try_once() {
    let clock = FixedClock::at(T0);
    let (store, refund) = pending_refund(&clock).await;
    let outcomes = two_failing_deliveries(&store, &clock, &refund).await;
    assert!(outcomes.contains(&RefundOutcome::RetryAfter(Duration::from_secs(10))), "{outcomes:?}");
    assert!(outcomes.contains(&RefundOutcome::Superseded), "the duplicate steps aside: {outcomes:?}");
    let now = store.refund(&refund.order_id, &refund.payment_id).await.unwrap().unwrap();
    assert_eq!((now.status, now.tries), (RefundStatus::RefundPending, 1), "one try counted once");
}

#[tokio::test]
async fn two_deliveries_of_the_last_try_give_up_once() {
    let clock = FixedClock::at(T0);
    let (store, refund) = pending_refund(&clock).await;
    fail_tries(&store, &refund, MAX_REFUND_TRIES - 1).await;
    let outcomes = two_failing_deliveries(&store, &clock, &refund).await;
    let gave_up = outcomes.iter().filter(|o| matches!(o, RefundOutcome::GiveUp(_))).count();
    assert_eq!(gave_up, 1, "exactly one delivery writes the dead letter: {outcomes:?}");
    assert!(outcomes.contains(&RefundOutcome::Superseded), "{outcomes:?}");
    let now = store.refund(&refund.order_id, &refund.payment_id).await.unwrap().unwrap();
    assert_eq!((now.status, now.tries), (RefundStatus::RefundFailed, MAX_REFUND_TRIES));
}

#[tokio::test]
async fn two_redriven_deliveries_of_a_failed_refund_give_up_once() {
    let clock = FixedClock::at(T0);
    let (store, refund) = pending_refund(&clock).await;
    fail_tries(&store, &refund, MAX_REFUND_TRIES - 1).await;
    let now = store.refund(&refund.order_id, &refund.payment_id).await.unwrap().unwrap();
    let at = Timestamp::from_unix_millis(T0 + 100);
    assert_eq!(store.update_refund(&now, RefundStatus::RefundFailed, None, Some("x"), at).await.unwrap(), Cas::Applied);
    // An operator redrives the dead letter twice by mistake.
    let outcomes = two_failing_deliveries(&store, &clock, &refund).await;
    let gave_up = outcomes.iter().filter(|o| matches!(o, RefundOutcome::GiveUp(_))).count();
    assert_eq!(gave_up, 1, "{outcomes:?}");
    let now = store.refund(&refund.order_id, &refund.payment_id).await.unwrap().unwrap();
    assert_eq!((now.status, now.tries), (RefundStatus::RefundFailed, MAX_REFUND_TRIES + 1));
}
