//! Slack (slack-sim) → gateway → JetStream → context-builder, all as
//! processes: a mention becomes exactly one versioned context; the bot's own
//! reply fed back becomes none.

use std::time::Duration;

use async_nats::jetstream;
use prost::Message as _;
use serde_json::{Value, json};
use threadline_runtime::bus::{Topic, Topology};
use threadline_testkit::slack::TEST_SECRET;
use threadline_testkit::{TestDb, delete_streams, eventually, nats_url, stream_len, unique_prefix};
use threadline_tests::{
    cli, sim_ctl, spawn_context_builder, spawn_gateway, spawn_inference, spawn_slack_sim,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_becomes_one_context_and_the_bots_own_reply_none() {
    let db = TestDb::new().await;
    let prefix = unique_prefix();
    let js = jetstream::new(async_nats::connect(nats_url()).await.expect("nats"));
    let keys = "k1:".to_owned() + &"42".repeat(32);
    let common = vec![
        ("DATABASE_URL", db.url.clone()),
        ("NATS_URL", nats_url()),
        ("THREADLINE_BUS_PREFIX", prefix.clone()),
        ("THREADLINE_TOKEN_KEYS", keys.clone()),
        ("THREADLINE_RELAY_SWEEP_MS", "200".to_owned()),
    ];
    let sim = spawn_slack_sim(11, 0.01).await;
    let mut gw_env = common.clone();
    gw_env.push(("SLACK_SIGNING_SECRET", TEST_SECRET.to_owned()));
    let gw = spawn_gateway(&gw_env).await;
    let mut cb_env = common.clone();
    cb_env.push(("SLACK_API_URL", format!("{}/api/", sim.base_url)));
    let cb = spawn_context_builder(&cb_env).await;
    let inf = spawn_inference(&common).await;

    let team = sim_ctl(&sim, "teams", json!({"name": "Acme"})).await["id"]
        .as_str()
        .expect("team")
        .to_owned();
    let user = sim_ctl(&sim, "users", json!({"team_id": team, "name": "ana"})).await["id"]
        .as_str()
        .expect("user")
        .to_owned();
    let channel = sim_ctl(
        &sim,
        "channels",
        json!({"team_id": team, "name": "ops", "kind": "public", "members": [user]}),
    )
    .await["id"]
        .as_str()
        .expect("channel")
        .to_owned();
    let app = sim_ctl(
        &sim,
        "apps",
        json!({"name": "Threadline", "signing_secret": TEST_SECRET, "request_urls": [gw.events_url()],
               "events": ["app_mention", "message.channels"]}),
    )
    .await["id"]
    .as_str()
    .expect("app")
    .to_owned();
    let inst = sim_ctl(
        &sim,
        &format!("apps/{app}/installs"),
        json!({"team_id": team, "scopes": ["chat:write", "channels:history"], "join_channels": [channel]}),
    )
    .await;
    let (bot_user, bot_id, token) = (
        inst["bot_user_id"].as_str().expect("bot user").to_owned(),
        inst["bot_id"].as_str().expect("bot id").to_owned(),
        inst["bot_token"].as_str().expect("token").to_owned(),
    );
    let out = cli(
        &[
            "install",
            "add",
            "--team",
            &team,
            "--app",
            &app,
            "--bot-user",
            &bot_user,
            "--bot-id",
            &bot_id,
            "--token",
            &token,
        ],
        &[
            ("DATABASE_URL", db.url.clone()),
            ("THREADLINE_TOKEN_KEYS", keys.clone()),
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let root = sim_ctl(
        &sim,
        "act/post",
        json!({"user": user, "channel": channel, "text": "deploy failed"}),
    )
    .await["ts"]
        .as_str()
        .expect("ts")
        .to_owned();
    let ask = sim_ctl(&sim, "act/post", json!({"user": user, "channel": channel, "text": format!("<@{bot_user}> why?"), "thread_ts": root}))
        .await["ts"]
        .as_str()
        .expect("ts")
        .to_owned();
    // The context is consumed by inference (a work queue): judge it by its record.
    // Inference proposes a labelled answer bound to that context's version.
    let proposals = Topology::new(prefix.clone()).stream(Topic::Proposals);
    eventually("a proposal on the bus", Duration::from_secs(20), || {
        let (js, s) = (js.clone(), proposals.clone());
        async move { (stream_len(&js, &s).await >= 1).then_some(()) }
    })
    .await;
    let msg = js
        .get_stream(&proposals)
        .await
        .expect("stream")
        .get_raw_message(1)
        .await
        .expect("message");
    let p =
        threadline_proto::v1::ProposalReady::decode(msg.payload.as_ref()).expect("ProposalReady");
    let (receipt, version, source, count): (uuid::Uuid, i64, String, i32) =
        sqlx::query_as("SELECT receipt_id, thread_version, source_ts, message_count FROM contexts")
            .fetch_one(&db.pool)
            .await
            .expect("one context");
    assert_eq!(
        (source.as_str(), count),
        (ask.as_str(), 2),
        "root and question"
    );
    assert_eq!(
        (
            p.receipt_id.clone(),
            p.thread_version,
            p.root_ts.as_str(),
            p.source_ts.as_str()
        ),
        (receipt.to_string(), version, root.as_str(), ask.as_str())
    );
    assert!(msg.headers.get("Nats-Msg-Id").is_some());
    assert!(
        p.text.starts_with("[threadline built-in model]")
            && p.text
                .ends_with("_AI-generated — verify before relying on it_")
    );

    // The bot answers in the thread; Slack feeds the post back as an event.
    let r: Value = reqwest::Client::new()
        .post(format!("{}/api/chat.postMessage", sim.base_url))
        .bearer_auth(&token)
        .form(&[
            ("channel", channel.as_str()),
            ("thread_ts", root.as_str()),
            ("text", "because of X"),
        ])
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    assert_eq!(r["ok"], true);
    let reasons = eventually("every receipt settled", Duration::from_secs(20), || {
        let pool = db.pool.clone();
        async move {
            let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
                "SELECT event_type, state, state_reason FROM event_receipts ORDER BY received_at",
            )
            .fetch_all(&pool)
            .await
            .ok()?;
            (rows.len() == 4
                && rows
                    .iter()
                    .all(|r| r.1 != "accepted" && r.1 != "processing"))
            .then_some(rows)
        }
    })
    .await;
    // Either twin of the mention may claim the turn; exactly one does.
    let mut outcomes: Vec<String> = reasons
        .iter()
        .map(|(_, s, r)| format!("{s}:{}", r.clone().unwrap_or_default()))
        .collect();
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            "done:",
            "ignored:duplicate_turn",
            "ignored:not_addressed",
            "ignored:own_bot"
        ],
        "root not addressed, one turn for the mention and its twin, our reply no job"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let jobs: (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM contexts), (SELECT count(*) FROM decisions)")
            .fetch_one(&db.pool)
            .await
            .expect("counts");
    assert_eq!(
        jobs,
        (1, 1),
        "the bot loop produced no job and no model call"
    );
    assert_eq!(stream_len(&js, &proposals).await, 1);
    let version: i64 = sqlx::query_scalar("SELECT version FROM threads WHERE root_ts = $1")
        .bind(&root)
        .fetch_one(&db.pool)
        .await
        .expect("thread");
    assert_eq!(version, 3, "root, question, our reply");
    assert!(inf.terminate().await.success());
    assert!(cb.terminate().await.success());
    assert!(gw.terminate().await.success());
    delete_streams(&js, &prefix).await;
}
