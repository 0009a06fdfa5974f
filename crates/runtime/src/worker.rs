//! Durable pull consumers with one mapping from a handler's outcome to the
//! broker: done → ack; not yet → nak with the delay (the message goes back
//! to JetStream, so a deferred message never holds a worker slot); a
//! transient failure (a dependency down) → nak with backoff, for as long as
//! the outage lasts; any other failure → nak, and dead-letter after
//! [`FAILURE_LIMIT`] of them; poison → dead-letter at once. Long handlers
//! keep their message with in-progress acks.
//!
//! Fair share: a worker reads ahead (up to [`LOOKAHEAD_PER_SLOT`] messages
//! per slot, kept alive with in-progress acks) into one queue per
//! installation, and fills a free slot round-robin across installations,
//! first-in first-out within each. While another installation has work
//! queued, one may hold at most `THREADLINE_TENANT_SHARE_PERCENT` of the
//! slots; with nobody else waiting it may use them all. Nothing is handed
//! back to the broker for fairness, so a flood costs no redeliveries.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, AckKind, consumer::PullConsumer};
use futures::{FutureExt as _, StreamExt as _};
use tracing::Instrument as _;

use crate::bus::{HeaderExtractor, Topic, Topology};
use crate::shutdown::CancellationToken;
use crate::transient::Classify;

/// What a worker must know of the messages it carries and does not know
/// itself (it knows subjects and bytes): whose each message is, for its
/// fair-share queue, and what the dead letter of one keeps. The contracts'
/// owner gives it: `threadline_tenancy::dead_letter::Letters`.
pub trait Contracts: Send + Sync + 'static {
    /// The installation a message of `topic` is for, when it names one.
    fn installation_of(&self, topic: Topic, payload: &[u8]) -> Option<String>;

    /// The dead letter of a message that arrived on `subject` (of `topic`)
    /// with `headers`: the headers to publish and the payload to keep.
    fn letter(
        &self,
        topic: Topic,
        subject: &str,
        headers: Option<&async_nats::HeaderMap>,
        payload: &[u8],
        reason: &str,
    ) -> (async_nats::HeaderMap, bytes::Bytes);

    /// Whether a dead letter keeps the whole message (sealed), so that any
    /// of them can be replayed; when not, the worker says so at start.
    fn letters_keep_messages(&self) -> bool;
}

/// What became of a message.
#[derive(Debug)]
pub enum Disposition {
    Done,
    /// Not an error, just not yet (a post slot, another worker's lease, a
    /// due time, a reconciliation read): the message is handed back to the
    /// broker and redelivered after the delay. It holds no worker slot, so
    /// a tenant waiting out a `Retry-After` cannot stall the others, and it
    /// is never dead-lettered for waiting.
    Defer(Duration),
    /// A dependency failed for a transient reason (database, broker, Slack
    /// unavailable): redelivered with growing backoff (at most
    /// [`MAX_BACKOFF`]) for as long as the outage lasts; never
    /// dead-lettered (DESIGN invariant 11).
    Transient,
    /// A failure that, as a rule, heals on its own within minutes but may
    /// not (a sealed secret whose key id the pods of a rollout do not all
    /// hold yet): redelivered with the transient backoff, and dead-lettered
    /// once it has failed [`RETRY_LIMIT`] times (about ten minutes).
    Retry(String),
    /// A failure not known to be transient (a defect, data the handler
    /// cannot cope with): retried with backoff, and dead-lettered once it
    /// has failed [`FAILURE_LIMIT`] times.
    Fail(String),
    /// Never going to work (undecodable, contract violation): dead-letter it.
    Poison(String),
}

impl Disposition {
    /// How a handler error is retried: `Transient` when a dependency is
    /// unavailable (see [`crate::transient`]; `more` tells the errors of
    /// the crates above this one), else `Fail`.
    pub fn of_error(e: &anyhow::Error, more: Classify) -> Self {
        if crate::transient::is_transient(e, more) {
            Self::Transient
        } else {
            Self::Fail(error_code(e, more))
        }
    }
}

