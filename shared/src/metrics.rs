//! CloudWatch metrics as Embedded Metric Format log lines: one JSON object
//! on stdout per data point, turned into a metric by CloudWatch Logs. No SDK
//! call, no added latency.

use serde_json::json;

pub const NAMESPACE: &str = "OrderExpiry";

/// Emits `name` with `value` (a count). The metric has no dimensions, so
/// that one alarm covers every function that emits it; the function name
/// rides along as a property for searching the logs.
pub fn count(name: &str, value: u64) {
    emit(name, value as f64, "Count");
}

/// Emits a measurement in `unit` (a CloudWatch unit name: `Seconds`,
/// `Milliseconds`, `Count`), e.g. an age or a duration.
pub fn emit(name: &str, value: f64, unit: &str) {
    let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "local".into());
    let ts =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let line = json!({
        "_aws": {
            "Timestamp": ts,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [[]],
                "Metrics": [{"Name": name, "Unit": unit}]
            }]
        },
        "function": function,
        name: value,
    });
    println!("{line}");
}
