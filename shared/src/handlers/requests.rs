//! Parse at the edge: each HTTP route's request (path, headers, body)
//! becomes a use case's typed input, and the use case's typed answer
//! becomes the route's JSON, here and in [`super::views`]. The use cases
//! never see a body or build JSON; their refusals
//! ([`UseCaseError`](crate::usecases::UseCaseError)) become
//! [`ApiError`] through the one mapping in [`crate::error`].

use super::views;
use crate::aws::buyer_index::MAX_PAGE;
use crate::domain::money::{line_total, MAX_AMOUNT};
use crate::domain::*;
use crate::error::{json_object, ApiError};
use crate::ports::{Clock, CloseReminders, IdGen, PaymentChannel};
use crate::store::{BuyerOrders, OrderStore, PaymentStore, StockLedger};
use crate::usecases::close_order::CloseOrder;
use crate::usecases::create_order::{
    CreateOrder, CreateOrderRequest, Created, RequestLine, MAX_LINES, MAX_POINTS, MAX_QTY,
};
use crate::usecases::my_orders::{self, ListQuery};
use crate::usecases::order_reads::Reader;
use crate::usecases::payments::{PaymentNotice, PaymentStarted, StartPayment};
use crate::usecases::queries::{NewCoupon, StockChange, MAX_STOCK};
use crate::usecases::{cancel_order as cancel, channel_events, force_check as check, order_reads, payments, queries};
use serde::Deserialize;
use serde_json::{json, Value};

/// The `Idempotency-Key` a write route requires.
fn required_key(idempotency_key: Option<&str>) -> Result<IdempotencyKey, ApiError> {
    match idempotency_key {
        None => Err(ApiError::invalid("the Idempotency-Key header is required")),
        Some(k) => IdempotencyKey::parse(k).map_err(|e| ApiError::invalid(e.0)),
    }
}

fn field<'a>(obj: &'a serde_json::Map<String, Value>, name: &str) -> Result<&'a Value, ApiError> {
    obj.get(name).ok_or_else(|| ApiError::invalid(format!("{name} is required")))
}

fn string_field(obj: &serde_json::Map<String, Value>, name: &str) -> Result<String, ApiError> {
    field(obj, name)?.as_str().map(str::to_owned).ok_or_else(|| ApiError::invalid(format!("{name} must be a string")))
}

fn reject_unknown(obj: &serde_json::Map<String, Value>, known: &[&str], at: &str) -> Result<(), ApiError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(ApiError::invalid(format!("{at}{k} is not a known field"))),
        None => Ok(()),
    }
}

// The wire form of the create request: the use case defines the typed
// request and what it means; how it is spelled in JSON is decided here.
impl CreateOrderRequest {
    /// Parses and validates a request body of `buyer` (the authenticated
    /// caller); every error names the field. A `user_id` in the body is
    /// accepted for older clients and ignored: the order is always the
    /// caller's.
    pub fn parse(buyer: &UserId, body: &[u8]) -> Result<Self, ApiError> {
        let obj = &json_object(body)?;
        reject_unknown(obj, &["user_id", "currency", "items", "coupon_id", "points"], "")?;
        let user_id = buyer.clone();
        let currency = Currency::parse(string_field(obj, "currency")?).map_err(|e| ApiError::invalid(e.0))?;
        let coupon_id = match obj.get("coupon_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => Some(CouponId::parse(c.clone()).map_err(|e| ApiError::invalid(e.0))?),
            Some(_) => return Err(ApiError::invalid("coupon_id must be a string")),
        };
        let points = match obj.get("points") {
            None | Some(Value::Null) => 0,
            Some(v) => v.as_u64().filter(|p| *p <= MAX_POINTS).ok_or_else(|| {
                ApiError::invalid(format!("points must be an integer from 0 to {MAX_POINTS} (one per minor unit)"))
            })? as u32,
        };
        let raw_items = field(obj, "items")?.as_array().ok_or_else(|| ApiError::invalid("items must be an array"))?;
        if raw_items.is_empty() || raw_items.len() > MAX_LINES {
            return Err(ApiError::invalid(format!("items must hold 1 to {MAX_LINES} lines")));
        }
        let mut items: Vec<RequestLine> = Vec::with_capacity(raw_items.len());
        for (i, raw) in raw_items.iter().enumerate() {
            let at = format!("items[{i}].");
            let line = raw.as_object().ok_or_else(|| ApiError::invalid(format!("items[{i}] must be an object")))?;
            reject_unknown(line, &["sku", "qty", "unit_price"], &at)?;
            let sku = Sku::parse(
                string_field(line, "sku").map_err(|_| ApiError::invalid(format!("{at}sku must be a string")))?,
            )
            .map_err(|e| ApiError::invalid(format!("{at}{}", e.0)))?;
            let qty = line
                .get("qty")
                .and_then(Value::as_u64)
                .filter(|q| (1..=MAX_QTY).contains(q))
                .ok_or_else(|| ApiError::invalid(format!("{at}qty must be an integer from 1 to {MAX_QTY}")))?;
            let unit_price = match line.get("unit_price") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_i64().filter(|p| (0..=MAX_AMOUNT).contains(p)).ok_or_else(|| {
                    ApiError::invalid(format!(
                        "{at}unit_price (optional: the price the buyer was shown) must be an integer from 0 to \
                         {MAX_AMOUNT} in minor units"
                    ))
                })?),
            };
            if items.iter().any(|l| l.sku == sku) {
                return Err(ApiError::invalid(format!(
                    "{at}sku repeats an earlier line; put the quantity on one line"
                )));
            }
            if let Some(p) = unit_price {
                line_total(qty as u32, p).map_err(|e| ApiError::invalid(format!("{at}{}", e.0)))?;
            }
            items.push(RequestLine { sku, qty: qty as u32, unit_price });
        }
        Ok(Self { user_id, currency, items, coupon_id, points })
    }
}

