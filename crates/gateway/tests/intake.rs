//! Gateway intake and relay against real Postgres and real NATS: several
//! gateway instances side by side, sharing one database and one bus prefix.

use std::net::SocketAddr;
use std::time::Duration;

use async_nats::jetstream;
use futures::future::join_all;
use prost::Message as _;
use serde_json::json;
use threadline_gateway::GatewayConfig;
use threadline_proto::v1::EventAccepted;
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::config::Source;
use threadline_runtime::shutdown::CancellationToken;
use threadline_store::testing;
use threadline_testkit::slack::{
    TEST_SECRET, app_mention, deliver, now_unix, seed_installation, signature,
};
use threadline_testkit::{TestDb, eventually, nats_url, stream_len, unique_prefix};

const APP: &str = "A0TEST";
const TEAM: &str = "T0TEST";

struct Gateway {
    url: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Gateway {
    async fn start(db: &TestDb, prefix: &str, extra: &[(&str, &str)]) -> Self {
        let mut src = Source::from_pairs([
            ("DATABASE_URL", db.url.as_str()),
            ("NATS_URL", nats_url().as_str()),
            ("THREADLINE_BUS_PREFIX", prefix),
            ("SLACK_SIGNING_SECRET", TEST_SECRET),
            ("THREADLINE_RELAY_SWEEP_MS", "200"),
            ("THREADLINE_DB_ACQUIRE_TIMEOUT_MS", "500"),
            ("THREADLINE_INTAKE_TIMEOUT_MS", "1500"),
        ]);
        for (k, v) in extra {
            src = src.with(*k, *v);
        }
        let cfg = GatewayConfig::from_source(&src).expect("test config is valid");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr: SocketAddr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let task = tokio::spawn(threadline_gateway::run(cfg, listener, stop.clone()));
        let gw = Self {
            url: format!("http://{addr}"),
            stop,
            task,
        };
        let client = reqwest::Client::new();
        eventually("gateway /healthz", Duration::from_secs(10), || {
            let c = client.clone();
            let u = format!("{}/healthz", gw.url);
            async move {
                c.get(u)
                    .send()
                    .await
                    .ok()
                    .filter(|r| r.status().is_success())
            }
        })
        .await;
        gw
    }

    fn events(&self) -> String {
        format!("{}/slack/events", self.url)
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task
            .await
            .expect("gateway task")
            .expect("gateway stopped cleanly");
    }
}

struct Env {
    db: TestDb,
    /// The installation of `APP` in `TEAM`.
    inst: uuid::Uuid,
    prefix: String,
    js: jetstream::Context,
    client: reqwest::Client,
}

impl Env {
    async fn new() -> Self {
        let db = TestDb::new().await;
        let inst = seed_installation(&db.pool, APP, TEAM).await;
        let nats = async_nats::connect(nats_url())
            .await
            .expect("NATS is reachable");
        Self {
            db,
            inst,
            prefix: unique_prefix(),
            js: jetstream::new(nats),
            client: reqwest::Client::new(),
        }
    }

    fn events_stream(&self) -> String {
        Topology::new(self.prefix.clone()).stream(Topic::Events)
    }

    async fn count(&self, what: Count) -> i64 {
        let pool = &self.db.pool;
        match what {
            Count::Receipts => testing::receipts::count_receipts(pool).await,
            Count::DuplicateDeliveries => testing::receipts::duplicate_deliveries_total(pool).await,
            Count::Unparsed => testing::receipts::count_unparsed_events(pool).await,
            Count::UnparsedOf(event_id) => {
                testing::receipts::count_unparsed_events_of(pool, event_id).await
            }
            Count::Outbox => testing::outbox::count_outbox(pool).await,
            Count::OutboxDeferred => testing::outbox::count_deferred_outbox(pool).await,
            Count::Rejections => testing::rejections::count_rejections(pool).await,
            Count::RateLimitNotices => {
                testing::rejections::count_app_rate_limit_notices(pool).await
            }
        }
        .unwrap_or_else(|e| panic!("{what:?}: {e}"))
    }

    /// Outbox rows ever written: still pending plus published.
    async fn outbox_total(&self) -> i64 {
        testing::outbox::outbox_total(&self.db.pool)
            .await
            .expect("outbox total")
    }

