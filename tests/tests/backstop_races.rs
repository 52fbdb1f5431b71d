//! The backstop under races and duplicates (sweep, due index, lazy expiry,
//! operator check) on the real store (DynamoDB Local) with the clock,
//! channel, reminders and re-drive faked: duplicate and early wake-ups leave
//! one reminder chain, a failed re-drive is retried, the sweep keeps its
//! budget, a payment during a close stays paid, a release racing a release
//! returns stock once, a dead closer is found after its lease, and bad ids
//! change nothing.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue as Av, PutRequest, WriteRequest};
use order_core::aws::dynamo::{keys, DueShards, DynamoStore};
use order_core::domain::*;
use order_core::handlers::requests::{force_check, get_order};
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::close_order::{CloseOrder, CloseOutcome};
use order_core::usecases::order_reads::Reader;
use order_core::usecases::refunds::{process_refund, RefundOutcome};
use order_core::usecases::release_order::{drive_effects, release_order, settle_order};
use order_core::usecases::sweep::{sweep, SweepConfig, SweepReport};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use system_tests::fakes::*;
use system_tests::fixtures::{self, fresh_key, one_line, T0};
use system_tests::{dynamodb_local, fresh_table};
const WINDOW: Duration = Duration::from_secs(60);
const WINDOW_MS: i64 = 60_000;

// ---------------------------------------------------------------- harness

/// A re-drive port that records calls, can fail chosen effects re-drives
/// once, and can make each effects re-drive take time on the test clock.
#[derive(Clone, Default)]
struct ScriptedRedrive {
    calls: Arc<Mutex<Vec<String>>>,
    fail_once: Arc<Mutex<HashSet<String>>>,
    /// Advanced by `effects_cost_ms` on every effects re-drive.
    clock: Option<FixedClock>,
    effects_cost_ms: i64,
}

impl ScriptedRedrive {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
    fn clear(&self) {
        self.calls.lock().unwrap().clear();
    }
}

#[async_trait]
impl Redrive for ScriptedRedrive {
    async fn close(&self, ids: &[OrderId]) -> Result<(), Unavailable> {
        self.calls.lock().unwrap().extend(ids.iter().map(|id| format!("close {id}")));
        Ok(())
    }
    /// One call is one hand-off (a `SendMessageBatch` of up to 10); it
    /// fails as a whole when it holds an order scripted to fail once.
    async fn effects(&self, effects: &[PendingEffect]) -> Result<(), Unavailable> {
        let mut failing = false;
        for e in effects {
            self.calls.lock().unwrap().push(match e {
                PendingEffect::Order(id) => format!("effects {id}"),
                PendingEffect::Refund(o, p) => format!("refund {o} {p}"),
            });
            failing |= self.fail_once.lock().unwrap().remove(e.order_id().as_str());
        }
        if let Some(c) = &self.clock {
            let now = c.now().unix_millis();
            c.set(now + self.effects_cost_ms);
        }
        if failing {
            return Err(Unavailable::new("scripted hand-off", "queue throttled"));
        }
        Ok(())
    }
}

system_tests::world_of!(World);

impl World {
    async fn new() -> Self {
        Self::with_store(fresh_table(&dynamodb_local().await).await).await
    }

    async fn with_store(store: DynamoStore) -> Self {
        Self(fixtures::World::on_store(store, ScriptedChannel::default(), &["A"], 1_000).await)
    }

    async fn order(&self) -> Order {
        fixtures::create(&self.creator(WINDOW, "w60"), &fresh_key(), &one_line("u1", "A", 3, 100)).await
    }

    async fn with_attempt(&self, order: &Order) -> PaymentAttempt {
        let a = system_tests::fixtures::processing_attempt(order, self.clock.now());
        let fresh = self.store.order(&order.order_id).await.unwrap().unwrap();
        assert_eq!(self.store.record_attempt(&fresh, &a).await.unwrap(), AttemptResult::Recorded);
        a
    }

    fn closer(&self) -> CloseOrder<DynamoStore, ScriptedChannel, RecordedReminders> {
        CloseOrder { lease: Duration::from_secs(60), ..self.0.closer() }
    }

    async fn now_order(&self, id: &OrderId) -> Order {
        self.store.order(id).await.unwrap().unwrap()
    }

