//! The order store port: every write the domain needs, each one a
//! conditional write or a transaction on the current state and version.
//! Methods return the business answer (applied, refused, already done) as a
//! value; `Err(Unavailable)` is reserved for the store failing to answer.

use crate::domain::*;
use crate::ports::Unavailable;
use async_trait::async_trait;

/// The answer to a compare-and-swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cas {
    Applied,
    /// The record was not in the expected state or version; re-read it.
    Rejected,
}

/// The entities the store reads and writes live in the domain; they are
/// re-exported here, where callers have always found them.
pub use crate::domain::records::{Coupon, CouponLock, Evidence, OrderRecord, PaymentAttempt, Reservation, Stock};
pub use crate::domain::Refund;

/// A row reconciliation could not decode. It is skipped and reported by
/// its key, so that one bad row neither hides the rest of the table nor
/// goes unnoticed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndecodableRow {
    pub pk: String,
    pub sk: String,
    pub error: String,
}

/// What reconciliation reads of the table: every order with what it holds,
/// every SKU's stock row, and the rows that could not be decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableSnapshot {
    pub orders: Vec<OrderRecord>,
    pub stocks: Vec<Stock>,
    /// Every operator change of every SKU (their audit records).
    pub stock_changes: Vec<StockChangeRecord>,
    /// Every buyer's points balance and the credits that made them.
    pub points: Vec<crate::domain::points::PointsBalance>,
    pub points_credits: Vec<crate::domain::points::PointsCredit>,
    pub undecodable: Vec<UndecodableRow>,
}

/// The idempotency record written together with a new order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyClaim {
    pub user_id: UserId,
    pub key: IdempotencyKey,
    /// SHA-256 of the canonical request body, hex.
    pub request_hash: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateResult {
    Created,
    /// The idempotency key was used before.
    Replay {
        order_id: OrderId,
        same_request: bool,
    },
    OutOfStock(Sku),
    /// The SKU's catalog price or currency is no longer the one on the
    /// order's line (it changed after the use case read it); `now` is the
    /// catalog's price at the time of the write, if it has one.
    PriceChanged {
        sku: Sku,
        now: Option<Price>,
    },
    CouponUnavailable,
    /// The buyer's units of `sku` (held by open orders and bought) plus
    /// this order's would pass the SKU's purchase limit.
    PurchaseLimitReached {
        sku: Sku,
        limit: u32,
    },
    /// The buyer's points balance is below the order's points.
    NotEnoughPoints,
    /// The buyer's points are kept in `currency`, not the order's.
    PointsCurrencyMismatch {
        currency: Currency,
    },
    /// The SKU's purchase limit changed after the catalog read (the
    /// order would be checked against a limit no longer in force).
    PurchaseLimitChanged(Sku),
    /// The buyer already has `cap` open orders.
    OpenOrderCapReached {
        cap: u32,
    },
}

/// The bounds a create checks its buyer's holdings against, in the same
/// transaction that takes them: the SKUs' purchase limits as the catalog
/// read gave them, and the open-order cap of the stack.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caps {
    /// At most this many open orders per buyer; `None`: no cap.
    pub open_orders: Option<u32>,
    /// At most this many units per buyer of each SKU listed, open and
    /// bought together.
    pub purchase_limits: std::collections::BTreeMap<Sku, u32>,
}

impl Caps {
    /// Everything `order` holds under these caps (stock, purchase limits,
    /// points, the open-order slot), each RESERVED.
    pub fn holdings(&self, order: &Order) -> Vec<Reservation> {
        let mut held: Vec<Reservation> = order.items.iter().map(|l| Reservation::stock(&l.sku, l.qty)).collect();
        held.extend(
            order
                .items
                .iter()
                .filter(|l| self.purchase_limits.contains_key(&l.sku))
                .map(|l| Reservation::purchase_limit(&order.user_id, &l.sku, l.qty)),
        );
        if order.points > 0 {
            held.push(Reservation::points(&order.user_id, order.points));
        }
        if self.open_orders.is_some() {
            held.push(Reservation::open_order_slot(&order.user_id));
        }
        held
    }
}

