//! The outbox consumer: a new order on the table stream gets its one-shot
//! wake-up at `expire_at`. A redelivered record finds the schedule there and
//! succeeds; a failure goes back to the stream mapping, which retries it.

use crate::domain::{OrderId, Timestamp};
use crate::ports::{Scheduled, Unavailable, WakeUpScheduler};
use tracing::{info, instrument};

#[instrument(skip_all, fields(order_id = %order_id, expire_at = %expire_at))]
pub async fn schedule_wake_up<W: WakeUpScheduler>(
    wakeups: &W,
    order_id: &OrderId,
    expire_at: Timestamp,
) -> Result<Scheduled, Unavailable> {
    let result = wakeups.schedule_wake_up(order_id, expire_at).await?;
    info!(result = ?result, "wake-up scheduled");
    Ok(result)
}
