//! The outbox relay: publishes committed outbox rows to JetStream and
//! deletes them only after the stream's PubAck (counted in `outbox_ledger`
//! in the same statement).
//!
//! A round **claims** due rows by leasing them ([`threadline_store::outbox`])
//! in a statement that commits at once, on a session whose commits do not
//! wait for the WAL flush (a claim lost in a crash only makes its rows due
//! again); sends them in order; and hands their PubAcks to a **settle**
//! that deletes what was acknowledged in one durable statement. No
//! transaction is open while the broker answers, and up to
//! [`RelayConfig::pipeline`] rounds await their PubAcks while the next is
//! claimed and sent, so a busy relay is not held to one round trip to the
//! broker and two to Postgres per round. Rows are sent in claim order, one
//! round after another, on one connection: while nothing fails, the stream
//! holds one relay's messages in outbox order (a row whose publish failed
//! goes out later, after a backoff, as it always did; the consumers do not
//! rely on the order).
//!
//! Several gateway replicas relay side by side: a claim skips rows another
//! holds. Each message carries `Nats-Msg-Id`, so a row published again (its
//! relay died before settling, and the lease ran out) is dropped by the
//! stream's duplicate window. The relay wakes in-process from its own
//! gateway's intake, on `LISTEN threadline_outbox` from other writers, and
//! sweeps periodically.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use futures::future::join_all;
use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};
use threadline_runtime::bus::{HeaderInjector, Topic, Topology};
use threadline_runtime::shutdown::CancellationToken;
use threadline_store::outbox::{self, Claimed, Failed, Published};
use tokio::sync::Notify;
use tracing::Instrument as _;

pub use crate::wake::Wake;

pub const NOTIFY_CHANNEL: &str = outbox::WAKE_CHANNEL;
/// How long a round waits for its PubAcks before treating the rest as
/// failed (they wait out a backoff and are published again).
pub const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a round may take to claim and send; past it the round is given
/// up and its rows are claimed again when their lease ends.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a claim keeps its rows from other relays beyond the longest a
/// round may take to send them and wait for their PubAcks, so that a
/// working relay's rows are not published twice (a second publish would be
/// dropped by the duplicate window all the same). The lease is also how
/// long a killed relay's rows wait for another relay.
const LEASE_MARGIN: Duration = Duration::from_secs(5);
/// How long a stopping relay keeps publishing what is left.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Refuses to relay as a database role that may not consume the outbox
/// (the public gateway's, `threadline_gateway`, may only add to it): every
/// round would fail. A database that cannot be read now is not a refusal
/// (a gateway with a spool starts during an outage); the relay's rounds
/// then say what fails.
pub async fn check_role(pool: &PgPool) -> anyhow::Result<()> {
    match tokio::time::timeout(Duration::from_secs(5), outbox::may_relay(pool)).await {
        Ok(Ok(true)) => Ok(()),
        Ok(Ok(false)) => anyhow::bail!(
            "THREADLINE_RELAY_ENABLED: the outbox relay reads, leases and deletes outbox rows, \
             which the role of this DATABASE_URL may not (the public gateway's role, \
             threadline_gateway, only adds to the outbox): log the relay in as \
             threadline_relay, or set THREADLINE_RELAY_ENABLED=false where another process relays"
        ),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the relay's database role could not be checked at start");
            Ok(())
        }
        Err(_) => {
            tracing::warn!("the relay's database role could not be checked at start (timed out)");
            Ok(())
        }
    }
}

#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows claimed per round.
    pub batch: i64,
    /// The periodic sweep besides the wake-ups.
    pub sweep: Duration,
    /// Rounds awaiting their PubAcks and settle at once (at least 1).
    pub pipeline: usize,
    /// How long a round waits for its PubAcks.
    pub ack_timeout: Duration,
}

impl RelayConfig {
    /// `batch` and `sweep` with the default pipeline and PubAck wait.
    pub fn new(batch: i64, sweep: Duration) -> Self {
        Self {
            batch,
            sweep,
            pipeline: 4,
            ack_timeout: ACK_TIMEOUT,
        }
    }
}