/// What an order idempotency key was first used for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedOrder {
    pub order_id: OrderId,
    pub request_hash: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutCoupon {
    Stored,
    /// The coupon is locked by an order; it cannot be overwritten now.
    Locked,
    /// The coupon has an outcome (USED, EXPIRED, VOID); an operator write
    /// never overrides it.
    Final(CouponState),
}

/// The idempotency record of a payment entry (`POST /orders/{id}/payments`),
/// scoped to the order's user and the order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentClaim {
    pub key: IdempotencyKey,
    /// SHA-256 of the canonical request body, hex.
    pub request_hash: String,
}

/// What a payment idempotency key was first used for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedPayment {
    pub payment_id: PaymentId,
    pub request_hash: String,
}

/// The result of moving one reservation or lock: the domain step that was
/// applied, or the refusal the domain gives for the state found.
pub type Moved<S> = Result<Step<S>, Refused>;

#[async_trait]
pub trait OrderStore: Send + Sync {
    /// One transaction: idempotency key, order, every holding of
    /// [`Caps::holdings`] with its counter's move (a stock decrement per
    /// line; a purchase-limit count per limited line; the points; the
    /// open-order slot), and the coupon lock. Each stock decrement is also
    /// conditional on the SKU's catalog price and currency still being the
    /// line's `unit_price` and the order's currency, so an order is never
    /// written at a price the catalog no longer has; each buyer counter on
    /// staying within `caps`.
    async fn create_order(
        &self,
        order: &Order,
        caps: &Caps,
        claim: &IdempotencyClaim,
    ) -> Result<CreateResult, Unavailable>;

    /// The expiry rules in force (the latest published version), read
    /// strongly consistent so that a create right after a publication
    /// uses it; `None` when none was ever published (a store without rules
    /// has none).
    async fn current_expiry_rules(&self) -> Result<Option<crate::domain::expiry_rules::ExpiryRuleSet>, Unavailable> {
        Ok(None)
    }

    /// What the idempotency key of `user_id` was used for, if it was.
    /// Read only to answer a retry that is refused before its transaction.
    async fn claimed_order(&self, user_id: &UserId, key: &IdempotencyKey) -> Result<Option<ClaimedOrder>, Unavailable>;

    /// The order alone, strongly consistent.
    async fn order(&self, order_id: &OrderId) -> Result<Option<Order>, Unavailable>;

    /// The order with everything it holds.
    async fn order_record(&self, order_id: &OrderId) -> Result<Option<OrderRecord>, Unavailable>;

    /// PENDING_PAYMENT → CLOSED, conditional on status, version, no payment
    /// attempt and the order being due (`expire_at <= now`, or its buyer's
    /// cancel request recorded).
    async fn close_unpaid(&self, order: &Order, now: Timestamp) -> Result<Cas, Unavailable>;

    /// PENDING_PAYMENT (due) or CLOSING (lease expired) → CLOSING with `lease`.
    async fn begin_closing(&self, order: &Order, lease: &ClosingLease, now: Timestamp) -> Result<Cas, Unavailable>;

    /// The buyer asked to cancel an open order whose window has not ended:
    /// records when. From then on the order is due, for the close use case
    /// and (its due time in the index moved to `now`) for the sweep, and no
    /// new payment may start. Conditional on PENDING_PAYMENT, the version
    /// read, `expire_at > now` and no earlier request; bumps the version, so
    /// a payment start that read the order before is refused and re-reads.
    async fn request_cancel(&self, order: &Order, now: Timestamp) -> Result<Cas, Unavailable>;

    /// A closer that cannot decide yet (payment state unknown) keeps the
    /// order CLOSING and moves its lease (and its due time in the index) to
    /// `until`, when its own reminder resumes it. Until then every other
    /// reminder finds the lease held and ends, so one order has one live
    /// reminder chain. Conditional on the version and owner it holds.
    async fn hold_closing(&self, order: &Order, until: Timestamp) -> Result<Cas, Unavailable>;

