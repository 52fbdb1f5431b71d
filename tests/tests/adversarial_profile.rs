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

fn repo_file(path: &str) -> String {
    let full = format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

/// The section of `infra/iam-actions.yaml` of one function (its lines up to
/// the next top-level key).
fn listed_calls(function: &str) -> String {
    let list = repo_file("infra/iam-actions.yaml");
    let start = list.find(&format!("\n{function}:\n")).unwrap_or_else(|| panic!("{function} not listed"));
    let rest = &list[start + 1..];
    let end = rest[1..].find("\n\n").map_or(rest.len(), |e| e + 1);
    rest[..end].to_owned()
}

/// `settle_success` puts a `ConditionCheck` on the order into its
/// transaction when the success is a duplicate or must be refunded (a late
/// payment on a CLOSED order, a second payment on a PAID one). DynamoDB
/// authorises a transaction's ConditionCheck as `dynamodb:ConditionCheckItem`:
/// without it, in a real account, every late-payment refund is AccessDenied
/// (the emulator does not enforce IAM, so no end-to-end test sees it). Every
/// function whose code reaches `settle_success` must be granted it
/// (`template_check.py roles` keeps the template equal to the list).
#[test]
fn every_function_that_settles_a_payment_may_run_the_condition_check_of_its_transaction() {
    assert!(
        repo_file("shared/src/aws/payments.rs").contains("ConditionCheck::builder()"),
        "settle_success no longer builds a ConditionCheck: revisit this test"
    );
    // The functions whose code reaches settle_success: the webhook (a
    // notification), close-order (a success found while closing), order-api
    // (supersede on a new attempt; the force-check's close), settle-order
    // (the order's other attempts) and the sweep (a re-driven settle).
    for function in
        ["PaymentWebhookFunction", "CloseOrderFunction", "OrderApiFunction", "SettleOrderFunction", "SweepFunction"]
    {
        let calls = listed_calls(function);
        assert!(
            calls.contains("dynamodb:ConditionCheckItem"),
            "{function} reaches settle_success but may not ConditionCheckItem:\n{calls}"
        );
    }
}
