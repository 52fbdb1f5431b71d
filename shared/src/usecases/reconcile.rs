//! Reconciliation (docs/design.md#reconciliation): cross-checks orders,
//! payment attempts, refunds, reservations and stock against each other
//! and against the channel's own ledger, and reports every discrepancy by
//! kind. It only reads.

use crate::domain::*;
use crate::ports::{Statement, StatementLine};
use crate::store::{OrderRecord, PaymentAttempt, TableSnapshot};
use crate::usecases::refunds::REFUND_REDRIVE_AFTER;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

/// Declares [`DiscrepancyKind`] from one table, so that its variants, their
/// wire names and which of them need the channel's data cannot drift apart.
macro_rules! discrepancy_kinds {
    ($($(#[doc = $doc:literal])* $variant:ident = $name:literal, $needs:ident;)+) => {
        /// Every kind of discrepancy the report can hold. Its wire name
        /// ([`DiscrepancyKind::as_str`]) is the report's `kind` and the key
        /// of its `counts`; its metric is `Discrepancy.<name>`
        /// ([`DiscrepancyKind::metric_name`], `metrics::DISCREPANCIES`), each
        /// with its alarm `Discrepancy<Name>Alarm` and that alarm's runbook
        /// entry (`tests/tests/discrepancy_kinds.rs` holds the template and
        /// `docs/runbooks.md` to this list). Compared, ordered, hashed,
        /// shown and (de)serialised as its wire name.
        #[derive(Clone, Copy, PartialEq, Eq)]
        pub enum DiscrepancyKind {
            $($(#[doc = $doc])* $variant,)+
        }

        impl DiscrepancyKind {
            /// How many kinds there are.
            pub const COUNT: usize = [$($name),+].len();
            /// Every kind, in declaration order.
            pub const ALL: [DiscrepancyKind; Self::COUNT] = [$(DiscrepancyKind::$variant),+];

            /// The wire name: `amount_mismatch`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(DiscrepancyKind::$variant => $name,)+
                }
            }

            /// The metric's name: `Discrepancy.amount_mismatch`.
            pub const fn metric_name(self) -> &'static str {
                match self {
                    $(DiscrepancyKind::$variant => concat!("Discrepancy.", $name),)+
                }
            }

            /// Whether only the channel's statement can show it (without
            /// one, a run reports the other kinds alone).
            pub const fn needs_channel(self) -> bool {
                match self {
                    $(DiscrepancyKind::$variant => discrepancy_kinds!(@needs $needs),)+
                }
            }
        }
    };
    (@needs channel) => { true };
    (@needs local) => { false };
}

discrepancy_kinds! {
    /// The channel took money for an order that is not PAID (or that the
    /// table does not have).
    ChannelSuccessOrderUnpaid = "channel_success_order_unpaid", channel;
    /// A PAID order without a success at the channel for its payment.
    OrderPaidWithoutChannelSuccess = "order_paid_without_channel_success", channel;
    /// The channel's amount or currency is not the attempt's.
    AmountMismatch = "amount_mismatch", channel;
    /// Money taken for a final order that is not its payment, unrefunded.
    SuccessAfterCloseWithoutRefund = "success_after_close_without_refund", channel;
    /// A refund's state differs between the table and the channel.
    RefundStateMismatch = "refund_state_mismatch", channel;
    /// A PAID order whose stock was handed back.
    ReservationReleasedOnPaidOrder = "reservation_released_on_paid_order", local;
    /// Paid − refunded is not what the final order's outcome says.
    FundsIdentityViolation = "funds_identity_violation", channel;
    /// A CLOSED order still holding RESERVED stock past the effects' bound.
    ReservationHeldOnClosedOrder = "reservation_held_on_closed_order", local;
    /// A CLOSED order still holding its coupon lock past the effects' bound.
    CouponLockedOnClosedOrder = "coupon_locked_on_closed_order", local;
    /// A PAID order whose reservation is still RESERVED past the bound.
    ReservationUnconfirmedOnPaidOrder = "reservation_unconfirmed_on_paid_order", local;
    /// An order still open past `expire_at` and [`Bounds::open_past_expiry`].
    OrderOpenPastExpiry = "order_open_past_expiry", local;
    /// A refund REFUND_PENDING past its redrive bound.
    RefundPendingStale = "refund_pending_stale", local;
    /// A SKU's `reserved` is not the sum of its RESERVED reservations.
    StockReservedMismatch = "stock_reserved_mismatch", local;
    /// A SKU's counts disagree with its audited changes.
    StockSupplyMismatch = "stock_supply_mismatch", local;
    /// A points balance disagrees with its credits or its open orders.
    PointsBalanceMismatch = "points_balance_mismatch", local;
    /// A table row that does not decode.
    UndecodableRecord = "undecodable_record", local;
}

impl DiscrepancyKind {
    /// The kind of a wire name, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

/// The wire name, padded like a `&str` (`{:<40}` lines up a table as the
/// string kinds did).
impl std::fmt::Display for DiscrepancyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// As the wire name's, so that a report's `{:?}` (its log line's `counts`)
/// reads as it did when the kinds were strings.
impl std::fmt::Debug for DiscrepancyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// By wire name: `counts` iterates, and merged reports sort, as they did
/// when the kinds were strings.
impl Ord for DiscrepancyKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for DiscrepancyKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::hash::Hash for DiscrepancyKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

/// `counts["amount_mismatch"]`: consistent with `Ord` and `Hash`, which go
/// by the wire name too.
impl std::borrow::Borrow<str> for DiscrepancyKind {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq<str> for DiscrepancyKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for DiscrepancyKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for DiscrepancyKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A kind is read back (a day run's stored partial report) as one of this
/// list: a name this code does not know is an error, not a new kind.
impl<'de> Deserialize<'de> for DiscrepancyKind {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(de)?;
        Self::parse(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown discrepancy kind {:?}", name.as_ref())))
    }
}

/// How late is too late. States that are normal for a short while (an
/// order past `expire_at` whose close is on its way, a final order whose
/// release or settle has not run yet) are reported only once they have
/// lasted longer than these bounds, so that a run never alarms on work in
/// flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// An order still PENDING_PAYMENT or CLOSING this long after its
    /// `expire_at` is reported (`order_open_past_expiry`).
    pub open_past_expiry: Duration,
    /// A final order still holding a reservation or coupon lock this long
    /// after it became final is reported.
    pub effects_pending: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Self { open_past_expiry: Duration::from_secs(3600), effects_pending: Duration::from_secs(900) }
    }
}

impl Bounds {
    /// `RECONCILE_OPEN_PAST_EXPIRY_SECONDS` and
    /// `RECONCILE_EFFECTS_PENDING_SECONDS`, each defaulting as above.
    pub fn from_env() -> Result<Self, BoundNotSeconds> {
        let read = |name: &'static str, default: Duration| match std::env::var(name) {
            Err(_) => Ok(default),
            Ok(v) => v.trim().parse::<u64>().map(Duration::from_secs).map_err(|_| BoundNotSeconds { name, value: v }),
        };
        let d = Self::default();
        Ok(Self {
            open_past_expiry: read("RECONCILE_OPEN_PAST_EXPIRY_SECONDS", d.open_past_expiry)?,
            effects_pending: read("RECONCILE_EFFECTS_PENDING_SECONDS", d.effects_pending)?,
        })
    }
}

/// A bound's environment variable that is not whole seconds: the function
/// refuses to start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable {name} must be whole seconds, got {value:?}")]
pub struct BoundNotSeconds {
    pub name: &'static str,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discrepancy {
    pub kind: DiscrepancyKind,
    /// Empty for the kinds that are not about one order (stock, rows).
    pub order_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_id: Option<String>,
    /// The table key (`pk/sk`) for the kinds that are about a row rather
    /// than an order: a stock row, an undecodable row.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub orders_checked: usize,
    /// False when no channel ledger was available: only local checks ran.
    pub channel_checked: bool,
    pub payments_checked: usize,
    /// Orders whose refunds are still REFUND_PENDING and younger than
    /// `REFUND_REDRIVE_AFTER`: the funds identity is checked once they
    /// drain. An older pending refund is stale: reported, and no longer a
    /// reason to defer the identity.
    pub refunds_pending: usize,
    /// Orders with a payment attempt older than the channel statement's
    /// window: their local checks ran, the channel comparison did not.
    pub orders_outside_statement: usize,
    pub stocks_checked: usize,
    pub counts: BTreeMap<DiscrepancyKind, usize>,
    pub discrepancies: Vec<Discrepancy>,
}

/// When the order reached its current status: the last history entry into
/// it (`expire_at` for records written without history).
fn status_since(o: &Order) -> Timestamp {
    o.history.iter().rev().find(|h| h.to == o.status).map(|h| h.at).unwrap_or(o.expire_at)
}

/// The checks that need only the records: resources a final order should
/// no longer hold, orders left open, refunds left pending.
pub(crate) fn local_checks(r: &OrderRecord, bounds: &Bounds, now: Timestamp, out: &mut Vec<Discrepancy>) {
    let o = &r.order;
    let mut push = |kind, detail: String| {
        out.push(Discrepancy { kind, order_id: o.order_id.to_string(), payment_id: None, key: None, detail })
    };
    let effects_overdue = status_since(o).plus(bounds.effects_pending) <= now;
    let held = || r.reservations.iter().filter(|x| x.status == ReservationStatus::Reserved);
    match o.status {
        OrderStatus::Closed if effects_overdue => {
            for res in held() {
                push(DiscrepancyKind::ReservationHeldOnClosedOrder, format!("{} still RESERVED", res.label()));
            }
            if let Some(lock) = r.coupon_lock.as_ref().filter(|l| l.status == CouponLockStatus::Locked) {
                push(DiscrepancyKind::CouponLockedOnClosedOrder, format!("coupon {} still LOCKED", lock.coupon_id));
            }
        }
        OrderStatus::Paid if effects_overdue => {
            for res in held() {
                push(
                    DiscrepancyKind::ReservationUnconfirmedOnPaidOrder,
                    format!("{} RESERVED, not CONFIRMED", res.label()),
                );
            }
        }
        OrderStatus::PendingPayment | OrderStatus::Closing if o.expire_at.plus(bounds.open_past_expiry) < now => push(
            DiscrepancyKind::OrderOpenPastExpiry,
            format!(
                "{} since expire_at {} (bound {} s)",
                o.status.as_str(),
                o.expire_at,
                bounds.open_past_expiry.as_secs()
            ),
        ),
        _ => {}
    }
    for f in r.refunds.iter().filter(|f| refund_is_stale(f, now)) {
        out.push(Discrepancy {
            kind: DiscrepancyKind::RefundPendingStale,
            order_id: o.order_id.to_string(),
            payment_id: Some(f.payment_id.to_string()),
            key: None,
            detail: format!("REFUND_PENDING since {} after {} tries", f.created_at, f.tries),
        });
    }
}

pub(crate) fn refund_is_stale(f: &crate::store::Refund, now: Timestamp) -> bool {
    f.status == RefundStatus::RefundPending && f.created_at.plus(REFUND_REDRIVE_AFTER) <= now
}

/// Each SKU's counts against its operators' audited changes: the records
/// numbered without a gap, adding up to `supplied`, and `available +
/// reserved + sold` equal to it (orders never create or destroy a unit).
pub(crate) fn supply_checks(snapshot: &TableSnapshot, out: &mut Vec<Discrepancy>) {
    let mut changes: BTreeMap<&str, Vec<crate::domain::StockChangeRecord>> = BTreeMap::new();
    for c in &snapshot.stock_changes {
        changes.entry(c.sku.as_str()).or_default().push(c.clone());
    }
    for stock in &snapshot.stocks {
        let records = changes.remove(stock.sku.as_str()).unwrap_or_default();
        for detail in crate::domain::catalog::audit_disagreements(stock, &records) {
            out.push(Discrepancy {
                kind: DiscrepancyKind::StockSupplyMismatch,
                order_id: String::new(),
                payment_id: None,
                key: Some(format!("SKU#{}/STOCK", stock.sku)),
                detail,
            });
        }
    }
    // Records of a SKU whose stock row is gone.
    for (sku, records) in changes {
        out.push(Discrepancy {
            kind: DiscrepancyKind::StockSupplyMismatch,
            order_id: String::new(),
            payment_id: None,
            key: Some(format!("SKU#{sku}/STOCK")),
            detail: format!("{} audit records but no stock row", records.len()),
        });
    }
}

/// RESERVED points per buyer over `records`.
pub(crate) fn points_held<'r>(records: impl Iterator<Item = &'r OrderRecord>) -> BTreeMap<String, i64> {
    let mut held = BTreeMap::new();
    for r in records {
        for res in r.reservations.iter() {
            if res.status == ReservationStatus::Reserved && res.resource_type == ResourceType::Points {
                *held.entry(res.resource_key.clone()).or_default() += i64::from(res.qty);
            }
        }
    }
    held
}