    /// A read found `order` open and due (past `expire_at`, or its buyer
    /// asked to cancel): notes that it asks for a
    /// close reminder, at most once per `every`. Applied means "send one".
    /// Touches neither status nor version (the read path decides nothing).
    async fn note_lazy_reminder(
        &self,
        order: &Order,
        now: Timestamp,
        every: std::time::Duration,
    ) -> Result<Cas, Unavailable>;

    /// An early reminder is about to be put back until `until`: notes it on
    /// the order, unless another put-back reminder is still on its way (one
    /// noted with a later time). Applied means "send it"; rejected means
    /// this reminder is a duplicate and ends. Status and version untouched.
    async fn note_early_reminder(&self, order: &Order, until: Timestamp, now: Timestamp) -> Result<Cas, Unavailable>;

    /// Records an operator check beside the order (its own item).
    async fn record_check(&self, order_id: &OrderId, check: &OperatorCheck) -> Result<Cas, Unavailable>;

    /// The order's effects (stock, coupon) are all settled: its entry leaves
    /// the effects part of the due index. Conditional on the final `status`.
    async fn effects_done(&self, order_id: &OrderId, status: OrderStatus) -> Result<Cas, Unavailable>;

    /// CLOSING → CLOSED, conditional on the version and lease owner the
    /// closer holds.
    async fn close_after_check(&self, order: &Order, now: Timestamp, cause: &str) -> Result<Cas, Unavailable>;

    /// RESERVED → RELEASED and stock back, in one transaction.
    async fn release_reservation(
        &self,
        order_id: &OrderId,
        reservation: &Reservation,
        now: Timestamp,
    ) -> Result<Moved<ReservationStatus>, Unavailable>;

    /// RESERVED → CONFIRMED and the reserved count drops (the stock is sold).
    async fn confirm_reservation(
        &self,
        order_id: &OrderId,
        reservation: &Reservation,
        now: Timestamp,
    ) -> Result<Moved<ReservationStatus>, Unavailable>;

    /// LOCKED → `to` on the order's lock and on the coupon, in one transaction.
    async fn end_coupon_lock(
        &self,
        order_id: &OrderId,
        coupon_id: &CouponId,
        to: CouponLockStatus,
        reason: &str,
        now: Timestamp,
    ) -> Result<Moved<CouponLockStatus>, Unavailable>;

    async fn stock(&self, sku: &Sku) -> Result<Option<Stock>, Unavailable>;
    /// The stock records of `skus` (strongly consistent), for the catalog
    /// prices; a SKU that does not exist is absent from the answer.
    async fn stocks(&self, skus: &[Sku]) -> Result<Vec<Stock>, Unavailable>;
    async fn put_coupon(&self, coupon: &Coupon) -> Result<PutCoupon, Unavailable>;
    async fn coupon(&self, coupon_id: &CouponId) -> Result<Option<Coupon>, Unavailable>;
}

/// Where a payment fact came from, for the idempotent write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    pub channel: ChannelName,
    pub notify_id: String,
}

/// The outcome of recording a trusted payment success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettleResult {
    /// The order went to PAID.
    Paid,
    /// Already recorded (same notification, or the order is PAID by this
    /// payment): nothing changed.
    Duplicate,
    /// The order is final without this payment: the success is recorded and
    /// exactly one refund exists for it.
    RefundPending,
    /// The order changed under us; re-read it and decide again.
    OrderMoved,
    /// The channel transaction id is already bound to another payment.
    TxnIdTaken,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    Recorded,
    /// The order is no longer PENDING_PAYMENT, its `expire_at` passed, it
    /// holds the maximum number of attempts, or its version moved.
    NotPayable(Box<Order>),
    NotFound,
    /// The idempotency key was used before (a concurrent or earlier call).
    Replay(ClaimedPayment),
}