    /// A webhook's success for `a`, decided on the order as it is now.
    async fn webhook_success(&self, a: &PaymentAttempt, txn: &str) -> Result<SettleResult, Unavailable> {
        let o = self.now_order(&a.order_id).await;
        let ev = Evidence {
            at: self.clock.now(),
            source: "notification".into(),
            status: PaymentStatus::Succeeded,
            detail: None,
        };
        let n = Notification { channel: a.channel.clone(), notify_id: format!("n-{}", rand::random::<u64>()) };
        self.store.settle_success(&o, a, txn, ev, Some(&n), "refund").await
    }

    async fn index_entry(&self, pk: String, sk: &str) -> Option<(String, String)> {
        let item = fixtures::raw_item(&self.store, pk, sk).await?;
        let get = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
        Some((get("due_shard")?, get("due_at")?))
    }

    /// Raw index entries as the store leaves them (KEYS_ONLY: the sweep
    /// reads nothing else): `n` orders in `shard`, due one second apart,
    /// all before T0.
    async fn raw_entries(&self, shard: &str, n: usize) -> Vec<OrderId> {
        let mut ids = Vec::new();
        let mut writes = Vec::new();
        for i in 0..n {
            let id = OrderId::parse(format!("ord_raw{i:04}")).unwrap();
            let due = Timestamp::from_unix_millis(T0 - 1_000 * (n as i64 - i as i64));
            let mut item = HashMap::new();
            item.insert("pk".to_string(), Av::S(keys::order(&id)));
            item.insert("sk".to_string(), Av::S("ORDER".into()));
            item.insert("entity".to_string(), Av::S("ORDER".into()));
            item.insert("status".to_string(), Av::S("CLOSED".into()));
            item.insert("due_shard".to_string(), Av::S(shard.into()));
            item.insert("due_at".to_string(), Av::S(due.to_string()));
            writes.push(
                WriteRequest::builder()
                    .put_request(PutRequest::builder().set_item(Some(item)).build().unwrap())
                    .build(),
            );
            ids.push(id);
        }
        for chunk in writes.chunks(25) {
            let mut pending = HashMap::from([(self.store.table().to_owned(), chunk.to_vec())]);
            while !pending.is_empty() {
                let out = self.store.client().batch_write_item().set_request_items(Some(pending)).send().await.unwrap();
                pending =
                    out.unprocessed_items.unwrap_or_default().into_iter().filter(|(_, v)| !v.is_empty()).collect();
            }
        }
        ids
    }
}

fn cfg() -> SweepConfig {
    SweepConfig::default()
}

async fn run_sweep(w: &World, r: &ScriptedRedrive, cfg: &SweepConfig) -> SweepReport {
    sweep(&w.store, r, &w.clock, cfg).await.unwrap()
}

fn reminders_for(w: &World, id: &OrderId) -> usize {
    w.reminders.0.lock().unwrap().iter().filter(|(o, _)| o == id).count()
}

fn final_transitions(o: &Order) -> usize {
    o.history.iter().filter(|h| h.to.is_final()).count()
}

// ============================================================ FINDINGS
// Each of these fails on the current code.

/// Invariant 8 (one live reminder chain per order). The schedule fires in
/// the minute BEFORE expire_at, so its reminder is normally early and is
/// put back "for the remaining time". SQS and Scheduler deliver at least
/// once, and an operator may check an order that is not due yet: every
/// early arrival puts back its own reminder, so the order ends with one
/// live chain per early delivery. Nothing (no lease, no note) dedupes the
/// put-back of a not-yet-due order.
#[tokio::test]
async fn early_duplicate_wakeups_and_an_early_check_leave_one_reminder_chain() {
    let w = World::new().await;
    let o = w.order().await;
    // The schedule's wake-up (start of the minute before expire_at)...
    w.clock.set(T0 + 20_000);
    let first = w.closer().close(&o.order_id, "schedule-delivery-1").await.unwrap();
    assert!(matches!(first, CloseOutcome::RemindedLater { why: "not yet due", .. }), "{first:?}");
    // ...delivered a second time (at-least-once) ...
    let dup = w.closer().close(&o.order_id, "schedule-delivery-2").await.unwrap();
    // ... and an operator looking at it early.
    w.clock.set(T0 + 30_000);
    let check = force_check(&w.closer(), o.order_id.as_str(), "arn:aws:iam::1:user/ops").await.unwrap();
    println!("duplicate: {dup:?}; operator: {check}");
    let live = reminders_for(&w, &o.order_id);
    assert!(live <= 1, "{live} reminders are now queued for one open order: {live} parallel chains");
}

