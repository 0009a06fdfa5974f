//! The assistant pane, judged from Slack's side: a person opens the app's
//! assistant (a thread in their DM with the app); threadline greets it with
//! suggested prompts and a title, shows progress while the model runs, and
//! clears it on every outcome; the pane stays under the DM policy. The
//! services run as processes; slack-sim's assistant state and call log say
//! what happened.

use std::time::Duration;

use serde_json::{Value, json};
use threadline_testkit::eventually;
use threadline_tests::{Stack, cli, first_installation, sim_ctl, sim_get};

const EVENTS: &[&str] = &[
    "app_mention",
    "message.channels",
    "message.im",
    "assistant_thread_started",
    "assistant_thread_context_changed",
];
const SCOPES: &[&str] = &[
    "chat:write",
    "channels:history",
    "channels:read",
    "im:history",
    "assistant:write",
];

async fn pane_stack(dms: bool) -> Stack {
    pane_stack_with(dms, &[("THREADLINE_BUILTIN_LATENCY_MS", "1500".to_owned())]).await
}

async fn pane_stack_with(dms: bool, settings: &[(&'static str, String)]) -> Stack {
    let s = Stack::start_with_app(settings, EVENTS, SCOPES).await;
    let inst = first_installation(&s).await;
    let out = cli(
        &[
            "policy",
            "set",
            "--installation",
            &inst,
            "--dms",
            if dms { "on" } else { "off" },
        ],
        &[("DATABASE_URL", s.db.url.clone())],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s
}

/// Opens the pane as the stack's person, looking at the stack's channel:
/// the DM and the thread.
async fn open_pane(s: &Stack) -> (String, String) {
    let opened = sim_ctl(
        &s.sim,
        "act/assistant_open",
        json!({"user": s.user, "app_id": s.app, "context_channel": s.channel}),
    )
    .await;
    (
        opened["channel"].as_str().expect("channel").to_owned(),
        opened["ts"].as_str().expect("ts").to_owned(),
    )
}

/// The pane's state as Slack shows it.
async fn pane(s: &Stack, dm: &str) -> Value {
    sim_get(&s.sim, &format!("assistant_threads?channel={dm}")).await["threads"][0].clone()
}

/// The app's replies in the pane's thread (its root, the app's
/// `assistant_app_thread` message, is no reply).
async fn replies(s: &Stack, dm: &str, thread: &str) -> Vec<Value> {
    s.answers_in(dm, thread)
        .await
        .into_iter()
        .filter(|m| m["subtype"] != "assistant_app_thread")
        .collect()
}

/// Asks `question` in the pane's thread; the text of the answer to it.
async fn ask(s: &Stack, dm: &str, thread: &str, question: &str) -> String {
    let asked = s.post_as(&s.user, dm, question, Some(thread)).await;
    let answer = eventually(
        &format!("the answer to {question:?}"),
        Duration::from_secs(30),
        || async {
            replies(s, dm, thread).await.into_iter().find(|a| {
                a["text"]
                    .as_str()
                    .is_some_and(|t| t.contains(&format!("Answering {asked}; read")))
            })
        },
    )
    .await;
    answer["text"].as_str().unwrap_or_default().to_owned()
}

/// The person looks at `channel` from the pane, and threadline recorded it.
async fn look_at(s: &Stack, dm: &str, thread: &str, channel: &str) {
    sim_ctl(
        &s.sim,
        "act/assistant_context",
        json!({"channel": dm, "thread_ts": thread, "context_channel": channel}),
    )
    .await;
    eventually(
        "the new context recorded",
        Duration::from_secs(30),
        || async {
            let c =
                threadline_store::testing::assistant::context_channel(&s.db.pool, dm, thread).await;
            (c.flatten().as_deref() == Some(channel)).then_some(())
        },
    )
    .await;
}

/// The channels slack-sim was asked the history of, in order.
async fn history_reads(s: &Stack) -> Vec<String> {
    let reads = sim_get(&s.sim, "calls?method=conversations.history").await;
    reads["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["channel"].as_str().map(str::to_owned))
        .collect()
}

fn statuses(p: &Value) -> Vec<Value> {
    p["statuses"].as_array().cloned().unwrap_or_default()
}

/// Opened, the pane gets its prompts and a title; a question there shows
/// "is thinking…" while the model runs, and is answered once, labelled,
/// which ends the progress; the context channel is kept (as ids).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pane_is_greeted_shows_progress_while_the_model_runs_and_is_answered_once() {
    let s = pane_stack(true).await;
    let (dm, thread) = open_pane(&s).await;
    let greeted = eventually("prompts and a title", Duration::from_secs(30), || async {
        let p = pane(&s, &dm).await;
        (p["suggested_prompts"].is_array() && p["title"].is_string()).then_some(p)
    })
    .await;
    assert_eq!(
        greeted["suggested_prompts"].as_array().map(Vec::len),
        Some(3)
    );
    assert!(
        greeted["title"]
            .as_str()
            .unwrap()
            .starts_with("threadline · ")
    );
    let context =
        threadline_store::testing::assistant::context_channel(&s.db.pool, &dm, &thread).await;
    assert_eq!(
        context.expect("recorded").as_deref(),
        Some(s.channel.as_str())
    );

    s.post_as(&s.user, &dm, "why did the deploy fail?", Some(&thread))
        .await;
    let shown = eventually(
        "progress while the model runs",
        Duration::from_secs(30),
        || async {
            let p = pane(&s, &dm).await;
            p["showing"]
                .as_array()
                .and_then(|a| a.first())
                .filter(|x| x["status"] == "is thinking…")
                .cloned()
        },
    )
    .await;
    assert_eq!(shown["app_id"], json!(s.app));
    let answers = eventually(
        "one answer in the pane",
        Duration::from_secs(30),
        || async {
            let a = replies(&s, &dm, &thread).await;
            (!a.is_empty()).then_some(a)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let answers_now = replies(&s, &dm, &thread).await;
    assert_eq!(answers_now.len(), 1, "{answers:?}");
    assert!(
        answers_now[0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("why did the deploy fail?")
                && t.ends_with("_AI-generated — verify before relying on it_")),
        "{answers_now:?}"
    );
    let p = pane(&s, &dm).await;
    assert_eq!(p["showing"], json!([]), "the progress ended: {p}");
    // The thread is named after its first question.
    assert_eq!(p["title"], json!("why did the deploy fail?"), "{p}");
    // Each stage replaced the one before; the last ended with the answer.
    let all = statuses(&p);
    let (last, before) = all.split_last().expect("a status was shown");
    assert!(before.iter().all(|x| x["ended"] == "replaced"), "{p}");
    assert!(
        last["ended"] == "replied" || last["ended"] == "cleared",
        "{p}"
    );
    s.stop().await;
}

/// With streaming off, the pane's status shows the stages a question goes
/// through, in the thinking steps' words, as they happen: the thread being
/// read (its context built; the read of the channel the person looks at
/// is slowed here so that it takes a while), the answer being written (the
/// model's call), the thread being checked before the post; the answer
/// ends it. slack-sim records every status set, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_panes_status_shows_each_stage_of_the_answer_as_it_happens() {
    let mut s = pane_stack(true).await;
    s.unjudged = Some("the pane's thread is a DM the oracle does not read");
    let (dm, thread) = open_pane(&s).await;
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "conversations.history", "mode": "latency", "latency_ms": 1500}),
    )
    .await;
    let text = ask(&s, &dm, &thread, "why did the deploy fail?").await;
    assert!(text.contains("why did the deploy fail?"), "{text}");
    // Past the publisher's and the sweeper's next looks.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let p = pane(&s, &dm).await;
    let shown: Vec<(Value, Value)> = statuses(&p)
        .iter()
        .map(|x| (x["status"].clone(), x["loading_messages"].clone()))
        .collect();
    assert_eq!(
        shown,
        [
            "Reading the thread",
            "Writing the answer",
            "Checking the thread before the answer is whole"
        ]
        .map(|stage| (json!("is thinking…"), json!([stage]))),
        "{p}"
    );
    assert_eq!(p["showing"], json!([]), "the answer ended it: {p}");
    assert_eq!(
        statuses(&p).last().map(|x| x["ended"].clone()),
        Some(json!("replied")),
        "{p}"
    );
    s.stop().await;
}

/// A second question while the first is being answered supersedes it: the
/// first's progress gives way to the second's, exactly one answer comes,
/// and nothing is left showing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_overtaken_in_the_pane_posts_nothing_and_leaves_no_progress() {
    let mut s = pane_stack(true).await;
    s.unjudged = Some("the pane's thread is a DM the oracle does not read");
    let (dm, thread) = open_pane(&s).await;
    eventually("greeted", Duration::from_secs(30), || async {
        pane(&s, &dm).await["title"].is_string().then_some(())
    })
    .await;
    s.post_as(&s.user, &dm, "is the queue healthy?", Some(&thread))
        .await;
    eventually(
        "progress while the model runs",
        Duration::from_secs(30),
        || async { (!pane(&s, &dm).await["showing"].as_array()?.is_empty()).then_some(()) },
    )
    .await;
    let second = s
        .post_as(&s.user, &dm, "actually, is the consumer up?", Some(&thread))
        .await;
    let answers = eventually("an answer in the pane", Duration::from_secs(40), || async {
        let a = replies(&s, &dm, &thread).await;
        (!a.is_empty()).then_some(a)
    })
    .await;
    let settled = eventually("nothing left showing", Duration::from_secs(30), || async {
        let p = pane(&s, &dm).await;
        (p["showing"] == json!([])).then_some(p)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let answers_now = replies(&s, &dm, &thread).await;
    assert_eq!(answers_now.len(), 1, "{answers:?}");
    assert!(
        answers_now[0]["text"]
            .as_str()
            .is_some_and(|t| t.contains(&format!("Answering {second}"))),
        "the answer is to the second question: {answers_now:?}"
    );
    assert_eq!(pane(&s, &dm).await["showing"], json!([]), "{settled}");
    assert_eq!(
        settled["title"],
        json!("is the queue healthy?"),
        "named after the first question, once"
    );
    s.stop().await;
}

/// With DMs denied, the pane is not served: no greeting, no progress, no
/// answer, and the events are recorded as ignored for that reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pane_stays_under_the_dm_policy() {
    let mut s = pane_stack(false).await;
    s.unjudged = Some("the pane's thread is a DM the oracle does not read");
    let (dm, thread) = open_pane(&s).await;
    s.post_as(&s.user, &dm, "why did the deploy fail?", Some(&thread))
        .await;
    eventually("both events ignored", Duration::from_secs(30), || async {
        let n =
            threadline_store::testing::receipts::count_with_reason(&s.db.pool, "dm_not_allowed")
                .await
                .ok()?;
        (n >= 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let p = pane(&s, &dm).await;
    assert!(
        p["suggested_prompts"].is_null() && p["title"].is_null(),
        "{p}"
    );
    assert_eq!(statuses(&p), Vec::<Value>::new(), "{p}");
    assert!(replies(&s, &dm, &thread).await.is_empty());
    for method in [
        "assistant.threads.setSuggestedPrompts",
        "assistant.threads.setStatus",
    ] {
        let calls = sim_get(&s.sim, &format!("calls?method={method}")).await;
        assert_eq!(calls["calls"], json!([]), "{method}");
    }
    s.stop().await;
}

/// A kill switch engaged while the model runs: the answer is suppressed
/// before posting, and the progress it showed is cleared (not left to
/// Slack's two-minute timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suppressed_answer_clears_the_progress_it_showed() {
    let mut s = pane_stack(true).await;
    s.unjudged = Some("the pane's thread is a DM the oracle does not read");
    let (dm, thread) = open_pane(&s).await;
    s.post_as(&s.user, &dm, "restart the consumer?", Some(&thread))
        .await;
    eventually(
        "progress while the model runs",
        Duration::from_secs(30),
        || async { (!pane(&s, &dm).await["showing"].as_array()?.is_empty()).then_some(()) },
    )
    .await;
    let env = [
        ("DATABASE_URL", s.db.url.clone()),
        ("NATS_URL", threadline_testkit::nats_url()),
        ("THREADLINE_BUS_PREFIX", s.prefix.clone()),
    ];
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
    let p = eventually("the progress cleared", Duration::from_secs(30), || async {
        let p = pane(&s, &dm).await;
        statuses(&p)
            .iter()
            .any(|x| x["ended"] == "cleared")
            .then_some(p)
    })
    .await;
    assert_eq!(p["showing"], json!([]), "{p}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(replies(&s, &dm, &thread).await.is_empty(), "suppressed");
    s.stop().await;
}

/// The service answering a pane question freezes mid-call (SIGSTOP) past
/// its lease, so no outcome will come for the progress it showed: the
/// publisher's sweeper clears it (`cleared`, well before Slack's own
/// two-minute limit). Once the service carries on, the question is
/// answered once and nothing is left showing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_that_no_answer_is_behind_is_cleared_by_the_sweeper() {
    // A 3 s model call within a 4 s timeout: the decision's lease is 18 s.
    let mut s = pane_stack_with(
        true,
        &[
            ("THREADLINE_BUILTIN_LATENCY_MS", "3000".to_owned()),
            ("THREADLINE_MODEL_TIMEOUT_MS", "4000".to_owned()),
            ("THREADLINE_SWEEP_MS", "1000".to_owned()),
        ],
    )
    .await;
    s.unjudged = Some("the pane's thread is a DM the oracle does not read");
    let (dm, thread) = open_pane(&s).await;
    s.post_as(&s.user, &dm, "is the consumer lagging?", Some(&thread))
        .await;
    eventually(
        "progress while the model runs",
        Duration::from_secs(30),
        || async {
            let p = pane(&s, &dm).await;
            let showing = p["showing"].as_array()?.first()?.clone();
            (showing["loading_messages"] == json!(["Writing the answer"])).then_some(())
        },
    )
    .await;
    let inference = &s.services[2];
    inference.pause();
    let p = eventually(
        "the orphaned progress cleared",
        Duration::from_secs(60),
        || async {
            let p = pane(&s, &dm).await;
            (p["showing"] == json!([])).then_some(p)
        },
    )
    .await;
    let ended: Vec<Value> = statuses(&p).iter().map(|x| x["ended"].clone()).collect();
    assert_eq!(
        ended,
        [json!("replaced"), json!("cleared")],
        "the thread read, then the answer written, cleared by threadline: {p}"
    );
    assert!(replies(&s, &dm, &thread).await.is_empty(), "{p}");
    assert_eq!(
        threadline_store::testing::assistant::status_decision(&s.db.pool, &dm, &thread)
            .await
            .expect("row"),
        None
    );
    inference.resume();
    let answers = eventually(
        "one answer in the pane",
        Duration::from_secs(60),
        || async {
            let a = replies(&s, &dm, &thread).await;
            (!a.is_empty()).then_some(a)
        },
    )
    .await;
    let settled = eventually("nothing left showing", Duration::from_secs(30), || async {
        let p = pane(&s, &dm).await;
        (p["showing"] == json!([])).then_some(p)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(replies(&s, &dm, &thread).await.len(), 1, "{answers:?}");
    assert!(
        statuses(&settled).iter().all(|x| x["ended"] == "replied"
            || x["ended"] == "cleared"
            || x["ended"] == "replaced"),
        "{settled}"
    );
    s.stop().await;
}

/// A streamed answer in the pane: the progress shows while the model
/// starts, the stream (which ends the status in Slack) carries the answer,
/// and nothing is left showing afterwards, whichever of the progress and
/// the stream's start reached Slack first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_in_the_pane_leaves_no_progress() {
    let mut s = pane_stack_with(
        true,
        &[
            ("THREADLINE_STREAMING", "true".to_owned()),
            ("THREADLINE_BUILTIN_LATENCY_MS", "300".to_owned()),
            ("THREADLINE_BUILTIN_STREAM_PACE_MS", "40".to_owned()),
        ],
    )
    .await;
    s.unjudged = Some("the pane's thread is a DM the oracle does not read");
    let (dm, thread) = open_pane(&s).await;
    for question in ["is the queue draining?", "and the consumer?"] {
        let text = ask(&s, &dm, &thread, question).await;
        assert!(text.contains(question), "{text}");
    }
    // Past the publisher's and the sweeper's next looks.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let p = pane(&s, &dm).await;
    assert_eq!(p["showing"], json!([]), "nothing left showing: {p}");
    let streams = sim_get(&s.sim, "calls?method=chat.startStream").await;
    assert_eq!(
        streams["calls"].as_array().map(Vec::len),
        Some(2),
        "both answers were streamed: {streams}"
    );
    assert_eq!(replies(&s, &dm, &thread).await.len(), 2);
    s.stop().await;
}

/// A streamed answer in the pane that names a link of the channel the
/// person looks at shows it as its writing step's source (the question
/// itself links nothing); the oracle, reading that channel as Slack shows
/// it, finds the source true.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_of_the_viewed_channel_is_a_source_of_the_panes_streamed_answer() {
    let model = threadline_tests::streaming_model(
        &[
            "The failing run is ",
            "https://ci.example.com/runs/77, ",
            "by the channel you look at.",
        ],
        Duration::from_millis(300),
    )
    .await;
    let mut s = pane_stack_with(
        true,
        &[
            ("THREADLINE_STREAMING", "true".to_owned()),
            ("THREADLINE_MODEL_PROVIDER", "openai".to_owned()),
            ("THREADLINE_MODEL_BASE_URL", model),
            ("THREADLINE_MODEL_NAME", "m".to_owned()),
        ],
    )
    .await;
    s.unjudged = Some("the test's model does not state what it read");
    s.post("deploy run <https://ci.example.com/runs/77> failed", None)
        .await;
    let (dm, thread) = open_pane(&s).await;
    s.judge_also_as(
        &dm,
        &s.bot_user,
        threadline_tests::oracle::ScopeKind::Direct,
    );
    s.post_as(&s.user, &dm, "which run failed?", Some(&thread))
        .await;
    let a = eventually("the streamed answer", Duration::from_secs(30), || async {
        replies(&s, &dm, &thread)
            .await
            .into_iter()
            .find(|m| m["streaming_state"] == "completed")
    })
    .await;
    let write = a["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b["task_id"] == "threadline_write")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        write["sources"],
        json!([{"type": "url", "url": "https://ci.example.com/runs/77",
                "text": "ci.example.com/runs/77"}]),
        "{a}"
    );
    let (_, violations) = s.verdict_by_kind(threadline_tests::ORACLE_GRACE).await;
    let untrue: Vec<_> = violations
        .iter()
        .filter(|(kind, _)| *kind == "source_untrue")
        .collect();
    assert!(untrue.is_empty(), "{untrue:?}");
    s.stop().await;
}

/// The channel the person is looking at is read with their question where
/// the channel policy would answer (a public channel), and not once they
/// look at a private channel the policy denies: Slack is never asked for
/// its messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_channel_the_person_looks_at_is_read_only_where_the_policy_would_answer() {
    let mut s = pane_stack(true).await;
    s.unjudged = Some("the pane's thread is a DM the oracle does not read");
    let said = s
        .post("the queue is at 9000 messages and rising", None)
        .await;
    let secret = sim_ctl(
        &s.sim,
        "channels",
        json!({"team_id": s.team, "name": "secret", "kind": "private", "members": [s.user, s.bot_user]}),
    )
    .await["id"]
        .as_str()
        .expect("channel")
        .to_owned();
    let hidden = s
        .post_as(&s.user, &secret, "the password is in the vault", None)
        .await;
    let (dm, thread) = open_pane(&s).await;
    let text = ask(&s, &dm, &thread, "what is going on here?").await;
    assert!(
        text.contains(&format!("of channel {}", s.channel)) && text.contains(&format!("{said}/")),
        "the public channel was read with the question: {text}"
    );

    // A channel of another workspace (where the app is installed too):
    // this installation's token reads nothing there, so Slack is not even
    // asked about it.
    let elsewhere = s.add_workspace("partner-co").await;
    s.post_as(
        &elsewhere.user,
        &elsewhere.channel,
        "their rollout is paused",
        None,
    )
    .await;
    look_at(&s, &dm, &thread, &elsewhere.channel).await;
    let text = ask(&s, &dm, &thread, "and over there?").await;
    assert!(!text.contains("of channel"), "{text}");
    let infos = sim_get(&s.sim, "calls?method=conversations.info").await;
    assert!(
        !infos["calls"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["channel"] == json!(elsewhere.channel)),
        "{infos}"
    );
    // The person looks at the private channel: not read.
    look_at(&s, &dm, &thread, &secret).await;
    let text = ask(&s, &dm, &thread, "and now?").await;
    assert!(
        !text.contains("of channel"),
        "nothing of a denied channel: {text}"
    );
    assert!(!text.contains(&hidden));
    // A Slack Connect channel (public, shared with another organisation),
    // where the policy does not allow shared channels: not read either.
    let connect = sim_ctl(
        &s.sim,
        "channels",
        json!({"team_id": s.team, "name": "partners", "kind": "public", "is_ext_shared": true,
               "members": [s.user, s.bot_user]}),
    )
    .await["id"]
        .as_str()
        .expect("channel")
        .to_owned();
    // Back to the public channel, but the installation now answers only in
    // allow-listed channels: the policy as it is now decides, so not read.
    let env = [("DATABASE_URL", s.db.url.clone())];
    let inst = first_installation(&s).await;
    let only = cli(
        &[
            "policy",
            "set",
            "--installation",
            &inst,
            "--allowlist-only",
            "on",
        ],
        &env,
    )
    .await;
    assert!(only.status.success());
    for (channel, question) in [
        (&connect, "and in partners?"),
        (&s.channel, "and in ops now?"),
    ] {
        look_at(&s, &dm, &thread, channel).await;
        let text = ask(&s, &dm, &thread, question).await;
        assert!(!text.contains("of channel"), "{channel} not read: {text}");
    }
    assert_eq!(
        history_reads(&s).await,
        [s.channel.as_str()],
        "only the first question read a channel"
    );
    s.stop().await;
}

/// The viewed channel's reads draw from the installation's shared read
/// budget: with one `conversations.history` a minute, a second question
/// within the minute is answered without the channel (and says nothing of
/// it), and Slack is asked once. (The channel is allow-listed, so no
/// `conversations.info` is asked: the history read alone meets the
/// budget.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewed_channel_is_read_within_the_shared_read_budget() {
    let mut s = pane_stack_with(
        true,
        &[
            ("THREADLINE_BUILTIN_LATENCY_MS", "200".to_owned()),
            ("THREADLINE_BACKFILL_PER_MINUTE", "1".to_owned()),
        ],
    )
    .await;
    s.unjudged = Some("the pane's thread is a DM the oracle does not read");
    let inst = first_installation(&s).await;
    let allowed = cli(
        &[
            "policy",
            "channel",
            "--installation",
            &inst,
            "--channel",
            &s.channel,
            "--allow",
            "on",
        ],
        &[("DATABASE_URL", s.db.url.clone())],
    )
    .await;
    assert!(
        allowed.status.success(),
        "{}",
        String::from_utf8_lossy(&allowed.stderr)
    );
    let said = s.post("the consumer restarted twice", None).await;
    let (dm, thread) = open_pane(&s).await;
    let text = ask(&s, &dm, &thread, "what happened?").await;
    assert!(
        text.contains(&format!("of channel {}", s.channel)) && text.contains(&format!("{said}/")),
        "{text}"
    );
    let text = ask(&s, &dm, &thread, "and since?").await;
    assert!(!text.contains("of channel"), "the budget is spent: {text}");
    assert_eq!(history_reads(&s).await, [s.channel.as_str()]);
    let infos = sim_get(&s.sim, "calls?method=conversations.info").await;
    assert!(
        !infos["calls"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["channel"] == json!(s.channel)),
        "an allow-listed channel needs no lookup: {infos}"
    );
    s.stop().await;
}