    async fn published_len(&self, expected: u64) -> u64 {
        let stream = self.events_stream();
        eventually(
            "events in the stream and outbox drained",
            Duration::from_secs(15),
            || {
                let (js, stream) = (self.js.clone(), stream.clone());
                let pool = self.db.pool.clone();
                async move {
                    let pending = testing::outbox::count_outbox(&pool).await.ok()?;
                    let n = stream_len(&js, &stream).await;
                    (pending == 0 && n >= expected).then_some(n)
                }
            },
        )
        .await
    }
}

/// What [`Env::count`] counts.
#[derive(Debug, Clone, Copy)]
enum Count {
    /// Receipts.
    Receipts,
    /// Duplicate deliveries summed over the receipts.
    DuplicateDeliveries,
    /// Held unparsed bodies.
    Unparsed,
    /// Held unparsed bodies of one event id.
    UnparsedOf(&'static str),
    /// Pending outbox rows.
    Outbox,
    /// Pending outbox rows waiting for a later try.
    OutboxDeferred,
    /// Rejected deliveries.
    Rejections,
    /// `app_rate_limited` notices.
    RateLimitNotices,
}

impl Drop for Env {
    fn drop(&mut self) {
        threadline_testkit::delete_streams_blocking(&self.js, &self.prefix);
    }
}

fn body(event_id: &str) -> Vec<u8> {
    serde_json::to_vec(&app_mention(
        APP,
        TEAM,
        event_id,
        "C0TEST",
        "1700000000.000100",
    ))
    .expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_delivered_many_times_to_two_gateways_yields_one_receipt_and_one_message() {
    let env = Env::new().await;
    let a = Gateway::start(&env.db, &env.prefix, &[]).await;
    let b = Gateway::start(&env.db, &env.prefix, &[]).await;
    let body = body("Ev0DUP");

    let deliveries = (0..40).map(|i| {
        let url = if i % 2 == 0 { a.events() } else { b.events() };
        let (client, body) = (env.client.clone(), body.clone());
        async move {
            deliver(
                &client,
                &url,
                TEST_SECRET,
                &body,
                (i > 0).then_some((1, "http_timeout")),
            )
            .await
        }
    });
    for r in join_all(deliveries).await {
        assert_eq!(r.expect("delivery").status(), 200);
    }
    assert_eq!(env.count(Count::Receipts).await, 1);
    assert_eq!(env.outbox_total().await, 1);
    assert_eq!(env.count(Count::DuplicateDeliveries).await, 39);
    assert_eq!(env.published_len(1).await, 1);

    // The message is the contract, with the dedupe id and identifiers only.
    let stream = env
        .js
        .get_stream(env.events_stream())
        .await
        .expect("stream");
    let msg = stream.get_raw_message(1).await.expect("first message");
    assert_eq!(
        msg.headers.get("Nats-Msg-Id").map(|v| v.as_str()),
        Some(format!("evt:{APP}:Ev0DUP").as_str())
    );
    let ev = EventAccepted::decode(msg.payload.as_ref()).expect("EventAccepted");
    assert_eq!(
        (
            ev.api_app_id.as_str(),
            ev.event_id.as_str(),
            ev.event_type.as_str()
        ),
        (APP, "Ev0DUP", "app_mention")
    );
    assert_eq!(ev.channel_id, "C0TEST");
    assert_eq!(ev.thread_ts, "1700000000.000100");
    let inner: serde_json::Value = serde_json::from_slice(&ev.event_json).expect("event json");
    assert_eq!(inner["type"], "app_mention");
    // Once published, the payload no longer sits in Postgres.
    assert_eq!(env.count(Count::Outbox).await, 0);
    assert_eq!(env.outbox_total().await, 1);

    // Restart both instances: still one receipt, one message.
    a.stop().await;
    b.stop().await;
    let a = Gateway::start(&env.db, &env.prefix, &[]).await;
    let b = Gateway::start(&env.db, &env.prefix, &[]).await;
    let again = (0..10).map(|i| {
        let url = if i % 2 == 0 { a.events() } else { b.events() };
        let (client, body) = (env.client.clone(), body.clone());
        async move { deliver(&client, &url, TEST_SECRET, &body, Some((2, "http_timeout"))).await }
    });
    for r in join_all(again).await {
        assert_eq!(r.expect("delivery").status(), 200);
    }
    assert_eq!(env.count(Count::Receipts).await, 1);
    assert_eq!(env.outbox_total().await, 1);
    assert_eq!(env.count(Count::DuplicateDeliveries).await, 49);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stream_len(&env.js, &env.events_stream()).await, 1);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_events_each_get_a_receipt_and_a_message() {
    let env = Env::new().await;
    let a = Gateway::start(&env.db, &env.prefix, &[]).await;
    let b = Gateway::start(&env.db, &env.prefix, &[]).await;
    let deliveries = (0..200).map(|i| {
        let url = if i % 2 == 0 { a.events() } else { b.events() };
        let (client, body) = (env.client.clone(), body(&format!("Ev{i:04}")));
        async move { deliver(&client, &url, TEST_SECRET, &body, None).await }
    });
    for r in join_all(deliveries).await {
        assert_eq!(r.expect("delivery").status(), 200);
    }
    assert_eq!(env.count(Count::Receipts).await, 200);
    assert_eq!(env.published_len(200).await, 200);
    // Both relays ran, and no row was published by both: the ledger counts
    // each PubAck a relay committed (the stream alone would hide a double
    // publish behind its duplicate window).
    assert_eq!(env.outbox_total().await, 200);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_signatures_get_a_bare_401_and_record_nothing() {
    let env = Env::new().await;
    let gw = Gateway::start(&env.db, &env.prefix, &[]).await;
    let body = body("Ev0SIG");
    let now = now_unix();
    let post = |ts: Option<String>, sig: Option<String>, body: Vec<u8>| {
        let mut req = env
            .client
            .post(gw.events())
            .header("content-type", "application/json")
            .body(body);
        if let Some(ts) = ts {
            req = req.header("x-slack-request-timestamp", ts);
        }
        if let Some(sig) = sig {
            req = req.header("x-slack-signature", sig);
        }
        req.send()
    };
    let (ts, sig) = signature(TEST_SECRET, now, &body);
    let mut tampered = body.clone();
    tampered.extend_from_slice(b" ");
    let (_, wrong) = signature("another-secret", now, &body);
    let (stale_ts, stale_sig) = signature(TEST_SECRET, now - 301, &body);
    // (a second may pass before the gateway reads its clock: well past
    // the window, not at its edge)
    let (future_ts, future_sig) = signature(TEST_SECRET, now + 310, &body);
    let cases = [
        (Some(ts.clone()), Some(sig.clone()), tampered),
        (Some(ts.clone()), Some(wrong), body.clone()),
        (Some(stale_ts), Some(stale_sig), body.clone()),
        (Some(future_ts), Some(future_sig), body.clone()),
        (None, Some(sig.clone()), body.clone()),
        (Some(ts.clone()), None, body.clone()),
        (Some("soon".into()), Some(sig.clone()), body.clone()),
        (Some(ts.clone()), Some("v0=nothex".into()), body.clone()),
    ];
    for (i, (ts, sig, body)) in cases.into_iter().enumerate() {
        let r = post(ts, sig, body).await.expect("request");
        assert_eq!(r.status(), 401, "case {i}");
        assert!(
            r.bytes().await.expect("body").is_empty(),
            "case {i}: 401 must carry no detail"
        );
    }
    assert_eq!(env.count(Count::Receipts).await, 0);
    assert_eq!(env.count(Count::Outbox).await, 0);
    // The genuine delivery still goes through.
    assert_eq!(
        post(Some(ts), Some(sig), body)
            .await
            .expect("request")
            .status(),
        200
    );
    assert_eq!(env.count(Count::Receipts).await, 1);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_verification_ssl_check_rotation_and_oversized_bodies() {
    let env = Env::new().await;
    let gw = Gateway::start(
        &env.db,
        &env.prefix,
        &[
            ("SLACK_SIGNING_SECRET_PREVIOUS", "previous-secret"),
            ("THREADLINE_GATEWAY_MAX_BODY_BYTES", "4096"),
        ],
    )
    .await;
    let challenge = threadline_testkit::fixture("events/url_verification.bolt-python.json");
    let r = deliver(&env.client, &gw.events(), TEST_SECRET, &challenge, None)
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.expect("json");
    assert_eq!(
        v,
        json!({"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"})
    );
    // Unsigned verification is refused like anything else.
    let r = env
        .client
        .post(gw.events())
        .body(challenge.clone())
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 401);
    // The previous secret still verifies while Slack rotates it.
    let r = deliver(
        &env.client,
        &gw.events(),
        "previous-secret",
        &body("Ev0ROT"),
        None,
    )
    .await
    .expect("request");
    assert_eq!(r.status(), 200);
    // ssl_check form posts get a plain 200 and record nothing, once signed.
    let form = b"ssl_check=1&token=x".to_vec();
    let (ts, sig) = signature(TEST_SECRET, now_unix(), &form);
    let ssl_check = |ts: &str, sig: &str| {
        env.client
            .post(gw.events())
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-slack-request-timestamp", ts)
            .header("x-slack-signature", sig)
            .body(form.clone())
            .send()
    };
    assert_eq!(ssl_check(&ts, &sig).await.expect("request").status(), 200);
    assert_eq!(
        ssl_check(&ts, "v0=00").await.expect("request").status(),
        401
    );
    let big = vec![b' '; 8192];
    let r = deliver(&env.client, &gw.events(), TEST_SECRET, &big, None)
        .await
        .expect("request");
    assert_eq!(r.status(), 413);
    assert_eq!(env.count(Count::Receipts).await, 1);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_unroutable_deliveries_are_answered_and_recorded_minimally() {
    let env = Env::new().await;
    let gw = Gateway::start(&env.db, &env.prefix, &[]).await;
    // Signed but malformed: 400, no retry, a rejection record, no receipt.
    for bad in [
        &b"{not json"[..],
        br#"{"type":"event_callback","api_app_id":"A1","event_time":1,"event":{"type":"message"}}"#,
    ] {
        let r = deliver(&env.client, &gw.events(), TEST_SECRET, bad, None)
            .await
            .expect("request");
        assert_eq!(r.status(), 400);
        assert_eq!(
            r.headers().get("x-slack-no-retry").map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
    }
    // Unknown installation and a disabled one: 200, a rejection, no job.
    let stranger =
        serde_json::to_vec(&app_mention(APP, "T0OTHER", "Ev0UNK", "C1", "1.2")).expect("json");
    assert_eq!(
        deliver(&env.client, &gw.events(), TEST_SECRET, &stranger, None)
            .await
            .expect("req")
            .status(),
        200
    );
    testing::installations::insert_installation(
        &env.db.pool,
        &testing::installations::NewInstallation {
            id: uuid::Uuid::now_v7(),
            app_id: APP,
            team_id: "T0OFF",
            bot_user_id: "U",
            bot_id: "B",
            bot_token_sealed: None,
            bot_token_key_id: None,
            status: "disabled",
        },
    )
    .await
    .expect("insert");
    let off = serde_json::to_vec(&app_mention(APP, "T0OFF", "Ev0OFF", "C1", "1.2")).expect("json");
    assert_eq!(
        deliver(&env.client, &gw.events(), TEST_SECRET, &off, None)
            .await
            .expect("req")
            .status(),
        200
    );
    // Unknown event types and subtypes are kept, not refused.
    let mut other = app_mention(APP, TEAM, "Ev0OTH", "C1", "1.2");
    other["event"] =
        json!({"type": "message", "subtype": "channel_purpose", "channel": "C1", "ts": "1.3"});
    assert_eq!(
        deliver(
            &env.client,
            &gw.events(),
            TEST_SECRET,
            &serde_json::to_vec(&other).expect("json"),
            None
        )
        .await
        .expect("req")
        .status(),
        200
    );
    // app_rate_limited is an operator alert, recorded.
    let limited = json!({"token": "x", "type": "app_rate_limited", "team_id": TEAM, "minute_rate_limited": 1518467820, "api_app_id": APP});
    assert_eq!(
        deliver(
            &env.client,
            &gw.events(),
            TEST_SECRET,
            &serde_json::to_vec(&limited).expect("json"),
            None
        )
        .await
        .expect("req")
        .status(),
        200
    );

    let reasons = testing::rejections::rejections_by_reason(&env.db.pool)
        .await
        .expect("rejections");
    assert_eq!(
        reasons,
        vec![
            ("installation_disabled".into(), 1),
            ("malformed_json".into(), 1),
            ("missing_field".into(), 1),
            ("unknown_installation".into(), 1)
        ]
    );
    let receipts = testing::receipts::event_subtypes(&env.db.pool)
        .await
        .expect("receipts");
    assert_eq!(
        receipts,
        vec![("Ev0OTH".into(), Some("channel_purpose".into()))]
    );
    assert_eq!(env.count(Count::RateLimitNotices).await, 1);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_headers_are_stored_and_never_drop_a_delivery() {
    let env = Env::new().await;
    let gw = Gateway::start(&env.db, &env.prefix, &[]).await;
    // The first delivery we ever see may itself be a retry (the original
    // timed out before reaching us): it must still be accepted.
    let r = deliver(
        &env.client,
        &gw.events(),
        TEST_SECRET,
        &body("Ev0RTY"),
        Some((2, "http_timeout")),
    )
    .await
    .expect("req");
    assert_eq!(r.status(), 200);
    let row = testing::receipts::retry_headers(&env.db.pool, "Ev0RTY")
        .await
        .expect("receipt");
    assert_eq!(row, (2, Some("http_timeout".into())));
    assert_eq!(env.published_len(1).await, 1);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_spool_database_down_gives_503_and_no_message_then_recovers() {
    let env = Env::new().await;
    let gw = Gateway::start(
        &env.db,
        &env.prefix,
        &[
            ("THREADLINE_INSTALLATION_CACHE_MS", "0"),
            ("THREADLINE_SPOOL_ENABLED", "false"),
        ],
    )
    .await;
    env.db.take_down().await;
    for i in 0..3 {
        let r = deliver(
            &env.client,
            &gw.events(),
            TEST_SECRET,
            &body(&format!("Ev0DN{i}")),
            None,
        )
        .await
        .expect("req");
        assert_eq!(r.status(), 503, "delivery {i} while Postgres is down");
    }
    let ready = env
        .client
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 503);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stream_len(&env.js, &env.events_stream()).await, 0);

    env.db.bring_up().await;
    // Slack retries; now it lands exactly once.
    let r = eventually(
        "a 200 after Postgres returns",
        Duration::from_secs(10),
        || {
            let (client, url) = (env.client.clone(), gw.events());
            async move {
                let r = deliver(
                    &client,
                    &url,
                    TEST_SECRET,
                    &body("Ev0DN0"),
                    Some((1, "http_error")),
                )
                .await
                .ok()?;
                (r.status() == 200).then_some(r)
            }
        },
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(env.published_len(1).await, 1);
    assert_eq!(env.count(Count::Receipts).await, 1);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_publish_leaves_the_row_for_retry() {
    let env = Env::new().await;
    // Intake only, so the test drives the relay itself.
    let gw = Gateway::start(
        &env.db,
        &env.prefix,
        &[("THREADLINE_RELAY_ENABLED", "false")],
    )
    .await;
    for i in 0..3 {
        let r = deliver(
            &env.client,
            &gw.events(),
            TEST_SECRET,
            &body(&format!("Ev0PF{i}")),
            None,
        )
        .await
        .expect("req");
        assert_eq!(r.status(), 200);
    }
    let nats = async_nats::connect(nats_url()).await.expect("nats");
    let topology = Topology::new(env.prefix.clone());
    let relay = threadline_gateway::relay::Relay::new(
        env.db.pool.clone(),
        jetstream::new(nats),
        topology.clone(),
        threadline_gateway::relay::RelayConfig::new(100, Duration::from_millis(100)),
    );
    // No stream exists for the subject yet: JetStream refuses the publish.
    let err = relay
        .relay_once()
        .await
        .expect_err("publish must fail without a stream");
    assert!(format!("{err:#}").contains("not acknowledged"), "{err:#}");
    let (pending, attempts) = testing::outbox::failed_outbox(&env.db.pool)
        .await
        .expect("outbox");
    assert_eq!((pending, attempts), (3, 3));

    // The failed rows wait before their next try instead of blocking others.
    assert_eq!(env.count(Count::OutboxDeferred).await, 3);
    assert_eq!(relay.relay_once().await.expect("nothing is due yet"), 0);
    testing::outbox::make_outbox_due(&env.db.pool)
        .await
        .expect("time passes");
    topology.declare(&env.js).await.expect("declare");
    assert_eq!(env.count(Count::Outbox).await, 3, "failed rows stay");
    assert_eq!(relay.relay_once().await.expect("relay"), 3);
    assert_eq!(env.count(Count::Outbox).await, 0);
    assert_eq!(stream_len(&env.js, &env.events_stream()).await, 3);
    // Publishing the same rows again (a crash between PubAck and commit) is
    // dropped by the stream's duplicate window.
    testing::outbox::requeue_every_receipt(&env.db.pool)
        .await
        .expect("re-queue");
    assert_eq!(relay.relay_once().await.expect("relay"), 3);
    assert_eq!(stream_len(&env.js, &env.events_stream()).await, 3);
    gw.stop().await;
}

// ---- Invariant 10: a signed delivery with an identity is never dropped ----

/// Whether the gateway's `/metrics` says it sheds new work (`want`).
async fn shedding_is(env: &Env, gw: &Gateway, want: bool) {
    let line = format!("threadline_gateway_shedding {}", u8::from(want));
    eventually(
        &format!("{line} in /metrics"),
        Duration::from_secs(10),
        || {
            let (c, u, line) = (
                env.client.clone(),
                format!("{}/metrics", gw.url),
                line.clone(),
            );
            async move {
                let text = c.get(u).send().await.ok()?.text().await.ok()?;
                text.lines().any(|l| l == line).then_some(())
            }
        },
    )
    .await;
}

/// While at least the bound of one installation's requests wait parked,
/// that installation's new top-level questions are answered 503 before
/// anything is written (first try and Slack's immediate retry), and
/// another installation's are taken; once fewer than half the bound wait,
/// its questions are taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installation_with_parked_work_over_the_bound_has_its_new_questions_shed() {
    use threadline_domain::budget::{Limits, Verdict};
    use threadline_store::budgets;
    let env = Env::new().await;
    let busy = env.inst;
    let other_team = "T0OTHER";
    seed_installation(&env.db.pool, APP, other_team).await;
    let gw = Gateway::start(
        &env.db,
        &env.prefix,
        &[
            ("THREADLINE_SHED_PARKED", "4"),
            ("THREADLINE_INSTALLATION_CACHE_MS", "60000"),
        ],
    )
    .await;
    // Four of the busy installation's requests wait parked (a share of 0).
    let parked: Vec<budgets::Request> = (0..4)
        .map(|n| budgets::Request {
            installation: busy,
            receipt: uuid::Uuid::now_v7(),
            event_id: format!("Ev0PARK{n}"),
            channel: "C0TEST".into(),
            root_ts: format!("1700000000.00010{n}"),
            source_ts: format!("1700000000.00010{n}"),
            channel_ref: None,
        })
        .collect();
    let mut tx = env.db.pool.begin().await.expect("tx");
    let placed = budgets::admit_many(&mut tx, &parked, &Limits::default(), 0)
        .await
        .expect("parked");
    tx.commit().await.expect("commit");
    assert!(placed.iter().all(|a| a.verdict != Verdict::Admit));
    shedding_is(&env, &gw, true).await;

    let mention = |team: &str, id: &str| {
        serde_json::to_vec(&app_mention(APP, team, id, "C0TEST", "1700000000.000300"))
            .expect("json")
    };
    // (the gateway sheds only installations its cache holds: nothing waits
    // on Postgres before a delivery's answer; a reply in a thread is never
    // shed, and brings each installation into the cache)
    for (team, id) in [(TEAM, "Ev0PSR1"), (other_team, "Ev0PSR2")] {
        let mut reply = app_mention(APP, team, id, "C0TEST", "1700000000.000200");
        reply["event"]["thread_ts"] = json!("1700000000.000100");
        let reply = serde_json::to_vec(&reply).expect("json");
        assert_eq!(
            post(&env, &gw, &reply, None).await.0,
            200,
            "a reply in a thread"
        );
    }
    let busys = mention(TEAM, "Ev0PSH1");
    assert_eq!(
        post(&env, &gw, &busys, None).await,
        (503, false),
        "first try"
    );
    assert_eq!(
        post(&env, &gw, &busys, Some((1, "http_error"))).await,
        (503, false),
        "Slack's immediate retry"
    );
    assert_eq!(env.count(Count::Receipts).await, 2, "nothing written");
    assert_eq!(
        post(&env, &gw, &mention(other_team, "Ev0PSO1"), None)
            .await
            .0,
        200,
        "another installation's question is taken"
    );
    assert_eq!(
        post(&env, &gw, &busys, Some((2, "http_error"))).await.0,
        200,
        "the retry a minute later"
    );
    assert_eq!(env.count(Count::Receipts).await, 4);

    // Three are taken: one waits, below half the bound.
    for r in &parked[..3] {
        assert!(
            budgets::drop_parked(&env.db.pool, r.receipt)
                .await
                .expect("dropped")
        );
    }
    // (a shed try writes nothing: tried until taken)
    let again = mention(TEAM, "Ev0PSH2");
    eventually(
        "the busy installation's question taken again",
        Duration::from_secs(10),
        || async { (post(&env, &gw, &again, None).await.0 == 200).then_some(()) },
    )
    .await;
    assert_eq!(env.count(Count::Receipts).await, 5);
    gw.stop().await;
}

/// A signed delivery's answer: status and whether it says "do not retry".
async fn post(env: &Env, gw: &Gateway, body: &[u8], retry: Option<(u32, &str)>) -> (u16, bool) {
    let r = deliver(&env.client, &gw.events(), TEST_SECRET, body, retry)
        .await
        .expect("request");
    let no_retry = r.headers().get("x-slack-no-retry").map(|v| v.as_bytes()) == Some(b"1");
    (r.status().as_u16(), no_retry)
}

/// The state, parse error, installation and duplicate deliveries of a receipt.
async fn receipt(env: &Env, event_id: &str) -> testing::receipts::Intake {
    testing::receipts::intake_by_event(&env.db.pool, event_id)
        .await
        .expect(event_id)
}

async fn installation(env: &Env, team: &str) -> uuid::Uuid {
    testing::installations::installation_id(&env.db.pool, APP, team)
        .await
        .expect("installation")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slacks_documented_app_mention_is_accepted_with_its_outbox_row() {
    let env = Env::new().await;
    // The documentation example's own app and team.
    let inst = seed_installation(&env.db.pool, "A0MDYCDME", "T061EG9R6").await;
    let gw = Gateway::start(
        &env.db,
        &env.prefix,
        &[("THREADLINE_RELAY_ENABLED", "false")],
    )
    .await;
    // `event_time` in microseconds, `event_ts` without its dot,
    // `authed_users` and no `authorizations`: refused and lost before.
    let doc = threadline_testkit::fixture("events/app_mention.slack-docs.json");
    assert_eq!(post(&env, &gw, &doc, None).await, (200, false));

    let testing::receipts::Intake {
        state,
        parse_error,
        installation_id,
        ..
    } = receipt(&env, "Ev0LAN670R").await;
    assert_eq!(
        (state.as_str(), parse_error, installation_id),
        ("accepted", None, Some(inst))
    );
    let e = testing::receipts::parsed_event_by_event(&env.db.pool, "Ev0LAN670R")
        .await
        .expect("receipt");
    assert_eq!(
        (
            e.event_type.as_str(),
            e.channel_id.as_deref(),
            e.thread_ts.as_deref(),
            e.event_time_secs
        ),
        (
            "app_mention",
            Some("C0LAN2Q65"),
            Some("1515449522.000016"),
            Some(1_515_449_522)
        )
    );
    let payload = testing::outbox::outbox_payload(&env.db.pool)
        .await
        .expect("exactly one outbox row");
    let ev = EventAccepted::decode(payload.as_slice()).expect("EventAccepted");
    assert_eq!(
        (ev.event_id.as_str(), ev.event_time, ev.team_id.as_str()),
        ("Ev0LAN670R", 1_515_449_522, "T061EG9R6")
    );
    assert_eq!(env.count(Count::Rejections).await, 0);
    assert_eq!(env.count(Count::Unparsed).await, 0);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_with_an_identity_that_do_not_parse_are_held_as_unparsed() {
    let env = Env::new().await;
    let inst = installation(&env, TEAM).await;
    let gw = Gateway::start(
        &env.db,
        &env.prefix,
        &[("THREADLINE_RELAY_ENABLED", "false")],
    )
    .await;
    let with = |id: &str, team: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = app_mention(APP, team, id, "C0TEST", "1700000000.000400");
        edit(&mut v);
        serde_json::to_vec(&v).expect("json")
    };
    let cases = [
        // an `event` that is a string
        (
            "Ev0STR",
            TEAM,
            with("Ev0STR", TEAM, &|v| v["event"] = json!("hello")),
            "malformed_event",
            Some(inst),
        ),
        // a `ts` that is not a timestamp
        (
            "Ev0TS",
            TEAM,
            with("Ev0TS", TEAM, &|v| v["event"]["ts"] = json!("yesterday")),
            "malformed_event",
            Some(inst),
        ),
        // a type threadline cannot even name
        (
            "Ev0TYP",
            TEAM,
            with("Ev0TYP", TEAM, &|v| {
                v["event"]["type"] = json!("App Mention")
            }),
            "malformed_event",
            Some(inst),
        ),
        // an envelope field of the wrong type
        (
            "Ev0TIM",
            TEAM,
            with("Ev0TIM", TEAM, &|v| v["event_time"] = json!("soon")),
            "wrong_type",
            Some(inst),
        ),
        // no `event` at all
        (
            "Ev0NOE",
            TEAM,
            with("Ev0NOE", TEAM, &|v| {
                v.as_object_mut().map(|o| o.remove("event"));
            }),
            "missing_field",
            Some(inst),
        ),
        // an installation threadline does not know: held, installation unknown
        (
            "Ev0UNK",
            "T0OTHER",
            with("Ev0UNK", "T0OTHER", &|v| v["event"]["ts"] = json!("x")),
            "malformed_event",
            None,
        ),
    ];
    for (id, _, body, code, inst) in &cases {
        assert_eq!(post(&env, &gw, body, None).await, (200, false), "{id}");
        let testing::receipts::Intake {
            state,
            parse_error,
            installation_id,
            duplicate_deliveries: dups,
        } = receipt(&env, id).await;
        assert_eq!(
            (state.as_str(), installation_id, dups),
            ("unparsed", *inst, 0),
            "{id}"
        );
        let parse_error = parse_error.expect("a reason");
        assert!(
            parse_error.starts_with(&format!("{code}: ")),
            "{id}: {parse_error}"
        );
        // The stored body is the delivery exactly, for replay.
        let stored = testing::receipts::unparsed_body(&env.db.pool, id)
            .await
            .expect("stored body");
        assert_eq!(&stored, body, "{id}");
    }
    // The reason names fields, never the values that were sent.
    let reasons: Vec<String> = testing::receipts::parse_errors(&env.db.pool)
        .await
        .expect("reasons")
        .into_iter()
        .map(|r| r.expect("a reason"))
        .collect();
    assert!(
        reasons
            .iter()
            .all(|r| !r.contains("yesterday") && !r.contains("hello") && !r.contains("soon")),
        "{reasons:?}"
    );

    // Slack's retry of an unparsed delivery is a duplicate, counted.
    let (_, _, body, _, _) = &cases[1];
    for n in 1..=2 {
        assert_eq!(
            post(&env, &gw, body, Some((n, "http_timeout"))).await,
            (200, false)
        );
    }
    assert_eq!(receipt(&env, "Ev0TS").await.duplicate_deliveries, 2);
    assert_eq!(env.count(Count::Receipts).await, cases.len() as i64);
    assert_eq!(env.count(Count::Unparsed).await, cases.len() as i64);
    // Nothing goes downstream, and nothing was rejected.
    assert_eq!(env.count(Count::Outbox).await, 0);
    assert_eq!(env.count(Count::Rejections).await, 0);

    // What the parser tolerates is a normal receipt: an unknown block type
    // (blocks are not parsed at intake) and an unknown, well-named event type.
    let blocks =
        with(
            "Ev0BLK",
            TEAM,
            &|v| {
                v["event"]["blocks"] =
                    json!([{"type": "hologram_v9", "elements": [{"type": "sparkle"}]}])
            },
        );
    let other = with(
        "Ev0NEW",
        TEAM,
        &|v| v["event"] = json!({"type": "reaction_added", "user": "U1", "item": {"type": "message", "channel": "C1", "ts": "1.2"}, "event_ts": "1700000000000500"}),
    );
    for body in [&blocks, &other] {
        assert_eq!(post(&env, &gw, body, None).await, (200, false));
    }
    assert_eq!(receipt(&env, "Ev0BLK").await.state, "accepted");
    assert_eq!(receipt(&env, "Ev0NEW").await.state, "accepted");
    assert_eq!(env.count(Count::Outbox).await, 2);
    assert_eq!(env.count(Count::Unparsed).await, cases.len() as i64);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_without_an_identity_are_refused_without_retry_and_recorded() {
    let env = Env::new().await;
    let gw = Gateway::start(&env.db, &env.prefix, &[]).await;
    let bodies: [&[u8]; 7] = [
        b"{not json",
        b"[1, 2]",
        br#""event_callback""#,
        br#"{"type":"event_callback","api_app_id":"A0TEST","team_id":"T0TEST","event_time":1,"event":{"type":"message","ts":"x"}}"#,
        br#"{"type":"event_callback","api_app_id":"A0TEST","event_id":12,"team_id":"T0TEST","event_time":1,"event":{"type":"message","ts":"x"}}"#,
        br#"{"type":"event_callback","api_app_id":"A0TEST","event_id":"Ev0NOT","event_time":1,"event":{"type":"message","ts":"x"}}"#,
        br#"{"type":"event_callback","event_id":"Ev0NOA","team_id":"T0TEST","event_time":1,"event":{"type":"message","ts":"x"}}"#,
    ];
    for body in bodies {
        assert_eq!(
            post(&env, &gw, body, None).await,
            (400, true),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    assert_eq!(env.count(Count::Rejections).await, bodies.len() as i64);
    assert_eq!(env.count(Count::Receipts).await, 0);
    assert_eq!(env.count(Count::Unparsed).await, 0);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_spool_an_unparsed_delivery_gets_503_while_postgres_is_down_then_is_held_once() {
    let env = Env::new().await;
    let gw = Gateway::start(
        &env.db,
        &env.prefix,
        &[
            ("THREADLINE_INSTALLATION_CACHE_MS", "0"),
            ("THREADLINE_SPOOL_ENABLED", "false"),
        ],
    )
    .await;
    let mut v = app_mention(APP, TEAM, "Ev0UDN", "C0TEST", "1700000000.000500");
    v["event"]["ts"] = json!("not-a-ts");
    let body = serde_json::to_vec(&v).expect("json");
    env.db.take_down().await;
    assert_eq!(post(&env, &gw, &body, None).await, (503, false));
    env.db.bring_up().await;
    eventually(
        "a 200 after Postgres returns",
        Duration::from_secs(10),
        || {
            let (env, gw, body) = (&env, &gw, &body);
            async move {
                (post(env, gw, body, Some((1, "http_error"))).await == (200, false)).then_some(())
            }
        },
    )
    .await;
    assert_eq!(receipt(&env, "Ev0UDN").await.state, "unparsed");
    assert_eq!(env.count(Count::Receipts).await, 1);
    assert_eq!(env.count(Count::Unparsed).await, 1);
    assert_eq!(env.count(Count::Rejections).await, 0);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_an_unparsed_receipt_after_an_upgrade_accepts_it_once_and_deletes_its_body() {
    use threadline_store::receipts::{Replay, replay};
    let env = Env::new().await;
    let inst = installation(&env, TEAM).await;
    let gw = Gateway::start(&env.db, &env.prefix, &[]).await;

    // Held by an older gateway whose parser refused `event_time` in
    // microseconds; this version reads it.
    let hold = |id: &'static str, team: &'static str, installation: Option<uuid::Uuid>| {
        let mut v = app_mention(APP, team, id, "C0TEST", "1700000000.000600");
        v["event_time"] = json!(1_700_000_000_000_600_i64);
        let pool = env.db.pool.clone();
        async move {
            let rid = uuid::Uuid::now_v7();
            testing::receipts::insert_unparsed_receipt(
                &pool,
                &testing::receipts::NewUnparsedReceipt {
                    id: rid,
                    installation_id: installation,
                    api_app_id: APP,
                    event_id: id,
                    team_id: team,
                    event_type: "app_mention",
                    parse_error: "wrong_type: `event_time` has the wrong JSON type",
                    retry_num: 1,
                    body: &serde_json::to_vec(&v).expect("json"),
                },
            )
            .await
            .expect("an unparsed receipt");
            rid
        }
    };
    let old = hold("Ev0OLD", TEAM, Some(inst)).await;
    let stranger = hold("Ev0STR", "T0NONE", None).await;
    // Still unparseable today.
    let mut v = app_mention(APP, TEAM, "Ev0BAD", "C0TEST", "1.2");
    v["event"]["ts"] = json!("yesterday");
    assert_eq!(
        post(&env, &gw, &serde_json::to_vec(&v).expect("json"), None).await,
        (200, false)
    );
    let bad = testing::receipts::receipt_id_by_event(&env.db.pool, "Ev0BAD")
        .await
        .expect("id");

    assert_eq!(
        replay(&env.db.pool, old).await.expect("replay"),
        Replay::Accepted {
            installation_id: inst,
            event_type: "app_mention".into()
        }
    );
    let e = testing::receipts::parsed_event(&env.db.pool, old)
        .await
        .expect("receipt");
    assert_eq!(
        (
            e.state,
            e.installation_id,
            e.channel_id,
            e.thread_ts,
            e.event_time_secs
        ),
        (
            "accepted".into(),
            Some(inst),
            Some("C0TEST".into()),
            Some("1700000000.000600".into()),
            Some(1_700_000_000)
        )
    );
    // The body (message text) is gone with the replay; the relay publishes
    // the event like any other, under the receipt's id.
    assert_eq!(env.count(Count::UnparsedOf("Ev0OLD")).await, 0);
    assert_eq!(env.published_len(1).await, 1);
    let stream = env
        .js
        .get_stream(env.events_stream())
        .await
        .expect("stream");
    let msg = stream.get_raw_message(1).await.expect("the message");
    assert_eq!(
        msg.headers.get("Nats-Msg-Id").map(|v| v.as_str()),
        Some(format!("evt:{APP}:Ev0OLD").as_str())
    );
    let ev = EventAccepted::decode(msg.payload.as_ref()).expect("EventAccepted");
    assert_eq!(
        (ev.receipt_id, ev.event_time, ev.retry_num),
        (old.to_string(), 1_700_000_000, 1)
    );

    // Once only: a second replay, and Slack's late retry, change nothing.
    assert!(matches!(
        replay(&env.db.pool, old).await.expect("replay"),
        Replay::NotUnparsed { .. }
    ));
    let mut again = app_mention(APP, TEAM, "Ev0OLD", "C0TEST", "1700000000.000600");
    again["event_time"] = json!(1_700_000_000_i64);
    assert_eq!(
        post(
            &env,
            &gw,
            &serde_json::to_vec(&again).expect("json"),
            Some((2, "http_timeout"))
        )
        .await,
        (200, false)
    );
    assert_eq!(env.outbox_total().await, 1);

    // What still does not parse, or has no active installation, stays held
    // with its body; an unknown id says so.
    match replay(&env.db.pool, bad).await.expect("replay") {
        Replay::StillUnparsed { parse_error } => {
            assert!(
                parse_error.starts_with("malformed_event: "),
                "{parse_error}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        replay(&env.db.pool, stranger).await.expect("replay"),
        Replay::InstallationNotActive {
            installation: "unknown"
        }
    );
    assert_eq!(
        replay(&env.db.pool, uuid::Uuid::now_v7())
            .await
            .expect("replay"),
        Replay::NotFound
    );
    let held = testing::receipts::held_unparsed_event_ids(&env.db.pool)
        .await
        .expect("held");
    assert_eq!(held, ["Ev0BAD", "Ev0STR"]);
    assert_eq!(env.outbox_total().await, 1);
    gw.stop().await;
}

/// Waits up to `limit` for a notification on the relays' channel.
async fn notified(l: &mut sqlx::postgres::PgListener, limit: Duration) -> bool {
    tokio::time::timeout(limit, l.recv())
        .await
        .is_ok_and(|r| r.is_ok())
}

/// The intake's commits take no NOTIFY (whose cluster-wide lock would queue
/// them behind one another): its own relay is woken in-process, so with
/// the periodic sweep a minute away a delivery still reaches the bus at
/// once and nobody is notified; a gateway that does not relay wakes the
/// relays elsewhere after its commit; any other writer's insert still
/// notifies from the trigger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_intake_wakes_the_relays_after_its_commit_without_notify_in_it() {
    let env = Env::new().await;
    let mut l = sqlx::postgres::PgListener::connect_with(&env.db.pool)
        .await
        .expect("listener");
    l.listen(threadline_store::outbox::WAKE_CHANNEL)
        .await
        .expect("listen");
    let sweep_off = [("THREADLINE_RELAY_SWEEP_MS", "60000")];

    let relaying = Gateway::start(&env.db, &env.prefix, &sweep_off).await;
    let (status, _) = post(&env, &relaying, &body("EvWake1"), None).await;
    assert_eq!(status, 200);
    // Within published_len's 15 s: the sweep cannot have done it.
    assert_eq!(env.published_len(1).await, 1);
    assert!(
        !notified(&mut l, Duration::from_secs(1)).await,
        "the intake's transaction notified"
    );
    relaying.stop().await;

    let mut not_relaying = sweep_off.to_vec();
    not_relaying.push(("THREADLINE_RELAY_ENABLED", "false"));
    let intake_only = Gateway::start(&env.db, &env.prefix, &not_relaying).await;
    let (status, _) = post(&env, &intake_only, &body("EvWake2"), None).await;
    assert_eq!(status, 200);
    assert!(
        notified(&mut l, Duration::from_secs(10)).await,
        "a gateway without a relay woke no relay"
    );
    intake_only.stop().await;

    // Another writer (a plain session) still notifies on insert.
    let mut conn = env.db.pool.acquire().await.expect("conn");
    threadline_store::outbox::enqueue(
        &mut conn,
        installation(&env, TEAM).await,
        uuid::Uuid::now_v7(),
        Topic::Events,
        "wake-test",
        b"{}".to_vec(),
    )
    .await
    .expect("enqueue");
    assert!(
        notified(&mut l, Duration::from_secs(10)).await,
        "an ordinary outbox insert did not notify"
    );
}

fn spool_stream(env: &Env) -> String {
    Topology::new(env.prefix.clone()).stream(Topic::Spool)
}

/// A gateway that spools after 0.5 s, resolving installations afresh,
/// once its spool stream exists. (Its relay declares the bus as it starts,
/// beside the listener: a delivery spooled before that finds no stream and
/// is answered 503, which these tests do not test.)
async fn spooling_gateway(env: &Env) -> Gateway {
    let gw = Gateway::start(
        &env.db,
        &env.prefix,
        &[
            ("THREADLINE_INSTALLATION_CACHE_MS", "0"),
            ("THREADLINE_SPOOL_AFTER_MS", "500"),
        ],
    )
    .await;
    eventually(
        "the spool stream is declared",
        Duration::from_secs(20),
        || async { env.js.get_stream(spool_stream(env)).await.ok().map(|_| ()) },
    )
    .await;
    gw
}

async fn spool_drained(env: &Env) {
    eventually("the spool drained", Duration::from_secs(20), || async {
        (stream_len(&env.js, &spool_stream(env)).await == 0).then_some(())
    })
    .await;
}

/// Postgres down: each delivery is answered 200 once the broker holds it in
/// the spool (a retry of one is the same spooled message); nothing is
/// recorded or published yet. Once Postgres is back the drainer records
/// each exactly once, publishes its event, and empties the spool; a retry
/// after that is a duplicate of its receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_down_spools_deliveries_and_the_drainer_records_each_once() {
    let env = Env::new().await;
    let gw = spooling_gateway(&env).await;
    env.db.take_down().await;
    for i in 0..3 {
        assert_eq!(
            post(&env, &gw, &body(&format!("Ev0SP{i}")), None).await,
            (200, false),
            "delivery {i} while Postgres is down"
        );
    }
    // Slack's retry of one, still during the outage.
    assert_eq!(
        post(&env, &gw, &body("Ev0SP0"), Some((1, "http_timeout"))).await,
        (200, false)
    );
    assert_eq!(
        stream_len(&env.js, &spool_stream(&env)).await,
        3,
        "one spooled message per event"
    );
    let ready = env
        .client
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .expect("readyz");
    assert_eq!(
        ready.status(),
        200,
        "the spool keeps the gateway in service"
    );
    assert_eq!(stream_len(&env.js, &env.events_stream()).await, 0);

    env.db.bring_up().await;
    assert_eq!(env.published_len(3).await, 3);
    spool_drained(&env).await;
    assert_eq!(env.count(Count::Receipts).await, 3);
    let r = receipt(&env, "Ev0SP0").await;
    assert_eq!(r.duplicate_deliveries, 0, "{r:?}");
    // After the drain (and once this gateway's last spooling is a second
    // old), a retry goes to Postgres: a duplicate, counted.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        post(&env, &gw, &body("Ev0SP1"), Some((2, "http_timeout"))).await,
        (200, false)
    );
    assert_eq!(env.count(Count::Receipts).await, 3);
    assert_eq!(env.count(Count::DuplicateDeliveries).await, 1);
    assert_eq!(env.published_len(3).await, 3);
    gw.stop().await;
}

/// A delivery that does not parse is spooled like any other and drained
/// into an unparsed receipt (held with its body, nothing published).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unparsed_delivery_spooled_while_postgres_is_down_is_held_once() {
    let env = Env::new().await;
    let gw = spooling_gateway(&env).await;
    let mut v = app_mention(APP, TEAM, "Ev0USP", "C0TEST", "1700000000.000500");
    v["event"]["ts"] = json!("not-a-ts");
    let body = serde_json::to_vec(&v).expect("json");
    env.db.take_down().await;
    assert_eq!(post(&env, &gw, &body, None).await, (200, false));
    env.db.bring_up().await;
    eventually("held as unparsed", Duration::from_secs(20), || async {
        testing::receipts::count_unparsed_events_of(&env.db.pool, "Ev0USP")
            .await
            .ok()
            .filter(|n| *n == 1)
    })
    .await;
    spool_drained(&env).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stream_len(&env.js, &env.events_stream()).await, 0);
    gw.stop().await;
}

/// With Postgres and the broker both away nothing can keep a delivery:
/// 503, as without a spool, and Slack retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_postgres_and_the_broker_down_a_delivery_gets_503() {
    let env = Env::new().await;
    // (a port nothing listens on)
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let nowhere = format!("nats://127.0.0.1:{port}");
    let gw = Gateway::start(
        &env.db,
        &env.prefix,
        &[
            ("THREADLINE_INSTALLATION_CACHE_MS", "0"),
            ("THREADLINE_SPOOL_AFTER_MS", "500"),
            ("THREADLINE_RELAY_ENABLED", "false"),
            ("NATS_URL", &nowhere),
        ],
    )
    .await;
    env.db.take_down().await;
    assert_eq!(post(&env, &gw, &body("Ev0BD0"), None).await, (503, false));
    let ready = env
        .client
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 503, "nothing can keep deliveries");
    env.db.bring_up().await;
    let r = eventually(
        "a 200 once Postgres is back",
        Duration::from_secs(10),
        || async {
            let r = post(&env, &gw, &body("Ev0BD0"), Some((1, "http_error"))).await;
            (r == (200, false)).then_some(r)
        },
    )
    .await;
    assert_eq!(r, (200, false));
    assert_eq!(env.count(Count::Receipts).await, 1);
    gw.stop().await;
}

/// A gateway (re)started during a Postgres outage serves at once with its
/// spool, and its deliveries are recorded once Postgres is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_started_while_postgres_is_down_takes_deliveries_into_the_spool() {
    let env = Env::new().await;
    env.db.take_down().await;
    let gw = spooling_gateway(&env).await;
    let r = eventually("a 200 from the spool", Duration::from_secs(20), || async {
        // (until the relay has declared the spool: 503, Slack retries)
        let r = post(&env, &gw, &body("Ev0ST0"), None).await;
        (r == (200, false)).then_some(r)
    })
    .await;
    assert_eq!(r, (200, false));
    env.db.bring_up().await;
    assert_eq!(env.published_len(1).await, 1);
    assert_eq!(env.count(Count::Receipts).await, 1);
    gw.stop().await;
}

/// Slack's own bot-message fixture as a delivery of `event_id`, its inner
/// event changed by `edit`.
fn bot_message(event_id: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let raw = threadline_testkit::fixture(
        "events/message_bot_message_self_via_auth_test.bolt-python.json",
    );
    let mut v: serde_json::Value = serde_json::from_slice(&raw).expect("fixture");
    v["event_id"] = json!(event_id);
    edit(&mut v["event"]);
    serde_json::to_vec(&v).expect("json")
}

/// A gateway (no relay) of the bot of Slack's bot-message fixtures (app
/// `A111`, team `T111`, bot `BZYBOTHED`), holding the audit key as a
/// deployment's does (without it, our replies go downstream, whose records
/// name their channel).
async fn with_the_fixtures_bot() -> (Env, uuid::Uuid, Gateway) {
    threadline_runtime::audit::configure(&Source::from_pairs([(
        "THREADLINE_AUDIT_KEY",
        "5a".repeat(32).as_str(),
    )]))
    .expect("audit key");
    let env = Env::new().await;
    let inst = uuid::Uuid::now_v7();
    testing::installations::insert_installation(
        &env.db.pool,
        &testing::installations::NewInstallation {
            id: inst,
            app_id: "A111",
            team_id: "T111",
            bot_user_id: "W111",
            bot_id: "BZYBOTHED",
            bot_token_sealed: None,
            bot_token_key_id: None,
            status: "active",
        },
    )
    .await
    .expect("installation");
    let gw = Gateway::start(
        &env.db,
        &env.prefix,
        &[("THREADLINE_RELAY_ENABLED", "false")],
    )
    .await;
    (env, inst, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_own_reply_is_settled_at_intake_and_anything_else_goes_downstream() {
    let (env, _, gw) = with_the_fixtures_bot().await;
    let (ts, text) = (
        "1658282075.825129",
        "Hi there! This is a reply using response_url.",
    );
    // Our reply, then Slack's retry of it.
    let own = bot_message("Ev111", |_| {});
    assert_eq!(post(&env, &gw, &own, None).await, (200, false));
    assert_eq!(
        post(&env, &gw, &own, Some((1, "http_timeout"))).await,
        (200, false)
    );
    // Another app's message, and a change of our own reply: downstream.
    let other = bot_message("Ev112", |e| {
        e["bot_id"] = json!("B_DIFFERENT_ONE");
        e["ts"] = json!("1658282076.000001");
    });
    assert_eq!(post(&env, &gw, &other, None).await, (200, false));
    let changed = bot_message("Ev113", |e| {
        let previous = e.clone();
        let mut message = e.clone();
        message["text"] = json!("the whole answer");
        *e = json!({"type": "message", "subtype": "message_changed", "channel": "C111",
                    "hidden": true, "ts": "1658282077.000001", "event_ts": "1658282077.000001",
                    "message": message, "previous_message": previous});
    });
    assert_eq!(post(&env, &gw, &changed, None).await, (200, false));
    // Our next reply in the thread our first one started.
    let next = bot_message("Ev114", |e| {
        e["ts"] = json!("1658282078.000001");
        e["thread_ts"] = json!(ts);
    });
    assert_eq!(post(&env, &gw, &next, None).await, (200, false));

    let own_receipt = receipt(&env, "Ev111").await;
    assert_eq!(
        (own_receipt.state.as_str(), own_receipt.duplicate_deliveries),
        ("ignored", 1),
        "settled at intake, its retry counted on it"
    );
    let mut states = testing::receipts::states_and_reasons(&env.db.pool)
        .await
        .expect("receipts");
    states.sort();
    assert_eq!(
        states,
        [
            ("accepted".to_owned(), None),
            ("accepted".to_owned(), None),
            ("ignored".to_owned(), Some("own_bot".to_owned())),
            ("ignored".to_owned(), Some("own_bot".to_owned())),
        ]
    );
    assert_eq!(
        env.count(Count::Outbox).await,
        2,
        "an outbox row for each event that is not our new reply"
    );
    // Kept in the thread store as the context-builder keeps it: ours, with
    // its text, its new thread at version 0.
    assert_eq!(
        testing::threads::count_messages_by(&env.db.pool, ts, "assistant")
            .await
            .expect("messages"),
        1
    );
    assert_eq!(
        testing::threads::message_text(&env.db.pool, ts)
            .await
            .expect("text"),
        text
    );
    assert_eq!(
        testing::threads::version_of(&env.db.pool, ts)
            .await
            .expect("thread"),
        Some(0),
        "made by our first reply, left as it is by the next"
    );
    let thread: Vec<String> = testing::threads::thread_of(&env.db.pool, "C111", ts)
        .await
        .iter()
        .map(|line| line.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        thread,
        [
            format!("{ts} - assistant"),
            "1658282078.000001 - assistant".to_owned()
        ]
    );
    // One content-free audit record: received and settled.
    let trail = testing::audit::trail_of_event(&env.db.pool, "Ev111")
        .await
        .expect("audit");
    assert_eq!(
        trail
            .iter()
            .map(|r| (
                r.stage.as_str(),
                r.outcome.as_str(),
                r.channel_ref.is_some()
            ))
            .collect::<Vec<_>>(),
        [("intake", "ignored", true)],
        "received, settled, its channel pseudonymised"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_own_reply_goes_downstream_when_keeping_it_would_wait_on_another_writer() {
    let (env, inst, gw) = with_the_fixtures_bot().await;
    // Another transaction is writing that message's fact (as the
    // context-builder applying an edit of it would) and does not end.
    let mut other = env.db.pool.begin().await.expect("tx");
    testing::threads::insert_fact_in(&mut other, inst, "C111", "1658282075.825129", "create")
        .await
        .expect("fact");
    // Acknowledged all the same (the intake gives up after 1.5 s here,
    // which would answer 503).
    let own = bot_message("Ev121", |_| {});
    assert_eq!(post(&env, &gw, &own, None).await, (200, false));
    // Not settled: recorded as any event, for the context-builder.
    assert_eq!(receipt(&env, "Ev121").await.state, "accepted");
    assert_eq!(env.count(Count::Outbox).await, 1);
    other.rollback().await.expect("rollback");
    gw.stop().await;
}
