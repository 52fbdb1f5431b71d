//! Helpers for the integration and end-to-end tests: clients for DynamoDB
//! Local and for the deployed local stack, SigV4 signing for IAM routes,
//! Lambda invocation, and polling.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection, ProjectionType,
    ScalarAttributeType, StreamSpecification, StreamViewType,
};
use order_core::aws::dynamo::DynamoStore;
use order_core::domain::UserId;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const REGION: &str = "us-east-1";

fn require(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run the tests through infra/test.sh, which starts the emulators and deploys the stack"
        )
    })
}

/// `.local/stack.env` as `infra/local.sh up` wrote it (empty when there is
/// none), read once per process.
fn stack_file() -> &'static HashMap<String, String> {
    static FILE: OnceLock<HashMap<String, String>> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.local/stack.env");
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().trim_matches('"').to_owned()))
            .collect()
    })
}

/// Stack outputs written by `infra/local.sh up` (`.local/stack.env`), with
/// the process environment taking precedence: an output (an endpoint, a
/// queue URL) may be pointed at another stack by exporting it. A setting
/// the stack was deployed with is read the other way round
/// ([`deployed_setting`]): the file is the deploy's own record of it. Under
/// `infra/test.sh` both agree (it exports the file it wrote).
pub fn stack_env(name: &str) -> String {
    if let Ok(v) = std::env::var(name) {
        return v;
    }
    stack_file().get(name).cloned().unwrap_or_else(|| require(name))
}

/// A setting the local stack was deployed with (`PAYMENT_WINDOW_SECONDS`,
/// `MAX_OPEN_ORDERS_PER_BUYER`, `SWEEP_GRACE_SECONDS`, …): the value
/// `infra/local.sh up` deployed and wrote to `.local/stack.env`. The file
/// comes first, since it is the deploy's own record (a variable left in
/// the shell may be another run's); the environment is read only when the
/// file does not name the setting (a stack deployed some other way, its
/// settings exported by hand). Never a default: a test that guessed the
/// window or the cap would wait for the wrong time or count to the wrong
/// number, so an unknown setting fails the test saying what to do.
pub fn deployed_setting(name: &str) -> String {
    if let Some(v) = stack_file().get(name) {
        return v.clone();
    }
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name}: the deployed stack's setting is unknown: .local/stack.env does not name it and it is not in \
             the environment. Deploy the local stack with infra/local.sh up (it writes the settings it deployed \
             with to .local/stack.env), or run the tests through infra/test.sh"
        )
    })
}

/// [`deployed_setting`] as a number.
pub fn deployed_number<T: std::str::FromStr>(name: &str) -> T {
    let v = deployed_setting(name);
    v.parse().unwrap_or_else(|_| panic!("{name}={v:?} (the deployed stack's setting) is not a number"))
}

async fn sdk_config(endpoint: &str) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(order_core::aws::http_client())
        .region(aws_config::Region::new(REGION))
        .endpoint_url(endpoint)
        .credentials_provider(aws_credential_types::Credentials::new("test", "test", None, None, "tests"))
        .load()
        .await
}

/// A DynamoDB client on DynamoDB Local — AWS's own engine.
pub async fn dynamodb_local() -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&sdk_config(&require("DYNAMODB_LOCAL_ENDPOINT")).await)
}

/// The emulator endpoint of the deployed local stack.
pub fn stack_endpoint() -> String {
    std::env::var("AWS_ENDPOINT_URL").unwrap_or_else(|_| "http://127.0.0.1:4566".into())
}

pub async fn stack_config() -> aws_config::SdkConfig {
    sdk_config(&stack_endpoint()).await
}

/// A fresh table with the production schema (keys, due, reconcile and
/// buyer indexes, stream) and
/// a unique name, so that tests never see each other's data.
pub async fn fresh_table(client: &aws_sdk_dynamodb::Client) -> DynamoStore {
    let name = format!("orders-test-{}", rand::random::<u64>());
    let s = |n: &str| {
        AttributeDefinition::builder().attribute_name(n).attribute_type(ScalarAttributeType::S).build().unwrap()
    };
    let k = |n: &str, t| KeySchemaElement::builder().attribute_name(n).key_type(t).build().unwrap();
    client
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(s("pk"))
        .attribute_definitions(s("sk"))
        .attribute_definitions(s("due_shard"))
        .attribute_definitions(s("due_at"))
        .attribute_definitions(s("recon_part"))
        .attribute_definitions(s("recon_at"))
        .attribute_definitions(s("user_id"))
        .attribute_definitions(s("created_at"))
        .key_schema(k("pk", KeyType::Hash))
        .key_schema(k("sk", KeyType::Range))
        .global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name("due-index")
                .key_schema(k("due_shard", KeyType::Hash))
                .key_schema(k("due_at", KeyType::Range))
                .projection(Projection::builder().projection_type(ProjectionType::KeysOnly).build())
                .build()
                .unwrap(),
        )
        .global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name("reconcile-index")
                .key_schema(k("recon_part", KeyType::Hash))
                .key_schema(k("recon_at", KeyType::Range))
                .projection(Projection::builder().projection_type(ProjectionType::KeysOnly).build())
                .build()
                .unwrap(),
        )
        .global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name("buyer-index")
                .key_schema(k("user_id", KeyType::Hash))
                .key_schema(k("created_at", KeyType::Range))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::Include)
                        .set_non_key_attributes(Some(
                            [
                                "entity",
                                "order_id",
                                "status",
                                "expire_at",
                                "amount_total",
                                "currency",
                                "cancel_requested_at",
                            ]
                            .map(String::from)
                            .to_vec(),
                        ))
                        .build(),
                )
                .build()
                .unwrap(),
        )
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewAndOldImages)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .expect("create test table on DynamoDB Local");
    DynamoStore::new(client.clone(), name)
}

/// A fresh sandbox ledger (the template's `SandboxLedgerTable` schema:
/// `payment_id` keyed) with a unique name, and the real sandbox adapter on it.
pub async fn fresh_sandbox_ledger(client: &aws_sdk_dynamodb::Client) -> order_core::aws::sandbox::SandboxChannel {
    order_core::aws::sandbox::SandboxChannel::new(client.clone(), fresh_sandbox_ledger_table(client).await)
}

