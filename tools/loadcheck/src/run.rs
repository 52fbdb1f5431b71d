//! One run: plan the orders, set up what they need (buyers, SKUs, coupons),
//! drive the traffic at the asked rate, control the drills that are not an
//! order's own (the sweep's pause), wait for the drain, check, report.

use crate::client::{Auth, Client};
use crate::place;
use crate::report::{self, OrderRow, RunFacts};
use crate::scenario::{self, Drilled, Driven, OrderPlan, Plan, Scenario, MIX};
use crate::stack::Stack;
use crate::stripe::StripeApi;
use crate::subscriber;
use crate::verify::{self, OrderOutcome, Scope};
use crate::{Args, Channel, Drill};
use futures_util::StreamExt;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use time::OffsetDateTime;

/// The sweep's period on the local stack (the template's minimum).
const SWEEP_PERIOD: Duration = Duration::from_secs(60);

fn bar(multi: &MultiProgress, len: u64, what: &str) -> ProgressBar {
    let pb = multi.add(ProgressBar::new(len));
    pb.set_style(
        ProgressStyle::with_template("{prefix:>10} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
            .expect("a progress template"),
    );
    pb.set_prefix(what.to_owned());
    pb
}

fn secs(stack: &Stack, name: &str, default: u64) -> u64 {
    stack.get_opt(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The order-level drills: the drill asked for, and the plan of the orders
/// that plant it. This order is the order their odds are tried in (for a
/// seed's plan) and the order the summary checks they were exercised in.
const ORDER_DRILLS: [(Drill, Drilled); 8] = [
    (Drill::CrashCloser, Drilled::CrashCloser),
    (Drill::ChannelTimeout, Drilled::ChannelTimeout),
    (Drill::ChannelNotFound, Drilled::ChannelNotFound),
    (Drill::SchedulerDown, Drilled::SchedulerDown),
    (Drill::ReleaseFails, Drilled::ReleaseFails),
    (Drill::SweepPause, Drilled::SweepBacklog),
    (Drill::RelayFails, Drilled::RelayFails),
    (Drill::SlowChannel, Drilled::SlowChannel),
];

/// Picks each order's plan: a drill's share first (by its odds), the
/// everyday mix otherwise. Deterministic for a seed.
fn plan_orders(args: &Args, run_id: &str, release_until: i64) -> Vec<OrderPlan> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let picker = PlanPicker::new(args);
    let mut coupon_n = 0;
    (0..args.orders)
        .map(|i| {
            let plan = picker.pick(&mut rng, i);
            let buyer = buyer_of(plan, args, run_id, release_until, i);
            let coupon = match plan {
                Plan::Mix(s) if s.uses_coupon() => {
                    coupon_n += 1;
                    Some(format!("lc-{run_id}-c{coupon_n}"))
                }
                _ => None,
            };
            let (sku, qty) = match plan {
                // One limited SKU per run, one unit per order.
                Plan::Mix(Scenario::OverTheLimit) => (format!("lc-{run_id}-limited"), 1),
                _ => (format!("lc-{run_id}-sku{}", i % args.skus.max(1)), 1 + (i % 2) as u32),
            };
            let points = match plan {
                Plan::Mix(s) if s.uses_points() => scenario::POINTS_SPENT,
                _ => 0,
            };
            OrderPlan { index: i, plan, buyer, sku, qty, coupon, points, idempotency_key: format!("lc-{run_id}-o{i}") }
        })
        .collect()
}

/// How [`plan_orders`] picks one order's plan from the asked drills and
/// the everyday mix.
struct PlanPicker<'a> {
    args: &'a Args,
    /// The Scheduler is "down" for the middle fifth of the create phase:
    /// every order created then has no wake-up.
    scheduler_down: std::ops::Range<usize>,
    /// The order-level drills asked for but the Scheduler's, each tried by
    /// its odds in this order.
    drilled: Vec<Drilled>,
    total_weight: u32,
}

impl<'a> PlanPicker<'a> {
    fn new(args: &'a Args) -> Self {
        let n = args.orders;
        let drilled = ORDER_DRILLS
            .iter()
            .filter(|(d, o)| *o != Drilled::SchedulerDown && args.drills.contains(d))
            .map(|(_, o)| *o)
            .collect();
        Self { args, scheduler_down: (n * 2 / 5)..(n * 3 / 5), drilled, total_weight: MIX.iter().map(|(_, w)| w).sum() }
    }

    fn pick(&self, rng: &mut rand::rngs::StdRng, i: usize) -> Plan {
        let args = self.args;
        let mut plan = None;
        if args.drills.contains(&Drill::SchedulerDown)
            && self.scheduler_down.contains(&i)
            && rng.gen_bool((args.drill_share * 5.0).min(1.0))
        {
            plan = Some(Plan::Drill(Drilled::SchedulerDown));
        }
        for d in &self.drilled {
            if plan.is_none() && rng.gen_bool(args.drill_share.clamp(0.0, 1.0)) {
                plan = Some(Plan::Drill(*d));
            }
        }
        plan.unwrap_or_else(|| self.everyday(rng))
    }

    /// An everyday order's scenario: `--unpaid-only`, `--only`, or the mix
    /// by its weights.
    fn everyday(&self, rng: &mut rand::rngs::StdRng) -> Plan {
        if self.args.unpaid_only {
            return Plan::Mix(Scenario::NeverPaid);
        }
        if let Some(only) = self.args.only {
            return Plan::Mix(only);
        }
        let mut pick = rng.gen_range(0..self.total_weight);
        let mut chosen = MIX[0].0;
        for (s, w) in MIX {
            if pick < *w {
                chosen = *s;
                break;
            }
            pick -= w;
        }
        Plan::Mix(chosen)
    }
}

/// The buyer of order `i`: a few buyers per drill (the buyer name is what
/// plants it), the run's everyday buyers otherwise.
fn buyer_of(plan: Plan, args: &Args, run_id: &str, release_until: i64, i: usize) -> String {
    let k = i % 4;
    match plan {
        Plan::Drill(Drilled::CrashCloser) => format!("fault-crash-closer-{run_id}-{k}"),
        Plan::Drill(Drilled::SchedulerDown) => format!("fault-no-wakeup-{run_id}-sd{k}"),
        Plan::Drill(Drilled::SweepBacklog) => format!("fault-no-wakeup-{run_id}-sw{k}"),
        Plan::Drill(Drilled::ReleaseFails) => format!("fault-release-until-{release_until}-{run_id}-{k}"),
        Plan::Drill(Drilled::RelayFails) => format!("fault-relay-{run_id}-{k}"),
        Plan::Drill(Drilled::SlowChannel) => format!("fault-slow-channel-{run_id}-{k}"),
        // Stripe's "not found" is the close's: it hears that of the
        // payments of these buyers' orders (`shared/src/faults.rs`).
        Plan::Drill(Drilled::ChannelNotFound) if args.channel == Channel::Stripe => {
            format!("fault-close-sees-no-payment-{run_id}-{k}")
        }
        _ => format!("lc-{run_id}-b{}", i % args.buyers.max(1)),
    }
}

/// Enables or disables the sweep's schedule (a direct Scheduler call: the
/// drill's fault, as in `tests/tests/e2e_backstop.rs`).
async fn set_sweep(stack: &Stack, enabled: bool) -> Result<(), String> {
    use aws_sdk_scheduler::types::ScheduleState;
    let scheduler = aws_sdk_scheduler::Client::new(&stack.sdk);
    let name = stack.get("SWEEP_SCHEDULE_NAME")?;
    let s = scheduler.get_schedule().name(name).send().await.map_err(|e| format!("the sweep's schedule: {e:?}"))?;
    scheduler
        .update_schedule()
        .name(name)
        .set_group_name(s.group_name().map(str::to_owned))
        .set_schedule_expression(s.schedule_expression().map(str::to_owned))
        .set_flexible_time_window(s.flexible_time_window().cloned())
        .set_target(s.target().cloned())
        .state(if enabled { ScheduleState::Enabled } else { ScheduleState::Disabled })
        .send()
        .await
        .map_err(|e| format!("updating the sweep's schedule: {e:?}"))?;
    Ok(())
}

async fn setup(client: &Client, plans: &[OrderPlan], skus: &BTreeMap<String, i64>) -> Result<BTreeSet<String>, String> {
    let buyers: BTreeSet<&str> = plans.iter().map(|p| p.buyer.as_str()).collect();
    let signed: Vec<Result<String, String>> =
        futures_util::stream::iter(buyers.iter().map(|b| client.sign_in(b))).buffer_unordered(8).collect().await;
    signed.into_iter().collect::<Result<Vec<_>, _>>()?;
    for (sku, stock) in skus {
        let body = json!({"available": stock, "price": scenario::PRICE, "currency": "EUR"}).to_string();
        // One key per SKU of the run, so a retry after a lost answer is
        // replayed by the API rather than applied again.
        let key = format!("seed-{sku}");
        let r = client
            .send_retried(|| Auth::Iam, "PUT", &format!("/admin/skus/{sku}"), &[("Idempotency-Key", &key)], Some(&body))
            .await?;
        if r.status != 200 {
            return Err(format!("seeding {sku}: {} {}", r.status, r.body));
        }
    }
    limit_and_credit(client, plans, skus).await?;
    let coupons: Vec<(&str, &str)> =
        plans.iter().filter_map(|p| p.coupon.as_deref().map(|c| (c, p.buyer.as_str()))).collect();
    let issued: Vec<Result<String, String>> = futures_util::stream::iter(coupons.iter().map(|(c, b)| async move {
        let user_id = client.sign_in(b).await?;
        let body = json!({"user_id": user_id, "valid_until": "2099-01-01T00:00:00Z"}).to_string();
        let r = client.admin("PUT", &format!("/admin/coupons/{c}"), Some(&body)).await?;
        if r.status == 200 {
            Ok(c.to_string())
        } else {
            Err(format!("issuing {c}: {} {}", r.status, r.body))
        }
    }))
    .buffer_unordered(8)
    .collect()
    .await;
    issued.into_iter().collect()
}

/// The run's limited SKU gets its purchase limit, and every buyer of a
/// points scenario its points (an audited credit, one key per buyer).
async fn limit_and_credit(client: &Client, plans: &[OrderPlan], skus: &BTreeMap<String, i64>) -> Result<(), String> {
    for sku in skus.keys().filter(|s| s.ends_with("-limited")) {
        let body = json!({"purchase_limit": scenario::PURCHASE_LIMIT}).to_string();
        let key = format!("limit-{sku}");
        let path = format!("/admin/skus/{sku}");
        let r = client.send_retried(|| Auth::Iam, "PUT", &path, &[("Idempotency-Key", &key)], Some(&body)).await?;
        if r.status != 200 {
            return Err(format!("limiting {sku}: {} {}", r.status, r.body));
        }
    }
    let buyers: BTreeSet<&str> = plans.iter().filter(|p| p.points > 0).map(|p| p.buyer.as_str()).collect();
    for buyer in buyers {
        let user_id = client.sign_in(buyer).await?;
        let body = json!({"currency": "EUR", "credit": scenario::POINTS_CREDIT, "reason": "loadcheck"}).to_string();
        let (key, path) = (format!("points-{buyer}"), format!("/admin/buyers/{user_id}/points"));
        let r = client.send_retried(|| Auth::Iam, "POST", &path, &[("Idempotency-Key", &key)], Some(&body)).await?;
        if r.status != 200 {
            return Err(format!("crediting {buyer}'s points: {} {}", r.status, r.body));
        }
    }
    Ok(())
}

/// Units still reserved over the run's SKUs (None if a read failed).
async fn reserved_units(client: &Client, skus: &BTreeMap<String, i64>) -> Option<i64> {
    let mut total = 0;
    for sku in skus.keys() {
        let r = client.admin("GET", &format!("/admin/skus/{sku}"), None).await.ok()?;
        total += r.body["reserved"].as_i64()?;
    }
    Some(total)
}

/// Whether an admin view shows the order final with nothing left to do.
fn settled(view: &Value) -> bool {
    matches!(view["status"].as_str(), Some("PAID" | "CLOSED"))
        && view["held"]["effects_pending"] == false
        && view["held"]["refunds_pending"].as_array().is_some_and(|a| a.is_empty())
}

fn outcome_of(view: &Value, expire_at: OffsetDateTime) -> OrderOutcome {
    let parse = |v: &Value| {
        v.as_str().and_then(|s| OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok())
    };
    let final_at = view["history"]
        .as_array()
        .and_then(|h| h.iter().find(|e| e["to"] == "PAID" || e["to"] == "CLOSED"))
        .and_then(|e| parse(&e["at"]));
    OrderOutcome {
        order_id: view["order_id"].as_str().unwrap_or("").to_owned(),
        status: view["status"].as_str().unwrap_or("?").to_owned(),
        expire_at,
        final_at,
        refunds: view["refunds"].as_array().map_or(0, |r| r.len()),
    }
}

pub async fn run(mut args: Args) -> i32 {
    let paused_sweep = args.check.is_none() && args.drills.contains(&Drill::SweepPause);
    // The run id is fixed here, so that what a run that failed midway made
    // on the stack can be found by its name and removed.
    let run_id = args.run_id.get_or_insert_with(|| format!("lc{:06x}", rand::random::<u32>() & 0xff_ffff)).clone();
    let subscribed = args.check.is_none() && args.drills.contains(&Drill::RelayFails);
    let stack_env = args.stack_env.clone();
    let result = match args.check.clone() {
        Some(scope) => check_only(&args, &scope).await,
        None => run_inner(args).await,
    };
    if (paused_sweep || subscribed) && result.is_err() {
        if let Ok(stack) = Stack::load(&stack_env).await {
            // A run that failed midway must not leave the stack without its sweep.
            if paused_sweep {
                if let Err(e) = set_sweep(&stack, true).await {
                    eprintln!("loadcheck: the sweep's schedule may still be disabled: {e}");
                }
            }
            // Nor its subscriber's rule on the stack's bus and its queue.
            if subscribed {
                if let Err(e) = subscriber::remove_leftover(&stack, &subscriber::name_for(&run_id)).await {
                    eprintln!("loadcheck: {e}");
                }
            }
        }
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("loadcheck: the run could not be made: {e}");
            2
        }
    }
}

