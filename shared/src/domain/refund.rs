//! The refund of a payment that succeeded after its order was final
//! (docs/design.md#no-revival): REFUND_PENDING → REFUNDED | REFUND_FAILED
//! (→ REFUNDED after a redrive). The record lives beside the order, under
//! its partition.

use super::{ChannelName, Currency, OrderId, PaymentId, RefundStatus, Timestamp};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    pub payment_id: PaymentId,
    pub order_id: OrderId,
    pub channel: ChannelName,
    pub amount: i64,
    pub currency: Currency,
    pub status: RefundStatus,
    pub reason: String,
    #[serde(default)]
    pub tries: u32,
    pub created_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refunded_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_refund_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The message recorded for the buyer when the refund was created.
    pub notification: String,
    /// The version of the order the refund decision was made on (the final
    /// order as read when the late success was settled). Refunds written
    /// before the field existed read 0.
    #[serde(default)]
    pub order_version: u64,
    /// A person's resolution of a REFUND_FAILED refund (refunded by hand
    /// at the provider, or found not owed): the refund keeps its status,
    /// leaves the failed refunds' list, and is never tried again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<String>,
    /// The order's buyer, for the refund's integration events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<super::UserId>,
    /// The time of the refund's last state write (set by every update).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<Timestamp>,
}