/// The table of [`fresh_sandbox_ledger`], by name (for a channel built from
/// the environment, `SANDBOX_LEDGER_TABLE`).
pub async fn fresh_sandbox_ledger_table(client: &aws_sdk_dynamodb::Client) -> String {
    let name = format!("sandbox-ledger-test-{}", rand::random::<u64>());
    client
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("payment_id")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(KeySchemaElement::builder().attribute_name("payment_id").key_type(KeyType::Hash).build().unwrap())
        .send()
        .await
        .expect("create the sandbox ledger on DynamoDB Local");
    name
}

/// Polls `f` until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// An HTTP client for the deployed API. Buyer routes are called as a
/// buyer: the helpers sign a Cognito user in per buyer name (the name a
/// test puts in a body's `user_id`) and send its access token, and remember
/// which buyer created which order so later calls on it act as its owner.
/// Payment notifications (`/payments/…`) go to the notification API, which
/// the stack keeps apart from the buyer API (`NOTIFY_API_BASE_URL`).
#[derive(Clone)]
pub struct Api {
    pub base: String,
    /// The notification API's base URL.
    pub notify_base: String,
    http: reqwest::Client,
    buyers: Arc<Mutex<HashMap<String, Buyer>>>,
    owners: Arc<Mutex<HashMap<String, String>>>,
}

/// A signed-in buyer of the local user pool.
#[derive(Debug, Clone)]
pub struct Buyer {
    pub access_token: String,
    /// What this buyer's orders carry as `user_id`: the token's subject
    /// (or, for a drill user named `fault-…`, that name).
    pub user_id: String,
}

/// The dev password of the local pool's test buyers (see `infra/buyers.py`).
pub const BUYER_PASSWORD: &str = "Local-buyer-Pa55word";

/// The claims of a JWT, unverified (the API verified it; tests only read it).
pub fn token_claims(token: &str) -> Value {
    use base64::Engine;
    let payload = token.split('.').nth(1).expect("a JWT has three parts");
    let bytes =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).expect("base64url");
    serde_json::from_slice(&bytes).expect("JSON claims")
}

/// One call of the Cognito user-pool API on the local stack (JSON 1.1
/// protocol), signed when `signed` (the Admin* calls need IAM).
pub async fn cognito(action: &str, body: &Value, signed: bool) -> Result<Value, Value> {
    let url = format!("{}/", stack_endpoint());
    let body = body.to_string();
    let mut hs = vec![
        ("content-type".to_owned(), "application/x-amz-json-1.1".to_owned()),
        ("x-amz-target".to_owned(), format!("AWSCognitoIdentityProviderService.{action}")),
    ];
    if signed {
        hs.extend(sigv4("POST", &url, &hs.clone(), body.as_bytes(), "cognito-idp"));
    }
    let mut req = reqwest::Client::new().post(&url).body(body);
    for (k, v) in &hs {
        req = req.header(k, v);
    }
    let resp = req.send().await.unwrap_or_else(|e| panic!("cognito {action}: {e}"));
    let ok = resp.status().is_success();
    let v: Value = serde_json::from_str(&resp.text().await.unwrap_or_default()).unwrap_or(Value::Null);
    if ok {
        Ok(v)
    } else {
        Err(v)
    }
}

/// Creates (first time) and signs in buyer `name` in the local user pool.
pub async fn sign_in(name: &str) -> Buyer {
    let pool = stack_env("BUYER_USER_POOL_ID");
    let client = stack_env("BUYER_USER_POOL_CLIENT_ID");
    let created = cognito(
        "AdminCreateUser",
        &serde_json::json!({"UserPoolId": pool, "Username": name, "MessageAction": "SUPPRESS",
            "UserAttributes": [{"Name": "email", "Value": format!("{name}@example.com")},
                               {"Name": "email_verified", "Value": "true"}]}),
        true,
    )
    .await;
    match created {
        Ok(_) => {}
        // Made by another test process. It may not have set the password
        // yet (its create and its set are two calls), so set it here too:
        // the same permanent password, so either order ends the same.
        Err(e) if e["__type"].as_str().unwrap_or("").contains("UsernameExists") => {}
        Err(e) => panic!("creating buyer {name}: {e}"),
    }
    cognito(
        "AdminSetUserPassword",
        &serde_json::json!({"UserPoolId": pool, "Username": name, "Password": BUYER_PASSWORD, "Permanent": true}),
        true,
    )
    .await
    .unwrap_or_else(|e| panic!("setting {name}'s password: {e}"));
    let auth = cognito(
        "InitiateAuth",
        &serde_json::json!({"ClientId": client, "AuthFlow": "USER_PASSWORD_AUTH",
            "AuthParameters": {"USERNAME": name, "PASSWORD": BUYER_PASSWORD}}),
        false,
    )
    .await
    .unwrap_or_else(|e| panic!("signing in {name}: {e}"));
    let access_token = auth["AuthenticationResult"]["AccessToken"].as_str().expect("an access token").to_owned();
    let claims = token_claims(&access_token);
    let user_id =
        if name.starts_with("fault-") { name.to_owned() } else { claims["sub"].as_str().expect("sub").to_owned() };
    Buyer { access_token, user_id }
}

/// A response: status and JSON body (Null when the body is not JSON).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    pub fn error_code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

impl Default for Api {
    fn default() -> Self {
        Self::new()
    }
}

impl Api {
    pub fn new() -> Self {
        Self {
            base: stack_env("API_BASE_URL").trim_end_matches('/').to_owned(),
            notify_base: stack_env("NOTIFY_API_BASE_URL").trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
            buyers: Default::default(),
            owners: Default::default(),
        }
    }

    /// Buyer `name`, signed in once per process.
    pub async fn buyer(&self, name: &str) -> Buyer {
        if let Some(b) = self.buyers.lock().unwrap().get(name) {
            return b.clone();
        }
        let b = sign_in(name).await;
        self.buyers.lock().unwrap().insert(name.to_owned(), b.clone());
        b
    }

    /// The `user_id` buyer `name`'s orders and coupons carry.
    pub async fn user_id(&self, name: &str) -> String {
        self.buyer(name).await.user_id
    }

    /// The buyer name that created `order_id` through this client (a
    /// stranger's name for an order it did not create).
    pub fn owner(&self, order_id: &str) -> String {
        self.owners.lock().unwrap().get(order_id).cloned().unwrap_or_else(|| "stranger".to_owned())
    }