/// Documented promise of the sweep ("Re-drives that failed (retried by the
/// next run: the entries stay)", and invariant 8's "finds every final order
/// whose release never happened"): when a shard is unfinished, the next run
/// continues AFTER the stored cursor, so an entry whose re-drive failed on
/// an earlier page is not retried by the next run — only after the shard
/// has been read to its end, which under a backlog can be many periods.
#[tokio::test]
async fn a_failed_redrive_is_retried_by_the_next_run_even_with_a_stored_cursor() {
    let store = fresh_table(&dynamodb_local().await).await.with_shards(DueShards { count: 1, sweep_count: 1 });
    let w = World::with_store(store).await;
    let ids = w.raw_entries("FX#0", 6).await;
    let redrive = ScriptedRedrive::default();
    redrive.fail_once.lock().unwrap().insert(ids[0].to_string());
    // A run that runs out of time after one page of 2 (a backlog).
    let tight = SweepConfig { page: 2, budget: Duration::ZERO, ..cfg() };
    let r1 = run_sweep(&w, &redrive, &tight).await;
    assert_eq!(r1.failures, 1, "the first entry's re-drive failed");
    assert_eq!(r1.unfinished, vec!["FX#0".to_string()]);
    redrive.clear();
    let _ = run_sweep(&w, &redrive, &tight).await;
    let second = redrive.calls();
    assert!(
        second.contains(&format!("effects {}", ids[0])),
        "the failed entry is not retried by the next run; it ran {second:?}"
    );
}

/// Invariant 8 / the sweep's time budget: the budget is looked at only
/// between pages, and the effects re-drives of a page used to run one
/// after the other in-process (release/settle, including channel calls):
/// 100 slow re-drives (1 s each) ran 100 s, past the function's 60 s
/// timeout. The sweep now hands effects to the effects queue, ten to a
/// call: a page of 100 is 10 calls, here each slow (1 s, a throttled
/// queue), and the run stays within its time.
#[tokio::test]
async fn the_sweep_stops_mid_page_once_its_budget_is_spent() {
    let store = fresh_table(&dynamodb_local().await).await.with_shards(DueShards { count: 1, sweep_count: 1 });
    let w = World::with_store(store).await;
    w.raw_entries("FX#0", 100).await;
    let redrive = ScriptedRedrive { clock: Some(w.clock.clone()), effects_cost_ms: 1_000, ..Default::default() };
    let started = w.clock.now();
    let report = run_sweep(&w, &redrive, &cfg()).await; // budget 40 s, page 100 (the template's values)
    let took = started.until(w.clock.now());
    println!("effects re-driven: {}, run took {took:?}", report.effects_found);
    const SWEEP_FUNCTION_TIMEOUT: Duration = Duration::from_secs(60);
    assert!(
        took <= SWEEP_FUNCTION_TIMEOUT,
        "the 40 s budget did not stop the run: it took {took:?} (> the function's 60 s timeout)"
    );
}

