//! A fault layer for drills and tests: an SDK interceptor that lets a
//! request reach the service and then replaces its answer with a 500, as
//! if the response was lost after the write was applied (a cut
//! connection, an attempt timeout after the service committed). The SDK's
//! standard retry then sends the same request again, which is what the
//! code must survive on AWS: its own write, already applied, refusing the
//! re-send's condition.
//!
//! Dev only: the functions install it only when fault injection is active
//! and `FAULT_LOST_ANSWER_RATE` is set (`crate::faults`), never in a prod
//! stage; [`super::clients`] builds every service client with it then.

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextMut;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::{HttpResponse, Metadata};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::config_bag::ConfigBag;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Which calls lose their answer.
#[derive(Debug)]
enum Which {
    /// The next `n` calls of the operations.
    Next(AtomicUsize),
    /// Each call of the operations with this probability (a drill on a
    /// running stack: `FAULT_LOST_ANSWER_RATE`).
    Rate(f64),
}

/// Loses the answers of some calls of the named operations (e.g.
/// `UpdateItem`), and lets every other answer through.
#[derive(Debug, Clone)]
pub struct LostAnswers {
    operations: Arc<Vec<String>>,
    which: Arc<Which>,
    lost: Arc<AtomicUsize>,
}

/// The calls of each service whose answer a drill loses: the writes, where
/// a re-send of an applied request is what the code must recognise.
pub const DYNAMODB_WRITES: [&str; 5] = ["PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"];
pub const SQS_WRITES: [&str; 3] = ["SendMessage", "SendMessageBatch", "DeleteMessage"];
pub const SCHEDULER_WRITES: [&str; 2] = ["CreateSchedule", "DeleteSchedule"];
pub const EVENTBRIDGE_WRITES: [&str; 1] = ["PutEvents"];

impl LostAnswers {
    /// Loses the answers of the next `count` calls of `operation`.
    pub fn next(operation: impl Into<String>, count: usize) -> Self {
        Self {
            operations: Arc::new(vec![operation.into()]),
            which: Arc::new(Which::Next(AtomicUsize::new(count))),
            lost: Arc::default(),
        }
    }

    /// Loses the answer of each call of `operations` with probability `rate`.
    pub fn at_rate(operations: &[&str], rate: f64) -> Self {
        Self {
            operations: Arc::new(operations.iter().map(|o| (*o).to_owned()).collect()),
            which: Arc::new(Which::Rate(rate.clamp(0.0, 1.0))),
            lost: Arc::default(),
        }
    }

    /// How many answers were lost so far.
    pub fn lost(&self) -> usize {
        self.lost.load(Ordering::SeqCst)
    }

    fn take(&self) -> bool {
        match self.which.as_ref() {
            Which::Next(left) => left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok(),
            Which::Rate(rate) => rand::random::<f64>() < *rate,
        }
    }
}

impl Intercept for LostAnswers {
    fn name(&self) -> &'static str {
        "LostAnswers"
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let op = cfg.load::<Metadata>().map(|m| m.name().to_owned()).unwrap_or_default();
        if self.operations.contains(&op) && self.take() {
            self.lost.fetch_add(1, Ordering::SeqCst);
            // One line per lost answer: a drill counts them in the log.
            tracing::warn!(operation = %op, "fault injection: answer lost after the request reached the service");
            let body = r#"{"__type":"com.amazon.coral.service#InternalServerError","message":"answer lost (fault injection)"}"#;
            let mut lost = HttpResponse::new(500.try_into().expect("a valid status"), SdkBody::from(body));
            lost.headers_mut().insert("content-type", "application/x-amz-json-1.0");
            *context.response_mut() = lost;
        }
        Ok(())
    }
}
