//! The functions' log lines that name one order, from CloudWatch Logs
//! (`FilterLogEvents` on each `/aws/lambda/<function>` group, the order id
//! as a quoted term). This is how a reminder that *reached* an order shows
//! up: close-order logs every reminder it handled with its trigger
//! (`schedule`, `sweep`, `lazy`, `operator:…`, `redrive`) and outcome, and
//! the effect functions log what they settled.
//!
//! The sweep logs each reminder it sends with the order id, so a swept
//! reminder shows twice: sent (sweep) and handled (close-order).
//!
//! What it cannot show: a reminder lost before it reached a function (a
//! schedule that never fired leaves no line), lines a function logged
//! without the order id (batch summaries), and anything older than the log
//! groups' retention.

use crate::error::{CliError, Result};
use crate::settings::Stack;
use crate::signed::Signed;
use order_core::domain::Timestamp;
use serde::Serialize;
use serde_json::{json, Value};

#[derive(Debug, Clone, Serialize)]
pub struct LogLine {
    pub at: String,
    pub function: String,
    pub level: String,
    pub message: String,
    /// The structured fields besides the message and the order id, `k=v`.
    pub fields: String,
}

/// The log lines naming `needle` since `since`, oldest first, and notes on
/// the groups that could not be read.
/// `only`: one function's short name (`relay`), else every function.
pub async fn lines_naming(
    stack: &Stack,
    needle: &str,
    since: Timestamp,
    only: Option<&str>,
) -> Result<(Vec<LogLine>, Vec<String>)> {
    let signed = Signed::new(&stack.sdk)?;
    let groups: Vec<(String, String)> =
        stack.functions().into_iter().filter(|(short, _)| only.is_none_or(|o| o == short)).collect();
    let reads = groups.iter().map(|(short, function)| {
        let signed = &signed;
        async move { (short.clone(), filter(signed, &format!("/aws/lambda/{function}"), needle, since).await) }
    });
    let mut lines = Vec::new();
    let mut notes = Vec::new();
    for (short, result) in futures_util::future::join_all(reads).await {
        match result {
            Ok(events) => lines.extend(events.iter().map(|e| line_of(&short, e))),
            Err(note) => notes.push(format!("{short}: {note}")),
        }
    }
    lines.sort_by(|a, b| a.at.cmp(&b.at));
    Ok((lines, notes))
}

/// Why one log group was not read: a note beside the lines found, not a
/// failure of the command.
#[derive(Debug, thiserror::Error)]
enum Unread {
    /// The request could not be signed or sent.
    #[error("{}", .0.what)]
    Request(CliError),
    /// The function has not run, so its group does not exist yet.
    #[error("no log group yet (the function has not run)")]
    NoGroup,
    /// CloudWatch Logs refused the call.
    #[error("FilterLogEvents answered HTTP {status}: {}", text.chars().take(200).collect::<String>())]
    Refused { status: u16, text: String },
}

/// At most this many pages of one group (10,000 events each on AWS).
const MAX_PAGES: usize = 5;

async fn filter(
    signed: &Signed,
    group: &str,
    needle: &str,
    since: Timestamp,
) -> std::result::Result<Vec<Value>, Unread> {
    let url = format!("{}/", signed.endpoint("logs"));
    let headers = [("content-type", "application/x-amz-json-1.1"), ("x-amz-target", "Logs_20140328.FilterLogEvents")];
    let mut events = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let mut body = json!({
            "logGroupName": group,
            "filterPattern": format!("\"{needle}\""),
            "startTime": since.unix_millis(),
        });
        if let Some(t) = &token {
            body["nextToken"] = json!(t);
        }
        let (status, text) = signed
            .send("logs", "POST", &url, &headers, body.to_string().into_bytes())
            .await
            .map_err(Unread::Request)?;
        let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status == 400 && answer["__type"].as_str().unwrap_or("").contains("ResourceNotFound") {
            return Err(Unread::NoGroup);
        }
        if !(200..300).contains(&status) {
            return Err(Unread::Refused { status, text });
        }
        events.extend(answer["events"].as_array().cloned().unwrap_or_default());
        token = answer["nextToken"].as_str().map(str::to_owned);
        if token.is_none() {
            break;
        }
    }
    Ok(events)
}

/// A log event as a line: the functions log JSON (`tracing`'s format:
/// `level`, the event's fields — at the top level, as the functions log
/// them (flattened), or under `fields` — and the spans' fields); any other
/// line is shown as it is.
fn line_of(function: &str, event: &Value) -> LogLine {
    let at = event["timestamp"].as_i64().map(|ms| Timestamp::from_unix_millis(ms).to_string()).unwrap_or_default();
    let raw = event["message"].as_str().unwrap_or("").trim();
    let parsed: Value = serde_json::from_str(raw).unwrap_or(Value::Null);
    let flat = parsed.as_object().filter(|o| o.contains_key("level") && o.contains_key("message"));
    let Some(fields) = parsed["fields"].as_object().or(flat) else {
        return LogLine {
            at,
            function: function.to_owned(),
            level: String::new(),
            message: raw.chars().take(300).collect(),
            fields: String::new(),
        };
    };
    let mut kv: Vec<String> = Vec::new();
    let spans = parsed["spans"].as_array().cloned().unwrap_or_default();
    for (k, v) in spans.iter().filter_map(Value::as_object).flatten().chain(fields.iter()) {
        // The trace id is noise here; the request id stays (a closing
        // lease's owner is the closer's request id).
        if ["message", "order_id", "name", "xrayTraceId", "level", "spans", "timestamp", "target", "span"]
            .contains(&k.as_str())
        {
            continue;
        }
        let v = v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
        let pair = format!("{k}={v}");
        if !kv.contains(&pair) {
            kv.push(pair);
        }
    }
    LogLine {
        at,
        function: function.to_owned(),
        level: parsed["level"].as_str().unwrap_or("").to_lowercase(),
        message: fields.get("message").and_then(Value::as_str).unwrap_or("").to_owned(),
        fields: kv.join(" "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tracing_json_line_becomes_message_and_fields() {
        let event = json!({"timestamp": 0, "message": r#"{"level":"INFO","fields":{"message":"close reminder handled","order_id":"ord_1","trigger":"sweep","outcome":"Closed"},"spans":[{"trigger":"sweep","name":"close_message"}]}"#});
        let l = line_of("close-order", &event);
        assert_eq!(l.message, "close reminder handled");
        assert_eq!(l.level, "info");
        assert_eq!(l.fields, "trigger=sweep outcome=Closed");
        assert_eq!(l.at, "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn a_flattened_json_line_becomes_message_and_fields() {
        let event = json!({"timestamp": 0, "message": r#"{"level":"INFO","message":"close reminder handled","order_id":"ord_1","trigger":"sweep","outcome":"closed","spans":[{"trigger":"sweep","name":"close_message"}]}"#});
        let l = line_of("close-order", &event);
        assert_eq!(l.message, "close reminder handled");
        assert_eq!(l.level, "info");
        assert_eq!(l.fields, "trigger=sweep outcome=closed");
    }

    #[test]
    fn any_other_line_is_kept_as_it_is() {
        let l = line_of("relay", &json!({"timestamp": 0, "message": "START RequestId: 1\n"}));
        assert_eq!(l.message, "START RequestId: 1");
        assert_eq!(l.fields, "");
    }
}
