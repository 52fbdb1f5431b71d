//! Stream- and queue-triggered handlers.

use super::batch::{decode_image, RecordError};
use crate::domain::{Order, OrderId, PaymentId};
use aws_lambda_events::event::dynamodb::EventRecord;

/// The order carried by a stream record's new image.
pub fn order_of(record: &EventRecord) -> Result<Order, RecordError> {
    decode_image(record.change.new_image.clone())
}

/// The order id and payment id of a refund record's new image.
pub fn refund_ids_of(record: &EventRecord) -> Result<(OrderId, PaymentId), RecordError> {
    #[derive(serde::Deserialize)]
    struct Ids {
        order_id: OrderId,
        payment_id: PaymentId,
    }
    let ids: Ids = decode_image(record.change.new_image.clone())?;
    Ok((ids.order_id, ids.payment_id))
}
