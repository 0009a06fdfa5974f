//! The outbox relay: publishes committed outbox rows to JetStream and marks
//! them done only after the stream's PubAck: the row is deleted and counted
//! in `outbox_ledger` in one transaction.
//!
//! Rows are claimed with `FOR UPDATE SKIP LOCKED`, so several gateway
//! replicas relay side by side without taking the same row; each message
//! carries `Nats-Msg-Id`, so a row re-published after a crash between PubAck
//! and commit is dropped by the stream's duplicate window. The relay wakes on
//! `LISTEN threadline_outbox` and also sweeps periodically.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use futures::future::join_all;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use threadline_runtime::bus::{HeaderInjector, Topic, Topology};
use threadline_runtime::shutdown::CancellationToken;
use tokio::sync::Notify;
use tracing::Instrument as _;

pub const NOTIFY_CHANNEL: &str = threadline_runtime::outbox::WAKE_CHANNEL;
/// How long the relay waits for a batch's PubAcks before treating the rest
/// as failed (they stay in the outbox and are retried).
const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a whole round may take (sends included); past it the round's
/// transaction is rolled back and its rows stay for the next round.
const ROUND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopping relay keeps publishing what is left.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub batch: i64,
    pub sweep: Duration,
}

pub struct Relay {
    pool: PgPool,
    js: jetstream::Context,
    topology: Topology,
    cfg: RelayConfig,
    /// Wakes this relay from its own process (the gateway's intake).
    local: Arc<Notify>,
}

/// How a writer whose inserts do not NOTIFY
/// ([`threadline_runtime::db::pool_waking_after_commit`]) wakes the relays
/// once its commit is done.
#[derive(Clone)]
pub enum Wake {
    /// The relay running in this process.
    Local(Arc<Notify>),
    /// Relays in other processes, by a task that sends a NOTIFY of its own.
    Remote(Arc<Notify>),
}

impl Wake {
    /// Wakes relays in other processes with a NOTIFY of its own, sent by a
    /// task of its own: a writer never waits for it, and wake-ups that come
    /// while one is on its way make one more, not one each.
    pub fn remote(pool: PgPool) -> Self {
        let asked = Arc::new(Notify::new());
        let waiting = asked.clone();
        tokio::spawn(async move {
            loop {
                waiting.notified().await;
                if let Err(e) = threadline_runtime::outbox::wake(&pool).await {
                    // The relays' sweep finds the rows all the same.
                    tracing::debug!(error = %e, "waking the outbox relays failed");
                }
            }
        });
        Wake::Remote(asked)
    }

    pub fn wake(&self) {
        match self {
            Wake::Local(n) | Wake::Remote(n) => n.notify_one(),
        }
    }
}

#[derive(sqlx::FromRow)]
struct Row {
    id: i64,
    topic: String,
    msg_id: String,
    payload: Vec<u8>,
    traceparent: Option<String>,
    tracestate: Option<String>,
    created_at: time::OffsetDateTime,
    receipt_id: uuid::Uuid,
    installation_id: uuid::Uuid,
    channel_id: Option<String>,
}

impl Relay {
    pub fn new(pool: PgPool, js: jetstream::Context, topology: Topology, cfg: RelayConfig) -> Self {
        Self {
            pool,
            js,
            topology,
            cfg,
            local: Arc::new(Notify::new()),
        }
    }

    /// Wakes this relay from within its process.
    pub fn waker(&self) -> Wake {
        Wake::Local(self.local.clone())
    }