/// Invariants 2 and 4 via the operator check: every `POST
/// /admin/orders/{id}/check` appends to the order item's `checks` list,
/// without bound. An order stuck in CLOSING (channel unreachable) is
/// exactly the order on-call re-checks in a loop. Once the item reaches
/// DynamoDB's 400 KB limit every write on the order fails — including the
/// webhook's PAID transaction: a confirmed payment can no longer be
/// recorded, the order can never become final, and its stock stays held.
#[tokio::test]
async fn operator_checks_never_grow_the_order_item_so_a_payment_still_records() {
    let w = World::new().await;
    let o = w.order().await;
    let a = w.with_attempt(&o).await;
    w.channel.answer(&a.payment_id, None); // the channel times out: held CLOSING
    w.clock.set(T0 + WINDOW_MS);
    let first = w.closer().close(&o.order_id, "closer").await.unwrap();
    assert!(matches!(first, CloseOutcome::RemindedLater { .. }), "{first:?}");
    // On-call re-checks the stuck order. An assumed-role ARN is ~150 chars.
    let by = "arn:aws:sts::123456789012:assumed-role/AWSReservedSSO_OrderExpiryOnCall_0123456789abcdef/oncall.engineer@example.com";
    let v = force_check(&w.closer(), o.order_id.as_str(), by).await.unwrap();
    assert_eq!(v["status"], "CLOSING");
    // The same write the check route makes, many times (a loop every few
    // seconds for a few hours); stop at the first refusal.
    let check = OperatorCheck {
        at: w.clock.now(),
        by: by.into(),
        found: OrderStatus::Closing,
        outcome: "left_to_lease_holder".into(),
        status: OrderStatus::Closing,
    };
    // Many of those (a loop every few seconds for a few hours, ~2,000
    // checks): written here 100 to a request, as the same list entries the
    // route appends, to keep the test fast; then the route's own write.
    let entry = Av::M(HashMap::from([
        ("at".to_string(), Av::S(check.at.to_string())),
        ("by".to_string(), Av::S(check.by.clone())),
        ("found".to_string(), Av::S("CLOSING".into())),
        ("outcome".to_string(), Av::S(check.outcome.clone())),
        ("status".to_string(), Av::S("CLOSING".into())),
    ]));
    let mut written = 1usize;
    for _ in 0..40 {
        let res = w
            .store
            .client()
            .update_item()
            .table_name(w.store.table())
            .key("pk", Av::S(keys::order(&o.order_id)))
            .key("sk", Av::S("ORDER".into()))
            .update_expression("SET checks = list_append(if_not_exists(checks, :e), :c)")
            .expression_attribute_values(":e", Av::L(vec![]))
            .expression_attribute_values(":c", Av::L(vec![entry.clone(); 100]))
            .send()
            .await;
        if res.is_err() {
            break;
        }
        written += 100;
    }
    // The route's own write, until the item is full.
    for _ in 0..200 {
        match w.store.record_check(&o.order_id, &check).await {
            Ok(_) => written += 1,
            Err(e) => {
                println!("the check route's write refused after {written} checks: {e}");
                break;
            }
        }
    }
    println!("{written} checks on the order");
    // The buyer's payment succeeds; the webhook must be able to record it.
    let res = w.webhook_success(&a, "tx-paid").await;
    assert!(matches!(res, Ok(SettleResult::Paid)), "the confirmed payment could not be recorded: {res:?}");
}

/// docs/payments.md#webhook-contract-for-payment-providers ("the same
/// success resent under a new notify_id is a duplicate too and changes
/// nothing"): on a CLOSED order the resend changes nothing
/// (the refund's Put is refused), but `settle_success` reads the refund's
/// refusal as `RefundPending`, so the webhook answers `refund_pending` and
/// counts `LatePaymentRefund` again for every resend (an alarmed metric),
/// instead of `duplicate`.
#[tokio::test]
async fn a_resent_success_on_a_closed_order_is_a_duplicate_not_a_new_refund() {
    let w = World::new().await;
    let o = w.order().await;
    let a = w.with_attempt(&o).await;
    w.clock.set(T0 + WINDOW_MS + 20_000);
    assert_eq!(w.closer().close(&o.order_id, "c").await.unwrap(), CloseOutcome::Closed);
    assert_eq!(w.webhook_success(&a, "tx-late").await.unwrap(), SettleResult::RefundPending);
    let again = w.webhook_success(&a, "tx-late").await.unwrap();
    assert_eq!(
        again,
        SettleResult::Duplicate,
        "a resend changed nothing but is reported (and counted) as a new late payment"
    );
}

// ============================================================ GUARDS
// Attacks that held; they pass and stay as regression guards.

/// Invariants 1, 2, 3: the order becomes PAID while CLOSING and held
/// (payment state unknown). The holder's reminder, a swept reminder and
/// an operator check afterwards all acknowledge PAID; nothing is released;
/// exactly one final transition.
#[tokio::test]
async fn paid_while_closing_and_held_stays_paid_and_releases_nothing() {
    let w = World::new().await;
    let o = w.order().await;
    let a = w.with_attempt(&o).await;
    w.channel.answer(&a.payment_id, None);
    w.clock.set(T0 + WINDOW_MS);
    assert!(matches!(w.closer().close(&o.order_id, "c1").await.unwrap(), CloseOutcome::RemindedLater { .. }));
    assert_eq!(w.webhook_success(&a, "tx1").await.unwrap(), SettleResult::Paid);
    // The channel now says the payment is closed/failed: a stale answer
    // must not turn PAID into CLOSED.
    w.channel.answer(&a.payment_id, Some(ChannelPayment::Failed));
    w.clock.set(T0 + WINDOW_MS + 400_000);
    for owner in ["holder-reminder", "sweep-reminder"] {
        assert_eq!(w.closer().close(&o.order_id, owner).await.unwrap(), CloseOutcome::AlreadyFinal(OrderStatus::Paid));
    }
    let v = force_check(&w.closer(), o.order_id.as_str(), "ops").await.unwrap();
    assert_eq!(v["outcome"], "already_final");
    assert_eq!(release_order(&w.store, &w.clock, &o.order_id).await.unwrap().moved, 0);
    let after = w.now_order(&o.order_id).await;
    assert_eq!(after.status, OrderStatus::Paid);
    assert_eq!(final_transitions(&after), 1);
    assert_eq!(w.available("A").await, 1_000 - 3, "the stock stays sold/reserved, never released");
}