#[async_trait]
pub trait PaymentStore: Send + Sync {
    /// Adds a payment attempt, conditional on the order being
    /// PENDING_PAYMENT with `expire_at > now` at its current version.
    /// Also conditional on `payment_attempts < MAX_PAYMENT_ATTEMPTS`.
    async fn record_attempt(&self, order: &Order, attempt: &PaymentAttempt) -> Result<AttemptResult, Unavailable> {
        self.record_keyed_attempt(order, attempt, None).await
    }

    /// [`Self::record_attempt`] plus, in the same transaction, the payment
    /// idempotency key (`attribute_not_exists`); a key already used comes
    /// back as [`AttemptResult::Replay`].
    async fn record_keyed_attempt(
        &self,
        order: &Order,
        attempt: &PaymentAttempt,
        claim: Option<&PaymentClaim>,
    ) -> Result<AttemptResult, Unavailable>;

    /// The payment a key was first used for on this order, if any.
    async fn claimed_payment(&self, order: &Order, key: &IdempotencyKey)
        -> Result<Option<ClaimedPayment>, Unavailable>;

    /// The attempt and the id of its order.
    async fn attempt(&self, payment_id: &PaymentId) -> Result<Option<PaymentAttempt>, Unavailable>;

    /// Records the channel's own id of an attempt (a PaymentIntent id),
    /// conditional on the attempt being PROCESSING and having no other id:
    /// an attempt concluded meanwhile (closed as never paid) is not handed
    /// a payable id afterwards. The same id again is `Applied`.
    async fn record_channel_ref(&self, attempt: &PaymentAttempt, channel_ref: &str) -> Result<Cas, Unavailable>;

    /// Records a trusted success. `order` is the state the caller decided
    /// on: when it is PENDING_PAYMENT or CLOSING the order goes to PAID in
    /// the same transaction; when it is final, a refund is created instead.
    async fn settle_success(
        &self,
        order: &Order,
        payment: &PaymentAttempt,
        channel_txn_id: &str,
        evidence: Evidence,
        notification: Option<&Notification>,
        refund_notice: &str,
    ) -> Result<SettleResult, Unavailable>;

    /// Records a non-success fact (FAILED, or UNKNOWN evidence) on an attempt
    /// that is not yet settled. Returns false when it was already settled
    /// differently or the notification was seen.
    async fn record_payment_fact(
        &self,
        payment: &PaymentAttempt,
        status: PaymentStatus,
        evidence: Evidence,
        notification: Option<&Notification>,
    ) -> Result<bool, Unavailable>;

    /// One refund, in whatever status it is.
    async fn refund(&self, order_id: &OrderId, payment_id: &PaymentId) -> Result<Option<Refund>, Unavailable>;

    /// Moves a refund from the status it was read in (`refund.status`) to
    /// `to` — REFUNDED, REFUND_FAILED, or the same status — and with `error`
    /// counts a failed try. Rejected if the status changed meanwhile or,
    /// when counting, if `tries` is no longer `refund.tries`. Leaving
    /// REFUND_PENDING also takes the refund out of the due index.
    async fn update_refund(
        &self,
        refund: &Refund,
        to: RefundStatus,
        channel_refund_id: Option<&str>,
        error: Option<&str>,
        now: Timestamp,
    ) -> Result<Cas, Unavailable>;

    /// The refunds given up on (REFUND_FAILED) that no person has resolved:
    /// each keeps an entry in the due index's failed refunds' partition,
    /// which the sweep counts (the `RefundsFailed` alarm) and never
    /// re-drives, until the refund is REFUNDED or resolved.
    async fn failed_refunds(&self) -> Result<Vec<(OrderId, PaymentId)>, Unavailable>;

    /// A person's resolution of a REFUND_FAILED refund (refunded by hand at
    /// the provider, or found not owed): it leaves the failed refunds'
    /// partition, keeps its status, and records who, when and why.
    /// Rejected if it is not REFUND_FAILED or was resolved already.
    async fn resolve_failed_refund(
        &self,
        refund: &Refund,
        by: &str,
        note: &str,
        now: Timestamp,
    ) -> Result<Cas, Unavailable>;

