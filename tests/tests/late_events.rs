//! Late events, judged from Slack's side: Slack replays the events of
//! messages an app missed (as after an outage of the app), long after they
//! were posted. A request that reaches threadline later than
//! `THREADLINE_LATE_EVENT_MS` (five minutes by default) after it was asked
//! is handled as its installation's policy says: answered with an honest
//! note of its lateness (the default), skipped, or answered as if in time;
//! every late event is recorded and counted. The note goes where the AI
//! label goes, through the one reply mechanism: a post, a stream's stop.
//!
//! slack-sim plays the replay: `/_sim/act/post` with `late_by_secs` dates
//! the message that long ago, and its events carry that `event_time`.

use std::time::Duration;

use serde_json::{Value, json};
use threadline_testkit::eventually;
use threadline_tests::oracle::answering;
use threadline_tests::{Stack, cli, first_installation, ok_calls, quiesce, sim_ctl, sim_get};

/// What the note says for a request 15 minutes late.
const NOTE_15: &str = "Slack delivered this message to me 15 minutes after it was sent";

/// A person's question that Slack delivers `secs` seconds after it was
/// asked; its `ts`.
async fn post_late(s: &Stack, text: &str, secs: u64) -> String {
    let v = sim_ctl(
        &s.sim,
        "act/post",
        json!({"user": s.user, "channel": s.channel, "text": text, "late_by_secs": secs}),
    )
    .await;
    v["ts"].as_str().expect("ts").to_owned()
}

/// The text of an answer's context blocks (the AI label, and a note).
fn context_text(answer: &Value) -> String {
    answer["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "context")
        .flat_map(|b| b["elements"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| e["text"].as_str().map(str::to_owned))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The one answer in the thread of `ts`, which answers `ts`.
async fn the_answer(s: &Stack, ts: &str) -> Value {
    let answers = s.wait_answers(ts, 1).await;
    assert_eq!(answers.len(), 1, "one answer to {ts}: {answers:#?}");
    let text = answers[0]["text"].as_str().unwrap_or_default();
    assert_eq!(answering(text).as_deref(), Some(ts), "{text}");
    answers[0].clone()
}

fn env(s: &Stack) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", s.db.url.clone()),
        ("NATS_URL", threadline_testkit::nats_url()),
        ("THREADLINE_BUS_PREFIX", s.prefix.clone()),
    ]
}

async fn run_cli(s: &Stack, args: &[&str]) -> String {
    let out = cli(args, &env(s)).await;
    assert!(
        out.status.success(),
        "threadline {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn set_policy(s: &Stack, inst: &str, action: &str) {
    run_cli(
        s,
        &[
            "policy",
            "late-events",
            "--installation",
            inst,
            "--action",
            action,
        ],
    )
    .await;
    let shown: Value =
        serde_json::from_str(&run_cli(s, &["policy", "show", "--installation", inst]).await)
            .expect("policy JSON");
    assert_eq!(shown["late_events"], action);
}

/// Waits until Slack had both events of message `ts` (`app_mention` and
/// `message`) acknowledged, then until threadline has nothing in flight.
async fn acknowledged_and_settled(s: &Stack, ts: &str) {
    eventually(
        "both events of the message acknowledged",
        Duration::from_secs(30),
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
    let open = quiesce(
        &s.db.pool,
        Some((&s.js, &s.prefix)),
        Duration::from_secs(30),
        Duration::from_millis(1500),
    )
    .await;
    assert!(open.is_none(), "work still in flight: {open:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_request_is_noted_skipped_or_answered_as_its_installation_says() {
    let s = Stack::start(&[]).await;
    let inst = first_installation(&s).await;
    let bot = s.bot_user.clone();

    // In time: answered, its label alone.
    let in_time = s.post(&format!("<@{bot}> in time?"), None).await;
    let a = the_answer(&s, &in_time).await;
    assert!(!context_text(&a).contains("Slack delivered"), "{a:#?}");

    // Fifteen minutes late, nothing chosen: answered, the note beside the
    // label (the label first, as on every answer).
    let noted = post_late(&s, &format!("<@{bot}> replayed after an outage?"), 900).await;
    let a = the_answer(&s, &noted).await;
    let label = context_text(&a);
    assert!(label.contains(NOTE_15), "the note of its lateness: {label}");
    assert!(label.starts_with("AI-generated"), "{label}");
    assert!(
        a["text"].as_str().unwrap_or_default().contains(NOTE_15),
        "the notification text carries it too: {a:#?}"
    );

    // `skip`: acknowledged to Slack, never answered.
    set_policy(&s, &inst, "skip").await;
    let skipped = post_late(&s, &format!("<@{bot}> skipped?"), 900).await;
    acknowledged_and_settled(&s, &skipped).await;
    assert!(
        s.answers(&skipped).await.is_empty(),
        "a skipped late request has no answer"
    );

    // `answer`: answered as if in time.
    set_policy(&s, &inst, "answer").await;
    let answered = post_late(&s, &format!("<@{bot}> answered anyway?"), 900).await;
    let a = the_answer(&s, &answered).await;
    assert!(!context_text(&a).contains("Slack delivered"), "{a:#?}");

    // Slack's call log: one post per answer, none for the skipped request.
    let posts = ok_calls(&s.sim, "chat.postMessage").await;
    assert_eq!(posts.len(), 3, "three answers posted: {posts:#?}");

    // Recorded and counted: each late request's two events (its
    // `app_mention` and `message` twin), by outcome.
    let stats: Value =
        serde_json::from_str(&run_cli(&s, &["stats", "--json"]).await).expect("stats JSON");
    assert_eq!(
        stats["late_events_by_outcome"],
        json!({"noted": 2, "skipped": 2, "answered": 2, "recorded": 0}),
        "{stats:#}"
    );
    assert_eq!(stats["ignored_by_reason"]["late_event"], 2, "{stats:#}");
    let metrics = s.metrics().await;
    for (outcome, n) in [("noted", 2), ("skipped", 2), ("answered", 2)] {
        let line = format!("threadline_late_events_total{{outcome=\"{outcome}\"}} {n}");
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} among the metrics"
        );
    }
    let audit =
        threadline_store::testing::audit::audit_reasons(&s.db.pool, "context", "late_event")
            .await
            .expect("audit");
    assert_eq!(audit.len(), 6, "{audit:?}");
    // (the oracle judges the run when the stack stops: the skipped request
    // is explained by its receipt, ignored as `late_event`)
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_requests_streamed_answer_stops_with_the_note() {
    let s = Stack::start(&threadline_tests::streaming(20, &[])).await;
    let bot = s.bot_user.clone();
    let noted = post_late(&s, &format!("<@{bot}> streamed late?"), 900).await;
    let a = the_answer(&s, &noted).await;
    assert_eq!(a["streaming_state"], "completed", "a stream: {a:#?}");
    let label = context_text(&a);
    assert!(
        label.contains(NOTE_15),
        "the stop's label notes it: {label}"
    );
    assert_eq!(ok_calls(&s.sim, "chat.startStream").await.len(), 1);
    assert!(ok_calls(&s.sim, "chat.postMessage").await.is_empty());
    s.stop().await;
}
