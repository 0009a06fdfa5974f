//! The gateway and the operator CLI as processes: crash recovery of the
//! outbox, start-up checks, and the CLI's ledger.

use std::time::Duration;

use serde_json::json;

use async_nats::jetstream;
use threadline_runtime::bus::{Topic, Topology};
use threadline_testkit::slack::{TEST_SECRET, app_mention, deliver, seed_installation};
use threadline_testkit::{TestDb, delete_streams, eventually, nats_url, stream_len, unique_prefix};
use threadline_tests::{cli, cli_with_stdin, free_port, otlp_collector, spawn_gateway};

fn gateway_env(db: &TestDb, prefix: &str, nats: String) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", db.url.clone()),
        ("NATS_URL", nats),
        ("THREADLINE_BUS_PREFIX", prefix.to_owned()),
        ("SLACK_SIGNING_SECRET", TEST_SECRET.to_owned()),
        ("THREADLINE_RELAY_SWEEP_MS", "200".to_owned()),
    ]
}

fn event(app: &str, team: &str, id: &str) -> Vec<u8> {
    serde_json::to_vec(&app_mention(app, team, id, "C0E2E", "1700000000.000200")).expect("json")
}

async fn pending(db: &TestDb) -> i64 {
    threadline_store::testing::outbox::count_outbox(&db.pool)
        .await
        .expect("outbox")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_rows_left_by_a_killed_gateway_are_published_after_restart() {
    let db = TestDb::new().await;
    seed_installation(&db.pool, "A0E2E", "T0E2E").await;
    let prefix = unique_prefix();
    let js = jetstream::new(async_nats::connect(nats_url()).await.expect("nats"));
    let stream = Topology::new(prefix.clone()).stream(Topic::Events);
    let client = reqwest::Client::new();

    // The broker is unreachable for this instance: intake still commits.
    let dead_nats = format!("nats://127.0.0.1:{}", free_port());
    let gw = spawn_gateway(&gateway_env(&db, &prefix, dead_nats)).await;
    for i in 0..25 {
        let r = deliver(
            &client,
            &gw.events_url(),
            TEST_SECRET,
            &event("A0E2E", "T0E2E", &format!("Ev0K{i:02}")),
            None,
        )
        .await
        .expect("delivery");
        assert_eq!(r.status(), 200);
    }
    gw.kill().await;
    assert_eq!(
        pending(&db).await,
        25,
        "every acknowledged event is in the outbox"
    );
    assert_eq!(stream_len(&js, &stream).await, 0);

    let gw = spawn_gateway(&gateway_env(&db, &prefix, nats_url())).await;
    eventually("the outbox drains after restart", Duration::from_secs(20), || {
        let (db, js, stream) = (&db, js.clone(), stream.clone());
        async move { (pending(db).await == 0 && stream_len(&js, &stream).await == 25).then_some(()) }
    })
    .await;
    assert!(
        gw.terminate().await.success(),
        "SIGTERM is a clean shutdown"
    );
    delete_streams(&js, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_refuses_to_start_on_bad_settings_or_an_unmigrated_database() {
    let out = tokio::process::Command::new(threadline_testkit::bin_path("threadline-gateway"))
        .env_clear()
        .output()
        .await
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("SLACK_SIGNING_SECRET"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = tokio::process::Command::new(threadline_testkit::bin_path("threadline-gateway"))
        .env_clear()
        .env("SLACK_SIGNING_SECRET", "x")
        .env("THREADLINE_INTAKE_WRITERS", "lots")
        .output()
        .await
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("THREADLINE_INTAKE_WRITERS"));

    // The relay (on by default) writes audit records: no key, no start,
    // and the error says which setting and why.
    let db = TestDb::empty().await;
    let out = tokio::process::Command::new(threadline_testkit::bin_path("threadline-gateway"))
        .env_clear()
        .env("SLACK_SIGNING_SECRET", "x")
        .env("DATABASE_URL", &db.url)
        .output()
        .await
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("THREADLINE_AUDIT_KEY") && err.contains("relay"),
        "{err}"
    );

    let out = tokio::process::Command::new(threadline_testkit::bin_path("threadline-gateway"))
        .env_clear()
        .env("SLACK_SIGNING_SECRET", "x")
        .env("THREADLINE_AUDIT_KEY", "5a".repeat(32))
        .env("DATABASE_URL", &db.url)
        .env(
            "THREADLINE_GATEWAY_ADDR",
            format!("127.0.0.1:{}", free_port()),
        )
        .env("THREADLINE_LOG_FORMAT", "text")
        .output()
        .await
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("threadline migrate"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A pod scheduled before Postgres accepts connections waits for it (and
/// says so) instead of exiting; once Postgres is back it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_started_while_postgres_is_down_waits_for_it_and_then_serves() {
    let db = TestDb::new().await;
    let prefix = unique_prefix();
    db.take_down().await;
    let env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("NATS_URL", nats_url()),
        ("THREADLINE_BUS_PREFIX", prefix.clone()),
        ("THREADLINE_TOKEN_KEYS", format!("k1:{}", "42".repeat(32))),
        ("THREADLINE_AUDIT_KEY", "5a".repeat(32)),
    ];
    let starting = tokio::spawn(async move { threadline_tests::spawn_context_builder(&env).await });
    // It is still waiting, and its log says on what.
    let log_dir = threadline_tests::log_dir();
    let name = db.name.clone();
    eventually(
        "a warning that Postgres is retried",
        Duration::from_secs(30),
        || {
            let (dir, name) = (log_dir.clone(), name.clone());
            async move {
                let entries = std::fs::read_dir(&dir).ok()?;
                entries
                    .filter_map(Result::ok)
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with("threadline-context-builder-")
                    })
                    .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                    .any(|t| {
                        t.contains(&name)
                            && t.contains("reading the database schema failed; retrying")
                    })
                    .then_some(())
            }
        },
    )
    .await;
    assert!(
        !starting.is_finished(),
        "it answered /healthz without a database"
    );
    db.bring_up().await;
    let cb = tokio::time::timeout(Duration::from_secs(60), starting)
        .await
        .expect("it comes up once Postgres is back")
        .expect("started");
    assert!(cb.terminate().await.success(), "it stops cleanly");
    let js = jetstream::new(async_nats::connect(nats_url()).await.expect("nats"));
    delete_streams(&js, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_cli_migrates_registers_and_reports_the_ledger() {
    let db = TestDb::empty().await;
    let prefix = unique_prefix();
    let keys = "k1:".to_owned() + &"11".repeat(32);
    let env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("THREADLINE_TOKEN_KEYS", keys.clone()),
    ];

    // Before migrating, operator commands refuse the old schema.
    let early = cli(&["stats", "--json"], &env).await;
    assert!(!early.status.success());
    assert!(
        String::from_utf8_lossy(&early.stderr).contains("run `threadline migrate`"),
        "{}",
        String::from_utf8_lossy(&early.stderr)
    );
    for _ in 0..2 {
        let out = cli(&["migrate"], &env).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let token = "xoxb-0000-1111-secretpart";
    let add = [
        "install",
        "add",
        "--team",
        "T0CLI",
        "--app",
        "A0CLI",
        "--bot-user",
        "U0BOT",
        "--bot-id",
        "B0BOT",
    ];
    // A token on the command line is refused, without echoing it, and
    // nothing is registered.
    for refused in [vec!["--token", token], vec![&format!("--token={token}")]] {
        let out = cli(&[&add[..], &refused[..]].concat(), &env).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains("--token is refused") && stderr.contains("--token-stdin"),
            "{stderr}"
        );
        assert!(!stderr.contains("secretpart"), "{stderr}");
    }
    assert!(
        matches!(
            threadline_store::testing::installations::first_id(&db.pool).await,
            Err(sqlx::Error::RowNotFound)
        ),
        "a refused token registers nothing"
    );
    // Without a token anywhere, it says where one may come from.
    let out = cli(&add, &env).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("SLACK_BOT_TOKEN"));
    // On standard input, then from a file, then from the environment: each
    // registers (updating in place).
    let file = std::env::temp_dir().join(format!("threadline-token-{}", uuid::Uuid::new_v4()));
    std::fs::write(&file, format!("{token}\n")).expect("token file");
    let path = file.to_string_lossy().into_owned();
    let mut with_env = env.clone();
    with_env.push(("SLACK_BOT_TOKEN", token.to_owned()));
    for out in [
        cli_with_stdin(
            &[&add[..], &["--token-stdin"]].concat(),
            &env,
            &format!("{token}\n"),
        )
        .await,
        cli(&[&add[..], &["--token-file", &path]].concat(), &env).await,
        cli(&add, &with_env).await,
    ] {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("secretpart"));
    }
    std::fs::remove_file(&file).expect("remove the token file");
    let threadline_store::testing::installations::CountAndBotToken {
        installations: n,
        sealed,
        key_id,
    } = threadline_store::testing::installations::count_and_bot_token(&db.pool)
        .await
        .expect("installation");
    assert_eq!(
        (n, key_id.as_str()),
        (1, "k1"),
        "re-adding updates in place"
    );
    assert!(
        !sealed.windows(10).any(|w| w == b"secretpart"),
        "token is stored encrypted"
    );

    // Without keys, or with a user token, registration is refused clearly.
    let out = cli(&add, &[with_env[0].clone(), with_env[2].clone()]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("THREADLINE_TOKEN_KEYS"));
    let mut user_token = env.clone();
    user_token.push(("SLACK_BOT_TOKEN", "xoxp-1".to_owned()));
    let out = cli(&add, &user_token).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a bot token"));

    let gw = spawn_gateway(&gateway_env(&db, &prefix, nats_url())).await;
    let client = reqwest::Client::new();
    for id in ["Ev0C1", "Ev0C2", "Ev0C1"] {
        let r = deliver(
            &client,
            &gw.events_url(),
            TEST_SECRET,
            &event("A0CLI", "T0CLI", id),
            None,
        )
        .await
        .expect("req");
        assert_eq!(r.status(), 200);
    }
    let r = deliver(&client, &gw.events_url(), TEST_SECRET, b"[]", None)
        .await
        .expect("req");
    assert_eq!(r.status(), 400);

    let stats = eventually(
        "stats show both events published",
        Duration::from_secs(15),
        || {
            let env = env.clone();
            async move {
                let out = cli(&["stats", "--json"], &env).await;
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let v: serde_json::Value =
                    serde_json::from_slice(&out.stdout).expect("stats is JSON");
                (v["outbox_published_total"] == 2).then_some(v)
            }
        },
    )
    .await;
    assert_eq!(stats["receipts_total"], 2);
    assert_eq!(stats["duplicate_deliveries_total"], 1);
    assert_eq!(stats["rejections_total"], 1);
    assert_eq!(stats["outbox_pending"], 0);
    assert!(gw.terminate().await.success());
    let js = jetstream::new(async_nats::connect(nats_url()).await.expect("nats"));
    delete_streams(&js, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_travels_from_the_request_through_the_outbox_to_the_bus() {
    let db = TestDb::new().await;
    seed_installation(&db.pool, "A0OTL", "T0OTL").await;
    let prefix = unique_prefix();
    let js = jetstream::new(async_nats::connect(nats_url()).await.expect("nats"));
    let (endpoint, spans) = otlp_collector().await;
    let mut env = gateway_env(&db, &prefix, nats_url());
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint));
    // Quiet logs must not switch tracing off.
    env.push(("RUST_LOG", "error".to_owned()));
    let gw = spawn_gateway(&env).await;
    let client = reqwest::Client::new();
    // A request to a path the gateway does not serve: no span names it.
    let stray = format!(
        "{}/slack/events/x-stray-path-{}",
        gw.base_url,
        unique_prefix()
    );
    let r = client.post(&stray).body("{}").send().await.expect("stray");
    assert_eq!(r.status(), 404);
    let r = deliver(
        &client,
        &gw.events_url(),
        TEST_SECRET,
        &event("A0OTL", "T0OTL", "Ev0OTL"),
        None,
    )
    .await
    .expect("delivery");
    assert_eq!(r.status(), 200);
    let stream = Topology::new(prefix.clone()).stream(Topic::Events);
    eventually("the event on the bus", Duration::from_secs(15), || {
        let (js, stream) = (js.clone(), stream.clone());
        async move { (stream_len(&js, &stream).await == 1).then_some(()) }
    })
    .await;
    let msg = js
        .get_stream(&stream)
        .await
        .expect("stream")
        .get_raw_message(1)
        .await
        .expect("message");
    let tp = msg
        .headers
        .get("traceparent")
        .map(|v| v.as_str().to_owned())
        .expect("traceparent header");
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{tp}");
    assert_eq!(
        (parts[0], parts[1].len(), parts[2].len()),
        ("00", 32, 16),
        "{tp}"
    );
    assert_ne!(parts[1], "0".repeat(32));
    assert!(gw.terminate().await.success());
    // Shutdown flushes the batch exporter: the request's span is in the
    // trace the bus message carries, under the gateway's service name.
    let spans = spans.lock().expect("spans").clone();
    let request = spans
        .iter()
        .find(|s| s.name == "http.request" && s.attribute("path") == Some("/slack/events"))
        .unwrap_or_else(|| panic!("the request span was exported: {spans:?}"));
    assert_eq!(request.service, "threadline-gateway");
    assert_eq!(request.trace_id, parts[1], "the bus message continues it");
    assert!(
        !format!("{spans:?}").contains("x-stray-path"),
        "a raw path reached a span: {spans:?}"
    );
    assert!(
        spans
            .iter()
            .any(|s| s.trace_id == parts[1] && s.attribute("event_id") == Some("Ev0OTL")),
        "the event's span names its event: {spans:?}"
    );
    delete_streams(&js, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_approval_records_the_reviewer_and_hands_over_to_the_publisher() {
    let db = TestDb::new().await;
    let prefix = unique_prefix();
    let js = jetstream::new(async_nats::connect(nats_url()).await.expect("nats"));
    Topology::new(prefix.clone())
        .declare(&js)
        .await
        .expect("topology");
    let (decision, other) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    for (id, ev) in [(decision, "Ev0R1"), (other, "Ev0R2")] {
        threadline_store::testing::decisions::insert_in_review(
            &db.pool,
            id,
            uuid::Uuid::now_v7(),
            uuid::Uuid::now_v7(),
            ev,
            "body",
        )
        .await
        .expect("decision");
    }
    // The broker is unreachable for the operator: approving needs only the
    // database.
    let env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("NATS_URL", "nats://127.0.0.1:9".to_owned()),
        ("THREADLINE_BUS_PREFIX", prefix.clone()),
    ];
    let out = cli(&["review", "list"], &env).await;
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(list.as_array().map(Vec::len), Some(2));
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("body"),
        "the list shows no text"
    );
    // The audit log records a handle, never an email address.
    let out = cli(
        &[
            "review",
            "approve",
            &decision.to_string(),
            "--by",
            "ana@example.com",
        ],
        &env,
    )
    .await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not an operator id"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(
        &["review", "approve", &decision.to_string(), "--by", "ana"],
        &env,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(
        &["review", "reject", &other.to_string(), "--by", "bo"],
        &env,
    )
    .await;
    assert!(out.status.success());
    assert!(
        !cli(&["review", "approve", &other.to_string()], &env)
            .await
            .status
            .success(),
        "a rejected proposal stays rejected"
    );
    let rows: Vec<(String, Option<String>)> =
        threadline_store::testing::decisions::statuses_and_reviewers(&db.pool)
            .await
            .expect("rows");
    assert_eq!(
        rows,
        vec![
            ("approved".into(), Some("ana".into())),
            ("rejected".into(), Some("bo".into()))
        ]
    );
    // Each review is an audit record with its reviewer, in the same
    // transaction as the decision it changed.
    let reviews: Vec<(String, Option<String>, bool)> =
        threadline_store::testing::audit::review_records(&db.pool, decision)
            .await
            .expect("audit")
            .into_iter()
            .map(|r| (r.outcome, r.reviewer, r.names_decision))
            .collect();
    assert_eq!(
        reviews,
        vec![
            ("approved".into(), Some("ana".into()), true),
            ("rejected".into(), Some("bo".into()), false)
        ]
    );
    // Only the approved proposal goes to the publisher, queued in the
    // outbox by the approval's own commit (the gateway's relay publishes
    // it), so a broker that is away cannot leave it approved but unsent.
    let queued: Vec<(String, String)> =
        threadline_store::testing::outbox::topics_and_msg_ids(&db.pool)
            .await
            .expect("outbox");
    assert_eq!(
        queued,
        vec![("proposals".to_owned(), format!("prop:{decision}:approved"))]
    );
    // A second approval is refused, and says the first one was queued.
    let again = cli(
        &["review", "approve", &decision.to_string(), "--by", "ana"],
        &env,
    )
    .await;
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already approved"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let stream = Topology::new(prefix.clone()).stream(Topic::Proposals);
    assert_eq!(
        stream_len(&js, &stream).await,
        0,
        "nothing published directly"
    );
    delete_streams(&js, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_intents_are_listed_and_settled_by_an_operator() {
    let db = TestDb::new().await;
    let (held, sent) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    for (id, state, ev) in [(held, "held", "Ev0H1"), (sent, "sent", "Ev0H2")] {
        threadline_store::testing::intents::insert_with_state(
            &db.pool,
            id,
            uuid::Uuid::now_v7(),
            ev,
            uuid::Uuid::now_v7(),
            uuid::Uuid::now_v7(),
            state,
        )
        .await
        .expect("intent");
    }
    let env = vec![("DATABASE_URL", db.url.clone())];
    let out = cli(&["intents", "list"], &env).await;
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(list.as_array().map(Vec::len), Some(1));
    assert_eq!(list[0]["id"], held.to_string());
    assert!(
        !cli(&["intents", "abandon", &sent.to_string()], &env)
            .await
            .status
            .success(),
        "only held intents are settled"
    );
    assert!(
        !cli(
            &[
                "intents",
                "mark-sent",
                &held.to_string(),
                "--ts",
                "yesterday"
            ],
            &env
        )
        .await
        .status
        .success()
    );
    let out = cli(
        &[
            "intents",
            "mark-sent",
            &held.to_string(),
            "--ts",
            "1700000000.000100",
        ],
        &env,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state: (String, Option<String>) =
        threadline_store::testing::intents::state_and_slack_ts(&db.pool, held)
            .await
            .expect("intent");
    assert_eq!(state, ("sent".into(), Some("1700000000.000100".into())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rotate_reseals_every_token_with_the_new_key() {
    let db = TestDb::new().await;
    // k1 is a symmetric key of before public-key sealing; the rotation
    // moves its tokens to the X25519 key k2.
    let (k1, k2) = (
        "k1:".to_owned() + &"11".repeat(32),
        threadline_tenancy::secrets::TokenKeys::generate_entry("k2"),
    );
    let add = [
        "install",
        "add",
        "--team",
        "T0ROT",
        "--app",
        "A0ROT",
        "--bot-user",
        "U0B",
        "--bot-id",
        "B0B",
    ];
    let out = cli(
        &add,
        &[
            ("DATABASE_URL", db.url.clone()),
            ("THREADLINE_TOKEN_KEYS", k1.clone()),
            ("SLACK_BOT_TOKEN", "xoxb-rotate-me-123".to_owned()),
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A rotating (OAuth) installation also holds a refresh token, sealed
    // with the same key.
    let inst: uuid::Uuid = threadline_store::testing::installations::first_id(&db.pool)
        .await
        .expect("installation");
    let only_k1 = threadline_tenancy::secrets::TokenKeys::parse(&k1.clone().into()).expect("keys");
    let refresh = threadline_tenancy::secrets::Seal::seal(
        &only_k1,
        b"xoxe-1-refresh-me",
        &threadline_tenancy::secrets::token_aad(&inst, "refresh"),
    )
    .expect("seal");
    threadline_store::testing::installations::set_refresh_token(
        &db.pool,
        inst,
        &refresh.bytes,
        &refresh.key_id,
    )
    .await
    .expect("refresh token");
    // Without the old key listed, rotation refuses rather than lose the token.
    let out = cli(
        &["keys", "rotate"],
        &[
            ("DATABASE_URL", db.url.clone()),
            ("THREADLINE_TOKEN_KEYS", k2.clone()),
        ],
    )
    .await;
    assert!(!out.status.success());
    let out = cli(
        &["keys", "rotate"],
        &[
            ("DATABASE_URL", db.url.clone()),
            ("THREADLINE_TOKEN_KEYS", format!("{k2},{k1}")),
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Both tokens are under k2 now, and k2 alone opens them.
    let only_k2 = threadline_tenancy::secrets::TokenKeys::parse(&k2.into()).expect("keys");
    for (kind, purpose, expected) in [
        (
            threadline_store::installations::TokenKind::Bot,
            "bot",
            "xoxb-rotate-me-123",
        ),
        (
            threadline_store::installations::TokenKind::Refresh,
            "refresh",
            "xoxe-1-refresh-me",
        ),
    ] {
        let (bytes, key): (Vec<u8>, String) =
            threadline_store::testing::installations::sealed_token(&db.pool, kind, inst)
                .await
                .expect("row");
        assert_eq!(key, "k2", "the {purpose} token is re-sealed");
        let token = only_k2
            .open(
                &threadline_tenancy::secrets::Sealed { key_id: key, bytes },
                &threadline_tenancy::secrets::token_aad(&inst, purpose),
            )
            .unwrap_or_else(|e| panic!("the {purpose} token opens with k2: {e}"));
        assert_eq!(secrecy::ExposeSecret::expose_secret(&token), expected);
    }
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 refresh token"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_commands_change_what_may_trigger() {
    let db = TestDb::empty().await;
    let env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("THREADLINE_TOKEN_KEYS", "k1:".to_owned() + &"33".repeat(32)),
    ];
    assert!(cli(&["migrate"], &env).await.status.success());
    let add = [
        "install",
        "add",
        "--team",
        "T0POL",
        "--app",
        "A0POL",
        "--bot-user",
        "U0B",
        "--bot-id",
        "B0B",
    ];
    let mut with_token = env.clone();
    with_token.push(("SLACK_BOT_TOKEN", "xoxb-p".to_owned()));
    assert!(cli(&add, &with_token).await.status.success());
    let id: uuid::Uuid = threadline_store::testing::installations::first_id(&db.pool)
        .await
        .expect("id");
    let id = id.to_string();
    let show = |env: Vec<(&'static str, String)>, id: String| async move {
        let out = cli(&["policy", "show", "--installation", &id], &env).await;
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("json")
    };
    let before = show(env.clone(), id.clone()).await;
    assert_eq!(
        (
            &before["dms"],
            &before["private_channels"],
            &before["shared_channels"]
        ),
        (&json!(false), &json!(false), &json!(false)),
        "denied by default"
    );
    let out = cli(
        &[
            "policy",
            "set",
            "--installation",
            &id,
            "--dms",
            "on",
            "--shared-channels",
            "on",
            "--approved-bots",
            "B0OTHER",
        ],
        &env,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        cli(
            &[
                "policy",
                "channel",
                "--installation",
                &id,
                "--channel",
                "C0OPS",
                "--mode",
                "keywords",
                "--keywords",
                "incident,outage"
            ],
            &env
        )
        .await
        .status
        .success()
    );
    assert!(
        !cli(
            &[
                "policy",
                "channel",
                "--installation",
                &id,
                "--channel",
                "C0OPS",
                "--mode",
                "keywords"
            ],
            &env
        )
        .await
        .status
        .success(),
        "keywords mode needs words"
    );
    assert!(
        !cli(
            &[
                "policy",
                "set",
                "--installation",
                &uuid::Uuid::now_v7().to_string(),
                "--dms",
                "on"
            ],
            &env
        )
        .await
        .status
        .success()
    );
    let after = show(env.clone(), id.clone()).await;
    assert_eq!(
        (
            &after["dms"],
            &after["private_channels"],
            &after["shared_channels"]
        ),
        (&json!(true), &json!(false), &json!(true))
    );
    assert_eq!(after["approved_bots"], json!(["B0OTHER"]));
    assert_eq!(
        after["channels"],
        json!([{"channel": "C0OPS", "mode": "keywords", "keywords": ["incident", "outage"], "allowed": false, "unfurl": null,
                 "streaming": null}])
    );
    // The allow-list: one private channel admitted by name, the keywords
    // channel listed without losing its mode, and answers only there.
    for args in [
        vec!["--channel", "G0PRIV", "--allow", "on"],
        vec!["--channel", "C0OPS", "--allow", "on"],
    ] {
        let mut full = vec!["policy", "channel", "--installation", id.as_str()];
        full.extend(args);
        let out = cli(&full, &env).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = cli(
        &[
            "policy",
            "set",
            "--installation",
            &id,
            "--allowlist-only",
            "on",
        ],
        &env,
    )
    .await;
    assert!(out.status.success());
    assert!(
        !cli(
            &[
                "policy",
                "channel",
                "--installation",
                &id,
                "--channel",
                "C0X"
            ],
            &env
        )
        .await
        .status
        .success(),
        "a channel rule needs --mode or --allow"
    );
    let listed = show(env.clone(), id).await;
    assert_eq!(listed["allowlist_only"], json!(true));
    assert_eq!(
        listed["channels"],
        json!([
            {"channel": "C0OPS", "mode": "keywords", "keywords": ["incident", "outage"], "allowed": true, "unfurl": null, "streaming": null},
            {"channel": "G0PRIV", "mode": "mentions", "keywords": [], "allowed": true, "unfurl": null, "streaming": null},
        ])
    );
}

/// Invariant 10 from the operator's side: deliveries held as `unparsed` are
/// listed without their bodies, replayed after an upgrade (the one this
/// version parses goes downstream once), counted in the ledger, and purged
/// past retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_cli_lists_replays_and_purges_unparsed_events() {
    let db = TestDb::new().await;
    let inst = seed_installation(&db.pool, "A0UNP", "T0UNP").await;
    let prefix = unique_prefix();
    let js = jetstream::new(async_nats::connect(nats_url()).await.expect("nats"));
    let gw = spawn_gateway(&gateway_env(&db, &prefix, nats_url())).await;
    let client = reqwest::Client::new();
    let env = vec![("DATABASE_URL", db.url.clone())];

    // Today's parser refuses a `ts` that is not a timestamp: held.
    let mut broken = app_mention("A0UNP", "T0UNP", "Ev0UNB", "C0UNP", "1700000000.000700");
    broken["event"]["ts"] = json!("yesterday");
    let text = broken["event"]["text"]
        .as_str()
        .expect("the fixture has text")
        .to_owned();
    let r = deliver(
        &client,
        &gw.events_url(),
        TEST_SECRET,
        &serde_json::to_vec(&broken).expect("json"),
        None,
    )
    .await
    .expect("delivery");
    assert_eq!(r.status(), 200);
    // Held by an older gateway that refused `event_time` in microseconds,
    // and one held 40 days ago that nobody replayed.
    let hold = |event_id: &'static str, body: serde_json::Value, age: Duration| {
        let pool = db.pool.clone();
        async move {
            let id = uuid::Uuid::now_v7();
            threadline_store::testing::receipts::insert_unparsed(
                &pool,
                &threadline_store::testing::receipts::HeldSince {
                    id,
                    installation_id: inst,
                    api_app_id: "A0UNP",
                    event_id,
                    team_id: "T0UNP",
                    parse_error: "wrong_type: `event_time` has the wrong JSON type",
                    body: &serde_json::to_vec(&body).expect("json"),
                    ago: age,
                },
            )
            .await
            .expect("an unparsed receipt");
            id
        }
    };
    let mut upgraded = app_mention("A0UNP", "T0UNP", "Ev0UNU", "C0UNP", "1700000000.000800");
    upgraded["event_time"] = json!(1_700_000_000_000_800_i64);
    let upgraded = hold("Ev0UNU", upgraded, Duration::from_secs(3600)).await;
    let mut old = broken.clone();
    old["event_id"] = json!("Ev0UNO");
    let old = hold("Ev0UNO", old, Duration::from_secs(40 * 86_400)).await;

    let ok = |out: &std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listed = ok(&cli(&["events", "unparsed"], &env).await);
    assert!(!listed.contains(&text), "the listing never shows the body");
    let listed: serde_json::Value = serde_json::from_str(&listed).expect("a JSON listing");
    let ids: Vec<&str> = listed
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| r["event_id"].as_str().expect("event_id"))
        .collect();
    assert_eq!(ids, ["Ev0UNO", "Ev0UNU", "Ev0UNB"], "oldest first");
    let first = &listed[2];
    assert_eq!(first["installation_id"], json!(inst.to_string()));
    assert_eq!(first["api_app_id"], "A0UNP");
    assert!(
        first["parse_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("malformed_event: ")),
        "{first}"
    );
    assert!(
        first["body_bytes"].as_i64().is_some_and(|n| n > 100),
        "{first}"
    );
    assert!(first["received_at"].is_string());

    // An unknown id is an error, and nothing is replayed.
    let stranger = uuid::Uuid::now_v7().to_string();
    let out = cli(
        &["events", "replay", &upgraded.to_string(), &stranger],
        &env,
    )
    .await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&stranger),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(pending(&db).await, 0);

    let out = ok(&cli(&["events", "replay", "--all"], &env).await);
    assert!(out.contains(&format!("{upgraded}: accepted")), "{out}");
    assert!(out.contains("still does not parse"), "{out}");
    assert!(out.contains("replayed 1 of 3, 2 left unparsed"), "{out}");
    let stream = Topology::new(prefix.clone()).stream(Topic::Events);
    eventually("the replayed event on the bus", Duration::from_secs(15), || {
        let (js, stream, db) = (js.clone(), stream.clone(), &db);
        async move { (pending(db).await == 0 && stream_len(&js, &stream).await == 1).then_some(()) }
    })
    .await;

    let stats: serde_json::Value =
        serde_json::from_str(&ok(&cli(&["stats", "--json"], &env).await)).expect("stats");
    assert_eq!(stats["receipts_by_state"]["unparsed"], 2, "{stats}");
    assert_eq!(stats["unparsed_pending_total"], 2, "{stats}");
    assert_eq!(stats["unparsed_by_reason"]["malformed_event"], 2, "{stats}");

    // Past the receipts' retention, the body goes and the receipt closes.
    let dry: serde_json::Value =
        serde_json::from_str(&ok(&cli(&["purge", "--dry-run"], &env).await)).expect("report");
    assert_eq!(
        (&dry["unparsed_bodies"], &dry["unparsed_expired"]),
        (&json!(1), &json!(1)),
        "{dry}"
    );
    ok(&cli(&["purge"], &env).await);
    let closed: (String, Option<String>) =
        threadline_store::testing::receipts::receipt_state(&db.pool, old)
            .await
            .expect("receipt");
    assert_eq!(closed, ("failed".into(), Some("unparsed_expired".into())));
    let bodies: Vec<String> = threadline_store::testing::receipts::unparsed_event_ids(&db.pool)
        .await
        .expect("bodies");
    assert_eq!(bodies, ["Ev0UNB"]);
    let stats: serde_json::Value =
        serde_json::from_str(&ok(&cli(&["stats", "--json"], &env).await)).expect("stats");
    assert_eq!(stats["unparsed_pending_total"], 1, "{stats}");

    assert!(gw.terminate().await.success());
    delete_streams(&js, &prefix).await;
}

/// A feature switch must name a feature threadline consults: a typo is
/// refused with the list (it used to be accepted and govern nothing), the
/// known names engage, and an old switch of any name can still be released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_switch_for_an_unknown_feature_is_refused_with_the_known_ones() {
    let db = TestDb::new().await;
    let env = vec![("DATABASE_URL", db.url.clone())];
    let out = cli(
        &[
            "kill-switch",
            "engage",
            "--feature",
            "reply",
            "--reason",
            "incident",
            "--by",
            "ops",
        ],
        &env,
    )
    .await;
    assert!(!out.status.success(), "a typo governs nothing: refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown feature") && err.contains("replies, tools"),
        "{err}"
    );
    let n: i64 = threadline_store::testing::kill_switches::count_rows(&db.pool)
        .await
        .expect("switches");
    assert_eq!(n, 0, "nothing was recorded");
    for feature in ["replies", "tools"] {
        let out = cli(
            &[
                "kill-switch",
                "engage",
                "--feature",
                feature,
                "--reason",
                "incident",
                "--by",
                "ops",
            ],
            &env,
        )
        .await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    threadline_store::kill_switches::set(&db.pool, "feature", "old-name", true, Some("x"), "ops")
        .await
        .expect("an old switch");
    let out = cli(
        &[
            "kill-switch",
            "release",
            "--feature",
            "old-name",
            "--by",
            "ops",
        ],
        &env,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let engaged: Vec<String> = threadline_store::testing::kill_switches::engaged_targets(&db.pool)
        .await
        .expect("switches");
    assert_eq!(engaged, ["replies", "tools"]);
}

/// The public gateway without the relay (per-role NATS users) never touches
/// the bus: with the broker unreachable it is ready and acknowledges signed
/// deliveries into the outbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_does_not_relay_is_ready_without_the_broker() {
    let db = TestDb::new().await;
    seed_installation(&db.pool, "A0NR", "T0NR").await;
    let prefix = unique_prefix();
    let dead_nats = format!("nats://127.0.0.1:{}", free_port());
    let mut env = gateway_env(&db, &prefix, dead_nats);
    env.push(("THREADLINE_RELAY_ENABLED", "false".to_owned()));
    let gw = spawn_gateway(&env).await;
    let client = reqwest::Client::new();
    let ready = client
        .get(format!("{}/readyz", gw.base_url))
        .send()
        .await
        .expect("readyz");
    assert_eq!(
        ready.status(),
        200,
        "{}",
        ready.text().await.unwrap_or_default()
    );
    let r = deliver(
        &client,
        &gw.events_url(),
        TEST_SECRET,
        &event("A0NR", "T0NR", "Ev0NR1"),
        None,
    )
    .await
    .expect("delivery");
    assert_eq!(r.status(), 200);
    assert_eq!(pending(&db).await, 1, "in the outbox, for the relay");
    assert!(gw.terminate().await.success());
}

/// Key rotation never undoes a refresh: a token refreshed between the
/// rotation's read and its write (sealed with the same key, as a replica
/// still on the old keys does) is not overwritten with the stale one, and
/// a token whose refresh holds the lease is not re-sealed under it (the
/// refresh's store, compare-and-set on the spent token, would then fail and
/// lose what Slack granted). `keys rotate` re-reads such tokens and
/// re-seals them once the refresh is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_rotation_never_overwrites_a_refreshed_token_nor_one_being_refreshed() {
    use threadline_store::installations::{self, SealedToken, TokenKind};
    use threadline_store::testing::installations as inst_testing;
    use threadline_tenancy::secrets::{Seal as _, Sealed, TokenKeys, token_aad};
    let db = TestDb::new().await;
    let inst = seed_installation(&db.pool, "A0RACE", "T0RACE").await;
    let k1 = "k1:".to_owned() + &"11".repeat(32);
    let both = format!("{},{k1}", TokenKeys::generate_entry("k2"));
    let old_keys = TokenKeys::parse(&k1.clone().into()).expect("keys");
    let new_keys = TokenKeys::parse(&both.clone().into()).expect("keys");
    let aad = token_aad(&inst, TokenKind::Refresh.purpose());
    let seal = |c: &TokenKeys, t: &str| c.seal(t.as_bytes(), &aad).expect("seal");
    let store = |s: &Sealed| {
        let (pool, bytes, key) = (db.pool.clone(), s.bytes.clone(), s.key_id.clone());
        async move {
            inst_testing::set_refresh_token(&pool, inst, &bytes, &key)
                .await
                .expect("store");
        }
    };
    let stored = || async {
        inst_testing::sealed_token(&db.pool, TokenKind::Refresh, inst)
            .await
            .expect("read")
    };
    let opened = |(bytes, key_id): (Vec<u8>, String)| {
        use secrecy::ExposeSecret as _;
        new_keys
            .open(&Sealed { key_id, bytes }, &aad)
            .expect("open")
            .expose_secret()
            .to_owned()
    };

    // The rotation reads the token (sealed with k1)…
    store(&seal(&old_keys, "xoxe-1-spent")).await;
    let (bytes, key_id) = stored().await;
    let old = SealedToken {
        id: inst,
        bytes,
        key_id,
    };
    let resealed = seal(&new_keys, "xoxe-1-spent");
    let new = SealedToken {
        id: inst,
        bytes: resealed.bytes.clone(),
        key_id: resealed.key_id.clone(),
    };
    // …a refresh on a replica still on k1 stores the token Slack granted…
    store(&seal(&old_keys, "xoxe-1-granted")).await;
    // …and the rotation's write must not put the spent one back.
    assert!(
        !installations::reseal(&db.pool, TokenKind::Refresh, &old, &new)
            .await
            .expect("reseal"),
        "the rotation overwrote a token refreshed since it read it"
    );
    assert_eq!(opened(stored().await), "xoxe-1-granted");

    // A refresh holds the lease on the token the rotation read: no write
    // under it.
    let (bytes, key_id) = stored().await;
    let old = SealedToken {
        id: inst,
        bytes: bytes.clone(),
        key_id,
    };
    let resealed = seal(&new_keys, "xoxe-1-granted");
    let new = SealedToken {
        id: inst,
        bytes: resealed.bytes,
        key_id: resealed.key_id,
    };
    let holder = uuid::Uuid::now_v7();
    assert!(
        threadline_store::tokens::take_refresh_lease(&db.pool, inst, &bytes, holder, 30.0)
            .await
            .expect("lease")
            .is_some(),
        "the refresh takes its lease"
    );
    assert!(
        !installations::reseal(&db.pool, TokenKind::Refresh, &old, &new)
            .await
            .expect("reseal"),
        "the rotation re-sealed a token a refresh was exchanging"
    );
    assert_eq!(stored().await.0, bytes, "untouched under the lease");
    // Once the lease is given back, the rotation goes through.
    threadline_store::tokens::give_back_refresh_lease(&db.pool, inst, holder, false)
        .await
        .expect("give back");
    assert!(
        installations::reseal(&db.pool, TokenKind::Refresh, &old, &new)
            .await
            .expect("reseal")
    );
    let (_, key_id) = stored().await;
    assert_eq!(key_id, "k2");
    assert_eq!(opened(stored().await), "xoxe-1-granted");
}
