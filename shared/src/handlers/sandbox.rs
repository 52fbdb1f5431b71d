//! The sandbox provider's control endpoint: settle a payment at the channel
//! (its own ledger), plant faults, and send a signed notification to the
//! webhook as a real provider would.

use super::api::{body_bytes, path_param, within_body_limit};
use crate::aws::sandbox::{Faults, SandboxChannel};
use crate::domain::{PaymentId, PaymentStatus};
use crate::error::{json_object, ApiError};
use crate::http::respond;
use crate::ports::{Clock, Unavailable};
use crate::signature;
use lambda_http::{Body, Request, Response};
use serde_json::{json, Value};

pub struct Sandbox {
    pub ledger: SandboxChannel,
    pub clock: Box<dyn Clock>,
    pub secret: Vec<u8>,
    pub merchant_id: String,
    /// Where notifications go: this API's `/payments/sandbox/notify`.
    pub webhook_url: String,
    pub http: reqwest::Client,
}

/// The body of `POST /sandbox/payments/{payment_id}/settle`, validated:
/// a field of the wrong type is refused, never ignored (a test that meant
/// to notify must not silently not notify).
#[derive(Debug, PartialEq)]
pub struct SettleRequest {
    pub outcome: Option<PaymentStatus>,
    pub notify: bool,
    pub faults: Option<Faults>,
}

impl SettleRequest {
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let body = json_object(body)?;
        if let Some(k) = body.keys().find(|k| !["outcome", "notify", "faults"].contains(&k.as_str())) {
            return Err(ApiError::invalid(format!("{k} is not a known field")));
        }
        let outcome = match body.get("outcome") {
            None | Some(Value::Null) => None,
            Some(Value::String(o)) if o == "SUCCEEDED" => Some(PaymentStatus::Succeeded),
            Some(Value::String(o)) if o == "FAILED" => Some(PaymentStatus::Failed),
            Some(o) => return Err(ApiError::invalid(format!("outcome {o} must be \"SUCCEEDED\" or \"FAILED\""))),
        };
        let notify = match body.get("notify") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(n) => return Err(ApiError::invalid(format!("notify {n} must be true or false"))),
        };
        let faults = match body.get("faults") {
            None | Some(Value::Null) => None,
            Some(f) => Some(serde_json::from_value(f.clone()).map_err(|e| ApiError::invalid(format!("faults: {e}")))?),
        };
        Ok(Self { outcome, notify, faults })
    }
}

pub async fn settle(app: &Sandbox, req: Request) -> Response<Body> {
    respond(settle_inner(app, &req).await.map(|v| (200, v)))
}

async fn settle_inner(app: &Sandbox, req: &Request) -> Result<Value, ApiError> {
    within_body_limit(req)?;
    let raw_id = path_param(req, "payment_id");
    let payment_id = PaymentId::parse(raw_id.clone()).map_err(|_| ApiError::not_found(format!("payment {raw_id}")))?;
    let SettleRequest { outcome, notify, faults } = SettleRequest::parse(body_bytes(req))?;
    let entry = app
        .ledger
        .settle(&payment_id, outcome, faults.as_ref())
        .await?
        .ok_or_else(|| ApiError::not_found(format!("payment {payment_id} at the sandbox channel")))?;
    if outcome.is_some_and(|o| o != entry.status) {
        return Err(ApiError::conflict(
            "already_settled",
            format!("the payment is already {} at the channel", entry.status.as_str()),
        ));
    }
    let mut result = json!({
        "payment_id": entry.payment_id, "order_id": entry.order_id, "status": entry.status,
        "channel_txn_id": entry.channel_txn_id, "amount": entry.amount, "currency": entry.currency,
        "faults": entry.faults, "notified": false,
    });
    if notify && entry.status != PaymentStatus::Processing {
        let now = app.clock.now();
        let notification = json!({
            "notify_id": format!("ntf_{}_{}", entry.payment_id, now.unix_millis()),
            "payment_id": entry.payment_id, "order_id": entry.order_id,
            "channel_txn_id": entry.channel_txn_id, "amount": entry.amount, "currency": entry.currency,
            "merchant_id": app.merchant_id, "status": entry.status,
        })
        .to_string();
        let sig = signature::sign(&app.secret, now.unix_seconds(), notification.as_bytes());
        let resp = app
            .http
            .post(&app.webhook_url)
            .header("content-type", "application/json")
            .header("x-signature", sig)
            .body(notification)
            .send()
            .await
            .map_err(|e| Unavailable::new("sandbox notify webhook", e))?;
        result["notified"] = json!(true);
        result["webhook_status"] = json!(resp.status().as_u16());
        result["webhook_response"] = resp.json::<Value>().await.unwrap_or(Value::Null);
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(body: &str) -> String {
        match SettleRequest::parse(body.as_bytes()) {
            Err(ApiError::Refused { code: "invalid_request", message, .. }) => message,
            other => panic!("expected invalid_request for {body}, got {other:?}"),
        }
    }

    #[test]
    fn settle_fields_of_the_wrong_type_are_refused_naming_the_field() {
        assert!(refusal(r#"{"outcome": 1}"#).contains("outcome"));
        assert!(refusal(r#"{"outcome": true}"#).contains("outcome"));
        assert!(refusal(r#"{"outcome": "PAID"}"#).contains("outcome"));
        assert!(refusal(r#"{"outcome": "SUCCEEDED", "notify": "yes"}"#).contains("notify"));
        assert!(refusal(r#"{"notify": 1}"#).contains("notify"));
        assert!(refusal(r#"{"outcome": "FAILED", "notfy": true}"#).contains("notfy"));
    }

    #[test]
    fn a_well_formed_settle_body_parses() {
        let r = SettleRequest::parse(br#"{"outcome":"SUCCEEDED","notify":true}"#).unwrap();
        assert_eq!((r.outcome, r.notify, r.faults), (Some(PaymentStatus::Succeeded), true, None));
        let r = SettleRequest::parse(b"{}").unwrap();
        assert_eq!((r.outcome, r.notify), (None, false));
    }
}