    /// The backstop's re-drive of a REFUND_PENDING refund: pushes its
    /// `due_at` to `now + REFUND_REDRIVE_AFTER`, so the sweep that re-sends
    /// it to the refund queue finds it again only after a whole retry
    /// budget. Rejected if the refund is not REFUND_PENDING any more, or
    /// not due any more (another delivery of the same re-drive pushed it).
    async fn redrive_refund(&self, refund: &Refund, now: Timestamp) -> Result<Cas, Unavailable>;

    /// Undoes the [`PaymentStore::redrive_refund`] made at `pushed_at` whose
    /// request to the refund worker then failed: the refund is due again
    /// from `pushed_at` (it was due then), so the redelivery of the same
    /// re-drive sends it. Rejected if the budget is no longer the one that
    /// push set (another re-drive, or the refund left REFUND_PENDING).
    async fn undo_refund_redrive(&self, refund: &Refund, pushed_at: Timestamp) -> Result<Cas, Unavailable>;

    /// Every order in the table, page by page. Fails on the first row it
    /// cannot decode; reconciliation uses [`Self::scan_snapshot`].
    async fn scan_order_records(&self) -> Result<Vec<OrderRecord>, Unavailable>;

    /// Every order record and every stock row, page by page, for
    /// reconciliation. A row that does not decode is skipped and listed in
    /// `undecodable` (an order row takes its whole order with it); only the
    /// store failing to answer is an error.
    async fn scan_snapshot(&self) -> Result<TableSnapshot, Unavailable>;
}

/// What a due-index entry points at (the index is KEYS_ONLY: its key says
/// which record it is, nothing else).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DueItem {
    /// An open order (PENDING_PAYMENT past `expire_at`, or CLOSING past its
    /// lease): the close use case must look at it.
    Open(OrderId),
    /// A final order whose stock or coupon is not settled yet.
    OrderEffects(OrderId),
    /// A refund still REFUND_PENDING.
    Refund(OrderId, PaymentId),
    /// A key this code does not know: reported, never acted on.
    Unrecognised { pk: String, sk: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueEntry {
    pub item: DueItem,
    pub due_at: Timestamp,
    /// The entry's index key: a cursor that continues right after it.
    pub key: DueCursor,
}

/// Where a paginated read of one shard stopped (DynamoDB's
/// `LastEvaluatedKey`, all string attributes).
pub type DueCursor = std::collections::BTreeMap<String, String>;

/// One line of a buyer's order list: what the buyer needs to act on it,
/// as the buyer index projects it (no lines, payments or history).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct OrderSummary {
    pub order_id: OrderId,
    pub status: OrderStatus,
    pub created_at: Timestamp,
    pub expire_at: Timestamp,
    pub amount_total: i64,
    pub currency: Currency,
    #[serde(default)]
    pub cancel_requested_at: Option<Timestamp>,
}

/// One page of a buyer's orders, newest first, and where the next starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuyerOrdersPage {
    pub orders: Vec<OrderSummary>,
    /// The index key to start the next page after; `None` on the last page.
    pub next: Option<DueCursor>,
}

/// A buyer's own orders, by the buyer index (`user_id`, `created_at`): a
/// `Query` of one buyer's partition, never a Scan and never an offset.
#[async_trait]
pub trait BuyerOrders: Send + Sync {
    /// Up to `limit` of `user`'s orders created before the cursor `after`
    /// (from the newest when `None`), only those in `status` when given. A
    /// filtered page may hold fewer than `limit` orders and still have a
    /// next one: DynamoDB applies `limit` before the filter.
    async fn buyer_orders(
        &self,
        user: &UserId,
        status: Option<OrderStatus>,
        limit: u32,
        after: Option<DueCursor>,
    ) -> Result<BuyerOrdersPage, Unavailable>;
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct DuePage {
    pub entries: Vec<DueEntry>,
    /// Set when the shard has more entries at or before the cutoff.
    pub next: Option<DueCursor>,
    /// Read capacity the query consumed, as DynamoDB reports it.
    pub consumed_capacity: f64,
}

/// The sweep's own progress: per shard, the key the last unfinished run
/// stopped at. Versioned, so two overlapping runs cannot interleave writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepCursors {
    pub version: u64,
    pub shards: std::collections::BTreeMap<String, DueCursor>,
}

