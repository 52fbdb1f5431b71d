//! The template watches what the code emits: every alarm on the custom
//! namespace, and every custom metric on the dashboard, names a metric of
//! `order_core::metrics::catalog()` with one of the dimension sets it is
//! emitted under (`infra/check_alarms.py metric-alarms` and `dashboard`,
//! handed the catalog as JSON); and every alarm has its runbook entry in
//! `docs/runbooks.md` (`runbooks`). No stack is needed.

use system_tests::template_check;

fn check_with_catalog(check: &str) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let catalog = std::env::temp_dir().join(format!("metric-catalog-{}-{check}.json", std::process::id()));
    std::fs::write(&catalog, order_core::metrics::catalog_json().to_string()).unwrap();
    let out = std::process::Command::new(root.join(".venv/bin/python"))
        .arg(root.join("infra/check_alarms.py"))
        .arg("--metrics")
        .arg(&catalog)
        .arg(check)
        .current_dir(&root)
        .output()
        .expect("running .venv/bin/python (infra/tools.sh creates it)");
    let _ = std::fs::remove_file(&catalog);
    assert!(
        out.status.success(),
        "infra/check_alarms.py {check} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_custom_metric_alarm_names_an_emitted_metric_with_its_dimensions() {
    check_with_catalog("metric-alarms");
}

#[test]
fn the_dashboard_is_json_and_shows_only_emitted_metrics_and_template_resources() {
    check_with_catalog("dashboard");
}

#[test]
fn every_alarm_has_a_runbook_entry() {
    template_check("check_alarms.py", "runbooks");
}

#[test]
fn the_catalog_json_lists_stack_first_in_every_dimension_set() {
    let catalog = order_core::metrics::catalog_json();
    let all = catalog.as_array().unwrap();
    assert!(all.len() > 40, "{catalog}");
    for m in all {
        assert_eq!(m["dimensions"][0], "Stack", "{m}");
        assert!(["Count", "Seconds", "Milliseconds"].contains(&m["unit"].as_str().unwrap()), "{m}");
    }
}