/// A short code for what failed, from the kind of error in the chain, never
/// from its text: an error's message can quote the data it failed on (a
/// JSON parser quotes the value), and the code ends up in dead-letter
/// headers, receipts and logs.
pub fn error_code(e: &anyhow::Error, more: Classify) -> String {
    for cause in e.chain() {
        if let Some(f) = more(cause) {
            return crate::audit::sanitise_code(&f.code);
        }
        if let Some(d) = cause.downcast_ref::<sqlx::Error>() {
            return match d {
                sqlx::Error::Database(db) => format!(
                    "database_{}",
                    crate::audit::sanitise_code(db.code().as_deref().unwrap_or("error"))
                ),
                sqlx::Error::RowNotFound => "database_row_not_found".into(),
                sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
                    "database_decode".into()
                }
                _ => "database".into(),
            };
        }
        if let Some(j) = cause.downcast_ref::<serde_json::Error>() {
            return format!("json_{:?}", j.classify()).to_ascii_lowercase();
        }
        if cause.downcast_ref::<prost::DecodeError>().is_some() {
            return "protobuf_decode".into();
        }
    }
    "handler_error".into()
}

/// Failures not known to be transient after which a message is
/// dead-lettered (counted per worker process).
pub const FAILURE_LIMIT: u32 = 5;

/// How many times a [`Disposition::Retry`] failure is tried before its
/// message is dead-lettered: with [`backoff`] (at most [`MAX_BACKOFF`])
/// between tries, about ten minutes, the length of a slow rollout.
pub const RETRY_LIMIT: u32 = 64;
/// The longest wait between two tries of a failing message.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Consecutive failures of the messages a worker has seen (by stream
/// sequence): transient ones set the backoff, others count towards the
/// dead-letter limit. Forgotten when the message is settled.
#[derive(Default)]
struct Failures(Mutex<HashMap<u64, (u32, u32)>>);

impl Failures {
    /// Records a failure; returns (transient, other) so far.
    fn record(&self, seq: u64, transient: bool) -> (u32, u32) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() > 100_000 {
            // Messages settled by another replica are never forgotten here:
            // bound the memory (a count restarting is harmless).
            m.clear();
        }
        let e = m.entry(seq).or_default();
        if transient {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
        *e
    }

    fn forget(&self, seq: u64) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&seq);
    }
}

/// How many messages per slot a worker reads ahead of the ones it runs, to
/// see other installations' work behind one installation's backlog.
pub const LOOKAHEAD_PER_SLOT: usize = 16;

/// The messages a worker has read and not started, one queue per
/// installation, and how many each installation has running.
struct Scheduler {
    queues: HashMap<String, std::collections::VecDeque<jetstream::Message>>,
    /// Installations with queued messages, in turn order.
    turn: std::collections::VecDeque<String>,
    running: HashMap<String, usize>,
    queued: usize,
    /// The most slots one installation may hold while another waits.
    cap: usize,
}

impl Scheduler {
    fn new(cap: usize) -> Self {
        Self {
            queues: HashMap::new(),
            turn: std::collections::VecDeque::new(),
            running: HashMap::new(),
            queued: 0,
            cap,
        }
    }

    fn push(&mut self, tenant: String, msg: jetstream::Message) {
        let q = self.queues.entry(tenant.clone()).or_default();
        if q.is_empty() {
            self.turn.push_back(tenant);
        }
        q.push_back(msg);
        self.queued += 1;
    }

    /// The next message to run: the first installation in turn that holds
    /// fewer slots than its share; if every installation waiting holds its
    /// share already, the first in turn (nobody below it is kept waiting).
    fn next(&mut self) -> Option<(String, jetstream::Message)> {
        let below = self
            .turn
            .iter()
            .position(|t| self.running.get(t).copied().unwrap_or(0) < self.cap);
        let tenant = self.turn.remove(below.unwrap_or(0))?;
        let q = self.queues.get_mut(&tenant)?;
        let msg = q.pop_front()?;
        if q.is_empty() {
            self.queues.remove(&tenant);
        } else {
            self.turn.push_back(tenant.clone());
        }
        self.queued -= 1;
        *self.running.entry(tenant.clone()).or_default() += 1;
        Some((tenant, msg))
    }

    fn finished(&mut self, tenant: &str) {
        if let Some(n) = self.running.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.running.remove(tenant);
            }
        }
    }

    fn queued(&self) -> impl Iterator<Item = &jetstream::Message> {
        self.queues.values().flatten()
    }

    fn drain(&mut self) -> Vec<jetstream::Message> {
        self.turn.clear();
        self.queued = 0;
        self.queues.drain().flat_map(|(_, q)| q).collect()
    }
}

/// 1 s, 2 s, 4 s … up to [`MAX_BACKOFF`], after the `n`th failure.
pub fn backoff(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.saturating_sub(1).min(10)).min(MAX_BACKOFF)
}

