//! Slack's agent messaging experience (`features.agent_view`), judged from
//! Slack's side: a person opens the app's Messages tab (their DM with the
//! app, `app_home_opened` with `tab: "messages"`) and threadline sets the
//! suggested prompts at its top, once; each question in the DM is a thread
//! of its own, answered once in it, with progress while the model runs;
//! what the person looks at (`app_context_changed`) is the viewed context,
//! read only where the channel policy would answer and never for canvases,
//! lists or a channel the policy denies. slack-sim's tabs, statuses, calls
//! and threads say what happened.

use std::time::Duration;

use serde_json::{Value, json};
use threadline_testkit::eventually;
use threadline_tests::oracle::ScopeKind;
use threadline_tests::{Stack, cli, first_installation, sim_ctl, sim_get};

const EVENTS: &[&str] = &[
    "app_mention",
    "message.channels",
    "message.im",
    "app_home_opened",
    "app_context_changed",
];
// (with the private channels' scopes: a private channel the policy denies
// is refused by the policy, not by a scope Slack would refuse)
const SCOPES: &[&str] = &[
    "chat:write",
    "channels:history",
    "channels:read",
    "groups:history",
    "groups:read",
    "im:history",
    "assistant:write",
];

/// A stack whose app has the agent messaging experience, with DMs allowed
/// or not.
async fn agent_stack(dms: bool) -> Stack {
    let s = Stack::start_with_app(
        &[("THREADLINE_BUILTIN_LATENCY_MS", "1500".to_owned())],
        EVENTS,
        SCOPES,
    )
    .await;
    let set = sim_ctl(
        &s.sim,
        &format!("apps/{}/experience", s.app),
        json!({"experience": "agent_view"}),
    )
    .await;
    assert_eq!(set["experience"], "agent_view", "{set}");
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

/// Opens the Messages tab as the stack's person, looking at `entities`:
/// the DM.
async fn open_tab(s: &Stack, entities: Value) -> String {
    let opened = sim_ctl(
        &s.sim,
        "act/agent_open",
        json!({"user": s.user, "app_id": s.app, "entities": entities}),
    )
    .await;
    let dm = opened["channel"].as_str().expect("channel").to_owned();
    // (the oracle judges the DM too: every message there is a question,
    // each answered once in its own thread)
    s.judge_also_as(&dm, &s.bot_user, ScopeKind::Direct);
    dm
}

/// The tab as Slack shows it.
async fn tab(s: &Stack, dm: &str) -> Value {
    sim_get(&s.sim, &format!("agent_tabs?channel={dm}")).await["tabs"][0].clone()
}

/// The person looks at `entities`, and threadline recorded the channel it
/// takes from them (`None`: none).
async fn look_at(s: &Stack, dm: &str, entities: Value, viewed: Option<&str>) {
    sim_ctl(
        &s.sim,
        "act/agent_context",
        json!({"user": s.user, "app_id": s.app, "entities": entities}),
    )
    .await;
    eventually(
        "the new context recorded",
        Duration::from_secs(30),
        || async {
            let c = threadline_store::testing::agent_view::context_channel(&s.db.pool, dm).await;
            (c == Some(viewed.map(str::to_owned))).then_some(())
        },
    )
    .await;
}

/// The answer to the DM question `asked` in its thread, waited for.
async fn answer_in_its_thread(s: &Stack, dm: &str, asked: &str) -> Value {
    eventually(
        &format!("the answer to {asked} in its thread"),
        Duration::from_secs(30),
        || async {
            s.answers_in(dm, asked).await.into_iter().find(|a| {
                a["text"]
                    .as_str()
                    .is_some_and(|t| t.contains(&format!("Answering {asked}; read")))
            })
        },
    )
    .await
}

/// Asks `question` at the top level of the DM: its `ts` and the answer,
/// which must be in the question's own thread.
async fn ask(s: &Stack, dm: &str, question: &str) -> (String, String) {
    let asked = s.post_as(&s.user, dm, question, None).await;
    let answer = answer_in_its_thread(s, dm, &asked).await;
    assert_eq!(answer["thread_ts"], json!(asked), "answered in its thread");
    (
        asked,
        answer["text"].as_str().unwrap_or_default().to_owned(),
    )
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

fn channel_entity(c: &str) -> Value {
    json!({"type": "slack#/types/channel_id", "value": c})
}

/// Opened, the Messages tab gets its suggested prompts (once, however often
/// it is opened); a question at the top of the DM shows progress in its own
/// thread while the model runs and is answered once there, labelled, with
/// the channel the person looks at read as background; a second question
/// is a thread of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_messages_tab_is_greeted_and_each_dm_question_is_answered_in_its_own_thread() {
    let s = agent_stack(true).await;
    let said = s.post("the nightly build is red again", None).await;
    let dm = open_tab(&s, json!([channel_entity(&s.channel)])).await;
    let greeted = eventually(
        "prompts at the top of the tab",
        Duration::from_secs(30),
        || async {
            let t = tab(&s, &dm).await;
            t["suggested_prompts"].is_array().then_some(t)
        },
    )
    .await;
    assert_eq!(
        greeted["suggested_prompts"].as_array().map(Vec::len),
        Some(3)
    );
    assert!(greeted["prompts_title"].is_string(), "{greeted}");
    // Opened again: greeted once.
    open_tab(&s, json!([channel_entity(&s.channel)])).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let prompts = sim_get(&s.sim, "calls?method=assistant.threads.setSuggestedPrompts").await;
    assert_eq!(
        prompts["calls"].as_array().map(Vec::len),
        Some(1),
        "{prompts}"
    );
    assert_eq!(tab(&s, &dm).await["opened"], 2);

    // (the read of the viewed channel takes a while: its stage shows)
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "conversations.history", "mode": "latency", "latency_ms": 1500}),
    )
    .await;
    let asked = s.post_as(&s.user, &dm, "why is the build red?", None).await;
    let shown = eventually(
        "progress in the question's thread",
        Duration::from_secs(30),
        || async {
            let t = sim_get(&s.sim, &format!("assistant_threads?channel={dm}")).await;
            t["threads"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|t| t["thread_ts"] == json!(asked))
                .and_then(|t| t["showing"].as_array()?.first().cloned())
                .filter(|x| x["status"] == "is thinking…")
        },
    )
    .await;
    assert_eq!(shown["app_id"], json!(s.app));
    let answers = eventually(
        "the answer in its thread",
        Duration::from_secs(30),
        || async {
            let a = s.answers_in(&dm, &asked).await;
            (!a.is_empty()).then_some(a)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let now = s.answers_in(&dm, &asked).await;
    assert_eq!(now.len(), 1, "{answers:?}");
    let text = now[0]["text"].as_str().unwrap_or_default();
    assert_eq!(now[0]["thread_ts"], json!(asked));
    assert!(
        text.ends_with("_AI-generated — verify before relying on it_"),
        "{text}"
    );
    assert!(
        text.contains(&format!("of channel {}", s.channel)) && text.contains(&format!("{said}/")),
        "the channel the person looks at was read: {text}"
    );
    let threads = sim_get(&s.sim, &format!("assistant_threads?channel={dm}")).await;
    let q = threads["threads"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["thread_ts"] == json!(asked))
        .cloned()
        .expect("the question's thread");
    assert_eq!(q["showing"], json!([]), "the answer ended the progress");
    // With streaming off, the status showed each stage as it happened, in
    // the thinking steps' words.
    let stages: Vec<Value> = q["statuses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| x["loading_messages"].clone())
        .collect();
    assert_eq!(
        stages,
        [
            json!(["Reading the thread"]),
            json!(["Writing the answer"]),
            json!(["Checking the thread before the answer is whole"])
        ],
        "{q}"
    );

    // A second question at the top of the DM: a thread of its own.
    let (second, _) = ask(&s, &dm, "and what changed since yesterday?").await;
    assert_ne!(second, asked);
    assert_eq!(s.answers_in(&dm, &asked).await.len(), 1);
    let top: Vec<Value> = sim_get(&s.sim, &format!("channels/{dm}/messages")).await["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| {
            m["app_id"].is_string() && (m["thread_ts"].is_null() || m["thread_ts"] == m["ts"])
        })
        .collect();
    assert!(
        top.is_empty(),
        "nothing of the app at the top of the DM: {top:?}"
    );
    s.stop().await;
}

/// What the person looks at is the viewed context under the pane's rules:
/// a private channel the policy denies is never read (behind a canvas,
/// first of the entities), a message's channel is (behind a list), and an
/// empty context reads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewed_context_follows_app_context_changed_under_the_channel_policy() {
    let s = agent_stack(true).await;
    let said = s.post("the queue is at 9000 messages", None).await;
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
    let dm = open_tab(&s, json!([])).await;
    look_at(
        &s,
        &dm,
        json!([{"type": "slack#/types/canvas_id", "value": "F0CANVAS01"}, channel_entity(&secret)]),
        Some(&secret),
    )
    .await;
    let (_, text) = ask(&s, &dm, "what is in here?").await;
    assert!(!text.contains("of channel"), "a denied channel: {text}");
    assert!(!text.contains(&hidden));

    look_at(
        &s,
        &dm,
        json!([{"type": "slack#/types/list_id", "value": "F0LIST0001"},
               {"type": "slack#/types/message_context",
                "value": {"message_ts": said, "channel_id": s.channel}}]),
        Some(&s.channel),
    )
    .await;
    let (_, text) = ask(&s, &dm, "and this one?").await;
    assert!(
        text.contains(&format!("of channel {}", s.channel)) && text.contains(&format!("{said}/")),
        "the message's channel was read: {text}"
    );

    look_at(&s, &dm, json!([]), None).await;
    let (_, text) = ask(&s, &dm, "and now?").await;
    assert!(!text.contains("of channel"), "nothing viewed: {text}");
    assert_eq!(
        history_reads(&s).await,
        [s.channel.as_str()],
        "only the public channel was read, once"
    );

    // A change that names no DM (as Slack's event reference shows the
    // event) is the person's recorded tab's.
    sim_ctl(
        &s.sim,
        "act/agent_context",
        json!({"user": s.user, "app_id": s.app, "channel": s.channel, "without_channel": true}),
    )
    .await;
    eventually(
        "the change without its DM recorded on the person's tab",
        Duration::from_secs(30),
        || async {
            let c = threadline_store::testing::agent_view::context_channel(&s.db.pool, &dm).await;
            (c == Some(Some(s.channel.clone()))).then_some(())
        },
    )
    .await;
    s.stop().await;
}