/// POST /orders: the key, then the body, then the use case.
pub async fn create_order<S: OrderStore>(
    uc: &CreateOrder<S>,
    buyer: &UserId,
    idempotency_key: Option<&str>,
    body: &[u8],
) -> Result<Created, ApiError> {
    let key = required_key(idempotency_key)?;
    let req = CreateOrderRequest::parse(buyer, body)?;
    Ok(uc.execute(key, req).await?)
}

/// POST /orders/{order_id}/payments: the key, the body's channel (which
/// this deployment must have), then the order id, then the use case.
pub async fn start_payment<S, C>(
    uc: &StartPayment<'_, S, C>,
    buyer: &UserId,
    order_id: &str,
    idempotency_key: Option<&str>,
    body: &[u8],
) -> Result<PaymentStarted, ApiError>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
{
    let key = required_key(idempotency_key)?;
    let obj = json_object(body)?;
    let channel_name = obj
        .get("channel")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("channel is required and must be a string"))?;
    uc.channel(channel_name)?;
    let order_id = OrderId::parse(order_id).map_err(|_| ApiError::not_found(format!("order {order_id}")))?;
    Ok(uc.execute(buyer, &order_id, key, channel_name).await?)
}

/// The body a payment provider posts to the webhook.
#[derive(Debug, Clone, Deserialize)]
struct PaymentNotification {
    notify_id: String,
    payment_id: String,
    order_id: String,
    channel_txn_id: String,
    amount: i64,
    currency: String,
    merchant_id: String,
    status: String,
}

/// A notification body of `channel`, checked field by field.
pub fn payment_notice(channel: &str, body: &[u8]) -> Result<PaymentNotice, ApiError> {
    let n: PaymentNotification =
        serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("notification body: {e}")))?;
    let channel = ChannelName::parse(channel).map_err(|e| ApiError::invalid(e.0))?;
    if n.notify_id.is_empty() || n.notify_id.len() > 128 || n.channel_txn_id.is_empty() || n.channel_txn_id.len() > 128
    {
        return Err(ApiError::invalid("notify_id and channel_txn_id must be 1 to 128 characters"));
    }
    let status = match n.status.as_str() {
        "SUCCEEDED" => PaymentStatus::Succeeded,
        "FAILED" => PaymentStatus::Failed,
        other => return Err(ApiError::invalid(format!("status {other:?} must be SUCCEEDED or FAILED"))),
    };
    let payment_id =
        PaymentId::parse(n.payment_id.clone()).map_err(|_| ApiError::not_found(format!("payment {}", n.payment_id)))?;
    Ok(PaymentNotice {
        channel,
        notify_id: n.notify_id,
        payment_id,
        order_id: n.order_id,
        channel_txn_id: n.channel_txn_id,
        amount: n.amount,
        currency: n.currency,
        merchant_id: n.merchant_id,
        status,
    })
}

/// POST /payments/{channel}/notify, after the signature was verified:
/// `{"result": "paid" | "duplicate" | "recorded" | "refund_pending"}`.
pub async fn payment_notification<S: OrderStore + PaymentStore>(
    store: &S,
    clock: &dyn Clock,
    merchant_id: &str,
    channel: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    let notice = payment_notice(channel, body)?;
    let result = payments::handle_notification(store, clock, merchant_id, &notice).await?;
    Ok(json!({"result": result.as_str()}))
}

/// POST /payments/stripe/notify, after the signature was verified.
pub async fn stripe_event<S, C>(
    store: &S,
    channel: &C,
    clock: &dyn Clock,
    merchant_id: &str,
    body: &[u8],
) -> Result<Value, ApiError>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
{
    let event = crate::stripe::events::parse_event(body).map_err(ApiError::invalid)?;
    let channel_name = ChannelName::parse(crate::stripe::CHANNEL_NAME).expect("a valid channel name");
    let outcome =
        channel_events::handle_channel_event(store, channel, clock, merchant_id, &channel_name, &event).await?;
    Ok(json!({"result": outcome.as_str()}))
}

/// GET /orders/{order_id} and GET /admin/orders/{order_id}.
pub async fn get_order<S: OrderStore, Q: CloseReminders>(
    store: &S,
    reminders: &Q,
    clock: &dyn Clock,
    id: &str,
    reader: &Reader,
) -> Result<Value, ApiError> {
    let order_id = OrderId::parse(id).map_err(|_| ApiError::not_found(format!("order {id}")))?;
    let read = order_reads::get_order(store, reminders, clock, &order_id, reader).await?;
    Ok(views::order_read(&read))
}

/// The page size of `GET /orders` when the buyer gives none.
pub const DEFAULT_PAGE: u32 = 20;

/// The wire form of a list cursor: the index key the page ended on and the
/// filter it was issued for, as hex of its JSON. Opaque to clients; not a
/// secret (it names only the buyer's own order), but bound to the buyer
/// (the use case checks the key's partition) and to the filter (here).
#[derive(serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListCursor {
    v: u32,
    status: Option<OrderStatus>,
    key: crate::store::DueCursor,
}