    /// Runs until `shutdown`; finishes the round in flight first.
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
        backoff = Duration::from_millis(100);
        while !shutdown.is_cancelled() {
            if listener.is_none() {
                listener = listen(&self.pool).await.ok();
            }
            if last_gauge.elapsed() >= self.cfg.sweep {
                self.report_backlog().await;
                last_gauge = Instant::now();
            }
            match self.round().await {
                Ok(n) => {
                    backoff = Duration::from_millis(100);
                    if n as i64 >= self.cfg.batch {
                        continue; // more waiting: go again at once
                    }
                }
                Err(e) => {
                    metrics::counter!("threadline_outbox_relay_errors_total").increment(1);
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "outbox relay round failed; rows stay for retry"
                    );
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
        // Publish what the last deliveries committed before stopping.
        let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            match self.round().await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        tracing::info!("outbox relay stopped");
    }

    async fn round(&self) -> anyhow::Result<usize> {
        tokio::time::timeout(ROUND_TIMEOUT, self.relay_once())
            .await
            .unwrap_or_else(|_| {
                Err(anyhow::anyhow!(
                    "relay round took longer than {ROUND_TIMEOUT:?}; rolled back"
                ))
            })
    }

    /// Publishes one batch; returns how many rows were marked published.
    pub async fn relay_once(&self) -> anyhow::Result<usize> {
        let mut tx = self
            .pool
            .begin()
            .await
            .context("starting relay transaction")?;
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT o.id, o.topic, o.msg_id, o.payload, o.traceparent, o.tracestate, o.created_at,
                    o.receipt_id, o.installation_id, r.channel_id
               FROM outbox o LEFT JOIN event_receipts r ON r.id = o.receipt_id
             WHERE o.next_attempt_at <= now()
              ORDER BY o.id
              LIMIT $1
              FOR UPDATE OF o SKIP LOCKED",
        )
        .bind(self.cfg.batch)
        .fetch_all(&mut *tx)
        .await
        .context("claiming outbox rows")?;
        if rows.is_empty() {
            return Ok(0);
        }

        // Send every message first, then await the PubAcks together.
        let mut pending = Vec::with_capacity(rows.len());
        let mut failed: Vec<(i64, String)> = Vec::new();
        for row in &rows {
            match self.send(row).await {
                Ok(ack) => pending.push((row.id, row.created_at, ack)),
                Err(e) => failed.push((row.id, e)),
            }
        }
        let acks = join_all(pending.into_iter().map(|(id, created_at, ack)| async move {
            let r = tokio::time::timeout(ACK_TIMEOUT, ack.into_future()).await;
            (id, created_at, r)
        }))
        .await;
        let mut published = Vec::with_capacity(acks.len());
        let now = time::OffsetDateTime::now_utc();
        for (id, created_at, r) in acks {
            match r {
                Ok(Ok(ack)) => {
                    if ack.duplicate {
                        // Published before by a relay that died before its
                        // commit; the stream dropped this copy.
                        metrics::counter!("threadline_outbox_duplicate_publishes_total")
                            .increment(1);
                    }
                    published.push(id);
                    metrics::histogram!("threadline_outbox_relay_lag_seconds")
                        .record((now - created_at).as_seconds_f64().max(0.0));
                }
                Ok(Err(e)) => failed.push((id, format!("puback: {}", e.kind()))),
                Err(_) => failed.push((id, "puback: timed out".into())),
            }
        }
        if !published.is_empty() {
            let done: std::collections::HashSet<i64> = published.iter().copied().collect();
            let done_rows: Vec<&Row> = rows.iter().filter(|r| done.contains(&r.id)).collect();
            let topics: Vec<&str> = done_rows.iter().map(|r| r.topic.as_str()).collect();
            // The intake audit record of each published receipt (received,
            // acknowledged), with its channel pseudonymised here.
            let refs: Vec<Option<String>> = done_rows
                .iter()
                .map(|r| {
                    r.channel_id
                        .as_deref()
                        .and_then(|c| threadline_runtime::audit::channel_ref(r.installation_id, c))
                })
                .collect();
            let receipts: Vec<uuid::Uuid> = done_rows.iter().map(|r| r.receipt_id).collect();
            sqlx::query(
                "WITH done AS (DELETE FROM outbox WHERE id = ANY($1) RETURNING receipt_id, created_at, topic),
                 ledger AS (
                    INSERT INTO outbox_ledger (topic, published_total, last_published_at)
                    SELECT topic, count(*), now() FROM UNNEST($2::text[]) AS t(topic) GROUP BY topic
                    ON CONFLICT (topic) DO UPDATE
                       SET published_total = outbox_ledger.published_total + EXCLUDED.published_total,
                           last_published_at = EXCLUDED.last_published_at)
                 INSERT INTO audit_log (stage, outcome, installation_id, event_id, receipt_id, channel_ref,
                                        event_type, received_at, acked_at, retry_count)
                 SELECT 'intake', 'accepted', r.installation_id, r.event_id, r.id, c.ref, r.event_type,
                        r.received_at, d.created_at, r.retry_num
                   FROM done d
                   JOIN event_receipts r ON r.id = d.receipt_id
                   LEFT JOIN UNNEST($3::uuid[], $4::text[]) AS c(receipt, ref) ON c.receipt = d.receipt_id
                  -- only an event's own row is its intake; other rows (an
                  -- approval, a re-post, a reconsideration) name its receipt
                  -- but are no intake
                  WHERE d.topic = 'events'",
            )
            .bind(&published)
            .bind(&topics)
            .bind(&receipts)
            .bind(&refs)
            .execute(&mut *tx)
            .await
            .context("removing published outbox rows")?;
        }
        if !failed.is_empty() {
            // Back off per row (2^attempts seconds, at most 5 minutes) so a
            // row that cannot be published does not hold up the others.
            sqlx::query(
                "UPDATE outbox o
                    SET attempts = o.attempts + 1, last_error = f.err,
                        next_attempt_at = now() + make_interval(secs => least(power(2, o.attempts), 300))
                   FROM UNNEST($1::bigint[], $2::text[]) AS f(id, err)
                  WHERE o.id = f.id",
            )
            .bind(failed.iter().map(|f| f.0).collect::<Vec<_>>())
            .bind(failed.iter().map(|f| f.1.as_str()).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await
            .context("recording failed publishes")?;
        }
        tx.commit().await.context("committing relay round")?;
        metrics::counter!("threadline_outbox_published_total").increment(published.len() as u64);
        if !failed.is_empty() {
            metrics::counter!("threadline_outbox_publish_failures_total")
                .increment(failed.len() as u64);
            let msg = format!(
                "{} of {} outbox rows were not acknowledged by JetStream (first: {})",
                failed.len(),
                rows.len(),
                failed[0].1
            );
            if published.is_empty() {
                anyhow::bail!(msg);
            }
            tracing::warn!(failed = failed.len(), published = published.len(), "{msg}");
        }
        Ok(published.len())
    }

    async fn send(&self, row: &Row) -> Result<jetstream::context::PublishAckFuture, String> {
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
        let r: Result<(i64, Option<f64>), _> = sqlx::query_as(
            "SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
               FROM outbox",
        )
        .fetch_one(&self.pool)
        .await;
        if let Ok((pending, oldest)) = r {
            metrics::gauge!("threadline_outbox_pending").set(pending as f64);
            metrics::gauge!("threadline_outbox_oldest_age_seconds").set(oldest.unwrap_or(0.0));
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
