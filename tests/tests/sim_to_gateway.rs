//! Slack (played by slack-sim) delivering to the real gateway: events reach
//! JetStream once each, whatever Slack's retries do.

use std::time::Duration;

use async_nats::jetstream;
use serde_json::json;
use threadline_runtime::bus::{Topic, Topology};
use threadline_testkit::slack::TEST_SECRET;
use threadline_testkit::{TestDb, delete_streams, eventually, nats_url, stream_len, unique_prefix};
use threadline_tests::{sim_ctl, sim_get, spawn_gateway, spawn_slack_sim};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_retries_of_a_slow_acknowledged_event_create_one_receipt() {
    let db = TestDb::new().await;
    let prefix = unique_prefix();
    let js = jetstream::new(async_nats::connect(nats_url()).await.expect("nats"));
    let stream = Topology::new(prefix.clone()).stream(Topic::Events);
    let gw = spawn_gateway(&[
        ("DATABASE_URL", db.url.clone()),
        ("NATS_URL", nats_url()),
        ("THREADLINE_BUS_PREFIX", prefix.clone()),
        ("SLACK_SIGNING_SECRET", TEST_SECRET.to_owned()),
        ("THREADLINE_RELAY_SWEEP_MS", "200".to_owned()),
    ])
    .await;
    let sim = spawn_slack_sim(3, 0.01).await;

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
        json!({"team_id": team, "name": "help", "kind": "public", "members": [user]}),
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
    let install = sim_ctl(
        &sim,
        &format!("apps/{app}/installs"),
        json!({"team_id": team, "scopes": ["chat:write", "channels:history"], "join_channels": [channel]}),
    )
    .await;
    let bot_user = install["bot_user_id"]
        .as_str()
        .expect("bot user")
        .to_owned();
    threadline_testkit::slack::seed_installation(&db.pool, &app, &team).await;

    // A mention: Slack sends app_mention and message for the same message.
    let posted = sim_ctl(
        &sim,
        "act/post",
        json!({"user": user, "channel": channel, "text": format!("<@{bot_user}> help")}),
    )
    .await;
    assert_eq!(posted["events"].as_array().map(Vec::len), Some(2));
    eventually("both events on the bus", Duration::from_secs(15), || {
        let (js, stream) = (js.clone(), stream.clone());
        async move { (stream_len(&js, &stream).await == 2).then_some(()) }
    })
    .await;

    // The gateway answers in time, but Slack counts the delivery as late and
    // retries (http_timeout): still one receipt and one message per event.
    sim_ctl(
        &sim,
        "faults",
        json!({"method": "events", "mode": "hold_past_deadline", "times": 2}),
    )
    .await;
    let posted = sim_ctl(
        &sim,
        "act/post",
        json!({"user": user, "channel": channel, "text": "a follow-up", "thread_ts": posted["ts"]}),
    )
    .await;
    let event_id = posted["events"][0]["event_id"]
        .as_str()
        .expect("event id")
        .to_owned();
    let deliveries = eventually("the retries to succeed", Duration::from_secs(15), || {
        let (sim, event_id) = (&sim, event_id.clone());
        async move {
            let d = sim_get(sim, &format!("deliveries?event_id={event_id}")).await;
            let list = d["deliveries"].as_array().cloned().unwrap_or_default();
            list.iter().any(|x| x["result"] == "ok").then_some(list)
        }
    })
    .await;
    assert_eq!(deliveries.len(), 3, "{deliveries:?}");
    assert_eq!(deliveries[1]["retry_reason"], "http_timeout");
    let threadline_store::testing::receipts::DeliveryCounts {
        receipts,
        duplicate_deliveries: dups,
        retry_num,
    } = threadline_store::testing::receipts::delivery_counts_of_event(&db.pool, &event_id)
        .await
        .expect("receipt");
    assert_eq!((receipts, dups, retry_num), (1, 2, 0));
    eventually("three events on the bus", Duration::from_secs(15), || {
        let (js, stream) = (js.clone(), stream.clone());
        async move { (stream_len(&js, &stream).await == 3).then_some(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stream_len(&js, &stream).await, 3);
    assert!(gw.terminate().await.success());
    delete_streams(&js, &prefix).await;
}