/// The Stripe server for `--channel stripe` (`None` with the sandbox), and
/// the drills it cannot run dropped from `args`, each with a note.
fn stripe_setup(args: &mut Args, stack: &Stack, notes: &mut Vec<String>) -> Result<Option<Arc<StripeApi>>, String> {
    if args.channel != Channel::Stripe {
        return Ok(None);
    }
    let api = StripeApi::from_stack(stack, args.stripe_concurrency).ok_or(
        "--channel stripe needs the stack's Stripe server: STRIPE_SECRET_KEY (and STRIPE_API_BASE_URL) are not \
         among its outputs",
    )?;
    if api.webhook_secret.is_none() {
        return Err("--channel stripe needs STRIPE_WEBHOOK_SECRET (the stack's webhook signing secret)".into());
    }
    if args.drills.contains(&Drill::ChannelTimeout) {
        args.drills.retain(|d| *d != Drill::ChannelTimeout);
        let why = "channel-timeout skipped: it plants a query timeout in the sandbox channel, and Stripe \
                   (localstripe) has no such fault";
        println!("{why}");
        notes.push(why.to_owned());
    }
    if args.drills.contains(&Drill::SlowChannel) {
        args.drills.retain(|d| *d != Drill::SlowChannel);
        let why = "slow-channel skipped: it slows the sandbox channel's answers, and Stripe (localstripe) has no \
                   such fault";
        println!("{why}");
        notes.push(why.to_owned());
    }
    Ok(Some(Arc::new(api)))
}