/// Each points balance against its audited credits (`available + held +
/// spent = credited`, the records add up to `credited`), and its `held`
/// against the points its buyer's open orders hold (`held_by_orders`, per
/// user id; a buyer whose orders hold points without a balance counts as
/// held 0).
pub(crate) fn points_checks(
    balances: &[crate::domain::points::PointsBalance],
    credits: &[crate::domain::points::PointsCredit],
    held_by_orders: &BTreeMap<String, i64>,
    out: &mut Vec<Discrepancy>,
) {
    let push = |out: &mut Vec<Discrepancy>, user: &str, detail: String| {
        out.push(Discrepancy {
            kind: DiscrepancyKind::PointsBalanceMismatch,
            order_id: String::new(),
            payment_id: None,
            key: Some(format!("BUYER#{user}/POINTS")),
            detail,
        })
    };
    for b in balances {
        let records: Vec<_> = credits.iter().filter(|c| c.user_id == b.user_id).cloned().collect();
        for detail in crate::domain::points::audit_disagreements(b, &records) {
            push(out, b.user_id.as_str(), detail);
        }
        let by_orders = held_by_orders.get(b.user_id.as_str()).copied().unwrap_or(0);
        if b.held != by_orders {
            push(out, b.user_id.as_str(), format!("held {}, the open orders hold {by_orders} points", b.held));
        }
    }
    for (user, by_orders) in held_by_orders {
        if *by_orders != 0 && !balances.iter().any(|b| b.user_id.as_str() == user) {
            push(out, user, format!("no balance, but the open orders hold {by_orders} points"));
        }
    }
}

