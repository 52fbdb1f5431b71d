//! A fault layer for drills and tests: an SDK interceptor that lets a
//! request reach the service and then replaces its answer with a 500, as
//! if the response was lost after the write was applied (a cut
//! connection, an attempt timeout after the service committed). The SDK's
//! standard retry then sends the same request again, which is what the
//! code must survive on AWS: its own write, already applied, refusing the
//! re-send's condition.
//!
//! Dev only: the functions install it only when fault injection is active
//! (`crate::faults`), never in a prod stage.

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextMut;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::{HttpResponse, Metadata};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::config_bag::ConfigBag;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Loses the answers of the next `count` calls of `operation` (e.g.
/// `UpdateItem`), then lets every answer through.
#[derive(Debug, Clone)]
pub struct LostAnswers {
    operation: String,
    left: Arc<AtomicUsize>,
    lost: Arc<AtomicUsize>,
}

impl LostAnswers {
    pub fn next(operation: impl Into<String>, count: usize) -> Self {
        Self { operation: operation.into(), left: Arc::new(AtomicUsize::new(count)), lost: Arc::default() }
    }

    /// How many answers were lost so far.
    pub fn lost(&self) -> usize {
        self.lost.load(Ordering::SeqCst)
    }

    fn take(&self) -> bool {
        self.left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
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
        if op == self.operation && self.take() {
            self.lost.fetch_add(1, Ordering::SeqCst);
            let body = r#"{"__type":"com.amazon.coral.service#InternalServerError","message":"answer lost (fault injection)"}"#;
            let mut lost = HttpResponse::new(500.try_into().expect("a valid status"), SdkBody::from(body));
            lost.headers_mut().insert("content-type", "application/x-amz-json-1.0");
            *context.response_mut() = lost;
        }
        Ok(())
    }
}
