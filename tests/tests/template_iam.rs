//! Least privilege, checked on the template: the local emulator runs every
//! function with the same credentials and enforces no IAM policy, so the
//! end-to-end suites would pass whatever the roles said. Each test runs one
//! check of `infra/template_check.py` (the SAM-translated template for the
//! dev and prod parameter sets, against the per-function list of calls in
//! `infra/iam-actions.yaml`). Needs `.venv` (infra/tools.sh).

use system_tests::template_check;

fn run_check(check: &str) {
    template_check("template_check.py", check);
}

#[test]
fn every_role_grants_exactly_the_listed_calls_and_nothing_on_every_resource() {
    run_check("roles");
}

#[test]
fn queue_and_stream_triggers_poll_only_their_own_source_and_queues_are_capped() {
    run_check("mappings");
}

#[test]
fn the_listed_calls_are_the_sdk_calls_the_code_makes() {
    run_check("code");
}