/// Each SKU's `reserved` count against the sum of its RESERVED
/// reservations over every order. A SKU with reservations and no stock row
/// counts as reserved 0.
fn stock_checks(snapshot: &TableSnapshot, out: &mut Vec<Discrepancy>) {
    let mut held: BTreeMap<&str, i64> = BTreeMap::new();
    for r in &snapshot.orders {
        for res in r
            .reservations
            .iter()
            .filter(|x| x.status == ReservationStatus::Reserved && x.resource_type == ResourceType::Stock)
        {
            *held.entry(res.resource_key.as_str()).or_default() += i64::from(res.qty);
        }
    }
    let mut counted: BTreeMap<&str, i64> = snapshot.stocks.iter().map(|s| (s.sku.as_str(), s.reserved)).collect();
    for sku in held.keys() {
        counted.entry(sku).or_insert(0);
    }
    for (sku, reserved) in counted {
        let sum = held.get(sku).copied().unwrap_or(0);
        if reserved != sum {
            out.push(Discrepancy {
                kind: DiscrepancyKind::StockReservedMismatch,
                order_id: String::new(),
                payment_id: None,
                key: Some(format!("SKU#{sku}/STOCK")),
                detail: format!("reserved {reserved}, RESERVED reservations sum to {sum}"),
            });
        }
    }
}

