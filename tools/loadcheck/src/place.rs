//! `--place-direct`: placement for the drain benchmark (issue 9, 3a).
//!
//! 3a asks how long the stack takes to make 10,000 orders final and
//! released when their windows all end within one minute. Through the API
//! that needs 167 creates/s, and the local stack's API path (API Gateway
//! emulation, the JWT check, one Lambda process per call) takes 26–38/s, so
//! the placement, not the drain, would be measured. Here the orders are
//! placed by the same create use case the create-order function runs
//! (`CreateOrder::execute`: the catalog read, then the one transaction that
//! writes the order, its reservation and the idempotency key), called from
//! this process against the stack's table. Everything after the write is
//! the stack's own path, unchanged: the stream, the relay, the wake-up
//! schedule, the close, the release.
//!
//! Each order gets its own window so that the `expire_at`s spread evenly
//! over `spread` from `first_expire` on, whatever the placement's pace: the
//! benchmark fixes when the windows end, the stack still fixes them on the
//! order at create (server time), as it does for every order.

use crate::scenario::{Driven, OrderPlan, PRICE};
use crate::stack::Stack;
use futures_util::StreamExt;
use indicatif::ProgressBar;
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::{Currency, IdempotencyKey, Sku, UserId};
use order_core::ports::{RandomIds, SystemClock};
use order_core::usecases::create_order::{CreateOrder, CreateOrderRequest, RequestLine};
use order_core::usecases::UseCaseError;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use time::OffsetDateTime;

/// The window that makes an order created at `now` expire at `target`;
/// one second at least (a target already passed: the placement was slower
/// than planned, and the spread of the `expire_at`s printed after the run
/// shows by how much).
pub fn window_until(now: OffsetDateTime, target: OffsetDateTime) -> Duration {
    let ms = (target - now).whole_milliseconds();
    Duration::from_millis(ms.max(1000) as u64)
}

/// Where order `i` of `n` should expire: `first + spread × i / n`.
pub fn target_expire(first: OffsetDateTime, spread: Duration, i: usize, n: usize) -> OffsetDateTime {
    let step = spread.as_secs_f64() * i as f64 / n.max(1) as f64;
    first + Duration::from_secs_f64(step)
}

/// When the windows end, and how hard to push.
#[derive(Clone, Copy)]
pub struct Timing {
    /// The first order's `expire_at`.
    pub first_expire: OffsetDateTime,
    /// The `expire_at`s spread evenly over this from `first_expire`.
    pub spread: Duration,
    /// Creates in flight at most.
    pub concurrency: usize,
}

/// Places every plan (each an unpaid order); `buyers` maps a plan's buyer
/// name to its user id (the token subject the API would have used).
pub async fn place_direct(
    stack: &Stack,
    plans: &[OrderPlan],
    buyers: &BTreeMap<String, String>,
    timing: &Timing,
    rule_version: &str,
    bar: &ProgressBar,
) -> Result<Vec<Driven>, String> {
    let (sdk, plans, buyers, timing, rule_version, bar) =
        (stack.sdk.clone(), plans.to_vec(), buyers.clone(), *timing, rule_version.to_owned(), bar.clone());
    // The use case prints an EMF metric line on stdout per order (Lambda's
    // way of publishing metrics), which would bury the run's output.
    // `metrics::capture` keeps them in a thread-local buffer instead, which
    // needs the whole placement on one thread: its own current-thread
    // runtime.
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("a runtime for the placement: {e}"))?;
        runtime.block_on(async {
            order_core::metrics::capture(place_all(&sdk, &plans, &buyers, timing, &rule_version, &bar)).await.0
        })
    })
    .await
    .map_err(|e| format!("the placement's thread: {e}"))?
}

