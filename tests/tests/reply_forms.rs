//! Every form of answer keeps the promise, judged from Slack's side: a
//! stream ends once its thread changed even when Slack refuses the stop for
//! a while; what a person says while a stream is open is a crossing of it;
//! a stream taken over from a dead publisher still ends in one answer; two
//! questions whose stream starts were both lost never take each other's
//! stream. Each scenario runs the services as processes against slack-sim,
//! and the oracle judges the run when the stack stops (its stream end bound
//! follows the stack's settings, see `Stack::oracle_limits`).

use std::time::Duration;

use serde_json::json;
use threadline_testkit::eventually;
use threadline_tests::{Stack, ok_calls, sim_ctl, sim_get, streaming};

const CHANGED: &str = "_The thread changed while I was answering, so I stopped here. I'm reconsidering with the new messages._";
const INTERRUPTED: &str = "_This answer was interrupted before it finished._";

/// Short recovery times, so that a lost or refused call is settled in
/// seconds (a stream nobody drives is taken over after 3 s).
const QUICK: [(&str, &str); 6] = [
    ("THREADLINE_SLACK_TIMEOUT_MS", "800"),
    ("THREADLINE_STREAM_STALE_MS", "3000"),
    ("THREADLINE_SENDING_STALE_MS", "4000"),
    ("THREADLINE_RECONCILE_WINDOW_MS", "1500"),
    ("THREADLINE_REDELIVERY_MS", "3000"),
    ("THREADLINE_SWEEP_MS", "500"),
];

async fn words_shown(s: &Stack) {
    eventually(
        "the stream showing words",
        Duration::from_secs(30),
        || async { (!ok_calls(&s.sim, "chat.appendStream").await.is_empty()).then_some(()) },
    )
    .await;
}

