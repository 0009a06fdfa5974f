//! The context-builder against real Postgres, real NATS and slack-sim.

use std::time::Duration;

use async_nats::jetstream;
use prost::Message as _;
use serde_json::{Value, json};
use threadline_context_builder::backfill::BackfillLimits;
use threadline_context_builder::context::Limits;
use threadline_context_builder::{Handler, store};
use threadline_domain::classify::{Effect, MessageFacts, Speaker};
use threadline_domain::state::ReceiptState;
use threadline_proto::v1::{ContextReady, EventAccepted};
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::worker::Disposition;
use threadline_slack::WebClient;
use threadline_store::{policies, testing};
use threadline_tenancy::secrets::{Seal as _, TokenKeys, token_aad};
use threadline_testkit::{TestDb, delete_streams, nats_url, stream_len, unique_prefix};
use uuid::Uuid;

const BOT_USER: &str = "U0BOT";
const BOT_ID: &str = "B0BOT";
const APP: &str = "A0APP";

struct Env {
    db: TestDb,
    js: jetstream::Context,
    prefix: String,
    inst: Uuid,
    handler: Handler,
}

impl Env {
    async fn new(
        slack_api_url: &str,
        token: &str,
        limits: Limits,
        backfill: BackfillLimits,
    ) -> Self {
        let db = TestDb::new().await;
        let js = jetstream::new(async_nats::connect(nats_url()).await.expect("nats"));
        let prefix = unique_prefix();
        let topology = Topology::new(prefix.clone());
        topology.declare(&js).await.expect("topology");
        let keys = TokenKeys::generate_entry("k1");
        let cipher = TokenKeys::parse(&keys.clone().into()).expect("keys");
        let inst = Uuid::now_v7();
        let sealed = cipher
            .seal(token.as_bytes(), &token_aad(&inst, "bot"))
            .expect("seal");
        testing::installations::insert_installation(
            &db.pool,
            &testing::installations::NewInstallation {
                id: inst,
                app_id: APP,
                team_id: "T0TEAM",
                bot_user_id: BOT_USER,
                bot_id: BOT_ID,
                bot_token_sealed: Some(sealed.bytes.as_slice()),
                bot_token_key_id: Some(sealed.key_id.as_str()),
                status: "active",
            },
        )
        .await
        .expect("installation");
        // The test channel is known to be public, as a message event with
        // channel_type would have taught (an app_mention alone cannot).
        store::learn_channel_kind(&db.pool, inst, "C0CHAN", false, "event")
            .await
            .expect("channel kind");
        let handler = Handler {
            pool: db.pool.clone(),
            js: js.clone(),
            topology,
            web: WebClient::new(slack_api_url, Duration::from_secs(5)).expect("client"),
            cipher: TokenKeys::parse(&keys.into()).expect("keys"),
            refresher: None,
            limits,
            backfill,
            opens: threadline_context_builder::handler::opens(&db.pool, 64),
            applies: threadline_context_builder::handler::applies(
                &db.pool,
                64,
                store::AdmitRules::unlimited(),
            ),
            builds: threadline_context_builder::handler::builds(&db.pool, 64),
            finishes: threadline_context_builder::handler::finishes(&db.pool, 64),
            late_after: Duration::from_secs(300),
            admission: store::AdmitRules::unlimited(),
        };
        Self {
            db,
            js,
            prefix,
            inst,
            handler,
        }
    }

    /// Records a receipt the way the gateway does and returns the bus message.
    async fn receipt(&self, event_id: &str, event: Value) -> (Uuid, Vec<u8>) {
        let id = Uuid::now_v7();
        let ts = event["ts"]
            .as_str()
            .or_else(|| event.pointer("/message/ts").and_then(Value::as_str))
            .unwrap_or("")
            .to_owned();
        let channel = event["channel"].as_str().unwrap_or("C0CHAN").to_owned();
        testing::receipts::insert_accepted_receipt(
            &self.db.pool,
            &testing::receipts::NewAcceptedReceipt {
                id,
                installation_id: self.inst,
                api_app_id: APP,
                event_id,
                event_type: event["type"].as_str().unwrap_or("message"),
                channel_id: &channel,
                message_ts: &ts,
            },
        )
        .await
        .expect("receipt");
        let msg = EventAccepted {
            schema_version: 1,
            receipt_id: id.to_string(),
            installation_id: self.inst.to_string(),
            api_app_id: APP.into(),
            event_id: event_id.into(),
            channel_id: channel,
            message_ts: ts,
            event_json: serde_json::to_vec(&event).expect("json"),
            ..Default::default()
        };
        (id, msg.encode_to_vec())
    }

    /// Handles `event` as Slack delivered it `late_secs` after it happened
    /// (its `event_time` that long before the gateway received it).
    async fn handle_late(&self, event_id: &str, event: Value, late_secs: i64) -> Uuid {
        let (id, payload) = self.receipt(event_id, event).await;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64;
        let msg = EventAccepted {
            event_time: now_ms / 1000 - late_secs,
            received_at_unix_ms: now_ms,
            ..EventAccepted::decode(payload.as_slice()).expect("decode")
        };
        assert!(matches!(
            self.handler.handle(&msg.encode_to_vec()).await,
            Disposition::Done
        ));
        id
    }

    async fn handle(&self, event_id: &str, event: Value) -> Uuid {
        let (id, payload) = self.receipt(event_id, event).await;
        assert!(matches!(
            self.handler.handle(&payload).await,
            Disposition::Done
        ));
        id
    }

    async fn state(&self, receipt: Uuid) -> (String, Option<String>) {
        testing::receipts::receipt_state(&self.db.pool, receipt)
            .await
            .expect("receipt")
    }

    async fn version(&self, root: &str) -> i64 {
        testing::threads::max_thread_version(&self.db.pool, root)
            .await
            .expect("version")
    }

    async fn contexts(&self) -> Vec<ContextReady> {
        let stream = self.handler.topology.stream(Topic::Contexts);
        let n = stream_len(&self.js, &stream).await;
        let s = self.js.get_stream(&stream).await.expect("stream");
        let mut out = Vec::new();
        for seq in 1..=n {
            let m = s.get_raw_message(seq).await.expect("message");
            out.push(ContextReady::decode(m.payload.as_ref()).expect("ContextReady"));
        }
        out
    }

    async fn cleanup(self) {
        delete_streams(&self.js, &self.prefix).await;
    }
}

fn limits() -> Limits {
    Limits {
        max_messages: 50,
        max_bytes: 32 * 1024,
        max_age_secs: 30 * 24 * 3600,
    }
}

fn backfill_limits() -> BackfillLimits {
    BackfillLimits {
        max_pages: 10,
        page_size: 200,
        per_minute: 50,
    }
}

fn human(ts: &str, text: &str, thread_ts: Option<&str>) -> Value {
    let mut v = json!({"type": "message", "user": "U0ANA", "text": text, "ts": ts, "channel": "C0CHAN", "channel_type": "channel", "event_ts": ts});
    if let Some(t) = thread_ts {
        v["thread_ts"] = json!(t);
    }
    v
}

/// `v` with the `client_msg_id` of its person's action.
fn with_id(mut v: Value, id: &str) -> Value {
    v["client_msg_id"] = json!(id);
    v
}

fn mention(ts: &str, thread_ts: Option<&str>) -> Value {
    let mut v = human(ts, &format!("<@{BOT_USER}> what now?"), thread_ts);
    v["type"] = json!("app_mention");
    v.as_object_mut().expect("object").remove("channel_type");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_builds_one_versioned_context_and_its_message_twin_collapses() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    env.handle("Ev1", human("100.000001", "we have a problem", None))
        .await;
    let m = env
        .handle("Ev2", mention("100.000002", Some("100.000001")))
        .await;
    // message.channels for the same human message: the same turn.
    let mut twin = human(
        "100.000002",
        &format!("<@{BOT_USER}> what now?"),
        Some("100.000001"),
    );
    twin["client_msg_id"] = json!("x");
    let t = env.handle("Ev3", twin).await;
    assert_eq!(env.state(m).await, ("done".into(), None));
    assert_eq!(
        env.state(t).await,
        ("ignored".into(), Some("duplicate_turn".into()))
    );
    let ctx = env.contexts().await;
    assert_eq!(ctx.len(), 1, "one context for one turn");
    let c = &ctx[0];
    assert_eq!(
        (c.root_ts.as_str(), c.source_ts.as_str(), c.thread_version),
        ("100.000001", "100.000002", 2)
    );
    let texts: Vec<(&str, &str)> = c
        .messages
        .iter()
        .map(|m| (m.role.as_str(), m.text.as_str()))
        .collect();
    assert_eq!(
        texts,
        [
            ("user", "we have a problem"),
            ("user", "<@U0BOT> what now?")
        ]
    );
    assert!(!c.truncated && !c.backfill_partial);
    assert_eq!((c.omitted_messages, c.content_hash.len()), (0, 64));
    assert!(c.captured_at_unix_ms > 0);
    // A redelivery of finished work publishes nothing new.
    let (_, payload) = env
        .receipt("Ev2-again", mention("100.000002", Some("100.000001")))
        .await;
    assert!(matches!(
        env.handler.handle(&payload).await,
        Disposition::Done
    ));
    assert_eq!(env.contexts().await.len(), 1);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_own_reply_fed_back_is_recorded_but_produces_no_job() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    env.handle("Ev1", mention("200.000001", None)).await;
    let before = env.contexts().await.len();
    let echo = json!({"type": "message", "user": BOT_USER, "bot_id": BOT_ID, "app_id": APP, "text": format!("<@{BOT_USER}> answering"),
                      "ts": "200.000009", "thread_ts": "200.000001", "channel": "C0CHAN", "channel_type": "channel"});
    let r = env.handle("Ev2", echo).await;
    assert_eq!(
        env.state(r).await,
        ("ignored".into(), Some("own_bot".into()))
    );
    assert_eq!(
        env.contexts().await.len(),
        before,
        "the bot loop makes no job"
    );
    // Our reply is kept (later answers read it) but is no thread change:
    // an answer in flight to another request of the thread stays current.
    assert_eq!(
        env.version("200.000001").await,
        1,
        "our own reply does not bump the version"
    );
    let kept = testing::threads::count_messages_by(&env.db.pool, "200.000009", "assistant")
        .await
        .expect("message");
    assert_eq!(kept, 1, "our reply is in the thread store");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_change_the_thread_only_when_the_text_changes() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    env.handle("Ev1", human("300.000001", "draft", None)).await;
    let edit = |text: &str, edited: &str| {
        json!({"type": "message", "subtype": "message_changed", "channel": "C0CHAN", "hidden": true, "ts": edited, "event_ts": edited,
               "message": {"type": "message", "user": "U0ANA", "text": text, "ts": "300.000001", "edited": {"user": "U0ANA", "ts": edited}},
               "previous_message": {"type": "message", "user": "U0ANA", "text": "draft", "ts": "300.000001"}})
    };
    let same = env.handle("Ev2", edit("draft", "300.000005")).await;
    assert_eq!(
        env.state(same).await.1.as_deref(),
        Some("edit_without_text_change")
    );
    assert_eq!(env.version("300.000001").await, 1);
    let changed = env.handle("Ev3", edit("final", "300.000006")).await;
    assert_eq!(env.state(changed).await.1.as_deref(), Some("state_change"));
    assert_eq!(env.version("300.000001").await, 2);
    let text = testing::threads::message_text(&env.db.pool, "300.000001")
        .await
        .expect("text");
    assert_eq!(text, "final");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_source_before_processing_cancels_the_work() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let (trigger, payload) = env.receipt("Ev1", mention("400.000001", None)).await;
    let delete = json!({"type": "message", "subtype": "message_deleted", "channel": "C0CHAN", "hidden": true,
                        "deleted_ts": "400.000001", "ts": "400.000009", "event_ts": "400.000009",
                        "previous_message": {"type": "message", "user": "U0ANA", "text": "x", "ts": "400.000001"}});
    env.handle("Ev2", delete).await;
    assert_eq!(
        env.state(trigger).await,
        ("ignored".into(), Some("source_deleted".into()))
    );
    assert!(matches!(
        env.handler.handle(&payload).await,
        Disposition::Done
    ));
    assert!(
        env.contexts().await.is_empty(),
        "no context for a deleted request"
    );
    // Delivered the other way round (the mention is already being worked on): the tombstone still wins.
    let (trigger, payload) = env.receipt("Ev3", mention("401.000001", None)).await;
    testing::receipts::set_receipt_state(&env.db.pool, trigger, "processing", None)
        .await
        .expect("claim");
    env.handle("Ev4", json!({"type": "message", "subtype": "message_deleted", "channel": "C0CHAN", "deleted_ts": "401.000001",
                              "ts": "401.000009", "previous_message": {"ts": "401.000001", "text": "x", "user": "U0ANA"}})).await;
    assert!(matches!(
        env.handler.handle(&payload).await,
        Disposition::Done
    ));
    assert_eq!(
        env.state(trigger).await,
        ("ignored".into(), Some("source_deleted".into()))
    );
    assert!(env.contexts().await.is_empty());
    env.cleanup().await;
}

