//! Use cases: one per trigger, generic over the ports. Each is the whole
//! business decision for its trigger; handlers only decode and encode.

pub mod close_order;
pub mod create_order;
pub mod force_check;
pub mod order_reads;
pub mod payments;
pub mod queries;
pub mod reconcile;
pub mod refunds;
pub mod release_order;
pub mod schedule_wakeup;
pub mod sweep;
