//! `docs/openapi.yaml` against what is deployed and what the handlers do.
//!
//! - The routes: the description names exactly the routes the template
//!   deploys (method, path, auth), for the dev and the prod parameter sets
//!   (the SAM-translated template of `infra/template_check.py translate`;
//!   the sandbox route, `x-dev-only`, only in dev). Needs `.venv`.
//! - The examples, offline: each request example validates against its
//!   request schema, each response example against its response's schema.
//! - The error codes: the description names every code the functions can
//!   answer (read from `shared/src`), and none they cannot.
//! - The examples, on the deployed local stack (`e2e_…`): each request
//!   example is sent (with real ids in place of the example ones) and gets
//!   the status of the response example of the same name (200/201 when the
//!   operation takes no body), with a body that validates against that
//!   status's documented schema.
//!
//! YAML is read through the repo's Python (`.venv`, PyYAML), as the other
//! template tests do, rather than with one more Rust dependency.

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use system_tests::{stack_env, unique, webhook_secret, Api, Reply};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python(args: &[&str]) -> String {
    let py = repo().join(".venv/bin/python");
    let out = std::process::Command::new(&py)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("running {} (infra/tools.sh creates it): {e}", py.display()));
    assert!(out.status.success(), "python {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The description as JSON. A YAML timestamp that is not quoted would
/// come back as a date object and fail the conversion: on the wire every
/// time is a string, so the examples must say so.
fn description() -> Value {
    let text = python(&[
        "-c",
        "import json, sys, yaml; json.dump(yaml.load(open(sys.argv[1]), getattr(yaml, 'CSafeLoader', yaml.SafeLoader)), sys.stdout)",
        "docs/openapi.yaml",
    ]);
    serde_json::from_str(&text).expect("docs/openapi.yaml as JSON")
}

/// (method, path, auth) with auth `NONE`, `JWT` or `AWS_IAM`, as API
/// Gateway names it.
type Route = (String, String, String);

fn template_routes(stage: &str) -> BTreeSet<Route> {
    let out = std::env::temp_dir().join(format!("openapi-template-{stage}-{:x}.json", rand::random::<u64>()));
    python(&["infra/template_check.py", "translate", stage, out.to_str().unwrap()]);
    let template: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out);
    let resources = template["Resources"].as_object().expect("Resources");
    for (name, r) in resources {
        // Routes declared inside an API's own OpenAPI body (SAM `HttpApi`
        // events do that) would escape the scan below.
        if r["Type"] == "AWS::ApiGatewayV2::Api" {
            let p = &r["Properties"];
            assert!(p.get("Body").is_none() && p.get("BodyS3Location").is_none(), "{name} defines routes in a body");
        }
    }
    resources
        .values()
        .filter(|r| r["Type"] == "AWS::ApiGatewayV2::Route")
        .map(|r| {
            let p = &r["Properties"];
            let key = p["RouteKey"].as_str().expect("RouteKey");
            let (method, path) = key.split_once(' ').expect("METHOD /path");
            let auth = p["AuthorizationType"].as_str().unwrap_or("NONE");
            (method.to_owned(), path.to_owned(), auth.to_owned())
        })
        .collect()
}

const METHODS: [&str; 8] = ["get", "put", "post", "delete", "patch", "head", "options", "trace"];

/// Every operation of the description: (method, path, operation).
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().unwrap() {
            if METHODS.contains(&method.as_str()) {
                out.push((method.to_uppercase(), path.clone(), op.clone()));
            }
        }
    }
    out
}

/// The auth an operation declares, in API Gateway's names.
fn auth_of(doc: &Value, op: &Value) -> String {
    let security = op.get("security").unwrap_or(&doc["security"]);
    let schemes: Vec<&str> = security
        .as_array()
        .expect("security is a list")
        .iter()
        .flat_map(|req| req.as_object().unwrap().keys().map(String::as_str))
        .collect();
    match schemes.as_slice() {
        [] => "NONE".into(),
        ["buyerJwt"] => "JWT".into(),
        ["adminIam"] => "AWS_IAM".into(),
        other => panic!("{} uses security {other:?}, which no route deploys", op["operationId"]),
    }
}

