//! HTTP handlers: route, call one use case, respond through [`crate::http`].

use super::api::{
    body_bytes, buyer, caller_identity, header, idempotency_key, path_param, route_key, source_ip, within_body_limit,
    within_limit, MAX_BODY_BYTES, MAX_PROVIDER_EVENT_BYTES,
};
use super::batch::{invocation_deadline, INVOCATION_MARGIN};
use super::requests;
use super::views;
use crate::aws::dynamo::DynamoStore;
use crate::aws::queue::SqsCloseReminders;
use crate::channels::ConfiguredChannel;
use crate::error::ApiError;
use crate::http::{error_response, json_response, respond};
use crate::metrics;
use crate::ports::{Clock, IdGen};
use crate::signature;
use crate::source_allowlist::SourceAllowlist;
use crate::usecases::close_order::CloseOrder;
use crate::usecases::create_order::CreateOrder;
use crate::usecases::order_reads::Reader;
use crate::usecases::payments;
use lambda_http::{Body, Request, RequestExt, Response};
use tracing::warn;

/// POST /orders
pub async fn create_order(uc: &CreateOrder<DynamoStore>, req: Request) -> Response<Body> {
    let checked = within_body_limit(&req).and_then(|()| buyer(&req)).and_then(|u| Ok((u, idempotency_key(&req)?)));
    let (user, key) = match checked {
        Ok(v) => v,
        Err(e) => return error_response(&e),
    };
    match requests::create_order(uc, &user, key, body_bytes(&req)).await {
        Ok(created) => replayable(json_response(201, &views::created_order(&created.order)), created.replayed),
        Err(e) => error_response(&e),
    }
}

/// Everything the order API needs, built once at cold start.
pub struct OrderApi {
    pub store: DynamoStore,
    pub channel: ConfiguredChannel,
    pub clock: Box<dyn Clock>,
    pub ids: Box<dyn IdGen>,
    pub merchant_id: String,
    /// The close use case, for lazy-expiry reminders and operator checks.
    pub closer: CloseOrder<DynamoStore, ConfiguredChannel, SqsCloseReminders>,
    /// The channel's not-found grace (`CHANNEL_NOT_FOUND_GRACE_SECONDS`).
    pub not_found_grace: std::time::Duration,
}

/// When the channel stops being waited for on this request: the Lambda
/// invocation's deadline less [`INVOCATION_MARGIN`], so that the answer (a
/// 503 with `Retry-After`, a check that says "reminded later") is sent
/// before the function's timeout would cut the connection. `None` outside
/// Lambda (no context): the adapters' own timeouts only.
fn invocation_until(req: &Request) -> Option<std::time::Instant> {
    req.lambda_context_ref().map(|c| invocation_deadline(c.deadline, INVOCATION_MARGIN))
}

/// POST /orders/{order_id}/payments
async fn start_payment(app: &OrderApi, req: &Request) -> Response<Body> {
    let uc = payments::StartPayment {
        store: &app.store,
        channel: app.channel.any(),
        clock: app.clock.as_ref(),
        ids: app.ids.as_ref(),
        merchant_id: &app.merchant_id,
        not_found_grace: app.not_found_grace,
        until: invocation_until(req),
    };
    let started = match buyer(req).and_then(|u| Ok((u, idempotency_key(req)?))) {
        Ok((user, key)) => {
            requests::start_payment(&uc, &user, &path_param(req, "order_id"), key, body_bytes(req)).await
        }
        Err(e) => Err(e),
    };
    match started {
        Ok(s) => {
            let publishable_key = app.channel.stripe().and_then(|c| c.publishable_key());
            let checkout = views::checkout(&s, publishable_key);
            replayable(json_response(201, &checkout), s.replayed)
        }
        Err(e) => error_response(&e),
    }
}

/// PUT /admin/skus/{sku}
async fn put_stock(app: &OrderApi, req: &Request) -> Response<Body> {
    let changed = match idempotency_key(req) {
        Ok(key) => {
            let (clock, ids) = (app.clock.as_ref(), app.ids.as_ref());
            let (sku, by) = (path_param(req, "sku"), caller_identity(req));
            requests::put_stock(&app.store, clock, ids, &sku, key, by, body_bytes(req)).await
        }
        Err(e) => Err(e),
    };
    match changed {
        Ok((stock, replayed)) => replayable(json_response(200, &stock), replayed),
        Err(e) => error_response(&e),
    }
}

