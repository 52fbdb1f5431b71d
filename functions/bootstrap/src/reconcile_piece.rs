//! ReconcilePieceQueue → one piece of a day's run each: read, check, store
//! the piece's report, merge the day's once the last piece is in.
use aws_config::SdkConfig;
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::dynamo::DynamoStore;
use order_core::channels::ConfiguredChannel;
use order_core::handlers::reconcile_day::piece_batch;
use order_core::ports::{Clock, SystemClock};
use order_core::usecases::reconcile::Bounds;
use order_core::usecases::reconcile_day::DayPorts;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let dynamo = order_core::aws::clients::dynamodb(config);
    let store = DynamoStore::from_env(dynamo.clone())?;
    let channel = ConfiguredChannel::load(config, dynamo).await?;
    let ports = DayPorts {
        index: &store,
        channel: channel.any(),
        bounds: Bounds::from_env()?,
        shards: store.shards().sweep_count,
    };
    let (ports, store) = (&ports, &store);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<_, Error>(piece_batch(ports, store, event.payload, SystemClock.now()).await)
    }))
    .await
}