/// Every call of `method` in Slack's log, whatever its outcome.
async fn all_calls(s: &Stack, method: &str) -> Vec<serde_json::Value> {
    sim_get(&s.sim, &format!("calls?method={method}")).await["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits until no reply intent is on its way or being reconciled.
async fn settled(s: &Stack) {
    eventually(
        "every reply intent settled",
        Duration::from_secs(60),
        || async {
            for state in ["sending", "unknown", "reconciling", "streaming", "ending"] {
                let n = threadline_store::testing::intents::count_in_state(&s.db.pool, state)
                    .await
                    .ok()?;
                if n > 0 {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
}

/// Questions threadline holds for an operator instead of answering.
async fn held(s: &Stack) -> i64 {
    threadline_store::testing::intents::count_in_state(&s.db.pool, "held")
        .await
        .expect("intents")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_stop_slack_refuses_is_stopped_once_slack_takes_stops_again() {
    let s = Stack::start(&streaming(150, &QUICK)).await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    words_shown(&s).await;
    // Slack refuses the next two stops (Tier 2, shared by the workspace's
    // streams) while the thread changes under the stream.
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.stopStream", "mode": "ratelimited", "retry_after": 2, "times": 2}),
    )
    .await;
    let reply = s.post("it only fails on Mondays", Some(&q)).await;
    // Slack's side: the stream ends with its closing line once Slack takes
    // stops again, and one whole answer that read the reply follows.
    let answers = s.wait_answers(&q, 2).await;
    assert_eq!(
        answers.len(),
        2,
        "the ended stream and one answer: {answers:#?}"
    );
    eventually("the stream stopped", Duration::from_secs(30), || async {
        let a = s.answers(&q).await;
        (a[0]["streaming_state"] == "completed").then_some(())
    })
    .await;
    let answers = s.answers(&q).await;
    let first = answers[0]["text"].as_str().expect("text");
    assert!(
        first.ends_with(CHANGED),
        "ended with its closing line: {first}"
    );
    let second = answers[1]["text"].as_str().expect("text");
    assert!(
        second.contains(&format!("Answering {q}; read")) && second.contains(&format!("{reply}/")),
        "the one whole answer read the reply: {second}"
    );
    let stops = all_calls(&s, "chat.stopStream").await;
    assert_eq!(
        stops
            .iter()
            .filter(|c| c["outcome"] == "ratelimited")
            .count(),
        2,
        "Slack refused two stops: {stops:#?}"
    );
    // (the oracle checks the stream ended within its bound of the change)
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_said_while_the_stream_stops_is_a_crossing_even_when_processed_after_it() {
    let s = Stack::start(&streaming(100, &[])).await;
    let _q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    words_shown(&s).await;
    // The context-builder is frozen, so that what a person says now is
    // processed only after the stream was recorded; the person replies the
    // moment the stream's stop reaches Slack (before it is applied).
    s.services[1].pause();
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.stopStream", "mode": "inject_reply", "user": s.user,
               "text": "wait, it is Tuesday", "latency_ms": 200}),
    )
    .await;
    eventually("the stream stopped", Duration::from_secs(30), || async {
        (!ok_calls(&s.sim, "chat.stopStream").await.is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    s.services[1].resume();
    // The oracle (at stop) finds the reply crossed the answer in flight and
    // requires threadline to have recorded and reconsidered that crossing.
    eventually("the crossing recorded", Duration::from_secs(30), || async {
        let n = threadline_store::testing::threads::count_crossed_answers(&s.db.pool)
            .await
            .ok()?;
        (n > 0).then_some(())
    })
    .await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_taken_over_whose_stop_answer_was_lost_still_ends_in_one_answer() {
    let mut s = Stack::start(&streaming(200, &QUICK)).await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    words_shown(&s).await;
    // The publisher dies mid-stream; the stream is taken over and ended,
    // and the answer to that stop is lost (Slack applied it).
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.stopStream", "mode": "lost_response", "latency_ms": 1000}),
    )
    .await;
    s.kill_and_restart(3).await;
    let answers = s.wait_answers(&q, 2).await;
    assert_eq!(
        answers.len(),
        2,
        "the ended stream and the answer: {answers:#?}"
    );
    settled(&s).await;
    let first = answers[0]["text"].as_str().expect("text");
    assert!(first.ends_with(INTERRUPTED), "ended honestly: {first}");
    let second = answers[1]["text"].as_str().expect("text");
    assert!(second.contains(&format!("Answering {q}; read")), "{second}");
    assert_eq!(held(&s).await, 0, "nothing held for an operator");
    assert_eq!(ok_calls(&s.sim, "chat.startStream").await.len(), 1);
    eprintln!(
        "DEBUG starts {:#?}",
        all_calls(&s, "chat.startStream").await
    );
    eprintln!("DEBUG stops {:#?}", all_calls(&s, "chat.stopStream").await);
    eprintln!("DEBUG answers {:#?}", s.answers(&q).await);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_questions_whose_stream_starts_were_lost_never_take_each_others_stream() {
    let s = Stack::start(&streaming(150, &QUICK)).await;
    // The first question's start fails without Slack making a stream (its
    // outcome unknown to threadline)…
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.startStream", "mode": "http_error", "status": 503, "applied": false}),
    )
    .await;
    let q1 = s
        .post(&format!("<@{}> first: why does it fail?", s.bot_user), None)
        .await;
    eventually("the first start tried", Duration::from_secs(30), || async {
        (!all_calls(&s, "chat.startStream").await.is_empty()).then_some(())
    })
    .await;
    // …and the second question's start makes a stream whose answer is lost.
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.startStream", "mode": "lost_response", "latency_ms": 1000}),
    )
    .await;
    let q2 = s
        .post(&format!("<@{}> second: and now?", s.bot_user), Some(&q1))
        .await;
    // The second question is answered once, whole (it reads the first).
    eventually(
        "the second question answered",
        Duration::from_secs(60),
        || async {
            let a = s.answers(&q1).await;
            a.iter()
                .any(|m| {
                    m["text"]
                        .as_str()
                        .is_some_and(|t| t.contains(&format!("Answering {q2}; read")))
                })
                .then_some(())
        },
    )
    .await;
    settled(&s).await;
    let answers = s.answers(&q1).await;
    let whole: Vec<&str> = answers
        .iter()
        .filter_map(|m| m["text"].as_str())
        .filter(|t| t.contains("; read "))
        .collect();
    assert_eq!(whole.len(), 1, "one whole answer: {answers:#?}");
    assert!(
        whole[0].contains(&format!("{q1}/")),
        "it read the first question too"
    );
    assert_eq!(held(&s).await, 0, "nothing held for an operator");
    s.stop().await;
}
