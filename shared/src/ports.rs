//! Ports: what the use cases need from the outside world, as traits. The
//! AWS adapters in [`crate::aws`] implement them; unit tests substitute
//! fakes for the clock, the scheduler, the queue and the payment channel.

use crate::domain::events::{IntegrationEvent, SOURCE};
use crate::domain::*;
use async_trait::async_trait;
use std::time::Duration;

/// A failure of an outside system that is not a business answer: a timeout,
/// a throttle, a 5xx. Carries its cause for the log; never shown to clients.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {source}")]
pub struct Unavailable {
    pub context: &'static str,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl Unavailable {
    pub fn new(context: &'static str, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self { context, source: source.into() }
    }
}

/// Server time. Use cases never read the system clock themselves, so that
/// deadline logic can be tested at any instant.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

pub struct SystemClock;
impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock after 1970").as_millis()
                as i64;
        Timestamp::from_unix_millis(ms)
    }
}

/// Generates identifiers: time-ordered, unguessable, URL- and key-safe.
pub trait IdGen: Send + Sync {
    fn new_id(&self, prefix: &str, now: Timestamp) -> String;
}

pub struct RandomIds;
impl IdGen for RandomIds {
    fn new_id(&self, prefix: &str, now: Timestamp) -> String {
        use rand::Rng;
        const ALPHABET: &[u8] = b"0123456789abcdefghjkmnpqrstvwxyz";
        let mut out = String::with_capacity(prefix.len() + 27);
        out.push_str(prefix);
        out.push('_');
        let mut ms = now.unix_millis() as u64;
        let mut time_part = [0u8; 10];
        for c in time_part.iter_mut().rev() {
            *c = ALPHABET[(ms & 31) as usize];
            ms >>= 5;
        }
        out.push_str(std::str::from_utf8(&time_part).expect("ascii"));
        let mut rng = rand::thread_rng();
        for _ in 0..16 {
            out.push(ALPHABET[rng.gen_range(0..32)] as char);
        }
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduled {
    Created,
    /// A schedule with this name exists: a redelivered stream record.
    AlreadyExisted,
}

/// The one-shot wake-up of an order at its `expire_at`.
#[async_trait]
pub trait WakeUpScheduler: Send + Sync {
    async fn schedule_wake_up(&self, order_id: &OrderId, at: Timestamp) -> Result<Scheduled, Unavailable>;
    /// Deleting a schedule that does not exist (already fired) is success.
    async fn cancel_wake_up(&self, order_id: &OrderId) -> Result<(), Unavailable>;
}

/// The longest delay a reminder can be put back with (SQS's 15 minutes);
/// a longer wait is covered by successive reminders, each re-checking.
pub const MAX_REMINDER_DELAY: Duration = Duration::from_secs(900);

/// Puts a close reminder back for later (an early or blocked wake-up).
#[async_trait]
pub trait CloseReminders: Send + Sync {
    async fn remind_later(&self, order_id: &OrderId, after: Duration) -> Result<(), Unavailable>;
}

/// Where a trigger puts what it can never process (a stream record that
/// does not decode), so that the rest of its batch can go on and a person
/// can look at it.
#[async_trait]
pub trait DeadLetters: Send + Sync {
    /// Stores `body` (the record's JSON) durably, or fails.
    async fn set_aside(&self, body: String) -> Result<(), Unavailable>;
}

/// What the payment channel says about one payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelPayment {
    Succeeded {
        channel_txn_id: String,
        amount: i64,
        currency: String,
    },
    Failed,
    /// The channel has never seen this payment: nothing was charged.
    NotFound,
    /// The channel answered but does not know yet.
    Pending,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundResult {
    Refunded {
        channel_refund_id: String,
    },
    /// The channel accepted the refund and has not finished it (Stripe's
    /// `pending` or `requires_action`): asked again later, never assumed.
    Pending {
        channel_refund_id: String,
    },
    /// The channel refused or failed; retry later.
    Failed(String),
}

/// What opening a payment at the channel hands back for the buyer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenedPayment {
    /// The channel's own id of the payment, when it has one of its own
    /// (recorded on the attempt: later queries, closes and refunds use it).
    pub channel_ref: Option<String>,
    /// What the buyer's client confirms the payment with (Stripe's
    /// PaymentIntent `client_secret`). Never logged, never stored by us.
    pub client_secret: Option<String>,
    /// The channel refused to open the payment (an amount below its minimum,
    /// a currency it does not take): nothing exists there, and why.
    pub refused: Option<String>,
}

/// A payment provider. The sandbox and Stripe implement it.
#[async_trait]
pub trait PaymentChannel: Send + Sync {
    /// The channel names (`"sandbox"`, `"stripe"`) a payment request may
    /// name on this deployment.
    fn names(&self) -> Vec<&'static str> {
        vec!["sandbox"]
    }
    /// Starts the payment at the provider (the buyer then pays there), or,
    /// for an attempt opened before (its `channel_ref` is set), hands back
    /// the same payment again. Idempotent on the attempt's `payment_id`.
    async fn open(&self, attempt: &PaymentAttempt, merchant_id: &str) -> Result<OpenedPayment, Unavailable>;
    /// `Err` means the channel could not be asked (timeout, network): the
    /// caller must treat the payment as unknown, never as unpaid.
    /// `Pending` is a payment that is open (payable, or processing).
    async fn query(&self, attempt: &PaymentAttempt) -> Result<ChannelPayment, Unavailable>;
    /// Closes a payment that is still open, so that it can no longer be
    /// paid; answers with the payment's state after the close (`Succeeded`
    /// if it was paid before the close reached the channel, `Pending` if
    /// it is processing and the channel cannot close it).
    async fn cancel(&self, attempt: &PaymentAttempt) -> Result<ChannelPayment, Unavailable>;
    /// Refunds are idempotent on `idempotency_key` at the channel.
    async fn refund(
        &self,
        attempt: &PaymentAttempt,
        amount: i64,
        idempotency_key: &str,
    ) -> Result<RefundResult, Unavailable>;
}

