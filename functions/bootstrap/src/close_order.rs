//! Close queue (SQS) → the close use case, with partial batch responses.
use aws_config::SdkConfig;
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::queue::SqsCloseReminders;
use order_core::aws::{dynamo::DynamoStore, env, seconds_env};
use order_core::channels::ConfiguredChannel;
use order_core::handlers::batch::{each_sqs_message_within, invocation_deadline, INVOCATION_MARGIN};
use order_core::handlers::close::close_message_until;
use order_core::ports::SystemClock;
use order_core::usecases::close_order::{CloseOrder, DEFAULT_CLOSE_BUDGET};

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let dynamo = order_core::aws::clients::dynamodb(config);
    let uc = CloseOrder {
        store: DynamoStore::from_env(dynamo.clone())?,
        channel: ConfiguredChannel::load(config, dynamo).await?,
        reminders: SqsCloseReminders::new(order_core::aws::clients::sqs(config), env("CLOSE_QUEUE_URL")?),
        clock: Box::new(SystemClock),
        lease: seconds_env("CLOSING_LEASE_SECONDS")?,
        not_found_grace: seconds_env("CHANNEL_NOT_FOUND_GRACE_SECONDS")?,
        budget: DEFAULT_CLOSE_BUDGET,
    };
    let uc = &uc;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        let owner = event.context.request_id.clone();
        let owner = &owner;
        // The batch shares one invocation: each message gets its share of
        // what is left before Lambda's deadline (less a margin to answer).
        let deadline = invocation_deadline(event.context.deadline, INVOCATION_MARGIN);
        Ok::<_, Error>(
            each_sqs_message_within(event.payload, deadline, |m, until| async move {
                close_message_until(uc, owner, m.body.as_deref().unwrap_or(""), Some(until)).await
            })
            .await,
        )
    }))
    .await
}