/// A batch of builds (one transaction) reads as the builds one by one: a
/// source deleted after its turn was claimed finishes only its own receipt
/// as ignored; a receipt built twice in one batch keeps one context and
/// gets a record per build; the others are recorded and left for their
/// publish. Finishing a batch as done ends each receipt once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_builds_reads_as_the_builds_one_by_one() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let mut receipts = Vec::new();
    for (i, (root, deleted)) in [
        ("500.000001", false),
        ("501.000001", true),
        ("502.000001", false),
    ]
    .into_iter()
    .enumerate()
    {
        let (id, _) = env.receipt(&format!("EvB{i}"), mention(root, None)).await;
        testing::receipts::set_receipt_state(&env.db.pool, id, "processing", None)
            .await
            .expect("claim");
        let message = testing::threads::NewMessage {
            ts: root,
            speaker: "user",
            user_id: Some("U0ANA"),
            bot_id: None,
            text: "a question",
            deleted,
        };
        testing::threads::insert_thread_messages(
            &env.db.pool,
            env.inst,
            "C0CHAN",
            root,
            &[message],
        )
        .await
        .expect("message");
        receipts.push((id, format!("EvB{i}"), root));
    }
    let job = |k: usize| store::BuildJob {
        snapshot: store::SnapshotJob {
            inst: env.inst,
            approved_bots: Vec::new(),
            channel: "C0CHAN".into(),
            root: receipts[k].2.into(),
            source_ts: receipts[k].2.into(),
            limits: limits(),
        },
        receipt: receipts[k].0,
        event_id: receipts[k].1.clone(),
        channel_ref: Some("ref".into()),
    };
    let outcomes = store::build_many(&env.db.pool, &[job(0), job(1), job(0), job(2)])
        .await
        .expect("builds");
    let recorded: Vec<Option<usize>> = outcomes
        .iter()
        .map(|o| match o {
            store::BuildOutcome::Recorded(s) => Some(s.built.messages.len()),
            store::BuildOutcome::SourceDeleted => None,
        })
        .collect();
    assert_eq!(recorded, [Some(1), None, Some(1), Some(1)]);
    assert_eq!(
        env.state(receipts[1].0).await,
        ("ignored".into(), Some("source_deleted".into()))
    );
    for k in [0, 2] {
        assert_eq!(
            env.state(receipts[k].0).await.0,
            "processing",
            "left for its publish"
        );
    }
    for (k, contexts, built) in [(0, 1, 2), (1, 0, 0), (2, 1, 1)] {
        let n = testing::threads::context_count(&env.db.pool, receipts[k].0)
            .await
            .expect("contexts");
        assert_eq!(n, contexts, "contexts of receipt {k}");
        let trail = testing::audit::trail_of_event(&env.db.pool, &receipts[k].1)
            .await
            .expect("trail");
        let records = trail
            .iter()
            .filter(|r| r.outcome == "context_built")
            .count();
        assert_eq!(records, built, "context records of receipt {k}");
    }
    // Two receipts whose context was never recorded (their requests ended
    // another way).
    for (i, root) in [(3, "503.000001"), (4, "504.000001")] {
        let (id, _) = env.receipt(&format!("EvB{i}"), mention(root, None)).await;
        testing::receipts::set_receipt_state(&env.db.pool, id, "processing", None)
            .await
            .expect("claim");
        receipts.push((id, format!("EvB{i}"), root));
    }
    // Done, in one statement: the twice-named receipt ends once, the
    // ignored one not at all. A receipt handed on with its context gets no
    // record of its own (its `context_built` stands for it); one without a
    // context gets its `done`.
    let ending = |k: usize| store::Ending {
        receipt: receipts[k].0,
        installation: env.inst,
        channel: "C0CHAN".into(),
        pseudonym: Some("ref".into()),
    };
    // (receipt 4 named with another channel than its event's: its record
    // gets no pseudonym)
    let elsewhere = store::Ending {
        channel: "C0ELSE".into(),
        ..ending(4)
    };
    let mut conn = env.db.pool.acquire().await.expect("conn");
    let ended = store::finish_many(
        &mut conn,
        &[
            ending(0),
            ending(1),
            ending(2),
            ending(0),
            ending(3),
            elsewhere,
        ],
        ReceiptState::Done,
        None,
    )
    .await
    .expect("finish");
    assert_eq!(ended, [true, false, true, false, true, true]);
    for (k, state, records) in [
        (0, "done", 0),
        (1, "ignored", 0),
        (2, "done", 0),
        (3, "done", 1),
        (4, "done", 1),
    ] {
        assert_eq!(env.state(receipts[k].0).await.0, state, "receipt {k}");
        let trail = testing::audit::trail_of_event(&env.db.pool, &receipts[k].1)
            .await
            .expect("trail");
        let done: Vec<_> = trail.iter().filter(|r| r.outcome == "done").collect();
        assert_eq!(done.len(), records, "done records of receipt {k}");
        if let Some(d) = done.first() {
            let pseudonym = (k == 3).then_some("ref");
            assert_eq!(
                d.channel_ref.as_deref(),
                pseudonym,
                "receipt {k}'s pseudonym"
            );
        }
    }
    env.cleanup().await;
}

