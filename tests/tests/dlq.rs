//! A poison message ends in the dead-letter stream with its message sealed
//! (no text readable on the stream); `threadline dlq list` shows the
//! envelope without payloads, `dlq drop` removes a letter, `dlq replay`
//! opens a sealed letter and puts it back where it came from, where it is
//! processed; a letter kept without its text is refused; `threadline purge`
//! removes letters past their retention.

use std::time::Duration;

use async_nats::jetstream;
use prost::Message as _;
use serde_json::{Value, json};
use threadline_proto::v1::EventAccepted;
use threadline_store::testing::receipts;
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
    let letter_keys = "d1:".to_owned() + &"17".repeat(32);
    let env = vec![
        ("THREADLINE_DEAD_LETTER_KEYS", letter_keys.clone()),
        ("DATABASE_URL", db.url.clone()),
        ("NATS_URL", nats_url()),
        ("THREADLINE_BUS_PREFIX", prefix.clone()),
        ("THREADLINE_TOKEN_KEYS", keys),
        ("THREADLINE_AUDIT_KEY", "5a".repeat(32)),
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
    assert_eq!(poison["payload"], "sealed");
    let listed = String::from_utf8(dlq(&["list"]).await.stdout).expect("utf8");
    assert!(!listed.contains("never be printed"), "no payloads listed");
    // On the stream itself (what anyone with broker access reads): sealed.
    let letters_stream = js
        .get_stream(threadline_runtime::bus::Topology::new(prefix.clone()).dead_letter_stream())
        .await
        .expect("dead-letter stream");
    let raw = letters_stream
        .get_raw_message(poison["seq"].as_u64().expect("seq"))
        .await
        .expect("raw letter");
    assert!(
        !raw.payload.windows(15).any(|w| w == b"never be printe"),
        "the stream holds no readable text"
    );
    assert!(
        raw.payload.len() > secret_looking.len(),
        "sealed, not dropped"
    );

    // A valid event whose retries ran out earlier, dead-lettered the way a
    // worker does it (sealed with the workers' keys), for a receipt that is
    // still open.
    let receipt = uuid::Uuid::now_v7();
    let event = json!({"type": "message", "user": "U0ANA", "text": "hello all", "ts": "1700000000.000100",
                       "channel": "C0DLQ", "channel_type": "channel", "event_ts": "1700000000.000100"});
    receipts::insert_accepted_receipt(
        &db.pool,
        &receipts::NewAcceptedReceipt {
            id: receipt,
            installation_id: inst,
            api_app_id: "A0DLQ",
            event_id: "Ev0DLQ",
            event_type: "message",
            channel_id: "C0DLQ",
            message_ts: "1700000000.000100",
        },
    )
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
    let mut original = async_nats::HeaderMap::new();
    original.insert("Nats-Msg-Id", "evt:A0DLQ:Ev0DLQ");
    let cipher = threadline_tenancy::secrets::SymmetricKeys::parse_setting(
        &letter_keys.clone().into(),
        threadline_tenancy::dead_letter::KEYS_SETTING,
    )
    .expect("keys");
    let dead_letter = |m: &EventAccepted, keys| {
        threadline_tenancy::dead_letter::letter(
            threadline_runtime::bus::Topic::Events,
            &format!("{prefix}.events"),
            Some(&original),
            &m.encode_to_vec(),
            "failed 5 times: boom",
            keys,
        )
    };
    let (headers, payload) = dead_letter(&msg, Some(&cipher));
    js.publish_with_headers(format!("{prefix}.dlq.events"), headers, payload)
        .await
        .expect("publish")
        .await
        .expect("ack");
    // The same kind of letter from a worker that had no keys: its text was
    // removed, so it cannot be replayed.
    let other = EventAccepted {
        receipt_id: uuid::Uuid::now_v7().to_string(),
        event_id: "Ev0GONE".into(),
        ..msg.clone()
    };
    let (headers, payload) = dead_letter(&other, None);
    js.publish_with_headers(format!("{prefix}.dlq.events"), headers, payload)
        .await
        .expect("publish")
        .await
        .expect("ack");
    let letters = list().await;
    assert_eq!(letters.len(), 3);
    let redacted = letters
        .iter()
        .find(|l| l["event_id"] == "Ev0GONE")
        .expect("the redacted letter, by its event id");
    assert_eq!(redacted["payload"], "redacted");
    assert_eq!(redacted["installation_id"], inst.to_string());
    let redacted_seq = redacted["seq"].as_u64().expect("seq").to_string();
    let refused = dlq(&["replay", &redacted_seq]).await;
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("without its text"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(list().await.len(), 3, "a refused replay changes nothing");
    assert!(dlq(&["drop", &redacted_seq]).await.status.success());
    let letters = list().await;
    assert_eq!(letters.len(), 2);
    // Replaying needs the keys the workers sealed with.
    let without_keys: Vec<(&str, String)> = env
        .iter()
        .filter(|(k, _)| *k != "THREADLINE_DEAD_LETTER_KEYS")
        .cloned()
        .collect();
    let needs_keys = cli(&["dlq", "replay", "--all"], &without_keys).await;
    assert!(!needs_keys.status.success());
    assert!(
        String::from_utf8_lossy(&needs_keys.stderr).contains("THREADLINE_DEAD_LETTER_KEYS"),
        "{}",
        String::from_utf8_lossy(&needs_keys.stderr)
    );
    assert_eq!(list().await.len(), 2);
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
                let s = receipts::receipt_state(&pool, receipt).await.ok()?;
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

    // Retention: a fresh letter stays under the default retention; with 0
    // hours every letter goes (a dry run only counts).
    js.publish(format!("{prefix}.events"), secret_looking.as_slice().into())
        .await
        .expect("publish")
        .await
        .expect("ack");
    eventually(
        "a second poison dead-lettered",
        Duration::from_secs(20),
        || async { (list().await.len() == 1).then_some(()) },
    )
    .await;
    let purge = |args: &'static [&'static str]| {
        let env = env.clone();
        async move {
            let out = cli(args, &env).await;
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice::<Value>(&out.stdout).expect("JSON report")
        }
    };
    assert_eq!(purge(&["purge"]).await["dead_letters"], 0);
    assert_eq!(
        purge(&["purge", "--dead-letters-hours", "0", "--dry-run"]).await["dead_letters"],
        1
    );
    assert_eq!(list().await.len(), 1, "a dry run removes nothing");
    assert_eq!(
        purge(&["purge", "--dead-letters-hours", "0"]).await["dead_letters"],
        1
    );
    assert!(list().await.is_empty(), "purged");
    // A purge that cannot reach the broker says so and fails.
    let unreachable: Vec<(&str, String)> = env
        .iter()
        .map(|(k, v)| {
            (
                *k,
                if *k == "NATS_URL" {
                    "nats://127.0.0.1:9".to_owned()
                } else {
                    v.clone()
                },
            )
        })
        .collect();
    let out = cli(&["purge"], &unreachable).await;
    assert!(
        !out.status.success(),
        "a purge that reached no letters failed"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("dead letters are not"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    assert!(cb.terminate().await.success());
    delete_streams(&js, &prefix).await;
}

/// `dlq list` on a prefix no service has started (the demo and the tests
/// run under prefixes of their own) names the prefix and the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_on_a_prefix_without_streams_names_the_prefix_it_tried() {
    let db = TestDb::new().await;
    let prefix = unique_prefix();
    let out = cli(
        &["dlq", "list"],
        &[
            ("DATABASE_URL", db.url.clone()),
            ("NATS_URL", nats_url()),
            ("THREADLINE_BUS_PREFIX", prefix.clone()),
        ],
    )
    .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "no stream, no list: {err}");
    assert!(
        err.contains(&format!("bus prefix \"{prefix}\"")) && err.contains("THREADLINE_BUS_PREFIX"),
        "{err}"
    );
}