/// Why a page of the due index was not read.
#[derive(Debug, thiserror::Error)]
pub enum DuePageError {
    /// The service refused the start key as invalid for this query: outside
    /// its key condition (the cutoff is now before the stored key, e.g.
    /// `SweepGraceSeconds` was raised since it was stored) or not a key of
    /// the index at all. The same query from the top is valid, so the key
    /// is dropped, never retried.
    #[error("start key refused: {0}")]
    CursorRejected(Unavailable),
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
}

impl From<DuePageError> for Unavailable {
    fn from(e: DuePageError) -> Self {
        match e {
            DuePageError::CursorRejected(e) | DuePageError::Unavailable(e) => e,
        }
    }
}

/// The due index: open orders and pending effects, by shard and due time.
#[async_trait]
pub trait DueIndex: Send + Sync {
    /// The shard names the sweep must cover (open and effects, every shard
    /// any live entry may have been written under).
    fn shards(&self) -> Vec<String>;
    /// Whether `shard` (one of [`Self::shards`]) holds open orders, whose
    /// due time the sweep gives a grace, rather than pending effects, whose
    /// due time already includes theirs.
    fn is_open_shard(&self, shard: &str) -> bool;
    /// Entries of `shard` with `due_at <= cutoff`, oldest first, at most
    /// `limit`, continuing after `start` ([`DuePageError::CursorRejected`]
    /// when the service refuses `start`).
    async fn due_page(
        &self,
        shard: &str,
        cutoff: Timestamp,
        limit: u32,
        start: Option<DueCursor>,
    ) -> Result<DuePage, DuePageError>;
    /// Moves an order's entry (found by the sweep in `shard`) to `until`,
    /// if it is still where the sweep found it: a close reminder, or a
    /// message with its pending effects, is on its way, so the next runs
    /// leave the order to it until then. Rejected when the order moved
    /// meanwhile (final, paid, a closer took or held its lease, its effects
    /// were done: each of which sets or removes the entry itself).
    /// `Some(due)` when moved: the due time the order's own writes gave
    /// it (`expire_at` while PENDING_PAYMENT, the lease's end while
    /// CLOSING, the effects grace after the final write while CLOSED or
    /// PAID), which a snooze does not restart, so that the sweep's
    /// oldest-overdue figures keep growing for an order reminded and left
    /// open or whose effects keep failing. `None` when refused.
    async fn snooze(&self, shard: &str, entry: &DueEntry, until: Timestamp) -> Result<Option<Timestamp>, Unavailable>;
    async fn sweep_cursors(&self) -> Result<SweepCursors, Unavailable>;
    /// Stores `cursors` if the stored version is still `cursors.version`.
    async fn save_sweep_cursors(&self, cursors: &SweepCursors) -> Result<Cas, Unavailable>;
}

/// What became of an operator's stock change ([`StockLedger::change_stock`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StockWritten {
    /// The change and its record were written.
    Applied,
    /// A change with this idempotency key was applied before (by an
    /// earlier request, or by this one whose answer was lost): its record.
    KeyUsed(StockChangeRecord),
    /// The SKU no longer allows the change as planned: the SKU as it is
    /// now (`None`: it does not exist), to plan it again from.
    Moved(Option<Stock>),
}

