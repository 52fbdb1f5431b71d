//! BENCHMARKS.md#what-does-refusing-a-junk-notification-cost: what the
//! payment webhook spends refusing a junk notification, the figure behind the
//! notify API's flood capacity (docs/payments.md, "Notification flood
//! capacity").
//!
//! Each case drives the production handler (`handlers::http::payment_webhook`)
//! with a Stripe-shaped request whose body is the largest the webhook takes
//! (64 KiB) and times it per request, on one thread. The worst case for the
//! defender is a forged signature of the right shape and a fresh timestamp
//! while two signing secrets are configured (a rotation): two HMAC-SHA256
//! over the whole body, then 401. The "decode" case adds what the Lambda
//! runtime does before the handler runs (the event's JSON turned into a
//! request). No store, channel or network is reached on any of these paths:
//! the store's client points at an address nothing listens on, and a call
//! to it would show as a multi-second outlier.
//!
//! `cargo bench -p system_tests --profile dev --bench webhook_reject 2>/dev/null | grep -v '^{"'`
//! (`-- N` sets the requests per case, default 2000). The dev profile is
//! unoptimised; the Lambda build (release) hashes several times faster, so
//! these figures overstate the cost, which understates the capacity.

use lambda_http::Request;
use order_core::aws::dynamo::DynamoStore;
use order_core::channels::ConfiguredChannel;
use order_core::handlers::http::{payment_webhook, Webhook};
use order_core::signature;
use order_core::source_allowlist::SourceAllowlist;
use serde_json::Value;
use std::collections::HashMap;
use std::time::Instant;
use system_tests::fakes::FixedClock;

const NOW: i64 = 1_795_946_400;
const BODY_BYTES: usize = 64 * 1024;

/// The events/stripe-webhook.json request with `body`, `signature` (none:
/// no header) and `source_ip`.
fn event(body: &str, signature: Option<&str>, source_ip: &str) -> String {
    let mut e: Value = serde_json::from_str(include_str!("../../events/stripe-webhook.json")).unwrap();
    e["body"] = Value::String(body.to_owned());
    e["isBase64Encoded"] = Value::Bool(false);
    let headers = e["headers"].as_object_mut().unwrap();
    match signature {
        Some(s) => headers.insert("stripe-signature".into(), Value::String(s.to_owned())),
        None => headers.remove("stripe-signature"),
    };
    e["requestContext"]["http"]["sourceIp"] = Value::String(source_ip.to_owned());
    e.to_string()
}

/// A body of exactly `len` bytes that looks like an event.
fn junk_body(len: usize) -> String {
    let head = r#"{"id":"evt_junk","type":"payment_intent.succeeded","pad":""#;
    let tail = r#""}"#;
    format!("{head}{}{tail}", "x".repeat(len - head.len() - tail.len()))
}

async fn webhook(sources: &str) -> Webhook {
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url("http://127.0.0.1:9")
        .credentials_provider(aws_credential_types::Credentials::new("bench", "bench", None, None, "bench"))
        .load()
        .await;
    Webhook {
        store: DynamoStore::new(aws_sdk_dynamodb::Client::new(&config), "bench-never-reached"),
        channel: ConfiguredChannel::default(),
        clock: Box::new(FixedClock::at(NOW * 1000)),
        // Two secrets, as while one is rotated: two HMACs per forged request.
        secrets: HashMap::from([("stripe".to_owned(), b"whsec_current,whsec_previous".to_vec())]),
        merchant_id: "merchant-bench".to_owned(),
        sources: SourceAllowlist::parse(sources).unwrap(),
    }
}

