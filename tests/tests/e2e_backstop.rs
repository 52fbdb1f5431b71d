//! The backstop end to end on the deployed local stack
//! (docs/design.md#fault-drills): lost wake-ups (schedule deleted, never
//! created), a closer that dies after CLOSING, a release that fails for a
//! while, many closers at once, lazy expiry on read, and the operator's
//! audited force-check.
//!
//! Fault drills use the stack's fault switches (on in the dev stage the
//! local run deploys, refused in prod); a fault only touches orders whose
//! user id names it. Progress is watched through the admin view, which
//! never nudges a close (a buyer's read would: lazy expiry).

use order_core::domain::Timestamp;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use system_tests::*;

/// The sweep's period on the local stack (the template's minimum, 1 minute).
const SWEEP_PERIOD: Duration = Duration::from_secs(60);

/// The deployed sweep's grace (`SWEEP_GRACE_SECONDS`).
fn sweep_grace() -> Duration {
    Duration::from_secs(deployed_number("SWEEP_GRACE_SECONDS"))
}

/// The deployed closer's lease (`CLOSING_LEASE_SECONDS`).
fn lease() -> Duration {
    Duration::from_secs(deployed_number("CLOSING_LEASE_SECONDS"))
}

async fn seeded(api: &Api, prefix: &str, available: i64) -> String {
    let sku = unique(prefix);
    api.put_stock(&sku, available).await;
    sku
}

async fn create(api: &Api, user: &str, sku: &str, qty: u32) -> (String, Timestamp) {
    let r = api.create_order(&unique("key"), &order_body(user, sku, qty, None)).await;
    assert_eq!(r.status, 201, "{r:?}");
    let id = r.body["order_id"].as_str().unwrap().to_owned();
    let expire_at = Timestamp::parse(r.body["expire_at"].as_str().unwrap()).unwrap();
    (id, expire_at)
}

fn now() -> Timestamp {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    Timestamp::from_unix_millis(ms)
}

/// Sleeps until `t` has passed (plus a little).
async fn sleep_past(t: Timestamp) {
    let left = now().until(t);
    tokio::time::sleep(left + Duration::from_millis(500)).await;
}

/// Polls the admin view (no lazy nudge) until `done` holds.
async fn admin_until(api: &Api, id: &str, what: &str, timeout: Duration, done: impl Fn(&Value) -> bool) -> Value {
    eventually(what, timeout, || async {
        let r = api.admin_order(id).await;
        (r.status == 200 && done(&r.body)).then_some(r.body)
    })
    .await
}

fn entered(view: &Value, status: &str) -> Vec<Value> {
    view["history"].as_array().unwrap().iter().filter(|h| h["to"] == status).cloned().collect()
}

fn closed_at(view: &Value) -> Timestamp {
    Timestamp::parse(entered(view, "CLOSED")[0]["at"].as_str().unwrap()).unwrap()
}

/// Within two sweep periods of the due time, plus the grace and slack for
/// a loaded 2-core machine.
fn sweep_bound() -> Duration {
    2 * SWEEP_PERIOD + sweep_grace() + Duration::from_secs(30)
}

