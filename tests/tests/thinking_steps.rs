//! Thinking steps of streamed answers against the compiled services,
//! judged from Slack's side (the task cards slack-sim shows in the
//! thread's messages): a clean stream shows its three stages complete; a
//! stream the thread moved on from ends its writing task as an error that
//! says why, and the reconsidered answer is a message of its own; a stream
//! Slack expired and threadline finished by update shows no task in
//! progress; the writing step of a whole answer carries as sources the
//! links the answer took from its thread, and never one only the answer
//! names.

use std::time::Duration;

use serde_json::{Value, json};
use threadline_testkit::eventually;
use threadline_tests::{ORACLE_GRACE, Stack, ok_calls, sim_ctl, streaming};

/// The task cards a message shows: (task id, status, details text).
fn cards(m: &Value) -> Vec<(String, String, String)> {
    m["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "task_card")
        .map(|b| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (
                s(&b["task_id"]),
                s(&b["status"]),
                s(&b["details"]["elements"][0]["elements"][0]["text"]),
            )
        })
        .collect()
}

fn statuses(m: &Value) -> Vec<(String, String)> {
    cards(m).into_iter().map(|(id, st, _)| (id, st)).collect()
}

fn pair(id: &str, status: &str) -> (String, String) {
    (id.to_owned(), status.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stream_shows_its_three_stages_complete() {
    let s = Stack::start(&streaming(20, &[])).await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    // While it streams, Slack shows the thread read and the answer being
    // written.
    let open = eventually("the stream open", Duration::from_secs(30), || async {
        s.answers(&q)
            .await
            .into_iter()
            .find(|m| m["streaming_state"] == "in_progress" && !cards(m).is_empty())
    })
    .await;
    assert_eq!(
        statuses(&open),
        [
            pair("threadline_read", "complete"),
            pair("threadline_write", "in_progress")
        ],
        "{open}"
    );
    eventually("the stream stopped", Duration::from_secs(30), || async {
        let a = s.answers(&q).await;
        a.iter()
            .any(|m| m["streaming_state"] == "completed")
            .then_some(())
    })
    .await;
    let answers = s.wait_answers(&q, 1).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    let a = &answers[0];
    assert_eq!(
        statuses(a),
        [
            pair("threadline_read", "complete"),
            pair("threadline_write", "complete"),
            pair("threadline_check", "complete")
        ],
        "{a}"
    );
    let titles: Vec<&str> = a["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["title"].as_str())
        .collect();
    assert_eq!(
        titles,
        [
            "Reading the thread",
            "Writing the answer",
            "Checking the thread before the answer is whole"
        ]
    );
    // The whole answer and its label are still there.
    assert!(a["text"].as_str().unwrap_or_default().contains(&q));
    assert!(a["blocks"].to_string().contains("AI-generated"));
    s.assert_at_most_one_reply_per_message().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_that_moves_on_mid_stream_leaves_the_writing_task_in_error_with_why() {
    let s = Stack::start(&streaming(150, &[])).await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    eventually(
        "the stream showing words",
        Duration::from_secs(30),
        || async { (!ok_calls(&s.sim, "chat.appendStream").await.is_empty()).then_some(()) },
    )
    .await;
    s.post("it only fails on Mondays", Some(&q)).await;
    let answers = s.wait_answers(&q, 2).await;
    assert_eq!(answers.len(), 2, "{answers:?}");
    let ended = &answers[0];
    let c = cards(ended);
    assert_eq!(
        c.iter().map(|(id, st, _)| pair(id, st)).collect::<Vec<_>>(),
        [
            pair("threadline_read", "complete"),
            pair("threadline_write", "error")
        ],
        "never complete, and no check shown as passed: {ended}"
    );
    assert!(
        c[1].2
            .starts_with("The thread changed while I was answering"),
        "the writing task says why: {c:?}"
    );
    // The reconsidered answer is a message of its own (posted whole, as
    // after any interrupted stream): none of the ended stream's tasks.
    let second = &answers[1];
    assert_ne!(second["ts"], ended["ts"]);
    assert!(cards(second).is_empty(), "{second}");
    assert!(
        second["text"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("Answering {q}; read"))
    );
    assert_eq!(ok_calls(&s.sim, "chat.startStream").await.len(), 1);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_slack_expired_and_threadline_updated_shows_no_task_in_progress() {
    let s = Stack::start(&streaming(150, &[])).await;
    sim_ctl(
        &s.sim,
        "settings",
        serde_json::json!({"stream_lifetime_ms": 1500}),
    )
    .await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    let a = eventually(
        "the expired stream finished by update",
        Duration::from_secs(40),
        || async {
            s.answers(&q)
                .await
                .into_iter()
                .find(|m| m["metadata"]["event_payload"]["intent_id"].is_string())
        },
    )
    .await;
    assert_eq!(a["stream"]["ended"], "expired", "Slack expired it: {a}");
    // It showed its steps while open (the writing step in progress), so
    // what follows is the update's doing, not a stream that had none.
    assert!(
        a["stream"]["tasks"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["id"] == "threadline_write")),
        "the stream showed its writing step: {a}"
    );
    // chat.update replaces the message's blocks: the task cards the stream
    // showed are gone with them, none left in progress.
    assert!(
        !cards(&a).iter().any(|(_, st, _)| st == "in_progress"),
        "{a}"
    );
    assert!(!ok_calls(&s.sim, "chat.update").await.is_empty());
    s.stop().await;
}

/// The writing step a message shows (its `task_card`).
fn writing_step(m: &Value) -> Value {
    m["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b["type"] == "task_card" && b["task_id"] == "threadline_write")
        .cloned()
        .unwrap_or(Value::Null)
}

/// The one answer to `q`, once its stream stopped whole.
async fn stopped_answer(s: &Stack, q: &str) -> Value {
    eventually("the stream stopped", Duration::from_secs(30), || async {
        s.answers(q)
            .await
            .into_iter()
            .find(|m| m["streaming_state"] == "completed")
    })
    .await
}

/// A question that links its CI run: the built-in model's answer quotes
/// it, so the stop shows the link as the writing step's source, as Slack's
/// URL source element; the oracle (which checks every source against the
/// answer and the thread as Slack shows them) finds nothing untrue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_the_answer_took_from_its_thread_is_its_writing_steps_source() {
    let s = Stack::start(&streaming(20, &[])).await;
    let q = s
        .post(
            &format!(
                "<@{}> why does <https://ci.example.com/runs/42> fail?",
                s.bot_user
            ),
            None,
        )
        .await;
    let a = stopped_answer(&s, &q).await;
    assert!(
        a["text"]
            .as_str()
            .unwrap_or_default()
            .contains("https://ci.example.com/runs/42"),
        "the answer quotes the link: {a}"
    );
    let w = writing_step(&a);
    assert_eq!(w["status"], "complete", "{a}");
    assert_eq!(
        w["sources"],
        json!([{"type": "url", "url": "https://ci.example.com/runs/42",
                "text": "ci.example.com/runs/42"}]),
        "{a}"
    );
    s.stop().await;
}

/// A model whose answer names the thread's link and one of its own: only
/// the thread's is a source; the one only the answer names is none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_only_in_the_answer_is_never_a_source() {
    let url = threadline_tests::streaming_model(
        &[
            "Compare https://ci.example.com/runs/42 ",
            "with https://runbook.example.com/deploys ",
            "before a retry.",
        ],
        Duration::from_millis(300),
    )
    .await;
    let mut s = Stack::start(&streaming(
        0,
        &[
            ("THREADLINE_MODEL_PROVIDER", "openai"),
            ("THREADLINE_MODEL_BASE_URL", url.as_str()),
            ("THREADLINE_MODEL_NAME", "m"),
        ],
    ))
    .await;
    s.unjudged = Some("the test's model does not state what it read");
    let q = s
        .post(
            &format!(
                "<@{}> why does <https://ci.example.com/runs/42> fail?",
                s.bot_user
            ),
            None,
        )
        .await;
    let a = stopped_answer(&s, &q).await;
    assert!(
        a["text"]
            .as_str()
            .unwrap_or_default()
            .contains("https://runbook.example.com/deploys"),
        "{a}"
    );
    let w = writing_step(&a);
    let sources: Vec<&str> = w["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x["url"].as_str())
        .collect();
    assert_eq!(sources, ["https://ci.example.com/runs/42"], "{a}");
    // Asked again in the thread, the model repeats its own link: it is in
    // the thread now, but only in the app's own answer, so still no source.
    s.post(&format!("<@{}> and now?", s.bot_user), Some(&q))
        .await;
    let first = a["ts"].clone();
    let again = eventually("the second stream stopped", Duration::from_secs(30), || {
        let first = first.clone();
        let s = &s;
        let q = q.clone();
        async move {
            s.answers(&q)
                .await
                .into_iter()
                .find(|m| m["streaming_state"] == "completed" && m["ts"] != first)
        }
    })
    .await;
    let sources: Vec<String> = writing_step(&again)["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x["url"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(sources, ["https://ci.example.com/runs/42"], "{again}");
    // The oracle's own check of sources finds nothing untrue either (the
    // answers state nothing the rest of it could judge).
    let (_, violations) = s.verdict_by_kind(ORACLE_GRACE).await;
    let untrue: Vec<_> = violations
        .iter()
        .filter(|(kind, _)| *kind == "source_untrue")
        .collect();
    assert!(untrue.is_empty(), "{untrue:?}");
    s.stop().await;
}
