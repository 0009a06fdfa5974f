//! The outbox relay against real Postgres and real NATS: what it holds while
//! the broker answers, what a relay that died mid-round leaves, and the
//! order the stream receives a pipelined relay's messages in.

use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt as _;
use prost::Message as _;
use threadline_gateway::relay::{Relay, RelayConfig};
use threadline_proto::v1::EventAccepted;
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::shutdown::CancellationToken;
use threadline_store::{outbox, testing};
use threadline_testkit::{TestDb, eventually, nats_url, stream_len, unique_prefix};
use uuid::Uuid;

struct Env {
    db: TestDb,
    prefix: String,
    nats: async_nats::Client,
    js: jetstream::Context,
}

impl Env {
    async fn new() -> Self {
        let nats = async_nats::connect(nats_url())
            .await
            .expect("NATS is reachable");
        Self {
            db: TestDb::new().await,
            prefix: unique_prefix(),
            js: jetstream::new(nats.clone()),
            nats,
        }
    }

    fn topology(&self) -> Topology {
        Topology::new(self.prefix.clone())
    }

    fn relay(&self, cfg: RelayConfig) -> Relay {
        Relay::new(self.db.pool.clone(), self.js.clone(), self.topology(), cfg)
    }

    /// Queues `n` events whose messages name `Ev<tag><i>`, in that order.
    async fn queue(&self, tag: &str, n: usize) -> Vec<String> {
        let mut conn = self.db.pool.acquire().await.expect("conn");
        let mut ids = Vec::with_capacity(n);
        for i in 0..n {
            let event_id = format!("Ev{tag}{i:04}");
            let msg = EventAccepted {
                event_id: event_id.clone(),
                ..Default::default()
            };
            outbox::enqueue(
                &mut conn,
                Uuid::now_v7(),
                Uuid::now_v7(),
                Topic::Events,
                &format!("evt:A0RELAY:{event_id}"),
                msg.encode_to_vec(),
            )
            .await
            .expect("enqueue");
            ids.push(event_id);
        }
        ids
    }

    /// Pending outbox rows.
    async fn pending(&self) -> i64 {
        testing::outbox::count_outbox(&self.db.pool)
            .await
            .expect("pending rows")
    }

    /// The ledger's count of events published.
    async fn published_events(&self) -> i64 {
        testing::outbox::published_total(&self.db.pool, "events")
            .await
            .expect("published events")
    }

    /// The event ids of the events stream's messages, in stream order.
    async fn stream_event_ids(&self) -> Vec<String> {
        let stream = self
            .js
            .get_stream(self.topology().stream(Topic::Events))
            .await
            .expect("events stream");
        let n = stream_len(&self.js, &self.topology().stream(Topic::Events)).await;
        let mut ids = Vec::new();
        for seq in 1..=n {
            let m = stream.get_raw_message(seq).await.expect("message");
            ids.push(
                EventAccepted::decode(m.payload.as_ref())
                    .expect("EventAccepted")
                    .event_id,
            );
        }
        ids
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        threadline_testkit::delete_streams_blocking(&self.js, &self.prefix);
    }
}

