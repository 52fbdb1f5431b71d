//! `loadcheck`: the invariant run of issue 9. It drives the deployed stack
//! through its public surface only (buyer routes with Cognito tokens, the
//! sandbox channel, the admin routes; direct AWS calls only to plant a
//! fault), waits until every order of the run is final and its effects
//! settled, then checks every invariant over the records and exits
//! non-zero on any violation.
//!
//! # Layout
//! - `client`: the surface, without panics (a run goes on past a failed call).
//! - `scenario`: what one order goes through and what it must be answered.
//! - `run`: setup (SKUs, coupons, buyers), the traffic, the drills' control
//!   (the sweep's pause), the drain wait.
//! - `report`: the summary table, the CSV and the PNG histogram.
//! - `stack`, `verify`: the stack's outputs and the invariant check.
//! - `subscriber`: the run's own queue on the order event bus (`relay-fails`).
//! - `stripe`: the Stripe server (localstripe) as the buyer and the check
//!   use it, for `--channel stripe`.

mod client;
mod place;
mod report;
mod run;
mod scenario;
mod stack;
mod stripe;
mod subscriber;
mod verify;

use clap::{Parser, ValueEnum};
use std::path::PathBuf;

/// Drives N orders through the deployed stack's public surface, with fault
/// drills, then checks every invariant over the records (issue 9).
///
/// Needs the stack up (`infra/local.sh up`) and its outputs in
/// `.local/stack.env`. Every buyer, SKU and coupon carries the run id, so
/// runs and the end-to-end tests never mix. Exits 0 when every invariant
/// holds, 1 on a violation (printed), 2 when the run could not be made
/// (a planned step failed after its retries, a drill planted nothing, or
/// the check could not run).
#[derive(Parser, Debug, Clone)]
#[command(name = "loadcheck", version)]
pub struct Args {
    /// How many orders to create.
    #[arg(long, default_value_t = 10_000)]
    pub orders: usize,
    /// Orders started per second (each then does its scenario's steps).
    #[arg(long, default_value_t = 50.0)]
    pub rate: f64,
    /// Requests in flight at most, over all orders.
    #[arg(long, default_value_t = 24)]
    pub concurrency: usize,
    /// SKUs the orders spread over (each seeded with enough stock for all).
    #[arg(long, default_value_t = 8)]
    pub skus: usize,
    /// Buyers the everyday orders spread over (each signs in once).
    #[arg(long, default_value_t = 20)]
    pub buyers: usize,
    /// The payment channel the paying scenarios use (default: the sandbox).
    ///
    /// sandbox: payment entry {"channel":"sandbox"}, the sandbox's settle
    ///   route, signed sandbox notifications.
    /// stripe: payment entry {"channel":"stripe"} (201 with a client_secret);
    ///   the buyer pays like Stripe.js at the stack's Stripe server
    ///   (STRIPE_API_BASE_URL, localstripe locally): a card payment method
    ///   (4242424242424242, or 4000000000000341, declined at confirmation),
    ///   set on the intent, then a confirmation without parameters; Stripe's
    ///   own payment_intent.succeeded webhook makes the order PAID.
    ///
    /// The scenarios with --channel stripe:
    /// - never_paid: no attempt (even orders), or an intent whose card is
    ///   declined and never retried (odd): CLOSED, intent canceled.
    /// - paid_in_time, coupon_paid: paid in the window: PAID.
    /// - settled_at_expiry: card set in time, confirmed at expire_at: PAID if
    ///   the confirmation won, CLOSED if Stripe refused it (the close had
    ///   cancelled the intent); never a refund.
    /// - notified_late: paid in time, the success event sent again (signed)
    ///   3-8 s after expire_at: answered paid or duplicate; PAID.
    /// - notified_twice: paid, one event sent three times and a second event
    ///   id about the same success: all duplicates after the first; PAID.
    /// - never_notified: Stripe always sends its webhook; the closest is a
    ///   confirmation 1 s before expire_at, so the webhook lands about when
    ///   the close asks the intent: PAID (CLOSED if the confirmation lost).
    /// - second_attempt: a first intent's card declined, a second attempt
    ///   paid; the first intent was cancelled when the second opened, so
    ///   paying it afterwards is refused by Stripe: PAID, no refund.
    /// - forged_notifications: Stripe-Signature of another secret, stale,
    ///   over a changed body, or missing (401 each), and a correctly signed
    ///   event claiming a success Stripe does not have (still_open): CLOSED.
    /// - payment_after_expiry (the late payer): payment entry after expire_at
    ///   refused (409), and the card set in time confirmed 0.3-5 s after it:
    ///   Stripe refuses (the close cancelled the intent: CLOSED) or, if the
    ///   confirmation won the race, PAID; never refunded, never both.
    /// - coupon_unpaid: card set, never confirmed: CLOSED, intent canceled.
    /// - replayed_create: as with the sandbox.
    /// - drill channel-not-found: fault-close-sees-no-payment- buyers (the
    ///   close hears "no such payment" and closes without cancelling the
    ///   intent); once CLOSED the buyer pays: CLOSED, refunded exactly once
    ///   at Stripe. channel-timeout and slow-channel have no Stripe fault:
    ///   skipped (said).
    ///   The unpaid drills' orders open an intent their close must cancel.
    ///
    /// The check then reads each Stripe attempt's intent and its charge's
    /// refunds back from Stripe: they are the channel's side of every
    /// invariant, plus stripe_intent_state and stripe_refunds.
    #[arg(long, value_enum, default_value_t = Channel::Sandbox, verbatim_doc_comment)]
    pub channel: Channel,
    /// Calls in flight at most to the Stripe server (localstripe is one
    /// single-threaded process the stack's functions call too), for the
    /// buyers' payments and the check's reads.
    #[arg(long, default_value_t = 4)]
    pub stripe_concurrency: usize,
    /// Fault drills to run, comma-separated (or `all`).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub drills: Vec<Drill>,
    /// Every everyday order is `never_paid` (the drain benchmark: only
    /// closes and releases); drills keep their share.
    #[arg(long, conflicts_with = "only")]
    pub unpaid_only: bool,
    /// Every everyday order follows this one scenario (e.g. `paid-in-time`
    /// to count one path's requests per order); drills keep their share.
    /// `--unpaid-only` is `--only never-paid`.
    #[arg(long, value_enum)]
    pub only: Option<crate::scenario::Scenario>,
    /// The drain benchmark's placement
    /// (BENCHMARKS.md#how-fast-does-a-mass-expiry-drain): the orders
    /// are placed by the create use case against the stack's table from
    /// this process instead of through the API (which cannot create 10,000
    /// within a minute locally), each with the window that makes the
    /// `expire_at`s spread evenly over `--expire-spread` seconds, starting
    /// one payment window (the stack's) after the run starts. Needs
    /// `--unpaid-only` and no drills. The orders go into the due index's
    /// shards as `DUE_SHARDS` says (default 16, the template's
    /// `DueIndexShards` default, which `infra/local.sh` keeps): export it
    /// when the stack was deployed with another count.
    #[arg(long, requires = "unpaid_only")]
    pub place_direct: bool,
    /// With `--place-direct`: the seconds the `expire_at`s spread over.
    #[arg(long, default_value_t = 60)]
    pub expire_spread: u64,
    /// Share of the orders each order-level drill takes (0..1).
    #[arg(long, default_value_t = 0.03)]
    pub drill_share: f64,
    /// How long past `expire_at` a planted channel fault (timeout, not
    /// found) lasts, in seconds.
    #[arg(long, default_value_t = 20)]
    pub channel_outage: u64,
    /// How long the sweep stays paused after the last backlog order is due,
    /// in seconds (drill `sweep-pause`).
    #[arg(long, default_value_t = 30)]
    pub sweep_pause: u64,
    /// How long the release keeps failing after the last order of the run
    /// is due, in seconds (drill `release-fails`).
    #[arg(long, default_value_t = 20)]
    pub release_outage: u64,
    /// Give up waiting for the drain after this many seconds (and say what
    /// is still open).
    #[arg(long, default_value_t = 900)]
    pub drain_timeout: u64,
    /// Where the CSV, the PNG and the summary go (default
    /// `target/loadcheck/<run id>/`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The stack's outputs (KEY=VALUE; the environment takes precedence).
    #[arg(long, default_value = ".local/stack.env")]
    pub stack_env: PathBuf,
    /// The run id (default: random); names of buyers, SKUs and coupons
    /// carry it.
    #[arg(long)]
    pub run_id: Option<String>,
    /// Seed of the scenario mix (the same seed and N give the same plan).
    #[arg(long, default_value_t = 9)]
    pub seed: u64,
    /// No progress bars (logs and CI).
    #[arg(long)]
    pub quiet: bool,
    /// Only the invariant check, over a finished run's `scope.json` (what
    /// it created, as the run wrote it): no traffic. For re-checking a run
    /// after the fact, e.g. after tampering with a record on purpose.
    #[arg(long, value_name = "SCOPE_JSON")]
    pub check: Option<PathBuf>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// The stack's sandbox channel (settle route, signed notifications).
    Sandbox,
    /// Stripe's PaymentIntents at the stack's Stripe server.
    Stripe,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Drill {
    /// Restart the emulator mid-run (needs its state persisted).
    EmulatorRestart,
    /// The closer dies right after CLOSING (`fault-crash-closer-` buyers).
    CrashCloser,
    /// The channel's query times out for a share of payments.
    ChannelTimeout,
    /// The channel says "not found" for a share of payments, which then succeed late.
    ChannelNotFound,
    /// The Scheduler's target is down for a window of the create phase
    /// (orders created then get no wake-up: `fault-no-wakeup-` buyers).
    SchedulerDown,
    /// The release fails until after the run's last order is due.
    ReleaseFails,
    /// The sweep's schedule is disabled, then enabled (its backlog's drain is timed).
    SweepPause,
    /// The relay's first PutEvents entry of each event fails (`fault-relay-` buyers).
    RelayFails,
    /// Every function loses the answers of a share of its write calls after
    /// the service applied them, so the SDK sends them again (needs the
    /// stack started with `LOST_ANSWER_RATE`, e.g. 0.02; every order).
    LostResponse,
    /// The sandbox answers every question about the payments of
    /// `fault-slow-channel-` buyers in 9 s (a brownout): the time budgets
    /// of payment entry, the close batch and the operator check.
    SlowChannel,
    /// Every drill above.
    All,
}

fn main() {
    let mut args = Args::parse();
    if args.drills.contains(&Drill::All) {
        args.drills = Drill::value_variants().iter().copied().filter(|d| *d != Drill::All).collect();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    let code = runtime.block_on(run::run(args));
    std::process::exit(code);
}
