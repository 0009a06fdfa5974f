//! Durable pull consumers with one mapping from a handler's outcome to the
//! broker: done → ack, retry later → nak with delay, poison → dead-letter
//! and term. Long handlers keep their message with in-progress acks; the
//! last allowed delivery of a retried message is dead-lettered rather than
//! dropped silently.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, AckKind, consumer::PullConsumer};
use futures::StreamExt as _;
use tracing::Instrument as _;

use crate::bus::{BACKOFF, HeaderExtractor, Topic, Topology};
use crate::shutdown::CancellationToken;

/// What became of a message.
#[derive(Debug)]
pub enum Disposition {
    Done,
    /// Try again after the delay (a dependency was unavailable). Counts
    /// against the consumer's delivery limit.
    Retry(Duration),
    /// Not an error, just not yet (a post slot, another worker's lease, a
    /// reconciliation read): the worker keeps the message (in-progress acks)
    /// and runs the handler again after the delay, without spending a
    /// delivery. Bounded by [`MAX_DEFER`], after which it becomes a retry.
    /// Never going to work (undecodable, contract violation): dead-letter it.
    Poison(String),
    Defer(Duration),
}

/// Longest a message is held through `Defer`s before it is nak'ed.
pub const MAX_DEFER: Duration = Duration::from_secs(15 * 60);

/// Pulls `topic` with the topology's durable consumer and runs `handler` on
/// up to `concurrency` messages at a time until `shutdown`; in-flight
/// handlers finish before this returns.
pub async fn run<H, F>(
    js: jetstream::Context,
    topology: Topology,
    topic: Topic,
    concurrency: usize,
    shutdown: CancellationToken,
    handler: H,
) -> anyhow::Result<()>
where
    H: Fn(jetstream::Message) -> F + Send + Sync + 'static,
    F: Future<Output = Disposition> + Send + 'static,
{
    let stream = js
        .get_stream(topology.stream(topic))
        .await
        .with_context(|| format!("opening stream {}", topology.stream(topic)))?;
    let consumer: PullConsumer = stream
        .get_consumer(topic.consumer())
        .await
        .map_err(|e| anyhow::anyhow!("opening consumer {}: {e}", topic.consumer()))?;
    spawn_lag_sampler(
        stream,
        consumer.clone(),
        topic.consumer().to_owned(),
        shutdown.clone(),
    );
    let handler = Arc::new(handler);
    let messages = consumer.messages().await.context("pulling messages")?;
    let dlq = topology.dead_letter_subject(topic);
    let progress_every = topology.progress_every();
    messages
        .take_until(shutdown.clone().cancelled_owned())
        .for_each_concurrent(concurrency, |msg| {
            let (handler, js, dlq, stop) =
                (handler.clone(), js.clone(), dlq.clone(), shutdown.clone());
            async move {
                let msg = match msg {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(error = %e, "pulling a message failed");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        return;
                    }
                };
                handle_one(msg, &*handler, &js, &dlq, progress_every, &stop).await;
            }
        })
        .await;
    Ok(())
}

/// How often a worker reports its consumer's lag.
const LAG_EVERY: Duration = Duration::from_secs(5);

/// Reports the consumer's backlog as gauges until `shutdown`: messages not
/// yet delivered, delivered but unacknowledged, redelivered, and the age of
/// the oldest message still in the (work-queue) stream.
fn spawn_lag_sampler(
    stream: jetstream::stream::Stream,
    consumer: PullConsumer,
    name: String,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            if let Ok(info) = consumer.get_info().await {
                metrics::gauge!("threadline_consumer_pending_messages", "consumer" => name.clone())
                    .set(info.num_pending as f64);
                metrics::gauge!("threadline_consumer_ack_pending_messages", "consumer" => name.clone())
                    .set(info.num_ack_pending as f64);
                metrics::gauge!("threadline_consumer_redelivered_messages", "consumer" => name.clone())
                    .set(info.num_redelivered as f64);
            }
            if let Ok(info) = stream.get_info().await {
                let age = if info.state.messages == 0 {
                    0.0
                } else {
                    (time::OffsetDateTime::now_utc() - info.state.first_timestamp)
                        .as_seconds_f64()
                        .max(0.0)
                };
                metrics::gauge!("threadline_consumer_oldest_message_age_seconds", "consumer" => name.clone())
                    .set(age);
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(LAG_EVERY) => {}
            }
        }
    });
}