/// Invariant 4: release re-driven by the sweep and by the stream at the
/// same time returns the stock exactly once and leaves the index.
#[tokio::test]
async fn concurrent_release_by_sweep_and_stream_returns_stock_once() {
    let w = World::new().await;
    let o = w.order().await;
    w.clock.set(T0 + WINDOW_MS);
    assert_eq!(w.closer().close(&o.order_id, "c").await.unwrap(), CloseOutcome::Closed);
    let wake = RecordedWakeUps::default();
    let (a, b, c) = tokio::join!(
        release_order(&w.store, &w.clock, &o.order_id),
        drive_effects(&w.store, &wake, &w.channel, &w.clock, &o.order_id),
        release_order(&w.store, &w.clock, &o.order_id),
    );
    let moved = a.unwrap().moved + b.unwrap().moved + c.unwrap().moved;
    assert_eq!(moved, 1, "one reservation moved once");
    assert_eq!(w.available("A").await, 1_000);
    assert_eq!(w.index_entry(keys::order(&o.order_id), "ORDER").await, None);
}

/// Invariants 2 and 6: a success found by the closer after another closer
/// (or the webhook) already closed the order becomes a refund, never a
/// revival, and CLOSED appears once in the history.
#[tokio::test]
async fn late_success_on_a_closed_order_is_refunded_and_indexed() {
    let w = World::new().await;
    let o = w.order().await;
    let a = w.with_attempt(&o).await;
    w.clock.set(T0 + WINDOW_MS + 20_000); // past the not-found grace
    assert_eq!(w.closer().close(&o.order_id, "c").await.unwrap(), CloseOutcome::Closed);
    assert_eq!(w.webhook_success(&a, "tx-late").await.unwrap(), SettleResult::RefundPending);
    let before = w.store.order_record(&o.order_id).await.unwrap().unwrap();
    // The same success again (redelivery under a new notify_id) changes
    // nothing (its answer is the subject of a finding above).
    w.webhook_success(&a, "tx-late").await.unwrap();
    let rec = w.store.order_record(&o.order_id).await.unwrap().unwrap();
    assert_eq!(rec.order.status, OrderStatus::Closed);
    assert_eq!(final_transitions(&rec.order), 1);
    assert_eq!(rec.refunds.len(), 1);
    assert_eq!(rec, before, "the resend changed nothing");
    let (shard, _) = w.index_entry(keys::order(&o.order_id), &keys::refund_sk(&a.payment_id)).await.unwrap();
    assert!(shard.starts_with("FX#"), "the pending refund is under the backstop");
}

/// Invariants 4 and 8: a refund re-driven by the sweep while the worker
/// completes it: the re-drive's conditional write is refused once it is
/// REFUNDED, the entry has left the index, and a second delivery is a no-op.
#[tokio::test]
async fn refund_redrive_racing_the_worker_is_harmless() {
    let w = World::new().await;
    let o = w.order().await;
    let a = w.with_attempt(&o).await;
    w.clock.set(T0 + WINDOW_MS + 20_000);
    assert_eq!(w.closer().close(&o.order_id, "c").await.unwrap(), CloseOutcome::Closed);
    assert_eq!(w.webhook_success(&a, "tx").await.unwrap(), SettleResult::RefundPending);
    let refund = w.store.refund(&o.order_id, &a.payment_id).await.unwrap().unwrap();
    let (r1, r2) = tokio::join!(
        process_refund(&w.store, &w.channel, &w.clock, &o.order_id, &a.payment_id),
        process_refund(&w.store, &w.channel, &w.clock, &o.order_id, &a.payment_id),
    );
    let outs = [r1.unwrap(), r2.unwrap()];
    assert!(outs.contains(&RefundOutcome::Refunded), "{outs:?}");
    assert_eq!(w.store.redrive_refund(&refund, w.clock.now()).await.unwrap(), Cas::Rejected);
    assert_eq!(w.index_entry(keys::order(&o.order_id), &keys::refund_sk(&a.payment_id)).await, None);
    // Every channel call used the one idempotency key.
    let keys_used: HashSet<_> = w.channel.refunds.lock().unwrap().iter().map(|(_, k)| k.clone()).collect();
    assert_eq!(keys_used.len(), 1);
}

