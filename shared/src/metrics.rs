//! CloudWatch metrics as Embedded Metric Format lines: one JSON object on
//! stdout per data point, which CloudWatch Logs turns into a metric. No SDK
//! call, no added latency.
//!
//! Every metric the code emits is declared here, once, as a [`Metric`]
//! (name, unit, dimensions) and listed in [`catalog`]. Emitting takes a
//! `&Metric`, so nothing outside this table can be emitted; the template
//! checks (`infra/check_alarms.py metric-alarms dashboard`, run by
//! `tests/tests/template_metrics.rs`) read the same table and refuse an
//! alarm or a dashboard widget on a metric, or with dimensions, that the
//! code does not emit.
//!
//! Dimensions: every point carries `Stack` (the CloudFormation stack name,
//! `STACK_NAME`), so two stacks in one account never add up into one
//! series; a few metrics add a dimension with a small closed set of values
//! (never an order id: each distinct value is a metric of its own). A
//! metric with extra dimensions is emitted under two dimension sets,
//! `[Stack]` and `[Stack, …]`, so one alarm on `Stack` alone covers all
//! its values.
//!
//! Why not the `metrics` facade with `metrics_cloudwatch_embedded`: that
//! backend aggregates in process and flushes once per invocation through
//! its own wrapper of `lambda_runtime::run`, which would couple every
//! function's entry point (being reworked into one bootstrap) and our
//! `lambda_runtime` version to it, and add two crates to every build. What
//! we need from it is small: units, a fixed dimension set, and a name list
//! that the template can be checked against — which the facade's
//! free-form string keys would not give. Our functions emit a handful of
//! points per invocation, so one line per point costs a few hundred bytes
//! of log, not a flush strategy.

use crate::usecases::reconcile::DiscrepancyKind;
use serde_json::{json, Map, Value};
use std::cell::RefCell;

pub const NAMESPACE: &str = "OrderExpiry";

/// The dimension every point carries: the stack's name.
pub const STACK_DIMENSION: &str = "Stack";

/// CloudWatch units this code uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Count,
    Seconds,
    Milliseconds,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Count => "Count",
            Unit::Seconds => "Seconds",
            Unit::Milliseconds => "Milliseconds",
        }
    }
}

/// One metric the code emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub unit: Unit,
    /// Dimensions beyond `Stack`, in order; each takes a small, closed set
    /// of values.
    pub dimensions: &'static [&'static str],
}

const fn count_metric(name: &'static str) -> Metric {
    Metric { name, unit: Unit::Count, dimensions: &[] }
}

// ---- orders: created, closed, paid, and how late the close came
// (docs/design.md#observability)
pub const ORDER_CREATED: Metric = count_metric("OrderCreated");
pub const ORDER_CLOSED: Metric = count_metric("OrderClosed");
/// A buyer asked to cancel an open order (`POST /orders/{id}/cancel`); its
/// close then counts as any close (`OrderClosed`).
pub const ORDER_CANCEL_REQUESTED: Metric = count_metric("OrderCancelRequested");
/// Orders noticed as expiring soon by the pass (each publishes one
/// `OrderExpiringSoon`); `ExpiringSoonPassCompleted` once per pass run.
pub const ORDER_EXPIRING_SOON: Metric = count_metric("OrderExpiringSoon");
pub const EXPIRING_SOON_PASS_COMPLETED: Metric = count_metric("ExpiringSoonPassCompleted");
/// Every way an order becomes PAID (notification, closer, new attempt).
pub const ORDER_PAID: Metric = count_metric("OrderPaid");
/// `expire_at` → CLOSED, per closed order (P50/P95/P99 on the dashboard).
pub const EXPIRY_TO_CLOSE_DELAY: Metric =
    Metric { name: "ExpiryToCloseDelay", unit: Unit::Milliseconds, dimensions: &[] };

// ---- wake-up quality: early, late, redundant (docs/design.md#observability)
pub const EARLY_WAKE_UP: Metric = count_metric("EarlyWakeUp");
/// The first close run of a due order came more than
/// [`crate::usecases::close_order::LATE_WAKE_UP_AFTER`] after `expire_at`.
pub const LATE_WAKE_UP: Metric = count_metric("LateWakeUp");
/// A reminder that found nothing to do: the order final, a reminder
/// already on its way, or another closer's live lease.
pub const REDUNDANT_WAKE_UP: Metric = count_metric("RedundantWakeUp");

