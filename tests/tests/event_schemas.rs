//! The published event details match their JSON Schemas
//! (`events/schemas/<Type>.schema.json`, draft 2020-12): one example of
//! each type validates, and each schema names exactly the fields the
//! detail has, so the schema and the code cannot drift apart unnoticed.

use order_core::domain::events::{examples::one_of_each, IntegrationEvent};
use serde_json::{json, Value};
use std::collections::BTreeSet;

fn schema_of(detail_type: &str) -> Value {
    let path = format!("{}/../events/schemas/{detail_type}.schema.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn validator(detail_type: &str) -> jsonschema::Validator {
    let schema = schema_of(detail_type);
    assert!(jsonschema::meta::is_valid(&schema), "{detail_type}: not a valid JSON Schema");
    jsonschema::draft202012::new(&schema).unwrap_or_else(|e| panic!("{detail_type}: {e}"))
}

fn errors(v: &jsonschema::Validator, detail: &Value) -> Vec<String> {
    v.iter_errors(detail).map(|e| format!("{} at {}", e, e.instance_path)).collect()
}

#[test]
fn one_event_of_each_type_validates_against_its_schema() {
    let events = one_of_each();
    assert_eq!(events.len(), IntegrationEvent::DETAIL_TYPES.len());
    for e in &events {
        let v = validator(e.detail_type());
        let detail = e.detail();
        assert_eq!(errors(&v, &detail), Vec::<String>::new(), "{}: {detail}", e.detail_type());
    }
}

#[test]
fn each_schema_names_exactly_the_fields_of_its_detail() {
    // The examples carry every optional field, so their keys are all keys.
    for e in one_of_each() {
        let schema = schema_of(e.detail_type());
        let in_schema: BTreeSet<String> = schema["properties"].as_object().unwrap().keys().cloned().collect();
        let in_detail: BTreeSet<String> = e.detail().as_object().unwrap().keys().cloned().collect();
        assert_eq!(in_schema, in_detail, "{}", e.detail_type());
        assert_eq!(schema["additionalProperties"], json!(false), "{}", e.detail_type());
        assert_eq!(schema["title"], json!(e.detail_type()));
    }
}

#[test]
fn a_detail_with_an_unknown_field_a_missing_field_or_a_wrong_type_is_refused() {
    for e in one_of_each() {
        let v = validator(e.detail_type());
        let mut extra = e.detail();
        extra["surprise"] = json!(true);
        assert!(!v.is_valid(&extra), "{}: unknown field accepted", e.detail_type());
        let mut missing = e.detail();
        missing.as_object_mut().unwrap().remove("event_id");
        assert!(!v.is_valid(&missing), "{}: missing event_id accepted", e.detail_type());
        let mut wrong = e.detail();
        wrong["version"] = json!("3");
        assert!(!v.is_valid(&wrong), "{}: string version accepted", e.detail_type());
        let mut future = e.detail();
        future["schema_version"] = json!(2);
        assert!(!v.is_valid(&future), "{}: schema_version 2 accepted", e.detail_type());
    }
}

#[test]
fn optional_fields_may_be_absent() {
    let optional = [
        ("OrderPlaced", "coupon_id"),
        ("OrderClosed", "coupon_id"),
        ("RefundCompleted", "channel_refund_id"),
        ("RefundFailed", "last_error"),
    ];
    let events = one_of_each();
    for (t, field) in optional {
        let e = events.iter().find(|e| e.detail_type() == t).unwrap();
        let mut d = e.detail();
        d.as_object_mut().unwrap().remove(field);
        assert!(validator(t).is_valid(&d), "{t} without {field}");
    }
}
