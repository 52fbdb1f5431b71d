//! The run's own subscriber of the order event bus, for the `relay-fails`
//! drill: a queue and a rule taking the events of the drill's buyers, made
//! before the traffic and removed when the run ends. The stack's example
//! subscriber (`infra/subscriber.yaml`) cannot serve: it takes one buyer's
//! events (`SUBSCRIBER_BUYER`, by user id), and the drill's orders belong
//! to `fault-relay-<run>-…` buyers. What the queue received is then checked
//! (`verify::check_final_events`): each drill order's final event arrived.

use crate::stack::Stack;
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::json;

pub struct RunSubscriber {
    pub queue_url: String,
    rule: String,
    bus: String,
}

/// Subscribes a new queue to the events of the buyers whose user id starts
/// with `user_prefix`. None when the stack names no event bus.
pub async fn subscribe(stack: &Stack, name: &str, user_prefix: &str) -> Result<Option<RunSubscriber>, String> {
    let Some(bus) = stack.get_opt("ORDER_EVENT_BUS_NAME") else { return Ok(None) };
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    let events = aws_sdk_eventbridge::Client::new(&stack.sdk);
    let failed = |what: &str, e: &dyn std::fmt::Display| format!("the run's event subscriber: {what}: {e}");
    let queue_url = sqs
        .create_queue()
        .queue_name(name)
        // Long enough for a long run's drain and check.
        .attributes(QueueAttributeName::MessageRetentionPeriod, "86400")
        .send()
        .await
        .map_err(|e| failed("creating its queue", &e))?
        .queue_url
        .ok_or("the run's event subscriber: CreateQueue answered no URL")?;
    let queue_arn = sqs
        .get_queue_attributes()
        .queue_url(&queue_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| failed("reading its queue's ARN", &e))?
        .attributes
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .ok_or("the run's event subscriber: the queue has no ARN")?;
    let rule_arn = events
        .put_rule()
        .name(name)
        .event_bus_name(bus)
        .event_pattern(
            json!({"source": ["order-expiry"], "detail": {"user_id": [{"prefix": user_prefix}]}}).to_string(),
        )
        .send()
        .await
        .map_err(|e| failed("creating its rule", &e))?
        .rule_arn
        .unwrap_or_default();
    // On AWS the bus may send to the queue only if the queue says so.
    let policy = json!({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Service": "events.amazonaws.com"}, "Action": "sqs:SendMessage",
        "Resource": queue_arn, "Condition": {"ArnEquals": {"aws:SourceArn": rule_arn}}}]});
    sqs.set_queue_attributes()
        .queue_url(&queue_url)
        .attributes(QueueAttributeName::Policy, policy.to_string())
        .send()
        .await
        .map_err(|e| failed("letting the bus send to its queue", &e))?;
    let target = aws_sdk_eventbridge::types::Target::builder()
        .id("loadcheck")
        .arn(queue_arn)
        .build()
        .map_err(|e| failed("describing its target", &e))?;
    events
        .put_targets()
        .rule(name)
        .event_bus_name(bus)
        .targets(target)
        .send()
        .await
        .map_err(|e| failed("pointing its rule at the queue", &e))?;
    Ok(Some(RunSubscriber { queue_url, rule: name.to_owned(), bus: bus.to_owned() }))
}

/// The name of the run's subscriber queue and rule.
pub fn name_for(run_id: &str) -> String {
    format!("lc-{run_id}-events")
}

/// Removes whatever a run that failed midway left of its subscriber (the
/// queue, the rule and its target, each possibly never made): a missing
/// part is not an error.
pub async fn remove_leftover(stack: &Stack, name: &str) -> Result<(), String> {
    use aws_sdk_eventbridge::operation::remove_targets::RemoveTargetsError;
    use aws_sdk_sqs::operation::get_queue_url::GetQueueUrlError;
    let failed = |what: &str, e: &dyn std::fmt::Display| format!("removing the run's event subscriber: {what}: {e}");
    if let Some(bus) = stack.get_opt("ORDER_EVENT_BUS_NAME") {
        let events = aws_sdk_eventbridge::Client::new(&stack.sdk);
        match events.remove_targets().rule(name).event_bus_name(bus).ids("loadcheck").send().await {
            Ok(_) => {}
            Err(e) if matches!(e.as_service_error(), Some(RemoveTargetsError::ResourceNotFoundException(_))) => {}
            Err(e) => return Err(failed("its target", &e)),
        }
        // Deleting a rule that is not there succeeds.
        events.delete_rule().name(name).event_bus_name(bus).send().await.map_err(|e| failed("its rule", &e))?;
    }
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    match sqs.get_queue_url().queue_name(name).send().await {
        Ok(out) => {
            let url = out.queue_url.unwrap_or_default();
            sqs.delete_queue().queue_url(url).send().await.map_err(|e| failed("its queue", &e))?;
        }
        Err(e) if matches!(e.as_service_error(), Some(GetQueueUrlError::QueueDoesNotExist(_))) => {}
        Err(e) => return Err(failed("finding its queue", &e)),
    }
    Ok(())
}

impl RunSubscriber {
    /// Removes the rule and the queue (a run leaves nothing behind on the
    /// stack; `--check` later says the queue is gone and skips that check).
    pub async fn remove(self, stack: &Stack) -> Result<(), String> {
        let events = aws_sdk_eventbridge::Client::new(&stack.sdk);
        let failed =
            |what: &str, e: &dyn std::fmt::Display| format!("removing the run's event subscriber: {what}: {e}");
        events
            .remove_targets()
            .rule(&self.rule)
            .event_bus_name(&self.bus)
            .ids("loadcheck")
            .send()
            .await
            .map_err(|e| failed("its target", &e))?;
        events
            .delete_rule()
            .name(&self.rule)
            .event_bus_name(&self.bus)
            .send()
            .await
            .map_err(|e| failed("its rule", &e))?;
        aws_sdk_sqs::Client::new(&stack.sdk)
            .delete_queue()
            .queue_url(&self.queue_url)
            .send()
            .await
            .map_err(|e| failed("its queue", &e))?;
        Ok(())
    }
}