// ---- the close and the channel: CLOSING past lease, unknown state, query
// timeouts (docs/design.md#observability)
pub const CLOSING_PAST_LEASE: Metric = count_metric("ClosingPastLease");
pub const PAYMENT_STATE_UNKNOWN: Metric = count_metric("PaymentStateUnknown");
pub const PAID_WHILE_CLOSING: Metric = count_metric("PaidWhileClosing");
/// A question to the channel not asked, or cut off, because a run's time
/// budget ran out (close, settle, payment entry, operator check; see
/// docs/architecture.md#time-budgets-per-function-a-channel-in-a-brownout).
pub const CLOSE_BUDGET_SPENT: Metric = count_metric("CloseBudgetSpent");
/// One per question to the channel about an attempt, by what it answered:
/// `succeeded`, `failed`, `not_found`, `pending`, `unavailable` (a timeout
/// or an error: the timeout rate is `unavailable` over all).
pub const CHANNEL_QUERY: Metric = Metric { name: "ChannelQuery", unit: Unit::Count, dimensions: &["Outcome"] };

// ---- payments
pub const PAYMENT_MISMATCH: Metric = count_metric("PaymentMismatch");
pub const WEBHOOK_BAD_SIGNATURE: Metric = count_metric("WebhookBadSignature");
/// A notification refused for its source address (`WebhookSourceCidrs`)
/// before its body was read: junk, or a provider whose addresses changed.
pub const WEBHOOK_SOURCE_REFUSED: Metric = count_metric("WebhookSourceRefused");
/// A signed provider event acknowledged without acting on it: a type we do
/// not handle, a payment or refund we never opened, an intent that is not
/// the attempt's. Reconciliation finds the money side of the last two.
pub const WEBHOOK_EVENT_IGNORED: Metric =
    Metric { name: "WebhookEventIgnored", unit: Unit::Count, dimensions: &["Reason"] };
/// A success on an order already final: refunded, never revived
/// (docs/design.md#observability).
pub const LATE_PAYMENT_REFUND: Metric = count_metric("LatePaymentRefund");

// ---- refunds
pub const REFUND_COMPLETED: Metric = count_metric("RefundCompleted");
pub const REFUND_RETRY: Metric = count_metric("RefundRetry");
pub const REFUND_GAVE_UP: Metric = count_metric("RefundGaveUp");
pub const REFUND_DUPLICATE_DELIVERY: Metric = count_metric("RefundDuplicateDelivery");
/// A refund the channel accepted and has not finished (followed up later).
pub const REFUND_CHANNEL_PENDING: Metric = count_metric("RefundChannelPending");

// ---- release and settle: release failures and the oldest pending one
// (docs/design.md#observability)
pub const RESERVATIONS_RELEASED: Metric = count_metric("ReservationsReleased");
pub const RELEASE_REFUSED: Metric = count_metric("ReleaseRefused");
/// A release or settle that failed and will be retried (queue, then sweep).
pub const EFFECT_FAILED: Metric = Metric { name: "EffectFailed", unit: Unit::Count, dimensions: &["Effect"] };
pub const CONFIRMED_RESERVATION_ON_CLOSED_ORDER: Metric = count_metric("ConfirmedReservationOnClosedOrder");
pub const RELEASED_RESERVATION_ON_PAID_ORDER: Metric = count_metric("ReleasedReservationOnPaidOrder");

// ---- messages that can never succeed
pub const MALFORMED_CLOSE_MESSAGE: Metric = count_metric("MalformedCloseMessage");
pub const MALFORMED_REFUND_MESSAGE: Metric = count_metric("MalformedRefundMessage");
pub const MALFORMED_EFFECT_MESSAGE: Metric = count_metric("MalformedEffectMessage");
pub const STREAM_RECORD_SET_ASIDE: Metric = count_metric("StreamRecordSetAside");

// ---- the relay
pub const EVENTS_PUBLISHED: Metric = count_metric("EventsPublished");
pub const EVENT_PUBLISH_RETRIED: Metric = count_metric("EventPublishRetried");
pub const EVENT_PUBLISH_FAILED: Metric = count_metric("EventPublishFailed");

// ---- the sweep: what the backstop finds should stay near 0
// (docs/design.md#observability)
pub const SWEEP_FOUND_OPEN: Metric = count_metric("SweepFoundOpen");
pub const SWEEP_FOUND_EFFECTS: Metric = count_metric("SweepFoundEffects");
pub const SWEEP_FOUND_REFUNDS: Metric = count_metric("SweepFoundRefunds");
pub const OLDEST_OVERDUE_OPEN_ORDER_SECONDS: Metric =
    Metric { name: "OldestOverdueOpenOrderSeconds", unit: Unit::Seconds, dimensions: &[] };