#[tokio::test]
async fn a_deleted_wake_up_is_found_by_the_sweep_and_the_order_closes_within_two_sweep_periods() {
    let api = Api::new();
    let sku = seeded(&api, "bs-deleted", 3).await;
    let (id, expire_at) = create(&api, "bs-user", &sku, 1).await;
    let scheduler = aws_sdk_scheduler::Client::new(&stack_config().await);
    let group = stack_env("SCHEDULE_GROUP_NAME");
    eventually("the wake-up schedule", Duration::from_secs(20), || async {
        scheduler.get_schedule().group_name(&group).name(format!("order-{id}")).send().await.ok()
    })
    .await;
    scheduler.delete_schedule().group_name(&group).name(format!("order-{id}")).send().await.unwrap();

    let view = admin_until(&api, &id, "the sweep to close the order", settle_timeout() + sweep_bound(), |v| {
        v["status"] == "CLOSED"
    })
    .await;
    let lag = expire_at.until(closed_at(&view));
    println!("schedule deleted: expire_at -> CLOSED in {:.1} s (bound {:?})", lag.as_secs_f64(), sweep_bound());
    assert!(lag <= sweep_bound(), "closed {lag:?} after expire_at");
    assert_eq!(entered(&view, "CLOSED").len(), 1);
    eventually("stock back", Duration::from_secs(90), || async {
        (api.stock(&sku).await["available"] == 3).then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_order_whose_wake_up_was_never_created_still_closes_and_releases_once() {
    let api = Api::new();
    let sku = seeded(&api, "bs-never", 4).await;
    let (id, expire_at) = create(&api, &unique("fault-no-wakeup-u"), &sku, 2).await;
    let view = admin_until(&api, &id, "the sweep to close the order", settle_timeout() + sweep_bound(), |v| {
        v["status"] == "CLOSED"
    })
    .await;
    let lag = expire_at.until(closed_at(&view));
    println!("wake-up never created: expire_at -> CLOSED in {:.1} s", lag.as_secs_f64());
    assert!(lag <= sweep_bound(), "closed {lag:?} after expire_at");
    let stock = eventually("stock back once", Duration::from_secs(90), || async {
        let s = api.stock(&sku).await;
        (s["reserved"] == 0).then_some(s)
    })
    .await;
    assert_eq!(stock["available"], 4, "released exactly once");
}

#[tokio::test]
async fn a_buyer_reading_an_overdue_order_sees_it_expired_and_the_read_brings_the_close() {
    let api = Api::new();
    let sku = seeded(&api, "bs-lazy", 2).await;
    let (id, expire_at) = create(&api, &unique("fault-no-wakeup-lazy"), &sku, 1).await;
    let before = api.get_order(&id).await.body;
    assert_eq!(before["expired_awaiting_close"], false);
    sleep_past(expire_at).await;
    let read = api.get_order(&id).await.body;
    // Either the read caught it open (and says so) or something closed it
    // in between; never "open and payable" after expire_at.
    if read["status"] == "PENDING_PAYMENT" {
        assert_eq!(read["expired_awaiting_close"], true, "{read}");
    } else {
        assert_eq!(read["status"], "CLOSED");
    }
    let t = Instant::now();
    let view =
        admin_until(&api, &id, "the lazy reminder to close", Duration::from_secs(30), |v| v["status"] == "CLOSED")
            .await;
    println!("lazy expiry: read -> CLOSED in {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(view["expired_awaiting_close"], false, "final orders are not awaiting anything");
    assert_eq!(api.start_payment(&id).await.status, 409, "no payment after expiry");
}

#[tokio::test]
async fn an_operator_force_check_closes_an_overdue_order_and_is_audited() {
    let api = Api::new();
    let sku = seeded(&api, "bs-check", 2).await;
    let (id, expire_at) = create(&api, &unique("fault-no-wakeup-op"), &sku, 1).await;
    let path = format!("/admin/orders/{id}/check");
    assert_eq!(api.send("POST", &path, &[], None, false).await.status, 403, "IAM only");
    let early = api.send("POST", &path, &[], None, true).await;
    assert_eq!(early.status, 200, "{early:?}");
    assert_eq!(
        (early.body["found"].as_str(), early.body["status"].as_str()),
        (Some("PENDING_PAYMENT"), Some("PENDING_PAYMENT"))
    );
    sleep_past(expire_at).await;
    let r = api.send("POST", &path, &[], None, true).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["status"], "CLOSED", "{r:?}");
    let view = api.admin_order(&id).await.body;
    let checks = view["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 2, "{view}");
    assert!(checks.iter().all(|c| !c["by"].as_str().unwrap().is_empty()));
    assert_eq!(entered(&view, "CLOSED").len(), 1);
    assert_eq!(api.send("POST", "/admin/orders/ord_nope/check", &[], None, true).await.status, 404);
}

#[tokio::test]
async fn a_closer_that_dies_after_claiming_closing_is_resumed_once_its_lease_runs_out() {
    let api = Api::new();
    let sku = seeded(&api, "bs-crash", 2).await;
    let (id, expire_at) = create(&api, &unique("fault-crash-closer-u"), &sku, 1).await;
    let pay = api.start_payment(&id).await;
    assert_eq!(pay.status, 201, "{pay:?}");
    // The closer claims CLOSING at expiry and dies there (message gone too).
    let closing = admin_until(&api, &id, "CLOSING", settle_timeout(), |v| v["status"] == "CLOSING").await;
    let lease_until = Timestamp::parse(closing["closing"]["lease_until"].as_str().unwrap()).unwrap();
    // Only the lease running out and the sweep can bring it back.
    let bound = lease() + sweep_bound();
    let view = admin_until(&api, &id, "the resumed close", settle_timeout() + bound, |v| v["status"] == "CLOSED").await;
    let resumed_after = lease_until.until(closed_at(&view));
    println!(
        "closer died after CLOSING: expire_at -> CLOSED in {:.1} s, {:.1} s after the lease ran out",
        expire_at.until(closed_at(&view)).as_secs_f64(),
        resumed_after.as_secs_f64()
    );
    assert!(resumed_after <= sweep_bound(), "resumed {resumed_after:?} after the lease ran out");
    assert_eq!(entered(&view, "CLOSING").len(), 1, "claimed once, resumed without a second status change");
    assert_eq!(entered(&view, "CLOSED").len(), 1);
    assert!(view["closing"]["resumes"].as_u64().unwrap() >= 1, "{view}");
    eventually("stock back once", Duration::from_secs(90), || async {
        let s = api.stock(&sku).await;
        (s["available"] == 2 && s["reserved"] == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_release_that_fails_for_a_while_is_pending_meanwhile_then_done_exactly_once() {
    let api = Api::new();
    let sku = seeded(&api, "bs-release", 5).await;
    // The release fails (stream record lost, sweep re-drives refused) until
    // 45 s after the order's expiry.
    let until = now().plus(Duration::from_secs(window_seconds() + 45));
    let user = unique(&format!("fault-release-until-{}", until.unix_millis() / 1000));
    let (id, _) = create(&api, &user, &sku, 2).await;
    let closed = admin_until(&api, &id, "CLOSED", settle_timeout(), |v| v["status"] == "CLOSED").await;
    let pending = admin_until(&api, &id, "effects shown pending", Duration::from_secs(30), |v| {
        v["held"]["effects_pending"] == true
    })
    .await;
    // The stock holding (the order also holds a slot of its buyer's open orders).
    let stock = pending["held"]["reservations"].as_array().unwrap().iter().find(|r| r["resource_type"] == "STOCK");
    assert_eq!(stock.map(|r| &r["qty"]), Some(&serde_json::json!(2)), "{pending}");
    assert_eq!(api.stock(&sku).await["reserved"], 2, "nothing released while the release fails");
    let t = Instant::now();
    // A hand-off made while the release still fails is tried again only
    // after PendingEffectsQueue's visibility timeout (the message's
    // redelivery) or the sweep's `hand_off_again_after` (the next hand-off),
    // both 180 s: the entry is moved that far ahead after each hand-off, so
    // the runs in between do not hand the effect on again.
    const HAND_OFF_AGAIN_AFTER: Duration = Duration::from_secs(180);
    let bound = Duration::from_secs(45) + HAND_OFF_AGAIN_AFTER + sweep_bound();
    let done = admin_until(&api, &id, "the backstop's release", bound, |v| v["held"]["effects_pending"] == false).await;
    println!(
        "release failing until {until}: released {:.1} s after CLOSED, {:.1} s after the fault ended \
         ({:.1} s after it was first seen pending)",
        closed_at(&closed).until(now()).as_secs_f64(),
        until.until(now()).as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    assert_eq!(done["reservations"][0]["status"], "RELEASED");
    let stock = api.stock(&sku).await;
    assert_eq!((stock["available"].clone(), stock["reserved"].clone()), (json!(5), json!(0)), "released exactly once");
}

#[tokio::test]
async fn many_closers_at_once_claim_closing_exactly_once() {
    let api = Api::new();
    let sku = seeded(&api, "bs-many", 2).await;
    // No wake-up of its own, so only the ten reminders below race.
    let (id, expire_at) = create(&api, &unique("fault-no-wakeup-many"), &sku, 1).await;
    assert_eq!(api.start_payment(&id).await.status, 201);
    sleep_past(expire_at).await;
    let sends: Vec<_> = (0..10).map(|_| send_close_message(&id)).collect();
    futures_util::future::join_all(sends).await;
    let view = admin_until(&api, &id, "CLOSED", Duration::from_secs(60), |v| v["status"] == "CLOSED").await;
    assert_eq!(entered(&view, "CLOSING").len(), 1, "{view}");
    assert_eq!(entered(&view, "CLOSED").len(), 1, "{view}");
    eventually("stock back once", Duration::from_secs(90), || async {
        let s = api.stock(&sku).await;
        (s["available"] == 2 && s["reserved"] == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn the_sweep_paused_then_resumed_drains_its_backlog() {
    let api = Api::new();
    let scheduler = aws_sdk_scheduler::Client::new(&stack_config().await);
    let name = stack_env("SWEEP_SCHEDULE_NAME");
    let sched = scheduler.get_schedule().name(&name).send().await.expect("the sweep's schedule");
    let set_state = |state: aws_sdk_scheduler::types::ScheduleState| {
        scheduler
            .update_schedule()
            .name(&name)
            .set_group_name(sched.group_name().map(str::to_owned))
            .set_schedule_expression(sched.schedule_expression().map(str::to_owned))
            .set_flexible_time_window(sched.flexible_time_window().cloned())
            .set_target(sched.target().cloned())
            .state(state)
            .send()
    };
    let sku = seeded(&api, "bs-backlog", 20).await;
    // Orders with no wake-up of their own: only the sweep (or a read) closes them.
    let mut orders = Vec::new();
    for _ in 0..20 {
        orders.push(create(&api, &unique("fault-no-wakeup-backlog"), &sku, 1).await);
    }
    // Paused: nothing below panics until the sweep is resumed.
    set_state(aws_sdk_scheduler::types::ScheduleState::Disabled).await.expect("pause the sweep");
    let last_due = orders.iter().map(|(_, e)| *e).max().unwrap().plus(sweep_grace());
    sleep_past(last_due).await;
    let mut open_while_paused = 0;
    for (id, _) in &orders {
        if api.admin_order(id).await.body["status"] == "PENDING_PAYMENT" {
            open_while_paused += 1;
        }
    }
    set_state(aws_sdk_scheduler::types::ScheduleState::Enabled).await.expect("resume the sweep");
    let resumed = Instant::now();
    for (id, _) in &orders {
        admin_until(&api, id, "the backlog to drain", sweep_bound(), |v| v["status"] == "CLOSED").await;
    }
    println!(
        "sweep paused with a backlog of {open_while_paused} overdue orders: drained {:.1} s after it resumed",
        resumed.elapsed().as_secs_f64()
    );
    assert!(open_while_paused > 0, "the pause left a backlog");
    eventually("stock back once", Duration::from_secs(90), || async {
        let s = api.stock(&sku).await;
        (s["available"] == 20 && s["reserved"] == 0).then_some(())
    })
    .await;
}