/// Invariant 5 and 8: lazy reads, duplicate due reminders and an operator
/// check on a DUE order give one close, one CLOSED transition, and leave
/// no reminder chain behind.
#[tokio::test]
async fn duplicate_reminders_on_a_due_order_close_once() {
    let w = World::new().await;
    let o = w.order().await;
    w.clock.set(T0 + WINDOW_MS + 1_000);
    for _ in 0..5 {
        get_order(&w.store, &w.reminders, &w.clock, o.order_id.as_str(), &Reader::Buyer(o.user_id.clone()))
            .await
            .unwrap();
    }
    assert_eq!(reminders_for(&w, &o.order_id), 1, "one lazy reminder");
    let (x, y) = (w.closer(), w.closer());
    let (a, b) = tokio::join!(x.close(&o.order_id, "lazy"), y.close(&o.order_id, "schedule"));
    let v = force_check(&w.closer(), o.order_id.as_str(), "ops").await.unwrap();
    let outs = [a.unwrap(), b.unwrap()];
    assert_eq!(outs.iter().filter(|o| **o == CloseOutcome::Closed).count() + (v["outcome"] == "closed") as usize, 1);
    assert_eq!(reminders_for(&w, &o.order_id), 1, "no chain put back for a due order");
    assert_eq!(final_transitions(&w.now_order(&o.order_id).await), 1);
}

/// Invariant 3 and 8: a closer dies after claiming CLOSING. No reminder
/// exists; the sweep finds it once the lease has run out (not before), the
/// next closer resumes (never reverts to PENDING_PAYMENT), and an unknown
/// channel keeps everything held.
#[tokio::test]
async fn a_dead_closer_is_found_by_the_sweep_after_its_lease_and_nothing_is_released_while_unknown() {
    let w = World::new().await;
    let o = w.order().await;
    let a = w.with_attempt(&o).await;
    w.clock.set(T0 + WINDOW_MS);
    // Simulate "claimed and died": claim CLOSING directly with a 60 s lease.
    let now = w.clock.now();
    let lease = ClosingLease {
        started_at: now,
        owner: "dead".into(),
        lease_until: now.plus(Duration::from_secs(60)),
        resumes: 0,
    };
    let cur = w.now_order(&o.order_id).await;
    assert_eq!(w.store.begin_closing(&cur, &lease, now).await.unwrap(), Cas::Applied);
    let redrive = ScriptedRedrive::default();
    w.clock.set(T0 + WINDOW_MS + 60_000 + 29_000);
    assert_eq!(run_sweep(&w, &redrive, &cfg()).await.open_found, 0, "lease + grace not yet passed");
    w.clock.set(T0 + WINDOW_MS + 60_000 + 31_000);
    let r = run_sweep(&w, &redrive, &cfg()).await;
    assert_eq!(r.open_found, 1);
    assert_eq!(redrive.calls(), vec![format!("close {}", o.order_id)]);
    w.channel.answer(&a.payment_id, None);
    let out = w.closer().close(&o.order_id, "sweep").await.unwrap();
    assert!(matches!(out, CloseOutcome::RemindedLater { .. }), "{out:?}");
    let after = w.now_order(&o.order_id).await;
    assert_eq!(after.status, OrderStatus::Closing);
    assert_eq!(after.closing.unwrap().resumes, 1);
    assert_eq!(w.available("A").await, 1_000 - 3, "nothing released while unknown");
}

/// Bad ids and unknown orders on every entry point the backstop uses.
#[tokio::test]
async fn bad_and_unknown_ids_change_nothing() {
    let w = World::new().await;
    for bad in ["", "ord#x", "ORDER#ord_1", "../x", "a b"] {
        assert!(force_check(&w.closer(), bad, "ops").await.is_err(), "{bad:?}");
        assert!(get_order(&w.store, &w.reminders, &w.clock, bad, &Reader::Operator).await.is_err(), "{bad:?}");
    }
    let missing = OrderId::parse("ord_missing").unwrap();
    assert_eq!(w.closer().close(&missing, "x").await.unwrap(), CloseOutcome::NotFound);
    let wake = RecordedWakeUps::default();
    assert_eq!(drive_effects(&w.store, &wake, &w.channel, &w.clock, &missing).await.unwrap().moved, 0);
    assert_eq!(settle_order(&w.store, &wake, &w.channel, &w.clock, &missing).await.unwrap().moved, 0);
    assert!(w.reminders.0.lock().unwrap().is_empty());
}