pub const OLDEST_PENDING_EFFECT_SECONDS: Metric =
    Metric { name: "OldestPendingEffectSeconds", unit: Unit::Seconds, dimensions: &[] };
pub const SWEEP_DURATION: Metric = Metric { name: "SweepDuration", unit: Unit::Milliseconds, dimensions: &[] };
pub const SWEEP_UNFINISHED_SHARDS: Metric = count_metric("SweepUnfinishedShards");
/// Stored cursors the due index refused, dropped (their shard swept from the top).
pub const SWEEP_CURSORS_RESET: Metric = count_metric("SweepCursorsReset");
pub const SWEEP_COMPLETED: Metric = count_metric("SweepCompleted");
/// Refunds given up on (REFUND_FAILED) and not yet resolved by a person,
/// counted by each sweep run from their index entries: a state, so its
/// alarm stays raised until the last one is resolved.
pub const REFUNDS_FAILED: Metric = count_metric("RefundsFailed");

// ---- reconciliation (daily by day and shard, or the full read on demand)
/// One per completed run: a full read, or a day run once every piece of
/// it has reported (a piece in ReconcilePieceDLQ keeps it from counting).
pub const RECONCILE_COMPLETED: Metric = count_metric("ReconcileCompleted");
/// Orders open (PENDING_PAYMENT or CLOSING) when the run read the table
/// (the day run: the due index's OPEN shards).
pub const OPEN_ORDERS: Metric = count_metric("OpenOrders");
pub const OLDEST_OPEN_ORDER_SECONDS: Metric =
    Metric { name: "OldestOpenOrderSeconds", unit: Unit::Seconds, dimensions: &[] };
/// Refunds still REFUND_PENDING when the run read the table (the backlog).
pub const REFUNDS_PENDING: Metric = count_metric("RefundsPending");

/// One per [`DiscrepancyKind`], named `Discrepancy.<kind>` (each has its
/// own alarm), in the kinds' declaration order.
pub const DISCREPANCIES: [Metric; DiscrepancyKind::COUNT] = discrepancy_metrics();

const fn discrepancy_metrics() -> [Metric; DiscrepancyKind::COUNT] {
    let mut all = [count_metric(""); DiscrepancyKind::COUNT];
    let mut i = 0;
    while i < DiscrepancyKind::COUNT {
        all[i] = count_metric(DiscrepancyKind::ALL[i].metric_name());
        i += 1;
    }
    all
}

/// Every named metric above; a test holds this list to the constants.
const NAMED: &[&Metric] = &[
    &ORDER_CREATED,
    &ORDER_CLOSED,
    &ORDER_CANCEL_REQUESTED,
    &ORDER_EXPIRING_SOON,
    &EXPIRING_SOON_PASS_COMPLETED,
    &ORDER_PAID,
    &EXPIRY_TO_CLOSE_DELAY,
    &EARLY_WAKE_UP,
    &LATE_WAKE_UP,
    &REDUNDANT_WAKE_UP,
    &CLOSING_PAST_LEASE,
    &PAYMENT_STATE_UNKNOWN,
    &PAID_WHILE_CLOSING,
    &CLOSE_BUDGET_SPENT,
    &CHANNEL_QUERY,
    &PAYMENT_MISMATCH,
    &WEBHOOK_BAD_SIGNATURE,
    &WEBHOOK_SOURCE_REFUSED,
    &WEBHOOK_EVENT_IGNORED,
    &LATE_PAYMENT_REFUND,
    &REFUND_COMPLETED,
    &REFUND_RETRY,
    &REFUND_GAVE_UP,
    &REFUND_DUPLICATE_DELIVERY,
    &REFUND_CHANNEL_PENDING,
    &RESERVATIONS_RELEASED,
    &RELEASE_REFUSED,
    &EFFECT_FAILED,
    &CONFIRMED_RESERVATION_ON_CLOSED_ORDER,
    &RELEASED_RESERVATION_ON_PAID_ORDER,
    &MALFORMED_CLOSE_MESSAGE,
    &MALFORMED_REFUND_MESSAGE,
    &MALFORMED_EFFECT_MESSAGE,
    &STREAM_RECORD_SET_ASIDE,
    &EVENTS_PUBLISHED,
    &EVENT_PUBLISH_RETRIED,
    &EVENT_PUBLISH_FAILED,
    &SWEEP_FOUND_OPEN,
    &REFUNDS_FAILED,
    &SWEEP_FOUND_EFFECTS,
    &SWEEP_FOUND_REFUNDS,
    &OLDEST_OVERDUE_OPEN_ORDER_SECONDS,
    &OLDEST_PENDING_EFFECT_SECONDS,
    &SWEEP_DURATION,
    &SWEEP_UNFINISHED_SHARDS,
    &SWEEP_CURSORS_RESET,
    &SWEEP_COMPLETED,
    &RECONCILE_COMPLETED,
    &OPEN_ORDERS,
    &OLDEST_OPEN_ORDER_SECONDS,
    &REFUNDS_PENDING,
];