fn facts(ts: &str, root: &str, text: &str, edited: Option<&str>) -> MessageFacts {
    MessageFacts {
        ts: ts.into(),
        root_ts: root.into(),
        speaker: Speaker::Human,
        user_id: Some("U0ANA".into()),
        bot_id: None,
        text: text.into(),
        changed_ts: edited.map(str::to_owned),
        client_msg_id: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shuffled_duplicated_concurrent_changes_converge_to_one_version_and_content() {
    let root = "500.000001";
    let effects = vec![
        Effect::Upsert(facts(root, root, "root", None)),
        Effect::Upsert(facts("500.000002", root, "a", None)),
        Effect::Upsert(facts("500.000003", root, "b", None)),
        Effect::Edit(facts("500.000002", root, "a1", Some("500.000010"))),
        Effect::Edit(facts("500.000002", root, "a2", Some("500.000020"))),
        Effect::Upsert(facts("500.000004", root, "c", None)),
        Effect::Delete {
            ts: "500.000003".into(),
            root_ts: root.into(),
        },
        Effect::Edit(facts("500.000003", root, "b1", Some("500.000030"))),
        // Our own reply: kept, without a version of its own.
        Effect::Upsert(MessageFacts {
            speaker: Speaker::Assistant,
            user_id: None,
            bot_id: Some("B0BOT".into()),
            ..facts("500.000005", root, "an answer", None)
        }),
        // An edit that arrives before its message's create: the create
        // keeps the edit.
        Effect::Edit(facts("500.000006", root, "d1", Some("500.000060"))),
        Effect::Upsert(facts("500.000006", root, "d", None)),
    ];
    let reply = effects
        .iter()
        .position(|e| matches!(e, Effect::Upsert(f) if f.speaker == Speaker::Assistant))
        .expect("our reply is among the effects");
    let mut results = Vec::new();
    // Orders 0-3: shuffled, two concurrent replicas; 4: one replica that
    // applies our reply before anything of the thread exists.
    for order in 0..5u64 {
        let db = TestDb::new().await;
        let inst = Uuid::now_v7();
        // Shuffle deterministically per order, and deliver everything twice
        // from two concurrent "replicas".
        let mut seq: Vec<usize> = (0..effects.len()).collect();
        let mut x = order.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for i in (1..seq.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            seq.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let replica = |seq: Vec<usize>| {
            let (pool, effects) = (db.pool.clone(), effects.clone());
            tokio::spawn(async move {
                for i in seq {
                    let mut tx = pool.begin().await.expect("tx");
                    store::apply(&mut tx, inst, "C0CHAN", &effects[i])
                        .await
                        .expect("apply");
                    tx.commit().await.expect("commit");
                }
            })
        };
        if order == 4 {
            seq.retain(|i| *i != reply);
            seq.insert(0, reply);
            replica(seq).await.expect("replica");
        } else {
            let mut reversed = seq.clone();
            reversed.reverse();
            let (a, b) = (replica(seq), replica(reversed));
            a.await.expect("replica a");
            b.await.expect("replica b");
        }
        let version = testing::threads::thread_version(&db.pool, root)
            .await
            .expect("v");
        let content: Vec<(String, String, bool)> = testing::threads::message_contents(&db.pool)
            .await
            .expect("content")
            .into_iter()
            .map(|m| (m.ts, m.text, m.deleted))
            .collect();
        results.push((version, content));
    }
    assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:#?}");
    let (version, content) = &results[0];
    assert_eq!(
        *version, 10,
        "ten distinct facts of people; our reply makes no version"
    );
    assert_eq!(
        content,
        &vec![
            ("500.000001".into(), "root".into(), false),
            ("500.000002".into(), "a2".into(), false),
            ("500.000003".into(), String::new(), true),
            ("500.000004".into(), "c".into(), false),
            ("500.000005".into(), "an answer".into(), false),
            ("500.000006".into(), "d1".into(), false),
        ]
    );
}

/// A slack-sim with one thread of `replies` replies and the app installed.
async fn sim_thread(
    replies: usize,
    non_marketplace: bool,
) -> (String, String, String, String, String) {
    let sim = threadline_slack_sim::Sim::new(5);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", l.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(l, threadline_slack_sim::router(sim)).await });
    let ws = threadline_testkit::sim::SimWorkspace::create(
        &base,
        json!({"non_marketplace_limits": non_marketplace}),
        &["channels:history"],
        Some("C0CHAN"),
    )
    .await;
    let root = ws.post("old incident", None).await;
    for i in 0..replies {
        ws.post(&format!("note {i}"), Some(&root)).await;
    }
    let ask = ws
        .post(&format!("<@{}> summary?", ws.bot_user()), Some(&root))
        .await;
    (format!("{base}/api/"), ws.token(), root, ask, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_in_an_unseen_thread_backfills_it_page_by_page() {
    let (api, token, root, ask, base) = sim_thread(40, false).await;
    let env = Env::new(
        &api,
        &token,
        limits(),
        BackfillLimits {
            max_pages: 10,
            page_size: 10,
            per_minute: 50,
        },
    )
    .await;
    let r = env.handle("Ev1", mention(&ask, Some(&root))).await;
    assert_eq!(env.state(r).await.0, "done");
    let ctx = env.contexts().await;
    assert_eq!(ctx.len(), 1);
    let c = &ctx[0];
    assert_eq!(c.messages.len(), 42, "root, 40 replies and the question");
    assert_eq!(c.messages[0].text, "old incident");
    assert_eq!(c.messages.last().map(|m| m.source_ts_is(&ask)), Some(true));
    assert!(!c.backfill_partial && !c.truncated);
    let calls: Value = reqwest::get(format!("{base}/_sim/calls?method=conversations.replies"))
        .await
        .expect("calls")
        .json()
        .await
        .expect("json");
    assert_eq!(
        calls["calls"].as_array().map(Vec::len),
        Some(5),
        "42 messages at 10 a page"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_marketplace_backfill_stops_at_its_budget_and_says_so() {
    let (api, token, root, ask, _) = sim_thread(40, true).await;
    let env = Env::new(&api, &token, limits(), backfill_limits()).await;
    policies::set_installation_policy(
        &env.db.pool,
        env.inst,
        &policies::InstallationChanges {
            read_limits: Some("non_marketplace".into()),
            ..Default::default()
        },
    )
    .await
    .expect("policy");
    env.handle("Ev1", mention(&ask, Some(&root))).await;
    let c = env.contexts().await.pop().expect("a context");
    assert!(c.backfill_partial, "a partial backfill is never silent");
    // One call a minute, 15 messages a call: the first page, plus the question.
    assert_eq!(c.messages.len(), 16);
    let state = testing::threads::backfill_state(&env.db.pool, &root)
        .await
        .expect("thread");
    assert_eq!(state, "partial");
    env.cleanup().await;
}

trait SourceIs {
    fn source_ts_is(&self, ts: &str) -> bool;
}

impl SourceIs for threadline_proto::v1::ContextMessage {
    fn source_ts_is(&self, ts: &str) -> bool {
        self.ts == ts
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_after_the_answer_is_recorded_never_reanswered() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    env.handle("Ev1", mention("600.000001", None)).await;
    assert_eq!(env.contexts().await.len(), 1);
    // The publisher marks the turn answered when its reply is sent.
    testing::threads::set_turn_answered(&env.db.pool, "600.000001")
        .await
        .expect("answered");
    let edit = json!({"type": "message", "subtype": "message_changed", "channel": "C0CHAN", "ts": "600.000009",
        "message": {"type": "message", "user": "U0ANA", "text": format!("<@{BOT_USER}> what now, really?"), "ts": "600.000001",
                    "edited": {"user": "U0ANA", "ts": "600.000009"}},
        "previous_message": {"type": "message", "user": "U0ANA", "text": format!("<@{BOT_USER}> what now?"), "ts": "600.000001"}});
    let r = env.handle("Ev2", edit).await;
    assert_eq!(env.state(r).await.1.as_deref(), Some("state_change"));
    let changed = testing::threads::source_changed_after_answer(&env.db.pool, "600.000001")
        .await
        .expect("turn");
    assert_eq!(changed, Some(true), "recorded as 'answered source changed'");
    assert_eq!(env.contexts().await.len(), 1, "no second automatic answer");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_threads_are_truncated_deterministically_with_a_marker() {
    let small = Limits {
        max_messages: 5,
        max_bytes: 32 * 1024,
        max_age_secs: 30 * 24 * 3600,
    };
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        small,
        backfill_limits(),
    )
    .await;
    env.handle("Ev0", human("700.000001", "root", None)).await;
    for i in 2..20 {
        env.handle(
            &format!("Ev{i}"),
            human(
                &format!("700.0000{i:02}"),
                &format!("reply {i}"),
                Some("700.000001"),
            ),
        )
        .await;
    }
    env.handle("EvQ", mention("700.000050", Some("700.000001")))
        .await;
    let c = env.contexts().await.pop().expect("context");
    assert!(c.truncated);
    assert_eq!(c.omitted_messages, 15);
    let texts: Vec<&str> = c.messages.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(
        texts,
        [
            "root",
            "reply 17",
            "reply 18",
            "reply 19",
            "<@U0BOT> what now?"
        ]
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconsideration_rebuilds_the_latest_unanswered_request_at_the_new_version() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    env.handle("Ev1", mention("800.000001", None)).await;
    // A human reply lands while the first answer is being prepared.
    env.handle(
        "Ev2",
        human("800.000002", "actually it's the cache", Some("800.000001")),
    )
    .await;
    let reconsider = |version: i64| {
        threadline_proto::v1::Reconsider {
            schema_version: 1,
            installation_id: env.inst.to_string(),
            channel_id: "C0CHAN".into(),
            root_ts: "800.000001".into(),
            stale_version: version,
            reason: "version_changed".into(),
            ..Default::default()
        }
        .encode_to_vec()
    };
    assert!(matches!(
        env.handler.reconsider(&reconsider(1)).await,
        Disposition::Done
    ));
    let ctx = env.contexts().await;
    assert_eq!(ctx.len(), 2, "a fresh context for the same request");
    assert_eq!(
        (ctx[1].source_ts.as_str(), ctx[1].thread_version),
        ("800.000001", 2)
    );
    assert_eq!(
        ctx[1].messages.last().map(|m| m.text.as_str()),
        Some("actually it's the cache")
    );
    // Once answered, a reconsideration builds nothing.
    testing::threads::set_all_turns_answered(&env.db.pool)
        .await
        .expect("answered");
    env.handler.reconsider(&reconsider(2)).await;
    assert_eq!(env.contexts().await.len(), 2);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstalling_or_revoking_disables_the_installation_and_purges_its_tokens() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    // An OAuth installation with token rotation also holds a refresh token.
    testing::installations::set_refresh_token(&env.db.pool, env.inst, &[0x01, 0x02], "k1")
        .await
        .expect("refresh token");
    // A revocation of some other user's token changes nothing.
    let other = env
        .handle(
            "Ev0",
            json!({"type": "tokens_revoked", "tokens": {"oauth": ["U0SOMEONE"], "bot": []}}),
        )
        .await;
    assert_eq!(
        env.state(other).await,
        ("ignored".into(), Some("unhandled_type".into()))
    );
    let r = env
        .handle(
            "Ev1",
            json!({"type": "tokens_revoked", "tokens": {"oauth": [], "bot": [BOT_USER]}}),
        )
        .await;
    assert_eq!(
        env.state(r).await,
        ("done".into(), Some("tokens_revoked".into()))
    );
    let row = testing::installations::status_and_tokens_purged(&env.db.pool, env.inst)
        .await
        .expect("installation");
    assert_eq!(
        row,
        ("disabled".into(), true),
        "bot and refresh tokens purged"
    );
    // Work still queued for it stops without a context.
    let (m, payload) = env.receipt("Ev2", mention("900.000001", None)).await;
    env.handler.handle(&payload).await;
    assert_eq!(
        env.state(m).await,
        ("ignored".into(), Some("installation_disabled".into()))
    );
    assert!(env.contexts().await.is_empty());
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_connect_channels_are_recorded_but_never_answered_until_allowed() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let shared = |(id, payload): (Uuid, Vec<u8>)| {
        let mut m = EventAccepted::decode(payload.as_slice()).expect("decode");
        m.is_ext_shared_channel = true;
        (id, m.encode_to_vec())
    };
    let (r, payload) = shared(env.receipt("Ev1", mention("950.000001", None)).await);
    env.handler.handle(&payload).await;
    assert_eq!(
        env.state(r).await,
        ("ignored".into(), Some("shared_channel_denied".into()))
    );
    assert!(env.contexts().await.is_empty());
    assert_eq!(
        env.version("950.000001").await,
        1,
        "the message is still part of the thread"
    );
    policies::set_installation_policy(
        &env.db.pool,
        env.inst,
        &policies::InstallationChanges {
            shared_channels_allowed: Some(true),
            ..Default::default()
        },
    )
    .await
    .expect("allow");
    let (r, payload) = shared(
        env.receipt("Ev2", mention("950.000002", Some("950.000001")))
            .await,
    );
    env.handler.handle(&payload).await;
    assert_eq!(env.state(r).await.0, "done");
    assert_eq!(env.contexts().await.len(), 1);
    env.cleanup().await;
}

/// An installation that answers only in allow-listed channels ignores a
/// mention anywhere else (recorded, with its reason); a listed channel is
/// answered even when Slack Connect and of unknown kind, with no lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_allow_list_only_listed_channels_are_answered() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    policies::set_installation_policy(
        &env.db.pool,
        env.inst,
        &policies::InstallationChanges {
            allowlist_only: Some(true),
            ..Default::default()
        },
    )
    .await
    .expect("allow-list only");
    let (r, payload) = env.receipt("Ev1", mention("960.000001", None)).await;
    env.handler.handle(&payload).await;
    assert_eq!(
        env.state(r).await,
        ("ignored".into(), Some("channel_not_allowed".into()))
    );
    assert!(env.contexts().await.is_empty());
    assert_eq!(env.version("960.000001").await, 1, "still recorded");
    let channel = testing::receipts::receipt_channel(&env.db.pool, r)
        .await
        .expect("channel")
        .expect("a channel");
    policies::set_channel_policy(
        &env.db.pool,
        env.inst,
        &channel,
        &policies::ChannelChanges {
            allowed: Some(true),
            ..Default::default()
        },
    )
    .await
    .expect("allow the channel");
    let (r, payload) = env
        .receipt("Ev2", mention("960.000002", Some("960.000001")))
        .await;
    let mut m = EventAccepted::decode(payload.as_slice()).expect("decode");
    m.is_ext_shared_channel = true;
    env.handler.handle(&m.encode_to_vec()).await;
    assert_eq!(env.state(r).await.0, "done");
    assert_eq!(env.contexts().await.len(), 1);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_without_the_history_scope_is_refused_and_marked_partial() {
    let (api, token, root, ask, base) = sim_thread(5, false).await;
    let env = Env::new(&api, &token, limits(), backfill_limits()).await;
    testing::installations::set_scopes(
        &env.db.pool,
        env.inst,
        &["app_mentions:read", "chat:write"],
    )
    .await
    .expect("scopes");
    env.handle("Ev1", mention(&ask, Some(&root))).await;
    let c = env
        .contexts()
        .await
        .pop()
        .expect("a context, marked partial");
    assert!(c.backfill_partial);
    assert_eq!(c.messages.len(), 1, "only what the store had: the request");
    let calls: Value = reqwest::get(format!("{base}/_sim/calls?method=conversations.replies"))
        .await
        .expect("calls")
        .json()
        .await
        .expect("json");
    assert_eq!(
        calls["calls"].as_array().map(Vec::len),
        Some(0),
        "Slack was not asked"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_in_a_private_channel_with_a_c_id_is_denied_until_private_channels_are_allowed() {
    // Slack gives new private channels C… ids and an app_mention carries no
    // channel_type: the kind is asked of Slack (conversations.info) once.
    let sim = threadline_slack_sim::Sim::new(7);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", l.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(l, threadline_slack_sim::router(sim)).await });
    let ws = threadline_testkit::sim::SimWorkspace::create(
        &base,
        json!({}),
        &[
            "channels:history",
            "groups:history",
            "channels:read",
            "groups:read",
        ],
        Some("C0PUB"),
    )
    .await;
    ws.ctl(
        "channels",
        json!({"team_id": ws.team, "name": "secret", "kind": "private", "id": "C0PRIV",
               "members": [ws.user, ws.bot_user()]}),
    )
    .await;
    let env = Env::new(
        &format!("{base}/api/"),
        &ws.token(),
        limits(),
        backfill_limits(),
    )
    .await;
    let in_channel = |channel: &str, ts: &str| {
        let mut m = mention(ts, None);
        m["channel"] = json!(channel);
        m
    };
    let info_calls = || async {
        let v: Value = reqwest::get(format!("{base}/_sim/calls?method=conversations.info"))
            .await
            .expect("calls")
            .json()
            .await
            .expect("json");
        v["calls"].as_array().map(Vec::len).unwrap_or(0)
    };

    let r = env.handle("Ev1", in_channel("C0PRIV", "970.000001")).await;
    assert_eq!(
        env.state(r).await,
        ("ignored".into(), Some("private_channel_denied".into()))
    );
    let r = env.handle("Ev2", in_channel("C0PRIV", "970.000002")).await;
    assert_eq!(
        env.state(r).await.1.as_deref(),
        Some("private_channel_denied")
    );
    assert_eq!(info_calls().await, 1, "the answer is remembered");
    let r = env.handle("Ev3", in_channel("C0PUB", "970.000003")).await;
    assert_eq!(
        env.state(r).await.0,
        "done",
        "a public C channel is answered"
    );
    assert_eq!(env.contexts().await.len(), 1);
    let kinds: Vec<(String, bool, String)> =
        testing::channels::learned_kinds_except(&env.db.pool, "C0CHAN")
            .await
            .expect("kinds")
            .into_iter()
            .map(|k| (k.channel_id, k.is_private, k.learned_from))
            .collect();
    assert_eq!(
        kinds,
        [
            ("C0PRIV".to_owned(), true, "conversations.info".to_owned()),
            ("C0PUB".to_owned(), false, "conversations.info".to_owned())
        ]
    );

    // Without a scope to ask, an unknown channel is denied, and Slack is
    // not asked at all.
    testing::installations::set_scopes(&env.db.pool, env.inst, &["channels:history", "chat:write"])
        .await
        .expect("scopes");
    let r = env.handle("Ev4", in_channel("C0ELSE", "970.000004")).await;
    assert_eq!(
        env.state(r).await,
        ("ignored".into(), Some("channel_kind_unknown".into()))
    );
    assert_eq!(info_calls().await, 2);

    // Allowed: no lookup needed, and the private channel is answered.
    policies::set_installation_policy(
        &env.db.pool,
        env.inst,
        &policies::InstallationChanges {
            private_channels_allowed: Some(true),
            ..Default::default()
        },
    )
    .await
    .expect("allow");
    let r = env.handle("Ev5", in_channel("C0PRIV", "970.000005")).await;
    assert_eq!(env.state(r).await.0, "done");
    assert_eq!(env.contexts().await.len(), 2);
    env.cleanup().await;
}

/// The context the store reads page by page (sizes first, then the text of
/// only the chosen messages) is exactly the one the whole thread gives:
/// random threads with deleted messages (the root too), approved and
/// unapproved bots, multi-byte text, oversized pastes, long gaps in time
/// and threads longer than a page, under random limits, sources and
/// approved bots; read one by one, and again many threads in one batch
/// ([`store::snapshot_many`], as the context-builder's builds read them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_windowed_read_builds_the_same_context_as_the_whole_thread() {
    use threadline_context_builder::context::{self, StoredMessage};
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let mut inst = store::installation(&env.db.pool, env.inst)
        .await
        .expect("installation")
        .expect("installed");
    let mut seed: u64 = 0x5eed_c0de;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n.max(1)
    };
    let (mut truncated, mut paged) = (0, 0);
    let mut batch = Vec::new();
    for case in 0..80u64 {
        let mut secs = 1_000_000 + case * 1_000_000;
        let root = format!("{secs}.000000");
        let n = 1 + next(40) + if case % 5 <= 1 { 150 } else { 0 };
        // ts, speaker, user, bot, text, deleted
        type Row<'a> = (
            String,
            &'a str,
            Option<String>,
            Option<&'a str>,
            String,
            bool,
        );
        let mut rows: Vec<Row<'_>> = Vec::new();
        for i in 0..n {
            let ts = if i == 0 {
                root.clone()
            } else {
                secs += next(if case % 3 == 0 { 900 } else { 30 });
                format!("{secs}.{:06}", next(1_000_000))
            };
            if rows.iter().any(|r| r.0 == ts) {
                continue;
            }
            let (speaker, user, bot) = match next(10) {
                0 => ("bot", None, Some("B0GOOD")),
                1 => ("bot", None, Some("B0BAD")),
                2 => ("assistant", Some(BOT_USER.to_owned()), Some(BOT_ID)),
                _ => ("user", Some(format!("U{}", next(5))), None),
            };
            // Some threads end in a run of pastes too big to keep, so the
            // read must page past them.
            let pastes = case % 10 == 1 && i > n / 3;
            let text = match next(12) {
                _ if pastes => "paste ".repeat(400),
                0 => "paste ".repeat(400),
                1 => format!("héllo wörld {i} ").repeat(1 + next(20) as usize),
                _ => format!("message {i} ").repeat(1 + next(15) as usize),
            };
            rows.push((ts, speaker, user, bot, text, next(10) == 0));
        }
        let messages: Vec<testing::threads::NewMessage<'_>> = rows
            .iter()
            .map(|r| testing::threads::NewMessage {
                ts: &r.0,
                speaker: r.1,
                user_id: r.2.as_deref(),
                bot_id: r.3,
                text: &r.4,
                deleted: r.5,
            })
            .collect();
        testing::threads::insert_thread_messages(&env.db.pool, env.inst, "C0WIN", &root, &messages)
            .await
            .expect("thread");
        // Each thread its own version and backfill state (none for some),
        // so a read that takes another thread's shows.
        let (version, partial) = (case as i64 * 7 + 3, case % 4 == 1);
        if case % 5 != 4 {
            let backfill = if partial { "partial" } else { "complete" };
            store::set_backfill(&env.db.pool, env.inst, "C0WIN", &root, backfill)
                .await
                .expect("thread row");
            testing::threads::set_thread_version(&env.db.pool, env.inst, "C0WIN", &root, version)
                .await
                .expect("version");
        }
        let (version, partial) = if case % 5 == 4 {
            (0, false)
        } else {
            (version, partial)
        };
        // The reference: every readable message, oldest first.
        let mut sorted = rows.clone();
        sorted.sort_by(|a, b| {
            let f = |ts: &str| ts.parse::<f64>().unwrap_or(0.0);
            f(&a.0).total_cmp(&f(&b.0))
        });
        for _ in 0..4 {
            // Which other bots this read may see (a batch mixes them).
            let approved: &[&str] = [&["B0GOOD"][..], &[], &["B0BAD", "B0GOOD"]][next(3) as usize];
            let whole: Vec<StoredMessage> = sorted
                .iter()
                .filter(|r| !r.5 && (r.1 != "bot" || r.3.is_some_and(|b| approved.contains(&b))))
                .map(|r| StoredMessage {
                    ts: r.0.clone(),
                    speaker: r.1.to_owned(),
                    user_id: r.2.clone().or(r.3.map(str::to_owned)).unwrap_or_default(),
                    text: r.4.clone(),
                })
                .collect();
            inst.approved_bots = approved.iter().map(|b| b.to_string()).collect();
            let source = match next(6) {
                0 => root.clone(),
                1 => "1.000000".to_owned(),
                _ => rows[next(rows.len() as u64) as usize].0.clone(),
            };
            let limits = Limits {
                max_messages: [2, 3, 5, 20, 200][next(5) as usize],
                max_bytes: [300, 4_000, 1_000_000][next(3) as usize],
                max_age_secs: [600, 3_600, 30 * 24 * 3600][next(3) as usize],
            };
            let expected = context::build(&whole, &source, limits);
            let mut tx = store::begin_snapshot(&env.db.pool).await.expect("tx");
            let snap = store::snapshot(&mut tx, &inst, "C0WIN", &root, &source, limits)
                .await
                .expect("snapshot");
            tx.commit().await.expect("commit");
            assert_eq!(
                snap.built,
                expected,
                "case {case}: source {source}, {limits:?}, {} messages",
                rows.len()
            );
            assert_eq!(
                snap.source_deleted,
                rows.iter().any(|r| r.0 == source && r.5),
                "case {case}: source {source} deleted"
            );
            assert_eq!(
                (snap.version, snap.backfill_partial),
                (version, partial),
                "case {case}: the thread's own version and backfill state"
            );
            batch.push((
                store::SnapshotJob {
                    inst: inst.id,
                    approved_bots: inst.approved_bots.clone(),
                    channel: "C0WIN".into(),
                    root: root.clone(),
                    source_ts: source.clone(),
                    limits,
                },
                snap,
            ));
            truncated += usize::from(expected.omitted > 0);
            // A kept reply further back than one page of sizes proves a
            // read past the first page.
            let oldest_kept = expected
                .messages
                .iter()
                .skip(1)
                .filter(|m| m.ts != source)
                .filter_map(|m| whole.iter().position(|w| w.ts == m.ts))
                .min();
            paged += usize::from(
                oldest_kept.is_some_and(|i| whole.len() - i > limits.max_messages + 16 + 1),
            );
        }
    }
    // The same reads in batches of growing size (1, 2, 3, ..., up to what
    // the reads allow; each with its first read again at the end) give
    // each read's own snapshot.
    let (mut from, mut size, mut batches) = (0, 1, 0);
    while from < batch.len() {
        let chunk = &batch[from..(from + size).min(batch.len())];
        let mut jobs: Vec<store::SnapshotJob> = chunk.iter().map(|(j, _)| j.clone()).collect();
        jobs.push(jobs[0].clone());
        let mut tx = store::begin_snapshot(&env.db.pool).await.expect("tx");
        let snaps = store::snapshot_many(&mut tx, &jobs)
            .await
            .expect("snapshots");
        tx.commit().await.expect("commit");
        assert_eq!(snaps.len(), jobs.len(), "one snapshot per read");
        for (k, (job, one)) in chunk.iter().chain(&chunk[..1]).enumerate() {
            let many = &snaps[k];
            assert_eq!(
                (
                    &many.built,
                    many.version,
                    many.source_deleted,
                    many.backfill_partial
                ),
                (
                    &one.built,
                    one.version,
                    one.source_deleted,
                    one.backfill_partial
                ),
                "batch of {}: read {k} ({} {} {:?}, bots {:?})",
                jobs.len(),
                job.root,
                job.source_ts,
                job.limits,
                job.approved_bots
            );
        }
        from += size;
        size = size % 40 + 1;
        batches += 1;
    }
    // The cases reached what they are for.
    assert!(batches > 10, "only {batches} batches");
    assert!(truncated > 50, "only {truncated} truncated contexts");
    assert!(paged >= 3, "only {paged} reads past one page");
    env.cleanup().await;
}

/// The events of concurrent handlers are opened by one statement: each
/// answered in order as if alone, two deliveries of one event both begun
/// (as two statements one after the other would), an event already
/// finished not begun again, an unknown installation's event untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_opens_a_batch_of_events_each_as_if_alone() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let (open, _) = env.receipt("EvOpen", mention("100.000010", None)).await;
    let (done, _) = env.receipt("EvDone", mention("100.000011", None)).await;
    testing::receipts::set_receipt_state(&env.db.pool, done, "done", None)
        .await
        .expect("finished before");
    let nobody = Uuid::now_v7();
    let ch = || "C0CHAN".to_owned();
    let opened = store::open_many(
        &env.db.pool,
        &[
            (env.inst, open, ch()),
            (nobody, Uuid::now_v7(), ch()),
            (env.inst, done, ch()),
            (env.inst, open, ch()),
        ],
    )
    .await
    .expect("one statement");
    assert_eq!(opened.len(), 4, "every event answered");
    let (inst, _) = opened[0].installation.as_ref().expect("known installation");
    assert_eq!(inst.id, env.inst);
    assert!(opened[0].begun && opened[3].begun, "both deliveries begun");
    assert_eq!(opened[0].channel_private, Some(false));
    assert!(opened[0].kind_fresh);
    assert!(opened[1].installation.is_none() && !opened[1].begun);
    assert!(
        opened[2].installation.is_some() && !opened[2].begun,
        "finished before"
    );
    assert_eq!(env.state(open).await, ("processing".into(), None));
    assert_eq!(env.state(done).await, ("done".into(), None));
    // An inactive installation's event is read, never begun; nor is an
    // event named with another installation than its receipt's.
    let (later, _) = env.receipt("EvLater", mention("100.000012", None)).await;
    let (foreign, _) = env.receipt("EvForeign", mention("100.000013", None)).await;
    let opened = store::open_many(&env.db.pool, &[(nobody, foreign, ch())])
        .await
        .expect("one statement");
    assert!(!opened[0].begun);
    assert_eq!(env.state(foreign).await.0, "accepted");
    testing::installations::disable_installation(&env.db.pool, env.inst, None)
        .await
        .expect("disable");
    let opened = store::open_many(&env.db.pool, &[(env.inst, later, ch())])
        .await
        .expect("one statement");
    let (inst, _) = opened[0].installation.as_ref().expect("still known");
    assert!(!inst.active && !opened[0].begun);
    assert_eq!(env.state(later).await.0, "accepted", "not touched");
    env.cleanup().await;
}

/// Applies of concurrent handlers share one transaction, each event as it
/// would be alone and in order: a mention's `message` twin in the same
/// batch finds the turn taken, an unaddressed reply is finished as ignored,
/// and the same batch delivered again changes nothing. A batch with an
/// event Postgres refuses commits nothing; run through the batcher, that
/// event fails alone and the others are applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_applies_reads_as_the_same_applies_one_by_one_and_a_bad_event_fails_alone() {
    use threadline_domain::classify::{Classification, IgnoreReason, Outcome, TriggerSource};
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let root = "300.000001";
    let (asked, twin, aside) = ("300.000002", "300.000002", "300.000003");
    let mut receipts = Vec::new();
    for (event_id, event) in [
        ("EvAsk", mention(asked, Some(root))),
        ("EvTwin", human(twin, "what now?", Some(root))),
        ("EvAside", human(aside, "never mind", Some(root))),
    ] {
        let (id, _) = env.receipt(event_id, event).await;
        testing::receipts::set_receipt_state(&env.db.pool, id, "processing", None)
            .await
            .expect("begun");
        receipts.push(id);
    }
    let job = |receipt: Uuid, effect: Effect, outcome: Outcome| store::ApplyJob {
        installation: env.inst,
        channel: "C0CHAN".into(),
        receipt,
        event_id: format!("Ev{receipt}"),
        classified: Classification { effect, outcome },
        late: None,
    };
    let mention_source = Outcome::Trigger(TriggerSource::Mention);
    let jobs = vec![
        job(
            receipts[0],
            Effect::Upsert(facts(asked, root, "what now?", None)),
            mention_source,
        ),
        job(
            receipts[1],
            Effect::Upsert(facts(twin, root, "what now?", None)),
            mention_source,
        ),
        job(
            receipts[2],
            Effect::Upsert(facts(aside, root, "never mind", None)),
            Outcome::Ignore(IgnoreReason::NotAddressed),
        ),
    ];
    let expected = vec![
        store::Next::Build {
            source_ts: asked.into(),
            root: root.into(),
            trigger: TriggerSource::Mention,
        },
        store::Next::Ignored("duplicate_turn"),
        store::Next::Ignored("not_addressed"),
    ];
    let applied = store::apply_many(&env.db.pool, &jobs, &store::AdmitRules::unlimited())
        .await
        .expect("one transaction");
    let next: Vec<store::Next> = applied.iter().map(|a| a.next.clone()).collect();
    assert_eq!(next, expected);
    assert_eq!(env.version(root).await, 2, "two new messages, two versions");
    assert_eq!(
        env.state(receipts[0]).await.0,
        "processing",
        "its context is next"
    );
    assert_eq!(
        env.state(receipts[1]).await,
        ("ignored".into(), Some("duplicate_turn".into()))
    );
    assert_eq!(
        env.state(receipts[2]).await,
        ("ignored".into(), Some("not_addressed".into()))
    );
    // Delivered again: the same outcomes, and the thread unchanged.
    let again = store::apply_many(&env.db.pool, &jobs, &store::AdmitRules::unlimited())
        .await
        .expect("again");
    let next: Vec<store::Next> = again.iter().map(|a| a.next.clone()).collect();
    assert_eq!(next, expected);
    assert_eq!(env.version(root).await, 2);

    // Text Postgres cannot store (a NUL character) fails the whole batch:
    // nothing of it is kept.
    let (fine, bad) = ("300.000004", "300.000005");
    let (fine_receipt, _) = env
        .receipt("EvFine", human(fine, "hello", Some(root)))
        .await;
    let (bad_receipt, _) = env.receipt("EvBad", human(bad, "nul", Some(root))).await;
    for id in [fine_receipt, bad_receipt] {
        testing::receipts::set_receipt_state(&env.db.pool, id, "processing", None)
            .await
            .expect("begun");
    }
    let unaddressed = Outcome::Ignore(IgnoreReason::NotAddressed);
    let fine_job = job(
        fine_receipt,
        Effect::Upsert(facts(fine, root, "hello", None)),
        unaddressed,
    );
    let bad_job = job(
        bad_receipt,
        Effect::Upsert(facts(bad, root, "a\u{0}b", None)),
        unaddressed,
    );
    assert!(
        store::apply_many(
            &env.db.pool,
            &[fine_job.clone(), bad_job.clone()],
            &store::AdmitRules::unlimited()
        )
        .await
        .is_err()
    );
    assert_eq!(env.version(root).await, 2, "the batch kept nothing");
    assert_eq!(env.state(fine_receipt).await.0, "processing");
    // Through the handlers' batcher: while a first event waits for the
    // thread's row, which this test holds, the good and the bad event queue
    // up behind it and are taken as one batch, which Postgres refuses; run
    // again one by one, the bad event fails by itself.
    let (waiting, _) = env
        .receipt("EvWaiting", human("300.000006", "hold on", Some(root)))
        .await;
    testing::receipts::set_receipt_state(&env.db.pool, waiting, "processing", None)
        .await
        .expect("begun");
    let mut hold = env.db.pool.begin().await.expect("begin");
    testing::threads::bump_thread_version(&mut hold, env.inst, "C0CHAN", root)
        .await
        .expect("hold the thread's row");
    let submit = |j: store::ApplyJob| {
        let applies = env.handler.applies.clone();
        tokio::spawn(async move { applies.submit(j).await })
    };
    let first = submit(job(
        waiting,
        Effect::Upsert(facts("300.000006", root, "hold on", None)),
        unaddressed,
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (fine_done, bad_done) = (submit(fine_job), submit(bad_job));
    tokio::time::sleep(Duration::from_millis(200)).await;
    hold.rollback().await.expect("release the thread");
    assert_eq!(
        first.await.expect("task").expect("applied").next,
        store::Next::Ignored("not_addressed")
    );
    assert_eq!(
        fine_done.await.expect("task").expect("applied").next,
        store::Next::Ignored("not_addressed")
    );
    let refused = anyhow::Error::from(bad_done.await.expect("task").expect_err("refused"));
    assert!(
        !threadline_tenancy::fault::is_transient(&refused),
        "a refused event is not an outage: {refused:#}"
    );
    assert_eq!(env.version(root).await, 4, "the good events were applied");
    assert_eq!(env.state(bad_receipt).await.0, "processing");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_slack_doubled_is_recorded_never_applied_or_answered_in_either_order() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let twin = |ts: &str, thread: Option<&str>, id: &str| {
        with_id(human(ts, &format!("<@{BOT_USER}> what now?"), thread), id)
    };
    // A question in a thread, with its message twin (one ts): one turn.
    env.handle("Ev1", human("900.000001", "the root", None))
        .await;
    let asked = env
        .handle(
            "Ev2",
            with_id(mention("900.000002", Some("900.000001")), "c1"),
        )
        .await;
    let asked_twin = env
        .handle("Ev3", twin("900.000002", Some("900.000001"), "c1"))
        .await;
    assert_eq!(env.state(asked).await, ("done".into(), None));
    assert_eq!(
        env.state(asked_twin).await,
        ("ignored".into(), Some("duplicate_turn".into()))
    );
    assert_eq!(env.version("900.000001").await, 2);
    // Slack delivers the same action again as another message (another ts,
    // the same client_msg_id), both events of it: recorded, not applied to
    // the thread (no new version: the first answer stays current), no turn.
    let copy = env
        .handle(
            "Ev4",
            with_id(mention("900.000003", Some("900.000001")), "c1"),
        )
        .await;
    let copy_twin = env
        .handle("Ev5", twin("900.000003", Some("900.000001"), "c1"))
        .await;
    for r in [copy, copy_twin] {
        assert_eq!(
            env.state(r).await,
            ("ignored".into(), Some("doubled_message".into()))
        );
    }
    assert_eq!(env.version("900.000001").await, 2);
    assert_eq!(env.contexts().await.len(), 1);
    // The other order (the copy reaches the store first): the copy is the
    // action's message, the original the doubled one.
    let later = env
        .handle("Ev6", with_id(mention("910.000003", None), "c2"))
        .await;
    let earlier = env
        .handle("Ev7", with_id(mention("910.000002", None), "c2"))
        .await;
    assert_eq!(env.state(later).await, ("done".into(), None));
    assert_eq!(
        env.state(earlier).await,
        ("ignored".into(), Some("doubled_message".into()))
    );
    let ctx = env.contexts().await;
    assert_eq!(ctx.len(), 2);
    assert_eq!(ctx[1].source_ts, "910.000003");
    let l = threadline_store::ledger::snapshot(&env.db.pool)
        .await
        .expect("ledger");
    assert_eq!(l.doubled_messages, 2);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_event_is_recorded_and_a_late_request_handled_as_its_installation_says() {
    use threadline_domain::late::LateAction;
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    // In time: no note.
    env.handle_late("Ev1", mention("920.000001", None), 10)
        .await;
    // Fifteen minutes late, no policy chosen: answered, its context saying
    // how late (for the answer's note).
    let noted = env
        .handle_late("Ev2", mention("921.000001", None), 900)
        .await;
    assert_eq!(env.state(noted).await, ("done".into(), None));
    let ctx = env.contexts().await;
    assert_eq!(ctx[0].late_by_ms, 0);
    assert!(
        (899_000..=901_000).contains(&ctx[1].late_by_ms),
        "{}",
        ctx[1].late_by_ms
    );
    // A reconsideration of the late request keeps the note.
    env.handle("Ev3", human("921.000002", "more", Some("921.000001")))
        .await;
    let reconsider = threadline_proto::v1::Reconsider {
        schema_version: 1,
        installation_id: env.inst.to_string(),
        channel_id: "C0CHAN".into(),
        root_ts: "921.000001".into(),
        stale_version: 1,
        reason: "version_changed".into(),
        ..Default::default()
    };
    env.handler.reconsider(&reconsider.encode_to_vec()).await;
    let ctx = env.contexts().await;
    assert_eq!(ctx.len(), 3);
    assert_eq!(
        (ctx[2].source_ts.as_str(), ctx[2].thread_version),
        ("921.000001", 2)
    );
    assert_eq!(ctx[2].late_by_ms, ctx[1].late_by_ms);
    // Skipped: no context, the message kept as thread content.
    threadline_store::late::set_action(&env.db.pool, env.inst, LateAction::Skip)
        .await
        .expect("policy");
    let skipped = env
        .handle_late("Ev4", mention("922.000001", None), 900)
        .await;
    assert_eq!(
        env.state(skipped).await,
        ("ignored".into(), Some("late_event".into()))
    );
    assert_eq!(env.version("922.000001").await, 1);
    // Answered as in time.
    threadline_store::late::set_action(&env.db.pool, env.inst, LateAction::Answer)
        .await
        .expect("policy");
    env.handle_late("Ev5", mention("923.000001", None), 900)
        .await;
    let ctx = env.contexts().await;
    assert_eq!(ctx.len(), 4);
    assert_eq!(
        (ctx[3].source_ts.as_str(), ctx[3].late_by_ms),
        ("923.000001", 0)
    );
    // Not a request: only recorded.
    env.handle_late("Ev6", human("923.000002", "fyi", Some("923.000001")), 900)
        .await;
    let l = threadline_store::ledger::snapshot(&env.db.pool)
        .await
        .expect("ledger");
    let by: std::collections::BTreeMap<_, _> = l.late_events_by_outcome.into_iter().collect();
    assert_eq!(
        by,
        [
            ("answered".to_owned(), 1),
            ("noted".to_owned(), 1),
            ("recorded".to_owned(), 1),
            ("skipped".to_owned(), 1)
        ]
        .into()
    );
    env.cleanup().await;
}

/// Admission (DESIGN invariant 11) in the transaction that applies the
/// triggers: within the budget a trigger is built; over it, parked in
/// order, its receipt done with why, its thread told once; delivered
/// again, the same places and nothing charged or told twice; resumed, in
/// the order asked, only once there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_are_admitted_or_parked_once_and_resume_in_the_order_asked() {
    use threadline_domain::budget::{Budget, Limits, Notice, ParkReason};
    use threadline_domain::classify::{Classification, Outcome, TriggerSource};
    use threadline_store::budgets;
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let rules = store::AdmitRules {
        limits: Limits {
            answers_per_minute: 1,
            ..Limits::default()
        },
        share: 16,
        notice: Notice::Note,
    };
    let asked = ["400.000001", "400.000002", "400.000003"];
    let mut jobs = Vec::new();
    for (i, ts) in asked.iter().enumerate() {
        let (id, _) = env.receipt(&format!("EvQ{i}"), mention(ts, None)).await;
        testing::receipts::set_receipt_state(&env.db.pool, id, "processing", None)
            .await
            .expect("begun");
        jobs.push(store::ApplyJob {
            installation: env.inst,
            channel: "C0CHAN".into(),
            receipt: id,
            event_id: format!("EvQ{i}"),
            classified: Classification {
                effect: Effect::Upsert(facts(ts, ts, "what now?", None)),
                outcome: Outcome::Trigger(TriggerSource::Mention),
            },
            late: None,
        });
    }
    let over = store::Next::Parked(ParkReason::Over(Budget::AnswersPerMinute));
    let applied = store::apply_many(&env.db.pool, &jobs, &rules)
        .await
        .expect("applied");
    let next: Vec<store::Next> = applied.iter().map(|a| a.next.clone()).collect();
    assert!(matches!(next[0], store::Next::Build { .. }), "{next:?}");
    assert_eq!(next[1..], [over.clone(), over.clone()]);
    assert!(applied[1].noted && applied[2].noted, "each thread told");
    assert_eq!(
        env.state(jobs[1].receipt).await,
        ("done".into(), Some("parked:answers_per_minute".into()))
    );
    // Delivered again: the same places; nothing charged or told twice.
    let again = store::apply_many(&env.db.pool, &jobs, &rules)
        .await
        .expect("again");
    let again: Vec<store::Next> = again.iter().map(|a| a.next.clone()).collect();
    assert_eq!(again, next);
    let mut conn = env.db.pool.acquire().await.expect("conn");
    let s = budgets::sample(&mut conn, 20).await.expect("sample");
    assert_eq!(s.parked_by_reason, [("answers_per_minute".to_owned(), 2)]);
    assert_eq!(
        (s.in_queue, s.notes, s.over_budget_installations),
        (1, 2, 1)
    );
    // No room yet: nothing resumes.
    let lease = |l: &Limits| {
        let (pool, l) = (env.db.pool.clone(), *l);
        async move {
            budgets::lease_resumable(&pool, &l, 16, 30.0, 64)
                .await
                .expect("lease")
        }
    };
    assert!(lease(&rules.limits).await.is_empty());
    // The limit lifted for this installation: both, in the order asked.
    policies::set_budget_overrides(
        &env.db.pool,
        env.inst,
        &policies::BudgetChanges {
            answers_per_minute: Some(Some(0)),
            ..Default::default()
        },
    )
    .await
    .expect("override");
    let resumed = lease(&rules.limits).await;
    let order: Vec<&str> = resumed
        .iter()
        .map(|r| r.request.source_ts.as_str())
        .collect();
    assert_eq!(order, asked[1..]);
    assert!(
        lease(&rules.limits).await.is_empty(),
        "leased: no other round takes them"
    );
    let marked = budgets::mark_admitted(&env.db.pool, &resumed)
        .await
        .expect("marked");
    assert_eq!(marked.len(), 2);
    let s = budgets::sample(&mut conn, 20).await.expect("sample");
    assert!(s.parked_by_reason.is_empty());
    assert_eq!(s.in_queue, 3);
    drop(conn);
    env.cleanup().await;
}

/// Applies one question per `asked` ts (each its own thread) under
/// `rules`: their jobs and what became of them.
async fn ask_under(
    env: &Env,
    rules: &store::AdmitRules,
    tag: &str,
    asked: &[&str],
) -> (Vec<store::ApplyJob>, Vec<store::ApplyOutcome>) {
    let asked: Vec<(&str, &str)> = asked.iter().map(|ts| (*ts, *ts)).collect();
    ask_in_threads(env, rules, tag, &asked).await
}

/// [`ask_under`], each question (its ts) in the thread of its root ts.
async fn ask_in_threads(
    env: &Env,
    rules: &store::AdmitRules,
    tag: &str,
    asked: &[(&str, &str)],
) -> (Vec<store::ApplyJob>, Vec<store::ApplyOutcome>) {
    let mut jobs = Vec::new();
    for (i, (ts, root)) in asked.iter().enumerate() {
        jobs.push(question_job(env, &format!("Ev{tag}{i}"), "C0CHAN", ts, root).await);
    }
    let applied = store::apply_many(&env.db.pool, &jobs, rules)
        .await
        .expect("applied");
    (jobs, applied)
}

/// One answer a minute, the over-budget note on.
fn one_a_minute() -> store::AdmitRules {
    store::AdmitRules {
        limits: threadline_domain::budget::Limits {
            answers_per_minute: 1,
            ..Default::default()
        },
        share: 16,
        notice: threadline_domain::budget::Notice::Note,
    }
}

/// A parked request a resumer leased (its context maybe published from
/// an older version of its thread, its mark as admitted not yet made) is
/// in flight: a reconsideration of it meanwhile builds it, rather than
/// leaving it to a resumer that has already read the thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconsideration_of_a_leased_parked_request_builds_it() {
    use threadline_domain::state::WorkState;
    use threadline_store::budgets;
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let rules = one_a_minute();
    let (_, applied) = ask_under(&env, &rules, "L", &["410.000001", "410.000002"]).await;
    assert!(matches!(applied[1].next, store::Next::Parked(_)));
    let resumed = budgets::lease_resumable(&env.db.pool, &Default::default(), 16, 30.0, 64)
        .await
        .expect("lease");
    assert_eq!(resumed.len(), 1);
    let state = budgets::rebuild(
        &env.db.pool,
        &resumed[0].request,
        &Default::default(),
        1_000_000,
    )
    .await
    .expect("rebuild");
    assert_eq!(state, Some(WorkState::Admitted), "leased: in flight, built");
    let marked = budgets::mark_admitted(&env.db.pool, &resumed)
        .await
        .expect("marked");
    assert_eq!(marked.len(), 1);
    env.cleanup().await;
}

/// A resumed request decided before its mark as admitted (a fast
/// fallback, a kill switch) leaves its installation's share of the model's
/// queue at once: the mark finds nothing to move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_request_decided_before_its_mark_frees_its_place() {
    use threadline_domain::state::DecisionStatus;
    use threadline_store::{budgets, decisions};
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let rules = one_a_minute();
    let (jobs, _) = ask_under(&env, &rules, "F", &["420.000001", "420.000002"]).await;
    let resumed = budgets::lease_resumable(&env.db.pool, &Default::default(), 16, 30.0, 64)
        .await
        .expect("lease");
    assert_eq!(resumed.len(), 1);
    assert_eq!(
        env.handler
            .resume(&resumed[0].request)
            .await
            .expect("resume"),
        threadline_context_builder::handler::Resumption::Built
    );
    let ctx = env
        .contexts()
        .await
        .into_iter()
        .find(|c| c.source_ts == "420.000002")
        .expect("its context");
    let binding = decisions::Binding::of(&ctx, jobs[1].receipt, env.inst, None);
    let decisions::Claim::Mine(id) = decisions::claim(&env.db.pool, &binding, 60.0, None)
        .await
        .expect("claim")
    else {
        panic!("claimed");
    };
    let settled = decisions::Settled {
        status: DecisionStatus::Suppressed,
        reason: Some("test"),
        action_kind: "thread_reply",
        review_reasons: Vec::new(),
        model_config_id: "m",
        provider: "none",
        fallback: false,
        prompt_tokens: None,
        completion_tokens: None,
        output_hash: None,
        body_text: None,
        body_blocks: None,
        sources: &[],
    };
    decisions::settle(&env.db.pool, id, &settled)
        .await
        .expect("settle");
    let marked = budgets::mark_admitted(&env.db.pool, &resumed)
        .await
        .expect("marked");
    assert!(marked.is_empty(), "decided: nothing to mark");
    let mut conn = env.db.pool.acquire().await.expect("conn");
    let s = budgets::sample(&mut conn, 20).await.expect("sample");
    assert_eq!(s.in_queue, 1, "only the first question holds a place");
    drop(conn);
    env.cleanup().await;
}

/// A resumer's round goes channel by channel, each channel's requests in
/// order: a parked reply that must wait for an answer of its thread on its
/// way holds back the requests of its channel behind it in that round, not
/// a question of another channel leased with it, which is built and
/// admitted; and its installation's line goes on once that wait is over
/// (a second), not when the round's lease (30 s) would have run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_request_that_must_wait_holds_its_channel_and_its_line_only_that_long() {
    use threadline_domain::double_text::DoubleTexting;
    use threadline_domain::state::{Machine as _, WorkState};
    use threadline_store::budgets;
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    policies::set_double_texting(
        &env.db.pool,
        env.inst,
        DoubleTexting::Latest {
            quiet: Duration::from_secs(3),
        },
    )
    .await
    .expect("policy");
    for channel in ["C0SECOND", "C0THIRD"] {
        store::learn_channel_kind(&env.db.pool, env.inst, channel, false, "event")
            .await
            .expect("channel kind");
    }
    // A burst of two questions (`first`, then `root`) takes the
    // installation's share of two; a reply in `root`'s thread, a later
    // question of that channel and one of another channel are parked
    // behind them.
    let rules = store::AdmitRules {
        limits: Default::default(),
        share: 2,
        notice: threadline_domain::budget::Notice::Note,
    };
    let (first, root, reply, behind) = ("460.000001", "460.000002", "460.000005", "465.000001");
    let (mut jobs, mut applied) = ask_in_threads(
        &env,
        &rules,
        "H",
        &[
            (first, first),
            (root, root),
            (reply, root),
            (behind, behind),
        ],
    )
    .await;
    let (job, outcome) = ask_in_channel(&env, &rules, "EvH4", "C0SECOND", "470.000001").await;
    jobs.push(job);
    applied.push(outcome);
    let next: Vec<&store::Next> = applied.iter().map(|a| &a.next).collect();
    assert!(
        matches!(
            next[..],
            [
                store::Next::Build { .. },
                store::Next::Build { .. },
                store::Next::Parked(_),
                store::Next::Parked(_),
                store::Next::Parked(_)
            ]
        ),
        "{next:?}"
    );
    // `root`'s answer (which reads the burst) is being posted: the reply
    // waits for it, to know whether its own answer reads the burst.
    let decision = proposed_answer(&env, ("EvH1", jobs[1].receipt), (root, root), &[]).await;
    testing::intents::insert_sending_intent(
        &env.db.pool,
        &testing::intents::IntentFixture {
            id: Uuid::now_v7(),
            installation_id: env.inst,
            event_id: "EvH1",
            action_kind: "thread_reply",
            receipt_id: jobs[1].receipt,
            decision_id: decision,
            channel_id: "C0CHAN",
            root_ts: root,
            body_hash: "h",
        },
        1,
        0.0,
    )
    .await
    .expect("intent");
    // The burst's requests decided: room for the parked ones, leased in
    // one round in the order asked, the reply first.
    for job in &jobs[..2] {
        budgets::free(&env.db.pool, job.receipt)
            .await
            .expect("free");
    }
    let rules = store::AdmitRules { share: 16, ..rules };
    let round = || threadline_context_builder::admission::round(&env.handler, &rules, 8);
    assert_eq!(round().await.expect("round"), 1, "one request resumed");
    let state = |receipt: Uuid| {
        let pool = env.db.pool.clone();
        async move {
            testing::budgets::work_state(&pool, receipt)
                .await
                .expect("state")
        }
    };
    let (admitted, parked) = (
        Some(WorkState::Admitted.as_str().to_owned()),
        Some(WorkState::Parked.as_str().to_owned()),
    );
    assert_eq!(
        state(jobs[4].receipt).await,
        admitted,
        "the other channel's question is admitted in the round"
    );
    assert_eq!(
        state(jobs[2].receipt).await,
        parked,
        "the reply waits for its thread's answer"
    );
    assert_eq!(
        state(jobs[3].receipt).await,
        parked,
        "its channel's later question waits behind it"
    );
    // A question asked now in a third channel waits behind the reply, for
    // the reply's wait of a second, not the round's lease of 30.
    let (later, outcome) = ask_in_channel(&env, &rules, "EvH5", "C0THIRD", "480.000001").await;
    assert!(
        matches!(outcome.next, store::Next::Parked(_)),
        "{:?}",
        outcome.next
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        round().await.expect("round"),
        1,
        "the third channel's question"
    );
    assert_eq!(state(later.receipt).await, admitted);
    assert_eq!(state(jobs[2].receipt).await, parked, "still waiting");
    assert_eq!(state(jobs[3].receipt).await, parked, "still behind it");
    let built: Vec<String> = env
        .contexts()
        .await
        .into_iter()
        .map(|c| c.source_ts)
        .collect();
    assert_eq!(
        built,
        ["470.000001", "480.000001"],
        "only the other channels' contexts are built"
    );
    env.cleanup().await;
}

/// A batch of applies waits a bounded time for a lock held elsewhere (its
/// `BEGIN` sets `lock_timeout`), then fails with `55P03`, which the batcher
/// reruns event by event: it never waits as long as another transaction
/// holds a thread. Once the thread is free, the same event applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_applies_waits_for_a_held_thread_a_bounded_time() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let rules = store::AdmitRules::unlimited();
    ask_in_channel(&env, &rules, "EvL1", "C0CHAN", "600.000001").await;
    let held = testing::threads::hold_thread(&env.db.pool, "600.000001")
        .await
        .expect("thread held");
    let reply = question_job(&env, "EvL2", "C0CHAN", "600.000002", "600.000001").await;
    let apply = || store::apply_many(&env.db.pool, std::slice::from_ref(&reply), &rules);
    let waited = tokio::time::timeout(Duration::from_secs(60), apply())
        .await
        .expect("the apply must give up on a held lock, not wait until its release");
    let refused = waited.expect_err("the held thread cannot be recorded in");
    assert_eq!(
        refused
            .as_database_error()
            .and_then(|d| d.code())
            .as_deref(),
        Some("55P03"),
        "a lock timeout: {refused}"
    );
    held.rollback().await.expect("released");
    let applied = apply().await.expect("applied once the thread is free");
    assert_eq!(applied.len(), 1);
    assert_eq!(
        testing::threads::thread_version(&env.db.pool, "600.000001")
            .await
            .expect("version"),
        2,
        "the reply is in the thread"
    );
    env.cleanup().await;
}

/// The job of a question `ts` in the thread `root` of `channel`, its
/// receipt recorded and begun as the gateway and the handler leave it.
async fn question_job(
    env: &Env,
    event_id: &str,
    channel: &str,
    ts: &str,
    root: &str,
) -> store::ApplyJob {
    use threadline_domain::classify::{Classification, Outcome, TriggerSource};
    let mut event = mention(ts, (ts != root).then_some(root));
    event["channel"] = json!(channel);
    let (id, _) = env.receipt(event_id, event).await;
    testing::receipts::set_receipt_state(&env.db.pool, id, "processing", None)
        .await
        .expect("begun");
    store::ApplyJob {
        installation: env.inst,
        channel: channel.into(),
        receipt: id,
        event_id: event_id.into(),
        classified: Classification {
            effect: Effect::Upsert(facts(ts, root, "what now?", None)),
            outcome: Outcome::Trigger(TriggerSource::Mention),
        },
        late: None,
    }
}

/// One question `ts` in a thread of its own in `channel`, applied under
/// `rules`: its job and what became of it.
async fn ask_in_channel(
    env: &Env,
    rules: &store::AdmitRules,
    event_id: &str,
    channel: &str,
    ts: &str,
) -> (store::ApplyJob, store::ApplyOutcome) {
    let job = question_job(env, event_id, channel, ts, ts).await;
    let mut applied = store::apply_many(&env.db.pool, std::slice::from_ref(&job), rules)
        .await
        .expect("applied");
    (job, applied.remove(0))
}

/// A rebuild is charged a model call only where that budget is limited,
/// from the bucket refilled to now and at most its size into debt: an
/// unlimited installation owes nothing when a limit is set later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_charges_a_model_call_only_under_a_limit_and_within_a_floor() {
    use threadline_domain::budget::Limits;
    use threadline_store::budgets;
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let request = |n: u32| budgets::Request {
        installation: env.inst,
        receipt: Uuid::now_v7(),
        event_id: format!("EvR{n}"),
        channel: "C0CHAN".into(),
        root_ts: "430.000001".into(),
        source_ts: "430.000001".into(),
        channel_ref: None,
    };
    let calls = |l: Limits| {
        let pool = env.db.pool.clone();
        let inst = env.inst;
        async move {
            let mut tx = pool.begin().await.expect("tx");
            let b = budgets::lock(&mut tx, &[inst], &l).await.expect("lock");
            tx.rollback().await.expect("rollback");
            b[&inst].model_calls
        }
    };
    let limited = Limits {
        model_calls_per_minute: 2,
        ..Default::default()
    };
    for n in 0..5 {
        budgets::rebuild(&env.db.pool, &request(n), &Limits::default(), 1_000_000)
            .await
            .expect("rebuild");
    }
    assert!(calls(limited).await >= 0.0, "no limit: nothing owed");
    for n in 5..10 {
        budgets::rebuild(&env.db.pool, &request(n), &limited, 1_000_000)
            .await
            .expect("rebuild");
    }
    let left = calls(limited).await;
    assert!(
        (-2.0..-1.5).contains(&left),
        "at most its size in debt: {left}"
    );
    env.cleanup().await;
}

/// A rebuild that takes a new place in the model's queue counts against
/// its installation's share like a new request: past the share it is
/// parked (`tenant_queue`, not charged) for the resumer, and a rebuild of
/// a request already in the queue keeps its place whatever the share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_past_the_installations_share_is_parked_not_queued() {
    use threadline_domain::budget::Limits;
    use threadline_store::budgets;
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let request = |n: u32| budgets::Request {
        installation: env.inst,
        receipt: Uuid::now_v7(),
        event_id: format!("EvS{n}"),
        channel: "C0CHAN".into(),
        root_ts: format!("44{n}.000001"),
        source_ts: format!("44{n}.000001"),
        channel_ref: None,
    };
    let calls = Limits {
        model_calls_per_minute: 10,
        ..Default::default()
    };
    const SHARE: u32 = 2;
    let first = request(0);
    let mut placed = Vec::new();
    for r in [first.clone(), request(1), request(2)] {
        placed.push(
            budgets::rebuild(&env.db.pool, &r, &calls, SHARE)
                .await
                .expect("rebuild"),
        );
    }
    assert_eq!(
        placed,
        [
            None,
            None,
            Some(threadline_domain::state::WorkState::Parked)
        ],
        "two places taken, the third parked"
    );
    // (the one in the queue is rebuilt again: it keeps its place)
    assert_eq!(
        budgets::rebuild(&env.db.pool, &first, &calls, SHARE)
            .await
            .expect("rebuild"),
        Some(threadline_domain::state::WorkState::Admitted)
    );
    let sample = {
        let mut conn = env.db.pool.acquire().await.expect("conn");
        budgets::sample(&mut conn, 10).await.expect("sample")
    };
    assert_eq!(sample.in_queue, 2, "{sample:?}");
    assert_eq!(
        sample.parked_by_reason,
        [("tenant_queue".to_owned(), 1)],
        "{sample:?}"
    );
    let mut tx = env.db.pool.begin().await.expect("tx");
    let b = budgets::lock(&mut tx, &[env.inst], &calls)
        .await
        .expect("lock");
    tx.rollback().await.expect("rollback");
    let left = b[&env.inst].model_calls;
    assert!(
        (7.0..7.5).contains(&left),
        "three model calls charged (the parked rebuild none): {left}"
    );
    env.cleanup().await;
}

/// The over-budget note never lands after its question's answer: once the
/// question is answered (or its answer on its way) the note's claim finds
/// it answered already, and it is discarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_budget_note_is_discarded_once_its_question_is_answered() {
    use threadline_store::{decisions, intents};
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let asked = ["440.000001", "440.000002"];
    let (_, applied) = ask_under(&env, &one_a_minute(), "N", &asked).await;
    assert!(applied[1].noted);
    let id = testing::budgets::note_decision(&env.db.pool, asked[1])
        .await
        .expect("read")
        .expect("a note");
    let d = decisions::load(&env.db.pool, id)
        .await
        .expect("load")
        .expect("the note's decision");
    let claim = || async {
        let p = intents::Proposal {
            installation: d.installation_id,
            receipt: d.receipt_id,
            decision: d.id,
            event_id: &d.event_id,
            action_kind: &d.action_kind,
            channel: &d.channel_id,
            root_ts: &d.root_ts,
            source_ts: &d.source_ts,
            version: d.thread_version,
            body_hash: d.output_hash.as_deref().unwrap_or_default(),
            channel_ref: None,
        };
        intents::check_and_claim(&env.db.pool, &p, 60.0, 0.0)
            .await
            .expect("claim")
    };
    testing::threads::set_turn_answered(&env.db.pool, asked[1])
        .await
        .expect("answered");
    assert_eq!(claim().await, intents::Verdict::AlreadySent);
    env.cleanup().await;
}