/// POST /admin/buyers/{user_id}/points
async fn credit_points(app: &OrderApi, req: &Request) -> Response<Body> {
    let credited = match idempotency_key(req) {
        Ok(key) => {
            let (user, by) = (path_param(req, "user_id"), caller_identity(req));
            requests::credit_points(&app.store, app.clock.as_ref(), &user, key, by, body_bytes(req)).await
        }
        Err(e) => Err(e),
    };
    match credited {
        Ok((balance, replayed)) => replayable(json_response(200, &balance), replayed),
        Err(e) => error_response(&e),
    }
}

/// GET /orders, GET /orders/{order_id}, POST /orders/{order_id}/cancel,
/// POST /orders/{order_id}/payments and the /admin routes.
pub async fn order_api(app: &OrderApi, req: Request) -> Response<Body> {
    if let Err(e) = within_body_limit(&req) {
        return error_response(&e);
    }
    let route = route_key(&req);
    let body = body_bytes(&req);
    let store = &app.store;
    let result = match route.as_str() {
        "GET /orders/{order_id}" | "GET /admin/orders/{order_id}" => {
            let reader =
                if route.starts_with("GET /admin/") { Ok(Reader::Operator) } else { buyer(&req).map(Reader::Buyer) };
            match reader {
                Ok(reader) => requests::get_order(
                    store,
                    &app.closer.reminders,
                    app.clock.as_ref(),
                    &path_param(&req, "order_id"),
                    &reader,
                )
                .await
                .map(|v| (200, v)),
                Err(e) => Err(e),
            }
        }
        "POST /admin/orders/{order_id}/check" => {
            let (id, by) = (path_param(&req, "order_id"), caller_identity(&req));
            requests::force_check_until(&app.closer, &id, &by, invocation_until(&req)).await.map(|v| (200, v))
        }
        "GET /orders" => match buyer(&req) {
            Ok(user) => {
                let params: Vec<(String, String)> =
                    req.query_string_parameters().iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
                requests::list_orders(store, app.clock.as_ref(), &user, &params).await.map(|v| (200, v))
            }
            Err(e) => Err(e),
        },
        "POST /orders/{order_id}/cancel" => match buyer(&req) {
            Ok(user) => {
                let id = path_param(&req, "order_id");
                requests::cancel_order(&app.closer, &user, &id, body, invocation_until(&req)).await
            }
            Err(e) => Err(e),
        },
        "POST /orders/{order_id}/payments" => return start_payment(app, &req).await,
        "PUT /admin/skus/{sku}" => return put_stock(app, &req).await,
        "GET /admin/skus/{sku}" => requests::get_stock(store, &path_param(&req, "sku")).await.map(|v| (200, v)),
        "POST /admin/buyers/{user_id}/points" => return credit_points(app, &req).await,
        "PUT /admin/expiry-rules" => {
            requests::publish_expiry_rules(store, app.clock.as_ref(), caller_identity(&req), body)
                .await
                .map(|v| (200, v))
        }
        "GET /admin/expiry-rules" => requests::get_expiry_rules(store, None).await.map(|v| (200, v)),
        "GET /admin/expiry-rules/{version}" => {
            requests::get_expiry_rules(store, Some(&path_param(&req, "version"))).await.map(|v| (200, v))
        }
        "GET /admin/buyers/{user_id}/points" => {
            requests::get_points(store, &path_param(&req, "user_id")).await.map(|v| (200, v))
        }
        "PUT /admin/coupons/{coupon_id}" => {
            requests::put_coupon(store, &path_param(&req, "coupon_id"), body).await.map(|v| (200, v))
        }
        "GET /admin/coupons/{coupon_id}" => {
            requests::get_coupon(store, &path_param(&req, "coupon_id")).await.map(|v| (200, v))
        }
        _ => Err(ApiError::not_found(format!("route {} {}", req.method(), req.uri().path()))),
    };
    respond(result)
}