    /// A request with buyer `name`'s bearer token.
    pub async fn send_as(
        &self,
        name: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Reply {
        let auth = format!("Bearer {}", self.buyer(name).await.access_token);
        let mut hs: Vec<(&str, &str)> = headers.to_vec();
        hs.push(("Authorization", &auth));
        self.send(method, path, &hs, body, false).await
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
        signed: bool,
    ) -> Reply {
        let url = format!("{}{}", self.base_for(path), path);
        self.send_to(method, &url, headers, body, signed).await
    }

    /// The API that serves `path`: the notification API for the providers'
    /// `/payments/{channel}/notify`, the buyer API for everything else.
    pub fn base_for(&self, path: &str) -> &str {
        if path.starts_with("/payments/") {
            &self.notify_base
        } else {
            &self.base
        }
    }

    /// A request to a full `url` (either API).
    pub async fn send_to(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
        signed: bool,
    ) -> Reply {
        let url = url.to_owned();
        let mut hs: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        if body.is_some() {
            hs.push(("content-type".into(), "application/json".into()));
        }
        if signed {
            hs.extend(sigv4(method, &url, &hs, body.unwrap_or("").as_bytes(), "execute-api"));
        }
        let mut req = self.http.request(method.parse().unwrap(), &url);
        for (k, v) in &hs {
            req = req.header(k, v);
        }
        if let Some(b) = body {
            req = req.body(b.to_owned());
        }
        let resp = req.send().await.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        Reply { status, body: serde_json::from_str(&text).unwrap_or(Value::Null) }
    }

    /// POST /orders as the buyer the body names in `user_id` (the API
    /// ignores that field: the order is the token's).
    pub async fn create_order(&self, key: &str, body: &Value) -> Reply {
        let name = body["user_id"].as_str().unwrap_or("anonymous-buyer").to_owned();
        let r = self.send_as(&name, "POST", "/orders", &[("Idempotency-Key", key)], Some(&body.to_string())).await;
        if let Some(id) = r.body["order_id"].as_str() {
            self.owners.lock().unwrap().insert(id.to_owned(), name);
        }
        r
    }
    /// GET /orders/{id} as the order's owner.
    pub async fn get_order(&self, id: &str) -> Reply {
        self.send_as(&self.owner(id), "GET", &format!("/orders/{id}"), &[], None).await
    }
    pub async fn admin_order(&self, id: &str) -> Reply {
        self.send("GET", &format!("/admin/orders/{id}"), &[], None, true).await
    }
    /// Seeds `sku` with `available` units at the price `order_body` shows
    /// the buyer ([`PRICE`] EUR).
    pub async fn put_stock(&self, sku: &str, available: i64) -> Reply {
        let r = self
            .send(
                "PUT",
                &format!("/admin/skus/{sku}"),
                &[],
                Some(&serde_json::json!({"available": available, "price": PRICE, "currency": "EUR"}).to_string()),
                true,
            )
            .await;
        assert_eq!(r.status, 200, "seeding stock: {r:?}");
        r
    }
    pub async fn stock(&self, sku: &str) -> Value {
        let r = self.send("GET", &format!("/admin/skus/{sku}"), &[], None, true).await;
        assert_eq!(r.status, 200, "reading stock: {r:?}");
        r.body
    }
    /// Issues coupon `id` to buyer `user` (a buyer name: the coupon is
    /// issued to that buyer's user id).
    pub async fn put_coupon(&self, id: &str, user: &str, valid_until: &str) -> Reply {
        let user_id = self.user_id(user).await;
        self.send(
            "PUT",
            &format!("/admin/coupons/{id}"),
            &[],
            Some(&serde_json::json!({"user_id": user_id, "valid_until": valid_until}).to_string()),
            true,
        )
        .await
    }
    pub async fn coupon(&self, id: &str) -> Value {
        self.send("GET", &format!("/admin/coupons/{id}"), &[], None, true).await.body
    }
    /// Starts a payment with a fresh Idempotency-Key.
    pub async fn start_payment(&self, order_id: &str) -> Reply {
        self.start_payment_with_key(order_id, &unique("pay-key")).await
    }
    pub async fn start_payment_with_key(&self, order_id: &str, key: &str) -> Reply {
        self.send_as(
            &self.owner(order_id),
            "POST",
            &format!("/orders/{order_id}/payments"),
            &[("Idempotency-Key", key)],
            Some(r#"{"channel":"sandbox"}"#),
        )
        .await
    }
    /// Starts a payment through Stripe (the stack's provider channel).
    pub async fn start_stripe_payment(&self, order_id: &str, key: &str) -> Reply {
        self.send_as(
            &self.owner(order_id),
            "POST",
            &format!("/orders/{order_id}/payments"),
            &[("Idempotency-Key", key)],
            Some(r#"{"channel":"stripe"}"#),
        )
        .await
    }
    /// The sandbox's settle route (IAM-signed, as its callers must).
    pub async fn settle(&self, payment_id: &str, body: &Value) -> Reply {
        self.send("POST", &format!("/sandbox/payments/{payment_id}/settle"), &[], Some(&body.to_string()), true).await
    }
    /// Waits until the order has `status`, returning its view.
    pub async fn wait_status(&self, id: &str, status: &str, timeout: Duration) -> Value {
        eventually(&format!("order {id} to be {status}"), timeout, || async {
            let r = self.get_order(id).await;
            (r.body["status"] == status).then_some(r.body)
        })
        .await
    }
}

/// SigV4 headers for a request to the local stack (the emulator checks that
/// IAM routes are signed, as AWS does, not by whom), with dummy credentials
/// (the signer is the domain crate's, the one `orderctl` uses).
pub fn sigv4(
    method: &str,
    url: &str,
    headers: &[(String, String)],
    body: &[u8],
    service: &str,
) -> Vec<(String, String)> {
    use order_core::aws::sigv4::{signing_headers, Request};
    let credentials = aws_credential_types::Credentials::new("test", "test", None, None, "tests");
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let request = Request { method, url, headers: &headers, body };
    signing_headers(&credentials, REGION, service, request, std::time::SystemTime::now())
        .unwrap_or_else(|e| panic!("signing {method} {url}: {e}"))
}

/// Invokes a deployed function synchronously through the Lambda API.
pub async fn invoke(function: &str, payload: &Value) -> Value {
    let url = format!("{}/2015-03-31/functions/{function}/invocations", stack_endpoint());
    let body = payload.to_string();
    let hs = vec![("content-type".to_owned(), "application/json".to_owned())];
    let mut req = reqwest::Client::new().post(&url).body(body.clone());
    for (k, v) in hs.iter().cloned().chain(sigv4("POST", &url, &hs, body.as_bytes(), "lambda")) {
        req = req.header(k, v);
    }
    let resp = req.send().await.unwrap_or_else(|e| panic!("invoke {function}: {e}"));
    let text = resp.text().await.unwrap_or_default();
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("invoke {function}: not JSON: {text}"))
}

/// Runs reconciliation on the deployed stack and returns its report.
pub async fn reconcile() -> Value {
    let report = invoke(&stack_env("RECONCILE_FUNCTION_NAME"), &serde_json::json!({})).await;
    assert!(report["counts"].is_object(), "reconcile answered {report}");
    report
}

/// The discrepancy kinds a reconcile report names for `order_id`.
pub fn reconcile_kinds(report: &Value, order_id: &str) -> std::collections::BTreeSet<String> {
    report["discrepancies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["order_id"] == order_id)
        .map(|d| d["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// A unique suffix for names created by one test.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:x}", rand::random::<u64>())
}

/// Test doubles for the ports that are not the store.
pub mod fakes {
    use async_trait::async_trait;
    use order_core::domain::*;
    use order_core::ports::*;
    use order_core::store::PaymentAttempt;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// A clock the test moves by hand.
    #[derive(Clone)]
    pub struct FixedClock(pub Arc<Mutex<Timestamp>>);
    impl FixedClock {
        pub fn at(ms: i64) -> Self {
            Self(Arc::new(Mutex::new(Timestamp::from_unix_millis(ms))))
        }
        pub fn set(&self, ms: i64) {
            *self.0.lock().unwrap() = Timestamp::from_unix_millis(ms);
        }
    }
    impl Clock for FixedClock {
        fn now(&self) -> Timestamp {
            *self.0.lock().unwrap()
        }
    }

    /// Records the reminders a use case puts back.
    #[derive(Clone, Default)]
    pub struct RecordedReminders(pub Arc<Mutex<Vec<(OrderId, Duration)>>>);
    #[async_trait]
    impl CloseReminders for RecordedReminders {
        async fn remind_later(&self, order_id: &OrderId, after: Duration) -> Result<(), Unavailable> {
            self.0.lock().unwrap().push((order_id.clone(), after));
            Ok(())
        }
    }

    /// A scripted payment channel: per payment, what `query` answers
    /// (`None` = the channel times out).
    #[derive(Clone, Default)]
    pub struct ScriptedChannel {
        pub answers: Arc<Mutex<HashMap<PaymentId, Option<ChannelPayment>>>>,
        pub refunds: Arc<Mutex<Vec<(PaymentId, String)>>>,
    }
    impl ScriptedChannel {
        pub fn answer(&self, p: &PaymentId, a: Option<ChannelPayment>) {
            self.answers.lock().unwrap().insert(p.clone(), a);
        }
    }
    #[async_trait]
    impl PaymentChannel for ScriptedChannel {
        async fn open(&self, _: &PaymentAttempt, _: &str) -> Result<OpenedPayment, Unavailable> {
            Ok(OpenedPayment::default())
        }
        async fn query(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
            let p = &a.payment_id;
            match self.answers.lock().unwrap().get(p).cloned() {
                Some(Some(a)) => Ok(a),
                Some(None) => Err(Unavailable::new("scripted channel", "timeout")),
                None => Ok(ChannelPayment::NotFound),
            }
        }
        /// Closing a payment still pending fails it; anything else answers
        /// as a query would.
        async fn cancel(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
            let p = &a.payment_id;
            match self.query(a).await? {
                ChannelPayment::Pending => {
                    self.answer(p, Some(ChannelPayment::Failed));
                    Ok(ChannelPayment::Failed)
                }
                other => Ok(other),
            }
        }
        async fn refund(&self, a: &PaymentAttempt, _: i64, key: &str) -> Result<RefundResult, Unavailable> {
            let p = &a.payment_id;
            self.refunds.lock().unwrap().push((p.clone(), key.to_owned()));
            Ok(RefundResult::Refunded { channel_refund_id: format!("r-{p}") })
        }
    }

    /// A channel with the same answers for every payment: `query` and
    /// `cancel` answer as set, taking `delay` each (a brownout when it is
    /// long; `open` too while `slow_open` is set); a refund fails with
    /// `refusal` when it is set, else goes through as `re_auto_<n>`, counted
    /// in `refunds`.
    #[derive(Clone)]
    pub struct FixedChannel {
        pub query: ChannelPayment,
        pub cancel: ChannelPayment,
        pub refusal: Option<String>,
        pub delay: Duration,
        pub slow_open: Arc<AtomicBool>,
        pub refunds: Arc<AtomicUsize>,
    }
    impl FixedChannel {
        /// At once: `query` answers `query`, `cancel` answers `cancel`,
        /// refunds go through.
        pub fn answering(query: ChannelPayment, cancel: ChannelPayment) -> Self {
            Self {
                query,
                cancel,
                refusal: None,
                delay: Duration::ZERO,
                slow_open: Default::default(),
                refunds: Default::default(),
            }
        }
        /// Every refund fails with `reason`.
        pub fn refusing_refunds(self, reason: &str) -> Self {
            Self { refusal: Some(reason.to_owned()), ..self }
        }
        /// `query` and `cancel` (and `open` while `slow_open` is set) take `delay`.
        pub fn taking(self, delay: Duration) -> Self {
            Self { delay, ..self }
        }
        async fn wait(&self) {
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
        }
    }
    #[async_trait]
    impl PaymentChannel for FixedChannel {
        async fn open(&self, _: &PaymentAttempt, _: &str) -> Result<OpenedPayment, Unavailable> {
            if self.slow_open.load(Ordering::SeqCst) {
                self.wait().await;
            }
            Ok(OpenedPayment::default())
        }
        async fn query(&self, _: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
            self.wait().await;
            Ok(self.query.clone())
        }
        async fn cancel(&self, _: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
            self.wait().await;
            Ok(self.cancel.clone())
        }
        async fn refund(&self, _: &PaymentAttempt, _: i64, _: &str) -> Result<RefundResult, Unavailable> {
            if let Some(reason) = &self.refusal {
                return Ok(RefundResult::Failed(reason.clone()));
            }
            let n = self.refunds.fetch_add(1, Ordering::SeqCst);
            Ok(RefundResult::Refunded { channel_refund_id: format!("re_auto_{n}") })
        }
    }

    /// `inner` as an open whose answer never came leaves it: `open` fails
    /// with `Unavailable::new(what, why)`; every other call is `inner`'s.
    #[derive(Clone)]
    pub struct OpenFails<C> {
        pub inner: C,
        pub what: &'static str,
        pub why: &'static str,
    }
    #[async_trait]
    impl<C: PaymentChannel> PaymentChannel for OpenFails<C> {
        fn names(&self) -> Vec<&'static str> {
            self.inner.names()
        }
        async fn open(&self, _: &PaymentAttempt, _: &str) -> Result<OpenedPayment, Unavailable> {
            Err(Unavailable::new(self.what, self.why))
        }
        async fn query(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
            self.inner.query(a).await
        }
        async fn cancel(&self, a: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
            self.inner.cancel(a).await
        }
        async fn refund(&self, a: &PaymentAttempt, amount: i64, key: &str) -> Result<RefundResult, Unavailable> {
            self.inner.refund(a, amount, key).await
        }
    }

    /// Counts schedules created and cancelled.
    #[derive(Clone, Default)]
    pub struct RecordedWakeUps(pub Arc<Mutex<Vec<String>>>);
    #[async_trait]
    impl WakeUpScheduler for RecordedWakeUps {
        async fn schedule_wake_up(&self, id: &OrderId, at: Timestamp) -> Result<Scheduled, Unavailable> {
            self.0.lock().unwrap().push(format!("schedule {id} {at}"));
            Ok(Scheduled::Created)
        }
        async fn cancel_wake_up(&self, id: &OrderId) -> Result<(), Unavailable> {
            self.0.lock().unwrap().push(format!("cancel {id}"));
            Ok(())
        }
    }
}

/// The payment window the local stack was deployed with, in seconds
/// ([`deployed_setting`] `PAYMENT_WINDOW_SECONDS`).
pub fn window_seconds() -> u64 {
    deployed_number("PAYMENT_WINDOW_SECONDS")
}

/// How long an order may take from creation to a final state on the local
/// stack: its window, the scheduler's 10 s tick, and generous slack for a
/// loaded 2-core machine.
pub fn settle_timeout() -> Duration {
    Duration::from_secs(window_seconds() + 90)
}

/// The catalog price `Api::put_stock` seeds, in EUR cents.
pub const PRICE: i64 = 1299;

/// A JSON order body for one SKU; `unit_price` is the price shown to the
/// buyer (the catalog's, as seeded by `Api::put_stock`), a guard only.
pub fn order_body(user: &str, sku: &str, qty: u32, coupon: Option<&str>) -> Value {
    let mut b = serde_json::json!({"user_id": user, "currency": "EUR", "items": [{"sku": sku, "qty": qty, "unit_price": PRICE}]});
    if let Some(c) = coupon {
        b["coupon_id"] = serde_json::json!(c);
    }
    b
}

/// Sends a raw message to the close queue, as the scheduler or the sweep would.
pub async fn send_close_message(order_id: &str) {
    let sqs = aws_sdk_sqs::Client::new(&stack_config().await);
    sqs.send_message()
        .queue_url(stack_env("CLOSE_QUEUE_URL"))
        .message_body(serde_json::json!({"order_id": order_id}).to_string())
        .send()
        .await
        .expect("send close message");
}

/// The sandbox channel's webhook secret the local stack was deployed with
/// (the tests' notifications are the sandbox channel's).
pub fn webhook_secret() -> String {
    deployed_setting("SANDBOX_WEBHOOK_SECRET")
}

/// The Stripe side of the local stack (localstripe, a third party's
/// stateful Stripe server): what a buyer's Stripe.js and an operator's
/// dashboard would do, through Stripe's own API with the stack's test key.
pub mod stripe {
    use super::stack_env;
    use serde_json::Value;

    /// Cards of Stripe's test mode (localstripe knows the same numbers).
    pub const CARD_OK: &str = "4242424242424242";
    pub const CARD_DECLINED_ON_CHARGE: &str = "4000000000000341";

    pub struct Stripe {
        base: String,
        key: String,
        http: reqwest::Client,
    }

    impl Default for Stripe {
        fn default() -> Self {
            Self::new()
        }
    }

    /// The intent id a client_secret (`pi_…_secret_…`) belongs to.
    pub fn intent_of(client_secret: &str) -> String {
        client_secret.split("_secret_").next().unwrap_or_default().to_owned()
    }

    impl Stripe {
        pub fn new() -> Self {
            Self {
                base: stack_env("STRIPE_API_BASE_URL").trim_end_matches('/').to_owned(),
                key: stack_env("STRIPE_SECRET_KEY"),
                http: reqwest::Client::new(),
            }
        }

        /// `(status, body)` of a call; form parameters for a POST.
        pub async fn call(&self, method: &str, path: &str, form: &[(&str, &str)]) -> (u16, Value) {
            let url = format!("{}{path}", self.base);
            let mut req = self.http.request(method.parse().unwrap(), &url).basic_auth(&self.key, Some(""));
            if method == "POST" {
                req = req.form(form);
            } else {
                req = req.query(form);
            }
            let resp = req.send().await.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
            let status = resp.status().as_u16();
            (status, resp.json().await.unwrap_or(Value::Null))
        }

        pub async fn intent(&self, id: &str) -> Value {
            let (status, body) = self.call("GET", &format!("/v1/payment_intents/{id}"), &[]).await;
            assert_eq!(status, 200, "retrieve {id}: {body}");
            body
        }

        /// A card payment method set on the intent (what Stripe.js does
        /// with the card the buyer typed), not yet confirmed.
        pub async fn attach_card(&self, intent: &str, card: &str) {
            let (status, pm) = self
                .call(
                    "POST",
                    "/v1/payment_methods",
                    &[
                        ("type", "card"),
                        ("card[number]", card),
                        ("card[exp_month]", "12"),
                        ("card[exp_year]", "2034"),
                        ("card[cvc]", "123"),
                    ],
                )
                .await;
            assert_eq!(status, 200, "payment method: {pm}");
            let pm_id = pm["id"].as_str().unwrap().to_owned();
            let (status, body) =
                self.call("POST", &format!("/v1/payment_intents/{intent}"), &[("payment_method", &pm_id)]).await;
            assert_eq!(status, 200, "set payment method on {intent}: {body}");
        }

        /// The buyer's confirmation: `(HTTP status, intent or error)`.
        pub async fn confirm(&self, intent: &str) -> (u16, Value) {
            self.call("POST", &format!("/v1/payment_intents/{intent}/confirm"), &[]).await
        }

        /// Card set and confirmed; the intent as confirmed.
        pub async fn pay(&self, intent: &str, card: &str) -> Value {
            self.attach_card(intent, card).await;
            let (status, body) = self.confirm(intent).await;
            assert_eq!(status, 200, "confirm {intent}: {body}");
            body
        }

        /// The charge of a succeeded intent (an id at Stripe, the expanded
        /// object at localstripe).
        pub fn charge_of(intent: &Value) -> String {
            let c = &intent["latest_charge"];
            c.as_str().or_else(|| c["id"].as_str()).unwrap_or_else(|| panic!("no charge: {intent}")).to_owned()
        }

        /// Every refund of a charge.
        pub async fn refunds_of(&self, charge: &str) -> Vec<Value> {
            let (status, body) = self.call("GET", "/v1/refunds", &[("charge", charge), ("limit", "100")]).await;
            assert_eq!(status, 200, "refunds of {charge}: {body}");
            body["data"].as_array().cloned().unwrap_or_default()
        }

        /// A webhook body as Stripe sends it, for the intent as it is now.
        pub async fn event_body(&self, event_id: &str, event_type: &str, intent: &str) -> String {
            let object = self.intent(intent).await;
            serde_json::json!({
                "id": event_id, "object": "event", "type": event_type, "api_version": "2024-06-20",
                "created": now_secs(), "data": {"object": object},
            })
            .to_string()
        }
    }

    pub fn now_secs() -> i64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
    }

    /// `Stripe-Signature` for `body` at `t` with `secret`.
    pub fn signature(secret: &str, t: i64, body: &str) -> String {
        order_core::signature::sign(secret.as_bytes(), t, body.as_bytes())
    }
}

/// Stripe's answers (`tests/fixtures/stripe/`, in the shapes of Stripe's
/// API reference) served in order by a local HTTP server that records the
/// requests: what localstripe cannot produce (a `processing` intent, a
/// pending refund, 429s, Stripe's error codes).
pub mod recorded_stripe {
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::{Arc, Mutex};

    /// One request the server saw.
    #[derive(Debug, Clone)]
    pub struct Seen {
        pub method: String,
        pub target: String,
        pub headers: HashMap<String, String>,
        pub body: String,
    }

    impl Seen {
        pub fn form(&self) -> HashMap<String, String> {
            parse_pairs(&self.body)
        }
        pub fn query(&self) -> HashMap<String, String> {
            parse_pairs(self.target.split_once('?').map(|(_, q)| q).unwrap_or(""))
        }
        pub fn path(&self) -> &str {
            self.target.split('?').next().unwrap_or("")
        }
    }

    fn parse_pairs(s: &str) -> HashMap<String, String> {
        let decode = |v: &str| {
            let v = v.replace('+', " ");
            let mut out = Vec::new();
            let b = v.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'%' && i + 2 < b.len() + 1 {
                    out.push(u8::from_str_radix(&v[i + 1..i + 3], 16).unwrap());
                    i += 3;
                } else {
                    out.push(b[i]);
                    i += 1;
                }
            }
            String::from_utf8(out).unwrap()
        };
        s.split('&')
            .filter(|p| !p.is_empty())
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (decode(k), decode(v)))
            .collect()
    }

