//! Pending effects queue (filled by the sweep) → release or settle the
//! order as the table has it, or hand a refund back to the refund worker.
use aws_config::SdkConfig;
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::queue::SqsRefundRequests;
use order_core::aws::{dynamo::DynamoStore, env, scheduler::EventBridgeWakeUps};
use order_core::channels::ConfiguredChannel;
use order_core::handlers::batch::{invocation_deadline, INVOCATION_MARGIN};
use order_core::handlers::effects::pending_effects_batch;
use order_core::ports::SystemClock;
use order_core::usecases::pending_effects::{drive_pending_effect, EffectPorts};

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let dynamo = order_core::aws::clients::dynamodb(config);
    let store = DynamoStore::from_env(dynamo.clone())?;
    // A settle only deletes schedules: the target and role are never used.
    let wakeups = EventBridgeWakeUps::new(
        order_core::aws::clients::scheduler(config),
        env("SCHEDULE_GROUP")?,
        String::new(),
        String::new(),
    );
    let channel = ConfiguredChannel::load(config, dynamo).await?;
    let refunds = SqsRefundRequests::new(order_core::aws::clients::sqs(config), env("REFUND_QUEUE_URL")?);
    let ports =
        EffectPorts { store: &store, wakeups: &wakeups, channel: &channel, refunds: &refunds, clock: &SystemClock };
    let ports = &ports;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        // Each message gets its share of half of what is left before
        // Lambda's deadline; the other half is for the effects that ran
        // out of their share (a settle asking a slow channel), see
        // `pending_effects_batch`.
        let deadline = invocation_deadline(event.context.deadline, INVOCATION_MARGIN);
        Ok::<_, Error>(
            pending_effects_batch(event.payload, deadline, |effect, until| async move {
                drive_pending_effect(ports, &effect, Some(until)).await
            })
            .await,
        )
    }))
    .await
}