fn documented_routes(doc: &Value, stage: &str) -> BTreeSet<Route> {
    operations(doc)
        .into_iter()
        .filter(|(_, _, op)| stage == "dev" || op.get("x-dev-only") != Some(&json!(true)))
        .map(|(method, path, op)| (method, path, auth_of(doc, &op)))
        .collect()
}

/// What one side has and the other has not, as readable lines.
fn route_differences(deployed: &BTreeSet<Route>, documented: &BTreeSet<Route>) -> Vec<String> {
    let show = |(m, p, a): &Route| format!("{m} {p} ({a})");
    let mut out: Vec<String> =
        deployed.difference(documented).map(|r| format!("deployed, not documented: {}", show(r))).collect();
    out.extend(documented.difference(deployed).map(|r| format!("documented, not deployed: {}", show(r))));
    out
}

#[test]
fn the_description_names_exactly_the_routes_the_template_deploys() {
    let doc = description();
    for stage in ["dev", "prod"] {
        let deployed = template_routes(stage);
        assert!(deployed.len() >= 10, "{stage}: the scan found only {deployed:?}");
        let diff = route_differences(&deployed, &documented_routes(&doc, stage));
        assert!(diff.is_empty(), "{stage} stack vs docs/openapi.yaml:\n{}", diff.join("\n"));
    }
}

#[test]
fn a_route_on_one_side_only_or_with_another_auth_is_reported() {
    let doc = description();
    let documented = documented_routes(&doc, "dev");
    let mut deployed = documented.clone();
    deployed.insert(("DELETE".into(), "/orders/{order_id}".into(), "JWT".into()));
    assert_eq!(
        route_differences(&deployed, &documented),
        ["deployed, not documented: DELETE /orders/{order_id} (JWT)"]
    );
    let mut fewer = doc.clone();
    fewer["paths"].as_object_mut().unwrap().remove("/admin/skus/{sku}");
    assert_eq!(route_differences(&documented, &documented_routes(&fewer, "dev")).len(), 2, "PUT and GET of the SKU");
    let mut open = doc.clone();
    open["paths"]["/admin/coupons/{coupon_id}"]["get"]["security"] = json!([]);
    let diff = route_differences(&documented, &documented_routes(&open, "dev"));
    assert_eq!(diff.len(), 2, "the IAM route missing, an unauthenticated one extra: {diff:?}");
}

// ------------------------------------------------------------- schemas

/// Follows a local `$ref` (`#/components/...`) once.
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => doc.pointer(r.trim_start_matches('#')).unwrap_or_else(|| panic!("dangling $ref {r}")),
        None => v,
    }
}

/// A validator for a schema of the description; its `$ref`s resolve
/// against the description's components. Formats (date-time) are checked.
fn validator(doc: &Value, schema: &Value) -> jsonschema::Validator {
    let root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": doc["components"],
        "allOf": [schema],
    });
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .build(&root)
        .unwrap_or_else(|e| panic!("schema does not compile: {e}\n{schema}"))
}

fn schema_errors(doc: &Value, schema: &Value, instance: &Value) -> Vec<String> {
    validator(doc, schema).iter_errors(instance).map(|e| format!("{e} at {}", e.instance_path)).collect()
}

/// The JSON media type of a request body or response, `$ref` resolved.
fn json_content<'a>(doc: &'a Value, v: &'a Value) -> Option<&'a Value> {
    resolve(doc, v).get("content").and_then(|c| c.get("application/json"))
}

/// (operation id, status, response) for every documented response.
fn responses(doc: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (_, _, op) in operations(doc) {
        let id = op["operationId"].as_str().expect("operationId").to_owned();
        for (status, r) in op["responses"].as_object().expect("responses") {
            out.push((id.clone(), status.clone(), resolve(doc, r).clone()));
        }
    }
    out
}

