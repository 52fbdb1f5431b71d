//! Least privilege, checked on the template: the local emulator runs every
//! function with the same credentials and enforces no IAM policy, so the
//! end-to-end suites would pass whatever the roles said. Each test runs one
//! check of `infra/template_check.py` (the SAM-translated template for the
//! dev and prod parameter sets, against the per-function list of calls in
//! `infra/iam-actions.yaml`). Needs `.venv` (infra/tools.sh).

use std::path::PathBuf;
use std::process::Command;

fn run_check(check: &str) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv/bin/python");
    let out = Command::new(&python)
        .arg(root.join("infra/template_check.py"))
        .arg(check)
        .current_dir(&root)
        .output()
        .unwrap_or_else(|e| panic!("running {} (infra/tools.sh creates it): {e}", python.display()));
    assert!(
        out.status.success(),
        "template_check.py {check} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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
