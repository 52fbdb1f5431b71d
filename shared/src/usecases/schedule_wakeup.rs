//! The outbox consumer: a new order on the table stream gets its one-shot
//! wake-up at `expire_at`. A redelivered record finds the schedule there and
//! succeeds; a failure goes back to the stream mapping, which retries it.

use crate::domain::{OrderId, Timestamp};
use crate::ports::{Clock, CloseReminders, Scheduled, Unavailable, WakeUpScheduler};
use std::time::Duration;
use tracing::{info, instrument};

/// Orders due sooner than this when their record is read (a backlog on the
/// stream, a very short window) are not given a schedule — one at a time
/// already past may never fire — but a close reminder straight on the
/// queue, delayed by the time left.
pub const DIRECT_REMINDER_WITHIN: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeUp {
    Scheduled(Scheduled),
    /// Due within [`DIRECT_REMINDER_WITHIN`]: reminded directly, with this delay.
    Reminded(Duration),
}

#[instrument(skip_all, fields(order_id = %order_id, expire_at = %expire_at))]
pub async fn schedule_wake_up<W: WakeUpScheduler, Q: CloseReminders>(
    wakeups: &W,
    reminders: &Q,
    clock: &dyn Clock,
    order_id: &OrderId,
    expire_at: Timestamp,
) -> Result<WakeUp, Unavailable> {
    let left = clock.now().until(expire_at);
    if left < DIRECT_REMINDER_WITHIN {
        reminders.remind_later(order_id, left).await?;
        info!(after_ms = left.as_millis() as u64, "due within seconds: reminded directly");
        return Ok(WakeUp::Reminded(left));
    }
    let result = wakeups.schedule_wake_up(order_id, expire_at).await?;
    info!(result = ?result, "wake-up scheduled");
    Ok(WakeUp::Scheduled(result))
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Calls(Mutex<Vec<String>>);
    #[async_trait]
    impl WakeUpScheduler for Calls {
        async fn schedule_wake_up(&self, _: &OrderId, at: Timestamp) -> Result<Scheduled, Unavailable> {
            self.0.lock().unwrap().push(format!("schedule {at}"));
            Ok(Scheduled::Created)
        }
        async fn cancel_wake_up(&self, _: &OrderId) -> Result<(), Unavailable> {
            Ok(())
        }
    }
    #[async_trait]
    impl CloseReminders for Calls {
        async fn remind_later(&self, _: &OrderId, after: Duration) -> Result<(), Unavailable> {
            self.0.lock().unwrap().push(format!("remind {}", after.as_secs()));
            Ok(())
        }
    }
    struct At(i64);
    impl Clock for At {
        fn now(&self) -> Timestamp {
            Timestamp::from_unix_millis(self.0)
        }
    }

    #[tokio::test]
    async fn a_future_expiry_gets_a_schedule_and_a_near_or_past_one_a_direct_reminder() {
        let calls = Calls::default();
        let id = OrderId::parse("ord_1").unwrap();
        let expire = Timestamp::from_unix_millis(100_000);
        let r = schedule_wake_up(&calls, &calls, &At(0), &id, expire).await.unwrap();
        assert_eq!(r, WakeUp::Scheduled(Scheduled::Created));
        let r = schedule_wake_up(&calls, &calls, &At(95_000), &id, expire).await.unwrap();
        assert_eq!(r, WakeUp::Reminded(Duration::from_secs(5)));
        let r = schedule_wake_up(&calls, &calls, &At(500_000), &id, expire).await.unwrap();
        assert_eq!(r, WakeUp::Reminded(Duration::ZERO));
        assert_eq!(*calls.0.lock().unwrap(), ["schedule 1970-01-01T00:01:40.000Z", "remind 5", "remind 0"]);
    }
}