/// Shows how hard the run leans on the Stripe server while it runs, and
/// how many of the `total` orders have `acted`: the spinner's message, or a
/// line every 15 s when the bars are hidden.
fn stripe_progress(
    multi: &MultiProgress,
    api: &Arc<StripeApi>,
    acted: Arc<std::sync::atomic::AtomicUsize>,
    total: usize,
) -> tokio::task::JoinHandle<()> {
    let (api, hidden) = (api.clone(), multi.is_hidden());
    let pb = multi.add(ProgressBar::new_spinner());
    pb.set_style(ProgressStyle::with_template("{prefix:>10} [{elapsed_precise}] {msg}").expect("a progress template"));
    pb.set_prefix("stripe");
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(if hidden { 15_000 } else { 500 }));
        tick.tick().await;
        loop {
            tick.tick().await;
            let line = format!(
                "{}/{total} orders acted; {}",
                acted.load(std::sync::atomic::Ordering::Relaxed),
                api.progress()
            );
            if hidden {
                eprintln!("loadcheck stripe: {line}");
            } else {
                pb.set_message(line);
            }
        }
    })
}

/// The accepted orders by id: each one's `expire_at` and its plan's index.
type Expiries = BTreeMap<String, (OffsetDateTime, usize)>;

/// What every phase of a run uses: the asked run, the stack with the
/// settings read from it, the client of its surface, the drills' notes.
struct Run {
    args: Args,
    stack: Stack,
    /// The Stripe server, with `--channel stripe`.
    stripe: Option<Arc<StripeApi>>,
    run_id: String,
    /// The payment window, the sweep's grace and the CLOSING lease (s).
    window: u64,
    grace: u64,
    lease: u64,
    client: Arc<Client>,
    out_dir: PathBuf,
    /// What the drills did, or why one did not run, for the summary.
    drill_notes: Vec<String>,
}

/// The plan: the orders, the run's SKUs and the drills the run controls.
struct Planned {
    started_at: OffsetDateTime,
    plans: Vec<OrderPlan>,
    /// Each SKU of the run with the stock it is seeded with.
    skus: BTreeMap<String, i64>,
    stock_per_sku: i64,
    restart_emulator: bool,
    lost_answers: Option<LostResponseDrill>,
}

/// The traffic's progress: its bars, when it started, how many orders
/// have done their scenario's steps.
struct Progress {
    multi: MultiProgress,
    t_traffic: Instant,
    acted: Arc<std::sync::atomic::AtomicUsize>,
}

impl Progress {
    /// The bars (hidden with `--quiet`), and the traffic's clock started.
    fn start(quiet: bool) -> Self {
        Self {
            multi: MultiProgress::with_draw_target(if quiet {
                ProgressDrawTarget::hidden()
            } else {
                ProgressDrawTarget::stderr()
            }),
            t_traffic: Instant::now(),
            acted: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        }
    }
}

/// What the traffic (or the direct placement) left.
struct Traffic {
    /// Each plan's order as driven, by plan index (None: its driver failed).
    driven: Vec<Option<Driven>>,
    /// When the last create was accepted, in ms after the traffic started.
    last_create: u64,
    /// The traffic's length in seconds of scenario time.
    secs: f64,
    restarted_at: Option<OffsetDateTime>,
    restart_note: Option<String>,
}

/// The orders the API accepted.
struct Accepted {
    expire: Expiries,
    create_ms: Vec<u64>,
    last_expire: OffsetDateTime,
}