#[test]
fn every_example_validates_against_its_own_schema() {
    let doc = description();
    let mut checked = 0;
    let mut failures = Vec::new();
    for (_, _, op) in operations(&doc) {
        let id = op["operationId"].as_str().unwrap().to_owned();
        if let Some(body) = op.get("requestBody").and_then(|b| json_content(&doc, b)) {
            for (name, ex) in body["examples"].as_object().into_iter().flatten() {
                checked += 1;
                let errors = schema_errors(&doc, &body["schema"], &ex["value"]);
                // An example of a malformed request (answered 400) may
                // break the schema: that is what makes it malformed. Every
                // other request is well-formed and must match it.
                match (expected_status(&doc, &op, name).as_str(), errors.is_empty()) {
                    ("400", _) | (_, true) => {}
                    (_, false) => failures.extend(errors.iter().map(|e| format!("{id} request example {name}: {e}"))),
                }
            }
        }
    }
    for (id, status, r) in responses(&doc) {
        let Some(content) = json_content(&doc, &r) else { continue };
        for (name, ex) in content["examples"].as_object().into_iter().flatten() {
            checked += 1;
            for e in schema_errors(&doc, &content["schema"], &ex["value"]) {
                failures.push(format!("{id} {status} example {name}: {e}"));
            }
        }
    }
    assert!(checked > 40, "only {checked} examples found");
    assert!(failures.is_empty(), "examples that do not match their schema:\n{}", failures.join("\n"));
}

#[test]
fn a_response_that_breaks_its_schema_is_caught() {
    // The schemas are strict enough to fail: a wrong error code, a time
    // without its zone, money as a string, a field the handler never sends.
    let doc = description();
    let created = doc.pointer("/components/schemas/CreatedOrder").unwrap();
    let good = json!({"order_id": "ord_1", "status": "PENDING_PAYMENT", "expire_at": "2026-11-30T10:45:00.000Z",
                      "amount_total": 2598, "currency": "EUR", "items": [{"sku": "A", "qty": 1, "unit_price": 2598}]});
    assert!(schema_errors(&doc, created, &good).is_empty());
    for (field, bad) in [
        ("expire_at", json!("2026-11-30T10:45:00")),
        ("amount_total", json!("25.98")),
        ("status", json!("EXPIRED")),
        ("extra", json!(1)),
    ] {
        let mut v = good.clone();
        v[field] = bad;
        assert!(!schema_errors(&doc, created, &v).is_empty(), "{field} = {} passed", v[field]);
    }
    let (_, _, conflict) =
        responses(&doc).into_iter().find(|(id, s, _)| id == "createOrder" && s == "409").expect("createOrder 409");
    let schema = &json_content(&doc, &conflict).unwrap()["schema"];
    assert!(schema_errors(&doc, schema, &json!({"error": {"code": "out_of_stock", "message": "m"}})).is_empty());
    assert!(!schema_errors(&doc, schema, &json!({"error": {"code": "stock_exists", "message": "m"}})).is_empty());
}