/// A parked request that will never be answered (a newer question in its
/// thread answers instead, or its question was deleted) is dropped when
/// its turn comes, before anything is charged or built for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_requests_superseded_or_deleted_are_dropped_not_resumed() {
    use threadline_store::budgets;
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let asked = [
        ("450.000001", "450.000001"),
        ("450.000002", "450.000002"),
        ("450.000003", "450.000003"),
        ("450.000004", "450.000002"),
    ];
    let (_, applied) = ask_in_threads(&env, &one_a_minute(), "D", &asked).await;
    assert!(
        applied[1..]
            .iter()
            .all(|a| matches!(a.next, store::Next::Parked(_))),
        "{:?}",
        applied.iter().map(|a| &a.next).collect::<Vec<_>>()
    );
    env.handle("EvDdel", json!({"type": "message", "subtype": "message_deleted", "channel": "C0CHAN",
                                "deleted_ts": "450.000003", "ts": "450.000009",
                                "previous_message": {"ts": "450.000003", "text": "x", "user": "U0ANA"}}))
        .await;
    let resumed = budgets::lease_resumable(&env.db.pool, &Default::default(), 16, 30.0, 64)
        .await
        .expect("lease");
    let order: Vec<&str> = resumed
        .iter()
        .map(|r| r.request.source_ts.as_str())
        .collect();
    assert_eq!(
        order,
        ["450.000004"],
        "only the thread's latest, not deleted"
    );
    let mut conn = env.db.pool.acquire().await.expect("conn");
    let s = budgets::sample(&mut conn, 20).await.expect("sample");
    assert_eq!(
        s.parked_by_reason.iter().map(|(_, n)| n).sum::<i64>(),
        1,
        "the others' places went"
    );
    drop(conn);
    env.cleanup().await;
}