/// What the drain saw.
struct Drained {
    stock_released_at: Option<OffsetDateTime>,
    /// The last admin view read of each accepted order.
    views: BTreeMap<String, Value>,
    /// The orders not settled when the drain ended.
    open: Vec<String>,
}

async fn run_inner(args: Args) -> Result<i32, String> {
    if args.place_direct && !args.drills.is_empty() {
        return Err("--place-direct is the drain benchmark's placement: unpaid orders only, without drills \
                    (the drills plant their faults through the API's buyers and payments)"
            .into());
    }
    let mut run = Run::open(args).await?;
    let planned = run.plan();
    let coupons = run.setup(&planned).await?;
    let relay_subscriber = run.subscribe().await?;
    let sweep_paused = run.pause_sweep().await?;

    let progress = Progress::start(run.args.quiet);
    let stripe_ticker = run
        .stripe
        .as_ref()
        .map(|api| stripe_progress(&progress.multi, api, progress.acted.clone(), planned.plans.len()));
    let traffic = run.traffic(&planned, &progress).await?;
    let mut scope = Scope {
        skus: planned.skus.clone(),
        coupons,
        started_at: Some(planned.started_at),
        restarted_at: traffic.restarted_at,
        event_queue_url: relay_subscriber.as_ref().map(|s| s.queue_url.clone()),
        ..Default::default()
    };
    let accepted = accept(&mut scope, &planned.plans, &traffic)?;
    let sweep_resumed = if sweep_paused { Some(run.resume_sweep(&planned.plans, &accepted).await?) } else { None };
    let drained = run.drain(&planned.skus, &accepted.expire, &progress.multi).await;
    if let (Some(ticker), Some(api)) = (stripe_ticker, &run.stripe) {
        ticker.abort();
        run.drill_notes.push(format!("stripe (the buyers' side, traffic and drain): {}", api.progress()));
    }
    let drain_notes = run.drain_notes(&drained, &planned.plans, &accepted.expire);
    let settled_at = OffsetDateTime::now_utc();

    // The invariant check over the run's records.
    scope.open_bound = run.open_bound(sweep_paused, &accepted);
    write_scope(&run.out_dir.join("scope.json"), &scope)?;
    let verdict = verify::verify(&run.stack, &scope, run.args.stripe_concurrency).await;
    if let Some(sub) = relay_subscriber {
        if let Err(e) = sub.remove(&run.stack).await {
            eprintln!("loadcheck: {e}");
        }
    }

    let rows = order_rows(&planned.plans, &traffic.driven, &accepted.expire, &drained.views, &verdict);
    let backlog_drain = sweep_resumed.map(|resumed| (resumed, last_backlog_final(&rows)));
    let mut drill_notes = std::mem::take(&mut run.drill_notes);
    let facts = RunFacts {
        run_id: run.run_id.clone(),
        rate: run.args.rate,
        window: run.window,
        create_ms: accepted.create_ms,
        first_create_to_last_s: traffic.last_create as f64 / 1000.0,
        last_expire: accepted.last_expire,
        stock_released_at: drained.stock_released_at,
        settled_at,
        backlog_drain,
        drill_failures: planned.lost_answers.map(|d| d.finish(&mut drill_notes)).into_iter().flatten().collect(),
        drill_notes: drill_notes.into_iter().chain(traffic.restart_note).collect(),
        stripe: run.stripe.is_some(),
        drain_notes,
        out_dir: run.out_dir,
        replays: rows.iter().map(|r| r.driven.replays as usize).sum(),
        drills_asked: ORDER_DRILLS
            .into_iter()
            .filter(|(d, _)| run.args.drills.contains(d))
            .map(|(_, o)| Plan::Drill(o).name())
            .collect(),
    };
    Ok(report::report(&facts, &rows, verdict))
}

impl Run {
    /// Loads the stack, drops the drills its channel cannot run, reads its
    /// settings and makes the run's output folder.
    async fn open(mut args: Args) -> Result<Self, String> {
        let stack = Stack::load(&args.stack_env).await?;
        stack.export_to_env();
        let mut drill_notes = Vec::new();
        let stripe = stripe_setup(&mut args, &stack, &mut drill_notes)?;
        let run_id = args.run_id.clone().ok_or("no run id")?;
        let window = secs(&stack, "PAYMENT_WINDOW_SECONDS", 30);
        let grace = secs(&stack, "SWEEP_GRACE_SECONDS", 5);
        let lease = secs(&stack, "CLOSING_LEASE_SECONDS", 35);
        let base = stack.get("API_BASE_URL")?;
        let notify_base = stack.get("NOTIFY_API_BASE_URL")?;
        let secret = stack.get_opt("SANDBOX_WEBHOOK_SECRET").unwrap_or("local-sandbox-webhook-secret").to_owned();
        let merchant = stack.get_opt("MERCHANT_ID").unwrap_or("merchant-local").to_owned();
        let client = Arc::new(Client::new(base, notify_base, secret, merchant, args.concurrency));
        let out_dir = args.out.clone().unwrap_or_else(|| PathBuf::from(format!("target/loadcheck/{run_id}")));
        std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
        Ok(Self { args, stack, stripe, run_id, window, grace, lease, client, out_dir, drill_notes })
    }

    /// Plans the orders and their SKUs, says what the run will do, and
    /// decides the drills that need the stack's consent.
    fn plan(&mut self) -> Planned {
        let args = &self.args;
        let run_id = &self.run_id;
        let create_estimate = (args.orders as f64 / args.rate.max(0.1)).ceil() as i64;
        let started_at = OffsetDateTime::now_utc();
        let started_unix = started_at.unix_timestamp();
        // Buyer names are fixed before the traffic (they sign in first), so the
        // release's outage ends at a time planned from the asked rate, with
        // room for a stack slower than asked.
        let release_until = started_unix + 2 * create_estimate + 30 + self.window as i64 + args.release_outage as i64;
        let plans = plan_orders(args, run_id, release_until);
        let stock_per_sku = (args.orders as i64 * 2) / args.skus.max(1) as i64 + 10;
        let mut skus: BTreeMap<String, i64> =
            (0..args.skus.max(1)).map(|j| (format!("lc-{run_id}-sku{j}"), stock_per_sku)).collect();
        if plans.iter().any(|p| p.plan == Plan::Mix(Scenario::OverTheLimit)) {
            skus.insert(format!("lc-{run_id}-limited"), stock_per_sku);
        }
        self.say_plan(&plans, &skus);
        let restart_emulator = self.emulator_restart_possible();
        let lost_answers = if self.args.drills.contains(&Drill::LostResponse) {
            LostResponseDrill::start(&self.stack, &self.args.stack_env, &mut self.drill_notes)
        } else {
            None
        };
        Planned { started_at, plans, skus, stock_per_sku, restart_emulator, lost_answers }
    }

