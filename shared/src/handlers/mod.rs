//! Trigger adapters: decode a Lambda event, call one use case, encode the
//! answer. Each function's module in `functions/bootstrap` only wires these to
//! the runtime.

pub mod api;
pub mod batch;
pub mod close;
pub mod effects;
pub mod http;
pub mod reconcile;
pub mod reconcile_day;
pub mod refunds;
pub mod relay;
pub mod requests;
pub mod sandbox;
pub mod sweep;
pub mod views;
