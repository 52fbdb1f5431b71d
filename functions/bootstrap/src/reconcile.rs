//! Reconciliation, daily and on demand: returns the JSON report and emits
//! one metric per discrepancy kind.
use aws_config::SdkConfig;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::dynamo::DynamoStore;
use order_core::channels::ConfiguredChannel;
use order_core::handlers::reconcile::run_reconcile;
use order_core::ports::SystemClock;
use order_core::usecases::reconcile::Bounds;
use serde_json::Value;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let dynamo = order_core::aws::clients::dynamodb(config);
    let store = DynamoStore::from_env(dynamo.clone())?;
    let channel = ConfiguredChannel::load(config, dynamo).await?;
    let bounds = Bounds::from_env()?;
    let (store, ledger, bounds) = (&store, channel.any(), &bounds);
    lambda_runtime::run(service_fn(move |_: LambdaEvent<Value>| async move {
        run_reconcile(store, ledger, bounds, &SystemClock).await
    }))
    .await
}