/// The channel's lines by payment, and the creation window they cover.
pub(crate) struct Ledger<'a> {
    by_payment: HashMap<&'a str, &'a StatementLine>,
    since: Option<Timestamp>,
    until: Option<Timestamp>,
}

impl<'a> Ledger<'a> {
    pub(crate) fn of(statement: &'a Statement) -> Self {
        Self {
            by_payment: statement.lines.iter().map(|e| (e.payment_id.as_str(), e)).collect(),
            since: statement.since,
            until: statement.until,
        }
    }
    /// Whether a payment made at `at` falls outside the statement's window.
    fn misses(&self, at: Timestamp) -> bool {
        self.since.is_some_and(|s| at < s) || self.until.is_some_and(|u| at >= u)
    }
}

/// What the channel comparison of one order counted.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct OrderTally {
    pub payments_checked: usize,
    /// A fresh REFUND_PENDING deferred the funds identity.
    pub refund_pending: bool,
    /// A payment attempt outside the statement's window: not compared.
    pub outside_statement: bool,
}

fn discrepancy(kind: DiscrepancyKind, order: &OrderId, payment: Option<&PaymentId>, detail: String) -> Discrepancy {
    Discrepancy { kind, order_id: order.to_string(), payment_id: payment.map(|p| p.to_string()), key: None, detail }
}

/// The checks of one order's records against the channel's lines of its
/// payments: amounts, successes the order does not reflect, refunds, and
/// the funds identity (docs/design.md#funds-identity).
pub(crate) fn channel_checks(
    r: &OrderRecord,
    ledger: &Ledger,
    now: Timestamp,
    out: &mut Vec<Discrepancy>,
) -> OrderTally {
    let o = &r.order;
    let mut tally = OrderTally::default();
    if r.payments.iter().any(|p| ledger.misses(p.created_at)) {
        tally.outside_statement = true;
        return tally;
    }
    let (mut paid, mut refunded) = (0i64, 0i64);
    for p in &r.payments {
        tally.payments_checked += 1;
        let entry = ledger.by_payment.get(p.payment_id.as_str()).copied();
        if let Some(e) = entry {
            if e.amount != p.amount || e.currency != p.currency {
                out.push(discrepancy(
                    DiscrepancyKind::AmountMismatch,
                    &o.order_id,
                    Some(&p.payment_id),
                    format!("channel {} {}, attempt {} {}", e.amount, e.currency, p.amount, p.currency),
                ));
            }
            if e.status == PaymentStatus::Succeeded {
                paid += e.amount;
            }
            refunded += e.refunded_amount;
        }
        success_checks(r, p, entry, out);
        tally.refund_pending |= refund_checks(r, p, entry, now, out);
    }
    if o.status == OrderStatus::Paid {
        let paid_by = o.paid_by.as_ref();
        let ok = paid_by
            .and_then(|p| ledger.by_payment.get(p.as_str()))
            .is_some_and(|e| e.status == PaymentStatus::Succeeded);
        if !ok {
            out.push(discrepancy(
                DiscrepancyKind::OrderPaidWithoutChannelSuccess,
                &o.order_id,
                paid_by,
                "order PAID but the channel has no success for its payment".into(),
            ));
        }
    }
    if !tally.refund_pending {
        funds_identity(o, paid, refunded, out);
    }
    tally
}