/// Whether `key` is shaped like a key of the buyer index, as DynamoDB
/// demands of a start key (the index's keys and the table's, no other
/// attribute, none empty): an order's, or a refund's (refunds carry
/// `user_id` and `created_at` too, so a page may end on one). A cursor
/// edited into anything else would make the query fail as a server error.
fn is_buyer_index_key(key: &crate::store::DueCursor) -> bool {
    let get = |k: &str| key.get(k).map(String::as_str);
    let order_pk = get("pk").and_then(|p| p.strip_prefix("ORDER#")).is_some_and(|id| OrderId::parse(id).is_ok());
    let sk = match get("sk") {
        Some("ORDER") => true,
        Some(sk) => sk.strip_prefix("REFUND#").is_some_and(|p| PaymentId::parse(p).is_ok()),
        None => false,
    };
    key.len() == 4
        && order_pk
        && sk
        && get("created_at").is_some_and(|t| Timestamp::parse(t).is_ok())
        && get("user_id").is_some_and(|u| UserId::parse(u).is_ok())
}

fn encode_cursor(status: Option<OrderStatus>, key: crate::store::DueCursor) -> String {
    hex::encode(serde_json::to_vec(&ListCursor { v: 1, status, key }).expect("serialisable"))
}

impl ListQuery {
    /// `GET /orders?status=&limit=&cursor=`, each at most once; anything
    /// else is refused by name.
    pub fn parse(params: &[(String, String)]) -> Result<Self, ApiError> {
        let mut seen = std::collections::BTreeSet::new();
        for (k, _) in params {
            if !["status", "limit", "cursor"].contains(&k.as_str()) {
                return Err(ApiError::invalid(format!("{k} is not a known query parameter (status, limit, cursor)")));
            }
            if !seen.insert(k.as_str()) {
                return Err(ApiError::invalid(format!("{k} may be given once")));
            }
        }
        let get = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let status = match get("status") {
            None => None,
            Some(v) => Some(OrderStatus::ALL.into_iter().find(|s| s.as_str() == v).ok_or_else(|| {
                ApiError::invalid(format!("status {v:?} must be one of PENDING_PAYMENT, CLOSING, PAID, CLOSED"))
            })?),
        };
        let limit = match get("limit") {
            None => DEFAULT_PAGE,
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|l| (1..=MAX_PAGE).contains(l))
                .ok_or_else(|| ApiError::invalid(format!("limit must be an integer from 1 to {MAX_PAGE}")))?,
        };
        let after = match get("cursor") {
            None => None,
            Some(c) => {
                let malformed = || {
                    ApiError::invalid("cursor is malformed; pass next_cursor from the previous page as it was given")
                };
                let cursor: ListCursor = hex::decode(c)
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok())
                    .filter(|c: &ListCursor| c.v == 1 && is_buyer_index_key(&c.key))
                    .ok_or_else(malformed)?;
                if cursor.status != status {
                    return Err(ApiError::invalid(
                        "cursor was issued for another status filter; keep the filter or start again without a cursor",
                    ));
                }
                Some(cursor.key)
            }
        };
        Ok(Self { status, limit, after })
    }
}

/// GET /orders, by `buyer`: a page of their orders, newest first, and
/// `next_cursor` while there are more.
pub async fn list_orders<S: BuyerOrders>(
    store: &S,
    clock: &dyn Clock,
    buyer: &UserId,
    params: &[(String, String)],
) -> Result<Value, ApiError> {
    let query = ListQuery::parse(params)?;
    let status = query.status;
    let list = my_orders::list_orders(store, clock, buyer, query).await?;
    let next = list.next.clone().map(|key| encode_cursor(status, key));
    Ok(views::order_list(&list, next))
}

/// POST /orders/{order_id}/cancel, by `buyer`: 200 with the order once it
/// is CLOSED, 202 while it is held in CLOSING (a payment attempt being
/// confirmed at the channel first). The route takes no body: an empty one
/// or `{}`; a field in it is refused rather than ignored.
pub async fn cancel_order<S, C, Q>(
    closer: &CloseOrder<S, C, Q>,
    buyer: &UserId,
    id: &str,
    body: &[u8],
    until: Option<std::time::Instant>,
) -> Result<(u16, Value), ApiError>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
    Q: CloseReminders,
{
    if !body.iter().all(u8::is_ascii_whitespace) {
        if let Some(k) = json_object(body)?.keys().next() {
            return Err(ApiError::invalid(format!("{k} is not a known field (a cancel takes no body)")));
        }
    }
    let order_id = OrderId::parse(id).map_err(|_| ApiError::not_found(format!("order {id}")))?;
    let cancelled = cancel::cancel_order(closer, buyer, &order_id, until).await?;
    let status = match cancelled.outcome {
        cancel::CancelOutcome::Closed => 200,
        cancel::CancelOutcome::Closing => 202,
    };
    Ok((status, views::cancelled(&cancelled.record, closer.clock.now())))
}

/// POST /admin/orders/{order_id}/check, by the IAM caller `by`.
pub async fn force_check<S, C, Q>(closer: &CloseOrder<S, C, Q>, id: &str, by: &str) -> Result<Value, ApiError>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
    Q: CloseReminders,
{
    force_check_until(closer, id, by, None).await
}

/// As [`force_check`], with the channel cut off at `until` (the API
/// invocation's deadline less its margin).
pub async fn force_check_until<S, C, Q>(
    closer: &CloseOrder<S, C, Q>,
    id: &str,
    by: &str,
    until: Option<std::time::Instant>,
) -> Result<Value, ApiError>
where
    S: OrderStore + PaymentStore,
    C: PaymentChannel,
    Q: CloseReminders,
{
    let order_id = OrderId::parse(id).map_err(|_| ApiError::not_found(format!("order {id}")))?;
    let checked = check::force_check_until(closer, &order_id, by, until).await?;
    Ok(views::force_check(&checked))
}