    /// Prints the run's line and its mix.
    fn say_plan(&self, plans: &[OrderPlan], skus: &BTreeMap<String, i64>) {
        let (args, run_id, window) = (&self.args, &self.run_id, self.window);
        let mut mix: BTreeMap<&str, usize> = BTreeMap::new();
        for p in plans {
            *mix.entry(p.plan.name()).or_default() += 1;
        }
        println!(
            "loadcheck run {run_id}: {} orders at {}/s (≤{} requests in flight) over {} SKUs, window {window} s; \
             channel {}; drills: {:?}",
            args.orders,
            args.rate,
            args.concurrency,
            skus.len(),
            match &self.stripe {
                Some(s) => format!("stripe at {} (≤{} calls in flight)", s.base_url(), s.concurrency),
                None => "sandbox".to_owned(),
            },
            args.drills
        );
        println!(
            "mix (weights of the everyday scenarios: {}):",
            MIX.iter().map(|(s, w)| format!("{} {w}", s.name())).collect::<Vec<_>>().join(", ")
        );
        for (name, n) in &mix {
            println!("  {name:<26} {n:>6}");
        }
    }

    /// Whether the emulator-restart drill runs: asked, and the stack keeps
    /// its state across a restart (otherwise said, and noted).
    fn emulator_restart_possible(&mut self) -> bool {
        let restart_emulator = self.args.drills.contains(&Drill::EmulatorRestart);
        if restart_emulator && self.stack.get_opt("PERSIST_STATE") != Some("1") {
            let why = "emulator-restart skipped: the stack was started without PERSIST_STATE=1, so ministack \
                       keeps its state in memory only and a restart would lose every order, queue and schedule \
                       of the run (start it with `PERSIST_STATE=1 infra/local.sh up` to run this drill)";
            println!("{why}");
            self.drill_notes.push(why.to_owned());
        }
        restart_emulator && self.stack.get_opt("PERSIST_STATE") == Some("1")
    }

    /// Signs the buyers in, seeds the SKUs, issues the coupons: the coupons.
    async fn setup(&self, planned: &Planned) -> Result<BTreeSet<String>, String> {
        let (plans, skus, stock_per_sku) = (&planned.plans, &planned.skus, planned.stock_per_sku);
        let t_setup = Instant::now();
        let coupons = setup(&self.client, plans, skus).await?;
        println!(
            "setup: {} buyers signed in, {} SKUs seeded with {stock_per_sku} each, {} coupons issued in {:.1} s",
            plans.iter().map(|p| &p.buyer).collect::<BTreeSet<_>>().len(),
            skus.len(),
            coupons.len(),
            t_setup.elapsed().as_secs_f64()
        );
        Ok(coupons)
    }

    /// The relay-fails drill is checked by what a subscriber of the bus got
    /// too: the run subscribes a queue of its own to the drill's buyers.
    async fn subscribe(&mut self) -> Result<Option<subscriber::RunSubscriber>, String> {
        if !self.args.drills.contains(&Drill::RelayFails) {
            return Ok(None);
        }
        let run_id = &self.run_id;
        let made = subscriber::subscribe(&self.stack, &subscriber::name_for(run_id), &format!("fault-relay-{run_id}-"))
            .await?;
        if made.is_none() {
            let why = "relay-fails: the stack names no order event bus (ORDER_EVENT_BUS_NAME), so no subscriber \
                       queue can show its events: checked by its effects only";
            println!("{why}");
            self.drill_notes.push(why.to_owned());
        }
        Ok(made)
    }

    /// The sweep-pause drill's start: the sweep's schedule disabled.
    async fn pause_sweep(&self) -> Result<bool, String> {
        let sweep_paused = self.args.drills.contains(&Drill::SweepPause);
        if sweep_paused {
            set_sweep(&self.stack, false).await?;
            println!("drill sweep-pause: the sweep's schedule is disabled");
        }
        Ok(sweep_paused)
    }
}

impl Run {
    /// The traffic: the orders driven at the asked rate, or placed directly
    /// (`--place-direct`).
    async fn traffic(&self, planned: &Planned, progress: &Progress) -> Result<Traffic, String> {
        let mut traffic = if self.args.place_direct {
            self.place_directly(&planned.plans, progress).await?
        } else {
            self.drive_all(planned, progress).await?
        };
        traffic.secs = progress.t_traffic.elapsed().as_secs_f64();
        Ok(traffic)
    }

    async fn place_directly(&self, plans: &[OrderPlan], progress: &Progress) -> Result<Traffic, String> {
        let buyers: BTreeMap<String, String> = {
            let mut m = BTreeMap::new();
            for b in plans.iter().map(|p| p.buyer.clone()).collect::<BTreeSet<_>>() {
                let id = self.client.sign_in(&b).await?;
                m.insert(b, id);
            }
            m
        };
        let window = self.window;
        let first_expire = OffsetDateTime::now_utc() + Duration::from_secs(window);
        let rule_version = format!("window-{window}s");
        let placed_bar = bar(&progress.multi, plans.len() as u64, "placed");
        let placed = place::place_direct(
            &self.stack,
            plans,
            &buyers,
            &place::Timing {
                first_expire,
                spread: Duration::from_secs(self.args.expire_spread),
                concurrency: self.args.concurrency,
            },
            &rule_version,
            &placed_bar,
        )
        .await?;
        placed_bar.finish();
        let last = progress.t_traffic.elapsed().as_millis() as u64;
        let driven = placed.into_iter().map(Some).collect::<Vec<_>>();
        Ok(Traffic { driven, last_create: last, secs: 0.0, restarted_at: None, restart_note: None })
    }

