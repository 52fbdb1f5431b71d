//! `orderctl`: the operators' command line for an order-expiry stack.
//!
//! # Layout
//!
//! - [`settings`]: which stack (`--stack` → CloudFormation outputs, else
//!   `.local/stack.env`) and the AWS configuration (the usual chain).
//! - [`signed`]: SigV4-signed calls for the APIs without an SDK crate in
//!   the workspace (CloudFormation, Lambda, CloudWatch Logs, the admin API).
//! - one module per command: [`show`], [`stuck`], [`check`], [`queues`]
//!   (redrive), [`reconcile`], [`stock`], [`events`]; [`logs`] and
//!   [`output`] are shared by them.
//!
//! Read-only commands read the table with `order_core`'s decoding. Nothing
//! here writes a status: `check` goes through the audited admin route and
//! `reconcile` runs the stack's own function.

mod check;
mod error;
mod events;
mod logs;
mod output;
mod points;
mod queues;
mod reconcile;
mod refunds;
mod settings;
mod show;
mod signed;
mod stock;
mod stuck;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

const LONG_ABOUT: &str = "\
Operate an order-expiry stack: read one order's whole timeline, list what \
is stuck, force-check an order through the audited admin route, redrive a \
dead-letter queue, run reconciliation, read a SKU's stock and an order's \
integration events.

Which stack: --stack NAME reads that stack's CloudFormation outputs \
(DescribeStacks) with the usual AWS credential chain (env, profile, SSO, \
role) and AWS_ENDPOINT_URL if set. Without --stack, the .local/stack.env \
that `infra/local.sh up` writes is used (--env-file PATH, else the nearest \
.local/stack.env in the current folder or a parent); its endpoint, region \
and keys apply where the environment sets none. --stack wins over the file.

Output is a human table; --json prints one JSON document on stdout for \
scripts (progress and notes go to stderr, and are hidden with --json).

Exit codes: 0 done (reconcile: clean), 1 error (the message says what to \
do; reconcile --day: pieces still missing), 2 usage error, 3 reconcile \
found discrepancies.";

const EXAMPLES: &str = "\
Examples:
  orderctl order show ord_01JD…            the timeline of one order
  orderctl --json order show ord_01JD… | jq '.timeline[] | select(.kind==\"status\")'
  orderctl stuck                           leases past due, pending effects and refunds, DLQs
  orderctl stuck --peek 5                  … with up to 5 messages of each non-empty DLQ
  orderctl check ord_01JD…                 force-check (recorded with your IAM identity)
  orderctl redrive close-dlq               CloseDLQ back to CloseQueue, with a count
  orderctl reconcile                       run reconciliation now, report by kind
  orderctl reconcile --day 2026-12-02      run that day's reconciliation, wait, print the merged report
  orderctl reconcile --day 2026-12-02 --show   the day's latest run as stored (missing pieces named)
  orderctl stock sku-1                     available / reserved / sold / price, audited changes
  orderctl refunds failed                  refunds given up on, waiting for a person
  orderctl events ord_01JD…                the order's integration events
  orderctl --stack order-expiry-prod stuck against a deployed stack (AWS_PROFILE=…)";

#[derive(Parser)]
#[command(name = "orderctl", version, about = "Operate an order-expiry stack", long_about = LONG_ABOUT,
          after_help = EXAMPLES)]
