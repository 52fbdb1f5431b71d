//! The stack's dead-letter queues: depth, a peek at their messages, and
//! the redrive of the ones whose messages can go back to a source queue.
//!
//! Every redrivable message is safe to send again: the close use case, the
//! release/settle and the refund worker decide from the records, never from
//! the message. The redrive receives a batch from the DLQ, sends it to the
//! source queue and only then deletes it from the DLQ, so a failure in
//! between leaves a message in both places (handled twice, harmlessly),
//! never in neither.

use crate::error::{CliError, Result};
use crate::output::{bar, print_json, table};
use crate::settings::Stack;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName, QueueAttributeName,
    SendMessageBatchRequestEntry,
};
use serde::Serialize;

/// One dead-letter queue of the stack.
#[derive(Debug)]
pub struct Dlq {
    /// The name `orderctl` accepts (`close-dlq`).
    pub name: &'static str,
    /// Its stack output (`.local/stack.env` name).
    pub url_key: &'static str,
    /// Where its messages go back to, when they can.
    pub source_key: Option<&'static str>,
    /// What lands there.
    pub holds: &'static str,
    /// For a DLQ with no source: what to do instead of a redrive.
    pub instead: &'static str,
}

pub const DLQS: &[Dlq] = &[
    Dlq {
        name: "close-dlq",
        url_key: "CLOSE_DLQ_URL",
        source_key: Some("CLOSE_QUEUE_URL"),
        holds: "close reminders that failed 10 receives",
        instead: "",
    },
    Dlq {
        name: "wakeup-dlq",
        url_key: "WAKEUP_DLQ_URL",
        source_key: Some("CLOSE_QUEUE_URL"),
        holds: "wake-ups Scheduler could not deliver",
        instead: "",
    },
    Dlq {
        name: "refund-dlq",
        url_key: "REFUND_DLQ_URL",
        source_key: Some("REFUND_QUEUE_URL"),
        holds: "refunds out of automatic tries (REFUND_FAILED)",
        instead: "",
    },
    Dlq {
        name: "order-placed-dlq",
        url_key: "ORDER_PLACED_QUEUE_DLQ_URL",
        source_key: Some("ORDER_PLACED_QUEUE_URL"),
        holds: "wake-up scheduling messages that failed 10 receives",
        instead: "",
    },
    Dlq {
        name: "order-closed-dlq",
        url_key: "ORDER_CLOSED_QUEUE_DLQ_URL",
        source_key: Some("ORDER_CLOSED_QUEUE_URL"),
        holds: "release messages that failed 10 receives",
        instead: "",
    },
    Dlq {
        name: "order-paid-dlq",
        url_key: "ORDER_PAID_QUEUE_DLQ_URL",
        source_key: Some("ORDER_PAID_QUEUE_URL"),
        holds: "settle messages that failed 10 receives",
        instead: "",
    },
    Dlq {
        name: "pending-effects-dlq",
        url_key: "PENDING_EFFECTS_QUEUE_DLQ_URL",
        source_key: Some("PENDING_EFFECTS_QUEUE_URL"),
        holds: "pending effects (release, settle, refund re-drives) the sweep handed on that failed 10 receives \
                or never decoded",
        instead: "",
    },
    Dlq {
        name: "reconcile-piece-dlq",
        url_key: "RECONCILE_PIECE_DLQ_URL",
        source_key: Some("RECONCILE_PIECE_QUEUE_URL"),
        holds: "pieces of a day's reconciliation that failed 3 receives (the day's report names them missing)",
        instead: "",
    },
    Dlq {
        name: "event-delivery-dlq",
        url_key: "EVENT_DELIVERY_DLQ_URL",
        source_key: None,
        holds: "events the bus could not deliver to an effect queue",
        instead: "usually nothing: the sweep re-drives the effect from the table; each message names its order \
                  (detail.order_id) if you want to look (`orderctl order show ID`)",
    },
    Dlq {
        name: "sweep-dlq",
        url_key: "SWEEP_DLQ_URL",
        source_key: None,
        holds: "sweep runs Scheduler could not deliver",
        instead: "nothing: the next sweep run covers them; a growing queue means the sweep function is failing \
                  (read its logs)",
    },
    Dlq {
        name: "stream-failure",
        url_key: "STREAM_FAILURE_QUEUE_URL",
        source_key: None,
        holds: "metadata of stream records the relay gave up on",
        instead: "nothing to redrive (the record is not in the message): the sweep re-drives this stack's \
                  effects; tell outside subscribers which events were lost (the message names the sequence numbers)",
    },
    Dlq {
        name: "stream-dead-letter",
        url_key: "STREAM_DEAD_LETTER_QUEUE_URL",
        source_key: None,
        holds: "stream records that can never be processed",
        instead: "inspect the records (`orderctl stuck --peek 10`) and fix the writer; the backstop covers the \
                  orders' outcomes and effects",
    },
    Dlq {
        name: "reconcile-failure",
        url_key: "RECONCILE_FAILURE_QUEUE_URL",
        source_key: None,
        holds: "scheduled day runs (reconcile-day) that failed twice",
        instead: "fix the cause (the message holds the error), then run `orderctl reconcile --day YYYY-MM-DD` \
                  for the day it was to reconcile (yesterday of the failed run)",
    },
];