    /// The traffic: one task per order, started at the asked rate.
    async fn drive_all(&self, planned: &Planned, progress: &Progress) -> Result<Traffic, String> {
        let (plans, multi, t_traffic) = (&planned.plans, &progress.multi, progress.t_traffic);
        let created_bar = bar(multi, plans.len() as u64, "created");
        let done_bar = bar(multi, plans.len() as u64, "acted");
        let opts = Arc::new(scenario::DriveOptions {
            channel_outage: Duration::from_secs(self.args.channel_outage),
            stripe: self.stripe.clone(),
        });
        // The emulator restart comes when half the orders are created.
        let created_count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let restart = planned.restart_emulator.then(|| self.restart_emulator_at(plans.len() / 2, &created_count));
        let mut tasks = tokio::task::JoinSet::new();
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / self.args.rate.max(0.1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let created_at_end = Arc::new(std::sync::Mutex::new(Vec::<(usize, u64)>::new()));
        for p in plans.iter().cloned() {
            tick.tick().await;
            let (client, opts, created_bar, done_bar, acted) =
                (self.client.clone(), opts.clone(), created_bar.clone(), done_bar.clone(), progress.acted.clone());
            let ends = created_at_end.clone();
            let created_count = created_count.clone();
            let t0 = t_traffic;
            tasks.spawn(async move {
                let on_created = || {
                    created_count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    created_bar.inc(1);
                    ends.lock().unwrap().push((p.index, t0.elapsed().as_millis() as u64));
                };
                let d = scenario::drive(&client, &p, &opts, &on_created).await;
                done_bar.inc(1);
                acted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                (p.index, d)
            });
        }
        let mut driven: Vec<Option<Driven>> = vec![None; plans.len()];
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((i, d)) => driven[i] = Some(d),
                Err(e) => eprintln!("an order's driver failed: {e}"),
            }
        }
        created_bar.finish();
        done_bar.finish();
        let (restarted_at, restart_note) = match restart {
            Some(task) => restart_outcome(task).await?,
            None => (None, None),
        };
        let last = created_at_end.lock().unwrap().iter().map(|(_, t)| *t).max().unwrap_or(0);
        Ok(Traffic { driven, last_create: last, secs: 0.0, restarted_at, restart_note })
    }

    /// The emulator-restart drill: once `half` the orders are created,
    /// `infra/local.sh restart`; when it stopped the emulator, and how long
    /// the restart took (s).
    fn restart_emulator_at(
        &self,
        half: usize,
        created_count: &Arc<std::sync::atomic::AtomicUsize>,
    ) -> tokio::task::JoinHandle<Result<(OffsetDateTime, f64), String>> {
        let created_count = created_count.clone();
        let root = self.args.stack_env.canonicalize().ok().and_then(|p| p.parent()?.parent().map(PathBuf::from));
        tokio::spawn(async move {
            while created_count.load(std::sync::atomic::Ordering::Relaxed) < half {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let at = OffsetDateTime::now_utc();
            let t = Instant::now();
            let out = tokio::task::spawn_blocking(move || {
                let root = root.ok_or("the repository root (the stack file's folder's parent) is unknown")?;
                std::process::Command::new(root.join("infra/local.sh"))
                    .arg("restart")
                    .current_dir(&root)
                    .output()
                    .map_err(|e| format!("infra/local.sh restart: {e}"))
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
            let took = t.elapsed().as_secs_f64();
            match out {
                Ok(o) if o.status.success() => Ok((at, took)),
                Ok(o) => Err(format!(
                    "infra/local.sh restart failed ({}): {}{}",
                    o.status,
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )),
                Err(e) => Err(e),
            }
        })
    }

    /// The sweep comes back once its backlog is due, plus the pause: when
    /// it was enabled again.
    async fn resume_sweep(&self, plans: &[OrderPlan], accepted: &Accepted) -> Result<OffsetDateTime, String> {
        let last_backlog = accepted
            .expire
            .values()
            .filter(|(_, i)| plans[*i].plan == Plan::Drill(Drilled::SweepBacklog))
            .map(|(e, _)| *e)
            .max()
            .unwrap_or(accepted.last_expire);
        let resume_at = last_backlog + Duration::from_secs(self.grace + self.args.sweep_pause);
        let wait = (resume_at - OffsetDateTime::now_utc()).whole_milliseconds().max(0) as u64;
        println!("drill sweep-pause: resuming the sweep in {:.0} s", wait as f64 / 1000.0);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        set_sweep(&self.stack, true).await?;
        Ok(OffsetDateTime::now_utc())
    }

    /// The drain: stock first (every reservation released or sold means
    /// every order is final), then each order's own effects and refunds.
    async fn drain(&self, skus: &BTreeMap<String, i64>, expire: &Expiries, multi: &MultiProgress) -> Drained {
        let drain_deadline = Instant::now() + Duration::from_secs(self.args.drain_timeout);
        let stock_released_at = self.drain_stock(skus, multi, drain_deadline).await;
        let (views, open) = self.drain_orders(expire, multi, drain_deadline).await;
        Drained { stock_released_at, views, open }
    }

    /// Waits until no unit is reserved over the run's SKUs: when that was seen.
    async fn drain_stock(
        &self,
        skus: &BTreeMap<String, i64>,
        multi: &MultiProgress,
        drain_deadline: Instant,
    ) -> Option<OffsetDateTime> {
        let client = &self.client;
        let initial_reserved = reserved_units(client, skus).await.unwrap_or(0);
        let stock_bar = bar(multi, initial_reserved.max(0) as u64, "reserved");
        stock_bar.set_message("units still reserved over the run's SKUs");
        let mut stock_released_at = None;
        loop {
            if let Some(left) = reserved_units(client, skus).await {
                stock_bar.set_position((initial_reserved - left).max(0) as u64);
                if left == 0 {
                    stock_released_at = Some(OffsetDateTime::now_utc());
                    break;
                }
            }
            if Instant::now() > drain_deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1000)).await;
        }
        stock_bar.finish();
        stock_released_at
    }

    /// Reads the orders' admin views until each is settled: the last view
    /// of each, and the orders still not settled.
    async fn drain_orders(
        &self,
        expire: &Expiries,
        multi: &MultiProgress,
        drain_deadline: Instant,
    ) -> (BTreeMap<String, Value>, Vec<String>) {
        let order_bar = bar(multi, expire.len() as u64, "settled");
        order_bar.set_message("orders final with nothing pending");
        let mut views: BTreeMap<String, Value> = BTreeMap::new();
        let mut open: Vec<String> = expire.keys().cloned().collect();
        loop {
            let read: Vec<(String, Result<Value, String>)> =
                futures_util::stream::iter(open.iter().cloned().map(|id| {
                    let client = self.client.clone();
                    async move {
                        let v = scenario::admin_view(&client, &id).await;
                        (id, v)
                    }
                }))
                .buffer_unordered(self.args.concurrency.max(1))
                .collect()
                .await;
            open.clear();
            for (id, v) in read {
                match v {
                    Ok(v) if settled(&v) => {
                        views.insert(id, v);
                        order_bar.inc(1);
                    }
                    Ok(v) => {
                        views.insert(id.clone(), v);
                        open.push(id);
                    }
                    Err(_) => open.push(id),
                }
            }
            if open.is_empty() || Instant::now() > drain_deadline {
                break;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        order_bar.finish();
        (views, open)
    }

    /// What the summary says of a drain that timed out (nothing otherwise).
    fn drain_notes(&self, drained: &Drained, plans: &[OrderPlan], expire: &Expiries) -> Vec<String> {
        let mut drain_notes = Vec::new();
        let open = &drained.open;
        if !open.is_empty() {
            drain_notes.push(format!(
                "drain timed out after {} s with {} orders not settled, e.g.:",
                self.args.drain_timeout,
                open.len()
            ));
            for id in open.iter().take(10) {
                let v = drained.views.get(id).cloned().unwrap_or(Value::Null);
                drain_notes.push(format!(
                    "  {id} ({}): status {}, held {}",
                    plans[expire[id].1].plan.name(),
                    v["status"],
                    v["held"]
                ));
            }
        }
        drain_notes
    }

    /// How long past `expire_at` an order may still be open before the
    /// check calls it a violation.
    fn open_bound(&self, sweep_paused: bool, accepted: &Accepted) -> Duration {
        let (grace, last_expire) = (self.grace, accepted.last_expire);
        2 * SWEEP_PERIOD
            + Duration::from_secs(grace + self.lease + 60)
            + if sweep_paused {
                // Everything due while the sweep was off waits for it.
                let first_expire = accepted.expire.values().map(|(e, _)| *e).min().unwrap_or(last_expire);
                Duration::from_secs(self.args.sweep_pause + grace)
                    + Duration::from_millis((last_expire - first_expire).whole_milliseconds().max(0) as u64)
            } else {
                Duration::ZERO
            }
            + Duration::from_secs(self.args.channel_outage)
    }
}

/// The emulator-restart drill's end: when it stopped the emulator and the
/// note saying so (printed), or why it failed.
async fn restart_outcome(
    task: tokio::task::JoinHandle<Result<(OffsetDateTime, f64), String>>,
) -> Result<(Option<OffsetDateTime>, Option<String>), String> {
    let (at, took) = match task.await {
        Ok(Ok(restarted)) => restarted,
        Ok(Err(e)) => return Err(format!("drill emulator-restart: {e}")),
        Err(e) => return Err(format!("drill emulator-restart: {e}")),
    };
    let note = format!(
        "drill emulator-restart: ministack stopped and started again with its state at {} ({took:.1} s), \
         half the orders created; calls in flight then were retried",
        at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
    );
    println!("{note}");
    Ok((Some(at), Some(note)))
}

/// The accepted orders into the scope (the relay-fails drill's apart too),
/// said; an error when none was.
fn accept(scope: &mut Scope, plans: &[OrderPlan], traffic: &Traffic) -> Result<Accepted, String> {
    let mut expire: Expiries = BTreeMap::new();
    for (i, d) in traffic.driven.iter().enumerate() {
        if let Some(Driven { order_id: Some(id), expire_at: Some(e), .. }) = d {
            scope.orders.insert(id.clone());
            if plans[i].plan == Plan::Drill(Drilled::RelayFails) {
                scope.relay_orders.insert(id.clone());
            }
            expire.insert(id.clone(), (*e, i));
        }
    }
    let create_ms: Vec<u64> = traffic.driven.iter().flatten().filter_map(|d| d.create_ms).collect();
    println!(
        "traffic: {} orders accepted in {:.1} s of scenario time; creates done {:.1} s after the first started",
        scope.orders.len(),
        traffic.secs,
        traffic.last_create as f64 / 1000.0
    );
    let Some(last_expire) = expire.values().map(|(e, _)| *e).max() else {
        return Err("no order was accepted".into());
    };
    Ok(Accepted { expire, create_ms, last_expire })
}

/// Each plan with what driving it produced and its order's outcome: the
/// check's, or else the one the drain's last admin view shows.
fn order_rows(
    plans: &[OrderPlan],
    driven: &[Option<Driven>],
    expire: &Expiries,
    views: &BTreeMap<String, Value>,
    verdict: &Result<verify::Verdict, String>,
) -> Vec<OrderRow> {
    let own: Vec<OrderOutcome> =
        expire.iter().filter_map(|(id, (e, _))| views.get(id).map(|v| outcome_of(v, *e))).collect();
    let outcomes = match verdict {
        Ok(v) if !v.orders.is_empty() => v.orders.clone(),
        _ => own,
    };
    let by_id: BTreeMap<&str, &OrderOutcome> = outcomes.iter().map(|o| (o.order_id.as_str(), o)).collect();
    plans
        .iter()
        .zip(driven)
        .map(|(p, d)| {
            let d = d.clone().unwrap_or_default();
            let outcome = d.order_id.as_deref().and_then(|id| by_id.get(id)).map(|o| (*o).clone());
            OrderRow { index: p.index, plan: p.plan, driven: d, outcome }
        })
        .collect()
}

/// When the sweep-pause drill's backlog was final, the last of its orders.
fn last_backlog_final(rows: &[OrderRow]) -> Option<OffsetDateTime> {
    rows.iter()
        .filter(|r| r.plan == Plan::Drill(Drilled::SweepBacklog))
        .filter_map(|r| r.outcome.as_ref().and_then(|o| o.final_at))
        .max()
}

/// The run's scope as `scope.json`, so the check can be run again later.
fn write_scope(path: &std::path::Path, scope: &Scope) -> Result<(), String> {
    let v = json!({
        "orders": scope.orders, "skus": scope.skus, "coupons": scope.coupons,
        "open_bound_seconds": scope.open_bound.as_secs(),
        "started_at": scope.started_at.and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok()),
        "relay_orders": scope.relay_orders, "event_queue_url": scope.event_queue_url,
        "restarted_at": scope.restarted_at.and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok()),
    });
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap_or_default())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn read_scope(path: &std::path::Path) -> Result<Scope, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let strings = |k: &str| -> BTreeSet<String> {
        v[k].as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect()
    };
    Ok(Scope {
        orders: strings("orders"),
        skus: v["skus"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, n)| n.as_i64().map(|n| (k.clone(), n)))
            .collect(),
        coupons: strings("coupons"),
        open_bound: Duration::from_secs(v["open_bound_seconds"].as_u64().unwrap_or(300)),
        started_at: v["started_at"]
            .as_str()
            .and_then(|t| OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()),
        relay_orders: strings("relay_orders"),
        restarted_at: v["restarted_at"]
            .as_str()
            .and_then(|t| OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()),
        event_queue_url: v["event_queue_url"].as_str().map(str::to_owned),
    })
}