    /// An answer: status, extra headers, body (a fixture's name or JSON).
    pub struct Answer {
        pub status: u16,
        pub headers: Vec<(&'static str, &'static str)>,
        pub body: String,
    }

    pub fn fixture(name: &str) -> String {
        let path = format!("{}/fixtures/stripe/{name}.json", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    pub fn ok(name: &str) -> Answer {
        Answer { status: 200, headers: vec![], body: fixture(name) }
    }

    pub fn status(status: u16, name: &str) -> Answer {
        Answer { status, headers: vec![], body: fixture(name) }
    }

    /// Serves `answers` in order, one per request, and records the requests.
    pub fn serve(answers: Vec<Answer>) -> (String, Arc<Mutex<Vec<Seen>>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            let mut answers = answers.into_iter();
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    continue;
                }
                let mut parts = line.split_whitespace();
                let (method, target) = (parts.next().unwrap().to_owned(), parts.next().unwrap().to_owned());
                let mut headers = HashMap::new();
                loop {
                    let mut h = String::new();
                    reader.read_line(&mut h).unwrap();
                    let h = h.trim_end();
                    if h.is_empty() {
                        break;
                    }
                    let (k, v) = h.split_once(':').unwrap();
                    headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
                }
                let len: usize = headers.get("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
                let mut body = vec![0; len];
                reader.read_exact(&mut body).unwrap();
                log.lock().unwrap().push(Seen { method, target, headers, body: String::from_utf8(body).unwrap() });
                let a = answers.next().unwrap_or_else(|| Answer { status: 599, headers: vec![], body: "{}".into() });
                let mut out = format!(
                    "HTTP/1.1 {} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                    a.status,
                    a.body.len()
                );
                for (k, v) in &a.headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str("\r\n");
                out.push_str(&a.body);
                let mut stream = stream;
                let _ = stream.write_all(out.as_bytes());
            }
        });
        (url, seen)
    }
}

