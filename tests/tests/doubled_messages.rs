//! One person's action is answered once, whatever its delivery. Slack has
//! delivered a person's single message as two `message` events with
//! different `ts` and the same `client_msg_id`, seconds apart; both messages
//! show in the channel, and a reader must see one answer. Judged from
//! Slack's side (its messages and call log): the copy arrives while the
//! answer is on its way, after it, before the original's own events, and
//! while threadline's database is down, with two context-builders taking
//! the events. Each delivery is an `app_mention` and its `message` twin
//! (same `ts`), which still collapse into one turn.
//!
//! slack-sim plays the doubled delivery: `/_sim/act/double` posts a copy of
//! a person's message (new `ts`, same `client_msg_id`) with its events.

use std::time::Duration;

use serde_json::{Value, json};
use threadline_store::testing::decisions;
use threadline_testkit::eventually;
use threadline_tests::oracle::answering;
use threadline_tests::{Stack, cli, ok_calls, quiesce, sim_ctl, sim_get, streaming};

/// Slack delivers the person's message `ts` again as another message; the
/// copy's `ts`.
async fn double(s: &Stack, ts: &str) -> String {
    let v = sim_ctl(
        &s.sim,
        "act/double",
        json!({"channel": s.channel, "ts": ts}),
    )
    .await;
    v["ts"].as_str().expect("the copy's ts").to_owned()
}