/// The heads-up before expiry ([`crate::usecases::expiring_soon`]): the
/// open orders due in a range of the due index, and the one conditional
/// write that notices an order.
#[async_trait]
pub trait ExpiringSoonNotices: Send + Sync {
    /// One page of an OPEN shard's entries due in `[after, through]`,
    /// oldest first.
    async fn due_between(
        &self,
        shard: &str,
        after: Timestamp,
        through: Timestamp,
        limit: u32,
        start: Option<DueCursor>,
    ) -> Result<DuePage, Unavailable>;
    /// Sets the order's `expiring_soon_at` to `now`, only if it is still
    /// waiting for payment with no cancel asked, was never noticed, still
    /// expires at `expire_at` (which is after `now`), and was created at
    /// or before `latest_created` (its window is long enough for a
    /// notice). `Rejected` otherwise: nothing is written, and a second
    /// notice of the same order is impossible. Leaves `version` as it is.
    async fn notice_expiring_soon(
        &self,
        order_id: &OrderId,
        expire_at: Timestamp,
        latest_created: Timestamp,
        now: Timestamp,
    ) -> Result<Cas, Unavailable>;
}

/// The published versions of the expiry rules
/// ([`crate::domain::expiry_rules`]).
#[async_trait]
pub trait ExpiryRuleStore: Send + Sync {
    /// Publishes `set` as its version, only if the version in force is
    /// still the one before it (none for version 1): `Rejected` when
    /// another publication came first. The version's record and the
    /// pointer to it are written in one transaction; neither is ever
    /// changed after.
    async fn publish_expiry_rules(&self, set: &crate::domain::expiry_rules::ExpiryRuleSet) -> Result<Cas, Unavailable>;
    /// A published version, whether in force or not.
    async fn expiry_rules_version(
        &self,
        version: u64,
    ) -> Result<Option<crate::domain::expiry_rules::ExpiryRuleSet>, Unavailable>;
}

/// What became of an operator's points credit ([`PointsLedger::credit_points`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PointsWritten {
    /// The credit and its record were written.
    Applied,
    /// A credit with this key was applied before: its record.
    KeyUsed(crate::domain::points::PointsCredit),
    /// A debit larger than the available points (`available` as found).
    Insufficient { available: i64 },
    /// The balance is kept in another currency (the one found).
    CurrencyMismatch { currency: Currency },
}

/// Operators' credits of buyers' points, each written with its audit
/// record (see [`crate::domain::points`]).
#[async_trait]
pub trait PointsLedger: Send + Sync {
    /// The credit and its record in one transaction: the record only if
    /// its key was never used for the buyer, a debit only while the
    /// buyer's available points cover it.
    async fn credit_points(&self, credit: &crate::domain::points::PointsCredit) -> Result<PointsWritten, Unavailable>;
    /// The credit made with `key`, if there was one.
    async fn points_credit(
        &self,
        user: &UserId,
        key: &IdempotencyKey,
    ) -> Result<Option<crate::domain::points::PointsCredit>, Unavailable>;
    async fn points_balance(&self, user: &UserId) -> Result<Option<crate::domain::points::PointsBalance>, Unavailable>;
    /// Every credit of the buyer, oldest first.
    async fn points_credits(&self, user: &UserId) -> Result<Vec<crate::domain::points::PointsCredit>, Unavailable>;
}

/// Operators' changes of the catalog, each written with its audit record
/// (see [`crate::domain::catalog`]).
#[async_trait]
pub trait StockLedger: Send + Sync {
    /// Writes `change` (planned by [`crate::domain::catalog::plan`] from
    /// the SKU as read) and its record in one transaction: a seed only if
    /// the SKU does not exist, any other change only if its own condition
    /// still holds (a swap's count, an adjustment's `available + d >= 0`);
    /// the record only if its key was never used for the SKU.
    async fn change_stock(&self, change: &StockChangeRecord) -> Result<StockWritten, Unavailable>;
    /// The record of the change made with `key`, if there was one.
    async fn stock_change(&self, sku: &Sku, key: &IdempotencyKey) -> Result<Option<StockChangeRecord>, Unavailable>;
    /// Every change of the SKU (in no order: see
    /// [`crate::domain::catalog::with_supply`]).
    async fn stock_changes(&self, sku: &Sku) -> Result<Vec<StockChangeRecord>, Unavailable>;
}

