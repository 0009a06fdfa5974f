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
    prefix: String,
    js: jetstream::Context,
    client: reqwest::Client,
}

impl Env {
    async fn new() -> Self {
        let db = TestDb::new().await;
        seed_installation(&db.pool, APP, TEAM).await;
        let nats = async_nats::connect(nats_url())
            .await
            .expect("NATS is reachable");
        Self {
            db,
            prefix: unique_prefix(),
            js: jetstream::new(nats),
            client: reqwest::Client::new(),
        }
    }

    fn events_stream(&self) -> String {
        Topology::new(self.prefix.clone()).stream(Topic::Events)
    }

    async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.db.pool)
            .await
            .expect(sql)
    }

    /// Outbox rows ever written: still pending plus published.
    async fn outbox_total(&self) -> i64 {
        self.count(
            "SELECT (SELECT count(*) FROM outbox)
                  + (SELECT coalesce(sum(published_total), 0) FROM outbox_ledger)::bigint",
        )
        .await
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
                    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
                        .fetch_one(&pool)
                        .await
                        .ok()?;
                    let n = stream_len(&js, &stream).await;
                    (pending == 0 && n >= expected).then_some(n)
                }
            },
        )
        .await
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let (js, prefix) = (self.js.clone(), self.prefix.clone());
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(threadline_testkit::delete_streams(&js, &prefix));
            }
        })
        .join();
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
    assert_eq!(env.count("SELECT count(*) FROM event_receipts").await, 1);
    assert_eq!(env.outbox_total().await, 1);
    assert_eq!(
        env.count("SELECT sum(duplicate_deliveries)::bigint FROM event_receipts")
            .await,
        39
    );
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
    assert_eq!(env.count("SELECT count(*) FROM outbox").await, 0);
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
    assert_eq!(env.count("SELECT count(*) FROM event_receipts").await, 1);
    assert_eq!(env.outbox_total().await, 1);
    assert_eq!(
        env.count("SELECT sum(duplicate_deliveries)::bigint FROM event_receipts")
            .await,
        49
    );
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
    assert_eq!(env.count("SELECT count(*) FROM event_receipts").await, 200);
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
    let (future_ts, future_sig) = signature(TEST_SECRET, now + 301, &body);
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
    assert_eq!(env.count("SELECT count(*) FROM event_receipts").await, 0);
    assert_eq!(env.count("SELECT count(*) FROM outbox").await, 0);
    // The genuine delivery still goes through.
    assert_eq!(
        post(Some(ts), Some(sig), body)
            .await
            .expect("request")
            .status(),
        200
    );
    assert_eq!(env.count("SELECT count(*) FROM event_receipts").await, 1);
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
    assert_eq!(env.count("SELECT count(*) FROM event_receipts").await, 1);
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
    sqlx::query("INSERT INTO installations (id, app_id, team_id, bot_user_id, bot_id, status) VALUES ($1, $2, 'T0OFF', 'U', 'B', 'disabled')")
        .bind(uuid::Uuid::now_v7())
        .bind(APP)
        .execute(&env.db.pool)
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

    let reasons: Vec<(String, i64)> =
        sqlx::query_as("SELECT reason, count(*) FROM rejections GROUP BY reason ORDER BY reason")
            .fetch_all(&env.db.pool)
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
    let receipts: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT event_id, event_subtype FROM event_receipts")
            .fetch_all(&env.db.pool)
            .await
            .expect("receipts");
    assert_eq!(
        receipts,
        vec![("Ev0OTH".into(), Some("channel_purpose".into()))]
    );
    assert_eq!(
        env.count("SELECT count(*) FROM app_rate_limit_notices")
            .await,
        1
    );
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
    let row: (i32, Option<String>) = sqlx::query_as(
        "SELECT retry_num, retry_reason FROM event_receipts WHERE event_id = 'Ev0RTY'",
    )
    .fetch_one(&env.db.pool)
    .await
    .expect("receipt");
    assert_eq!(row, (2, Some("http_timeout".into())));
    assert_eq!(env.published_len(1).await, 1);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_down_gives_503_and_no_message_then_recovers() {
    let env = Env::new().await;
    let gw = Gateway::start(
        &env.db,
        &env.prefix,
        &[("THREADLINE_INSTALLATION_CACHE_MS", "0")],
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
    assert_eq!(env.count("SELECT count(*) FROM event_receipts").await, 1);
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
        threadline_gateway::relay::RelayConfig {
            batch: 100,
            sweep: Duration::from_millis(100),
        },
    );
    // No stream exists for the subject yet: JetStream refuses the publish.
    let err = relay
        .relay_once()
        .await
        .expect_err("publish must fail without a stream");
    assert!(format!("{err:#}").contains("not acknowledged"), "{err:#}");
    let (pending, attempts): (i64, i64) = sqlx::query_as(
        "SELECT count(*), sum(attempts)::bigint FROM outbox WHERE last_error IS NOT NULL",
    )
    .fetch_one(&env.db.pool)
    .await
    .expect("outbox");
    assert_eq!((pending, attempts), (3, 3));

    // The failed rows wait before their next try instead of blocking others.
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE next_attempt_at > now()")
            .await,
        3
    );
    assert_eq!(relay.relay_once().await.expect("nothing is due yet"), 0);
    sqlx::query("UPDATE outbox SET next_attempt_at = now()")
        .execute(&env.db.pool)
        .await
        .expect("time passes");
    topology.declare(&env.js).await.expect("declare");
    assert_eq!(
        env.count("SELECT count(*) FROM outbox").await,
        3,
        "failed rows stay"
    );
    assert_eq!(relay.relay_once().await.expect("relay"), 3);
    assert_eq!(env.count("SELECT count(*) FROM outbox").await, 0);
    assert_eq!(stream_len(&env.js, &env.events_stream()).await, 3);
    // Publishing the same rows again (a crash between PubAck and commit) is
    // dropped by the stream's duplicate window.
    sqlx::query(
        "INSERT INTO outbox (installation_id, receipt_id, topic, msg_id, payload)
         SELECT installation_id, id, 'events', 'evt:' || api_app_id || ':' || event_id, '\\x00'::bytea
           FROM event_receipts",
    )
    .execute(&env.db.pool)
    .await
    .expect("re-queue");
    assert_eq!(relay.relay_once().await.expect("relay"), 3);
    assert_eq!(stream_len(&env.js, &env.events_stream()).await, 3);
    gw.stop().await;
}
