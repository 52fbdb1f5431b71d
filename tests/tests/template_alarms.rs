//! Nothing in the template fails silently: each test runs one check of
//! `infra/check_alarms.py` over `template.yaml` (every alarm notifies the
//! alarm topic; every function has a log group with the retention
//! parameter, an Errors and a Throttles alarm; every dead-letter queue a
//! depth alarm and every consumed queue an oldest-message-age alarm). The
//! checks live in Python because they read the template with the same
//! loader the deploy uses; no stack is needed.

use system_tests::template_check;

fn check(name: &str) {
    template_check("check_alarms.py", name);
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
