//! The template as CloudFormation sees it after the language extensions
//! and the SAM transform (`infra/template_check.py translate <stage>`), and
//! the questions the template tests ask of it. Needs the repo's `.venv`
//! (`infra/tools.sh` creates it), no stack.

use serde_json::Value;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The translated template of `stage` (`dev` or `prod`) as JSON.
pub fn translated(stage: &str) -> Value {
    let out = std::process::Command::new(root().join(".venv/bin/python"))
        .arg(root().join("infra/template_check.py"))
        .args(["translate", stage])
        .current_dir(root())
        .output()
        .expect("the repo's .venv python (infra/tools.sh creates it)");
    assert!(out.status.success(), "translate {stage} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the translated template is JSON")
}

/// Every resource of type `kind`, with its logical id.
pub fn of_type<'a>(t: &'a Value, kind: &str) -> Vec<(&'a String, &'a Value)> {
    t["Resources"].as_object().unwrap().iter().filter(|(_, r)| r["Type"] == kind).collect()
}

/// The alarms that fire on any visible message in the queue `dlq` (its
/// logical id) and notify someone.
pub fn depth_alarms_of<'a>(t: &'a Value, dlq: &str) -> Vec<&'a String> {
    let dlq_name = serde_json::json!({"Fn::GetAtt": [dlq, "QueueName"]});
    of_type(t, "AWS::CloudWatch::Alarm")
        .into_iter()
        .filter(|(_, a)| {
            let p = &a["Properties"];
            p["MetricName"] == "ApproximateNumberOfMessagesVisible"
                && p["Threshold"] == 0
                && p["ComparisonOperator"] == "GreaterThanThreshold"
                && p["Dimensions"].as_array().is_some_and(|d| d.iter().any(|d| d["Value"] == dlq_name))
                && p["AlarmActions"].as_array().is_some_and(|a| !a.is_empty())
        })
        .map(|(id, _)| id)
        .collect()
}

/// The properties of every event source mapping that reads the queue
/// `queue` (its logical id).
pub fn consumers_of<'a>(t: &'a Value, queue: &str) -> Vec<&'a Value> {
    let source = serde_json::json!({"Fn::GetAtt": [queue, "Arn"]});
    of_type(t, "AWS::Lambda::EventSourceMapping")
        .into_iter()
        .map(|(_, m)| &m["Properties"])
        .filter(|p| p["EventSourceArn"] == source)
        .collect()
}

/// `docs/runbooks.md`, whose `### <AlarmLogicalId>` headings are the
/// alarms' entries.
pub fn runbooks() -> String {
    std::fs::read_to_string(root().join("docs/runbooks.md")).unwrap()
}

/// Whether `docs/runbooks.md` has an entry headed by `alarm`.
pub fn has_runbook_entry(alarm: &str) -> bool {
    runbooks().lines().any(|l| l.trim() == format!("### {alarm}"))
}
