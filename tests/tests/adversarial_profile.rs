//! Adversarial checks of the production profile (issue 8): buyer identity,
//! catalog prices, body limits and the published contracts around them.

use order_core::domain::events::examples::one_of_each;
use serde_json::{json, Value};

fn schema_of(detail_type: &str) -> Value {
    let path = format!("{}/../events/schemas/{detail_type}.schema.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// User ids now take OIDC subjects (`auth0|5f…`, `x@y`): every event that
/// carries a `user_id` must still validate against its published schema,
/// or a consumer that validates drops the events of those buyers.
#[test]
fn events_of_a_buyer_with_an_oidc_subject_validate_against_their_schemas() {
    for subject in ["auth0|5f1c2e", "google-oauth2|1093", "samlp|acme|jo@example.com"] {
        for e in one_of_each() {
            let mut detail = e.detail();
            if detail.get("user_id").is_none() {
                continue;
            }
            detail["user_id"] = json!(subject);
            let v = jsonschema::draft202012::new(&schema_of(e.detail_type())).unwrap();
            let errors: Vec<String> = v.iter_errors(&detail).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{} with user_id {subject}: {errors:?}", e.detail_type());
        }
    }
}