/// A pending effect the sweep found in the due index's effects shards, as
/// the effects queue's message names it: which effect, never what to do
/// about it. The consumer re-reads the record and the use case's
/// conditional writes decide, so a stale or repeated one changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PendingEffect {
    /// A final order whose stock or coupon is not settled yet: release if
    /// the order is CLOSED, settle if it is PAID (read from the order).
    Order(OrderId),
    /// A refund still REFUND_PENDING past its retry budget.
    Refund(OrderId, PaymentId),
}

impl PendingEffect {
    pub fn order_id(&self) -> &OrderId {
        match self {
            Self::Order(id) | Self::Refund(id, _) => id,
        }
    }
}

/// What the sweep does with the due records it finds. It only hands them
/// on: close reminders to the close path, pending effects to the effects
/// queue, whose consumer runs the same idempotent use cases as the normal
/// path. The sweep never decides and never waits for an effect to be done.
#[async_trait]
pub trait Redrive: Send + Sync {
    /// Close reminders for due open orders, `{"order_id", "trigger": "sweep"}`
    /// on CloseQueue (the sweep hands at most 10 at a time: one batch).
    async fn close(&self, order_ids: &[OrderId]) -> Result<(), Unavailable>;
    /// Pending effects on the effects queue, one message each (the sweep
    /// hands at most 10 at a time: one batch). `Err` if any was not taken.
    async fn effects(&self, effects: &[PendingEffect]) -> Result<(), Unavailable>;
}

/// Hands a refund to the refund worker (its queue), which owns the tries,
/// the backoff between them and the hand-over to a person.
#[async_trait]
pub trait RefundRequests: Send + Sync {
    async fn request_refund(&self, order_id: &OrderId, payment_id: &PaymentId) -> Result<(), Unavailable>;
}