/// `{"category": C | null, "tags": [T, …]}` (either alone; sent without
/// the other fields): what expiry rules may match of a SKU.
fn classify(obj: &serde_json::Map<String, Value>) -> Result<StockChange, ApiError> {
    use crate::domain::expiry_rules::Label;
    if let Some(k) = obj.keys().find(|k| !["category", "tags"].contains(&k.as_str())) {
        return Err(ApiError::invalid(format!("category and tags are changed on their own, without {k}")));
    }
    let label = |v: &Value, what: &str| -> Result<Label, ApiError> {
        let s = v.as_str().ok_or_else(|| ApiError::invalid(format!("{what} must be a string")))?;
        Label::parse(s).map_err(|e| ApiError::invalid(format!("{what}: {}", e.0)))
    };
    let category = match obj.get("category") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(v) => Some(Some(label(v, "category")?)),
    };
    let tags = match obj.get("tags") {
        None => None,
        Some(Value::Array(a)) if a.len() <= 20 => {
            let tags =
                a.iter().enumerate().map(|(i, t)| label(t, &format!("tags[{i}]"))).collect::<Result<Vec<_>, _>>()?;
            Some(tags)
        }
        Some(_) => return Err(ApiError::invalid("tags must be an array of at most 20 labels")),
    };
    Ok(StockChange::Classify { category, tags })
}

// The wire form of a stock change, as for the create request above.
impl StockChange {
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let obj = json_object(body)?;
        let known = ["available", "if_available", "adjust", "price", "currency", "purchase_limit", "category", "tags"];
        if let Some(k) = obj.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(ApiError::invalid(format!("{k} is not a known field")));
        }
        let int = |name: &str, range: std::ops::RangeInclusive<i64>| -> Result<Option<i64>, ApiError> {
            match obj.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_i64().filter(|a| range.contains(a)).map(Some).ok_or_else(|| {
                    ApiError::invalid(format!("{name} must be an integer from {} to {}", range.start(), range.end()))
                }),
            }
        };
        let available = int("available", 0..=MAX_STOCK)?;
        let expected = int("if_available", 0..=MAX_STOCK)?;
        let adjust = int("adjust", -MAX_STOCK..=MAX_STOCK)?;
        let amount = int("price", 0..=money::MAX_AMOUNT)?;
        if obj.contains_key("category") || obj.contains_key("tags") {
            return classify(&obj);
        }
        if obj.contains_key("purchase_limit") {
            let limit = int("purchase_limit", 0..=MAX_QTY as i64)?.ok_or_else(|| {
                ApiError::invalid(format!("purchase_limit must be an integer from 0 (no limit) to {MAX_QTY}"))
            })?;
            if obj.len() > 1 {
                return Err(ApiError::invalid("purchase_limit is changed on its own, without other fields"));
            }
            return Ok(Self::Limit(limit as u32));
        }
        let currency = match obj.get("currency") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => Some(Currency::parse(c.clone()).map_err(|e| ApiError::invalid(e.0))?),
            Some(_) => return Err(ApiError::invalid("currency must be a string (ISO 4217, e.g. \"EUR\")")),
        };
        let price = match (amount, currency) {
            (Some(a), Some(c)) => Some(Price::new(a, c).map_err(|e| ApiError::invalid(e.0))?),
            (Some(_), None) => return Err(ApiError::invalid("currency is required with price")),
            (None, Some(_)) => return Err(ApiError::invalid("price is required with currency")),
            (None, None) => None,
        };
        match (available, expected, adjust, price) {
            (Some(available), None, None, Some(price)) => Ok(Self::Seed { available, price }),
            (Some(_), None, None, None) => Err(ApiError::invalid(
                "price and currency are required with available to seed a new SKU (a live SKU's count changes \
                 with if_available or adjust)",
            )),
            (Some(available), Some(expected), None, None) => Ok(Self::Swap { available, expected }),
            (None, None, Some(0), None) => Err(ApiError::invalid("adjust must not be 0")),
            (None, None, Some(d), None) => Ok(Self::Adjust(d)),
            (None, None, None, Some(price)) => Ok(Self::Reprice(price)),
            (_, Some(_), _, Some(_)) | (_, _, Some(_), Some(_)) => Err(ApiError::invalid(
                "price and currency change a live SKU on their own, not with if_available or adjust",
            )),
            (None, Some(_), None, None) => Err(ApiError::invalid("if_available needs available")),
            (None, None, None, None) => Err(ApiError::invalid(
                "send available with price and currency (a new SKU), available with if_available, adjust, or \
                 price with currency",
            )),
            _ => Err(ApiError::invalid("send either available (with optional if_available) or adjust, not both")),
        }
    }
}

/// PUT /admin/skus/{sku}: the SKU, the `Idempotency-Key` (optional), then
/// the body, then the use case. The answer is the SKU as it is now, and
/// whether the key's change had been made before (a replay).
pub async fn put_stock<S: OrderStore + StockLedger>(
    store: &S,
    clock: &dyn Clock,
    ids: &dyn IdGen,
    sku: &str,
    idempotency_key: Option<&str>,
    by: String,
    body: &[u8],
) -> Result<(Value, bool), ApiError> {
    let sku = Sku::parse(sku).map_err(|e| ApiError::invalid(e.0))?;
    let key = idempotency_key.map(|k| IdempotencyKey::parse(k).map_err(|e| ApiError::invalid(e.0))).transpose()?;
    let change = StockChange::parse(body)?;
    let req = queries::StockRequest { change, key, by };
    let done = queries::put_stock(store, clock, ids, &sku, req).await?;
    Ok((views::stock(&done.stock), done.replayed))
}

