//! The production profile's promises: events of a buyer with an OIDC
//! subject validate against their schemas, every function that settles a
//! payment may run its transaction's condition check, and a prod stack
//! refuses the emulator-only API id (no stack); OIDC subjects keep
//! idempotency keys and coupons per buyer (`ddb_…`, DynamoDB Local); and,
//! on the deployed local stack (`e2e_…`), a body of exactly the limit is
//! taken and one byte more is 413, a payment key replayed by another buyer
//! neither reaches nor returns the owner's attempt, and a price edit never
//! creates a SKU nor changes its counts.

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
    // (the order's other attempts) and drive-effects (a settle the sweep
    // handed on; the sweep itself no longer settles).
    for function in [
        "PaymentWebhookFunction",
        "CloseOrderFunction",
        "OrderApiFunction",
        "SettleOrderFunction",
        "DriveEffectsFunction",
    ] {
        let calls = listed_calls(function);
        assert!(
            calls.contains("dynamodb:ConditionCheckItem"),
            "{function} reaches settle_success but may not ConditionCheckItem:\n{calls}"
        );
    }
}

/// The 413 boundary, end to end: a valid order body of exactly the limit
/// is an order; one byte more is 413 and holds no stock. (Needs the local
/// stack: `.local/stack.env`.)
#[tokio::test]
async fn e2e_a_body_of_exactly_the_limit_is_taken_and_one_byte_more_is_413() {
    use order_core::handlers::api::MAX_BODY_BYTES;
    use system_tests::*;
    let api = Api::new();
    let buyer = unique("adv-limit");
    let sku = unique("adv-limit");
    api.put_stock(&sku, 5).await;
    let padded = |len: usize| {
        let body = order_body(&buyer, &sku, 1, None).to_string();
        // JSON whitespace before the closing brace: the same order, longer.
        let mut b = body[..body.len() - 1].to_owned();
        b.push_str(&" ".repeat(len - body.len()));
        b.push('}');
        assert_eq!(b.len(), len);
        b
    };
    let over = api
        .send_as(&buyer, "POST", "/orders", &[("Idempotency-Key", "k-over")], Some(&padded(MAX_BODY_BYTES + 1)))
        .await;
    assert_eq!((over.status, over.error_code()), (413, "payload_too_large"), "{over:?}");
    assert_eq!(api.stock(&sku).await["reserved"], 0, "a refused body holds nothing");
    let at =
        api.send_as(&buyer, "POST", "/orders", &[("Idempotency-Key", "k-at")], Some(&padded(MAX_BODY_BYTES))).await;
    assert_eq!(at.status, 201, "{at:?}");
    assert_eq!(api.stock(&sku).await["reserved"], 1);
}