pub struct Relay {
    pool: PgPool,
    /// Claims commit here without waiting for the WAL flush.
    claims: PgPool,
    js: jetstream::Context,
    topology: Topology,
    cfg: RelayConfig,
    /// Wakes this relay from its own process (the gateway's intake).
    local: Arc<Notify>,
}

/// A round's rows, sent, with their PubAcks to come.
pub struct Round {
    rows: Vec<Claimed>,
    acks: Vec<(usize, jetstream::context::PublishAckFuture)>,
    /// Rows that could not be sent, with why.
    unsent: Vec<Failed>,
}

impl Round {
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

impl Relay {
    pub fn new(pool: PgPool, js: jetstream::Context, topology: Topology, cfg: RelayConfig) -> Self {
        // A claim is a lease: losing one in a crash only makes its rows due
        // again, so its commit need not wait for the flush (the settle that
        // follows is durable, and flushes the claim with it).
        let claims = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(pool.options().get_acquire_timeout())
            .connect_lazy_with(
                (*pool.connect_options())
                    .clone()
                    .options([("synchronous_commit", "off")]),
            );
        Self {
            pool,
            claims,
            js,
            topology,
            cfg: RelayConfig {
                pipeline: cfg.pipeline.max(1),
                ..cfg
            },
            local: Arc::new(Notify::new()),
        }
    }

    /// How long a claim leases its rows (see [`LEASE_MARGIN`]).
    pub fn lease(&self) -> Duration {
        SEND_TIMEOUT + self.cfg.ack_timeout + LEASE_MARGIN
    }

    /// Wakes this relay from within its process.
    pub fn waker(&self) -> Wake {
        Wake::Local(self.local.clone())
    }