struct Cli {
    /// Print one JSON document on stdout instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Read this CloudFormation stack's outputs (wins over --env-file).
    #[arg(long, global = true, value_name = "NAME")]
    stack: Option<String>,
    /// The stack.env to read when no --stack is given [default: the nearest .local/stack.env].
    #[arg(long, global = true, value_name = "PATH")]
    env_file: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum RefundsCommand {
    /// List them (what keeps RefundsFailedAlarm raised).
    Failed,
    /// Record that one was dealt with (refunded by hand at the provider, or
    /// found not owed): it stays REFUND_FAILED, leaves the list, and the
    /// alarm clears with the last one.
    Resolve {
        /// The order id (ord_…).
        order_id: String,
        /// The payment id (pay_…) the refund is for.
        payment_id: String,
        /// How it was dealt with (e.g. "refunded by hand, re_3Q…").
        #[arg(long)]
        note: String,
        /// Who dealt with it [default: $USER].
        #[arg(long)]
        by: Option<String>,
    },
}

#[derive(Subcommand)]
enum Command {
    /// One order.
    Order {
        #[command(subcommand)]
        command: OrderCommand,
    },
    /// What the backstop has not finished: CLOSING past its lease, open
    /// orders past expiry, effects pending, the refund backlog, DLQ depths.
    Stuck {
        /// Peek at up to this many messages (max 10) of each non-empty DLQ; 0: none.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(0..=10))]
        peek: i32,
        /// Due-index shards to read [default: the stack's DueIndexShardsSweep, else 16].
        #[arg(long)]
        shards: Option<u32>,
    },
    /// The audited force-check: runs the close use case on the order now
    /// (it can only do what a wake-up could) and records who asked.
    Check {
        /// The order id (ord_…).
        order_id: String,
    },
    /// Move a dead-letter queue's messages back to their source queue.
    #[command(after_help = "Queues: close-dlq, wakeup-dlq, refund-dlq, order-placed-dlq, order-closed-dlq, \
                            order-paid-dlq, pending-effects-dlq, reconcile-piece-dlq (redrivable); event-delivery-dlq, sweep-dlq, stream-failure, \
                            stream-dead-letter, reconcile-failure (the error says what to do instead).")]
    Redrive {
        /// The DLQ, e.g. close-dlq.
        queue: String,
        /// Move at most this many messages.
        #[arg(long)]
        max: Option<u64>,
    },
    /// Run reconciliation and print its report by kind: the whole table
    /// now (for small tables), or one day's run with --day.
    #[command(after_help = "Without --day: the reconcile function reads the whole table and the channel's \
                            statement (one Scan; fine for a small table, too slow for millions of orders).\n\
                            With --day YYYY-MM-DD: starts a run of that day (orders and refunds that became final \
                            on it, the channel's payments opened on it, what is in flight, the catalog), waits for \
                            its pieces (progress on stderr) and prints the merged report; pieces still missing at \
                            --wait are listed. --show prints the day's latest run as stored, starting nothing.")]
    Reconcile {
        /// The UTC day to reconcile, YYYY-MM-DD (the daily schedule runs yesterday).
        #[arg(long)]
        day: Option<String>,
        /// With --day: print the day's latest run as stored; start none.
        #[arg(long, requires = "day")]
        show: bool,
        /// With --day: how long to wait for the pieces, in seconds.
        #[arg(long, default_value_t = 600, requires = "day")]
        wait: u64,
    },
    /// Refunds given up on (REFUND_FAILED) that wait for a person.
    Refunds {
        #[command(subcommand)]
        command: RefundsCommand,
    },
    /// A SKU's stock, catalog price and audited changes (and whether its counts agree with them).
    Stock {
        /// The SKU.
        sku: String,
    },
    /// A buyer's loyalty points: balance, audited credits, the orders holding
    /// points, and whether they all agree.
    Points {
        /// The buyer's user id (their token's subject).
        user_id: String,
    },
    /// The integration events of one order (from the relay's log lines).
    Events {
        /// The order id (ord_…).
        order_id: String,
    },
}

#[derive(Subcommand)]
enum OrderCommand {
    /// The whole timeline: status changes with causes, reminders that
    /// reached it, payment attempts with their evidence, refunds with tries,
    /// reservations and coupon lock with when each settled, operator checks,
    /// and the functions' log lines naming the order.
    Show {
        /// The order id (ord_…).
        order_id: String,
        /// Skip the CloudWatch Logs search (faster; records only).
        #[arg(long)]
        no_logs: bool,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("orderctl: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> error::Result<ExitCode> {
    let stack = settings::resolve(cli.stack.as_deref(), cli.env_file.as_deref()).await?;
    let json = cli.json;
    match cli.command {
        Command::Order { command: OrderCommand::Show { order_id, no_logs } } => {
            show::run(&stack, &order_id, !no_logs, json).await?
        }
        Command::Stuck { peek, shards } => stuck::run(&stack, shards, peek, json).await?,
        Command::Check { order_id } => check::run(&stack, &order_id, json).await?,
        Command::Redrive { queue, max } => queues::redrive(&stack, &queue, max, json).await?,
        Command::Reconcile { day: Some(day), show, wait } => {
            return Ok(match reconcile::day(&stack, &day, show, std::time::Duration::from_secs(wait), json).await? {
                reconcile::Found::Clean => ExitCode::SUCCESS,
                reconcile::Found::Discrepancies => ExitCode::from(3),
            })
        }
        Command::Reconcile { day: None, .. } => {
            return Ok(match reconcile::run(&stack, json).await? {
                reconcile::Found::Clean => ExitCode::SUCCESS,
                reconcile::Found::Discrepancies => ExitCode::from(3),
            })
        }
        Command::Stock { sku } => stock::run(&stack, &sku, json).await?,
        Command::Points { user_id } => points::run(&stack, &user_id, json).await?,
        Command::Refunds { command: RefundsCommand::Failed } => refunds::failed(&stack, json).await?,
        Command::Refunds { command: RefundsCommand::Resolve { order_id, payment_id, note, by } } => {
            refunds::resolve(&stack, &order_id, &payment_id, &note, by).await?
        }
        Command::Events { order_id } => events::run(&stack, &order_id, json).await?,
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