/// Pulls `topic` with the topology's durable consumer and runs `handler` on
/// up to `concurrency` messages at a time until `shutdown`; in-flight
/// handlers finish before this returns. `contracts` tells whose each
/// message is and writes its dead letter.
pub async fn run<H, F>(
    js: jetstream::Context,
    topology: Topology,
    contracts: Arc<dyn Contracts>,
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
    let dead_letters = js.get_stream(topology.dead_letter_stream()).await.ok();
    spawn_lag_sampler(
        stream,
        consumer.clone(),
        topic.consumer().to_owned(),
        dead_letters,
        shutdown.clone(),
    );
    let handler = Arc::new(handler);
    // Pull in batches of one slot's worth: what the client library holds
    // beyond the read-ahead gets no in-progress acks, so it must stay
    // small enough to reach the read-ahead well within the ack wait.
    let messages = consumer
        .stream()
        .max_messages_per_batch(concurrency.max(1))
        .heartbeat(Duration::from_secs(15))
        .messages()
        .await
        .context("pulling messages")?;
    if !contracts.letters_keep_messages() {
        tracing::warn!(
            setting = crate::config::DEAD_LETTER_KEYS_SETTING,
            "dead letters keep no message text and events or contexts dead-lettered here cannot be replayed: set THREADLINE_DEAD_LETTER_KEYS"
        );
    }
    let dlq = DeadLetters {
        subject: topology.dead_letter_subject(topic),
        topic,
        contracts: contracts.clone(),
    };
    let dlq = Arc::new(dlq);
    let progress_every = topology.progress_every();
    let failures = Arc::new(Failures::default());
    let mut sched = Scheduler::new(topology.tenant_cap(concurrency));
    let lookahead = concurrency.max(1) * LOOKAHEAD_PER_SLOT;
    let mut messages = messages;
    let mut running = tokio::task::JoinSet::new();
    let mut running_tenant: HashMap<tokio::task::Id, String> = HashMap::new();
    let mut keepalive = tokio::time::interval(progress_every);
    keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open = true;
    let mut paused_until = tokio::time::Instant::now();
    loop {
        while running.len() < concurrency {
            let Some((tenant, msg)) = sched.next() else {
                break;
            };
            let (handler, js, dlq, failures) =
                (handler.clone(), js.clone(), dlq.clone(), failures.clone());
            let task = running.spawn(async move {
                handle_one(msg, &*handler, &js, &dlq, progress_every, &failures).await;
            });
            running_tenant.insert(task.id(), tenant);
        }
        if !open && running.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled(), if open => {
                open = false;
                // What was read ahead goes back at once, for another replica.
                for msg in sched.drain() {
                    let _ = msg.ack_with(AckKind::Nak(None)).await;
                }
            }
            Some(done) = running.join_next_with_id(), if !running.is_empty() => {
                let id = match &done {
                    Ok((id, ())) => *id,
                    Err(e) => e.id(),
                };
                if let Some(tenant) = running_tenant.remove(&id) {
                    sched.finished(&tenant);
                }
            }
            _ = keepalive.tick(), if sched.queued > 0 => {
                // Read ahead, not started: still ours.
                for msg in sched.queued() {
                    let _ = msg.ack_with(AckKind::Progress).await;
                }
            }
            () = tokio::time::sleep_until(paused_until), if paused_until > tokio::time::Instant::now() => {}
            next = messages.next(), if open && sched.queued < lookahead && paused_until <= tokio::time::Instant::now() => match next {
                Some(Ok(msg)) => {
                    let tenant = contracts.installation_of(topic, &msg.payload)
                        .unwrap_or_default();
                    sched.push(tenant, msg);
                }
                Some(Err(e)) => {
                    // Pause reading, not the loop: completions and
                    // keep-alives go on meanwhile.
                    tracing::warn!(error = %e, "pulling a message failed");
                    paused_until = tokio::time::Instant::now() + Duration::from_millis(500);
                }
                None => open = false,
            },
        }
    }
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
    dead_letters: Option<jetstream::stream::Stream>,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        let mut dead_letters = dead_letters;
        loop {
            // What waits for an operator in the dead-letter stream (every
            // worker samples the one stream: alert on the max).
            if let Some(dlq) = dead_letters.as_mut()
                && let Ok(info) = dlq.info().await
            {
                let age = if info.state.messages == 0 {
                    0.0
                } else {
                    (time::OffsetDateTime::now_utc() - info.state.first_timestamp)
                        .as_seconds_f64()
                        .max(0.0)
                };
                metrics::gauge!("threadline_dead_letters_pending").set(info.state.messages as f64);
                metrics::gauge!("threadline_dead_letters_oldest_age_seconds").set(age);
            }
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

/// Where and how a worker dead-letters.
struct DeadLetters {
    subject: String,
    topic: Topic,
    /// Write the letters.
    contracts: Arc<dyn Contracts>,
}

async fn handle_one<H, F>(
    msg: jetstream::Message,
    handler: &H,
    js: &jetstream::Context,
    dlq: &DeadLetters,
    progress_every: Duration,
    failures: &Failures,
) where
    H: Fn(jetstream::Message) -> F,
    F: Future<Output = Disposition>,
{
    let (delivered, seq) = msg
        .info()
        .map(|i| (i.delivered, i.stream_sequence))
        .unwrap_or((1, 0));
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
    // A handler that panics on a message is a failure like any other
    // (counted, then dead-lettered), not the end of the worker.
    let outcome = std::panic::AssertUnwindSafe(handler(msg.clone()).instrument(span.clone()))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| Disposition::Fail("handler_panicked".into()));
    progress_stop.cancel();
    let _ = progress.await;
    let result = match outcome {
        Disposition::Done => {
            failures.forget(seq);
            msg.double_ack().await
        }
        Disposition::Defer(delay) => {
            // Back to the broker: no slot is held while waiting.
            msg.ack_with(AckKind::Nak(Some(delay.max(Duration::from_millis(50)))))
                .await
        }
        Disposition::Transient => {
            let (n, _) = failures.record(seq, true);
            metrics::counter!("threadline_worker_transient_failures_total", "subject" => msg.subject.to_string())
                .increment(1);
            msg.ack_with(AckKind::Nak(Some(backoff(n)))).await
        }
        Disposition::Retry(reason) => {
            let (n, _) = failures.record(seq, true);
            if n >= RETRY_LIMIT {
                failures.forget(seq);
                dead_letter(js, dlq, &msg, &format!("failed {n} times: {reason}"))
                    .instrument(span.clone())
                    .await
            } else {
                msg.ack_with(AckKind::Nak(Some(backoff(n)))).await
            }
        }
        Disposition::Fail(reason) => {
            let (_, n) = failures.record(seq, false);
            if n >= FAILURE_LIMIT {
                failures.forget(seq);
                // Inside the consume span: the error line carries its trace id.
                dead_letter(js, dlq, &msg, &format!("failed {n} times: {reason}"))
                    .instrument(span.clone())
                    .await
            } else {
                msg.ack_with(AckKind::Nak(Some(backoff(n)))).await
            }
        }
        Disposition::Poison(reason) => {
            failures.forget(seq);
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
    dlq: &DeadLetters,
    msg: &jetstream::Message,
    reason: &str,
) -> Result<(), async_nats::Error> {
    metrics::counter!("threadline_dead_letters_total", "subject" => msg.subject.to_string())
        .increment(1);
    tracing::error!(reason, subject = %msg.subject, "message dead-lettered");
    let (headers, payload) = dlq.contracts.letter(
        dlq.topic,
        msg.subject.as_str(),
        msg.headers.as_ref(),
        &msg.payload,
        reason,
    );
    js.publish_with_headers(dlq.subject.clone(), headers, payload)
        .await?
        .await?;
    msg.ack_with(AckKind::Term).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transient::infrastructure_only;

    #[test]
    fn an_error_code_names_the_kind_never_the_data() {
        let json = serde_json::from_str::<u64>("\"the deploy password is hunter2\"")
            .map_err(anyhow::Error::from)
            .map_err(|e| e.context("parsing the event"))
            .expect_err("not a number");
        assert!(
            format!("{json:#}").contains("hunter2"),
            "the message quotes it"
        );
        assert_eq!(error_code(&json, infrastructure_only), "json_data");
        // An error of a crate above is named by its classifier, cut to a
        // label.
        let outside = |cause: &(dyn std::error::Error + 'static)| {
            (cause.to_string() == "outside").then(|| crate::transient::Fault {
                transient: false,
                code: "slack_Channel Not Found".into(),
            })
        };
        let slack = anyhow::anyhow!("outside").context("conversations.info");
        assert_eq!(error_code(&slack, outside), "slack_channel_not_found");
        let other = anyhow::anyhow!("thread {} has text hunter2", 1);
        assert_eq!(error_code(&other, outside), "handler_error");
        assert!(
            matches!(Disposition::of_error(&other, outside), Disposition::Fail(c) if c == "handler_error")
        );
    }
}