async fn check_only(args: &Args, scope_path: &std::path::Path) -> Result<i32, String> {
    let stack = Stack::load(&args.stack_env).await?;
    let scope = read_scope(scope_path)?;
    println!(
        "loadcheck --check {}: {} orders, {} SKUs, {} coupons",
        scope_path.display(),
        scope.orders.len(),
        scope.skus.len(),
        scope.coupons.len()
    );
    Ok(report::verdict_only(verify::verify(&stack, &scope, args.stripe_concurrency).await))
}

/// The `lost-response` drill: the stack's functions lose a share of their
/// write answers (`LOST_ANSWER_RATE` at `infra/local.sh up`); each loss is
/// one line in the emulator's log, counted over the run.
struct LostResponseDrill {
    rate: f64,
    log: std::path::PathBuf,
    from: u64,
}

const LOST_ANSWER_LINE: &str = "answer lost after the request reached the service";

impl LostResponseDrill {
    fn start(stack: &Stack, env_file: &std::path::Path, notes: &mut Vec<String>) -> Option<Self> {
        let rate = stack.get_opt("LOST_ANSWER_RATE").and_then(|r| r.parse::<f64>().ok()).filter(|r| *r > 0.0);
        let Some(rate) = rate else {
            let why = "lost-response skipped: the stack was started with LOST_ANSWER_RATE=0, so no answer is \
                       lost (start it with `LOST_ANSWER_RATE=0.02 infra/local.sh up` to run this drill)";
            println!("{why}");
            notes.push(why.to_owned());
            return None;
        };
        let log = env_file.parent().unwrap_or(std::path::Path::new(".")).join("ministack.log");
        let from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        println!("drill lost-response: {:.1} % of every function's write answers are lost", rate * 100.0);
        Some(Self { rate, log, from })
    }

