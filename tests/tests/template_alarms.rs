//! Nothing in the template fails silently: each test runs one check of
//! `infra/check_alarms.py` over `template.yaml` (every alarm notifies the
//! alarm topic; every function has a log group with the retention
//! parameter, an Errors and a Throttles alarm; every dead-letter queue a
//! depth alarm and every consumed queue an oldest-message-age alarm). The
//! checks live in Python because they read the template with the same
//! loader the deploy uses; no stack is needed.

use std::path::Path;
use std::process::Command;

fn check(name: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join(".venv/bin/python"))
        .arg("infra/check_alarms.py")
        .arg(name)
        .current_dir(&root)
        .output()
        .unwrap_or_else(|e| panic!("running .venv/bin/python infra/check_alarms.py (run infra/tools.sh first): {e}"));
    assert!(
        out.status.success(),
        "infra/check_alarms.py {name} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_alarm_notifies_the_alarm_topic() {
    check("actions");
}

#[test]
fn every_function_logs_to_a_declared_group_with_retention() {
    check("log-groups");
}

#[test]
fn every_function_has_an_errors_and_a_throttles_alarm() {
    check("function-alarms");
}

#[test]
fn every_dead_letter_queue_has_a_depth_alarm_and_every_consumed_queue_an_age_alarm() {
    check("queue-alarms");
}