async fn place_all(
    sdk: &aws_config::SdkConfig,
    plans: &[OrderPlan],
    buyers: &BTreeMap<String, String>,
    timing: Timing,
    rule_version: &str,
    bar: &ProgressBar,
) -> Result<Vec<Driven>, String> {
    let Timing { first_expire, spread, concurrency } = timing;
    let store =
        DynamoStore::from_env(aws_sdk_dynamodb::Client::new(sdk)).map_err(|e| format!("the orders table: {e}"))?;
    let n = plans.len();
    let t0 = Instant::now();
    let placed: Vec<(usize, Driven)> = futures_util::stream::iter(plans.iter().map(|p| {
        let store = store.clone();
        let user = buyers.get(&p.buyer).cloned();
        async move {
            let mut d = Driven::default();
            let Some(user) = user else {
                d.errors.push(format!("buyer {} was not signed in", p.buyer));
                return (p.index, d);
            };
            let target = target_expire(first_expire, spread, p.index, n);
            let request = match create_request(p, user) {
                Ok(r) => r,
                Err(e) => {
                    d.errors.push(format!("order {}: {e}", p.index));
                    return (p.index, d);
                }
            };
            place_one(&store, request, target, rule_version, p.index, &mut d).await;
            bar.inc(1);
            (p.index, d)
        }
    }))
    .buffer_unordered(concurrency.max(1))
    .collect()
    .await;
    let mut out = vec![Driven::default(); n];
    for (i, d) in placed {
        out[i] = d;
    }
    let ok = out.iter().filter(|d| d.order_id.is_some()).count();
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "placed directly: {ok} of {n} orders in {secs:.1} s = {:.0}/s (the create use case against the stack's table)",
        ok as f64 / secs.max(0.001)
    );
    Ok(out)
}

/// The create use case's request for a plan whose buyer is `user`, with
/// its idempotency key.
fn create_request(p: &OrderPlan, user: String) -> Result<(IdempotencyKey, CreateOrderRequest), String> {
    Ok((
        IdempotencyKey::parse(p.idempotency_key.clone()).map_err(|e| e.to_string())?,
        CreateOrderRequest {
            user_id: UserId::parse(user).map_err(|e| e.to_string())?,
            currency: Currency::parse("EUR").map_err(|e| e.to_string())?,
            items: vec![RequestLine {
                sku: Sku::parse(p.sku.clone()).map_err(|e| e.to_string())?,
                qty: p.qty,
                unit_price: Some(PRICE),
            }],
            coupon_id: None,
            points: p.points,
        },
    ))
}

/// Places order `index` with the window that makes it expire at `target`,
/// into `d` (its order, or why not).
async fn place_one(
    store: &DynamoStore,
    (key, req): (IdempotencyKey, CreateOrderRequest),
    target: OffsetDateTime,
    rule_version: &str,
    index: usize,
    d: &mut Driven,
) {
    // A store that did not answer is retried with the same key: a
    // create that did land answers as a replay of the same order.
    for attempt in 1..=5u32 {
        let uc = CreateOrder {
            store: store.clone(),
            clock: Box::new(SystemClock),
            ids: Box::new(RandomIds),
            window: window_until(OffsetDateTime::now_utc(), target),
            expiry_rule_version: rule_version.to_owned(),
            open_order_cap: None,
        };
        let t = Instant::now();
        match uc.execute(key.clone(), req.clone()).await {
            Ok(created) => {
                d.order_id = Some(created.order.order_id.to_string());
                d.expire_at = OffsetDateTime::from_unix_timestamp_nanos(
                    created.order.expire_at.unix_millis() as i128 * 1_000_000,
                )
                .ok();
                d.create_ms = Some(t.elapsed().as_millis() as u64);
                d.replays = u32::from(created.replayed);
                break;
            }
            Err(UseCaseError::Unavailable(_)) if attempt < 5 => {
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
            Err(e) => {
                d.errors.push(format!("order {index}: create refused or failed: {e}"));
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_targets_spread_evenly_over_the_minute_and_the_window_reaches_them() {
        let first = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let spread = Duration::from_secs(60);
        assert_eq!(target_expire(first, spread, 0, 10_000), first);
        assert_eq!(target_expire(first, spread, 5_000, 10_000), first + Duration::from_secs(30));
        assert!(target_expire(first, spread, 9_999, 10_000) < first + spread);
        let now = first - Duration::from_secs(100);
        assert_eq!(window_until(now, first + Duration::from_millis(1500)), Duration::from_millis(101_500));
    }

    #[test]
    fn a_target_already_passed_gets_the_one_second_floor() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        assert_eq!(window_until(now, now - Duration::from_secs(5)), Duration::from_secs(1));
    }
}
