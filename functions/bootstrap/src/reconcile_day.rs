//! The day run's coordinator: the daily schedule (yesterday) or an operator
//! (`{"day": "YYYY-MM-DD"}`, `orderctl reconcile --day`) → a run recorded
//! and its pieces on ReconcilePieceQueue. Answers with the run.
use aws_config::SdkConfig;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_core::aws::queue::SqsReconcilePieces;
use order_core::aws::{dynamo::DynamoStore, env};
use order_core::handlers::reconcile_day::{start_day_run, DayRequest};
use order_core::ports::{Clock, SystemClock};
use serde_json::Value;

pub async fn run(config: &SdkConfig) -> Result<(), Error> {
    let store = DynamoStore::from_env(order_core::aws::clients::dynamodb(config))?;
    let queue = SqsReconcilePieces::new(order_core::aws::clients::sqs(config), env("RECONCILE_PIECE_QUEUE_URL")?);
    let (store, queue) = (&store, &queue);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        let request = DayRequest::from_payload(event.payload)?;
        let now = SystemClock.now();
        let run = start_day_run(store, queue, request.day(now), store.shards().sweep_count, now).await?;
        Ok::<_, Error>(serde_json::to_value(&run)?)
    }))
    .await
}
