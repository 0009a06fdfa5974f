//! The JetStream topology (every stream and consumer, declared from this one
//! place, idempotently at start), the connection, and W3C trace-context
//! propagation through NATS headers.
//!
//! Subjects and streams take a prefix (`THREADLINE_BUS_PREFIX`, default
//! `tl`) so that deployments and tests can share one server: subject
//! `tl.events` lives in stream `TL_EVENTS`. `proto/README.md` lists them.
//!
//! On a broker with authorization each process logs in as the user of its
//! role, limited to its subjects ([`crate::nats_auth`]); then only the relay
//! and the operator declare, and the other services check their parts.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer, stream};

pub use crate::config::NatsEndpoint;
use crate::nats_role::Role;

pub use threadline_domain::topic::Topic;

/// How long a re-publish with the same `Nats-Msg-Id` is dropped by a stream.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(10 * 60);
/// How long a work consumer waits for an acknowledgement before it hands
/// the message to another worker (the delivering worker died or froze):
/// the default of `THREADLINE_REDELIVERY_MS`. Handlers doing long work (a
/// model call, a backfill) send in-progress acks well inside it. Explicit
/// retries and deferrals use `Nak(delay)` instead. Deliveries are not
/// limited (`max_deliver` -1, which nats-server 2.9 accepts only without a
/// `backoff` list, so none is set): a broker or database outage must never
/// turn acknowledged work into dead letters; the worker dead-letters poison
/// and repeated non-transient failures itself (`worker::FAILURE_LIMIT`).
pub const ACK_WAIT: Duration = Duration::from_secs(60);

/// Messages a work consumer may have delivered and not yet acknowledged,
/// deferred ones included.
pub const MAX_ACK_PENDING: i64 = 20_000;

/// The spool's ack wait (see [`Topology::work_consumer`]): above the
/// in-progress acks' interval, so a delivery being recorded is kept.
pub const SPOOL_ACK_WAIT: Duration = Duration::from_secs(30);

/// Spooled deliveries delivered at once across the drainers: they are
/// recorded together, in spool order within the window.
pub const SPOOL_WINDOW: i64 = 32;

#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
    /// Stream replicas (`THREADLINE_STREAM_REPLICAS`): 3 on a 3-node cluster.
    replicas: usize,
    /// How long dead letters (which hold the failed message) are kept.
    dead_letter_max_age: Duration,
    /// The ack deadline (`THREADLINE_REDELIVERY_MS`, default [`ACK_WAIT`]).
    redelivery: Duration,
    /// The share of a worker's slots one installation may hold while more
    /// work waits (`THREADLINE_TENANT_SHARE_PERCENT`).
    tenant_share_percent: u8,
    /// The bus user this process logs in as (`NATS_USER`); `None` without
    /// authorization. Decides what [`Topology::declare`] may do.
    role: Option<Role>,
}