/// POST /admin/buyers/{user_id}/points: `{"credit": N, "reason": "…"}`
/// under a required Idempotency-Key (an audited change of money's worth
/// is never made twice by a re-send).
pub async fn credit_points<S: crate::store::PointsLedger>(
    store: &S,
    clock: &dyn Clock,
    user: &str,
    idempotency_key: Option<&str>,
    by: String,
    body: &[u8],
) -> Result<(Value, bool), ApiError> {
    let user_id = UserId::parse(user).map_err(|e| ApiError::invalid(e.0))?;
    let key = idempotency_key
        .ok_or_else(|| ApiError::invalid("the Idempotency-Key header is required: a credit is applied once per key"))
        .and_then(|k| IdempotencyKey::parse(k).map_err(|e| ApiError::invalid(e.0)))?;
    let obj = json_object(body)?;
    reject_unknown(&obj, &["credit", "currency", "reason"], "")?;
    let currency = obj
        .get("currency")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("currency is required: the ISO 4217 code whose minor unit one point is worth"))
        .and_then(|c| Currency::parse(c).map_err(|e| ApiError::invalid(e.0)))?;
    let limit = crate::usecases::points::MAX_CREDIT;
    let delta =
        obj.get("credit").and_then(Value::as_i64).filter(|d| *d != 0 && (-limit..=limit).contains(d)).ok_or_else(
            || {
                ApiError::invalid(format!(
                    "credit is required: a whole number of points from -{limit} to {limit}, not 0 (negative takes \
                 points away)"
                ))
            },
        )?;
    let reason = obj
        .get("reason")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|r| (1..=200).contains(&r.chars().count()))
        .ok_or_else(|| ApiError::invalid("reason is required: 1 to 200 characters saying why (it is audited)"))?
        .to_owned();
    let req = crate::usecases::points::CreditRequest { user_id, currency, key, delta, reason, by };
    let (balance, replayed) = crate::usecases::points::credit_points(store, clock, req).await?;
    Ok((views::points_balance(&balance), replayed))
}

/// GET /admin/buyers/{user_id}/points: the balance and its credits.
pub async fn get_points<S: crate::store::PointsLedger>(store: &S, user: &str) -> Result<Value, ApiError> {
    let user_id = UserId::parse(user).map_err(|_| ApiError::not_found(format!("buyer {user}")))?;
    Ok(views::points(&crate::usecases::points::points_view(store, &user_id).await?))
}

/// PUT /admin/expiry-rules: `{"if_version"?: N, "default_seconds"?: S,
/// "rules": [{"sku" | "category" | "tag": X, "window_seconds": S}, …]}`.
pub async fn publish_expiry_rules<S: OrderStore + crate::store::ExpiryRuleStore>(
    store: &S,
    clock: &dyn Clock,
    by: String,
    body: &[u8],
) -> Result<Value, ApiError> {
    let obj = json_object(body)?;
    reject_unknown(&obj, &["if_version", "default_seconds", "rules"], "")?;
    let whole = |name: &str| -> Result<Option<u64>, ApiError> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| ApiError::invalid(format!("{name} must be a whole number"))),
        }
    };
    let (if_version, default_seconds) = (whole("if_version")?, whole("default_seconds")?);
    let raw = obj.get("rules").and_then(Value::as_array).ok_or_else(|| {
        ApiError::invalid("rules is required: an array of {\"sku\" | \"category\" | \"tag\": …, \"window_seconds\": N}")
    })?;
    let rules = raw.iter().enumerate().map(|(i, r)| expiry_rule(i, r)).collect::<Result<Vec<_>, _>>()?;
    let req = crate::usecases::expiry_rules::PublishRequest { if_version, default_seconds, rules, by };
    Ok(views::expiry_rules(&crate::usecases::expiry_rules::publish(store, clock, req).await?))
}

/// One rule: exactly one target (`sku`, `category` or `tag`) and its window.
fn expiry_rule(i: usize, raw: &Value) -> Result<crate::domain::expiry_rules::ExpiryRule, ApiError> {
    use crate::domain::expiry_rules::{ExpiryRule, Label, RuleTarget};
    let at = format!("rules[{i}]");
    let obj = raw.as_object().ok_or_else(|| ApiError::invalid(format!("{at} must be an object")))?;
    if let Some(k) = obj.keys().find(|k| !["sku", "category", "tag", "window_seconds"].contains(&k.as_str())) {
        return Err(ApiError::invalid(format!(
            "{at}: {k} is not a known field; a rule applies to one sku, category or tag"
        )));
    }
    let text =
        |k: &str| obj.get(k).map(|v| v.as_str().ok_or_else(|| ApiError::invalid(format!("{at}.{k} must be a string"))));
    let label = |k: &str, s: &str| Label::parse(s).map_err(|e| ApiError::invalid(format!("{at}.{k}: {}", e.0)));
    let targets: Vec<RuleTarget> = [
        text("sku").map(|s| {
            s.and_then(|s| {
                Sku::parse(s).map_err(|e| ApiError::invalid(format!("{at}.sku: {}", e.0))).map(RuleTarget::Sku)
            })
        }),
        text("category").map(|s| s.and_then(|s| label("category", s).map(RuleTarget::Category))),
        text("tag").map(|s| s.and_then(|s| label("tag", s).map(RuleTarget::Tag))),
    ]
    .into_iter()
    .flatten()
    .collect::<Result<_, _>>()?;
    let [applies_to] = <[RuleTarget; 1]>::try_from(targets)
        .map_err(|_| ApiError::invalid(format!("{at} must name exactly one of sku, category or tag")))?;
    let window_seconds = obj
        .get("window_seconds")
        .and_then(Value::as_u64)
        .ok_or_else(|| ApiError::invalid(format!("{at}.window_seconds is required: whole seconds")))?;
    Ok(ExpiryRule { applies_to, window_seconds })
}

