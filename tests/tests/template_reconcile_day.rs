//! The day run as deployed (issue 17): the template, translated as
//! CloudFormation sees it after the SAM transform (dev parameters,
//! `infra/template_check.py translate`), has the reconcile index on the
//! table, a daily coordinator with its failure destination, the piece queue
//! dead-lettering after 3 receives into an alarmed DLQ with a runbook, a
//! worker consuming one piece per message, and neither function allowed to
//! scan the orders. Needs the repo's `.venv` (as the other template tests),
//! no stack.

use serde_json::{json, Value};
use system_tests::template::{self, consumers_of, depth_alarms_of, has_runbook_entry, of_type};

fn translated() -> Value {
    template::translated("dev")
}

#[test]
fn the_table_has_a_keys_only_reconcile_index_by_day_part_and_final_time() {
    let t = translated();
    let table = &t["Resources"]["OrdersTable"]["Properties"];
    let gsis = table["GlobalSecondaryIndexes"].as_array().unwrap();
    let index = gsis.iter().find(|g| g["IndexName"] == "reconcile-index").expect("the reconcile index");
    assert_eq!(
        index["KeySchema"],
        json!([{"AttributeName": "recon_part", "KeyType": "HASH"}, {"AttributeName": "recon_at", "KeyType": "RANGE"}])
    );
    assert_eq!(index["Projection"]["ProjectionType"], "KEYS_ONLY");
    let defs = table["AttributeDefinitions"].to_string();
    assert!(defs.contains("recon_part") && defs.contains("recon_at"), "{defs}");
}

#[test]
fn the_piece_queue_dead_letters_after_three_receives_into_an_alarmed_dlq_with_a_runbook() {
    let t = translated();
    let queue = &t["Resources"]["ReconcilePieceQueue"]["Properties"];
    let redrive = &queue["RedrivePolicy"];
    assert_eq!(redrive["deadLetterTargetArn"], json!({"Fn::GetAtt": ["ReconcilePieceDLQ", "Arn"]}));
    // tests/tests/reconcile_day.rs plays the queue with this count.
    assert_eq!(redrive["maxReceiveCount"], 3);
    let timeout = t["Resources"]["ReconcilePieceFunction"]["Properties"]["Timeout"].as_i64().unwrap();
    assert!(queue["VisibilityTimeout"].as_i64().unwrap() >= timeout, "a running piece is not handed out twice");
    let alarms = depth_alarms_of(&t, "ReconcilePieceDLQ");
    assert_eq!(alarms, ["ReconcilePieceDLQAlarm"], "one alarm on the DLQ's visible messages");
    assert!(has_runbook_entry("ReconcilePieceDLQAlarm"), "its runbook entry");
}

#[test]
fn the_worker_takes_one_piece_per_message_and_names_a_failed_one() {
    let t = translated();
    let mappings = consumers_of(&t, "ReconcilePieceQueue");
    assert_eq!(mappings.len(), 1, "one consumer of the queue");
    assert_eq!(mappings[0]["FunctionName"], json!({"Ref": "ReconcilePieceFunction"}));
    assert_eq!(mappings[0]["BatchSize"], 1);
    assert_eq!(mappings[0]["FunctionResponseTypes"], json!(["ReportBatchItemFailures"]));
    assert_eq!(t["Resources"]["ReconcilePieceFunction"]["Properties"]["Handler"], "reconcile-piece");
}

#[test]
fn the_coordinator_runs_daily_hands_pieces_to_the_queue_and_keeps_failed_runs() {
    let t = translated();
    let schedules: Vec<&Value> = of_type(&t, "AWS::Scheduler::Schedule")
        .into_iter()
        .map(|(_, s)| &s["Properties"])
        .filter(|p| p["Target"]["Arn"] == json!({"Fn::GetAtt": ["ReconcileDayFunction", "Arn"]}))
        .collect();
    assert_eq!(schedules.len(), 1, "one schedule starts the day run");
    assert_eq!(schedules[0]["ScheduleExpression"], "cron(0 3 * * ? *)");
    let coordinator = &t["Resources"]["ReconcileDayFunction"]["Properties"];
    assert_eq!(coordinator["Handler"], "reconcile-day");
    assert_eq!(
        coordinator["Environment"]["Variables"]["RECONCILE_PIECE_QUEUE_URL"],
        json!({"Ref": "ReconcilePieceQueue"})
    );
    let invoke = of_type(&t, "AWS::Lambda::EventInvokeConfig")
        .into_iter()
        .map(|(_, c)| &c["Properties"])
        .find(|p| p["FunctionName"] == json!({"Ref": "ReconcileDayFunction"}))
        .expect("the coordinator's invoke config")
        .clone();
    assert_eq!(
        invoke["DestinationConfig"]["OnFailure"]["Destination"],
        json!({"Fn::GetAtt": ["ReconcileFailureQueue", "Arn"]})
    );
    // The full read no longer runs on a schedule of its own.
    let full = of_type(&t, "AWS::Scheduler::Schedule")
        .into_iter()
        .filter(|(_, s)| s["Properties"]["Target"]["Arn"] == json!({"Fn::GetAtt": ["ReconcileFunction", "Arn"]}))
        .count();
    assert_eq!(full, 0);
}

#[test]
fn neither_day_run_function_may_scan_the_orders_table() {
    let t = translated();
    for role in ["ReconcileDayFunctionRole", "ReconcilePieceFunctionRole"] {
        let statements: Vec<Value> = t["Resources"][role]["Properties"]["Policies"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| p["PolicyDocument"]["Statement"].as_array().cloned().unwrap_or_default())
            .collect();
        for s in &statements {
            let scans = s["Action"] == "dynamodb:Scan"
                || s["Action"].as_array().is_some_and(|a| a.iter().any(|a| a == "dynamodb:Scan"));
            let on_orders = s["Resource"].to_string().contains("OrdersTable");
            assert!(!(scans && on_orders), "{role} may scan the orders: {s}");
        }
    }
}
