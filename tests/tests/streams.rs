//! Streamed answers against the compiled services, judged from Slack's
//! side (slack-sim's messages and call log, and the oracle at `stop`): a
//! stream grows and stops once with the label and metadata; a human reply
//! mid-stream ends it with the closing line and exactly one reconsidered
//! answer follows; a publisher killed mid-stream leaves one stream, ended
//! honestly, and never a second stream.

use std::time::Duration;

use serde_json::Value;
use threadline_testkit::eventually;
use threadline_tests::{Stack, cli, ok_calls, sim_ctl, sim_get, streaming};

async fn calls(s: &Stack, method: &str) -> Vec<Value> {
    ok_calls(&s.sim, method).await
}

/// Slack expires streams `ms` after their start (its lifetime, shortened).
async fn stream_lifetime(s: &Stack, ms: u64) {
    sim_ctl(
        &s.sim,
        "settings",
        serde_json::json!({"stream_lifetime_ms": ms}),
    )
    .await;
}

/// Appends Slack refused because it had expired the stream.
async fn appends_after_expiry(s: &Stack) -> usize {
    sim_get(&s.sim, "calls?method=chat.appendStream").await["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["outcome"] == "message_not_in_streaming_state")
        .count()
}

const CHANGED: &str = "_The thread changed while I was answering, so I stopped here. I'm reconsidering with the new messages._";
const INTERRUPTED: &str = "_This answer was interrupted before it finished._";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_grows_in_slack_and_stops_once_with_its_label_and_metadata() {
    let s = Stack::start(&streaming(20, &[])).await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    // (the message is there from the start; the answer once it stopped)
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
    let text = a["text"].as_str().expect("text");
    assert!(
        text.starts_with("[threadline built-in model]")
            && text.contains(&format!("Answering {q}; read")),
        "the whole answer: {text}"
    );
    assert_eq!(a["streaming_state"], "completed", "{a}");
    assert_eq!(
        a["metadata"]["event_type"], "threadline_reply",
        "metadata reconciliation reads: {a}"
    );
    assert!(
        a["metadata"]["event_payload"]["intent_id"].is_string(),
        "{a}"
    );
    let blocks = a["blocks"].to_string();
    assert!(
        blocks.contains("AI-generated"),
        "the AI label below the streamed text: {blocks}"
    );
    // From Slack's call log: one stream, grown in several appends, stopped
    // once; nothing posted whole.
    let ts = a["ts"].as_str().expect("ts");
    assert_eq!(calls(&s, "chat.startStream").await.len(), 1);
    let appends: Vec<Value> = calls(&s, "chat.appendStream")
        .await
        .into_iter()
        .filter(|c| c["ts"] == ts)
        .collect();
    assert!(appends.len() >= 2, "grown as the model wrote: {appends:?}");
    assert_eq!(calls(&s, "chat.stopStream").await.len(), 1);
    assert!(calls(&s, "chat.postMessage").await.is_empty());
    s.assert_at_most_one_reply_per_message().await;
    assert!(
        s.metrics()
            .await
            .contains("threadline_streams_finished_total")
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_human_reply_mid_stream_ends_it_with_the_closing_line_and_one_reconsidered_answer_follows()
 {
    // About 50 words at 150 ms: the stream runs for seconds.
    let s = Stack::start(&streaming(150, &[])).await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    // The answer is on its way in Slack: some words shown.
    eventually(
        "the stream showing words",
        Duration::from_secs(30),
        || async { (!calls(&s, "chat.appendStream").await.is_empty()).then_some(()) },
    )
    .await;
    let reply = s.post("it only fails on Mondays", Some(&q)).await;
    let answers = s.wait_answers(&q, 2).await;
    assert_eq!(
        answers.len(),
        2,
        "the ended stream and one answer: {answers:?}"
    );
    let first = answers[0]["text"].as_str().expect("text");
    assert!(
        first.ends_with(CHANGED),
        "the stream ends with its closing line: {first}"
    );
    assert!(
        !first.contains("Answering"),
        "and shows only part of the answer: {first}"
    );
    let second = answers[1]["text"].as_str().expect("text");
    assert!(
        second.contains(&format!("Answering {q}; read")) && second.contains(&format!("{reply}/")),
        "the reconsidered answer read the reply: {second}"
    );
    // Never streamed twice: the reconsidered answer is posted whole.
    assert_eq!(calls(&s, "chat.startStream").await.len(), 1);
    assert_eq!(calls(&s, "chat.postMessage").await.len(), 1);
    assert!(
        s.metrics()
            .await
            .contains("threadline_streams_interrupted_total{reason=\"thread_changed\"}")
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_killed_mid_stream_leaves_one_stream_ended_honestly_and_no_second() {
    let mut s = Stack::start(&streaming(
        200,
        &[
            ("THREADLINE_STREAM_STALE_MS", "2000"),
            ("THREADLINE_SLACK_TIMEOUT_MS", "500"),
            ("THREADLINE_REDELIVERY_MS", "3000"),
            ("THREADLINE_SWEEP_MS", "500"),
        ],
    ))
    .await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    eventually(
        "the stream showing words",
        Duration::from_secs(30),
        || async { (!calls(&s, "chat.appendStream").await.is_empty()).then_some(()) },
    )
    .await;
    s.kill_and_restart(3).await;
    let answers = s.wait_answers(&q, 2).await;
    assert_eq!(
        answers.len(),
        2,
        "the ended stream and the answer: {answers:?}"
    );
    let first = answers[0]["text"].as_str().expect("text");
    assert!(first.ends_with(INTERRUPTED), "ended honestly: {first}");
    assert_eq!(answers[0]["streaming_state"], "completed", "{}", answers[0]);
    let second = answers[1]["text"].as_str().expect("text");
    assert!(second.contains(&format!("Answering {q}; read")), "{second}");
    // One stream only, whatever the restart redelivered.
    assert_eq!(calls(&s, "chat.startStream").await.len(), 1);
    assert_eq!(calls(&s, "chat.postMessage").await.len(), 1);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_whose_answer_was_lost_is_found_in_slack_ended_and_never_started_again() {
    let s = Stack::start(&streaming(
        50,
        &[
            ("THREADLINE_SLACK_TIMEOUT_MS", "1000"),
            ("THREADLINE_SENDING_STALE_MS", "4000"),
            ("THREADLINE_RECONCILE_WINDOW_MS", "1500"),
            ("THREADLINE_REDELIVERY_MS", "3000"),
        ],
    ))
    .await;
    sim_ctl(
        &s.sim,
        "faults",
        serde_json::json!({"method": "chat.startStream", "mode": "lost_response", "times": 1}),
    )
    .await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    let answers = s.wait_answers(&q, 2).await;
    assert_eq!(
        answers.len(),
        2,
        "the found stream and the answer: {answers:?}"
    );
    let first = answers[0]["text"].as_str().expect("text");
    assert_eq!(
        first, INTERRUPTED,
        "the stream Slack made is ended honestly"
    );
    assert_eq!(answers[0]["streaming_state"], "completed", "{}", answers[0]);
    let second = answers[1]["text"].as_str().expect("text");
    assert!(second.contains(&format!("Answering {q}; read")), "{second}");
    // Slack's call log: the one start (whose answer was lost) and no other.
    let starts = sim_get(&s.sim, "calls?method=chat.startStream").await["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(starts.len(), 1, "{starts:?}");
    assert_eq!(starts[0]["effect"], "applied_response_lost");
    assert_eq!(calls(&s, "chat.postMessage").await.len(), 1);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_switched_off_for_a_channel_or_installation_posts_answers_whole() {
    let s = Stack::start(&streaming(20, &[])).await;
    let inst = threadline_store::testing::installations::first_id(&s.db.pool)
        .await
        .expect("installation")
        .to_string();
    let env = vec![("DATABASE_URL", s.db.url.clone())];
    let policy = |args: Vec<String>| {
        let env = env.clone();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = cli(&args, &env).await;
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    let args = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    let said = policy(args(&[
        "policy",
        "channel",
        "--installation",
        &inst,
        "--channel",
        &s.channel,
        "--streaming",
        "off",
    ]))
    .await;
    assert!(said.contains("never streams"), "{said}");
    let q1 = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    assert_eq!(s.wait_answers(&q1, 1).await.len(), 1);
    assert!(calls(&s, "chat.startStream").await.is_empty());
    assert_eq!(calls(&s, "chat.postMessage").await.len(), 1);

    // The channel follows the installation again, which is off too.
    policy(args(&[
        "policy",
        "channel",
        "--installation",
        &inst,
        "--channel",
        &s.channel,
        "--streaming",
        "inherit",
    ]))
    .await;
    policy(args(&[
        "policy",
        "set",
        "--installation",
        &inst,
        "--streaming",
        "off",
    ]))
    .await;
    let shown: Value =
        serde_json::from_str(&policy(args(&["policy", "show", "--installation", &inst])).await)
            .expect("json");
    assert_eq!(shown["streaming"], false, "{shown}");
    let q2 = s
        .post(&format!("<@{}> and the cache?", s.bot_user), None)
        .await;
    assert_eq!(s.wait_answers(&q2, 1).await.len(), 1);
    assert!(calls(&s, "chat.startStream").await.is_empty());

    // On again: streamed.
    policy(args(&[
        "policy",
        "set",
        "--installation",
        &inst,
        "--streaming",
        "on",
    ]))
    .await;
    let q3 = s
        .post(&format!("<@{}> and the queue?", s.bot_user), None)
        .await;
    eventually(
        "the third answer streamed",
        Duration::from_secs(30),
        || async { (calls(&s, "chat.stopStream").await.len() == 1).then_some(()) },
    )
    .await;
    assert_eq!(s.wait_answers(&q3, 1).await.len(), 1);
    assert_eq!(calls(&s, "chat.startStream").await.len(), 1);
    assert_eq!(calls(&s, "chat.postMessage").await.len(), 2);
    s.stop().await;
}

/// A streaming stack whose model is [`threadline_tests::streaming_model`]
/// with `pieces` every `gap`, plus `extra` settings; unjudged (the scripted
/// answers do not state what they read).
async fn scripted_stack(
    pieces: &'static [&'static str],
    gap: Duration,
    extra: &[(&'static str, &str)],
) -> Stack {
    let url = threadline_tests::streaming_model(pieces, gap).await;
    let mut settings = vec![
        ("THREADLINE_MODEL_PROVIDER", "openai"),
        ("THREADLINE_MODEL_BASE_URL", url.as_str()),
        ("THREADLINE_MODEL_NAME", "m"),
    ];
    settings.extend_from_slice(extra);
    let mut s = Stack::start(&streaming(0, &settings)).await;
    s.unjudged = Some("the scripted model's answers do not state what they read");
    s
}

/// A reviewer approves `decision` through the CLI.
async fn approve(s: &Stack, decision: uuid::Uuid) {
    let env = vec![
        ("DATABASE_URL", s.db.url.clone()),
        ("NATS_URL", threadline_testkit::nats_url()),
        ("THREADLINE_BUS_PREFIX", s.prefix.clone()),
    ];
    let out = cli(
        &["review", "approve", &decision.to_string(), "--by", "ana"],
        &env,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const REVIEW: &str = "_The rest of this answer needs a person's review before it is shown._";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_that_turns_risky_shows_nothing_risky_and_waits_for_its_reviewer() {
    let s = scripted_stack(
        &[
            "The job fails ",
            "because the cache ",
            "is cold. Ask ",
            "<@U0SECRET> about ",
            "the warmer, ",
            "then retry.",
        ],
        Duration::from_millis(300),
        &[],
    )
    .await;
    let q = s
        .post(&format!("<@{}> why does the job fail?", s.bot_user), None)
        .await;
    eventually(
        "the stream ended for review",
        Duration::from_secs(30),
        || async {
            let a = s.answers(&q).await;
            a.first()
                .filter(|m| m["text"].as_str().is_some_and(|t| t.ends_with(REVIEW)))
                .cloned()
        },
    )
    .await;
    let shown = s.answers(&q).await[0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        shown.starts_with("The job fails because the cache is cold."),
        "{shown}"
    );
    assert!(
        !shown.contains("U0SECRET") && !shown.contains("warmer"),
        "nothing from the risky part on is shown: {shown}"
    );
    let decision =
        threadline_store::testing::decisions::decision_id_with_status(&s.db.pool, "review")
            .await
            .expect("read")
            .expect("the answer waits for a reviewer");
    approve(&s, decision).await;
    let answers = s.wait_answers(&q, 2).await;
    assert_eq!(answers.len(), 2, "{answers:?}");
    let approved = answers[1]["text"].as_str().expect("text");
    assert!(
        approved.contains("Ask &lt;@U0SECRET&gt; about the warmer, then retry."),
        "the approved answer, whole and escaped: {approved}"
    );
    assert_eq!(calls(&s, "chat.startStream").await.len(), 1);
    assert_eq!(calls(&s, "chat.postMessage").await.len(), 1);
    s.stop().await;
}

/// A stream ended for review; the approved whole answer's post times out
/// but Slack applies it later. Reconciling the post must find the post,
/// not take the intent's own ended stream for its outcome (which would
/// settle the intent `interrupted` and post the answer a second time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_answer_whose_post_lands_late_after_its_stream_is_posted_once() {
    let s = scripted_stack(
        &[
            "The job fails ",
            "because the cache ",
            "is cold. Ask ",
            "<@U0SECRET> now.",
        ],
        Duration::from_millis(200),
        &[
            ("THREADLINE_SLACK_TIMEOUT_MS", "800"),
            ("THREADLINE_SENDING_STALE_MS", "4000"),
            ("THREADLINE_RECONCILE_WINDOW_MS", "1500"),
            ("THREADLINE_SWEEP_MS", "500"),
        ],
    )
    .await;
    let q = s
        .post(&format!("<@{}> why does the job fail?", s.bot_user), None)
        .await;
    eventually(
        "the stream ended for review",
        Duration::from_secs(30),
        || async {
            let a = s.answers(&q).await;
            a.first()
                .filter(|m| m["streaming_state"] == "completed")
                .filter(|m| m["text"].as_str().is_some_and(|t| t.ends_with(REVIEW)))
                .cloned()
        },
    )
    .await;
    let decision =
        threadline_store::testing::decisions::decision_id_with_status(&s.db.pool, "review")
            .await
            .expect("read")
            .expect("the answer waits for a reviewer");
    // The approved post is applied by Slack 2.5 s after it arrives; the
    // publisher gives up on it after 0.8 s and must reconcile.
    sim_ctl(
        &s.sim,
        "faults",
        serde_json::json!({"method": "chat.postMessage", "mode": "latency", "latency_ms": 2500}),
    )
    .await;
    approve(&s, decision).await;
    eventually(
        "the intent settled sent",
        Duration::from_secs(60),
        || async {
            let sent = threadline_store::testing::intents::count_in_state(&s.db.pool, "sent")
                .await
                .ok()?;
            (sent == 1).then_some(())
        },
    )
    .await;
    // Long enough for a second post to have followed (reconciliation reads
    // at 0.5 s intervals over 1.5 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let answers = s.answers(&q).await;
    assert_eq!(
        answers.len(),
        2,
        "the ended stream and one whole answer: {answers:#?}"
    );
    let posts = sim_get(&s.sim, "calls?method=chat.postMessage").await["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(posts.len(), 1, "one post, applied late: {posts:#?}");
    assert_eq!(posts[0]["effect"], "applied_client_gone", "{posts:#?}");
    s.stop().await;
}

/// A stream is Markdown, where `[label](url)` shows only its label: a
/// link the model writes is never streamed (a prompt injection could hide a
/// phishing target behind friendly words). The stream ends before it, and
/// the whole answer is posted as mrkdwn, where the same text shows its URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_markdown_link_is_never_streamed_and_the_answer_shows_its_url() {
    let s = scripted_stack(
        &[
            "The deploy fails ",
            "because the token expired. ",
            "Renew it at ",
            "[the admin page](https://evil.example/login) ",
            "and retry.",
        ],
        Duration::from_millis(200),
        &[],
    )
    .await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    let answers = s.wait_answers(&q, 2).await;
    assert_eq!(
        answers.len(),
        2,
        "the ended stream and the whole answer: {answers:#?}"
    );
    let streamed = answers[0]["text"].as_str().unwrap_or_default();
    assert!(
        !streamed.contains("](") && !streamed.contains("evil.example"),
        "no Markdown link was streamed: {streamed}"
    );
    assert!(streamed.ends_with(INTERRUPTED), "{streamed}");
    assert!(
        answers[1]["streaming_state"].is_null(),
        "a post, not a stream"
    );
    let whole = answers[1]["text"].as_str().unwrap_or_default();
    assert!(
        whole.contains("[the admin page](https://evil.example/login)"),
        "the post shows the link's target as written: {whole}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_of_the_question_mid_stream_ends_it_and_the_edited_question_is_answered_once() {
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
        || async { (!calls(&s, "chat.appendStream").await.is_empty()).then_some(()) },
    )
    .await;
    let edited = format!("<@{}> why does the deploy fail on Mondays?", s.bot_user);
    sim_ctl(
        &s.sim,
        "act/edit",
        serde_json::json!({"user": s.user, "channel": s.channel, "ts": q, "text": edited}),
    )
    .await;
    let answers = s.wait_answers(&q, 2).await;
    assert_eq!(answers.len(), 2, "{answers:?}");
    let first = answers[0]["text"].as_str().expect("text");
    assert!(first.ends_with(CHANGED), "{first}");
    let second = answers[1]["text"].as_str().expect("text");
    assert!(
        second.contains("on Mondays?") && second.contains(&format!("Answering {q}; read")),
        "the edited question answered: {second}"
    );
    assert_eq!(calls(&s, "chat.startStream").await.len(), 1);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_switch_engaged_mid_stream_ends_it_and_nothing_more_is_posted() {
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
        || async { (!calls(&s, "chat.appendStream").await.is_empty()).then_some(()) },
    )
    .await;
    let env = vec![("DATABASE_URL", s.db.url.clone())];
    let out = cli(
        &[
            "kill-switch",
            "engage",
            "--global",
            "--reason",
            "test",
            "--by",
            "ops",
        ],
        &env,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually("the stream ended", Duration::from_secs(30), || async {
        s.answers(&q)
            .await
            .into_iter()
            .find(|m| m["streaming_state"] == "completed")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let answers = s.answers(&q).await;
    assert_eq!(answers.len(), 1, "nothing after the switch: {answers:?}");
    let text = answers[0]["text"].as_str().expect("text");
    assert!(
        text.ends_with("_Answers were switched off here, so I stopped._"),
        "{text}"
    );
    assert!(calls(&s, "chat.postMessage").await.is_empty());
    let out = cli(&["kill-switch", "release", "--global", "--by", "ops"], &env).await;
    assert!(out.status.success());
    s.stop().await;
}

/// The thread's one message of the app once it carries metadata naming an
/// intent as answered (an expired stream finished by update).
async fn wait_named(s: &Stack, q: &str) -> Vec<Value> {
    eventually(
        "the expired stream finished by update",
        Duration::from_secs(40),
        || async {
            let a = s.answers(q).await;
            a.iter()
                .any(|m| m["metadata"]["event_payload"]["intent_id"].is_string())
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s.answers(q).await
}

/// What Slack shows of a stream it expired that threadline then finished:
/// one message, the stream's own, with the whole answer, the AI label and
/// the metadata naming the intent; never a post beside it.
async fn assert_finished_in_place(s: &Stack, q: &str, answers: &[Value]) {
    assert_eq!(answers.len(), 1, "one message, never a second: {answers:?}");
    let a = &answers[0];
    let ts = a["ts"].as_str().expect("ts");
    assert_eq!(a["stream"]["ended"], "expired", "Slack expired it: {a}");
    let text = a["text"].as_str().expect("text");
    assert!(
        text.contains(&format!("Answering {q}; read")),
        "the whole answer: {text}"
    );
    assert!(
        a["blocks"].as_array().is_some_and(|b| b
            .iter()
            .any(|b| b["type"] == "context" && b.to_string().contains("AI-generated"))),
        "with the AI label: {a}"
    );
    assert!(
        a["blocks"].as_array().is_some_and(|b| b.iter().any(|b| {
            b["type"] == "context_actions" && b.to_string().contains("\"feedback_buttons\"")
        })),
        "with the feedback buttons, as any answer: {a}"
    );
    assert_eq!(a["metadata"]["event_type"], "threadline_reply", "{a}");
    assert!(
        a["metadata"]["event_payload"]["intent_id"].is_string(),
        "the metadata names the intent as answered: {a}"
    );
    assert_eq!(calls(s, "chat.startStream").await.len(), 1);
    assert!(calls(s, "chat.postMessage").await.is_empty(), "no post");
    let updates = calls(s, "chat.update").await;
    assert!(
        !updates.is_empty() && updates.iter().all(|c| c["ts"] == ts),
        "updated in place: {updates:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_slack_expires_mid_answer_is_finished_by_updating_that_message() {
    // About 50 words at 150 ms: the stream outlives Slack's (shortened)
    // lifetime by seconds.
    let s = Stack::start(&streaming(150, &[])).await;
    stream_lifetime(&s, 1500).await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    let answers = wait_named(&s, &q).await;
    assert_finished_in_place(&s, &q, &answers).await;
    // Slack told an append that the stream was not open any more.
    let refused = appends_after_expiry(&s).await;
    assert!(refused >= 1, "the expiry was met mid-answer");
    assert!(
        s.metrics()
            .await
            .contains("threadline_streams_expired_total{finished=\"answer\"}")
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_found_expired_only_at_its_stop_is_finished_by_updating_that_message() {
    // A short answer (about a second); its stop reaches Slack only after
    // the stream's lifetime.
    let s = Stack::start(&streaming(20, &[])).await;
    stream_lifetime(&s, 3500).await;
    sim_ctl(
        &s.sim,
        "faults",
        serde_json::json!({"method": "chat.stopStream", "mode": "latency", "latency_ms": 4000, "times": 1}),
    )
    .await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    let answers = wait_named(&s, &q).await;
    assert_finished_in_place(&s, &q, &answers).await;
    // Every append went through; the stop was the first to meet the expiry.
    let outcomes = |method: &'static str| {
        let sim = &s.sim;
        async move {
            sim_get(sim, &format!("calls?method={method}")).await["calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|c| c["outcome"].as_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let appends = outcomes("chat.appendStream").await;
    assert!(
        !appends.is_empty() && appends.iter().all(|o| o == "ok"),
        "{appends:?}"
    );
    assert!(
        outcomes("chat.stopStream")
            .await
            .iter()
            .any(|o| o == "message_not_in_streaming_state"),
        "the stop found it expired"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_stream_whose_thread_moved_on_is_closed_by_update_and_the_answer_follows() {
    let s = Stack::start(&streaming(150, &[])).await;
    stream_lifetime(&s, 1500).await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    eventually(
        "Slack expired the stream",
        Duration::from_secs(30),
        || async {
            s.answers(&q)
                .await
                .iter()
                .any(|m| m["streaming_state"] == "errored")
                .then_some(())
        },
    )
    .await;
    // The thread moves on while the answer is still being written.
    let reply = s.post("it only fails on Mondays", Some(&q)).await;
    eventually("the answer after", Duration::from_secs(40), || async {
        (s.answers(&q).await.len() >= 2).then_some(())
    })
    .await;
    let answers = s.wait_answers(&q, 2).await;
    assert_eq!(
        answers.len(),
        2,
        "the closed stream and one answer: {answers:?}"
    );
    let first = &answers[0];
    let text = first["text"].as_str().expect("text");
    assert!(
        text.ends_with(CHANGED),
        "the expired stream is closed with its closing line: {text}"
    );
    assert!(
        first["metadata"]["event_payload"]["interrupted_intent_id"].is_string(),
        "its metadata names the intent as interrupted: {first}"
    );
    assert!(
        first["blocks"].to_string().contains("AI-generated"),
        "labelled: {first}"
    );
    let second = answers[1]["text"].as_str().expect("text");
    assert!(
        second.contains(&format!("Answering {q}; read")) && second.contains(&format!("{reply}/")),
        "the reconsidered answer read the reply: {second}"
    );
    assert_eq!(calls(&s, "chat.startStream").await.len(), 1);
    assert_eq!(calls(&s, "chat.postMessage").await.len(), 1);
    let updates = calls(&s, "chat.update").await;
    assert!(
        !updates.is_empty() && updates.iter().all(|c| c["ts"] == first["ts"]),
        "{updates:?}"
    );
    assert!(
        s.metrics()
            .await
            .contains("threadline_streams_expired_total{finished=\"closing_line\"}")
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_streams_update_whose_answer_was_lost_is_found_in_slack_never_repeated() {
    let s = Stack::start(&streaming(150, &[])).await;
    stream_lifetime(&s, 1500).await;
    // Slack applies the update, then answers `fatal_error`: its outcome is
    // unknown to threadline, which reads the thread for it.
    sim_ctl(
        &s.sim,
        "faults",
        serde_json::json!({"method": "chat.update", "mode": "fatal_error", "times": 1}),
    )
    .await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    let answers = wait_named(&s, &q).await;
    let updates = sim_get(&s.sim, "calls?method=chat.update").await["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        updates.len(),
        1,
        "found in Slack, not sent again: {updates:?}"
    );
    assert_eq!(updates[0]["outcome"], "fatal_error");
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(calls(&s, "chat.postMessage").await.is_empty(), "no post");
    use threadline_store::testing::intents;
    let o = eventually(
        "the update's outcome settled",
        Duration::from_secs(20),
        || async {
            intents::one_intent_outcome(&s.db.pool)
                .await
                .ok()
                .filter(|o| o.state != "unknown" && o.state != "reconciling")
        },
    )
    .await;
    assert_eq!(
        (o.state.as_str(), o.reconciled),
        ("sent", true),
        "recorded as the answer, from what Slack shows"
    );
    assert_eq!(
        intents::one_intent_slack_ts(&s.db.pool)
            .await
            .expect("its ts"),
        answers[0]["ts"].as_str().map(str::to_owned),
        "the stream's own message"
    );
    s.stop().await;
}

/// An append meets the expiry while the model still writes, and the answer
/// it then settles may not be streamed (it holds a Markdown link): the
/// reconciliation that found the stream expired closes it with its closing
/// line, and the whole answer still follows as a post, never lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_stream_whose_answer_may_not_be_streamed_is_closed_and_the_answer_follows() {
    let s = scripted_stack(
        &[
            "The deploy fails ",
            "because the token ",
            "expired last night, ",
            "as the log shows. ",
            "Ask the admin ",
            "to renew it, ",
            "then retry. ",
            "Renew it at ",
            "[the admin page](https://evil.example/login) ",
            "and retry.",
        ],
        Duration::from_millis(300),
        &[],
    )
    .await;
    stream_lifetime(&s, 1200).await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    let answers = s.wait_answers(&q, 2).await;
    assert_eq!(
        answers.len(),
        2,
        "the closed stream and the whole answer: {answers:#?}"
    );
    let closed = &answers[0];
    assert_eq!(closed["stream"]["ended"], "expired", "{closed}");
    let shown = closed["text"].as_str().unwrap_or_default();
    assert!(shown.ends_with(INTERRUPTED), "closed in place: {shown}");
    assert!(!shown.contains("evil.example"), "{shown}");
    assert!(
        closed["metadata"]["event_payload"]["interrupted_intent_id"].is_string(),
        "{closed}"
    );
    assert!(answers[1]["streaming_state"].is_null(), "a post");
    let whole = answers[1]["text"].as_str().unwrap_or_default();
    assert!(
        whole.contains("[the admin page](https://evil.example/login)"),
        "the whole answer, its link's target shown: {whole}"
    );
    let refused = appends_after_expiry(&s).await;
    assert!(refused >= 1, "the expiry was met by an append");
    s.stop().await;
}