/// A round whose transaction began before another's but locked the
/// bucket after it neither refills from before that round nor stores its
/// own start as the time refilled to: the bucket is never over-credited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_that_began_earlier_but_locked_later_never_overcredits() {
    use threadline_domain::budget::Limits;
    use threadline_store::budgets;
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let l = Limits {
        answers_per_minute: 60,
        ..Default::default()
    };
    let request = |n: u32| budgets::Request {
        installation: env.inst,
        receipt: Uuid::now_v7(),
        event_id: format!("EvC{n}"),
        channel: "C0CHAN".into(),
        root_ts: format!("460.{n:06}"),
        source_ts: format!("460.{n:06}"),
        channel_ref: None,
    };
    // The early round's transaction starts (its now() is fixed here).
    let mut early = env.db.pool.begin().await.expect("tx");
    budgets::lock(&mut early, &[Uuid::now_v7()], &l)
        .await
        .expect("a statement");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Another round spends all but one unit meanwhile.
    let mut tx = env.db.pool.begin().await.expect("tx");
    let many: Vec<_> = (0..59).map(request).collect();
    budgets::admit_many(&mut tx, &many, &l, 1000)
        .await
        .expect("admitted");
    tx.commit().await.expect("commit");
    // The early round takes the last unit.
    let a = budgets::admit_many(&mut early, &[request(100)], &l, 1000)
        .await
        .expect("admitted");
    assert_eq!(a[0].verdict, threadline_domain::budget::Verdict::Admit);
    early.commit().await.expect("commit");
    let mut tx = env.db.pool.begin().await.expect("tx");
    let b = budgets::lock(&mut tx, &[env.inst], &l).await.expect("lock");
    tx.rollback().await.expect("rollback");
    let left = b[&env.inst].answers;
    assert!(
        left < 0.5,
        "spent; refilled for a moment only, not 1.5 s: {left}"
    );
    env.cleanup().await;
}