/// Every error code the functions can answer, read from the code: the
/// codes handed to `ApiError::{conflict, unauthorized, unprocessable}`
/// anywhere in `shared/src`, and those `error.rs` fixes itself.
fn codes_in_source() -> BTreeSet<String> {
    fn walk(dir: &std::path::Path, out: &mut Vec<(PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push((path.clone(), std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let mut files = Vec::new();
    walk(&repo().join("shared/src"), &mut files);
    let mut codes = BTreeSet::new();
    for (path, text) in files {
        let mut openers = vec!["conflict(", "unauthorized(", "forbidden(", "unprocessable(", "try_later("];
        if path.ends_with("error.rs") {
            openers.extend(["code: ", "=> "]);
        }
        for opener in openers {
            for (at, _) in text.match_indices(opener) {
                let rest = text[at + opener.len()..].trim_start();
                let Some(quoted) = rest.strip_prefix('"') else { continue };
                let code = &quoted[..quoted.find('"').unwrap()];
                if !code.is_empty() && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                    codes.insert(code.to_owned());
                }
            }
        }
    }
    codes
}

/// Every error code the description names (`code` with `const` or `enum`).
fn codes_in_description(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(o) => {
            if let Some(code) = o.get("code") {
                let named = code.get("enum").and_then(Value::as_array).cloned().unwrap_or_default();
                out.extend(named.iter().chain(code.get("const")).filter_map(Value::as_str).map(str::to_owned));
            }
            o.values().for_each(|x| codes_in_description(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| codes_in_description(x, out)),
        _ => {}
    }
}

#[test]
fn the_description_names_every_error_code_the_code_answers_and_no_other() {
    let in_source = codes_in_source();
    assert!(in_source.len() >= 20 && in_source.contains("out_of_stock"), "the scan found only {in_source:?}");
    let mut documented = BTreeSet::new();
    codes_in_description(&description(), &mut documented);
    let undocumented: Vec<_> = in_source.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&in_source).collect();
    assert!(
        undocumented.is_empty(),
        "error codes the functions answer but docs/openapi.yaml does not name: {undocumented:?}"
    );
    assert!(stale.is_empty(), "error codes docs/openapi.yaml names but no function answers: {stale:?}");
}

// ------------------------------------------------------- on the stack

/// The example identifiers of the description, each standing for a real
/// one the scenario creates (matched on whole string values).
const DOC_SKU: &str = "MUG-BLUE-350";
const DOC_COUPON: &str = "WELCOME10-7F3K";
const DOC_ORDER: &str = "ord_1kq2v7h3m9x4tz8y6w2p5r3n7m";
const DOC_PAYMENT: &str = "pay_1kq2v7j0x4tz8y6w2p5r3n7m9";
const DOC_USER: &str = "c8dfe06d-be99-4271-8a15-7dcf2037dd08";
const DOC_TXN: &str = "txn-5f7d2c";
const DOC_NOTIFY_IDS: [&str; 2] = ["n-5f7d2c-1", "n-5f7d2c-2"];
const DOC_MERCHANT: &str = "merchant-local";

fn replace_strings(v: &mut Value, map: &BTreeMap<String, String>) {
    match v {
        Value::String(s) => {
            if let Some(real) = map.get(s.as_str()) {
                *s = real.clone();
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| replace_strings(x, map)),
        Value::Object(o) => o.values_mut().for_each(|x| replace_strings(x, map)),
        _ => {}
    }
}

struct Scenario {
    doc: Value,
    api: Api,
    buyer: String,
    /// Example value → real value, for the step being sent.
    ids: BTreeMap<String, String>,
    /// (operation, example) pairs sent so far.
    sent: BTreeSet<(String, String)>,
}

impl Scenario {
    fn operation(&self, id: &str) -> (String, String, Value) {
        operations(&self.doc).into_iter().find(|(_, _, op)| op["operationId"] == id).unwrap_or_else(|| panic!("{id}"))
    }

    fn bind(&mut self, example: &str, real: &str) {
        self.ids.insert(example.to_owned(), real.to_owned());
    }

    /// Sends `example` of operation `id` (or, for an operation without a
    /// body, the request its path-parameter examples make) and checks the
    /// answer against the description.
    async fn send(&mut self, id: &str, example: Option<&str>) -> Reply {
        let doc = self.doc.clone();
        let (method, path_template, op) = self.operation(id);
        let mut path = path_template.clone();
        let mut headers: Vec<(String, String)> = Vec::new();
        for p in op["parameters"].as_array().into_iter().flatten() {
            let p = resolve(&doc, p);
            let name = p["name"].as_str().unwrap();
            match p["in"].as_str() {
                Some("path") => {
                    let mut v = p["example"].clone();
                    replace_strings(&mut v, &self.ids);
                    path = path.replace(&format!("{{{name}}}"), v.as_str().expect("a string path example"));
                }
                // Query parameters are optional filters: the example request
                // is the unfiltered one (e2e_my_orders.rs sends them).
                Some("query") => assert_ne!(p["required"], json!(true), "{id}: required query parameter {name}"),
                Some("header") if name == "Idempotency-Key" => headers.push((name.into(), unique("openapi"))),
                Some("header") if name == "X-Signature" => {} // signed below, over the body sent
                // The Stripe channel's header: the examples are the
                // sandbox's notifications (Stripe's events: e2e_stripe.rs).
                Some("header") if name == "Stripe-Signature" => {}
                other => panic!("{id}: parameter {name} in {other:?} is not handled by this test"),
            }
        }
        let body = example.map(|name| {
            let content = json_content(&doc, &op["requestBody"]).unwrap_or_else(|| panic!("{id} takes no body"));
            let mut v = content["examples"][name]["value"].clone();
            assert!(!v.is_null(), "{id} has no request example {name}");
            replace_strings(&mut v, &self.ids);
            self.sent.insert((id.to_owned(), name.to_owned()));
            v.to_string()
        });
        if op.get("requestBody").is_none() {
            self.sent.insert((id.to_owned(), String::new()));
        }
        let expected = match example {
            Some(name) => expected_status(&doc, &op, name),
            None => ["200", "201"].into_iter().find(|s| op["responses"].get(*s).is_some()).unwrap().to_owned(),
        };
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let reply = match auth_of(&doc, &op).as_str() {
            "JWT" => self.api.send_as(&self.buyer.clone(), &method, &path, &h, body.as_deref()).await,
            "AWS_IAM" => self.api.send(&method, &path, &h, body.as_deref(), true).await,
            _ => {
                let raw = body.clone().unwrap_or_default();
                let now = time::OffsetDateTime::now_utc().unix_timestamp();
                let sig = order_core::signature::sign(webhook_secret().as_bytes(), now, raw.as_bytes());
                let mut h = h.clone();
                h.push(("X-Signature", &sig));
                self.api.send(&method, &path, &h, body.as_deref(), false).await
            }
        };
        let what = format!("{method} {path} ({id}, example {example:?})");
        assert_eq!(reply.status.to_string(), expected, "{what}: {reply:?}");
        let response = resolve(&doc, &op["responses"][&expected]);
        let schema = &json_content(&doc, response).unwrap_or_else(|| panic!("{id} {expected} has no JSON"))["schema"];
        let errors = schema_errors(&doc, schema, &reply.body);
        assert!(
            errors.is_empty(),
            "{what}: the answer does not match the documented schema: {errors:?}\n{}",
            reply.body
        );
        reply
    }
}

/// The status whose response examples hold one named `example`.
fn expected_status(doc: &Value, op: &Value, example: &str) -> String {
    let statuses: Vec<String> = op["responses"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, r)| json_content(doc, r).and_then(|c| c["examples"].get(example)).is_some())
        .map(|(s, _)| s.clone())
        .collect();
    match statuses.as_slice() {
        [one] => one.clone(),
        other => panic!("{}: request example {example} pairs with responses {other:?}, not one", op["operationId"]),
    }
}

fn request_examples(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (_, _, op) in operations(doc) {
        let id = op["operationId"].as_str().unwrap().to_owned();
        match op.get("requestBody").and_then(|b| json_content(doc, b)) {
            Some(c) => out.extend(c["examples"].as_object().unwrap().keys().map(|k| (id.clone(), k.clone()))),
            None => {
                out.insert((id, String::new()));
            }
        }
    }
    out
}

#[tokio::test]
async fn e2e_every_request_example_gets_its_documented_answer() {
    let doc = description();
    let text = serde_json::to_string(&doc).unwrap();
    for id in [DOC_SKU, DOC_COUPON, DOC_ORDER, DOC_PAYMENT, DOC_USER, DOC_TXN, DOC_MERCHANT] {
        assert!(text.contains(id), "the description no longer uses the example id {id}");
    }
    let api = Api::new();
    let buyer = "openapi-buyer".to_owned();
    let user_id = api.user_id(&buyer).await;
    let mut s = Scenario { doc, api, buyer, ids: BTreeMap::new(), sent: BTreeSet::new() };
    s.bind(DOC_SKU, &unique("openapi-sku"));
    s.bind(DOC_COUPON, &unique("openapi-coupon"));
    s.bind(DOC_USER, &user_id);
    s.bind(DOC_TXN, &unique("txn"));
    s.bind(DOC_MERCHANT, &stack_env("MERCHANT_ID"));
    for n in DOC_NOTIFY_IDS {
        s.bind(n, &unique("ntf"));
    }

    // The catalog and a coupon, as an operator.
    s.send("adminPutSku", Some("seed")).await;
    s.send("adminPutSku", Some("seed_again")).await;
    s.send("adminPutSku", Some("restock_if_unchanged")).await;
    s.send("adminPutSku", Some("adjust")).await;
    s.send("adminGetSku", None).await;
    s.send("adminPutCoupon", Some("issue")).await;
    s.send("adminGetCoupon", None).await;

    // The refusals write nothing.
    s.send("createOrder", Some("stale_price")).await;
    s.send("createOrder", Some("bad_quantity")).await;

    // Each order is paid right after it is created: the test stack's
    // payment window is 20 s, and a loaded machine must not turn a step
    // into `order_expired`.
    // A: paid through the sandbox, which notifies the webhook itself.
    let a = s.send("createOrder", Some("one_line")).await.body["order_id"].as_str().unwrap().to_owned();
    s.bind(DOC_ORDER, &a);
    s.send("getOrder", None).await;
    let pa = s.send("startPayment", Some("sandbox")).await.body["payment_id"].as_str().unwrap().to_owned();
    s.bind(DOC_PAYMENT, &pa);
    let settled = s.send("sandboxSettle", Some("succeed_and_notify")).await;
    assert_eq!(settled.body["webhook_response"], json!({"result": "paid"}), "{settled:?}");
    s.send("startPayment", Some("unknown_channel")).await; // the channel is checked before the order
    s.send("adminGetOrder", None).await;

    // B: paid by a notification as the provider sends it.
    let b = s.send("createOrder", Some("with_coupon")).await.body["order_id"].as_str().unwrap().to_owned();
    s.bind(DOC_ORDER, &b);
    let pb = s.send("startPayment", Some("sandbox")).await.body["payment_id"].as_str().unwrap().to_owned();
    s.bind(DOC_PAYMENT, &pb);
    s.send("paymentNotification", Some("succeeded")).await;
    s.send("paymentNotification", Some("amount_mismatch")).await;
    let check = s.send("adminCheckOrder", None).await;
    assert_eq!(check.body["outcome"], "already_final", "{check:?}");

    // C: cancelled by its buyer before anyone paid.
    let c = s.send("createOrder", Some("one_line")).await.body["order_id"].as_str().unwrap().to_owned();
    s.bind(DOC_ORDER, &c);
    let cancelled = s.send("cancelOrder", None).await;
    assert_eq!(cancelled.body["close_reason"], "BUYER_CANCELLED", "{cancelled:?}");

    // The buyer's orders: C, B and A, newest first (after them, any this
    // buyer made on the same stack before).
    let list = s.send("listOrders", None).await;
    let ids: Vec<&str> =
        list.body["orders"].as_array().unwrap().iter().map(|o| o["order_id"].as_str().unwrap()).collect();
    assert_eq!(ids.get(..3), Some(&[c.as_str(), b.as_str(), a.as_str()][..]), "{list:?}");

    // D: the buyer's points, spent by an order, and a SKU's purchase limit.
    s.send("adminCreditPoints", Some("welcome")).await;
    s.send("adminCreditPoints", Some("zero")).await;
    s.send("adminGetPoints", None).await;
    let d = s.send("createOrder", Some("with_points")).await;
    assert_eq!(d.body["points"], 500, "{d:?}");
    s.send("adminPutSku", Some("limit")).await;
    s.send("createOrder", Some("over_the_limit")).await;

    s.send("adminPutSku", Some("reprice")).await;
    s.send("adminPutSku", Some("classify")).await;

    // Last: the rules apply to new orders of the example SKU only, and
    // this scenario makes no more orders.
    s.send("adminPublishExpiryRules", Some("unknown_target")).await;
    let published = s.send("adminPublishExpiryRules", Some("per_sku")).await;
    s.send("adminGetExpiryRules", None).await;
    s.send("adminGetExpiryRulesVersion", None).await;
    assert!(published.body["version"].as_u64().is_some_and(|v| v >= 1), "{published:?}");

    let missing: Vec<_> = request_examples(&s.doc).difference(&s.sent).cloned().collect();
    assert!(missing.is_empty(), "request examples this scenario does not send (add them to it): {missing:?}");
}