    /// Runs until `shutdown`; settles the rounds in flight first.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        // The topology must exist before anything is published into it.
        loop {
            match self.topology.declare(&self.js).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "declaring bus topology failed; retrying"
                    );
                    if sleep_or_shutdown(backoff, &shutdown).await {
                        return;
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        let mut listener: Option<PgListener> = None;
        let mut last_gauge = Instant::now() - Duration::from_secs(60);
        let mut settling = tokio::task::JoinSet::new();
        backoff = Duration::from_millis(100);
        while !shutdown.is_cancelled() {
            if listener.is_none() {
                listener = listen(&self.pool).await.ok();
            }
            if last_gauge.elapsed() >= self.cfg.sweep {
                self.report_backlog().await;
                last_gauge = Instant::now();
            }
            let (mut settled, mut refused) = (false, false);
            let mut note = |done| match note_settled(done) {
                true => settled = true,
                false => refused = true,
            };
            while let Some(done) = settling.try_join_next() {
                note(done);
            }
            if settling.len() >= self.cfg.pipeline {
                // As many rounds in flight as allowed: wait for one.
                if let Some(done) = settling.join_next().await {
                    note(done);
                }
            }
            if settled && !refused {
                backoff = Duration::from_millis(100);
            }
            if refused {
                // The broker took nothing of a round (or its settle failed):
                // wait before claiming more, as after any failed round.
                if sleep_or_shutdown(backoff, &shutdown).await {
                    break;
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
            if settling.len() >= self.cfg.pipeline {
                continue;
            }
            match self.send_round().await {
                Ok(round) if round.is_empty() => {}
                Ok(round) => {
                    let full = round.len() as i64 >= self.cfg.batch;
                    let (pool, wait) = (self.pool.clone(), self.cfg.ack_timeout);
                    settling.spawn(settle(pool, round, wait));
                    if full {
                        continue; // more waiting: go again at once
                    }
                }
                Err(e) => {
                    relay_failed(&e);
                    if sleep_or_shutdown(backoff, &shutdown).await {
                        break;
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            }
            // Idle: wait for a notification, the sweep timer, or shutdown.
            let lost = match listener.as_mut() {
                Some(l) => tokio::select! {
                    _ = shutdown.cancelled() => break,
                    () = self.local.notified() => false,
                    r = tokio::time::timeout(self.cfg.sweep, l.recv()) => {
                        // One round serves every notification already here:
                        // under load many arrive for rows a round has taken.
                        while l.next_buffered().is_some() {}
                        matches!(r, Ok(Err(_)))
                    }
                },
                None => tokio::select! {
                    _ = shutdown.cancelled() => break,
                    () = self.local.notified() => false,
                    _ = tokio::time::sleep(self.cfg.sweep) => false,
                },
            };
            if lost {
                listener = None;
            }
        }
        while let Some(done) = settling.join_next().await {
            note_settled(done);
        }
        // Publish what the last deliveries committed before stopping.
        let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            match self.relay_once().await {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    relay_failed(&e);
                    break;
                }
            }
        }
        self.claims.close().await;
        tracing::info!("outbox relay stopped");
    }

    /// Claims, sends and settles one round; returns how many rows were
    /// published and deleted.
    pub async fn relay_once(&self) -> anyhow::Result<usize> {
        let round = self.send_round().await?;
        if round.is_empty() {
            return Ok(0);
        }
        settle(self.pool.clone(), round, self.cfg.ack_timeout).await
    }

    /// Claims due rows and sends them in order; their PubAcks are still to
    /// come. Rows claimed and then not sent in time stay leased and are
    /// claimed again when the lease ends.
    pub async fn send_round(&self) -> anyhow::Result<Round> {
        let rows = outbox::claim(&self.claims, self.cfg.batch, self.lease())
            .await
            .context("claiming outbox rows")?;
        let sending = async {
            let mut round = Round {
                acks: Vec::with_capacity(rows.len()),
                unsent: Vec::new(),
                rows: Vec::new(),
            };
            // One at a time, in claim order: the stream keeps that order.
            for (i, row) in rows.iter().enumerate() {
                match self.send(row).await {
                    Ok(ack) => round.acks.push((i, ack)),
                    Err(error) => round.unsent.push(Failed { id: row.id, error }),
                }
            }
            round
        };
        let mut round = tokio::time::timeout(SEND_TIMEOUT, sending)
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "sending a round took longer than {SEND_TIMEOUT:?}; its rows are claimed again after their lease"
                )
            })?;
        round.rows = rows;
        Ok(round)
    }

    async fn send(&self, row: &Claimed) -> Result<jetstream::context::PublishAckFuture, String> {
        let topic = Topic::parse(&row.topic)
            .ok_or_else(|| format!("unknown outbox topic {:?}", row.topic))?;
        let payload = row.payload.clone();
        let span = tracing::info_span!("outbox.publish", outbox_id = row.id, msg_id = %row.msg_id, topic = %row.topic, trace_id = tracing::field::Empty);
        let mut headers = HeaderMap::new();
        if let Some(tp) = &row.traceparent {
            // Continue the gateway request's trace: parent the relay span on
            // it and pass the relay span's context on (or the stored one
            // unchanged when tracing is not exported here).
            let mut carrier = std::collections::HashMap::new();
            carrier.insert("traceparent".to_owned(), tp.clone());
            if let Some(ts) = &row.tracestate {
                carrier.insert("tracestate".to_owned(), ts.clone());
            }
            let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&carrier));
            use opentelemetry::trace::TraceContextExt as _;
            use tracing_opentelemetry::OpenTelemetrySpanExt as _;
            let _ = span.set_parent(parent);
            threadline_runtime::telemetry::record_trace_id(&span);
            let cx = span.context();
            if cx.span().span_context().is_valid() {
                opentelemetry::global::get_text_map_propagator(|p| {
                    p.inject_context(&cx, &mut HeaderInjector(&mut headers))
                });
            } else {
                headers.insert("traceparent", tp.as_str());
                if let Some(ts) = &row.tracestate {
                    headers.insert("tracestate", ts.as_str());
                }
            }
        }
        let msg = PublishMessage::build()
            .payload(Bytes::from(payload))
            .headers(headers)
            .message_id(&row.msg_id);
        self.js
            .send_publish(self.topology.subject(topic), msg)
            .instrument(span)
            .await
            .map_err(|e| format!("publish: {}", e.kind()))
    }

    async fn report_backlog(&self) {
        if let Ok(b) = outbox::backlog(&self.pool).await {
            metrics::gauge!("threadline_outbox_pending").set(b.pending as f64);
            metrics::gauge!("threadline_outbox_oldest_age_seconds").set(b.oldest_seconds);
        }
    }
}