/// Runs `n` requests built from `raw` (decoded once and copied, or decoded
/// per request when `decode`), checks the answer's status, and returns ns
/// per request without the copy (`copy_ns`).
async fn time(app: &Webhook, raw: &str, decode: bool, n: usize, want: u16, copy_ns: f64) -> f64 {
    let decoded: Request = lambda_http::request::from_str(raw).unwrap();
    let first = payment_webhook(app, clone(&decoded)).await.status().as_u16();
    assert_eq!(first, want, "the case must be refused with {want}");
    let start = Instant::now();
    for _ in 0..n {
        let req = if decode { lambda_http::request::from_str(raw).unwrap() } else { clone(&decoded) };
        let status = payment_webhook(app, req).await.status().as_u16();
        debug_assert_eq!(status, want);
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    if decode {
        ns
    } else {
        (ns - copy_ns).max(0.0)
    }
}

/// A request rebuilt from its parts (a `Request` is not `Clone`); the copy
/// of the 64 KiB body is timed on its own and subtracted.
fn clone(req: &Request) -> Request {
    let mut out = Request::new(req.body().clone());
    *out.method_mut() = req.method().clone();
    *out.uri_mut() = req.uri().clone();
    *out.headers_mut() = req.headers().clone();
    *out.extensions_mut() = req.extensions().clone();
    out
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2000);
    let body = junk_body(BODY_BYTES);
    let forged = format!("t={NOW},v1={}", "ab".repeat(32));
    let forged4 = format!("t={NOW}{}", format!(",v1={}", "ab".repeat(32)).repeat(signature::MAX_SIGNATURES));
    let stale = format!("t={},v1={}", NOW - 3600, "ab".repeat(32));
    let stripe_ip = "3.18.12.63";
    let open = webhook("").await;
    let listed = webhook("3.18.12.63/32,3.130.192.231/32").await;

    // The copy each timed request makes of its decoded parts.
    let decoded: Request = lambda_http::request::from_str(&event(&body, Some(&forged), stripe_ip)).unwrap();
    let start = Instant::now();
    for _ in 0..n {
        std::hint::black_box(clone(&decoded));
    }
    let clone_ns = start.elapsed().as_nanos() as f64 / n as f64;

    // HMAC-SHA256 alone over the body: one and two secrets.
    let secrets = [b"whsec_current".to_vec(), b"whsec_previous".to_vec()];
    let mut hmac_ns = Vec::new();
    for k in [1, 2] {
        let start = Instant::now();
        for _ in 0..n {
            let r = signature::verify_any(&secrets[..k], Some(&forged), body.as_bytes(), NOW);
            std::hint::black_box(r).unwrap_err();
        }
        hmac_ns.push(start.elapsed().as_nanos() as f64 / n as f64);
    }

    let cases: Vec<(&str, f64)> = vec![
        (
            "forged, fresh t, 2 secrets (worst case)",
            time(&open, &event(&body, Some(&forged), stripe_ip), false, n, 401, clone_ns).await,
        ),
        (
            "forged, 4 v1 values, 2 secrets",
            time(&open, &event(&body, Some(&forged4), stripe_ip), false, n, 401, clone_ns).await,
        ),
        (
            "forged + event decode (runtime's share)",
            time(&open, &event(&body, Some(&forged), stripe_ip), true, n, 401, clone_ns).await,
        ),
        ("no Stripe-Signature header", time(&open, &event(&body, None, stripe_ip), false, n, 401, clone_ns).await),
        ("stale timestamp", time(&open, &event(&body, Some(&stale), stripe_ip), false, n, 401, clone_ns).await),
        (
            "over 64 KiB (413)",
            time(&open, &event(&junk_body(BODY_BYTES + 1), Some(&forged), stripe_ip), false, n, 413, clone_ns).await,
        ),
        (
            "source not in WebhookSourceCidrs (403)",
            time(&listed, &event(&body, Some(&forged), "198.51.100.7"), false, n, 403, clone_ns).await,
        ),
        (
            "forged, source listed (allowlist on)",
            time(&listed, &event(&body, Some(&forged), stripe_ip), false, n, 401, clone_ns).await,
        ),
    ];

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    println!("webhook rejection cost, {n} requests per case, 64 KiB body, one thread (load average {load})");
    println!("  request copy (subtracted below)            {:>10.0} ns", clone_ns);
    println!("  HMAC-SHA256 over the body, 1 secret        {:>10.0} ns", hmac_ns[0]);
    println!("  HMAC-SHA256 over the body, 2 secrets       {:>10.0} ns", hmac_ns[1]);
    for (name, ns) in &cases {
        println!("  {name:<42} {ns:>10.0} ns/request");
    }
    let worst = cases.iter().map(|(_, ns)| *ns).fold(0.0, f64::max);
    println!("worst refusal in process: {:.3} ms", worst / 1e6);
    println!(
        "  -> one execution slot refuses at most {:.0} junk requests/s at this speed \
         (a 256 MB Lambda has about 256/1769 of a vCPU: multiply the time by ~6.9)",
        1e9 / worst
    );
}
