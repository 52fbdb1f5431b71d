//! The order protocol checked over every interleaving (issue 9, item 4).
//!
//! A model of one order, its payment attempts, two closers, the webhook,
//! the channel, the release/settle effect and the refund worker, explored
//! exhaustively with `stateright`. Every decision in it is taken by the
//! code's own functions — `decide_close`, `on_payment_success`,
//! `order::apply`/`transition`, `payment::recordable_from`,
//! `reservation::apply` and the close path's `verdict_of` — so a change to
//! the domain changes what the model does. What the model writes itself is
//! the store: each conditional write or transaction of `aws/dynamo.rs` and
//! `aws/payments.rs` is one atomic action here (a compare-and-set on status
//! and version, conditions built from `transition()`/`recordable_from()`),
//! and every read is a separate step before it, so a write can always be
//! decided on a stale read.
//!
//! # Actors and the steps they take
//! - **Buyer**: records an attempt (PENDING_PAYMENT, not expired, CAS on
//!   the version), then opens it at the channel — possibly much later,
//!   even after the order closed (the "not found, then paid late" case).
//! - **Channel** (the truth per attempt): not opened (NOT FOUND), pending,
//!   SUCCEEDED or FAILED, each outcome sending one notification; a query
//!   may time out (UNKNOWN); a pending payment is closed by the closer's
//!   query (query-or-cancel), a late success after close is possible
//!   whenever the payment was still open or not opened yet.
//! - **Network**: notifications are delivered in any order, one may be
//!   delivered twice.
//! - **Webhook** (one handler at a time): a failure is one transaction; a
//!   success reads the order, then runs `settle_success`'s transaction,
//!   and re-reads on `OrderMoved`.
//! - **Closers** (two): read → `decide_close` → one-write close, or claim
//!   CLOSING (a lease); read the record; per unsettled attempt, query the
//!   channel (one step) and record what it said (another); then settle the
//!   successes, hold (unknown) or close after the check. A closer may
//!   crash any time after its claim, and a lease may run out — while its
//!   holder is dead or holding, or (once) while it is still working.
//! - **Effects**: release on CLOSED, settle (confirm) on PAID, any number
//!   of times (the stream and the sweep both drive them). They, and the
//!   refund worker, run while no closer or webhook is mid-run: they read
//!   only final facts and write records no other actor reads, so their
//!   place among the others' steps does not matter (a reduction).
//! - **Refund worker**: channel refund with the payment's idempotency key,
//!   then REFUND_PENDING → REFUNDED.
//!
//! # Bounds
//! 2 attempts, 2 closers, 1 webhook handler, 1 closer crash, 1 lease lost
//! by a live closer, and (per test) 1 duplicated notification and 1
//! channel timeout. "Not found" inside the grace is UNKNOWN once: the hold
//! that follows lets the grace pass (the backoff grows past it).
//!
//! # Left out
//! Superseding an earlier attempt when a new one starts (both stay payable
//! here: a superset), `close_other_payments` after PAID (the notification
//! refunds instead), the close budget running out (the same hold as a
//! timeout), refunds failing at the channel, coupons, several
//! reservations, notifications lost for good.

use order_core::domain::order::{self, decide_close, on_payment_success, CloseDecision, PaymentSuccessOutcome};
use order_core::domain::payment;
use order_core::domain::reservation::{self, ReservationEvent};
use order_core::domain::*;
use order_core::ports::{ChannelPayment, Unavailable};
use order_core::store::{PaymentAttempt, SettleResult};
use order_core::usecases::close_order::{verdict_of, Verdict};
use stateright::{Checker, Model, Property};
use std::time::{Duration, Instant};

const ATTEMPTS: usize = 2;
const CLOSERS: usize = 2;
const WEBHOOKS: usize = 1;
const SUCCESS: usize = 0;
const FAILURE: usize = 1;

/// The channel's own truth about one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Chan {
    NotOpened,
    Pending,
    Succeeded,
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Lease {
    owner: u8,
    /// `lease_until` still ahead of server time.
    live: bool,
}

/// The order item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct OrderItem {
    status: OrderStatus,
    version: u8,
    attempts: u8,
    lease: Option<Lease>,
    paid_by: Option<u8>,
}

/// The payment attempt item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Attempt {
    status: PaymentStatus,
    /// `channel_txn_id` written (always the attempt's own one here).
    txn: bool,
}

/// What an actor read of the order: the basis of its next conditional write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Snap {
    status: OrderStatus,
    version: u8,
    paid_by: Option<u8>,
}

