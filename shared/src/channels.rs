//! The payment channels a deployment has, from its environment: the
//! sandbox when `SANDBOX_LEDGER_TABLE` names its ledger (dev stacks), and
//! Stripe when `STRIPE_SECRET_KEY_PARAMETER` names the SSM parameter of its
//! secret key. Each call goes to the channel the attempt was opened with.

use crate::aws::sandbox::SandboxChannel;
use crate::domain::Timestamp;
use crate::ports::{
    ChannelPayment, ChannelStatement, OpenedPayment, PaymentChannel, RefundResult, Statement, Unavailable,
};
use crate::store::PaymentAttempt;
use crate::stripe::{SecretKey, StripeChannel, StripeClient, StripeEnv, StripeSettings};
use async_trait::async_trait;

#[derive(Clone, Default)]
pub struct ConfiguredChannel {
    sandbox: Option<SandboxChannel>,
    stripe: Option<StripeChannel>,
}

impl ConfiguredChannel {
    /// Reads the environment (and, for Stripe, its key from SSM) once at
    /// cold start. A Stripe setting that is refused fails the init, naming it.
    pub async fn load(
        config: &aws_config::SdkConfig,
        dynamo: aws_sdk_dynamodb::Client,
    ) -> Result<Self, lambda_runtime::Error> {
        let sandbox = match std::env::var("SANDBOX_LEDGER_TABLE") {
            Ok(t) if !t.is_empty() => Some(SandboxChannel::new(dynamo, t)),
            _ => None,
        };
        let stripe = match std::env::var("STRIPE_SECRET_KEY_PARAMETER") {
            Ok(name) if !name.is_empty() => {
                let ssm = aws_sdk_ssm::Client::new(config);
                let key = SecretKey::new(crate::aws::ssm_text(&ssm, &name).await?);
                let settings = StripeSettings::from_env(&StripeEnv::from_process(), &key)
                    .map_err(|e| format!("Stripe channel settings: {e}"))?;
                Some(StripeChannel::new(StripeClient::new(settings.base_url.clone(), key), settings))
            }
            _ => None,
        };
        Ok(Self { sandbox, stripe })
    }

    pub fn sandbox(&self) -> Option<&SandboxChannel> {
        self.sandbox.as_ref()
    }

    pub fn stripe(&self) -> Option<&StripeChannel> {
        self.stripe.as_ref()
    }

    /// `None` when the deployment has no channel at all.
    pub fn any(&self) -> Option<&Self> {
        (self.sandbox.is_some() || self.stripe.is_some()).then_some(self)
    }

    fn for_attempt(&self, attempt: &PaymentAttempt, op: &'static str) -> Result<&dyn PaymentChannel, Unavailable> {
        let found: Option<&dyn PaymentChannel> = match attempt.channel.as_str() {
            "sandbox" => self.sandbox.as_ref().map(|c| c as &dyn PaymentChannel),
            crate::stripe::CHANNEL_NAME => self.stripe.as_ref().map(|c| c as &dyn PaymentChannel),
            _ => None,
        };
        // Reached only by a deployment that lost a channel its attempts
        // were opened with: an unknown answer, which holds the order and
        // releases nothing, until the channel is configured again.
        found.ok_or_else(|| {
            Unavailable::new(op, format!("channel {:?} is not configured on this deployment", attempt.channel.as_str()))
        })
    }
}

#[async_trait]
impl PaymentChannel for ConfiguredChannel {
    fn names(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if self.stripe.is_some() {
            names.push(crate::stripe::CHANNEL_NAME);
        }
        if self.sandbox.is_some() {
            names.push("sandbox");
        }
        names
    }
    async fn open(&self, attempt: &PaymentAttempt, merchant_id: &str) -> Result<OpenedPayment, Unavailable> {
        self.for_attempt(attempt, "open payment")?.open(attempt, merchant_id).await
    }
    async fn query(&self, attempt: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        self.for_attempt(attempt, "query payment")?.query(attempt).await
    }
    async fn cancel(&self, attempt: &PaymentAttempt) -> Result<ChannelPayment, Unavailable> {
        self.for_attempt(attempt, "close payment")?.cancel(attempt).await
    }
    async fn refund(&self, attempt: &PaymentAttempt, amount: i64, key: &str) -> Result<RefundResult, Unavailable> {
        self.for_attempt(attempt, "refund")?.refund(attempt, amount, key).await
    }
}

/// Every configured channel's statement, as one. Its window is the
/// narrowest of theirs, so no channel's older payment is taken as missing.
#[async_trait]
impl ChannelStatement for ConfiguredChannel {
    async fn statement(&self, now: Timestamp) -> Result<Statement, Unavailable> {
        let mut out = Statement::default();
        let parts: [Option<&dyn ChannelStatement>; 2] =
            [self.sandbox.as_ref().map(|c| c as &dyn ChannelStatement), self.stripe.as_ref().map(|c| c as _)];
        for part in parts.into_iter().flatten() {
            let s = part.statement(now).await?;
            out.since = match (out.since, s.since) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            out.lines.extend(s.lines);
        }
        Ok(out)
    }

    async fn statement_between(&self, since: Timestamp, until: Timestamp) -> Result<Statement, Unavailable> {
        let mut out = Statement { since: Some(since), until: Some(until), lines: Vec::new() };
        let parts: [Option<&dyn ChannelStatement>; 2] =
            [self.sandbox.as_ref().map(|c| c as &dyn ChannelStatement), self.stripe.as_ref().map(|c| c as _)];
        for part in parts.into_iter().flatten() {
            out.lines.extend(part.statement_between(since, until).await?.lines);
        }
        Ok(out)
    }
}