pub fn names() -> String {
    DLQS.iter().map(|d| d.name).collect::<Vec<_>>().join(", ")
}

pub fn find(name: &str) -> Result<&'static Dlq> {
    let wanted = name.trim().to_lowercase().replace('_', "-");
    DLQS.iter().find(|d| d.name == wanted).ok_or_else(|| {
        CliError::new(format!("no dead-letter queue called {name:?}"), format!("use one of: {}", names()))
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct Depth {
    pub queue: &'static str,
    pub url: Option<String>,
    /// Messages waiting (`ApproximateNumberOfMessages`).
    pub visible: u64,
    /// Messages someone has received and not yet deleted.
    pub in_flight: u64,
    pub peeked: Vec<Peeked>,
    /// Why the queue could not be read, if it could not.
    pub unavailable: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Peeked {
    pub message_id: String,
    pub sent_at: Option<String>,
    pub receive_count: Option<u64>,
    pub body: String,
}

pub async fn depth(sqs: &aws_sdk_sqs::Client, stack: &Stack, dlq: &'static Dlq, peek: i32) -> Depth {
    let Some(url) = stack.opt(dlq.url_key) else {
        return Depth {
            queue: dlq.name,
            url: None,
            visible: 0,
            in_flight: 0,
            peeked: vec![],
            unavailable: Some(format!("{} is not among the stack's outputs (redeploy the template)", dlq.url_key)),
        };
    };
    let mut d = Depth {
        queue: dlq.name,
        url: Some(url.to_owned()),
        visible: 0,
        in_flight: 0,
        peeked: vec![],
        unavailable: None,
    };
    match counts(sqs, url).await {
        Ok((visible, in_flight)) => (d.visible, d.in_flight) = (visible, in_flight),
        Err(e) => {
            d.unavailable = Some(e.what);
            return d;
        }
    }
    if peek > 0 && d.visible > 0 {
        match peek_at(sqs, url, peek).await {
            Ok(p) => d.peeked = p,
            Err(e) => d.unavailable = Some(e.what),
        }
    }
    d
}

async fn counts(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<(u64, u64)> {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .map_err(|e| CliError::aws(&format!("reading the depth of {url}"), e))?;
    let get =
        |n: QueueAttributeName| out.attributes().and_then(|a| a.get(&n)).and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok((
        get(QueueAttributeName::ApproximateNumberOfMessages),
        get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    ))
}

/// Receives up to `n` messages with a visibility timeout of 0: they stay
/// visible, so a peek hides nothing from a redrive. (Each peek counts as a
/// receive; the DLQs have no redrive policy of their own, so that moves
/// nothing.)
async fn peek_at(sqs: &aws_sdk_sqs::Client, url: &str, n: i32) -> Result<Vec<Peeked>> {
    let out = sqs
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(n.clamp(1, 10))
        .visibility_timeout(0)
        .wait_time_seconds(0)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await
        .map_err(|e| CliError::aws(&format!("peeking at {url}"), e))?;
    Ok(out.messages().iter().map(peeked).collect())
}

fn peeked(m: &Message) -> Peeked {
    let attr = |n: MessageSystemAttributeName| m.attributes().and_then(|a| a.get(&n)).cloned();
    Peeked {
        message_id: m.message_id().unwrap_or("").to_owned(),
        sent_at: attr(MessageSystemAttributeName::SentTimestamp)
            .and_then(|ms| ms.parse().ok())
            .map(|ms| order_core::domain::Timestamp::from_unix_millis(ms).to_string()),
        receive_count: attr(MessageSystemAttributeName::ApproximateReceiveCount).and_then(|c| c.parse().ok()),
        body: m.body().unwrap_or("").to_owned(),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Redriven {
    pub queue: &'static str,
    pub from: String,
    pub to: String,
    pub moved: u64,
    /// Sent but not deleted, or not sent: they are back in the DLQ once
    /// their visibility timeout ends.
    pub failed: u64,
}

/// How long a received batch stays hidden in the DLQ while it is sent on.
const IN_FLIGHT_SECONDS: i32 = 120;

pub async fn redrive(stack: &Stack, name: &str, max: Option<u64>, json_out: bool) -> Result<()> {
    let dlq = find(name)?;
    let Some(source_key) = dlq.source_key else {
        return Err(CliError::new(
            format!("{} ({}) has no source queue to redrive to", dlq.name, dlq.holds),
            dlq.instead,
        ));
    };
    let from = stack.get(dlq.url_key)?.to_owned();
    let to = stack.get(source_key)?.to_owned();
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    let (waiting, _) = counts(&sqs, &from).await?;
    let limit = max.unwrap_or(u64::MAX);
    let pb = bar(json_out, waiting.min(limit), format!("{} → {}", dlq.name, short(&to)));
    let mut result = Redriven { queue: dlq.name, from: from.clone(), to: to.clone(), moved: 0, failed: 0 };
    let mut empty_polls = 0;
    while result.moved + result.failed < limit {
        let room = (limit - result.moved - result.failed).min(10) as i32;
        let got = sqs
            .receive_message()
            .queue_url(&from)
            .max_number_of_messages(room)
            .visibility_timeout(IN_FLIGHT_SECONDS)
            .wait_time_seconds(1)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| CliError::aws(&format!("receiving from {}", dlq.name), e))?;
        let messages = got.messages();
        if messages.is_empty() {
            // SQS may answer empty while messages remain (short polling
            // samples servers): stop after two empty polls in a row.
            empty_polls += 1;
            if empty_polls >= 2 {
                break;
            }
            continue;
        }
        empty_polls = 0;
        let (moved, failed) = move_batch(&sqs, &from, &to, messages).await?;
        result.moved += moved;
        result.failed += failed;
        if pb.length().is_some_and(|len| result.moved + result.failed > len) {
            pb.set_length(result.moved + result.failed);
        }
        pb.set_position(result.moved + result.failed);
    }
    pb.finish_and_clear();
    if json_out {
        print_json(&result)?;
    } else {
        println!("moved {} message(s) from {} to {}", result.moved, dlq.name, short(&to));
        if result.failed > 0 {
            println!(
                "{} message(s) could not be moved; they reappear in {} within {IN_FLIGHT_SECONDS}s: run the \
                 redrive again",
                result.failed, dlq.name
            );
        }
    }
    if result.failed > 0 {
        return Err(CliError::new(format!("{} message(s) not moved", result.failed), "run the redrive again"));
    }
    Ok(())
}

/// Sends one received batch to `to`, then deletes what was sent from `from`.
async fn move_batch(sqs: &aws_sdk_sqs::Client, from: &str, to: &str, messages: &[Message]) -> Result<(u64, u64)> {
    let entries: Vec<SendMessageBatchRequestEntry> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(m.body().unwrap_or(""))
                .set_message_attributes(m.message_attributes().cloned())
                .build()
                .expect("id and body are set")
        })
        .collect();
    let sent = sqs
        .send_message_batch()
        .queue_url(to)
        .set_entries(Some(entries))
        .send()
        .await
        .map_err(|e| CliError::aws("sending to the source queue", e))?;
    let deletes: Vec<DeleteMessageBatchRequestEntry> = sent
        .successful()
        .iter()
        .filter_map(|ok| {
            let m = messages.get(ok.id().parse::<usize>().ok()?)?;
            DeleteMessageBatchRequestEntry::builder().id(ok.id()).receipt_handle(m.receipt_handle()?).build().ok()
        })
        .collect();
    let mut failed = sent.failed().len() as u64;
    if deletes.is_empty() {
        return Ok((0, failed));
    }
    let deleted = sqs
        .delete_message_batch()
        .queue_url(from)
        .set_entries(Some(deletes))
        .send()
        .await
        .map_err(|e| CliError::aws("deleting moved messages from the DLQ", e))?;
    failed += deleted.failed().len() as u64;
    Ok((deleted.successful().len() as u64, failed))
}

/// The queue's name from its URL.
pub fn short(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

pub fn print_depths(depths: &[Depth]) {
    let mut t = table(&["dead-letter queue", "waiting", "in flight", "note"]);
    for d in depths {
        t.add_row(vec![
            d.queue.to_owned(),
            d.visible.to_string(),
            d.in_flight.to_string(),
            d.unavailable.clone().unwrap_or_default(),
        ]);
    }
    println!("{t}");
    for d in depths.iter().filter(|d| !d.peeked.is_empty()) {
        println!("peek at {}:", d.queue);
        let mut t = table(&["sent at", "receives", "body"]);
        for p in &d.peeked {
            let body: String = p.body.chars().take(160).collect();
            t.add_row(vec![
                p.sent_at.clone().unwrap_or_default(),
                p.receive_count.map(|c| c.to_string()).unwrap_or_default(),
                body,
            ]);
        }
        println!("{t}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_are_forgiving_and_an_unknown_one_lists_the_valid_ones() {
        assert_eq!(find("close-dlq").unwrap().url_key, "CLOSE_DLQ_URL");
        assert_eq!(find("CLOSE_DLQ").unwrap().name, "close-dlq");
        let e = find("closedlq").unwrap_err();
        assert!(e.todo.contains("close-dlq") && e.todo.contains("refund-dlq"), "{e}");
    }

    #[test]
    fn every_redrivable_dlq_has_a_source_and_every_other_says_what_to_do() {
        for d in DLQS {
            assert_eq!(d.source_key.is_some(), d.instead.is_empty(), "{}", d.name);
        }
    }
}