/// A closer's knowledge of one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Fact {
    NotAsked,
    Unpaid,
    Unknown,
    Paid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Closer {
    Idle,
    /// `decide_close` said CloseNow on this read.
    CloseUnpaid(Snap),
    /// `decide_close` said Begin/ResumeClosing on this read.
    Claim(Snap),
    /// Holds CLOSING at version `v`; next it reads the record.
    Claimed {
        v: u8,
    },
    /// Establishing the facts (`close_order.rs::facts`): the attempts as
    /// read, what is known so far, the next one to look at, and a fact
    /// the channel gave that still has to be recorded on the attempt.
    Facts {
        v: u8,
        seen: [Option<PaymentStatus>; ATTEMPTS],
        facts: [Fact; ATTEMPTS],
        next: u8,
        record: Option<PaymentStatus>,
    },
    /// `settle_successes`: the order as last read, the successes left.
    Settle {
        order: Snap,
        todo: [bool; ATTEMPTS],
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Webhook {
    Idle,
    /// A success notification for attempt `i`, with the order as read.
    Success {
        i: u8,
        order: Snap,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct St {
    /// Server time is past `expire_at`.
    expired: bool,
    /// The not-found grace of the attempts has passed.
    grace_passed: bool,
    order: OrderItem,
    pay: [Option<Attempt>; ATTEMPTS],
    chan: [Chan; ATTEMPTS],
    /// Notifications in flight, per attempt and kind (success, failure).
    net: [[u8; 2]; ATTEMPTS],
    /// Notification dedupe records, per attempt and kind.
    notify_seen: [[bool; 2]; ATTEMPTS],
    refunds: [Option<RefundStatus>; ATTEMPTS],
    reservation: ReservationStatus,
    closers: [Closer; CLOSERS],
    webhooks: [Webhook; WEBHOOKS],
    // Fault budgets.
    dups_left: u8,
    timeouts_left: u8,
    crashes_left: u8,
    slow_lease_left: u8,
    // Ghost variables: what happened, for the properties only.
    finals: u8,
    first_final: Option<OrderStatus>,
    releases: u8,
    refund_creations: [u8; ATTEMPTS],
    money_back: [u8; ATTEMPTS],
    learned: [bool; ATTEMPTS],
    closed_on_unknown: bool,
    /// A closer asked the channel about the attempt and it had never seen
    /// it ("not found").
    asked_unopened: [bool; ATTEMPTS],
    /// The closer closed while the channel could still take the money for
    /// an attempt it had opened.
    closed_while_payable: bool,
    refused_effect: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum A {
    Expire,
    RecordAttempt,
    Open(u8),
    ChannelPays(u8),
    ChannelFails(u8),
    Deliver {
        i: u8,
        kind: u8,
        dup: bool,
    },
    WebhookSettle(u8),
    CloserStart(u8),
    CloserWrite(u8),
    /// The closer's channel query; `timeout` = the channel did not answer.
    CloserQuery {
        c: u8,
        timeout: bool,
    },
    CloserCrash(u8),
    LeaseRunsOut,
    Release,
    Settle,
    Refund(u8),
}

/// The fault budgets of one exploration.
#[derive(Clone, Copy, Debug)]
struct Protocol {
    duplicates: u8,
    timeouts: u8,
    crashes: u8,
    slow_leases: u8,
}

const EXPIRE_AT: i64 = 10_000;
const AMOUNT: i64 = 100;

fn ts(ms: i64) -> Timestamp {
    Timestamp::from_unix_millis(ms)
}

/// Server time as the model's flags say it is.
fn now(s: &St) -> Timestamp {
    ts(if s.expired { EXPIRE_AT + 5_000 } else { EXPIRE_AT - 5_000 })
}

/// The domain `Order` for the model's order item, so `decide_close` reads
/// exactly what the use case would read.
fn domain_order(s: &St) -> Order {
    let n = now(s);
    let o = &s.order;
    Order {
        order_id: OrderId::parse("ord_model").unwrap(),
        user_id: UserId::parse("buyer").unwrap(),
        status: o.status,
        version: u64::from(o.version),
        currency: Currency::parse("EUR").unwrap(),
        items: vec![],
        amount_total: AMOUNT,
        coupon_id: None,
        created_at: ts(0),
        expire_at: ts(EXPIRE_AT),
        expiry_rule_version: "model".into(),
        cancel_requested_at: None,
        expiring_soon_at: None,
        points: 0,
        payment_attempts: u32::from(o.attempts),
        closing: o.lease.map(|l| ClosingLease {
            started_at: ts(EXPIRE_AT),
            owner: format!("closer-{}", l.owner),
            lease_until: if l.live { n.plus(Duration::from_secs(30)) } else { ts(EXPIRE_AT) },
            resumes: 0,
        }),
        paid_by: o.paid_by.map(payment_id),
        history: vec![],
        checks: vec![],
    }
}

fn payment_id(i: u8) -> PaymentId {
    PaymentId::parse(format!("pay_{i}")).unwrap()
}

fn domain_attempt(i: u8, status: PaymentStatus) -> PaymentAttempt {
    PaymentAttempt {
        payment_id: payment_id(i),
        order_id: OrderId::parse("ord_model").unwrap(),
        channel: ChannelName::parse("sandbox").unwrap(),
        amount: AMOUNT,
        currency: Currency::parse("EUR").unwrap(),
        status,
        channel_txn_id: None,
        channel_ref: None,
        // Attempts are made before expiry; the grace flag decides whether
        // "not found" is believed.
        created_at: ts(0),
        evidence: vec![],
    }
}

fn snap(s: &St) -> Snap {
    Snap { status: s.order.status, version: s.order.version, paid_by: s.order.paid_by }
}

/// Every write to the order item bumps its version; a write into a final
/// status is counted for the "one final outcome" property.
fn write_order(s: &mut St, status: OrderStatus) {
    if status.is_final() && !s.order.status.is_final() {
        s.finals += 1;
        s.first_final.get_or_insert(status);
    }
    s.order.status = status;
    s.order.version += 1;
}

/// `settle_success` (aws/payments.rs): one transaction of the notification
/// dedupe put, the attempt → SUCCEEDED update, and either the order → PAID
/// (from `transition(PaymentSucceeded)`, on the version read) or a check
/// of the version read plus the refund put (`attribute_not_exists`). A
/// cancelled transaction is read back in the adapter's order.
fn settle_success(s: &mut St, i: u8, read: Snap, notification: bool) -> SettleResult {
    let iu = usize::from(i);
    let outcome = on_payment_success(read.status, read.paid_by == Some(i));
    let notify_hit = notification && s.notify_seen[iu][SUCCESS];
    let att = s.pay[iu].expect("a notification names a recorded attempt");
    let payment_ok = payment::recordable_from(PaymentStatus::Succeeded).contains(&att.status)
        && !(att.status == PaymentStatus::Succeeded && att.txn);
    let same_success = att.status == PaymentStatus::Succeeded && att.txn;
    let (order_ok, refund_hit) = match outcome {
        PaymentSuccessOutcome::MarkPaid => {
            let (from, _) = order::transition(OrderEvent::PaymentSucceeded);
            (from.contains(&s.order.status) && s.order.version == read.version, false)
        }
        PaymentSuccessOutcome::Duplicate => (s.order.version == read.version, false),
        PaymentSuccessOutcome::Refund => (s.order.version == read.version, s.refunds[iu].is_some()),
    };
    if !notify_hit && payment_ok && order_ok && !refund_hit {
        if notification {
            s.notify_seen[iu][SUCCESS] = true;
        }
        s.pay[iu] = Some(Attempt { status: PaymentStatus::Succeeded, txn: true });
        match outcome {
            PaymentSuccessOutcome::MarkPaid => {
                let (_, to) = order::transition(OrderEvent::PaymentSucceeded);
                write_order(s, to);
                s.order.paid_by = Some(i);
                SettleResult::Paid
            }
            PaymentSuccessOutcome::Duplicate => SettleResult::Duplicate,
            PaymentSuccessOutcome::Refund => {
                s.refunds[iu] = Some(RefundStatus::RefundPending);
                s.refund_creations[iu] += 1;
                SettleResult::RefundPending
            }
        }
    } else if notify_hit || same_success {
        SettleResult::Duplicate
    } else if refund_hit {
        SettleResult::RefundPending
    } else if !order_ok {
        SettleResult::OrderMoved
    } else {
        SettleResult::TxnIdTaken
    }
}

/// `record_payment_fact`: the attempt update conditional on
/// `recordable_from(to)`, with the notification's dedupe put if any.
fn record_fact(s: &mut St, i: u8, to: PaymentStatus, notify_kind: Option<usize>) -> bool {
    let iu = usize::from(i);
    let Some(att) = s.pay[iu] else { return false };
    if notify_kind.is_some_and(|k| s.notify_seen[iu][k]) || !payment::recordable_from(to).contains(&att.status) {
        return false;
    }
    if let Some(k) = notify_kind {
        s.notify_seen[iu][k] = true;
    }
    s.pay[iu] = Some(Attempt { status: to, ..att });
    true
}

/// Moves a closer over the attempts it can judge from the record alone
/// (FAILED: skip; SUCCEEDED with its transaction id: paid), up to the next
/// one that needs the channel or the end.
fn skip_local(facts: &mut [Fact; ATTEMPTS], seen: &[Option<PaymentStatus>; ATTEMPTS], next: &mut u8) {
    while usize::from(*next) < ATTEMPTS {
        match seen[usize::from(*next)] {
            None => *next = ATTEMPTS as u8,
            Some(PaymentStatus::Failed) => *next += 1,
            Some(PaymentStatus::Succeeded) => {
                facts[usize::from(*next)] = Fact::Paid;
                *next += 1;
            }
            Some(PaymentStatus::Processing | PaymentStatus::Unknown) => return,
        }
    }
}

fn closer_in_run(c: Closer) -> bool {
    !matches!(c, Closer::Idle)
}

impl Protocol {
    fn init(&self) -> St {
        St {
            expired: false,
            grace_passed: false,
            order: OrderItem {
                status: OrderStatus::PendingPayment,
                version: 1,
                attempts: 0,
                lease: None,
                paid_by: None,
            },
            pay: [None; ATTEMPTS],
            chan: [Chan::NotOpened; ATTEMPTS],
            net: [[0; 2]; ATTEMPTS],
            notify_seen: [[false; 2]; ATTEMPTS],
            refunds: [None; ATTEMPTS],
            reservation: ReservationStatus::Reserved,
            closers: [Closer::Idle; CLOSERS],
            webhooks: [Webhook::Idle; WEBHOOKS],
            dups_left: self.duplicates,
            timeouts_left: self.timeouts,
            crashes_left: self.crashes,
            slow_lease_left: self.slow_leases,
            finals: 0,
            first_final: None,
            releases: 0,
            refund_creations: [0; ATTEMPTS],
            money_back: [0; ATTEMPTS],
            learned: [false; ATTEMPTS],
            closed_on_unknown: false,
            asked_unopened: [false; ATTEMPTS],
            closed_while_payable: false,
            refused_effect: false,
        }
    }

    /// A closer run starts: read the order, `decide_close`.
    fn closer_start(s: &mut St, c: usize) {
        match decide_close(&domain_order(s), now(s)) {
            CloseDecision::AlreadyFinal(_) | CloseDecision::NotYetDue(_) | CloseDecision::LeaseHeld(_) => {}
            CloseDecision::CloseNow => s.closers[c] = Closer::CloseUnpaid(snap(s)),
            CloseDecision::BeginClosing | CloseDecision::ResumeClosing => s.closers[c] = Closer::Claim(snap(s)),
        }
    }

    /// The closer's next write (everything but the channel query).
    fn closer_write(s: &mut St, c: usize) {
        let me = c as u8;
        match s.closers[c] {
            Closer::Idle => {}
            // close_unpaid: transition(CloseUnpaid) sources, version,
            // no attempt, expire_at <= now.
            Closer::CloseUnpaid(read) => {
                let (from, to) = order::transition(OrderEvent::CloseUnpaid);
                if from.contains(&s.order.status)
                    && s.order.version == read.version
                    && s.order.attempts == 0
                    && s.expired
                {
                    write_order(s, to);
                }
                s.closers[c] = Closer::Idle;
            }
            // begin_closing: version read, and PENDING_PAYMENT due or
            // CLOSING with no live lease.
            Closer::Claim(read) => {
                let (from, to) = order::transition(OrderEvent::BeginClosing);
                let o = s.order;
                let ok = from.contains(&o.status)
                    && o.version == read.version
                    && ((o.status == OrderStatus::PendingPayment && s.expired)
                        || (o.status == OrderStatus::Closing && !o.lease.is_some_and(|l| l.live)));
                if ok {
                    write_order(s, to);
                    s.order.lease = Some(Lease { owner: me, live: true });
                    s.closers[c] = Closer::Claimed { v: s.order.version };
                } else {
                    s.closers[c] = Closer::Idle;
                }
            }
            // order_record: the attempts as they are now.
            Closer::Claimed { v } => {
                let seen = s.pay.map(|p| p.map(|a| a.status));
                let mut facts = [Fact::NotAsked; ATTEMPTS];
                let mut next = 0;
                skip_local(&mut facts, &seen, &mut next);
                s.closers[c] = Closer::Facts { v, seen, facts, next, record: None };
            }
            // Record what the channel said on the attempt, then move on.
            Closer::Facts { v, seen, mut facts, mut next, record: Some(to) } => {
                record_fact(s, next, to, None);
                next += 1;
                skip_local(&mut facts, &seen, &mut next);
                s.closers[c] = Closer::Facts { v, seen, facts, next, record: None };
            }
            // Every attempt judged: decide_with_facts.
            Closer::Facts { v, seen, facts, next, record: None } => {
                debug_assert_eq!(usize::from(next), ATTEMPTS);
                let _ = seen;
                let owned = |s: &St| {
                    s.order.status == OrderStatus::Closing
                        && s.order.version == v
                        && s.order.lease.is_some_and(|l| l.owner == me)
                };
                if facts.contains(&Fact::Paid) {
                    let order = Snap { status: OrderStatus::Closing, version: v, paid_by: None };
                    s.closers[c] = Closer::Settle { order, todo: facts.map(|f| f == Fact::Paid) };
                    Self::closer_write(s, c);
                } else if facts.contains(&Fact::Unknown) {
                    // hold_closing: status, version, owner; keeps the lease
                    // until its own reminder.
                    if owned(s) {
                        s.order.version += 1;
                        s.order.lease = Some(Lease { owner: me, live: true });
                    }
                    s.closers[c] = Closer::Idle;
                } else {
                    // close_after_check: transition(ConfirmUnpaid) sources,
                    // version, owner.
                    let (from, to) = order::transition(OrderEvent::ConfirmUnpaid);
                    if owned(s) && from.contains(&s.order.status) {
                        // Every attempt the record held was judged unpaid
                        // (or was FAILED in the record): the "unknown never
                        // releases" ghost looks at exactly that.
                        let judged = (0..ATTEMPTS).all(|i| {
                            seen[i].is_none() || seen[i] == Some(PaymentStatus::Failed) || facts[i] == Fact::Unpaid
                        });
                        let unseen_attempt = s.pay.iter().zip(seen.iter()).any(|(p, r)| p.is_some() && r.is_none());
                        if !judged || unseen_attempt {
                            s.closed_on_unknown = true;
                        }
                        // The channel's truth: every attempt it had opened
                        // is FAILED (failed, or closed by the query) — only
                        // one it had never seen may still be paid, late,
                        // and that is refunded.
                        if (0..ATTEMPTS)
                            .any(|i| s.pay[i].is_some() && s.chan[i] != Chan::Failed && !s.asked_unopened[i])
                        {
                            s.closed_while_payable = true;
                        }
                        write_order(s, to);
                    }
                    s.closers[c] = Closer::Idle;
                }
            }
            // settle_successes: one success at a time; OrderMoved re-reads.
            Closer::Settle { order, mut todo } => {
                let Some(i) = todo.iter().position(|t| *t) else {
                    s.closers[c] = Closer::Idle;
                    return;
                };
                match settle_success(s, i as u8, order, false) {
                    SettleResult::OrderMoved => s.closers[c] = Closer::Settle { order: snap(s), todo },
                    SettleResult::TxnIdTaken => s.closers[c] = Closer::Idle,
                    SettleResult::Paid | SettleResult::RefundPending | SettleResult::Duplicate => {
                        todo[i] = false;
                        s.closers[c] =
                            if todo.contains(&true) { Closer::Settle { order: snap(s), todo } } else { Closer::Idle };
                    }
                }
            }
        }
    }

    /// `channel_verdict`: query, cancel a pending payment, and the verdict
    /// by `verdict_of`.
    fn closer_query(s: &mut St, c: usize, timeout: bool) {
        let Closer::Facts { v, seen, mut facts, mut next, record: None } = s.closers[c] else { return };
        let i = next;
        let iu = usize::from(i);
        let answer = if timeout {
            s.timeouts_left -= 1;
            Err(Unavailable::new("model", "channel timeout"))
        } else {
            Ok(match s.chan[iu] {
                Chan::NotOpened => {
                    s.asked_unopened[iu] = true;
                    ChannelPayment::NotFound
                }
                Chan::Pending => {
                    s.chan[iu] = Chan::Failed; // closed at the channel
                    ChannelPayment::Failed
                }
                Chan::Failed => ChannelPayment::Failed,
                Chan::Succeeded => ChannelPayment::Succeeded {
                    channel_txn_id: format!("txn_{i}"),
                    amount: AMOUNT,
                    currency: "EUR".into(),
                },
            })
        };
        let was = seen[iu].expect("queried attempts were read");
        let grace = if s.grace_passed { Duration::ZERO } else { Duration::from_secs(3600) };
        let verdict = verdict_of(answer, &domain_attempt(i, was), now(s), grace);
        if matches!(verdict, Verdict::Unknown(_)) && s.chan[iu] == Chan::NotOpened {
            // The hold that follows lets the grace pass.
            s.grace_passed = true;
        }
        let (status, fact) = match verdict {
            Verdict::Paid { .. } => {
                s.learned[iu] = true;
                (PaymentStatus::Succeeded, Fact::Paid)
            }
            Verdict::Unpaid(_) => (PaymentStatus::Failed, Fact::Unpaid),
            Verdict::Unknown(_) => (PaymentStatus::Unknown, Fact::Unknown),
        };
        facts[iu] = fact;
        if status != PaymentStatus::Succeeded && status != was {
            s.closers[c] = Closer::Facts { v, seen, facts, next, record: Some(status) };
        } else {
            next += 1;
            skip_local(&mut facts, &seen, &mut next);
            s.closers[c] = Closer::Facts { v, seen, facts, next, record: None };
        }
    }
}

impl Model for Protocol {
    type State = St;
    type Action = A;

    fn init_states(&self) -> Vec<St> {
        vec![self.init()]
    }

    fn actions(&self, s: &St, out: &mut Vec<A>) {
        // Release, settle and the refund worker read only what is final
        // (the order's final status, a refund record) and write records no
        // other actor reads, so their order relative to the others does
        // not matter: they run while no closer or webhook is mid-run.
        let quiet = s.closers.iter().all(|c| *c == Closer::Idle) && s.webhooks.iter().all(|w| *w == Webhook::Idle);
        if !s.expired {
            out.push(A::Expire);
        }
        if (s.order.attempts as usize) < ATTEMPTS {
            out.push(A::RecordAttempt);
        }
        for i in 0..ATTEMPTS as u8 {
            let iu = usize::from(i);
            match s.chan[iu] {
                Chan::NotOpened if s.pay[iu].is_some() => out.push(A::Open(i)),
                Chan::Pending => {
                    out.push(A::ChannelPays(i));
                    out.push(A::ChannelFails(i));
                }
                _ => {}
            }
            for kind in 0..2u8 {
                if s.net[iu][usize::from(kind)] > 0 {
                    out.push(A::Deliver { i, kind, dup: false });
                    if s.dups_left > 0 {
                        out.push(A::Deliver { i, kind, dup: true });
                    }
                }
            }
            if quiet && s.refunds[iu] == Some(RefundStatus::RefundPending) {
                out.push(A::Refund(i));
            }
        }
        for w in 0..WEBHOOKS as u8 {
            if s.webhooks[usize::from(w)] != Webhook::Idle {
                out.push(A::WebhookSettle(w));
            }
        }
        for c in 0..CLOSERS as u8 {
            match s.closers[usize::from(c)] {
                Closer::Idle => out.push(A::CloserStart(c)),
                Closer::Facts { next, record: None, .. } if usize::from(next) < ATTEMPTS => {
                    out.push(A::CloserQuery { c, timeout: false });
                    if s.timeouts_left > 0 {
                        out.push(A::CloserQuery { c, timeout: true });
                    }
                }
                _ => out.push(A::CloserWrite(c)),
            }
            if !matches!(s.closers[usize::from(c)], Closer::Idle | Closer::CloseUnpaid(_) | Closer::Claim(_))
                && s.crashes_left > 0
            {
                out.push(A::CloserCrash(c));
            }
        }
        if s.order.status == OrderStatus::Closing && s.order.lease.is_some_and(|l| l.live) {
            out.push(A::LeaseRunsOut);
        }
        if quiet && s.order.status == OrderStatus::Closed {
            out.push(A::Release);
        }
        if quiet && s.order.status == OrderStatus::Paid {
            out.push(A::Settle);
        }
    }

    fn next_state(&self, last: &St, action: A) -> Option<St> {
        let mut s = last.clone();
        match action {
            A::Expire => s.expired = true,
            // record_keyed_attempt: PENDING_PAYMENT, expire_at > now, the
            // version, attempts below the maximum. (The supersede step
            // that closes an earlier attempt at the channel first is left
            // out: the model lets both stay payable, a superset.)
            A::RecordAttempt => {
                let o = s.order;
                if o.status == OrderStatus::PendingPayment
                    && !s.expired
                    && u32::from(o.attempts) < payment::MAX_PAYMENT_ATTEMPTS
                {
                    s.pay[usize::from(o.attempts)] = Some(Attempt { status: PaymentStatus::Processing, txn: false });
                    s.order.attempts += 1;
                    s.order.version += 1;
                }
            }
            A::Open(i) => s.chan[usize::from(i)] = Chan::Pending,
            A::ChannelPays(i) => {
                s.chan[usize::from(i)] = Chan::Succeeded;
                s.net[usize::from(i)][SUCCESS] += 1;
            }
            A::ChannelFails(i) => {
                s.chan[usize::from(i)] = Chan::Failed;
                s.net[usize::from(i)][FAILURE] += 1;
            }
            A::Deliver { i, kind, dup } => {
                let (iu, k) = (usize::from(i), usize::from(kind));
                if dup {
                    s.dups_left -= 1;
                } else {
                    s.net[iu][k] -= 1;
                }
                if k == FAILURE {
                    record_fact(&mut s, i, PaymentStatus::Failed, Some(FAILURE));
                } else {
                    let w = s.webhooks.iter().position(|w| *w == Webhook::Idle)?;
                    s.webhooks[w] = Webhook::Success { i, order: snap(&s) };
                }
            }
            A::WebhookSettle(w) => {
                let Webhook::Success { i, order } = s.webhooks[usize::from(w)] else { return None };
                match settle_success(&mut s, i, order, true) {
                    SettleResult::OrderMoved => s.webhooks[usize::from(w)] = Webhook::Success { i, order: snap(&s) },
                    r => {
                        if r != SettleResult::TxnIdTaken {
                            s.learned[usize::from(i)] = true;
                        }
                        s.webhooks[usize::from(w)] = Webhook::Idle;
                    }
                }
            }
            A::CloserStart(c) => {
                if !s.expired {
                    return None; // the reminder is early: put back, nothing else
                }
                Self::closer_start(&mut s, usize::from(c));
            }
            A::CloserWrite(c) => Self::closer_write(&mut s, usize::from(c)),
            A::CloserQuery { c, timeout } => Self::closer_query(&mut s, usize::from(c), timeout),
            A::CloserCrash(c) => {
                s.crashes_left -= 1;
                s.closers[usize::from(c)] = Closer::Idle;
            }
            A::LeaseRunsOut => {
                let lease = s.order.lease?;
                if closer_in_run(s.closers[usize::from(lease.owner)]) {
                    // The holder is alive and still working: rare, bounded.
                    if s.slow_lease_left == 0 {
                        return None;
                    }
                    s.slow_lease_left -= 1;
                }
                s.order.lease = Some(Lease { live: false, ..lease });
            }
            // release_order: only a CLOSED order; per reservation
            // reservation::apply(Release), conditional on its status.
            A::Release => {
                if s.order.status == OrderStatus::Closed {
                    match reservation::apply(s.reservation, ReservationEvent::Release) {
                        Ok(Step::Moved(to)) => {
                            s.reservation = to;
                            s.releases += 1;
                        }
                        Ok(Step::AlreadyThere) => {}
                        Err(_) => s.refused_effect = true,
                    }
                }
            }
            A::Settle => {
                if s.order.status == OrderStatus::Paid {
                    match reservation::apply(s.reservation, ReservationEvent::Confirm) {
                        Ok(Step::Moved(to)) => s.reservation = to,
                        Ok(Step::AlreadyThere) => {}
                        Err(_) => s.refused_effect = true,
                    }
                }
            }
            // process_refund: the channel refund (idempotent on
            // refund-<payment_id>), then REFUND_PENDING → REFUNDED.
            A::Refund(i) => {
                let iu = usize::from(i);
                if s.money_back[iu] == 0 {
                    s.money_back[iu] = 1;
                }
                s.refunds[iu] = Some(RefundStatus::Refunded);
            }
        }
        (s != *last).then_some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one final outcome, never changed", |_, s: &St| {
                s.finals <= 1
                    && (s.order.status.is_final() == (s.finals == 1))
                    && (!s.order.status.is_final() || s.first_final == Some(s.order.status))
            }),
            Property::always("a recorded success is the paying payment or has its refund", |_, s: &St| {
                (0..ATTEMPTS).all(|i| {
                    s.pay[i].is_none_or(|a| a.status != PaymentStatus::Succeeded)
                        || s.order.paid_by == Some(i as u8)
                        || s.refunds[i].is_some()
                })
            }),
            Property::always("the paying payment is never refunded", |_, s: &St| {
                s.order.paid_by.is_none_or(|i| s.refunds[usize::from(i)].is_none() && s.money_back[usize::from(i)] == 0)
            }),
            Property::always("at most one refund per payment, only of money the channel took", |_, s: &St| {
                (0..ATTEMPTS).all(|i| {
                    s.refund_creations[i] <= 1
                        && s.money_back[i] <= 1
                        && (s.money_back[i] == 0 || s.chan[i] == Chan::Succeeded)
                })
            }),
            Property::always("unknown payment state never closes or releases", |_, s: &St| {
                !s.closed_on_unknown && !s.closed_while_payable
            }),
            Property::always("release at most once, never on a PAID order", |_, s: &St| {
                s.releases <= 1
                    && !s.refused_effect
                    && (s.reservation != ReservationStatus::Released || s.order.status == OrderStatus::Closed)
                    && (s.reservation != ReservationStatus::Confirmed || s.order.status == OrderStatus::Paid)
            }),
            Property::always("every terminal state is final and consistent", |m: &Protocol, s: &St| {
                !is_terminal(m, s) || settled(s)
            }),
            Property::eventually("the order becomes final", |_, s: &St| s.order.status.is_final()),
            // Coverage: the races the model exists for are reached.
            Property::sometimes("a success after CLOSED is refunded", |_, s: &St| {
                s.order.status == OrderStatus::Closed && s.refunds.contains(&Some(RefundStatus::Refunded))
            }),
            Property::sometimes("a second success on a PAID order is refunded", |_, s: &St| {
                s.order.status == OrderStatus::Paid && s.refunds.iter().any(Option::is_some)
            }),
            Property::sometimes("a CLOSING order is paid", |_, s: &St| {
                s.order.status == OrderStatus::Paid && s.order.lease.is_some()
            }),
            Property::sometimes("an attempt is recorded UNKNOWN", |_, s: &St| {
                s.pay.iter().any(|p| p.is_some_and(|a| a.status == PaymentStatus::Unknown))
            }),
            Property::sometimes("closed after the channel check", |_, s: &St| {
                s.order.status == OrderStatus::Closed && s.order.attempts > 0
            }),
        ]
    }
}

/// No action changes the state any more.
fn is_terminal(m: &Protocol, s: &St) -> bool {
    let mut actions = Vec::new();
    m.actions(s, &mut actions);
    actions.into_iter().all(|a| m.next_state(s, a).is_none())
}

/// Where every run must end: one final outcome; its effect done; every
/// payment the channel took (or the system learned of) is the paying one
/// or has exactly one refund, done.
fn settled(s: &St) -> bool {
    let effect_done = match s.order.status {
        OrderStatus::Closed => s.reservation == ReservationStatus::Released,
        OrderStatus::Paid => s.reservation == ReservationStatus::Confirmed,
        _ => false,
    };
    effect_done
        && (0..ATTEMPTS).all(|i| {
            let took = s.chan[i] == Chan::Succeeded || s.learned[i];
            let paying = s.order.paid_by == Some(i as u8);
            let refunded = s.refunds[i] == Some(RefundStatus::Refunded) && s.money_back[i] == 1;
            if took {
                paying != refunded
            } else {
                !paying && s.refunds[i].is_none()
            }
        })
}

/// Explores every state reachable under `bounds`, prints the figures and
/// fails on any counterexample (the panic shows the trace).
fn check(bounds: Protocol, at_least: usize) {
    let started = Instant::now();
    let mut builder = bounds.checker().threads(std::thread::available_parallelism().map_or(1, |n| n.get()));
    if let Some(n) = std::env::var("MODEL_STATE_LIMIT").ok().and_then(|v| v.parse().ok()) {
        builder = builder.target_state_count(n);
    }
    let checker = builder.spawn_bfs().join();
    let states = checker.unique_state_count();
    println!(
        "protocol model: {states} unique states ({} generated), max depth {}, {:.1} s; bounds: {ATTEMPTS} attempts, \
         {CLOSERS} closers, {WEBHOOKS} webhook handler, {bounds:?}",
        checker.state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    checker.assert_properties();
    assert!(states > at_least, "the model explored only {states} states: a bound or an action is broken");
}

/// The test command runs two bounds, each with every fault but one; the
/// ignored test below has them all at once. This one: a notification
/// delivered twice, a closer crash, a lease lost by a live closer; UNKNOWN
/// comes from "not found" inside the grace.
#[test]
fn the_order_protocol_holds_in_every_interleaving() {
    check(Protocol { duplicates: 1, timeouts: 0, crashes: 1, slow_leases: 1 }, 1_000_000);
}

/// A channel timeout, a closer crash, a lease lost by a live closer.
#[test]
fn the_order_protocol_holds_in_every_interleaving_with_a_channel_timeout() {
    check(Protocol { duplicates: 0, timeouts: 1, crashes: 1, slow_leases: 1 }, 1_000_000);
}

/// Every fault at once: about 14.6 million states, about 100 s on 2 cores.
/// Run it with `cargo nextest run -p protocol_model --run-ignored all`.
#[test]
#[ignore = "about 100 s; run with --run-ignored all"]
fn the_order_protocol_holds_with_every_fault_at_once() {
    check(Protocol { duplicates: 1, timeouts: 1, crashes: 1, slow_leases: 1 }, 1_000_000);
}