/// A success at the channel the order does not reflect.
fn success_checks(r: &OrderRecord, p: &PaymentAttempt, entry: Option<&StatementLine>, out: &mut Vec<Discrepancy>) {
    let o = &r.order;
    if !entry.is_some_and(|e| e.status == PaymentStatus::Succeeded) {
        return;
    }
    let is_the_payment = o.paid_by.as_ref() == Some(&p.payment_id);
    let refund = r.refunds.iter().find(|f| f.payment_id == p.payment_id);
    match o.status {
        OrderStatus::PendingPayment | OrderStatus::Closing => out.push(discrepancy(
            DiscrepancyKind::ChannelSuccessOrderUnpaid,
            &o.order_id,
            Some(&p.payment_id),
            format!("channel says paid, order is {}", o.status.as_str()),
        )),
        OrderStatus::Closed | OrderStatus::Paid if !is_the_payment && refund.is_none() => out.push(discrepancy(
            DiscrepancyKind::SuccessAfterCloseWithoutRefund,
            &o.order_id,
            Some(&p.payment_id),
            format!("money taken for a {} order without a refund", o.status.as_str()),
        )),
        _ => {}
    }
}

/// The local refund of a payment against the channel's; `true` when a
/// fresh pending refund defers the funds identity.
fn refund_checks(
    r: &OrderRecord,
    p: &PaymentAttempt,
    entry: Option<&StatementLine>,
    now: Timestamp,
    out: &mut Vec<Discrepancy>,
) -> bool {
    let o = &r.order;
    let channel_refunded = entry.is_some_and(|e| e.refund_id.is_some());
    let mismatch =
        |detail: String| discrepancy(DiscrepancyKind::RefundStateMismatch, &o.order_id, Some(&p.payment_id), detail);
    let Some(f) = r.refunds.iter().find(|f| f.payment_id == p.payment_id) else {
        if channel_refunded {
            out.push(mismatch("refunded at the channel with no local refund".into()));
        }
        return false;
    };
    match (f.status, channel_refunded) {
        (RefundStatus::Refunded, false) => out.push(mismatch("refund REFUNDED locally, not at the channel".into())),
        // A person refunded it by hand and recorded that.
        (RefundStatus::RefundFailed, true) if f.resolved_by.is_some() => {}
        (RefundStatus::RefundPending | RefundStatus::RefundFailed, true) => {
            out.push(mismatch(format!("refund {} locally, refunded at the channel", f.status.as_str())))
        }
        // Deferred only while the refund is fresh: a stale one may never
        // drain, and the money must not go unchecked.
        (RefundStatus::RefundPending, false) if !refund_is_stale(f, now) => return true,
        _ => {}
    }
    false
}

/// The funds identity (docs/design.md#funds-identity):
/// closed ⇒ paid − refunded = 0; paid ⇒ paid − refunded = the order amount.
fn funds_identity(o: &Order, paid: i64, refunded: i64, out: &mut Vec<Discrepancy>) {
    let net = paid - refunded;
    let expected = match o.status {
        OrderStatus::Closed => 0,
        OrderStatus::Paid => o.amount_total,
        _ => return,
    };
    if net != expected {
        out.push(discrepancy(
            DiscrepancyKind::FundsIdentityViolation,
            &o.order_id,
            None,
            format!("{} order: paid {paid} − refunded {refunded} = {net}, expected {expected}", o.status.as_str()),
        ));
    }
}

/// A PAID order whose stock was handed back.
pub(crate) fn released_on_paid(r: &OrderRecord, out: &mut Vec<Discrepancy>) {
    let o = &r.order;
    if o.status != OrderStatus::Paid {
        return;
    }
    for res in r.reservations.iter().filter(|x| x.status == ReservationStatus::Released) {
        out.push(discrepancy(
            DiscrepancyKind::ReservationReleasedOnPaidOrder,
            &o.order_id,
            None,
            format!("reservation of {} RELEASED on a PAID order", res.label()),
        ));
    }
}

/// A rows that did not decode, as a discrepancy of its key.
pub(crate) fn undecodable(row: &crate::store::UndecodableRow) -> Discrepancy {
    Discrepancy {
        kind: DiscrepancyKind::UndecodableRecord,
        order_id: row.pk.strip_prefix("ORDER#").unwrap_or_default().to_owned(),
        payment_id: None,
        key: Some(format!("{}/{}", row.pk, row.sk)),
        detail: row.error.clone(),
    }
}

