//! The reconciliation's kinds of discrepancy are one enum
//! (`order_core::usecases::reconcile::DiscrepancyKind`), and everything
//! that names a kind outside the code is held to it: the metric catalog
//! (`Discrepancy.<kind>`, one per kind), the alarms of the template (read
//! as CloudFormation sees it, `infra/template_check.py translate`, for the
//! dev and the prod parameter sets) and `docs/runbooks.md` (a section per
//! kind's alarm that names the kind). Every kind is alarmed
//! (`order_core::metrics::DISCREPANCIES`: each has its own alarm). Needs the
//! repo's `.venv` (as the other template tests), no stack.

use order_core::metrics::{self, Unit};
use order_core::usecases::reconcile::DiscrepancyKind;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn translated(stage: &str) -> Value {
    system_tests::template::translated(stage)
}

/// The metrics of the custom namespace an alarm watches, as (name, its
/// dimensions by name): its own metric, or each metric of a metric-math
/// alarm.
fn watched(alarm: &Value) -> Vec<(String, BTreeMap<String, Value>)> {
    let p = &alarm["Properties"];
    let one = |m: &Value, dims: &Value| -> Option<(String, BTreeMap<String, Value>)> {
        (m["Namespace"] == metrics::NAMESPACE).then(|| {
            let dims = dims.as_array().into_iter().flatten();
            let dims = dims.filter_map(|d| Some((d["Name"].as_str()?.to_owned(), d["Value"].clone()))).collect();
            (m["MetricName"].as_str().unwrap_or_default().to_owned(), dims)
        })
    };
    let mut out: Vec<_> = one(p, &p["Dimensions"]).into_iter().collect();
    for q in p["Metrics"].as_array().into_iter().flatten() {
        let m = &q["MetricStat"]["Metric"];
        out.extend(one(m, &m["Dimensions"]));
    }
    out
}

/// The kind a watched metric counts: `Discrepancy.<kind>`, or a
/// `Discrepancy…` metric with a `Kind` dimension. `Err` with the name it
/// gives when that is not a kind; `Ok(None)` for any other metric.
fn kind_of(name: &str, dims: &BTreeMap<String, Value>) -> Result<Option<DiscrepancyKind>, String> {
    if let Some(kind) = name.strip_prefix("Discrepancy.") {
        return DiscrepancyKind::parse(kind).map(Some).ok_or_else(|| kind.to_owned());
    }
    match dims.get("Kind") {
        Some(v) if name.starts_with("Discrepancy") => {
            let kind = v.as_str().unwrap_or_default();
            DiscrepancyKind::parse(kind).map(Some).ok_or_else(|| kind.to_owned())
        }
        _ => Ok(None),
    }
}

/// Each alarm on a discrepancy metric, by logical id, with its kind; the
/// problems found on the way (a kind that does not exist).
fn discrepancy_alarms(t: &Value) -> (BTreeMap<String, DiscrepancyKind>, Vec<String>) {
    let (mut alarms, mut problems) = (BTreeMap::new(), Vec::new());
    let resources = t["Resources"].as_object().expect("Resources");
    for (id, r) in resources.iter().filter(|(_, r)| r["Type"] == "AWS::CloudWatch::Alarm") {
        for (name, dims) in watched(r) {
            match kind_of(&name, &dims) {
                Ok(Some(kind)) => {
                    alarms.insert(id.clone(), kind);
                }
                Ok(None) => {}
                Err(unknown) => problems.push(format!("{id}: alarm on {name}, kind {unknown:?} does not exist")),
            }
        }
        if id.starts_with("Discrepancy") && !alarms.contains_key(id) {
            problems.push(format!("{id}: named for a discrepancy, watches no discrepancy metric"));
        }
    }
    (alarms, problems)
}

/// `docs/runbooks.md`'s sections by their heading's alarm id (`### XAlarm`,
/// as `infra/check_alarms.py runbooks` reads them), each with its text.
fn runbook_sections() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("docs/runbooks.md")).expect("docs/runbooks.md");
    let mut sections = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("##").map(|h| h.trim_start_matches('#')) {
            if let Some((id, body)) = current.take() {
                sections.insert(id, body);
            }
            let word = heading.trim().trim_matches('`');
            let id: String = word.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            if id.ends_with("Alarm") {
                current = Some((id, String::new()));
            }
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    sections.extend(current);
    sections
}

/// The kinds a runbook section names as the one counted: "counted `kind`".
fn kinds_counted(section: &str) -> Vec<&str> {
    section.split("counted `").skip(1).filter_map(|rest| rest.split_once('`').map(|(kind, _)| kind)).collect()
}