/// Every metric the code can emit, each once.
pub fn catalog() -> Vec<&'static Metric> {
    let mut all: Vec<&'static Metric> = Vec::new();
    for m in NAMED.iter().copied().chain(DISCREPANCIES.iter()) {
        if !all.iter().any(|seen| seen.name == m.name) {
            all.push(m);
        }
    }
    all
}

/// The catalog as JSON, `[{"name","unit","dimensions":[…]}]`, with `Stack`
/// first in every dimension list: what the template checks read.
pub fn catalog_json() -> Value {
    Value::Array(
        catalog()
            .into_iter()
            .map(|m| {
                let mut dims = vec![STACK_DIMENSION];
                dims.extend_from_slice(m.dimensions);
                json!({"name": m.name, "unit": m.unit.as_str(), "dimensions": dims})
            })
            .collect(),
    )
}

/// The metric of one reconciliation kind.
pub fn discrepancy(kind: DiscrepancyKind) -> &'static Metric {
    // DISCREPANCIES follows `DiscrepancyKind::ALL`, the declaration order.
    let all: &'static [Metric; DiscrepancyKind::COUNT] = &DISCREPANCIES;
    &all[kind as usize]
}

impl Metric {
    /// Emits a count (a metric without extra dimensions).
    pub fn count(&self, value: u64) {
        self.emit(value as f64, &[]);
    }

    /// Emits a duration in the metric's unit.
    pub fn duration(&self, d: std::time::Duration) {
        let value = match self.unit {
            Unit::Seconds => d.as_secs_f64(),
            Unit::Milliseconds => d.as_millis() as f64,
            Unit::Count => d.as_secs_f64(),
        };
        self.emit(value, &[]);
    }

    /// Emits `value` with the values of the metric's extra dimensions, in
    /// the order they are declared.
    pub fn emit(&self, value: f64, dimension_values: &[&str]) {
        let line = render(self, value, dimension_values, &stack(), &function(), now_millis());
        CAPTURE.with(|c| match c.borrow_mut().as_mut() {
            Some(lines) => lines.push(line.clone()),
            None => println!("{line}"),
        });
    }
}

/// One EMF document. Pure, so that its shape is tested without stdout.
pub fn render(metric: &Metric, value: f64, dimension_values: &[&str], stack: &str, function: &str, ts: u64) -> String {
    debug_assert_eq!(
        dimension_values.len(),
        metric.dimensions.len(),
        "{}: one value per declared dimension",
        metric.name
    );
    let mut doc = Map::new();
    let mut sets = vec![json!([STACK_DIMENSION])];
    if !metric.dimensions.is_empty() {
        let mut full = vec![STACK_DIMENSION];
        full.extend_from_slice(metric.dimensions);
        sets.push(json!(full));
    }
    doc.insert(
        "_aws".into(),
        json!({
            "Timestamp": ts,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": sets,
                "Metrics": [{"Name": metric.name, "Unit": metric.unit.as_str()}]
            }]
        }),
    );
    doc.insert(STACK_DIMENSION.into(), json!(stack));
    for (name, v) in metric.dimensions.iter().zip(dimension_values) {
        doc.insert((*name).into(), json!(v));
    }
    // A property, not a dimension: searchable in the logs, one alarm for
    // every function that emits the metric.
    doc.insert("function".into(), json!(function));
    doc.insert(metric.name.into(), json!(value));
    Value::Object(doc).to_string()
}

fn stack() -> String {
    std::env::var("STACK_NAME").unwrap_or_else(|_| "local".into())
}

fn function() -> String {
    std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "local".into())
}

fn now_millis() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

