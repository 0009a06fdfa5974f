//! Intake that outlives its database, judged from Slack's side: while
//! Postgres is down every delivery is acknowledged once the broker holds it
//! in the spool, and once Postgres is back each question is answered once
//! (the oracle judges every run when its stack stops). A question spooled
//! through an outage longer than Slack's whole retry schedule, and retried
//! by Slack meanwhile, is answered once; a drainer killed mid-drain (its
//! window waiting in its insert) loses and doubles nothing; a thread's
//! question, its edit and a reply, all spooled, are recorded and the answer
//! reads the thread as it is.

use std::time::Duration;

use prost::Message as _;
use serde_json::json;
use threadline_proto::v1::SpooledDelivery;
use threadline_runtime::bus::{Topic, Topology};
use threadline_store::testing::receipts;
use threadline_testkit::{eventually, stream_len};
use threadline_tests::oracle::{digest, stated};
use threadline_tests::{Stack, sim_ctl, sim_get};

fn spool_stream(s: &Stack) -> String {
    Topology::new(s.prefix.clone()).stream(Topic::Spool)
}

/// Every delivery attempt Slack made, as the emulator recorded it.
async fn deliveries(s: &Stack) -> Vec<serde_json::Value> {
    sim_get(&s.sim, "deliveries").await["deliveries"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits until Slack has nothing left to deliver: every event's last
/// attempt answered (200), none waiting for a retry.
async fn all_acknowledged(s: &Stack, events: usize) {
    eventually(
        "every delivery acknowledged",
        Duration::from_secs(30),
        || async {
            let d = deliveries(s).await;
            let mut ok = std::collections::BTreeSet::new();
            for x in &d {
                if x["status"] == 200 && x["result"] == "ok" {
                    ok.insert(x["event_id"].as_str().unwrap_or_default().to_owned());
                }
            }
            (ok.len() >= events).then_some(())
        },
    )
    .await;
}

async fn wait_spooled(s: &Stack, n: u64) {
    eventually(
        "deliveries in the spool",
        Duration::from_secs(30),
        || async { (stream_len(&s.js, &spool_stream(s)).await >= n).then_some(()) },
    )
    .await;
}

async fn wait_drained(s: &Stack) {
    eventually("the spool drained", Duration::from_secs(60), || async {
        (stream_len(&s.js, &spool_stream(s)).await == 0).then_some(())
    })
    .await;
}

/// The spool's deliveries, in the order it holds them (event ids).
async fn spooled_event_ids(s: &Stack) -> Vec<String> {
    let stream = s.js.get_stream(spool_stream(s)).await.expect("spool");
    let info = stream.cached_info().state.clone();
    let mut ids = Vec::new();
    for seq in info.first_sequence..=info.last_sequence {
        if let Ok(m) = stream.get_raw_message(seq).await {
            let d = SpooledDelivery::decode(m.payload.as_ref()).expect("a spooled delivery");
            ids.push(d.event_id);
        }
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_spooled_through_an_outage_longer_than_slacks_retries_is_answered_once() {
    let s = Stack::start(&[("THREADLINE_SPOOL_AFTER_MS", "500".to_owned())]).await;
    s.db.take_down().await;
    // Slack counts the first two deliveries as timed out whatever the app
    // answered, and retries them (its schedule, scaled: 0.6 s, then 3 s).
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "events", "mode": "hold_past_deadline", "times": 2}),
    )
    .await;
    let q = s
        .post(&format!("<@{}> is anything lost?", s.bot_user), None)
        .await;
    // The mention and its message twin, each acknowledged by the spool.
    all_acknowledged(&s, 2).await;
    // Longer than Slack's whole retry schedule (in the emulator's time).
    tokio::time::sleep(Duration::from_secs(8)).await;
    let d = deliveries(&s).await;
    let brief: Vec<_> = d
        .iter()
        .map(|x| {
            (
                x["event_id"].clone(),
                x["attempt"].clone(),
                x["status"].clone(),
                x["result"].clone(),
            )
        })
        .collect();
    // (an attempt Slack counted as timed out by the fault has no status)
    assert!(
        d.iter()
            .all(|x| x["status"] == 200 || x["result"] == "held_past_deadline"),
        "every attempt acknowledged: {brief:?}"
    );
    assert!(
        d.iter().any(|x| x["attempt"].as_u64() >= Some(1)),
        "Slack retried during the outage: {d:#?}"
    );
    assert_eq!(
        stream_len(&s.js, &spool_stream(&s)).await,
        2,
        "one spooled message per event, retries included"
    );
    assert!(s.answers(&q).await.is_empty(), "nothing answered yet");
    s.db.bring_up().await;
    s.wait_answers(&q, 1).await;
    wait_drained(&s).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(s.answers(&q).await.len(), 1, "answered once");
    s.assert_at_most_one_reply_per_message().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drainer_killed_mid_drain_loses_and_doubles_nothing() {
    let mut s = Stack::start(&[
        ("THREADLINE_SPOOL_AFTER_MS", "300".to_owned()),
        // (each question is a thread of its own, read once: Slack's read
        // budget, not the spool, would set the pace)
        ("THREADLINE_BACKFILL_PER_MINUTE", "1000".to_owned()),
        // (the dead drainer's window is handed on after 3 s)
        ("THREADLINE_REDELIVERY_MS", "3000".to_owned()),
    ])
    .await;
    // (and the answers all go to one channel)
    sim_ctl(
        &s.sim,
        "settings",
        json!({"posts_per_second": 50.0, "post_burst": 50.0, "tier3_per_minute": 1000}),
    )
    .await;
    s.db.take_down().await;
    const QUESTIONS: usize = 25;
    let mut questions = Vec::new();
    for i in 0..QUESTIONS {
        let q = s
            .post(&format!("<@{}> question {i}", s.bot_user), None)
            .await;
        questions.push(q);
    }
    // Each question is a mention and its message twin.
    let total = 2 * QUESTIONS;
    all_acknowledged(&s, total).await;
    wait_spooled(&s, total as u64).await;
    s.db.bring_up().await;
    // The drain is held: the receipts are locked, so the drainer's window
    // waits in its insert…
    let mut lock = s.db.pool.begin().await.expect("a transaction");
    receipts::lock_receipts(&mut lock).await.expect("lock");
    eventually(
        "the drainer waiting in its insert",
        Duration::from_secs(30),
        || async {
            let waiting = receipts::lock_waits(&s.db.pool).await.ok()?;
            (waiting > 0).then_some(())
        },
    )
    .await;
    // …when the relay (and the drainer beside it) is killed; a new one
    // starts, and the lock goes.
    s.kill_and_restart(threadline_tests::RELAY).await;
    let left = stream_len(&s.js, &spool_stream(&s)).await;
    assert!(
        left > 0,
        "the killed drainer's deliveries are still in the spool"
    );
    lock.rollback().await.expect("unlock");
    wait_drained(&s).await;
    eventually(
        "every question answered",
        Duration::from_secs(60),
        || async {
            for q in &questions {
                if s.answers(q).await.is_empty() {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for q in &questions {
        assert_eq!(s.answers(q).await.len(), 1, "question {q} answered once");
    }
    // Every delivery recorded (the store keeps one receipt per event: a
    // delivery drained twice is a duplicate of it).
    let delivered: std::collections::BTreeSet<String> = deliveries(&s)
        .await
        .iter()
        .filter_map(|x| x["event_id"].as_str().map(str::to_owned))
        .collect();
    let recorded: std::collections::BTreeSet<String> = receipts::event_ids(&s.db.pool)
        .await
        .expect("receipts")
        .into_iter()
        .collect();
    let missing: Vec<_> = delivered.difference(&recorded).collect();
    assert!(missing.is_empty(), "deliveries never recorded: {missing:?}");
    s.assert_at_most_one_reply_per_message().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_threads_spooled_question_edit_and_reply_are_recorded_and_answered_as_it_is() {
    let s = Stack::start(&[("THREADLINE_SPOOL_AFTER_MS", "500".to_owned())]).await;
    s.db.take_down().await;
    let q = s
        .post(&format!("<@{}> what broke the build?", s.bot_user), None)
        .await;
    let edited = format!("<@{}> what broke the nightly build?", s.bot_user);
    sim_ctl(
        &s.sim,
        "act/edit",
        json!({"user": s.user, "channel": s.channel, "ts": q, "text": edited}),
    )
    .await;
    let reply = s.post("the cache, I think", Some(&q)).await;
    // The mention, its twin, the edit and the reply.
    all_acknowledged(&s, 4).await;
    wait_spooled(&s, 4).await;
    let spooled = spooled_event_ids(&s).await;
    assert_eq!(spooled.len(), 4, "{spooled:?}");
    s.db.bring_up().await;
    let answers = s.wait_answers(&q, 1).await;
    wait_drained(&s).await;
    // Every delivery the spool held is recorded (in spool order within the
    // drain's window, which commits together).
    let mut recorded = receipts::event_ids_in_order(&s.db.pool)
        .await
        .expect("receipts");
    // (the bot's own answer comes back as an event too)
    recorded.retain(|e| spooled.contains(e));
    recorded.sort();
    let mut want = spooled.clone();
    want.sort();
    assert_eq!(recorded, want, "every spooled delivery recorded once");
    // Slack's side: one answer, which read the question as edited and the
    // reply said before it.
    let text = answers[0]["text"].as_str().unwrap_or_default();
    let st = stated(text).unwrap_or_else(|| panic!("the answer states what it read: {text}"));
    assert_eq!(st.answering, q, "{text}");
    let read = |ts: &str| {
        st.read
            .iter()
            .find(|(t, _)| t == ts)
            .map(|(_, d)| d.clone())
    };
    assert_eq!(
        read(&q),
        Some(digest(&edited)),
        "the edited question: {text}"
    );
    assert_eq!(
        read(&reply),
        Some(digest("the cache, I think")),
        "the reply: {text}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(s.answers(&q).await.len(), 1, "answered once");
    s.stop().await;
}