impl Topology {
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            replicas: 1,
            dead_letter_max_age: Duration::from_secs(14 * 24 * 3600),
            redelivery: ACK_WAIT,
            tenant_share_percent: 100,
            role: None,
        }
    }

    /// The topology a deployment configured (prefix, replicas, retention).
    pub fn from_config(common: &crate::config::CommonConfig) -> Self {
        Self {
            replicas: common.stream_replicas,
            dead_letter_max_age: common.dead_letter_max_age,
            redelivery: common.redelivery,
            tenant_share_percent: common.tenant_share_percent,
            role: common.nats_url.role(),
            ..Self::new(common.bus_prefix.clone())
        }
    }

    /// The most slots of a worker with `concurrency` slots that one
    /// installation may hold while more work waits behind its message.
    pub fn tenant_cap(&self, concurrency: usize) -> usize {
        (concurrency * usize::from(self.tenant_share_percent))
            .div_ceil(100)
            .clamp(1, concurrency.max(1))
    }

    /// A copy with another tenant share (tests, benchmarks).
    pub fn with_tenant_share(mut self, percent: u8) -> Self {
        self.tenant_share_percent = percent.clamp(1, 100);
        self
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn subject(&self, topic: Topic) -> String {
        format!("{}.{}", self.prefix, topic.as_str())
    }

    pub fn stream(&self, topic: Topic) -> String {
        format!("{}_{}", self.prefix, topic.as_str()).to_ascii_uppercase()
    }

    /// Dead letters of every consumer: `<prefix>.dlq.<topic>`.
    pub fn dead_letter_subject(&self, topic: Topic) -> String {
        format!("{}.dlq.{}", self.prefix, topic.as_str())
    }

    pub fn dead_letter_stream(&self) -> String {
        format!("{}_DLQ", self.prefix).to_ascii_uppercase()
    }

    fn work_stream(&self, topic: Topic) -> stream::Config {
        stream::Config {
            name: self.stream(topic),
            subjects: vec![self.subject(topic)],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: DUPLICATE_WINDOW,
            max_age: Duration::from_secs(7 * 24 * 3600),
            num_replicas: self.replicas,
            description: Some(format!("threadline {} (work queue)", topic.as_str())),
            ..Default::default()
        }
    }

    fn dead_letter_stream_config(&self) -> stream::Config {
        stream::Config {
            name: self.dead_letter_stream(),
            subjects: vec![format!("{}.dlq.>", self.prefix)],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            duplicate_window: DUPLICATE_WINDOW,
            max_age: self.dead_letter_max_age,
            num_replicas: self.replicas,
            description: Some("threadline dead letters".into()),
            ..Default::default()
        }
    }

    /// How often a running handler extends its ack deadline: well inside it.
    pub fn progress_every(&self) -> Duration {
        (self.redelivery / 3).min(Duration::from_secs(20))
    }

    fn work_consumer(&self, topic: Topic) -> consumer::pull::Config {
        consumer::pull::Config {
            durable_name: Some(topic.consumer().to_owned()),
            description: Some(format!("threadline {} worker", topic.consumer())),
            ack_policy: consumer::AckPolicy::Explicit,
            // Every later delivery waits behind the window: a drainer that
            // died holds the spool back for this long at most.
            ack_wait: match topic {
                Topic::Spool => self.redelivery.min(SPOOL_ACK_WAIT),
                _ => self.redelivery,
            },
            max_deliver: -1,
            // Deferred messages (waiting for a post slot or Retry-After) stay
            // ack-pending until redelivered: room for many without stalling
            // the consumer. The spool is drained a window at a time, in the
            // order it was spooled, by whichever replica: deliveries waiting
            // for Postgres hold every later one back.
            max_ack_pending: match topic {
                Topic::Spool => SPOOL_WINDOW,
                _ => MAX_ACK_PENDING,
            },
            ..Default::default()
        }
    }

    /// How many deliveries wait in the spool and how old the oldest is
    /// (`None` when it cannot be read now: the broker is away).
    pub async fn spool_depth(&self, js: &jetstream::Context) -> Option<(u64, Duration)> {
        // (bounded: a broker away must not hold a post or a watcher long)
        let stream = tokio::time::timeout(
            Duration::from_secs(1),
            js.get_stream(self.stream(Topic::Spool)),
        )
        .await
        .ok()?
        .ok()?;
        let state = &stream.cached_info().state;
        let n = state.messages;
        let age = if n == 0 {
            Duration::ZERO
        } else {
            let first = state.first_timestamp.unix_timestamp_nanos();
            let now = time::OffsetDateTime::now_utc().unix_timestamp_nanos();
            Duration::from_nanos(u64::try_from(now - first).unwrap_or(0))
        };
        Some((n, age))
    }

    /// Makes sure the topology is there before it is used. Anonymous (no
    /// authorization), or as a user whose role declares (the relay, the
    /// operator): creates or updates every stream and consumer. As another
    /// user: checks that the streams and consumers of its role exist (they
    /// may not change them), and fails, to be retried, until they do. Safe
    /// to run from every replica of every service at every start.
    pub async fn declare(&self, js: &jetstream::Context) -> anyhow::Result<()> {
        match self.role {
            None => self.declare_all(js).await,
            Some(role) if role.declares() => self.declare_all(js).await,
            Some(role) => self.check_declared(js, role).await,
        }
    }

    /// Fails unless every stream and consumer `role` uses exists.
    async fn check_declared(&self, js: &jetstream::Context, role: Role) -> anyhow::Result<()> {
        if role.publishes().is_empty() && role.consumes().is_empty() {
            anyhow::bail!(
                "the NATS user {role} has no rights on the bus: run the outbox relay as the user \
                 relay (and THREADLINE_RELAY_ENABLED=false where NATS_USER is {role})"
            );
        }
        for name in role.streams(self) {
            js.get_stream(&name).await.with_context(|| {
                format!(
                    "stream {name} (the NATS user {role} may not declare it: the relay or \
                     `threadline nats declare` does)"
                )
            })?;
        }
        for topic in role.consumes() {
            let name = self.stream(*topic);
            let stream = js
                .get_stream_no_info(&name)
                .await
                .with_context(|| format!("opening stream {name}"))?;
            let consumer = topic.consumer();
            stream.consumer_info(consumer).await.with_context(|| {
                format!(
                    "consumer {consumer} on {name} (the NATS user {role} may not declare it: \
                     the relay or `threadline nats declare` does)"
                )
            })?;
        }
        Ok(())
    }

    /// Creates or updates every stream and consumer.
    pub async fn declare_all(&self, js: &jetstream::Context) -> anyhow::Result<()> {
        for topic in Topic::ALL {
            let cfg = self.work_stream(topic);
            let name = cfg.name.clone();
            js.create_or_update_stream(cfg)
                .await
                .with_context(|| format!("declaring stream {name}"))?;
            let stream = js
                .get_stream(&name)
                .await
                .with_context(|| format!("opening stream {name}"))?;
            stream
                .create_consumer(self.work_consumer(topic))
                .await
                .with_context(|| format!("declaring consumer {} on {name}", topic.consumer()))?;
        }
        let dlq = self.dead_letter_stream_config();
        let name = dlq.name.clone();
        js.create_or_update_stream(dlq)
            .await
            .with_context(|| format!("declaring stream {name}"))?;
        Ok(())
    }
}