#[test]
fn the_kinds_are_named_once_and_read_back_by_their_wire_names() {
    let names: BTreeSet<&str> = DiscrepancyKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(names.len(), DiscrepancyKind::COUNT, "two kinds share a name");
    for kind in DiscrepancyKind::ALL {
        assert_eq!(DiscrepancyKind::parse(kind.as_str()), Some(kind));
        assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        assert_eq!(serde_json::from_value::<DiscrepancyKind>(kind.as_str().into()).unwrap(), kind);
        assert_eq!(kind.metric_name(), format!("Discrepancy.{kind}"));
    }
    let unknown = serde_json::from_value::<DiscrepancyKind>("stock_lost".into()).unwrap_err().to_string();
    assert!(unknown.contains("unknown discrepancy kind \"stock_lost\""), "{unknown}");
}

#[test]
fn every_kind_has_its_metric_and_every_discrepancy_metric_is_a_kind() {
    let catalog = metrics::catalog();
    for kind in DiscrepancyKind::ALL {
        let m = catalog.iter().find(|m| m.name == kind.metric_name());
        let m = m.unwrap_or_else(|| panic!("{kind}: no {} in the catalog", kind.metric_name()));
        assert_eq!((m.unit, m.dimensions), (Unit::Count, &[][..]), "{kind}");
        assert_eq!(metrics::discrepancy(kind), *m, "{kind}");
    }
    for m in catalog.iter().filter(|m| m.name.starts_with("Discrepancy")) {
        assert!(kind_of(m.name, &BTreeMap::new()).is_ok_and(|k| k.is_some()), "{}: not a kind's metric", m.name);
    }
}

#[test]
fn every_kind_has_its_alarm_with_a_runbook_section_and_none_names_a_kind_that_does_not_exist() {
    let sections = runbook_sections();
    for stage in ["dev", "prod"] {
        let (alarms, mut problems) = discrepancy_alarms(&translated(stage));
        for kind in DiscrepancyKind::ALL {
            let ids: Vec<&String> = alarms.iter().filter(|(_, k)| **k == kind).map(|(id, _)| id).collect();
            if ids.is_empty() {
                problems.push(format!("{kind}: no alarm on {}", kind.metric_name()));
            }
            for id in ids {
                match sections.get(id) {
                    None => problems.push(format!("{id} ({kind}): no runbook section `### {id}`")),
                    Some(text) if !kinds_counted(text).contains(&kind.as_str()) => {
                        problems.push(format!("{id}: its runbook section does not say it counted `{kind}`"))
                    }
                    Some(_) => {}
                }
            }
        }
        assert!(problems.is_empty(), "{stage}:\n{}", problems.join("\n"));
    }
    // The runbooks: a discrepancy section is some kind's alarm's, and names
    // only that kind as counted; no section names a kind that does not exist.
    let (alarms, _) = discrepancy_alarms(&translated("prod"));
    let mut problems = Vec::new();
    for (id, text) in &sections {
        let counted = kinds_counted(text);
        for name in &counted {
            if DiscrepancyKind::parse(name).is_none() {
                problems.push(format!("{id}: names `{name}`, which is not a kind"));
            }
        }
        match alarms.get(id) {
            Some(kind) if counted.iter().any(|c| *c != kind.as_str()) => {
                problems.push(format!("{id}: names {counted:?} as counted, its alarm counts `{kind}`"))
            }
            Some(_) => {}
            None if id.starts_with("Discrepancy") => {
                problems.push(format!("{id}: a discrepancy runbook section for no discrepancy alarm"))
            }
            None => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_reads_an_alarm_on_a_kind_by_name_or_by_dimension_and_refuses_an_unknown_one() {
    let alarm = |name: &str, dims: Value| {
        serde_json::json!({"Type": "AWS::CloudWatch::Alarm", "Properties": {
            "Namespace": metrics::NAMESPACE, "MetricName": name, "Dimensions": dims}})
    };
    let t = serde_json::json!({"Resources": {
        "ByName": alarm("Discrepancy.amount_mismatch", serde_json::json!([{"Name": "Stack", "Value": "s"}])),
        "ByDimension": alarm("DiscrepancyFound", serde_json::json!([{"Name": "Kind", "Value": "undecodable_record"}])),
        "Unknown": alarm("Discrepancy.stock_lost", serde_json::json!([])),
        "DiscrepancyOther": alarm("OrderClosed", serde_json::json!([])),
    }});
    let (alarms, problems) = discrepancy_alarms(&t);
    assert_eq!(alarms["ByName"], DiscrepancyKind::AmountMismatch);
    assert_eq!(alarms["ByDimension"], DiscrepancyKind::UndecodableRecord);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems.iter().any(|p| p.starts_with("DiscrepancyOther: named for a discrepancy")), "{problems:?}");
    assert!(problems.iter().any(|p| p.starts_with("Unknown:") && p.contains("\"stock_lost\"")), "{problems:?}");
    assert_eq!(kinds_counted("The run counted `amount_mismatch`. A `key`."), ["amount_mismatch"]);
}