thread_local! {
    static CAPTURE: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's metric lines collected instead of printed,
/// and returns them: how a test reads what a use case emitted (use a
/// current-thread runtime, `#[tokio::test]`'s default).
pub async fn capture<F: std::future::Future>(f: F) -> (F::Output, Vec<String>) {
    let previous = CAPTURE.with(|c| c.borrow_mut().replace(Vec::new()));
    let out = f.await;
    let lines = CAPTURE.with(|c| std::mem::replace(&mut *c.borrow_mut(), previous)).unwrap_or_default();
    (out, lines)
}

/// The EMF documents among `lines` that carry metric `name`, parsed.
pub fn points<'a>(lines: &'a [String], name: &'a str) -> impl Iterator<Item = Value> + 'a {
    lines.iter().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(move |doc| {
        doc["_aws"]["CloudWatchMetrics"][0]["Metrics"].as_array().is_some_and(|ms| ms.iter().any(|m| m["Name"] == name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_line_is_emf_with_the_stack_dimension_and_the_value() {
        let line = render(&ORDER_CLOSED, 1.0, &[], "shop-prod", "shop-prod-close-order", 1_700_000_000_000);
        let doc: Value = serde_json::from_str(&line).unwrap();
        let cw = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(cw["Namespace"], "OrderExpiry");
        assert_eq!(cw["Dimensions"], json!([["Stack"]]));
        assert_eq!(cw["Metrics"], json!([{"Name": "OrderClosed", "Unit": "Count"}]));
        assert_eq!(doc["_aws"]["Timestamp"], 1_700_000_000_000u64);
        assert_eq!(doc["Stack"], "shop-prod");
        assert_eq!(doc["OrderClosed"], 1.0);
        assert_eq!(doc["function"], "shop-prod-close-order");
    }

    #[test]
    fn a_metric_with_an_extra_dimension_is_emitted_under_stack_alone_and_with_it() {
        let line = render(&CHANNEL_QUERY, 1.0, &["unavailable"], "s", "f", 0);
        let doc: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([["Stack"], ["Stack", "Outcome"]]));
        assert_eq!(doc["Outcome"], "unavailable");
    }

    #[test]
    fn durations_are_emitted_in_the_metrics_unit() {
        let d = std::time::Duration::from_millis(1500);
        let (_, lines) = futures_util::FutureExt::now_or_never(capture(async {
            EXPIRY_TO_CLOSE_DELAY.duration(d);
            OLDEST_PENDING_EFFECT_SECONDS.duration(d);
        }))
        .unwrap();
        let ms: Vec<Value> = points(&lines, "ExpiryToCloseDelay").collect();
        assert_eq!(ms[0]["ExpiryToCloseDelay"], 1500.0);
        assert_eq!(ms[0]["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Unit"], "Milliseconds");
        let s: Vec<Value> = points(&lines, "OldestPendingEffectSeconds").collect();
        assert_eq!(s[0]["OldestPendingEffectSeconds"], 1.5);
        assert_eq!(s[0]["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Unit"], "Seconds");
    }

    #[test]
    fn every_declared_metric_is_in_the_catalog_once() {
        // Every `pub const NAME: Metric` of this file must be listed in
        // `NAMED` (or be one of DISCREPANCIES): a metric emitted but left
        // out of the catalog would escape the template cross-checks.
        let source = include_str!("metrics.rs");
        let (declarations, _) = source.split_once("/// Every named metric above").unwrap();
        let named_list = source.split_once("const NAMED: &[&Metric] = &[").unwrap().1.split_once("];").unwrap().0;
        let mut declared = 0;
        for line in declarations.lines() {
            let Some(rest) = line.strip_prefix("pub const ") else { continue };
            let Some((ident, ty)) = rest.split_once(':') else { continue };
            if ty.trim_start().starts_with("Metric") {
                declared += 1;
                assert!(named_list.contains(&format!("&{ident},")), "{ident} is declared but not in NAMED");
            }
        }
        let names: Vec<&str> = catalog().iter().map(|m| m.name).collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "a name appears twice: {names:?}");
        assert_eq!(names.len(), declared + DISCREPANCIES.len());
    }

    #[test]
    fn every_reconciliation_kind_has_its_metric() {
        for kind in DiscrepancyKind::ALL {
            assert_eq!(discrepancy(kind).name, format!("Discrepancy.{kind}"));
            assert!(catalog().contains(&discrepancy(kind)), "Discrepancy.{kind} is not in the catalog");
        }
        assert_eq!(DISCREPANCIES.len(), DiscrepancyKind::ALL.len());
    }

    #[test]
    fn metrics_are_emitted_only_through_the_catalog() {
        // The only way to emit is a `Metric` of this file: no other file
        // builds one, and none prints an EMF document of its own.
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut stack = vec![std::path::PathBuf::from(root)];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("metrics.rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for banned in ["Metric {", "CloudWatchMetrics", "count_metric("] {
                        assert!(!text.contains(banned), "{}: `{banned}` outside metrics.rs", path.display());
                    }
                }
            }
        }
    }
}