/// Publishes `payload` on `topic` with `Nats-Msg-Id: msg_id` (a re-publish
/// inside the stream's duplicate window is dropped) and the current trace
/// context in its headers, and waits for the stream's PubAck. Every
/// service publishes through this one function (the outbox relay, which
/// pipelines its PubAcks with the trace context each row recorded, has its
/// own).
pub async fn publish(
    js: &jetstream::Context,
    topology: &Topology,
    topic: Topic,
    msg_id: &str,
    payload: Vec<u8>,
) -> anyhow::Result<()> {
    let mut headers = HeaderMap::new();
    crate::telemetry::inject_current(&mut headers);
    let publish = jetstream::message::PublishMessage::build()
        .payload(bytes::Bytes::from(payload))
        .headers(headers)
        .message_id(msg_id);
    js.send_publish(topology.subject(topic), publish)
        .await?
        .await?;
    Ok(())
}

/// Connects to NATS, as the endpoint's user when it has one (replies then
/// arrive under that user's own inbox prefix, the only one it may read).
/// The client keeps reconnecting in the background, so a broker outage
/// delays publishing instead of killing the process. A refused login or a
/// refused publish or subscription is logged and counted
/// ([`crate::bus_refusal::report`]).
pub async fn connect(endpoint: &NatsEndpoint, name: &str) -> anyhow::Result<async_nats::Client> {
    let role = endpoint.role();
    let mut options = async_nats::ConnectOptions::new()
        .name(name)
        .connection_timeout(Duration::from_secs(3))
        .retry_on_initial_connect()
        .event_callback(move |event| async move { crate::bus_refusal::report(&event, role) });
    if let Some((role, password)) = endpoint.credentials() {
        options = options
            .user_and_password(role.user().to_owned(), password.to_owned())
            .custom_inbox_prefix(role.inbox_prefix());
    }
    options
        .connect(endpoint.url())
        .await
        .with_context(|| format!("connecting to NATS at {}", redact_url(endpoint.url())))
}