/// A success at the channel for an order the table does not have.
pub(crate) fn unknown_order(line: &StatementLine) -> Option<Discrepancy> {
    (line.status == PaymentStatus::Succeeded).then(|| {
        discrepancy(
            DiscrepancyKind::ChannelSuccessOrderUnpaid,
            &line.order_id,
            Some(&line.payment_id),
            "channel success for an unknown order".into(),
        )
    })
}

/// Every kind at zero, then the found ones counted.
pub(crate) fn count_kinds(found: &[Discrepancy]) -> BTreeMap<DiscrepancyKind, usize> {
    let mut counts: BTreeMap<DiscrepancyKind, usize> = DiscrepancyKind::ALL.iter().map(|k| (*k, 0)).collect();
    for d in found {
        *counts.entry(d.kind).or_default() += 1;
    }
    counts
}

/// Compares the local records with each other and with the channel's
/// statement, as of `now`. Without one (no channel configured) only the
/// checks that need no channel data run. A statement that covers a window
/// (Stripe's: intents created since `since`) is compared only with the
/// orders whose every payment attempt was made inside it; the others are
/// counted as `orders_outside_statement`.
pub fn reconcile(snapshot: &TableSnapshot, statement: Option<&Statement>, bounds: &Bounds, now: Timestamp) -> Report {
    let records = &snapshot.orders;
    let empty = Statement::default();
    let ledger = Ledger::of(statement.unwrap_or(&empty));
    let mut out: Vec<Discrepancy> = snapshot.undecodable.iter().map(undecodable).collect();
    for r in records {
        local_checks(r, bounds, now, &mut out);
    }
    stock_checks(snapshot, &mut out);
    supply_checks(snapshot, &mut out);
    let held = points_held(snapshot.orders.iter());
    points_checks(&snapshot.points, &snapshot.points_credits, &held, &mut out);
    let (mut payments_checked, mut refunds_pending, mut outside_statement) = (0, 0, 0);
    for r in records {
        released_on_paid(r, &mut out);
        let tally = channel_checks(r, &ledger, now, &mut out);
        payments_checked += tally.payments_checked;
        refunds_pending += usize::from(tally.refund_pending);
        outside_statement += usize::from(tally.outside_statement);
    }
    // Money at the channel for an order we do not know at all.
    let known: HashSet<&str> = records.iter().map(|r| r.order.order_id.as_str()).collect();
    let lines = statement.map(|s| s.lines.as_slice()).unwrap_or_default();
    out.extend(lines.iter().filter(|e| !known.contains(e.order_id.as_str())).filter_map(unknown_order));
    if statement.is_none() {
        out.retain(|d| !d.kind.needs_channel());
    }
    Report {
        orders_checked: records.len(),
        payments_checked,
        refunds_pending,
        channel_checked: statement.is_some(),
        orders_outside_statement: outside_statement,
        stocks_checked: snapshot.stocks.len(),
        counts: count_kinds(&out),
        discrepancies: out,
    }
}

/// What the table holds open when the run reads it (open orders and the
/// oldest one's age; the refund backlog; see docs/design.md#observability).
/// The full read is the reconciliation's anyway; the sweep, which runs every
/// minute, reads only what is overdue and so cannot count what is merely
/// open.
#[derive(Debug, PartialEq)]
pub struct Backlog {
    pub open_orders: u64,
    pub oldest_open: std::time::Duration,
    pub refunds_pending: u64,
}

