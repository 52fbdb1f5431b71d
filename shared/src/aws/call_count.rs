//! A measuring layer: an SDK interceptor that logs one line per request
//! attempt sent to AWS (`aws_call`, with the service, the operation and
//! the function), so that a run's requests per order can be counted from
//! the logs (`bench/count_requests.py`, BENCHMARKS.md "Requests and
//! invocations per order"). Every attempt is a request AWS bills, a retry
//! included, so attempts are what is counted, not operations.
//!
//! Off unless `COUNT_AWS_CALLS=1` (template parameter `CountAwsCalls`,
//! `COUNT_AWS_CALLS=1 infra/local.sh up`): it changes no request, but a
//! log line per call is log volume a production stack need not pay for.

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use std::sync::OnceLock;

/// Logs every request attempt of the client it is installed on.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallCount;

impl CallCount {
    /// `Some` when `COUNT_AWS_CALLS` is `1` or `true`, read once.
    pub fn from_env() -> Option<Self> {
        static ON: OnceLock<bool> = OnceLock::new();
        let on = *ON
            .get_or_init(|| matches!(std::env::var("COUNT_AWS_CALLS").as_deref().map(str::trim), Ok("1") | Ok("true")));
        on.then_some(Self)
    }
}

/// The function's name as Lambda gives it, so that the counts can be split
/// by function; empty outside Lambda.
fn function_name() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_default())
}

impl Intercept for CallCount {
    fn name(&self) -> &'static str {
        "CallCount"
    }

    fn read_before_transmit(
        &self,
        _: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let (service, operation) =
            cfg.load::<Metadata>().map(|m| (m.service().to_owned(), m.name().to_owned())).unwrap_or_default();
        tracing::info!(target: "aws_call", service = %service, operation = %operation, function = function_name(), "aws_call");
        Ok(())
    }
}
