//! The effects backstop's queue as deployed (issue 17): the template,
//! translated as CloudFormation sees it after the SAM transform (dev
//! parameters, `infra/template_check.py translate`), has the queue the
//! sweep fills, its dead-letter queue after 10 receives, the consumer's
//! mapping with partial batch responses, an alarm on the DLQ's visible
//! messages with its runbook entry, and the sweep allowed to send there.
//! Needs the repo's `.venv` (as the other template tests), no stack.

use serde_json::{json, Value};
use system_tests::template::{self, consumers_of, depth_alarms_of, has_runbook_entry, of_type};

fn translated() -> Value {
    template::translated("dev")
}

#[test]
fn the_pending_effects_queue_dead_letters_after_ten_receives_into_an_alarmed_dlq_with_a_runbook() {
    let t = translated();
    let queue = &t["Resources"]["PendingEffectsQueue"];
    assert_eq!(queue["Type"], "AWS::SQS::Queue");
    let redrive = &queue["Properties"]["RedrivePolicy"];
    assert_eq!(redrive["deadLetterTargetArn"], json!({"Fn::GetAtt": ["PendingEffectsQueueDLQ", "Arn"]}));
    assert_eq!(redrive["maxReceiveCount"], 10);
    assert_eq!(t["Resources"]["PendingEffectsQueueDLQ"]["Type"], "AWS::SQS::Queue");

    let alarms = depth_alarms_of(&t, "PendingEffectsQueueDLQ");
    assert_eq!(alarms, ["PendingEffectsQueueDLQAlarm"], "one alarm on the DLQ's visible messages");
    assert!(has_runbook_entry("PendingEffectsQueueDLQAlarm"), "its runbook entry");
}

#[test]
fn drive_effects_consumes_the_queue_in_batches_of_ten_naming_only_failed_messages() {
    let t = translated();
    let mappings = consumers_of(&t, "PendingEffectsQueue");
    assert_eq!(mappings.len(), 1, "one consumer of the queue");
    let m = mappings[0];
    assert_eq!(m["FunctionName"], json!({"Ref": "DriveEffectsFunction"}));
    assert_eq!(m["BatchSize"], 10);
    assert_eq!(m["FunctionResponseTypes"], json!(["ReportBatchItemFailures"]));
    assert_eq!(t["Resources"]["DriveEffectsFunction"]["Properties"]["Handler"], "drive-effects");
}

#[test]
fn the_sweep_hands_pending_effects_to_the_queue_and_no_longer_drives_them() {
    let t = translated();
    let sweep = &t["Resources"]["SweepFunction"]["Properties"];
    let env = &sweep["Environment"]["Variables"];
    assert_eq!(env["PENDING_EFFECTS_QUEUE_URL"], json!({"Ref": "PendingEffectsQueue"}));
    let role = t["Resources"]["SweepFunctionRole"].to_string();
    assert!(role.contains("PendingEffectsQueue"), "the sweep may send to the queue");
    for driven in ["scheduler:DeleteSchedule", "dynamodb:ConditionCheckItem", "ssm:GetParameter"] {
        assert!(!role.contains(driven), "the sweep no longer runs settle or release itself: {driven} granted");
    }
}

/// drive-effects names a failed effect in its batch response, so the
/// invocation succeeds and Lambda's `Errors` stays 0 however many effects
/// fail: the alarm that says "pending effects are failing" watches the
/// `EffectFailed` metric the handler emits for them (Effect=backstop).
#[test]
fn a_failed_pending_effect_raises_an_alarm_on_effect_failed_backstop_with_a_runbook() {
    let t = translated();
    let alarms: Vec<&String> = of_type(&t, "AWS::CloudWatch::Alarm")
        .into_iter()
        .filter(|(_, a)| {
            let p = &a["Properties"];
            let dims = p["Dimensions"].as_array().cloned().unwrap_or_default();
            p["Namespace"] == "OrderExpiry"
                && p["MetricName"] == "EffectFailed"
                && dims.iter().any(|d| d["Name"] == "Effect" && d["Value"] == "backstop")
                && dims.iter().any(|d| d["Name"] == "Stack")
                && p["Threshold"] == 0
                && p["ComparisonOperator"] == "GreaterThanThreshold"
                && p["AlarmActions"].as_array().is_some_and(|a| !a.is_empty())
        })
        .map(|(id, _)| id)
        .collect();
    assert_eq!(alarms, ["DriveEffectsFailedAlarm"], "one alarm on failed pending effects");
    assert!(has_runbook_entry("DriveEffectsFailedAlarm"), "its runbook entry");
    let handler = include_str!("../../shared/src/handlers/effects.rs");
    assert!(handler.contains(r#"EFFECT_FAILED.emit(1.0, &["backstop"])"#), "the metric drive-effects emits");
}
