//! Slack (slack-sim) → gateway → context-builder → inference → publisher →
//! Slack, all as processes: a mention is answered exactly once, labelled, in
//! its thread; the answer fed back by Slack makes no new job.

use std::time::Duration;

use async_nats::jetstream;
use serde_json::{Value, json};
use threadline_testkit::slack::TEST_SECRET;
use threadline_testkit::{TestDb, delete_streams, eventually, nats_url, unique_prefix};
use threadline_tests::{
    cli, sim_ctl, sim_get, spawn_context_builder, spawn_gateway, spawn_inference, spawn_publisher,
    spawn_slack_sim,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_is_answered_once_in_its_thread_and_the_answer_is_no_new_job() {
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
    let mut pub_env = cb_env.clone();
    pub_env.push(("THREADLINE_POST_SPACING_MS", "0".to_owned()));
    let publisher = spawn_publisher(&pub_env).await;

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
    // The publisher posts the labelled answer once, into the thread root.
    let thread_path = format!("channels/{channel}/threads/{root}");
    let posts = eventually("the answer in Slack", Duration::from_secs(30), || {
        let (sim, path) = (&sim, thread_path.clone());
        async move {
            let v = sim_get(sim, &path).await;
            let msgs = v["messages"].as_array().cloned().unwrap_or_default();
            let answers: Vec<Value> = msgs
                .into_iter()
                .filter(|m| m["app_id"].is_string())
                .collect();
            (!answers.is_empty()).then_some(answers)
        }
    })
    .await;
    assert_eq!(posts.len(), 1);
    let answer = &posts[0];
    assert_eq!(
        answer["thread_ts"],
        root.as_str(),
        "into the root, never a reply ts"
    );
    let text = answer["text"].as_str().expect("text");
    assert!(
        text.starts_with("[threadline built-in model]")
            && text.ends_with("_AI-generated — verify before relying on it_"),
        "{text}"
    );
    assert_eq!(answer["metadata"]["event_type"], "threadline_reply");
    let (receipt, version, source): (uuid::Uuid, i64, String) =
        sqlx::query_as("SELECT receipt_id, thread_version, source_ts FROM contexts")
            .fetch_one(&db.pool)
            .await
            .expect("one context");
    assert_eq!(source, ask);
    let (intent_state, decided_version): (String, i64) = sqlx::query_as(
        "SELECT i.state, d.thread_version FROM reply_intents i JOIN decisions d ON d.id = i.decision_id WHERE i.receipt_id = $1",
    )
    .bind(receipt)
    .fetch_one(&db.pool)
    .await
    .expect("intent");
    assert_eq!((intent_state.as_str(), decided_version), ("sent", version));

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
    let posts = sim_get(&sim, &format!("app_posts?app_id={app}")).await;
    assert_eq!(
        posts["per_thread"],
        json!([{"channel": channel, "thread_ts": root, "count": 1}]),
        "answered exactly once"
    );
    let version: i64 = sqlx::query_scalar("SELECT version FROM threads WHERE root_ts = $1")
        .bind(&root)
        .fetch_one(&db.pool)
        .await
        .expect("thread");
    assert_eq!(version, 3, "root, question, our reply");
    let out = cli(&["stats", "--json"], &[("DATABASE_URL", db.url.clone())]).await;
    let stats: Value = serde_json::from_slice(&out.stdout).expect("stats");
    assert_eq!(
        (
            &stats["receipts_total"],
            &stats["contexts_total"],
            &stats["model_calls_total"],
            &stats["duplicate_replies_total"]
        ),
        (&json!(4), &json!(1), &json!(1), &json!(0))
    );
    assert_eq!(stats["reply_intents_by_state"], json!({"sent": 1}));
    assert!(publisher.terminate().await.success());
    assert!(inf.terminate().await.success());
    assert!(cb.terminate().await.success());
    assert!(gw.terminate().await.success());
    delete_streams(&js, &prefix).await;
}