impl Backlog {
    pub fn of(records: &[OrderRecord], now: Timestamp) -> Self {
        let open: Vec<_> = records.iter().filter(|r| !r.order.status.is_final()).collect();
        Self {
            open_orders: open.len() as u64,
            oldest_open: open.iter().map(|r| r.order.created_at.until(now)).max().unwrap_or_default(),
            refunds_pending: records
                .iter()
                .flat_map(|r| &r.refunds)
                .filter(|f| f.status == RefundStatus::RefundPending)
                .count() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{PaymentAttempt, Refund, Reservation, TableSnapshot};

    #[test]
    fn kinds_order_print_and_serialize_as_their_wire_names_did() {
        let mut by_ord = DiscrepancyKind::ALL.to_vec();
        by_ord.sort();
        let mut by_name = DiscrepancyKind::ALL.to_vec();
        by_name.sort_by_key(|k| k.as_str());
        assert_eq!(by_ord, by_name, "Ord is the wire names' order");
        let k = DiscrepancyKind::ALL[0];
        assert_eq!(format!("{k:<40}|"), format!("{:<40}|", k.as_str()), "Display pads like a &str");
        let counts: std::collections::BTreeMap<DiscrepancyKind, u32> =
            DiscrepancyKind::ALL.iter().map(|k| (*k, 1)).collect();
        let json = serde_json::to_value(&counts).unwrap();
        let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
        let mut names: Vec<&str> = DiscrepancyKind::ALL.iter().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(keys, names, "a report's counts serialize under the wire names, in their order");
    }

    fn order(id: &str, status: OrderStatus, paid_by: Option<&str>) -> Order {
        Order {
            order_id: OrderId::parse(id).unwrap(),
            user_id: UserId::parse("u").unwrap(),
            status,
            version: 3,
            currency: Currency::parse("EUR").unwrap(),
            items: vec![],
            amount_total: 500,
            coupon_id: None,
            created_at: Timestamp::from_unix_millis(0),
            expire_at: Timestamp::from_unix_millis(1),
            expiry_rule_version: "v".into(),
            cancel_requested_at: None,
            expiring_soon_at: None,
            points: 0,
            payment_attempts: 1,
            closing: None,
            paid_by: paid_by.map(|p| PaymentId::parse(p).unwrap()),
            history: vec![],
            checks: vec![],
        }
    }

    fn attempt(order: &str, pay: &str, status: PaymentStatus) -> PaymentAttempt {
        PaymentAttempt {
            payment_id: PaymentId::parse(pay).unwrap(),
            order_id: OrderId::parse(order).unwrap(),
            channel: ChannelName::parse("sandbox").unwrap(),
            amount: 500,
            currency: Currency::parse("EUR").unwrap(),
            status,
            channel_txn_id: None,
            channel_ref: None,
            created_at: Timestamp::from_unix_millis(0),
            evidence: vec![],
        }
    }

    fn ledger(order: &str, pay: &str, status: PaymentStatus, refunded: bool) -> StatementLine {
        StatementLine {
            payment_id: PaymentId::parse(pay).unwrap(),
            order_id: OrderId::parse(order).unwrap(),
            amount: 500,
            currency: Currency::parse("EUR").unwrap(),
            status,
            refund_id: refunded.then(|| format!("r-{pay}")),
            refunded_amount: if refunded { 500 } else { 0 },
            created_at: None,
        }
    }

    fn refund(order: &str, pay: &str, status: RefundStatus) -> Refund {
        Refund {
            payment_id: PaymentId::parse(pay).unwrap(),
            order_id: OrderId::parse(order).unwrap(),
            channel: ChannelName::parse("sandbox").unwrap(),
            amount: 500,
            currency: Currency::parse("EUR").unwrap(),
            status,
            reason: "late".into(),
            tries: 0,
            created_at: Timestamp::from_unix_millis(0),
            refunded_at: None,
            channel_refund_id: None,
            last_error: None,
            notification: "n".into(),
            order_version: 0,
            updated_at: None,
            resolved_by: None,
            resolved_at: None,
            resolution: None,
            user_id: None,
        }
    }

    #[test]
    fn the_backlog_counts_open_orders_the_oldest_ones_age_and_pending_refunds() {
        let mut old = order("ord_old", OrderStatus::Closing, None);
        old.created_at = Timestamp::from_unix_millis(10_000);
        let mut young = order("ord_young", OrderStatus::PendingPayment, None);
        young.created_at = Timestamp::from_unix_millis(50_000);
        let closed = order("ord_closed", OrderStatus::Closed, None);
        let records = vec![
            record(old, vec![], vec![], false),
            record(young, vec![], vec![], false),
            record(
                closed,
                vec![],
                vec![
                    refund("ord_closed", "pay_1", RefundStatus::RefundPending),
                    refund("ord_closed", "pay_2", RefundStatus::Refunded),
                ],
                true,
            ),
        ];
        let backlog = Backlog::of(&records, Timestamp::from_unix_millis(70_000));
        assert_eq!(backlog, Backlog { open_orders: 2, oldest_open: Duration::from_secs(60), refunds_pending: 1 });
        assert_eq!(Backlog::of(&[], Timestamp::from_unix_millis(0)).open_orders, 0);
    }

    /// Reconciles at the epoch: every record is fresh, nothing is overdue.
    fn run(orders: Vec<OrderRecord>, ledger: Option<&[StatementLine]>) -> Report {
        let statement = ledger.map(|l| Statement { since: None, until: None, lines: l.to_vec() });
        reconcile(
            &TableSnapshot { orders, ..Default::default() },
            statement.as_ref(),
            &Bounds::default(),
            Timestamp::from_unix_millis(0),
        )
    }

    fn record(o: Order, payments: Vec<PaymentAttempt>, refunds: Vec<Refund>, released: bool) -> OrderRecord {
        let reservations = vec![Reservation {
            status: if released { ReservationStatus::Released } else { ReservationStatus::Confirmed },
            ..Reservation::stock(&Sku::parse("A").unwrap(), 1)
        }];
        OrderRecord { order: o, reservations, coupon_lock: None, payments, refunds }
    }

    #[test]
    fn clean_paid_and_refunded_late_orders_report_nothing() {
        let records = vec![
            record(
                order("o1", OrderStatus::Paid, Some("p1")),
                vec![attempt("o1", "p1", PaymentStatus::Succeeded)],
                vec![],
                false,
            ),
            record(
                order("o2", OrderStatus::Closed, None),
                vec![attempt("o2", "p2", PaymentStatus::Succeeded)],
                vec![refund("o2", "p2", RefundStatus::Refunded)],
                true,
            ),
            record(
                order("o3", OrderStatus::Closed, None),
                vec![attempt("o3", "p3", PaymentStatus::Failed)],
                vec![],
                true,
            ),
        ];
        let ledger = vec![
            ledger("o1", "p1", PaymentStatus::Succeeded, false),
            ledger("o2", "p2", PaymentStatus::Succeeded, true),
            ledger("o3", "p3", PaymentStatus::Failed, false),
        ];
        let report = run(records.clone(), Some(&ledger));
        assert_eq!(report.discrepancies, vec![], "{report:?}");
        assert_eq!((report.orders_checked, report.payments_checked), (3, 3));
    }

    #[test]
    fn each_kind_is_reported() {
        let mut mismatched = ledger("o3", "p3", PaymentStatus::Succeeded, false);
        mismatched.amount = 499;
        let records = vec![
            record(
                order("o1", OrderStatus::PendingPayment, None),
                vec![attempt("o1", "p1", PaymentStatus::Processing)],
                vec![],
                false,
            ),
            record(
                order("o2", OrderStatus::Paid, Some("p2")),
                vec![attempt("o2", "p2", PaymentStatus::Succeeded)],
                vec![],
                false,
            ),
            record(
                order("o3", OrderStatus::Paid, Some("p3")),
                vec![attempt("o3", "p3", PaymentStatus::Succeeded)],
                vec![],
                false,
            ),
            record(
                order("o4", OrderStatus::Closed, None),
                vec![attempt("o4", "p4", PaymentStatus::Succeeded)],
                vec![],
                true,
            ),
            record(
                order("o5", OrderStatus::Closed, None),
                vec![attempt("o5", "p5", PaymentStatus::Succeeded)],
                vec![refund("o5", "p5", RefundStatus::Refunded)],
                true,
            ),
            record(
                order("o6", OrderStatus::Paid, Some("p6")),
                vec![attempt("o6", "p6", PaymentStatus::Succeeded)],
                vec![],
                true,
            ),
        ];
        let ledger = vec![
            ledger("o1", "p1", PaymentStatus::Succeeded, false),
            ledger("o2", "p2", PaymentStatus::Processing, false),
            mismatched,
            ledger("o4", "p4", PaymentStatus::Succeeded, false),
            ledger("o5", "p5", PaymentStatus::Succeeded, false),
            ledger("o6", "p6", PaymentStatus::Succeeded, false),
        ];
        let report = run(records.clone(), Some(&ledger));
        let has = |kind: &str, order: &str| report.discrepancies.iter().any(|d| d.kind == kind && d.order_id == order);
        assert!(has("channel_success_order_unpaid", "o1"));
        assert!(has("order_paid_without_channel_success", "o2"));
        assert!(has("amount_mismatch", "o3"));
        assert!(has("success_after_close_without_refund", "o4"));
        assert!(has("funds_identity_violation", "o4"));
        assert!(has("refund_state_mismatch", "o5"));
        assert!(has("reservation_released_on_paid_order", "o6"));
        // The record-only kinds added later have their own tests on
        // DynamoDB Local (tests/tests/reconcile_kinds.rs).
        let here = DiscrepancyKind::ALL
            .iter()
            .filter(|k| k.needs_channel() || **k == DiscrepancyKind::ReservationReleasedOnPaidOrder);
        for kind in here {
            assert!(report.counts[kind] >= 1, "{kind}: {report:?}");
        }
        assert_eq!(report.counts.len(), DiscrepancyKind::COUNT, "every kind is counted, zero or not");
        // Without the channel's ledger, only what the records alone show.
        let local = run(records, None);
        assert!(!local.channel_checked);
        let kinds: Vec<&str> = local.discrepancies.iter().map(|d| d.kind.as_str()).collect();
        assert_eq!(kinds, ["reservation_released_on_paid_order"]);
    }

    #[test]
    fn a_pending_refund_defers_the_funds_identity() {
        let records = vec![record(
            order("o1", OrderStatus::Closed, None),
            vec![attempt("o1", "p1", PaymentStatus::Succeeded)],
            vec![refund("o1", "p1", RefundStatus::RefundPending)],
            true,
        )];
        let report = run(records, Some(&[ledger("o1", "p1", PaymentStatus::Succeeded, false)]));
        assert_eq!(report.discrepancies, vec![]);
        assert_eq!(report.refunds_pending, 1);
    }
}
