//! The one `bootstrap` every function of `template.yaml` runs.
//!
//! Twelve binaries meant twelve links of the whole AWS SDK on every change
//! to `shared/`; one binary links once. Each function keeps its own role,
//! settings and logs in the template; what differs between them is only the
//! wiring, chosen here by the function's `Handler`, which Lambda hands a
//! `provided.*` runtime as `_HANDLER` (ministack does the same).
//!
//! # Layout
//! - `main.rs`: the handler names and the dispatch, nothing else.
//! - one module per function, named for it (`close_order.rs` serves
//!   `Handler: close-order`): config from env, clients built once from the
//!   shared `SdkConfig`, then the runtime loop.
use lambda_runtime::Error;

mod close_order;
mod create_order;
mod drive_effects;
mod order_api;
mod payment_webhook;
mod reconcile;
mod reconcile_day;
mod reconcile_piece;
mod refund_worker;
mod relay;
mod release_order;
mod sandbox_channel;
mod schedule_wakeup;
mod settle_order;
mod sweep;

/// A function of the template, as its `Handler` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Function {
    CloseOrder,
    CreateOrder,
    DriveEffects,
    OrderApi,
    PaymentWebhook,
    Reconcile,
    ReconcileDay,
    ReconcilePiece,
    RefundWorker,
    Relay,
    ReleaseOrder,
    SandboxChannel,
    ScheduleWakeup,
    SettleOrder,
    Sweep,
}

/// Every handler name the template may use, with the function it selects.
const HANDLERS: [(&str, Function); 15] = [
    ("close-order", Function::CloseOrder),
    ("create-order", Function::CreateOrder),
    ("drive-effects", Function::DriveEffects),
    ("order-api", Function::OrderApi),
    ("payment-webhook", Function::PaymentWebhook),
    ("reconcile", Function::Reconcile),
    ("reconcile-day", Function::ReconcileDay),
    ("reconcile-piece", Function::ReconcilePiece),
    ("refund-worker", Function::RefundWorker),
    ("relay", Function::Relay),
    ("release-order", Function::ReleaseOrder),
    ("sandbox-channel", Function::SandboxChannel),
    ("schedule-wakeup", Function::ScheduleWakeup),
    ("settle-order", Function::SettleOrder),
    ("sweep", Function::Sweep),
];

/// A `_HANDLER` that names no function: the deploy is wrong, so the
/// environment must fail its init rather than serve the wrong code.
struct UnknownHandler(Option<String>);

impl std::fmt::Display for UnknownHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let known: Vec<&str> = HANDLERS.iter().map(|(name, _)| *name).collect();
        match &self.0 {
            Some(name) => write!(f, "unknown handler {name:?} (_HANDLER); known handlers: {}", known.join(", ")),
            None => write!(f, "_HANDLER is not set (the template's Handler); known handlers: {}", known.join(", ")),
        }
    }
}

// `main` returning Err prints the Debug form: make it the readable one.
impl std::fmt::Debug for UnknownHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for UnknownHandler {}

fn function_named(handler: Option<&str>) -> Result<Function, UnknownHandler> {
    let name = handler.ok_or(UnknownHandler(None))?;
    HANDLERS
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, function)| *function)
        .ok_or_else(|| UnknownHandler(Some(name.to_owned())))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    order_core::init_tracing();
    // Decided before any client is built: a wrong name fails in milliseconds.
    let function = function_named(std::env::var("_HANDLER").ok().as_deref())?;
    let config = order_core::aws::sdk_config().await;
    match function {
        Function::CloseOrder => close_order::run(&config).await,
        Function::CreateOrder => create_order::run(&config).await,
        Function::DriveEffects => drive_effects::run(&config).await,
        Function::OrderApi => order_api::run(&config).await,
        Function::PaymentWebhook => payment_webhook::run(&config).await,
        Function::Reconcile => reconcile::run(&config).await,
        Function::ReconcileDay => reconcile_day::run(&config).await,
        Function::ReconcilePiece => reconcile_piece::run(&config).await,
        Function::RefundWorker => refund_worker::run(&config).await,
        Function::Relay => relay::run(&config).await,
        Function::ReleaseOrder => release_order::run(&config).await,
        Function::SandboxChannel => sandbox_channel::run(&config).await,
        Function::ScheduleWakeup => schedule_wakeup::run(&config).await,
        Function::SettleOrder => settle_order::run(&config).await,
        Function::Sweep => sweep::run(&config).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `Handler:` values of the template's functions.
    fn template_handlers() -> Vec<String> {
        include_str!("../../../template.yaml")
            .lines()
            .filter_map(|line| line.trim().strip_prefix("Handler:"))
            .map(|name| name.trim().to_owned())
            .collect()
    }

    #[test]
    fn every_handler_of_the_template_names_a_function() {
        let handlers = template_handlers();
        assert_eq!(handlers.len(), HANDLERS.len(), "one Handler per function in template.yaml: {handlers:?}");
        for name in handlers {
            assert!(function_named(Some(&name)).is_ok(), "template.yaml's Handler {name} is unknown to the bootstrap");
        }
    }

    #[test]
    fn each_handler_name_selects_its_own_function() {
        for (i, (name, function)) in HANDLERS.iter().enumerate() {
            assert_eq!(function_named(Some(name)).unwrap(), *function);
            assert!(HANDLERS[i + 1..].iter().all(|(other, f)| other != name && f != function), "{name} twice");
        }
    }

    #[test]
    fn an_unknown_handler_fails_naming_the_known_ones() {
        let err = function_named(Some("bootstrap")).unwrap_err().to_string();
        assert!(err.contains("unknown handler \"bootstrap\""), "{err}");
        assert!(HANDLERS.iter().all(|(name, _)| err.contains(name)), "{err}");
        let unset = function_named(None).unwrap_err().to_string();
        assert!(unset.contains("_HANDLER is not set") && unset.contains("close-order"), "{unset}");
    }
}