/// GET /admin/expiry-rules (the version in force) and
/// GET /admin/expiry-rules/{version}.
pub async fn get_expiry_rules<S: OrderStore + crate::store::ExpiryRuleStore>(
    store: &S,
    version: Option<&str>,
) -> Result<Value, ApiError> {
    let set = match version {
        None => crate::usecases::expiry_rules::current(store).await?,
        Some(v) => {
            let n = v.parse::<u64>().map_err(|_| ApiError::not_found(format!("expiry rules version {v}")))?;
            crate::usecases::expiry_rules::version(store, n).await?
        }
    };
    Ok(views::expiry_rules(&set))
}

/// GET /admin/skus/{sku}; an id that cannot exist is simply not found.
pub async fn get_stock<S: OrderStore>(store: &S, sku: &str) -> Result<Value, ApiError> {
    let sku = Sku::parse(sku).map_err(|_| ApiError::not_found(format!("sku {sku}")))?;
    Ok(views::stock(&queries::get_stock(store, &sku).await?))
}

/// The body of PUT /admin/coupons/{coupon_id}.
fn new_coupon(coupon_id: &str, body: &[u8]) -> Result<NewCoupon, ApiError> {
    let coupon_id = CouponId::parse(coupon_id).map_err(|e| ApiError::invalid(e.0))?;
    let obj = json_object(body)?;
    let user_id = obj
        .get("user_id")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("user_id is required and must be a string"))
        .and_then(|u| UserId::parse(u).map_err(|e| ApiError::invalid(e.0)))?;
    let valid_until = obj
        .get("valid_until")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("valid_until is required (RFC 3339, e.g. 2030-01-01T00:00:00Z)"))
        .and_then(|t| Timestamp::parse(t).map_err(|e| ApiError::invalid(format!("valid_until: {e}"))))?;
    let returnable = match obj.get("returnable") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid("returnable must be true or false")),
    };
    if let Some(k) = obj.keys().find(|k| !["user_id", "valid_until", "returnable"].contains(&k.as_str())) {
        return Err(ApiError::invalid(format!("{k} is not a known field")));
    }
    Ok(NewCoupon { coupon_id, user_id, valid_until, returnable })
}

/// PUT /admin/coupons/{coupon_id}.
pub async fn put_coupon<S: OrderStore>(store: &S, coupon_id: &str, body: &[u8]) -> Result<Value, ApiError> {
    let new = new_coupon(coupon_id, body)?;
    Ok(views::coupon(&queries::put_coupon(store, new).await?))
}