pub use crate::redact::redact_url;

pub use crate::telemetry::{HeaderExtractor, HeaderInjector, TraceCarrier};

impl Role {
    /// The streams this role uses (and checks at start).
    pub fn streams(self, t: &Topology) -> Vec<String> {
        if self.declares() {
            return all_streams(t);
        }
        let mut v: Vec<String> = Vec::new();
        for topic in self
            .publishes()
            .iter()
            .chain(self.consumes())
            .chain(self.watches())
        {
            let s = t.stream(*topic);
            if !v.contains(&s) {
                v.push(s);
            }
        }
        if !self.consumes().is_empty() {
            v.push(t.dead_letter_stream());
        }
        v
    }
}

fn all_streams(t: &Topology) -> Vec<String> {
    let mut v: Vec<String> = Topic::ALL.iter().map(|topic| t.stream(*topic)).collect();
    v.push(t.dead_letter_stream());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_prefix() {
        let t = Topology::new("t123");
        assert_eq!(t.subject(Topic::Events), "t123.events");
        assert_eq!(t.stream(Topic::Reconsider), "T123_RECONSIDER");
        assert_eq!(
            t.dead_letter_subject(Topic::Proposals),
            "t123.dlq.proposals"
        );
    }

    #[test]
    fn urls_lose_their_credentials() {
        assert_eq!(redact_url("nats://u:p@h:4222"), "nats://[redacted]@h:4222");
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1/x"),
            "postgres://[redacted]@127.0.0.1/x"
        );
        assert_eq!(redact_url("nats://h:4222"), "nats://h:4222");
    }

    #[test]
    fn consumers_redeliver_after_the_ack_wait_with_no_delivery_limit() {
        let c = Topology::new("tl").work_consumer(Topic::Events);
        // An outage of any length never exhausts deliveries.
        assert_eq!(c.max_deliver, -1);
        assert_eq!(c.ack_policy, consumer::AckPolicy::Explicit);
        assert_eq!(c.ack_wait, ACK_WAIT);
        assert!(
            c.backoff.is_empty(),
            "nats-server 2.9 refuses max_deliver -1 with a backoff list"
        );
    }

    #[test]
    fn replicas_and_dead_letter_retention_come_from_the_settings() {
        let src = crate::config::Source::from_pairs([
            ("THREADLINE_STREAM_REPLICAS", "3"),
            ("THREADLINE_DLQ_MAX_AGE_HOURS", "48"),
        ]);
        let common = crate::config::CommonConfig::from_source(&src).expect("config");
        let t = Topology::from_config(&common);
        assert_eq!(t.work_stream(Topic::Events).num_replicas, 3);
        let dlq = t.dead_letter_stream_config();
        assert_eq!(
            (dlq.num_replicas, dlq.max_age),
            (3, Duration::from_secs(48 * 3600))
        );
        let bad = crate::config::Source::from_pairs([("THREADLINE_STREAM_REPLICAS", "0")]);
        let err = crate::config::CommonConfig::from_source(&bad)
            .expect_err("refused")
            .to_string();
        assert!(err.contains("THREADLINE_STREAM_REPLICAS"), "{err}");
        assert_eq!(
            Topology::new("tl").work_stream(Topic::Events).num_replicas,
            1
        );
    }
}