/// While a round waits for its PubAcks, no outbox row is locked and no
/// session of the database is in a transaction: another relay claiming, or
/// an operator reading, never waits for the broker. The rows sent are
/// leased, so another relay does not take them meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_holds_no_lock_or_transaction_while_the_broker_answers() {
    let env = Env::new().await;
    env.queue("HOLD", 3).await;
    // No stream takes the subject: a plain subscriber receives the publishes
    // and never acknowledges them, so the round waits for its PubAcks.
    let mut sink = env
        .nats
        .subscribe(env.topology().subject(Topic::Events))
        .await
        .expect("subscribe");
    env.nats.flush().await.expect("flush");
    let relay = env.relay(RelayConfig {
        ack_timeout: Duration::from_secs(3),
        ..RelayConfig::new(100, Duration::from_secs(60))
    });
    let round = tokio::spawn(async move { relay.relay_once().await });
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(10), sink.next())
            .await
            .expect("the relay sends the rows")
            .expect("subscription open");
    }
    assert!(!round.is_finished(), "the round waits for its PubAcks");

    let locked = testing::outbox::lock_outbox_nowait(&env.db.pool).await;
    assert!(
        matches!(&locked, Ok(rows) if rows.len() == 3),
        "the rows are not locked while the broker answers: {locked:?}"
    );
    assert_eq!(
        testing::server::idle_in_transaction_sessions(&env.db.pool)
            .await
            .expect("sessions"),
        0,
        "no session waits inside a transaction"
    );
    let taken = outbox::claim(&env.db.pool, 100, Duration::from_secs(60))
        .await
        .expect("claim");
    assert!(taken.is_empty(), "leased rows are not claimed twice");

    let err = round
        .await
        .expect("round task")
        .expect_err("no PubAck came");
    assert!(format!("{err:#}").contains("not acknowledged"), "{err:#}");
    assert_eq!(
        testing::outbox::count_failed_with(&env.db.pool, 1, "puback: timed out")
            .await
            .expect("failed rows"),
        3,
        "unacknowledged rows stay, marked for a later try"
    );
}

/// A relay that claimed rows and died before publishing them leaves them
/// leased; when the lease ends another relay publishes them once, and a
/// settle repeated for rows already settled counts nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_claimed_by_a_relay_that_died_are_published_once_after_the_lease() {
    let env = Env::new().await;
    env.topology().declare(&env.js).await.expect("declare");
    let queued = env.queue("DIED", 5).await;
    let died = outbox::claim(&env.db.pool, 100, Duration::from_secs(600))
        .await
        .expect("claim");
    assert_eq!(died.len(), 5);

    let relay = env.relay(RelayConfig::new(100, Duration::from_secs(60)));
    assert_eq!(
        relay.relay_once().await.expect("round"),
        0,
        "leased rows wait for their lease"
    );
    assert_eq!(env.pending().await, 5);

    // The lease ends.
    testing::outbox::make_outbox_due(&env.db.pool)
        .await
        .expect("time passes");
    assert_eq!(relay.relay_once().await.expect("round"), 5);
    assert_eq!(env.pending().await, 0);
    assert_eq!(env.stream_event_ids().await, queued);
    assert_eq!(env.published_events().await, 5);

    // The relay that died comes back and settles what it had claimed: the
    // rows are gone, and nothing is counted again.
    let late: Vec<outbox::Published> = died
        .iter()
        .map(|r| outbox::Published {
            id: r.id,
            topic: r.topic.clone(),
            receipt_id: r.receipt_id,
            channel_ref: None,
        })
        .collect();
    assert_eq!(
        outbox::settle(&env.db.pool, &late, &[])
            .await
            .expect("settle"),
        0
    );
    assert_eq!(env.published_events().await, 5);
}

/// A relay with several rounds in flight (small batches, a deep pipeline)
/// still hands the stream its rows in the order they were written, each
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_relay_publishes_in_outbox_order() {
    let env = Env::new().await;
    let queued = env.queue("ORDER", 300).await;
    let relay = env.relay(RelayConfig {
        pipeline: 8,
        ..RelayConfig::new(7, Duration::from_millis(100))
    });
    let stop = CancellationToken::new();
    let running = tokio::spawn(relay.run(stop.clone()));
    eventually("the outbox drains", Duration::from_secs(30), || {
        let pool = env.db.pool.clone();
        async move {
            let left = testing::outbox::count_outbox(&pool).await.ok()?;
            (left == 0).then_some(())
        }
    })
    .await;
    stop.cancel();
    running.await.expect("relay task");
    assert_eq!(env.stream_event_ids().await, queued);
    assert_eq!(env.published_events().await, 300);
}