/// GET /admin/coupons/{coupon_id}; an id that cannot exist is not found.
pub async fn get_coupon<S: OrderStore>(store: &S, coupon_id: &str) -> Result<Value, ApiError> {
    let id = CouponId::parse(coupon_id).map_err(|_| ApiError::not_found(format!("coupon {coupon_id}")))?;
    Ok(views::coupon(&queries::get_coupon(store, &id).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn list_refusal(pairs: &[(&str, &str)]) -> String {
        match ListQuery::parse(&params(pairs)) {
            Err(ApiError::Refused { code: "invalid_request", message, .. }) => message,
            other => panic!("expected invalid_request for {pairs:?}, got {other:?}"),
        }
    }

    #[test]
    fn a_list_query_takes_a_status_a_limit_and_a_cursor_issued_for_the_same_filter() {
        let q = ListQuery::parse(&[]).unwrap();
        assert_eq!((q.status, q.limit, q.after), (None, DEFAULT_PAGE, None));
        let key: crate::store::DueCursor =
            [("user_id", "u1"), ("created_at", "2026-12-04T10:00:00.000Z"), ("pk", "ORDER#o"), ("sk", "ORDER")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into();
        let cursor = encode_cursor(Some(OrderStatus::Closed), key.clone());
        let q = ListQuery::parse(&params(&[("status", "CLOSED"), ("limit", "100"), ("cursor", &cursor)])).unwrap();
        assert_eq!((q.status, q.limit, q.after), (Some(OrderStatus::Closed), 100, Some(key)));
        // Bound to its filter.
        assert!(list_refusal(&[("cursor", &cursor)]).contains("another status filter"));
        assert!(list_refusal(&[("status", "PAID"), ("cursor", &cursor)]).contains("another status filter"));
    }

    #[test]
    fn a_bad_list_query_is_refused_by_name() {
        assert!(list_refusal(&[("page", "2")]).contains("page is not a known query parameter"));
        assert!(list_refusal(&[("limit", "5"), ("limit", "6")]).contains("limit may be given once"));
        assert!(list_refusal(&[("status", "OPEN")]).contains("must be one of PENDING_PAYMENT"));
        for limit in ["0", "101", "-1", "ten", "1.5", ""] {
            assert!(list_refusal(&[("limit", limit)]).contains("limit must be an integer from 1 to 100"), "{limit}");
        }
        // Shaped by hand: only a key of the buyer index is a cursor.
        let key = |pairs: &[(&str, &str)]| -> String {
            let key: crate::store::DueCursor = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            encode_cursor(None, key)
        };
        let whole =
            [("user_id", "u1"), ("created_at", "2026-12-04T10:00:00.000Z"), ("pk", "ORDER#o1"), ("sk", "ORDER")];
        assert!(ListQuery::parse(&params(&[("cursor", &key(&whole))])).is_ok());
        let refund_sk = [whole[0], whole[1], whole[2], ("sk", "REFUND#pay_1")];
        assert!(ListQuery::parse(&params(&[("cursor", &key(&refund_sk))])).is_ok());
        for bad in [
            key(&whole[..1]),
            key(&[whole[0], whole[1], whole[2], whole[3], ("x", "y")]),
            key(&[whole[0], ("created_at", ""), whole[2], whole[3]]),
            key(&[whole[0], whole[1], ("pk", "SKU#A"), whole[3]]),
            key(&[whole[0], whole[1], (whole[2].0, &format!("ORDER#{}", "o".repeat(3000))), whole[3]]),
            key(&[whole[0], whole[1], whole[2], ("sk", "STOCK")]),
        ] {
            assert!(list_refusal(&[("cursor", &bad)]).contains("cursor is malformed"), "{bad}");
        }
        let not_json = hex::encode(b"not json");
        let v2 = hex::encode(br#"{"v":2,"status":null,"key":{}}"#);
        let extra = hex::encode(br#"{"v":1,"status":null,"key":{},"offset":40}"#);
        for cursor in ["zz", "abc", not_json.as_str(), v2.as_str(), extra.as_str()] {
            assert!(list_refusal(&[("cursor", cursor)]).contains("cursor is malformed"), "{cursor}");
        }
    }
    use crate::store::Stock;
    use crate::usecases::create_order::amount_total;
    use crate::usecases::UseCaseError;

    fn u() -> UserId {
        UserId::parse("u").unwrap()
    }

    fn err(body: &str) -> String {
        match CreateOrderRequest::parse(&u(), body.as_bytes()) {
            Err(ApiError::Refused { message, .. }) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn req(body: &str) -> CreateOrderRequest {
        CreateOrderRequest::parse(&u(), body.as_bytes()).unwrap()
    }

    fn stock(sku: &str, price: Option<(i64, &str)>) -> Stock {
        Stock {
            sku: Sku::parse(sku).unwrap(),
            available: 10,
            reserved: 0,
            sold: 0,
            price: price.map(|p| p.0),
            currency: price.map(|p| Currency::parse(p.1).unwrap()),
            supplied: 10,
            changes: 1,
            purchase_limit: None,
            category: None,
            tags: vec![],
        }
    }

    fn refusal(r: Result<Vec<OrderLine>, UseCaseError>) -> (&'static str, String) {
        match r {
            Err(UseCaseError::Conflict { code, message }) => (code, message),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn validation_errors_name_the_field() {
        assert!(err("{").contains("not valid JSON"));
        assert!(err(r#"{"currency":"EUR","items":[]}"#).contains("items"));
        assert!(err(r#"{"user_id":"u","currency":"eur","items":[]}"#).contains("currency"));
        assert!(err(r#"{"user_id":"u","currency":"EUR","items":[]}"#).contains("items"));
        assert!(err(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":0,"unit_price":1}]}"#)
            .contains("items[0].qty"));
        assert!(err(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":1.5}]}"#)
            .contains("items[0].unit_price"));
        assert!(err(r#"{"currency":"EUR","items":[{"sku":"a","qty":1},{"sku":"b","qty":1,"unit_price":-1}]}"#)
            .contains("items[1].unit_price"));
        assert!(err(r#"{"currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":"12.99"}]}"#)
            .contains("items[0].unit_price"));
        assert!(err(r#"{"currency":"EUR","items":[{"sku":"a","qty":1000,"unit_price":1000000000000}]}"#)
            .contains("items[0].line total"));
        assert!(err(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":1}],"x":1}"#)
            .contains("x is not a known field"));
        assert!(err(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":1},{"sku":"a","qty":1,"unit_price":1}]}"#)
            .contains("items[1].sku"));
    }

    #[test]
    fn the_unit_price_is_an_optional_guard() {
        let r = req(
            r#"{"currency":"EUR","items":[{"sku":"a","qty":1},{"sku":"b","qty":2,"unit_price":7},{"sku":"c","qty":1,"unit_price":null}]}"#,
        );
        let guards: Vec<_> = r.items.iter().map(|l| l.unit_price).collect();
        assert_eq!(guards, [None, Some(7), None]);
    }

    #[test]
    fn lines_take_the_catalog_price_and_a_guard_must_match_it() {
        let catalog = [stock("a", Some((500, "EUR"))), stock("b", Some((700, "EUR")))];
        let lines = req(r#"{"currency":"EUR","items":[{"sku":"a","qty":2},{"sku":"b","qty":1,"unit_price":700}]}"#)
            .price_lines(&catalog)
            .unwrap();
        assert_eq!(
            lines.iter().map(|l| (l.sku.as_str(), l.qty, l.unit_price)).collect::<Vec<_>>(),
            [("a", 2, 500), ("b", 1, 700)]
        );
        assert_eq!(amount_total(&lines).unwrap(), 1700);
        // A buyer-sent 0 is a guard like any other: it does not set the price.
        let (code, message) =
            refusal(req(r#"{"currency":"EUR","items":[{"sku":"b","qty":1,"unit_price":0}]}"#).price_lines(&catalog));
        assert_eq!(code, "price_changed");
        assert!(message.contains("sku b") && message.contains("700 EUR") && message.contains("not the 0"), "{message}");
    }

    #[test]
    fn a_sku_that_cannot_be_priced_is_refused_with_its_reason() {
        let catalog = [stock("eur", Some((500, "EUR"))), stock("usd", Some((500, "USD"))), stock("none", None)];
        let code = |body: &str| refusal(req(body).price_lines(&catalog));
        let (c, m) = code(r#"{"currency":"EUR","items":[{"sku":"eur","qty":1},{"sku":"usd","qty":1}]}"#);
        assert_eq!(c, "currency_mismatch");
        assert!(m.contains("sku usd") && m.contains("USD"), "{m}");
        let (c, m) = code(r#"{"currency":"EUR","items":[{"sku":"none","qty":1}]}"#);
        assert_eq!(c, "not_for_sale");
        assert!(m.contains("sku none"), "{m}");
        let (c, m) = code(r#"{"currency":"EUR","items":[{"sku":"gone","qty":1}]}"#);
        assert_eq!(c, "out_of_stock");
        assert!(m.contains("sku gone"), "{m}");
    }

    #[test]
    fn the_hash_ignores_formatting_but_not_content() {
        let a = req(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":5}]}"#);
        let b = req(
            "{ \"items\": [ {\"unit_price\":5, \"qty\":1, \"sku\":\"a\"} ], \"currency\":\"EUR\", \"user_id\":\"u\" }",
        );
        let c = req(r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":2,"unit_price":5}]}"#);
        let no_guard = req(r#"{"currency":"EUR","items":[{"sku":"a","qty":1}]}"#);
        let null_guard = req(r#"{"currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":null}]}"#);
        assert_eq!(a.request_hash(), b.request_hash());
        assert_ne!(a.request_hash(), c.request_hash());
        assert_ne!(a.request_hash(), no_guard.request_hash());
        assert_eq!(no_guard.request_hash(), null_guard.request_hash());
    }

    #[test]
    fn the_hash_does_not_depend_on_the_order_of_the_lines() {
        let ab = req(
            r#"{"user_id":"u","currency":"EUR","items":[{"sku":"a","qty":1,"unit_price":5},{"sku":"b","qty":2,"unit_price":7}]}"#,
        );
        let ba = req(
            r#"{"user_id":"u","currency":"EUR","items":[{"sku":"b","qty":2,"unit_price":7},{"sku":"a","qty":1,"unit_price":5}]}"#,
        );
        let other = req(
            r#"{"user_id":"u","currency":"EUR","items":[{"sku":"b","qty":1,"unit_price":7},{"sku":"a","qty":2,"unit_price":5}]}"#,
        );
        assert_eq!(ab.request_hash(), ba.request_hash());
        assert_ne!(ab.request_hash(), other.request_hash());
    }

    fn eur(amount: i64) -> Price {
        Price::new(amount, Currency::parse("EUR").unwrap()).unwrap()
    }

    fn stock_err(body: &str) -> String {
        match StockChange::parse(body.as_bytes()) {
            Err(ApiError::Refused { code: "invalid_request", message, .. }) => message,
            other => panic!("expected invalid_request, got {other:?}"),
        }
    }

    #[test]
    fn the_stock_forms_parse() {
        let parse = |b: &str| StockChange::parse(b.as_bytes()).unwrap();
        assert_eq!(
            parse(r#"{"available": 5, "price": 1299, "currency": "EUR"}"#),
            StockChange::Seed { available: 5, price: eur(1299) }
        );
        assert_eq!(parse(r#"{"available": 5, "if_available": 3}"#), StockChange::Swap { available: 5, expected: 3 });
        assert_eq!(parse(r#"{"adjust": -2}"#), StockChange::Adjust(-2));
        assert_eq!(parse(r#"{"price": 0, "currency": "EUR"}"#), StockChange::Reprice(eur(0)));
    }

    #[test]
    fn every_refused_stock_form_names_its_field() {
        assert!(stock_err(r#"{"available": 5}"#).contains("price and currency are required"));
        assert!(stock_err(r#"{"available": 5, "price": 1}"#).contains("currency is required"));
        assert!(stock_err(r#"{"currency": "EUR"}"#).contains("price is required"));
        assert!(stock_err(r#"{"price": -1, "currency": "EUR"}"#).starts_with("price must be an integer"));
        assert!(stock_err(r#"{"price": 12.5, "currency": "EUR"}"#).starts_with("price must be an integer"));
        assert!(stock_err(r#"{"price": "1299", "currency": "EUR"}"#).starts_with("price must be an integer"));
        assert!(stock_err(r#"{"price": 1000000000001, "currency": "EUR"}"#).starts_with("price must be an integer"));
        assert!(stock_err(r#"{"price": 1, "currency": "eur"}"#).starts_with("currency must be"));
        assert!(stock_err(r#"{"price": 1, "currency": 978}"#).starts_with("currency must be"));
        assert!(
            stock_err(r#"{"price": 1, "currency": "EUR", "adjust": 1}"#).contains("not with if_available or adjust")
        );
        assert!(stock_err(r#"{"price": 1, "currency": "EUR", "available": 1, "if_available": 0}"#)
            .contains("not with if_available or adjust"));
        assert!(stock_err(r#"{"price": 1, "currency": "EUR", "cost": 1}"#).starts_with("cost is not a known field"));
        assert!(stock_err(r#"{"available": -1, "price": 1, "currency": "EUR"}"#).starts_with("available must be"));
        assert!(stock_err(r#"{"if_available": 1}"#).contains("if_available needs available"));
        assert!(stock_err(r#"{"adjust": 0}"#).starts_with("adjust must not be 0"));
        assert!(stock_err("{}").contains("price with currency"));
    }
}
