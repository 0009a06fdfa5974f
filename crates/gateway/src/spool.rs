//! Intake that outlives its database. A verified delivery that Postgres
//! cannot take within `THREADLINE_SPOOL_AFTER_MS` is published to the
//! spool stream (`<prefix>.spool`, `Nats-Msg-Id` `spool:<app>:<event>`, so
//! Slack's retries of it are one message) and answered 200 only once
//! JetStream acknowledged it: acknowledged work is durable in the broker
//! instead of the database. While deliveries wait in the spool, new ones
//! are spooled behind them, so that none overtakes an earlier one.
//!
//! The drainer (beside the relay; across replicas the consumer lets a
//! window of [`crate::drain::DRAIN_WINDOW`] deliveries be unacknowledged, which are
//! submitted together, in spool order, and commit together) records each
//! spooled delivery exactly as the gateway would have (resolution,
//! receipt, outbox row; a delivery already received directly is a
//! duplicate, counted) and acknowledges it once committed; while Postgres
//! is away it waits, and every later delivery with it. The publisher posts nothing while the
//! spool holds deliveries (an acknowledged change of a thread may be among
//! them), so the staleness rules see every acknowledged change.
//!
//! If the broker cannot take the delivery either, the gateway answers 503
//! as it would without a spool, and Slack retries.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use prost::Message as _;
use threadline_domain::DeliveryIdentity;
use threadline_proto::v1::{SCHEMA_VERSION, SpooledDelivery};
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::shutdown::CancellationToken;

/// Longest wait for the broker's acknowledgement of a spooled delivery.
pub const PUT_TIMEOUT: Duration = Duration::from_millis(1000);

/// A delivery is answered within this long, whatever Postgres and the
/// broker do (Slack waits 3 s; the rest is the network's and the body's).
pub const ANSWER_WITHIN: Duration = Duration::from_millis(2500);

/// After a put the broker did not take, the spool is not tried again for
/// this long (each try would cost the delivery [`PUT_TIMEOUT`]).
const BROKER_PAUSE: Duration = Duration::from_secs(1);

/// How often the spool's depth is read (the gateway's "deliveries wait
/// there" flag and the depth and age gauges).
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// A delivery spooled here keeps the flag up this long whatever a depth
/// read that crossed it said.
const FRESH: Duration = Duration::from_secs(1);

pub struct Spool {
    js: jetstream::Context,
    topology: Topology,
    /// How long a delivery waits for Postgres before it is spooled.
    pub after: Duration,
    /// Deliveries wait in the spool, as last read.
    waiting: AtomicBool,
    /// When this gateway last began to spool a delivery (ms since `born`).
    last_put_ms: AtomicU64,
    /// Until when (ms since `born`) the broker is taken for away.
    broker_away_until_ms: AtomicU64,
    born: Instant,
}

impl Spool {
    pub fn new(js: jetstream::Context, topology: Topology, after: Duration) -> Arc<Self> {
        Arc::new(Self {
            js,
            topology,
            after,
            waiting: AtomicBool::new(false),
            last_put_ms: AtomicU64::new(u64::MAX),
            broker_away_until_ms: AtomicU64::new(0),
            born: Instant::now(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// Deliveries wait in the spool (or this gateway began to spool one a
    /// moment ago), and the broker is not known to be away: a new delivery
    /// goes behind them.
    pub fn active(&self) -> bool {
        if self.now_ms() < self.broker_away_until_ms.load(Ordering::Acquire) {
            return false;
        }
        if self.waiting.load(Ordering::Acquire) {
            return true;
        }
        let last = self.last_put_ms.load(Ordering::Acquire);
        last != u64::MAX
            && (self.born.elapsed().as_millis() as u64).saturating_sub(last)
                < FRESH.as_millis() as u64
    }

    /// Keeps `body` (verified, with identity `id`) in the spool; `Ok` once
    /// JetStream acknowledged it, within `within` (at most [`PUT_TIMEOUT`]).
    pub async fn put(
        &self,
        id: &DeliveryIdentity,
        retry: (i32, Option<&str>),
        body: &[u8],
        received_at_unix_ms: i64,
        transport: &'static str,
        within: Duration,
    ) -> anyhow::Result<()> {
        // Deliveries that follow go behind this one from now, not from its
        // acknowledgement.
        self.last_put_ms.store(self.now_ms(), Ordering::Release);
        let key = id.installation_key();
        let tenant = key
            .team_id
            .as_ref()
            .map(|t| t.to_string())
            .or_else(|| key.enterprise_id.as_ref().map(|e| e.to_string()))
            .unwrap_or_default();
        let (retry_num, retry_reason) = retry;
        let d = SpooledDelivery {
            schema_version: SCHEMA_VERSION,
            api_app_id: id.api_app_id.to_string(),
            event_id: id.event_id.to_string(),
            tenant,
            body: body.to_vec(),
            retry_num,
            retry_reason: retry_reason.unwrap_or_default().to_owned(),
            received_at_unix_ms,
            transport: transport.to_owned(),
        };
        let msg_id = format!("spool:{}:{}", d.api_app_id, d.event_id);
        let put = tokio::time::timeout(
            within.min(PUT_TIMEOUT),
            threadline_runtime::bus::publish(
                &self.js,
                &self.topology,
                Topic::Spool,
                &msg_id,
                d.encode_to_vec(),
            ),
        )
        .await
        .map_err(|_| anyhow::anyhow!("the broker did not acknowledge in time"))
        .and_then(|r| r);
        if put.is_err() {
            self.broker_away_until_ms.store(
                self.now_ms() + BROKER_PAUSE.as_millis() as u64,
                Ordering::Release,
            );
        }
        put
    }

    /// Reads the spool's depth every [`WATCH_EVERY`] until `shutdown`: the
    /// flag, and the gauges `threadline_spool_depth` and
    /// `threadline_spool_oldest_age_seconds`. While the broker cannot be
    /// read the flag keeps its last value.
    pub async fn watch(self: Arc<Self>, shutdown: CancellationToken) {
        let mut every = tokio::time::interval(WATCH_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = every.tick() => {}
            }
            if let Some((n, age)) = self.topology.spool_depth(&self.js).await {
                self.waiting.store(n > 0, Ordering::Release);
                metrics::gauge!("threadline_spool_depth").set(n as f64);
                metrics::gauge!("threadline_spool_oldest_age_seconds").set(age.as_secs_f64());
            }
        }
    }
}