/// Asserts that an EventBridge event (as a subscriber receives it) is one
/// of ours and that its detail validates against its JSON Schema in
/// `events/schemas/<detail-type>.schema.json`.
pub fn validate_event(event: &Value) {
    let detail_type = event["detail-type"].as_str().unwrap_or_else(|| panic!("no detail-type: {event}"));
    let path = format!("{}/../events/schemas/{detail_type}.schema.json", env!("CARGO_MANIFEST_DIR"));
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let validator = jsonschema::draft202012::new(&schema).unwrap_or_else(|e| panic!("{detail_type}: {e}"));
    let errors: Vec<String> =
        validator.iter_errors(&event["detail"]).map(|e| format!("{e} at {}", e.instance_path)).collect();
    assert!(errors.is_empty(), "{detail_type} does not match its schema: {errors:?}\n{event}");
}

pub mod fixtures;
pub mod template;

/// The buyer named by a create-order body's `user_id`: the use-case tests
/// keep writing bodies as the API's clients did, and act as that buyer
/// (on the deployed API the buyer is the token's subject instead).
pub fn body_buyer(body: &[u8]) -> UserId {
    let v: Value = serde_json::from_slice(body).expect("a JSON body");
    UserId::parse(v["user_id"].as_str().expect("the body names user_id")).expect("a valid user id")
}