/// The webhook's configuration, read once at cold start.
pub struct Webhook {
    pub store: DynamoStore,
    /// Asked what a payment is when a provider only says that it changed.
    pub channel: ConfiguredChannel,
    pub clock: Box<dyn Clock>,
    /// Each channel's own signing secret.
    pub secrets: std::collections::HashMap<String, Vec<u8>>,
    pub merchant_id: String,
    /// Where the provider's notifications may come from
    /// (`WEBHOOK_SOURCE_CIDRS`; empty: anywhere). Not applied to the
    /// sandbox, a dev-only channel whose notifications come from a function.
    pub sources: SourceAllowlist,
}

/// The sandbox channel's name: the one channel the source list skips.
const SANDBOX_CHANNEL: &str = "sandbox";

/// POST /payments/{channel}/notify. Cheapest refusals first, so junk costs
/// as little as it can (docs/payments.md, "Notification flood capacity"):
/// the source address, then the size, then the signature (one HMAC per
/// secret over the raw body); nothing is parsed, read or written before
/// the signature holds.
pub async fn payment_webhook(app: &Webhook, req: Request) -> Response<Body> {
    let channel = path_param(&req, "channel");
    if channel != SANDBOX_CHANNEL && !app.sources.allows(source_ip(&req)) {
        metrics::WEBHOOK_SOURCE_REFUSED.count(1);
        return error_response(&ApiError::forbidden(
            "forbidden_source",
            "notifications are accepted only from the payment provider's published addresses",
        ));
    }
    let limit = if channel == crate::stripe::CHANNEL_NAME { MAX_PROVIDER_EVENT_BYTES } else { MAX_BODY_BYTES };
    if let Err(e) = within_limit(&req, limit) {
        return error_response(&e);
    }
    let body = body_bytes(&req);
    let now = app.clock.now().unix_seconds();
    let Some(secret) = app.secrets.get(&channel) else {
        return error_response(&ApiError::not_found(format!("payment channel {channel:?}")));
    };
    if channel == crate::stripe::CHANNEL_NAME {
        return stripe_webhook(app, &req, secret, body, now).await;
    }
    if let Err(e) = signature::verify(secret, header(&req, "x-signature"), body, now) {
        warn!(reason = %e, channel, "webhook signature rejected");
        metrics::WEBHOOK_BAD_SIGNATURE.count(1);
        return error_response(&ApiError::unauthorized("bad_signature", e.to_string()));
    }
    respond(
        requests::payment_notification(&app.store, app.clock.as_ref(), &app.merchant_id, &channel, body)
            .await
            .map(|v| (200, v)),
    )
}

/// POST /payments/stripe/notify: `Stripe-Signature` checked against every
/// configured signing secret (comma-separated in the parameter, so a secret
/// is rotated by adding the new one, then removing the old), then the event
/// decided from the API's answer (`usecases::channel_events`).
async fn stripe_webhook(app: &Webhook, req: &Request, secret: &[u8], body: &[u8], now: i64) -> Response<Body> {
    let secrets = crate::stripe::events::signing_secrets(secret);
    if let Err(e) = signature::verify_any(&secrets, header(req, "stripe-signature"), body, now) {
        warn!(reason = %e, channel = "stripe", "webhook signature rejected");
        metrics::WEBHOOK_BAD_SIGNATURE.count(1);
        return error_response(&ApiError::unauthorized("bad_signature", format!("Stripe-Signature: {e}")));
    }
    let Some(stripe) = app.channel.stripe() else {
        // Signed with our secret, but this deployment has no Stripe key:
        // a 5xx, so Stripe sends it again once the stack is configured.
        let cause = crate::ports::Unavailable::new("Stripe event", "STRIPE_SECRET_KEY_PARAMETER is not set");
        return error_response(&ApiError::Internal(cause));
    };
    respond(
        requests::stripe_event(&app.store, stripe, app.clock.as_ref(), &app.merchant_id, body).await.map(|v| (200, v)),
    )
}

/// A write's answer, marked `idempotent-replayed: true` when it answers a
/// key seen before with the same request (nothing was written now).
fn replayable(mut resp: Response<Body>, replayed: bool) -> Response<Body> {
    if replayed {
        resp.headers_mut().insert("idempotent-replayed", "true".parse().expect("valid header"));
    }
    resp
}