/// With DMs denied, the tab is not greeted, what the person looks at is not
/// recorded, and a question there is not answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_messages_tab_stays_under_the_dm_policy() {
    let s = agent_stack(false).await;
    let dm = open_tab(&s, json!([channel_entity(&s.channel)])).await;
    sim_ctl(
        &s.sim,
        "act/agent_context",
        json!({"user": s.user, "app_id": s.app, "channel": s.channel}),
    )
    .await;
    let asked = s.post_as(&s.user, &dm, "are you there?", None).await;
    eventually(
        "the three events ignored",
        Duration::from_secs(30),
        || async {
            let n = threadline_store::testing::receipts::count_with_reason(
                &s.db.pool,
                "dm_not_allowed",
            )
            .await
            .ok()?;
            (n >= 3).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(tab(&s, &dm).await["suggested_prompts"].is_null());
    assert!(s.answers_in(&dm, &asked).await.is_empty());
    assert_eq!(
        threadline_store::testing::agent_view::context_channel(&s.db.pool, &dm).await,
        None,
        "nothing recorded"
    );
    s.stop().await;
}

/// Slack may deliver a person's context changes out of order (a retry,
/// two gateways, two context-builders): an older change never overwrites
/// a newer one; a newer one always does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_context_change_never_overwrites_a_newer_one() {
    use threadline_store::agent_view::{Tab, record};
    let db = threadline_testkit::TestDb::new().await;
    let inst = threadline_testkit::slack::seed_installation(&db.pool, "A0AGENT", "T0AGENT").await;
    let change = |channel: &'static str, at: &'static str| Tab {
        installation: inst,
        channel: "D0TAB00001",
        user: "U0PERSON01",
        context: Some((Some(channel), None)),
        at: Some(at),
    };
    let viewed = || async {
        threadline_store::testing::agent_view::context_channel(&db.pool, "D0TAB00001").await
    };
    for (i, (channel, at, want)) in [
        ("C0SECOND01", "1700000000.000200", "C0SECOND01"),
        // (delivered late: older than what is recorded)
        ("C0FIRST001", "1700000000.000100", "C0SECOND01"),
        ("C0THIRD001", "1700000001.000000", "C0THIRD001"),
    ]
    .into_iter()
    .enumerate()
    {
        record(
            &db.pool,
            &change(channel, at),
            uuid::Uuid::now_v7(),
            &format!("Ev{i}"),
            false,
        )
        .await
        .expect("recorded");
        assert_eq!(
            viewed().await,
            Some(Some(want.to_owned())),
            "after {channel} at {at}"
        );
    }
}

