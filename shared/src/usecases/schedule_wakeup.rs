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

/// When the one-shot schedule fires: the start of the minute before the
/// one `expire_at` falls in. EventBridge Scheduler delivers a one-time
/// schedule anywhere within its minute, so a schedule *at* `expire_at`
/// could close an order up to a minute late. Waking it a little early costs
/// one extra message: the close use case finds it not yet due and puts the
/// reminder back with an SQS delay for the seconds left, so it closes
/// within about a second of `expire_at`.
pub fn wake_up_time(expire_at: Timestamp) -> Timestamp {
    let ms = expire_at.unix_millis();
    Timestamp::from_unix_millis(ms - ms.rem_euclid(60_000) - 60_000)
}

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
    let now = clock.now();
    // A schedule closer than a few seconds may never fire; a short window
    // (tests, demos) is woken as early as that allows.
    let wake_at = wake_up_time(expire_at).max(now.plus(DIRECT_REMINDER_WITHIN));
    if wake_at >= expire_at {
        // Due within seconds: remind directly, delayed to `expire_at`.
        let left = now.until(expire_at);
        reminders.remind_later(order_id, left).await?;
        info!(after_ms = left.as_millis() as u64, "due within seconds: reminded directly");
        return Ok(WakeUp::Reminded(left));
    }
    let result = wakeups.schedule_wake_up(order_id, wake_at).await?;
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
        // expire_at 00:05:40 → the schedule fires in the minute of 00:04:00.
        let expire = Timestamp::from_unix_millis(340_000);
        let r = schedule_wake_up(&calls, &calls, &At(0), &id, expire).await.unwrap();
        assert_eq!(r, WakeUp::Scheduled(Scheduled::Created));
        // Past the early wake-up time: as early as a schedule can be.
        let r = schedule_wake_up(&calls, &calls, &At(235_000), &id, expire).await.unwrap();
        assert_eq!(r, WakeUp::Scheduled(Scheduled::Created));
        // Due within 10 s: a direct reminder delayed to expire_at.
        let r = schedule_wake_up(&calls, &calls, &At(335_000), &id, expire).await.unwrap();
        assert_eq!(r, WakeUp::Reminded(Duration::from_secs(5)));
        let r = schedule_wake_up(&calls, &calls, &At(500_000), &id, expire).await.unwrap();
        assert_eq!(r, WakeUp::Reminded(Duration::ZERO));
        assert_eq!(
            *calls.0.lock().unwrap(),
            ["schedule 1970-01-01T00:04:00.000Z", "schedule 1970-01-01T00:04:05.000Z", "remind 5", "remind 0"]
        );
    }

    #[test]
    fn the_wake_up_is_the_start_of_the_minute_before_expiry() {
        let t = |ms| Timestamp::from_unix_millis(ms);
        assert_eq!(wake_up_time(t(340_000)), t(240_000));
        assert_eq!(wake_up_time(t(300_000)), t(240_000), "a whole minute still wakes a minute early");
        assert_eq!(wake_up_time(t(359_999)), t(240_000));
        for ms in [60_000i64, 61_234, 3_599_999, 1_700_000_000_123] {
            let w = wake_up_time(t(ms));
            assert!(w.unix_millis() <= ms - 60_000 && ms - w.unix_millis() < 120_000, "{ms}");
        }
    }
}