    /// The drill's note, or why it planted nothing.
    fn finish(self, notes: &mut Vec<String>) -> Option<String> {
        use std::io::{Read, Seek};
        let mut text = String::new();
        let read = std::fs::File::open(&self.log).and_then(|mut f| {
            f.seek(std::io::SeekFrom::Start(self.from))?;
            f.read_to_string(&mut text)
        });
        if let Err(e) = read {
            return Some(format!("lost-response: cannot read {}: {e}", self.log.display()));
        }
        let lost = text.lines().filter(|l| l.contains(LOST_ANSWER_LINE)).count();
        notes.push(format!(
            "lost-response: {lost} write answers lost after the write was applied (rate {}), each re-sent by the SDK",
            self.rate
        ));
        (lost == 0).then(|| "lost-response exercised: no answer was lost during the run".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> Args {
        Args::parse_from(["loadcheck", "--orders", "2000"].iter().chain(extra))
    }

    #[test]
    fn the_same_seed_plans_the_same_run_and_every_name_carries_the_run_id() {
        let a = plan_orders(&args(&["--drills", "crash-closer,release-fails"]), "lcx", 123);
        let b = plan_orders(&args(&["--drills", "crash-closer,release-fails"]), "lcx", 123);
        assert_eq!(a.len(), 2000);
        assert!(a.iter().zip(&b).all(|(x, y)| x.plan == y.plan && x.buyer == y.buyer));
        for p in &a {
            assert!(p.buyer.contains("lcx") && p.sku.contains("lcx") && p.idempotency_key.contains("lcx"), "{p:?}");
            assert!(p.coupon.as_ref().is_none_or(|c| c.contains("lcx")));
        }
    }

    #[test]
    fn drill_orders_get_the_buyer_name_that_plants_their_fault() {
        let plans = plan_orders(
            &args(&["--drills", "crash-closer,release-fails,scheduler-down,relay-fails,slow-channel"]),
            "lcx",
            99,
        );
        let prefix = |d: Drilled| match d {
            Drilled::CrashCloser => "fault-crash-closer-lcx-".to_owned(),
            Drilled::ReleaseFails => "fault-release-until-99-lcx-".to_owned(),
            Drilled::SchedulerDown => "fault-no-wakeup-lcx-".to_owned(),
            Drilled::RelayFails => "fault-relay-lcx-".to_owned(),
            Drilled::SlowChannel => "fault-slow-channel-lcx-".to_owned(),
            other => panic!("{other:?} was not asked for"),
        };
        let mut seen = BTreeSet::new();
        for p in &plans {
            match p.plan {
                Plan::Drill(d) => {
                    assert!(p.buyer.starts_with(&prefix(d)), "{p:?}");
                    seen.insert(d);
                }
                Plan::Mix(_) => assert!(!p.buyer.starts_with("fault-"), "{p:?}"),
            }
        }
        assert_eq!(seen.len(), 5, "every drill asked for has orders: {seen:?}");
        // The Scheduler is down only for the middle fifth of the creates.
        assert!(plans
            .iter()
            .filter(|p| p.plan == Plan::Drill(Drilled::SchedulerDown))
            .all(|p| (800..1200).contains(&p.index)));
    }

    #[test]
    fn unpaid_only_leaves_every_everyday_order_unpaid() {
        let plans = plan_orders(&args(&["--unpaid-only"]), "lcx", 0);
        assert!(plans.iter().all(|p| p.plan == Plan::Mix(Scenario::NeverPaid) && p.coupon.is_none()));
    }

    #[test]
    fn only_gives_every_everyday_order_that_scenario() {
        let plans = plan_orders(&args(&["--only", "paid-in-time"]), "lcx", 0);
        assert_eq!(plans.len(), 2000);
        assert!(plans.iter().all(|p| p.plan == Plan::Mix(Scenario::PaidInTime)), "{plans:?}");
        let coupons = plan_orders(&args(&["--only", "coupon-paid"]), "lcx", 0);
        assert!(coupons.iter().all(|p| p.plan == Plan::Mix(Scenario::CouponPaid) && p.coupon.is_some()));
    }
}
