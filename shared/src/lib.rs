//! # order_core
//!
//! The domain and adapters of the order-expiry system: unpaid orders close
//! when their payment window ends, paid orders never close, and the stock
//! and coupons an order held are released exactly once.
//!
//! # Layout
//!
//! - [`domain`]: identifiers, money, time, the state machines (order,
//!   reservation, coupon lock, payment, refund) and the entities the store
//!   keeps (`domain::records`). Pure; no AWS types.
//! - [`ports`] and [`store`]: what use cases need from the outside, as traits.
//! - [`usecases`]: one per trigger (create, schedule wake-up, close,
//!   release/settle, payments, refunds, reconcile, queries), generic over
//!   the ports.
//! - [`aws`]: DynamoDB, Scheduler and SQS adapters (the sandbox channel
//!   among them), and the SigV4 signer of the HTTP calls made without an
//!   SDK client.
//! - [`stripe`]: the Stripe channel (PaymentIntents) and its webhook events;
//!   [`channels`]: the channels a deployment has, chosen per attempt.
//! - [`http`] and [`error`]: the single mapping from errors to HTTP.
//! - [`signature`] and [`source_allowlist`]: what a notification must pass
//!   before the webhook does any other work.
//! - [`handlers`]: decode a Lambda trigger, call one use case, encode. For
//!   HTTP, `handlers::requests` parses a request into the use case's typed
//!   input and `handlers::views` shapes its typed answer as JSON; use cases
//!   never see a body nor build JSON (`tests/tests/layering.rs`).

pub mod aws;
pub mod channels;
pub mod domain;
pub mod error;
pub mod faults;
pub mod handlers;
pub mod http;
pub mod metrics;
pub mod ports;
pub mod signature;
pub mod source_allowlist;
pub mod store;
pub mod stripe;
pub mod usecases;

/// Structured JSON logs, level from `RUST_LOG` (default `info`): one
/// object per line, the event's fields at the top level (`message`,
/// `order_id`, `trigger`, `outcome`, …) so that CloudWatch Logs Insights
/// discovers them, and the enclosing spans' fields under `spans` (the
/// `#[instrument]` order id, the runtime's request id). The functions log
/// in Lambda's JSON log format (`LoggingConfig.LogFormat: JSON`), whose
/// platform records (START, REPORT) are JSON too.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_current_span(false)
        .without_time()
        .with_target(false)
        .init();
}