/// What a read cost: the items DynamoDB returned and the read capacity it
/// says it consumed. A day's run adds these up, so that its cost can be
/// shown to follow the day's traffic and not the table's history.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReadCost {
    pub items: u64,
    pub capacity_units: f64,
}

impl ReadCost {
    pub fn add(&mut self, other: ReadCost) {
        self.items += other.items;
        self.capacity_units += other.capacity_units;
    }
}

/// One page of a sparse index partition: the table keys (`pk`, `sk`) of
/// its entries, and where the next page starts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IndexPage {
    pub keys: Vec<(String, String)>,
    pub next: Option<DueCursor>,
    pub cost: ReadCost,
}

/// Order records read by key, with the rows that did not decode.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordsRead {
    pub records: Vec<OrderRecord>,
    pub undecodable: Vec<UndecodableRow>,
    pub cost: ReadCost,
}

/// A SKU as the catalog piece reads it: its row (if any) and its audit
/// records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CatalogEntry {
    pub stock: Option<Stock>,
    pub changes: Vec<StockChangeRecord>,
    pub cost: ReadCost,
}

/// What a day's reconciliation reads: index partitions, then records by
/// key. Nothing here scans.
#[async_trait]
pub trait DayIndex: Send + Sync {
    /// A page of reconcile-index partition `part` (a day's shard
    /// `<YYYY-MM-DD>#<n>`, or the catalog's).
    async fn reconcile_page(&self, part: &str, limit: u32, start: Option<DueCursor>) -> Result<IndexPage, Unavailable>;
    /// A page of due-index partition `shard` (`OPEN#<n>`, `FX#<n>`), every
    /// entry whatever its due time: the records in flight.
    async fn in_flight_page(&self, shard: &str, limit: u32, start: Option<DueCursor>)
        -> Result<IndexPage, Unavailable>;
    /// The records of `orders`, each read by a query of its own partition.
    async fn order_records(&self, orders: &[OrderId]) -> Result<RecordsRead, Unavailable>;
    /// A SKU's row and audit records.
    async fn catalog_entry(&self, sku: &Sku) -> Result<CatalogEntry, Unavailable>;
    /// A buyer's points balance and its audited credits, as of one moment.
    async fn points_entry(&self, user: &UserId) -> Result<PointsEntry, Unavailable>;
}

/// A buyer's points balance and credits as the day run read them.
#[derive(Debug, Clone, PartialEq)]
pub struct PointsEntry {
    pub balance: Option<crate::domain::points::PointsBalance>,
    pub credits: Vec<crate::domain::points::PointsCredit>,
    pub cost: ReadCost,
}

/// Where a day's runs, their pieces' partial reports and the merged
/// reports are kept. Every write is a conditional put of a new item, so a
/// piece that runs twice (a redelivery) stores its report once.
#[async_trait]
pub trait DayRuns: Send + Sync {
    /// Records a run and the pieces it expects; `Rejected` if that run
    /// id exists.
    async fn start_run(&self, run: &crate::usecases::reconcile_day::DayRun) -> Result<Cas, Unavailable>;
    /// A run of `day` by id, or the latest one (`None` id).
    async fn day_run(
        &self,
        day: Day,
        run_id: Option<&str>,
    ) -> Result<Option<crate::usecases::reconcile_day::DayRun>, Unavailable>;
    /// Stores a piece's report; `Rejected`: it was stored before.
    async fn save_part(&self, part: &crate::usecases::reconcile_day::PartialReport) -> Result<Cas, Unavailable>;
    /// The pieces' reports stored for a run.
    async fn parts(
        &self,
        day: Day,
        run_id: &str,
    ) -> Result<Vec<crate::usecases::reconcile_day::PartialReport>, Unavailable>;
    /// Stores the merged report of a complete run; `Rejected`: stored before.
    async fn save_report(&self, report: &crate::usecases::reconcile_day::DayReport) -> Result<Cas, Unavailable>;
}