/// A workspace over budget that opens thread after thread is sent at most
/// `NOTES_PER_MINUTE` notes a minute, not one post per thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_budget_notes_are_capped_per_installation_and_minute() {
    use threadline_store::budgets;
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let asked: Vec<String> = (1..=9).map(|i| format!("470.{i:06}")).collect();
    let asked: Vec<&str> = asked.iter().map(String::as_str).collect();
    let (_, applied) = ask_under(&env, &one_a_minute(), "K", &asked).await;
    let parked = applied
        .iter()
        .filter(|a| matches!(a.next, store::Next::Parked(_)))
        .count();
    let noted = applied.iter().filter(|a| a.noted).count();
    assert_eq!(parked, 8);
    assert_eq!(noted as i64, budgets::NOTES_PER_MINUTE);
    env.cleanup().await;
}

/// A proposed answer of event `(event_id, receipt)` to `source` in thread
/// `root`, at the thread's version now, that read the messages `read`.
async fn proposed_answer(
    env: &Env,
    (event_id, receipt): (&str, Uuid),
    (root, source): (&str, &str),
    read: &[String],
) -> Uuid {
    let decision = Uuid::now_v7();
    testing::decisions::insert_proposed_decision(
        &env.db.pool,
        &testing::decisions::ProposedDecision {
            id: decision,
            receipt_id: receipt,
            installation_id: env.inst,
            event_id,
            channel_id: "C0CHAN",
            root_ts: root,
            source_ts: source,
            thread_version: env.version(root).await,
            body_text: "an answer",
            output_hash: "h",
        },
    )
    .await
    .expect("decision");
    testing::decisions::set_decision_context(&env.db.pool, decision, read)
        .await
        .expect("context");
    decision
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_is_asked_for_its_deleted_message_unless_a_later_answer_read_either() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    // Two threads: the later answer there read neither the question nor
    // its copy (it was built after the question was deleted, before the
    // copy arrived), or it read the question.
    for (n, later_read_the_question) in [(920, false), (930, true)] {
        let ts = |k: u32| format!("{n}.00000{k}");
        let (root, question, later, copy) = (ts(1), ts(2), ts(3), ts(4));
        env.handle(&format!("Ev{n}a"), human(&root, "the root", None))
            .await;
        let action = format!("c{n}");
        env.handle(
            &format!("Ev{n}b"),
            with_id(mention(&question, Some(&root)), &action),
        )
        .await;
        // The person deletes the question before it was answered; Slack's
        // copy of it is still on its way.
        env.handle(
            &format!("Ev{n}c"),
            json!({"type": "message", "subtype": "message_deleted", "channel": "C0CHAN",
                   "deleted_ts": question, "ts": ts(9), "event_ts": ts(9),
                   "previous_message": {"type": "message", "user": "U0ANA", "text": "x", "ts": question}}),
        )
        .await;
        // Someone asks later in the thread, and that answer goes out.
        let mut asked = mention(&later, Some(&root));
        asked["user"] = json!("U0BEA");
        let receipt = env
            .handle(&format!("Ev{n}d"), with_id(asked, &format!("d{n}")))
            .await;
        let mut read = vec![root.clone(), later.clone()];
        if later_read_the_question {
            read.push(question.clone());
        }
        let decision =
            proposed_answer(&env, (&format!("Ev{n}d"), receipt), (&root, &later), &read).await;
        testing::decisions::set_decision_status(&env.db.pool, decision, "published")
            .await
            .expect("published");
        // The copy arrives and stands in for the deleted question: asked
        // in its place unless the later answer read the question.
        let arrived = env
            .handle(
                &format!("Ev{n}e"),
                with_id(mention(&copy, Some(&root)), &action),
            )
            .await;
        assert_eq!(
            env.state(arrived).await,
            ("ignored".into(), Some("doubled_message".into()))
        );
        assert_eq!(
            testing::threads::has_turn(&env.db.pool, &copy)
                .await
                .expect("turn"),
            !later_read_the_question,
            "the copy asked in thread {root}: the later answer read the question: {later_read_the_question}"
        );
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_waiting_on_a_later_answer_is_asked_when_that_answer_is_discarded() {
    let env = Env::new(
        "http://127.0.0.1:9/api/",
        "xoxb-unused",
        limits(),
        backfill_limits(),
    )
    .await;
    let ts = |k: u32| format!("940.00000{k}");
    let (root, question, copy, later) = (ts(1), ts(2), ts(3), ts(4));
    env.handle("Ev940a", human(&root, "the root", None)).await;
    let action = "c940";
    env.handle("Ev940b", with_id(mention(&question, Some(&root)), action))
        .await;
    // Slack delivers the question twice: the copy is kept hidden.
    env.handle("Ev940c", with_id(mention(&copy, Some(&root)), action))
        .await;
    // Someone asks later in the thread; that answer, on its way, read the
    // question.
    let mut asked = mention(&later, Some(&root));
    asked["user"] = json!("U0BEA");
    let receipt = env.handle("Ev940d", with_id(asked, "d940")).await;
    let decision = proposed_answer(
        &env,
        ("Ev940d", receipt),
        (&root, &later),
        &[root.clone(), question.clone(), later.clone()],
    )
    .await;
    // The person deletes the question: the copy stands in for it, and is
    // not asked while the later answer that read the question may show.
    env.handle(
        "Ev940e",
        json!({"type": "message", "subtype": "message_deleted", "channel": "C0CHAN",
               "deleted_ts": question, "ts": ts(9), "event_ts": ts(9),
               "previous_message": {"type": "message", "user": "U0ANA", "text": "x", "ts": question}}),
    )
    .await;
    assert!(
        !testing::threads::has_turn(&env.db.pool, &copy)
            .await
            .expect("turn"),
        "not asked while the later answer may show"
    );
    // That answer is discarded (the thread changed under it): nothing that
    // read the question will show, so its copy is asked now.
    testing::decisions::set_decision_status(&env.db.pool, decision, "stale")
        .await
        .expect("stale");
    let mut tx = env.db.pool.begin().await.expect("tx");
    let d = threadline_store::decisions::load(&mut *tx, decision)
        .await
        .expect("load")
        .expect("the decision");
    let asked = threadline_store::decisions::discarded(&mut tx, &d)
        .await
        .expect("discarded");
    tx.commit().await.expect("commit");
    assert_eq!(
        asked.iter().map(|s| s.ts.as_str()).collect::<Vec<_>>(),
        [copy.as_str()],
        "the copy asked in the deleted question's place"
    );
    assert!(
        testing::threads::has_turn(&env.db.pool, &copy)
            .await
            .expect("turn")
    );
    env.cleanup().await;
}