async fn handle_one<H, F>(
    msg: jetstream::Message,
    handler: &H,
    js: &jetstream::Context,
    dlq: &str,
    progress_every: Duration,
    shutdown: &CancellationToken,
) where
    H: Fn(jetstream::Message) -> F,
    F: Future<Output = Disposition>,
{
    let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
    let span = tracing::info_span!(
        "bus.consume",
        subject = %msg.subject,
        delivered,
        trace_id = tracing::field::Empty
    );
    if let Some(headers) = &msg.headers {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let parent = opentelemetry::global::get_text_map_propagator(|p| {
            p.extract(&HeaderExtractor(headers))
        });
        let _ = span.set_parent(parent);
    }
    crate::telemetry::record_trace_id(&span);
    // Keep the message ours while the handler works.
    let (acker_msg, progress_stop) = (msg.clone(), CancellationToken::new());
    let stop = progress_stop.clone();
    let progress = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(progress_every) => {
                    let _ = acker_msg.ack_with(AckKind::Progress).await;
                }
            }
        }
    });
    let started = tokio::time::Instant::now();
    let outcome = loop {
        match handler(msg.clone()).instrument(span.clone()).await {
            Disposition::Defer(d) if started.elapsed() + d <= MAX_DEFER => {
                // Stopping: hand the message back (redelivered after `d`)
                // rather than hold the shutdown up for a deferral.
                tokio::select! {
                    _ = shutdown.cancelled() => break Disposition::Retry(d),
                    _ = tokio::time::sleep(d.max(Duration::from_millis(50))) => {}
                }
            }
            Disposition::Defer(d) => break Disposition::Retry(d),
            other => break other,
        }
    };
    progress_stop.cancel();
    let _ = progress.await;
    // max_deliver is BACKOFF.len() + 1: this is the last delivery.
    let last_try = delivered > BACKOFF.len() as i64;
    let result = match outcome {
        Disposition::Done => msg.double_ack().await,
        Disposition::Defer(_) => unreachable!("a defer is retried or turned into a retry above"),
        Disposition::Retry(delay) if !last_try => msg.ack_with(AckKind::Nak(Some(delay))).await,
        // Inside the consume span: the error line carries its trace id.
        Disposition::Retry(_) => {
            dead_letter(js, dlq, &msg, "retries exhausted")
                .instrument(span.clone())
                .await
        }
        Disposition::Poison(reason) => {
            dead_letter(js, dlq, &msg, &reason)
                .instrument(span.clone())
                .await
        }
    };
    if let Err(e) = result {
        tracing::warn!(parent: &span, error = %e, "acknowledging a message failed; it will be redelivered");
    }
}

async fn dead_letter(
    js: &jetstream::Context,
    dlq: &str,
    msg: &jetstream::Message,
    reason: &str,
) -> Result<(), async_nats::Error> {
    metrics::counter!("threadline_dead_letters_total", "subject" => msg.subject.to_string())
        .increment(1);
    tracing::error!(reason, subject = %msg.subject, "message dead-lettered");
    let mut headers = msg.headers.clone().unwrap_or_default();
    headers.insert("Threadline-Dead-Letter-Reason", reason);
    headers.insert("Threadline-Original-Subject", msg.subject.as_str());
    js.publish_with_headers(dlq.to_owned(), headers, msg.payload.clone())
        .await?
        .await?;
    msg.ack_with(AckKind::Term).await
}