/// The person's context changes to `entities` (Slack naming the DM, or
/// not) and they ask at once, while recording the change is held up (the
/// tab's row locked): the question waits for it. The answer's text.
async fn ask_during_change(s: &Stack, dm: &str, entities: Value, named: bool) -> String {
    let held = threadline_store::testing::agent_view::hold_tab(&s.db.pool, dm)
        .await
        .expect("the tab's row locked");
    let before = context_changes_acknowledged(s).await;
    sim_ctl(
        &s.sim,
        "act/agent_context",
        json!({"user": s.user, "app_id": s.app, "entities": entities, "without_channel": !named}),
    )
    .await;
    eventually(
        "the change acknowledged to Slack",
        Duration::from_secs(30),
        || async { (context_changes_acknowledged(s).await > before).then_some(()) },
    )
    .await;
    let asked = s.post_as(&s.user, dm, "what is in here?", None).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        s.answers_in(dm, &asked).await.is_empty(),
        "the question waits for the tab's change"
    );
    held.rollback().await.expect("released");
    let answer = answer_in_its_thread(s, dm, &asked).await;
    answer["text"].as_str().unwrap_or_default().to_owned()
}

/// How many `app_context_changed` deliveries Slack saw acknowledged.
async fn context_changes_acknowledged(s: &Stack) -> usize {
    let d = sim_get(&s.sim, "deliveries").await;
    d["deliveries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["event_type"] == "app_context_changed" && x["status"] == 200)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_asked_while_the_tabs_change_is_being_handled_reads_what_the_person_looked_at() {
    let s = agent_stack(true).await;
    let said = s.post("the queue is at 9000 messages", None).await;
    let dm = open_tab(&s, json!([])).await;
    look_at(&s, &dm, json!([]), None).await;

    // The person looks at the channel and asks at once: the answer reads
    // the channel they looked at when they asked.
    let text = ask_during_change(&s, &dm, json!([channel_entity(&s.channel)]), true).await;
    assert!(
        text.contains(&format!("of channel {}", s.channel)) && text.contains(&format!("{said}/")),
        "the channel looked at was read: {text}"
    );
    // They look away, Slack's event naming no DM, and ask at once: the
    // answer reads no channel.
    let text = ask_during_change(&s, &dm, json!([]), false).await;
    assert!(!text.contains("of channel"), "nothing viewed: {text}");
    s.stop().await;
}
