//! A poison message ends in the dead-letter stream; `threadline dlq list`
//! shows it without its payload, `dlq drop` removes it, and `dlq replay`
//! puts a dead letter back where it came from, where it is processed.

use std::time::Duration;

use async_nats::jetstream;
use prost::Message as _;
use serde_json::{Value, json};
use threadline_proto::v1::EventAccepted;
use threadline_testkit::{
    TestDb, delete_streams, eventually, nats_url, slack::seed_installation, unique_prefix,
};
use threadline_tests::{cli, spawn_context_builder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_is_dead_lettered_listed_dropped_and_a_dead_letter_replayed() {
    let db = TestDb::new().await;
    let prefix = unique_prefix();
    let nats = async_nats::connect(nats_url()).await.expect("nats");
    let js = jetstream::new(nats.clone());
    let inst = seed_installation(&db.pool, "A0DLQ", "T0DLQ").await;
    let keys = "k1:".to_owned() + &"42".repeat(32);
    let env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("NATS_URL", nats_url()),
        ("THREADLINE_BUS_PREFIX", prefix.clone()),
        ("THREADLINE_TOKEN_KEYS", keys),
        ("SLACK_API_URL", "http://127.0.0.1:9/api/".to_owned()),
    ];
    let cb = spawn_context_builder(&env).await;
    let dlq = |args: &[&str]| {
        let mut a = vec!["dlq"];
        a.extend_from_slice(args);
        let a: Vec<String> = a.iter().map(|s| (*s).to_owned()).collect();
        let env = env.clone();
        async move {
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            cli(&a, &env).await
        }
    };
    let list = || async {
        let out = dlq(&["list"]).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("JSON list")
    };

    // Garbage on the events subject: the context-builder cannot decode it.
    let secret_looking = b"not a protobuf, and text that must never be printed";
    js.publish(format!("{prefix}.events"), secret_looking.as_slice().into())
        .await
        .expect("publish")
        .await
        .expect("ack");
    let poison = eventually(
        "the poison dead-lettered",
        Duration::from_secs(20),
        || async {
            let l = list().await;
            (l.len() == 1).then(|| l[0].clone())
        },
    )
    .await;
    assert_eq!(poison["original_subject"], format!("{prefix}.events"));
    assert_eq!(poison["reason"], "undecodable EventAccepted");
    assert_eq!(poison["payload_bytes"], secret_looking.len());
    let listed = String::from_utf8(dlq(&["list"]).await.stdout).expect("utf8");
    assert!(!listed.contains("never be printed"), "no payloads listed");

    // A valid event whose retries ran out earlier (dead-lettered the way a
    // worker does it), for a receipt that is still open.
    let receipt = uuid::Uuid::now_v7();
    let event = json!({"type": "message", "user": "U0ANA", "text": "hello all", "ts": "1700000000.000100",
                       "channel": "C0DLQ", "channel_type": "channel", "event_ts": "1700000000.000100"});
    sqlx::query(
        "INSERT INTO event_receipts (id, installation_id, api_app_id, event_id, event_type, channel_id, message_ts, event_time)
         VALUES ($1, $2, 'A0DLQ', 'Ev0DLQ', 'message', 'C0DLQ', '1700000000.000100', now())",
    )
    .bind(receipt)
    .bind(inst)
    .execute(&db.pool)
    .await
    .expect("receipt");
    let msg = EventAccepted {
        schema_version: 1,
        receipt_id: receipt.to_string(),
        installation_id: inst.to_string(),
        api_app_id: "A0DLQ".into(),
        event_id: "Ev0DLQ".into(),
        channel_id: "C0DLQ".into(),
        message_ts: "1700000000.000100".into(),
        event_json: serde_json::to_vec(&event).expect("json"),
        ..Default::default()
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Threadline-Dead-Letter-Reason", "retries exhausted");
    headers.insert(
        "Threadline-Original-Subject",
        format!("{prefix}.events").as_str(),
    );
    headers.insert("Nats-Msg-Id", "evt:A0DLQ:Ev0DLQ");
    js.publish_with_headers(
        format!("{prefix}.dlq.events"),
        headers,
        msg.encode_to_vec().into(),
    )
    .await
    .expect("publish")
    .await
    .expect("ack");
    let letters = list().await;
    assert_eq!(letters.len(), 2);
    let poison_seq = poison["seq"].as_u64().expect("seq").to_string();

    // Drop the poison after inspection; replay the rest.
    assert!(dlq(&["drop", &poison_seq]).await.status.success());
    assert_eq!(list().await.len(), 1);
    let replay = dlq(&["replay", "--all"]).await;
    assert!(
        replay.status.success(),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    assert!(list().await.is_empty(), "a replayed letter is removed");
    let state = eventually(
        "the replayed event processed",
        Duration::from_secs(20),
        || {
            let pool = db.pool.clone();
            async move {
                let s: (String, Option<String>) =
                    sqlx::query_as("SELECT state, state_reason FROM event_receipts WHERE id = $1")
                        .bind(receipt)
                        .fetch_one(&pool)
                        .await
                        .ok()?;
                (s.0 != "accepted" && s.0 != "processing").then_some(s)
            }
        },
    )
    .await;
    assert_eq!(
        state,
        ("ignored".to_owned(), Some("not_addressed".to_owned()))
    );

    // Nothing left to replay: a clear error, nothing happens.
    let missing = dlq(&["replay", &poison_seq]).await;
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("not found"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    assert!(cb.terminate().await.success());
    delete_streams(&js, &prefix).await;
}