/// Payment keys are per buyer: a stranger replaying the owner's key on the
/// owner's order is 404 and opens nothing; the same key on the stranger's
/// own order is a new attempt of that order, never the owner's.
#[tokio::test]
async fn e2e_a_payment_key_replayed_by_another_buyer_neither_reaches_nor_returns_the_owners_attempt() {
    use system_tests::*;
    let api = Api::new();
    let (owner, stranger) = (unique("adv-owner"), unique("adv-stranger"));
    let sku = unique("adv-paykey");
    api.put_stock(&sku, 5).await;
    let mine = api.create_order(&unique("k"), &order_body(&owner, &sku, 1, None)).await;
    let theirs = api.create_order(&unique("k"), &order_body(&stranger, &sku, 1, None)).await;
    let (mine, theirs) = (mine.body["order_id"].as_str().unwrap(), theirs.body["order_id"].as_str().unwrap());
    let key = unique("shared-key");
    let paid = api.start_payment_with_key(mine, &key).await;
    assert_eq!(paid.status, 201, "{paid:?}");
    let body = Some(r#"{"channel":"sandbox"}"#);
    let hijack =
        api.send_as(&stranger, "POST", &format!("/orders/{mine}/payments"), &[("Idempotency-Key", &key)], body).await;
    assert_eq!(hijack.status, 404, "{hijack:?}");
    let own =
        api.send_as(&stranger, "POST", &format!("/orders/{theirs}/payments"), &[("Idempotency-Key", &key)], body).await;
    assert_eq!(own.status, 201, "{own:?}");
    assert_eq!(own.body["order_id"], theirs);
    assert_ne!(own.body["payment_id"], paid.body["payment_id"]);
    assert_eq!(api.admin_order(mine).await.body["payment_attempts"], 1);
}

/// A price edit on a SKU that does not exist creates nothing; a price
/// change racing stock adjustments leaves the counts exactly as the
/// adjustments make them.
#[tokio::test]
async fn e2e_a_price_edit_never_creates_a_sku_nor_changes_its_counts() {
    use system_tests::*;
    let api = Api::new();
    let ghost = unique("adv-ghost");
    let put = |sku: String, body: Value| {
        let api = &api;
        async move { api.send("PUT", &format!("/admin/skus/{sku}"), &[], Some(&body.to_string()), true).await }
    };
    let r = put(ghost.clone(), json!({"price": 100, "currency": "EUR"})).await;
    assert_eq!(r.status, 404, "{r:?}");
    let g = api.send("GET", &format!("/admin/skus/{ghost}"), &[], None, true).await;
    assert_eq!(g.status, 404, "a price edit created the sku: {g:?}");

    let sku = unique("adv-race");
    api.put_stock(&sku, 100).await;
    let mut calls = Vec::new();
    for i in 0..10 {
        calls.push(put(sku.clone(), json!({"adjust": 1})));
        calls.push(put(sku.clone(), json!({"price": 1000 + i, "currency": "EUR"})));
    }
    for r in futures::future::join_all(calls).await {
        assert_eq!(r.status, 200, "{r:?}");
    }
    let s = api.stock(&sku).await;
    assert_eq!(
        (s["available"].as_i64(), s["reserved"].as_i64(), s["sold"].as_i64()),
        (Some(110), Some(0), Some(0)),
        "{s}"
    );
}

/// `LocalApiId` is an emulator-only switch, and setting it silently drops
/// production protections (the SQS mappings' MaximumConcurrency, which
/// keeps a create flood from starving close and settle, and the event
/// archive). A prod stack must refuse it like the other test switches.
#[test]
fn a_prod_stack_refuses_the_emulator_only_api_id() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = r#"
import sys
sys.path.insert(0, "infra")
from check_profile import refusing_rules
from template_check import load
print(",".join(refusing_rules(load(), {"Stage": "prod", "LocalApiId": "abc123"})))
"#;
    let out = std::process::Command::new(root.join(".venv/bin/python"))
        .args(["-c", script])
        .current_dir(&root)
        .output()
        .expect("the tools venv (infra/tools.sh)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let refused = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(!refused.is_empty(), "a prod stack with LocalApiId set deploys (no rule refuses it)");
}

/// OIDC subjects with `|` and `@` through the create transaction on
/// DynamoDB Local: the idempotency key stays per buyer (a look-alike
/// subject's same key is a new order, not a replay of another's), a coupon
/// is lockable only by the exact subject it was issued to, and a refused
/// create writes nothing. (Needs DYNAMODB_LOCAL_ENDPOINT.)
#[tokio::test]
async fn ddb_oidc_subjects_keep_keys_and_coupons_per_buyer() {
    use order_core::domain::*;
    use order_core::handlers::requests::create_order;
    use order_core::store::{OrderStore, PutCoupon};
    use order_core::usecases::create_order::CreateOrder;
    use system_tests::fakes::FixedClock;
    use system_tests::fixtures::{available_coupon, eur};
    use system_tests::{dynamodb_local, fresh_table};
    const T0: i64 = 1_800_000_000_000;
    let store = fresh_table(&dynamodb_local().await).await;
    let clock = FixedClock::at(T0);
    let uc = CreateOrder {
        store: store.clone(),
        clock: Box::new(clock.clone()),
        ids: Box::new(order_core::ports::RandomIds),
        window: std::time::Duration::from_secs(1800),
        expiry_rule_version: "w".into(),
        open_order_cap: None,
    };
    let sku = Sku::parse("A").unwrap();
    system_tests::fixtures::seed_stock(&store, &sku, 10, &eur(250)).await.unwrap();
    let jo = UserId::parse("auth0|jo@example.com").unwrap();
    let look_alike = UserId::parse("auth0|jo").unwrap();
    let c = available_coupon("C1", jo.as_str(), Timestamp::from_unix_millis(T0 + 86_400_000));
    assert_eq!(store.put_coupon(&c).await.unwrap(), PutCoupon::Stored);
    let count = || async { store.client().scan().table_name(store.table()).send().await.unwrap().count as usize };

    let with_coupon = json!({"currency": "EUR", "items": [{"sku": "A", "qty": 1}], "coupon_id": "C1"}).to_string();
    let before = count().await;
    let stolen = create_order(&uc, &look_alike, Some("k1"), with_coupon.as_bytes()).await;
    assert!(stolen.is_err(), "a look-alike subject locked another buyer's coupon: {stolen:?}");
    assert_eq!(count().await, before, "a refused create wrote something");

    let mine = create_order(&uc, &jo, Some("k1"), with_coupon.as_bytes()).await.unwrap();
    assert!(!mine.replayed);
    assert_eq!(mine.order.user_id, jo);
    let again = create_order(&uc, &jo, Some("k1"), with_coupon.as_bytes()).await.unwrap();
    assert!(again.replayed && again.order.order_id == mine.order.order_id);
    let plain = json!({"currency": "EUR", "items": [{"sku": "A", "qty": 1}]}).to_string();
    let theirs = create_order(&uc, &look_alike, Some("k1"), plain.as_bytes()).await.unwrap();
    assert!(!theirs.replayed, "the look-alike's key replayed another buyer's order");
    assert_ne!(theirs.order.order_id, mine.order.order_id);
    let coupon = store.coupon(&CouponId::parse("C1").unwrap()).await.unwrap().unwrap();
    assert_eq!(coupon.locked_by.as_ref(), Some(&mine.order.order_id));
    let s = store.stock(&sku).await.unwrap().unwrap();
    assert_eq!((s.available, s.reserved), (8, 2));
}