/// An entry of a publish that the bus did not take. `index` is the entry's
/// position in the slice handed to [`EventPublisher::publish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishFailure {
    pub index: usize,
    /// The bus's error code (e.g. `ThrottlingException`, `InternalFailure`;
    /// `FaultInjection` for a drill).
    pub code: String,
    pub message: String,
}

/// The most events one [`EventPublisher::publish`] call carries: EventBridge's
/// `PutEvents` takes at most ten entries a request.
pub const MAX_EVENTS_PER_PUBLISH: usize = 10;

/// `PutEvents` also wants its entries to add up to less than 256 KB, each
/// counted by [`publish_size`]; a call is packed to stay under this.
pub const MAX_PUBLISH_BYTES: usize = 256 * 1024;

/// An event's size as `PutEvents` counts it against [`MAX_PUBLISH_BYTES`]
/// (EventBridge user guide, "Calculating PutEvents event entry size"):
/// 14 bytes for `Time` (the adapter always sets it) and the UTF-8 bytes of
/// `Source`, `DetailType` and `Detail`. The bus name is not counted.
pub fn publish_size(event: &IntegrationEvent) -> usize {
    14 + SOURCE.len() + event.detail_type().len() + event.detail_json().len()
}

/// The event bus other services subscribe to.
#[async_trait]
pub trait EventPublisher: Send + Sync {
    /// Publishes `events` in their order, as one call when they fit one
    /// ([`MAX_EVENTS_PER_PUBLISH`], [`MAX_PUBLISH_BYTES`]; the relay packs
    /// its calls so). The answer names the entries the bus refused (empty:
    /// all taken); `Err` means it could not be asked.
    async fn publish(&self, events: &[IntegrationEvent]) -> Result<Vec<PublishFailure>, Unavailable>;
}

/// One payment as the channel's own books (its statement) record it: what
/// reconciliation compares the local records with. Only the facts the
/// comparison needs; how a provider stores them is its adapter's business.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatementLine {
    pub payment_id: PaymentId,
    pub order_id: OrderId,
    pub amount: i64,
    pub currency: Currency,
    /// PROCESSING, SUCCEEDED or FAILED at the channel.
    pub status: PaymentStatus,
    /// Set once the channel refunded the payment.
    pub refund_id: Option<String>,
    pub refunded_amount: i64,
    /// When the payment was opened at the channel, if the channel says:
    /// a day's run reports a channel-side discrepancy on the day its
    /// payment was opened.
    pub created_at: Option<Timestamp>,
}

/// The channel's side of reconciliation, as read for one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Statement {
    /// The earliest creation time the statement covers; `None` when it is
    /// the channel's whole ledger. Payments created before it are not in
    /// the statement, so the channel checks skip orders that have one.
    pub since: Option<Timestamp>,
    /// The end (exclusive) of the creation times it covers; `None`: up to
    /// the time it was read.
    pub until: Option<Timestamp>,
    pub lines: Vec<StatementLine>,
}

/// The channel's side of reconciliation.
#[async_trait]
pub trait ChannelStatement: Send + Sync {
    /// The payments and refunds the channel has, as of `now`.
    async fn statement(&self, now: Timestamp) -> Result<Statement, Unavailable>;
    /// The payments opened in `[since, until)`, with their state and
    /// refunds as of now: a day's run reads its own window, not the
    /// channel's whole recent history.
    async fn statement_between(&self, since: Timestamp, until: Timestamp) -> Result<Statement, Unavailable>;
}

/// What the refund worker does with a delivery beyond the refund itself:
/// the backoff between tries and the hand-over to a person.
#[async_trait]
pub trait RefundRetries: Send + Sync {
    /// Makes the delivery identified by `receipt` come back after `after`.
    async fn retry_after(&self, receipt: &str, after: Duration) -> Result<(), Unavailable>;
    /// Sets the message `body` aside for a person (the dead-letter queue).
    async fn hand_to_person(&self, body: String) -> Result<(), Unavailable>;
}