/// `CreateOrder::execute` as the buyer the body names ([`body_buyer`]).
#[async_trait::async_trait]
pub trait CreateAsNamed {
    async fn execute_as_named(
        &self,
        key: Option<&str>,
        body: &[u8],
    ) -> Result<order_core::usecases::create_order::Created, order_core::error::ApiError>;
}

#[async_trait::async_trait]
impl<S: order_core::store::OrderStore + Send + Sync> CreateAsNamed
    for order_core::usecases::create_order::CreateOrder<S>
{
    async fn execute_as_named(
        &self,
        key: Option<&str>,
        body: &[u8],
    ) -> Result<order_core::usecases::create_order::Created, order_core::error::ApiError> {
        order_core::handlers::requests::create_order(self, &body_buyer(body), key, body).await
    }
}

/// Runs one check of a template-checking script under `infra/` with the
/// repo's `.venv` Python (`infra/<script> <check>`), failing the test with
/// the script's findings when it exits non-zero. No stack is needed.
pub fn template_check(script: &str, check: &str) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv/bin/python");
    let out = std::process::Command::new(&python)
        .arg(root.join("infra").join(script))
        .arg(check)
        .current_dir(&root)
        .output()
        .unwrap_or_else(|e| panic!("running {} (infra/tools.sh creates it): {e}", python.display()));
    assert!(
        out.status.success(),
        "infra/{script} {check} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Consumed capacity, measured from the outside: an SDK interceptor that
/// asks every DynamoDB call for `ReturnConsumedCapacity=INDEXES` and
/// records what each response reports, so the store adapter runs exactly
/// as in production (the benchmarks in `tests/benches/` use it).
pub mod capacity {
    use aws_sdk_dynamodb::config::ConfigBag;
    use aws_sdk_dynamodb::operation::{
        batch_get_item::{BatchGetItemInput, BatchGetItemOutput},
        batch_write_item::{BatchWriteItemInput, BatchWriteItemOutput},
        delete_item::{DeleteItemInput, DeleteItemOutput},
        get_item::{GetItemInput, GetItemOutput},
        put_item::{PutItemInput, PutItemOutput},
        query::{QueryInput, QueryOutput},
        scan::{ScanInput, ScanOutput},
        transact_get_items::{TransactGetItemsInput, TransactGetItemsOutput},
        transact_write_items::{TransactWriteItemsInput, TransactWriteItemsOutput},
        update_item::{UpdateItemInput, UpdateItemOutput},
    };
    use aws_sdk_dynamodb::types::{ConsumedCapacity, ReturnConsumedCapacity};
    use aws_smithy_runtime_api::box_error::BoxError;
    use aws_smithy_runtime_api::client::interceptors::context::Error as InterceptorError;
    use aws_smithy_runtime_api::client::interceptors::context::{
        AfterDeserializationInterceptorContextRef, BeforeSerializationInterceptorContextMut,
    };
    use aws_smithy_runtime_api::client::interceptors::Intercept;
    use aws_smithy_runtime_api::client::orchestrator::{Metadata, OrchestratorError};
    use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
    use std::sync::{Arc, Mutex};

    /// Units one call consumed on one table or index.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Units {
        /// The table, or `table/index` for a secondary index.
        pub on: String,
        pub read: f64,
        pub write: f64,
    }

    /// One DynamoDB call as the meter saw it.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Call {
        pub operation: String,
        /// `false`: the call failed (a refused condition, a cancelled
        /// transaction); DynamoDB reports no capacity with an error.
        pub ok: bool,
        pub units: Vec<Units>,
        /// For `TransactWriteItems`: how many items it wrote or checked.
        pub transact_items: Option<usize>,
        /// Why the call failed: for a cancelled transaction
        /// `TransactionCanceled[<reason codes>]` (e.g. `TransactionConflict`),
        /// for another service error its code, else `timeout`, `connector`
        /// or `other`.
        pub error: Option<String>,
    }

    impl Call {
        pub fn read(&self) -> f64 {
            self.units.iter().map(|u| u.read).sum()
        }
        pub fn write(&self) -> f64 {
            self.units.iter().map(|u| u.write).sum()
        }
    }

    /// The interceptor; clones share one log. The item count of a
    /// transaction is carried from its request to its response in
    /// `pending`, which assumes one call at a time (the benchmarks).
    #[derive(Debug, Clone, Default)]
    pub struct Meter(Arc<Mutex<Vec<Call>>>, Arc<Mutex<Option<usize>>>);

    impl Meter {
        /// The calls recorded since the last `take`, oldest first.
        pub fn take(&self) -> Vec<Call> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    /// Splits one reported `ConsumedCapacity` into table and index parts.
    /// With INDEXES, DynamoDB reports the table's share under `Table` and
    /// each index's under its name; a Query on an index reports only the
    /// index. `ReadCapacityUnits`/`WriteCapacityUnits` are filled for the
    /// parts; when only `CapacityUnits` is there, it is attributed by the
    /// operation's kind.
    fn split(c: &ConsumedCapacity, writes: bool, out: &mut Vec<Units>) {
        let table = c.table_name().unwrap_or("?").to_owned();
        let mut parts = Vec::new();
        let mut put = |on: String, cap: Option<&aws_sdk_dynamodb::types::Capacity>| {
            if let Some(cap) = cap {
                let total = cap.capacity_units().unwrap_or(0.0);
                let (r, w) = match (cap.read_capacity_units(), cap.write_capacity_units()) {
                    (None, None) if writes => (0.0, total),
                    (None, None) => (total, 0.0),
                    (r, w) => (r.unwrap_or(0.0), w.unwrap_or(0.0)),
                };
                parts.push(Units { on, read: r, write: w });
            }
        };
        put(table.clone(), c.table());
        for (name, cap) in c.global_secondary_indexes().into_iter().flatten() {
            put(format!("{table}/{name}"), Some(cap));
        }
        for (name, cap) in c.local_secondary_indexes().into_iter().flatten() {
            put(format!("{table}/{name}"), Some(cap));
        }
        if parts.is_empty() {
            let total = c.capacity_units().unwrap_or(0.0);
            let (r, w) = if writes { (0.0, total) } else { (total, 0.0) };
            parts.push(Units {
                on: table,
                read: c.read_capacity_units().unwrap_or(r),
                write: c.write_capacity_units().unwrap_or(w),
            });
        }
        out.extend(parts);
    }

    macro_rules! set_indexes {
        ($input:expr, $($t:ty),+) => {
            $(if let Some(i) = $input.downcast_mut::<$t>() {
                i.return_consumed_capacity = Some(ReturnConsumedCapacity::Indexes);
            })+
        };
    }

    /// What [`Call::error`] says about a failed attempt.
    fn failure(e: &OrchestratorError<InterceptorError>) -> String {
        use aws_sdk_dynamodb::error::ProvideErrorMetadata;
        use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
        if e.is_timeout_error() {
            return "timeout".into();
        }
        if e.is_connector_error() {
            return "connector".into();
        }
        let Some(op) = e.as_operation_error() else { return "other".into() };
        match op.downcast_ref::<TransactWriteItemsError>() {
            Some(TransactWriteItemsError::TransactionCanceledException(c)) => {
                let codes: Vec<&str> =
                    c.cancellation_reasons().iter().filter_map(|r| r.code()).filter(|c| *c != "None").collect();
                format!("TransactionCanceled[{}]", codes.join(","))
            }
            Some(other) => other.code().unwrap_or("other").to_owned(),
            None => "other".into(),
        }
    }

    impl Intercept for Meter {
        fn name(&self) -> &'static str {
            "ConsumedCapacityMeter"
        }

        fn modify_before_serialization(
            &self,
            context: &mut BeforeSerializationInterceptorContextMut<'_>,
            _: &RuntimeComponents,
            _: &mut ConfigBag,
        ) -> Result<(), BoxError> {
            let input = context.input_mut();
            if let Some(t) = input.downcast_ref::<TransactWriteItemsInput>() {
                *self.1.lock().unwrap() = Some(t.transact_items().len());
            }
            set_indexes!(
                input,
                GetItemInput,
                PutItemInput,
                UpdateItemInput,
                DeleteItemInput,
                QueryInput,
                ScanInput,
                BatchGetItemInput,
                BatchWriteItemInput,
                TransactGetItemsInput,
                TransactWriteItemsInput
            );
            Ok(())
        }

        fn read_after_deserialization(
            &self,
            context: &AfterDeserializationInterceptorContextRef<'_>,
            _: &RuntimeComponents,
            cfg: &mut ConfigBag,
        ) -> Result<(), BoxError> {
            let operation = cfg.load::<Metadata>().map(|m| m.name().to_owned()).unwrap_or_else(|| "?".into());
            let mut units = Vec::new();
            let mut error = None;
            let ok = match context.output_or_error() {
                Err(e) => {
                    error = Some(failure(e));
                    false
                }
                Ok(out) => {
                    let one = |c: Option<&ConsumedCapacity>, w: bool, units: &mut Vec<Units>| {
                        if let Some(c) = c {
                            split(c, w, units)
                        }
                    };
                    if let Some(o) = out.downcast_ref::<GetItemOutput>() {
                        one(o.consumed_capacity(), false, &mut units);
                    } else if let Some(o) = out.downcast_ref::<PutItemOutput>() {
                        one(o.consumed_capacity(), true, &mut units);
                    } else if let Some(o) = out.downcast_ref::<UpdateItemOutput>() {
                        one(o.consumed_capacity(), true, &mut units);
                    } else if let Some(o) = out.downcast_ref::<DeleteItemOutput>() {
                        one(o.consumed_capacity(), true, &mut units);
                    } else if let Some(o) = out.downcast_ref::<QueryOutput>() {
                        one(o.consumed_capacity(), false, &mut units);
                    } else if let Some(o) = out.downcast_ref::<ScanOutput>() {
                        one(o.consumed_capacity(), false, &mut units);
                    } else if let Some(o) = out.downcast_ref::<BatchGetItemOutput>() {
                        o.consumed_capacity().iter().for_each(|c| split(c, false, &mut units));
                    } else if let Some(o) = out.downcast_ref::<BatchWriteItemOutput>() {
                        o.consumed_capacity().iter().for_each(|c| split(c, true, &mut units));
                    } else if let Some(o) = out.downcast_ref::<TransactGetItemsOutput>() {
                        o.consumed_capacity().iter().for_each(|c| split(c, false, &mut units));
                    } else if let Some(o) = out.downcast_ref::<TransactWriteItemsOutput>() {
                        o.consumed_capacity().iter().for_each(|c| split(c, true, &mut units));
                    }
                    true
                }
            };
            let transact_items = if operation == "TransactWriteItems" { self.1.lock().unwrap().take() } else { None };
            self.0.lock().unwrap().push(Call { operation, ok, units, transact_items, error });
            Ok(())
        }
    }

    /// A DynamoDB Local client whose calls `meter` records.
    pub async fn metered_client(meter: &Meter) -> aws_sdk_dynamodb::Client {
        let endpoint = super::require("DYNAMODB_LOCAL_ENDPOINT");
        let conf = aws_sdk_dynamodb::config::Builder::from(&super::sdk_config(&endpoint).await)
            .interceptor(meter.clone())
            .build();
        aws_sdk_dynamodb::Client::from_conf(conf)
    }
}

/// Writes `items` into the store's table, 25 to a `BatchWriteItem` and 16
/// of those at a time, resending what DynamoDB hands back unprocessed.
pub async fn batch_put(store: &DynamoStore, items: Vec<HashMap<String, aws_sdk_dynamodb::types::AttributeValue>>) {
    use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
    let writes: Vec<WriteRequest> = items
        .into_iter()
        .map(|i| WriteRequest::builder().put_request(PutRequest::builder().set_item(Some(i)).build().unwrap()).build())
        .collect();
    for group in writes.chunks(25 * 16) {
        let batches = group.chunks(25).map(|chunk| async move {
            let mut pending = chunk.to_vec();
            while !pending.is_empty() {
                let out = store
                    .client()
                    .batch_write_item()
                    .request_items(store.table(), pending)
                    .send()
                    .await
                    .expect("batch write on DynamoDB Local");
                pending = out.unprocessed_items.and_then(|mut u| u.remove(store.table())).unwrap_or_default();
            }
        });
        futures_util::future::join_all(batches).await;
    }
}
