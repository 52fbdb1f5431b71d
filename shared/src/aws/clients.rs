//! The service clients every function builds at cold start, from the one
//! [`super::sdk_config`]. With the `lost-response` drill on
//! ([`crate::faults::lost_answer_rate`], dev only), each client loses the
//! answers of that share of its write calls ([`super::lost_answers`]).
//! With `COUNT_AWS_CALLS=1` each client logs every request it sends
//! ([`super::call_count`]), to count requests per order.

use super::call_count::CallCount;
use super::lost_answers::{LostAnswers, DYNAMODB_WRITES, EVENTBRIDGE_WRITES, SCHEDULER_WRITES, SQS_WRITES};
use aws_config::SdkConfig;
use tracing::warn;

fn drill(service: &str, writes: &[&str]) -> Option<LostAnswers> {
    let rate = crate::faults::lost_answer_rate()?;
    warn!(service, rate, "fault injection: this share of write answers is lost (lost-response drill)");
    Some(LostAnswers::at_rate(writes, rate))
}

pub fn dynamodb(config: &SdkConfig) -> aws_sdk_dynamodb::Client {
    let mut conf = aws_sdk_dynamodb::config::Builder::from(config);
    if let Some(lost) = drill("dynamodb", &DYNAMODB_WRITES) {
        conf = conf.interceptor(lost);
    }
    if let Some(count) = CallCount::from_env() {
        conf = conf.interceptor(count);
    }
    aws_sdk_dynamodb::Client::from_conf(conf.build())
}

pub fn sqs(config: &SdkConfig) -> aws_sdk_sqs::Client {
    let mut conf = aws_sdk_sqs::config::Builder::from(config);
    if let Some(lost) = drill("sqs", &SQS_WRITES) {
        conf = conf.interceptor(lost);
    }
    if let Some(count) = CallCount::from_env() {
        conf = conf.interceptor(count);
    }
    aws_sdk_sqs::Client::from_conf(conf.build())
}

pub fn scheduler(config: &SdkConfig) -> aws_sdk_scheduler::Client {
    let mut conf = aws_sdk_scheduler::config::Builder::from(config);
    if let Some(lost) = drill("scheduler", &SCHEDULER_WRITES) {
        conf = conf.interceptor(lost);
    }
    if let Some(count) = CallCount::from_env() {
        conf = conf.interceptor(count);
    }
    aws_sdk_scheduler::Client::from_conf(conf.build())
}

pub fn eventbridge(config: &SdkConfig) -> aws_sdk_eventbridge::Client {
    let mut conf = aws_sdk_eventbridge::config::Builder::from(config);
    if let Some(lost) = drill("eventbridge", &EVENTBRIDGE_WRITES) {
        conf = conf.interceptor(lost);
    }
    if let Some(count) = CallCount::from_env() {
        conf = conf.interceptor(count);
    }
    aws_sdk_eventbridge::Client::from_conf(conf.build())
}