/// Awaits a round's PubAcks and settles it in one statement; returns how
/// many rows were published and deleted. A round with nothing acknowledged
/// is an error (the broker or its stream is not taking messages).
pub async fn settle(pool: PgPool, round: Round, ack_timeout: Duration) -> anyhow::Result<usize> {
    let Round { rows, acks, unsent } = round;
    let acks = join_all(acks.into_iter().map(|(i, ack)| async move {
        (
            i,
            tokio::time::timeout(ack_timeout, ack.into_future()).await,
        )
    }))
    .await;
    let mut failed = unsent;
    let mut published = Vec::with_capacity(acks.len());
    let now = time::OffsetDateTime::now_utc();
    for (i, r) in acks {
        let row = &rows[i];
        match r {
            Ok(Ok(ack)) => {
                if ack.duplicate {
                    // Published before by a relay that died before settling;
                    // the stream dropped this copy.
                    metrics::counter!("threadline_outbox_duplicate_publishes_total").increment(1);
                }
                metrics::histogram!("threadline_outbox_relay_lag_seconds")
                    .record((now - row.created_at).as_seconds_f64().max(0.0));
                published.push(Published {
                    id: row.id,
                    topic: row.topic.clone(),
                    receipt_id: row.receipt_id,
                    // The intake audit record's channel, pseudonymised here.
                    channel_ref: row.channel_id.as_deref().and_then(|c| {
                        threadline_runtime::audit::channel_ref(row.installation_id, c)
                    }),
                });
            }
            Ok(Err(e)) => failed.push(Failed {
                id: row.id,
                error: format!("puback: {}", e.kind()),
            }),
            Err(_) => failed.push(Failed {
                id: row.id,
                error: "puback: timed out".into(),
            }),
        }
    }
    let deleted = outbox::settle(&pool, &published, &failed)
        .await
        .context("settling the relay round")?;
    metrics::counter!("threadline_outbox_published_total").increment(deleted);
    if !failed.is_empty() {
        metrics::counter!("threadline_outbox_publish_failures_total")
            .increment(failed.len() as u64);
        let msg = format!(
            "{} of {} outbox rows were not acknowledged by JetStream (first: {})",
            failed.len(),
            rows.len(),
            failed[0].error
        );
        if published.is_empty() {
            anyhow::bail!(msg);
        }
        tracing::warn!(failed = failed.len(), published = published.len(), "{msg}");
    }
    Ok(deleted as usize)
}

fn relay_failed(e: &anyhow::Error) {
    metrics::counter!("threadline_outbox_relay_errors_total").increment(1);
    tracing::warn!(
        error = format!("{e:#}"),
        "outbox relay round failed; rows stay for retry"
    );
}

/// Reports a settled round; false when it failed.
fn note_settled(done: Result<anyhow::Result<usize>, tokio::task::JoinError>) -> bool {
    match done {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            relay_failed(&e);
            false
        }
        Err(e) => {
            relay_failed(&anyhow::anyhow!("a settle task ended: {e}"));
            false
        }
    }
}

async fn listen(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut l = PgListener::connect_with(pool).await?;
    l.listen(NOTIFY_CHANNEL).await?;
    Ok(l)
}

/// Sleeps; returns true when shutdown was requested meanwhile.
async fn sleep_or_shutdown(d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}