/// The app's answers in the channel (every thread), by the question each
/// states.
async fn answers_by_question(s: &Stack) -> Vec<(String, Value)> {
    let v = sim_get(&s.sim, &format!("channels/{}/messages", s.channel)).await;
    v["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m["app_id"].is_string())
        .filter_map(|m| Some((answering(m["text"].as_str()?)?, m)))
        .collect()
}

/// The answers to either of `a` and `b` (one person's action).
async fn answers_to(s: &Stack, a: &str, b: &str) -> Vec<(String, Value)> {
    answers_by_question(s)
        .await
        .into_iter()
        .filter(|(q, _)| q == a || q == b)
        .collect()
}

/// Waits until both events of message `ts` (`app_mention` and `message`)
/// were acknowledged to Slack.
async fn acknowledged(s: &Stack, ts: &str) {
    eventually(
        "both events of the message acknowledged",
        Duration::from_secs(60),
        || async {
            let d = sim_get(&s.sim, "deliveries").await;
            let n = d["deliveries"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|x| x["message_ts"] == ts && x["status"] == 200)
                .count();
            (n >= 2).then_some(())
        },
    )
    .await;
}

/// Waits until nothing is in flight in threadline (and a moment more).
async fn settled(s: &Stack) {
    let open = quiesce(
        &s.db.pool,
        Some((&s.js, &s.prefix)),
        Duration::from_secs(45),
        Duration::from_millis(1500),
    )
    .await;
    assert!(open.is_none(), "work still in flight: {open:?}");
}

/// Exactly one answer to the action of `a` and its copy `b`, once
/// threadline has settled; the message it answers.
async fn answered_once(s: &Stack, a: &str, b: &str) -> String {
    settled(s).await;
    let answers = answers_to(s, a, b).await;
    assert_eq!(
        answers.len(),
        1,
        "one answer to the action delivered as {a} and {b}: {answers:#?}"
    );
    answers[0].0.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_slack_delivered_twice_is_answered_once_whatever_the_order_and_timing() {
    let s = Stack::start(&[("THREADLINE_BUILTIN_LATENCY_MS", "2500".to_owned())]).await;
    // A second context-builder takes events too (the claim is shared in
    // Postgres, not in a process).
    let replica = s.spawn_replica(1, &[]).await;
    let bot = s.bot_user.clone();

    // 1. The copy arrives while the answer is on its way (a reply in a
    //    thread: both messages in one thread). The answer is the first
    //    message's, as it was asked: the copy neither superseded it nor made
    //    it stale.
    let root = s.post(&format!("<@{bot}> a thread?"), None).await;
    s.wait_answers(&root, 1).await;
    let asked = s.post(&format!("<@{bot}> and now?"), Some(&root)).await;
    eventually("the model is answering", Duration::from_secs(20), || {
        let pool = s.db.pool.clone();
        async move {
            let n = decisions::count_with_status(&pool, "calling").await.ok()?;
            (n >= 1).then_some(())
        }
    })
    .await;
    let copy = double(&s, &asked).await;
    acknowledged(&s, &copy).await;
    assert_eq!(answered_once(&s, &asked, &copy).await, asked);
    let thread = s.answers(&root).await;
    assert_eq!(
        thread.len(),
        2,
        "the root's answer and this one: {thread:#?}"
    );

    // 2. The copy arrives after the answer (a top-level question: the copy
    //    is a thread of its own, and stays unanswered).
    let q = s.post(&format!("<@{bot}> question two?"), None).await;
    s.wait_answers(&q, 1).await;
    let copy = double(&s, &q).await;
    acknowledged(&s, &copy).await;
    assert_eq!(answered_once(&s, &q, &copy).await, q);
    assert!(s.answers(&copy).await.is_empty());

    // 3. The copy's events reach threadline before the original's (Slack
    //    releases the four events reversed): whichever is applied first is
    //    answered, the other is not.
    sim_ctl(&s.sim, "settings", json!({"reorder_window": 4})).await;
    let q = s.post(&format!("<@{bot}> question three?"), None).await;
    let copy = double(&s, &q).await;
    sim_ctl(&s.sim, "settings", json!({"reorder_window": 0})).await;
    acknowledged(&s, &q).await;
    answered_once(&s, &q, &copy).await;

    // 4. The copy arrives while threadline's database is down (the gateway
    //    keeps it in the spool and answers Slack; it is recorded later).
    let q = s.post(&format!("<@{bot}> question four?"), None).await;
    s.wait_answers(&q, 1).await;
    s.db.take_down().await;
    let copy = double(&s, &q).await;
    acknowledged(&s, &copy).await;
    s.db.bring_up().await;
    assert_eq!(answered_once(&s, &q, &copy).await, q);

    // Slack's call log: one post per answer (the four roots' and the
    // thread's reply), nothing else.
    let posts = ok_calls(&s.sim, "chat.postMessage").await;
    assert_eq!(posts.len(), 5, "{posts:#?}");
    s.assert_at_most_one_reply_per_message().await;

    // Recorded and counted, content-free: four doubled messages.
    let out = cli(
        &["stats", "--json"],
        &[
            ("DATABASE_URL", s.db.url.clone()),
            ("NATS_URL", threadline_testkit::nats_url()),
            ("THREADLINE_BUS_PREFIX", s.prefix.clone()),
        ],
    )
    .await;
    assert!(out.status.success());
    let stats: Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    assert_eq!(stats["doubled_messages_total"], 4, "{stats:#}");
    // (each copy's `app_mention` and `message` both end as doubled)
    assert_eq!(
        stats["ignored_by_reason"]["doubled_message"], 8,
        "{stats:#}"
    );
    let mut counted = 0;
    for base in [&s.services[1].base_url, &replica.base_url] {
        let text = reqwest::get(format!("{base}/metrics"))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        counted += text
            .lines()
            .find_map(|l| l.strip_prefix("threadline_doubled_messages_total "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    assert_eq!(counted, 4, "threadline_doubled_messages_total");
    assert!(replica.terminate().await.success());
    // (the oracle judges the run when the stack stops: one person's action
    // is one question there, answered at most once)
    s.stop().await;
}

/// The receipts ended with `reason` (as `state`).
async fn receipts_ended(s: &Stack, state: &str, reason: &str) -> usize {
    threadline_store::testing::receipts::states_and_reasons(&s.db.pool)
        .await
        .expect("receipts")
        .into_iter()
        .filter(|(st, why)| st == state && why.as_deref() == Some(reason))
        .count()
}

/// Waits until both events of the copy ended as doubled (it is kept
/// hidden behind the message it repeats).
async fn kept_hidden(s: &Stack, before: usize) {
    eventually(
        "the copy's events ended as doubled",
        Duration::from_secs(30),
        || async {
            let n = receipts_ended(s, "ignored", "doubled_message").await;
            (n >= before + 2).then_some(())
        },
    )
    .await;
}

/// Waits until the model is answering a question.
async fn calling(s: &Stack) {
    eventually("the model is answering", Duration::from_secs(20), || {
        let pool = s.db.pool.clone();
        async move {
            let n = decisions::count_with_status(&pool, "calling").await.ok()?;
            (n >= 1).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_still_showing_stands_in_for_the_kept_message_the_person_deleted() {
    let s = Stack::start(&[("THREADLINE_BUILTIN_LATENCY_MS", "2500".to_owned())]).await;
    let bot = s.bot_user.clone();

    // 1. The message threadline kept is deleted while its answer is being
    //    made, its copy showing: the copy is answered, once, in its own
    //    thread (the deleted message's answer is cancelled, then the copy
    //    asked in its place).
    let kept = s.post(&format!("<@{bot}> question one?"), None).await;
    calling(&s).await;
    let before = receipts_ended(&s, "ignored", "doubled_message").await;
    let copy = double(&s, &kept).await;
    kept_hidden(&s, before).await;
    s.delete(&kept).await;
    assert_eq!(answered_once(&s, &kept, &copy).await, copy);
    assert_eq!(s.answers(&copy).await.len(), 1);
    assert!(s.answers(&kept).await.is_empty());

    // 2. A reply already answered when the message kept is deleted: its
    //    copy is not asked again (the action was answered), but it is
    //    what the thread holds now: the next answer there reads it.
    let root = s.post(&format!("<@{bot}> a thread?"), None).await;
    s.wait_answers(&root, 1).await;
    let kept = s.post(&format!("<@{bot}> a detail?"), Some(&root)).await;
    s.wait_answers(&root, 2).await;
    let before = receipts_ended(&s, "ignored", "doubled_message").await;
    let copy = double(&s, &kept).await;
    kept_hidden(&s, before).await;
    s.delete(&kept).await;
    settled(&s).await;
    let next = s.post(&format!("<@{bot}> and now?"), Some(&root)).await;
    s.wait_answers(&root, 3).await;
    settled(&s).await;
    assert_eq!(answers_to(&s, &kept, &copy).await.len(), 1);
    let (_, answer) = answers_by_question(&s)
        .await
        .into_iter()
        .find(|(q, _)| *q == next)
        .expect("the next question's answer");
    let read = threadline_tests::oracle::stated(answer["text"].as_str().unwrap_or_default())
        .expect("the answer states what it read")
        .read;
    assert!(
        read.iter().any(|(ts, _)| *ts == copy) && !read.iter().any(|(ts, _)| *ts == kept),
        "the next answer read the copy, not the deleted message: {read:?}"
    );

    // 3. The copy's events reach threadline only after the deletion (Slack
    //    releases the copy's two events and the deletion reversed): the
    //    copy stands in as it arrives, and is answered once the deleted
    //    message's answer is cancelled.
    let kept = s.post(&format!("<@{bot}> question three?"), None).await;
    calling(&s).await;
    sim_ctl(&s.sim, "settings", json!({"reorder_window": 3})).await;
    let copy = double(&s, &kept).await;
    s.delete(&kept).await;
    sim_ctl(&s.sim, "settings", json!({"reorder_window": 0})).await;
    acknowledged(&s, &copy).await;
    assert_eq!(answered_once(&s, &kept, &copy).await, copy);

    // 4. A top-level copy is a thread of its own in Slack: someone replies
    //    under it, and the answer there reads the copy as its root (while
    //    the message it repeats keeps its own answer, and the copy none).
    let kept = s.post(&format!("<@{bot}> question four?"), None).await;
    s.wait_answers(&kept, 1).await;
    let before = receipts_ended(&s, "ignored", "doubled_message").await;
    let copy = double(&s, &kept).await;
    kept_hidden(&s, before).await;
    let under = s.post(&format!("<@{bot}> about that?"), Some(&copy)).await;
    s.wait_answers(&copy, 1).await;
    settled(&s).await;
    let (_, answer) = answers_by_question(&s)
        .await
        .into_iter()
        .find(|(q, _)| *q == under)
        .expect("the answer under the copy");
    let read = threadline_tests::oracle::stated(answer["text"].as_str().unwrap_or_default())
        .expect("the answer states what it read")
        .read;
    assert!(
        read.iter().any(|(ts, _)| *ts == copy),
        "the answer under the copy read it: {read:?}"
    );
    assert_eq!(answered_once(&s, &kept, &copy).await, kept);

    // Slack saw one post per answer.
    let posts = ok_calls(&s.sim, "chat.postMessage").await;
    assert_eq!(posts.len(), 7, "{posts:#?}");
    let (j, violations) = s.verdict(Duration::from_millis(500)).await;
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(j.unexplained.is_empty(), "{j:#?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_standing_in_for_a_message_whose_answer_streamed_is_posted_whole() {
    // About 50 words at 300 ms: the stream runs for about 15 s, past the
    // doubling and the deletion.
    let s = Stack::start(&streaming(300, &[])).await;
    let bot = s.bot_user.clone();

    // The message threadline kept is being streamed an answer when Slack
    // doubles it and the person deletes it: the stream ends early, and the
    // copy asked in its place is answered once, posted whole (one action,
    // one stream at most: never a second stream after an interrupted one).
    let kept = s.post(&format!("<@{bot}> why does it fail?"), None).await;
    let before = receipts_ended(&s, "ignored", "doubled_message").await;
    eventually(
        "the stream showing words",
        Duration::from_secs(30),
        || async { (!ok_calls(&s.sim, "chat.appendStream").await.is_empty()).then_some(()) },
    )
    .await;
    let copy = double(&s, &kept).await;
    kept_hidden(&s, before).await;
    s.delete(&kept).await;
    assert_eq!(answered_once(&s, &kept, &copy).await, copy);
    let answer = s.answers(&copy).await;
    assert_eq!(answer.len(), 1, "{answer:#?}");
    assert!(
        answer[0].get("streaming_state").is_none_or(Value::is_null),
        "the copy's answer was posted whole: {:#}",
        answer[0]
    );
    assert_eq!(ok_calls(&s.sim, "chat.startStream").await.len(), 1);
    assert_eq!(ok_calls(&s.sim, "chat.postMessage").await.len(), 1);
    let (_, violations) = s.verdict(Duration::from_millis(500)).await;
    assert!(violations.is_empty(), "{violations:#?}");
    s.stop().await;
}
