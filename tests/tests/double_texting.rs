//! Double texting, judged from Slack's side: people send one question as
//! two or three quick messages. Under an installation's `latest` policy
//! (`threadline policy double-texting --action latest`) the latest message
//! of a person's burst is answered once they were quiet, its answer reading
//! the earlier ones (top-level messages, each a thread of its own, named by
//! the built-in model apart from the thread; replies, in the thread), and
//! the earlier ones get no answer of their own; under `each` (the default)
//! every message is answered. The oracle judges every answer: each question
//! answered once — by its own answer or read by exactly one later one of
//! the same person — never both.

use std::time::Duration;

use serde_json::{Value, json};
use threadline_testkit::eventually;
use threadline_tests::oracle::{ScopeKind, stated};
use threadline_tests::{Stack, cli, first_installation, quiesce, sim_ctl};

/// The quiet period the tests choose (short, so they run fast).
const QUIET_MS: u64 = 3000;

/// Sets the installation's double-texting policy through the CLI.
async fn policy(s: &Stack, inst: &str, args: &[&str]) -> String {
    let mut all = vec!["policy", "double-texting", "--installation", inst];
    all.extend_from_slice(args);
    let out = cli(&all, &[("DATABASE_URL", s.db.url.clone())]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until nothing is in flight in threadline (and a moment more).
async fn settled(s: &Stack) {
    let open = quiesce(
        &s.db.pool,
        Some((&s.js, &s.prefix)),
        Duration::from_secs(60),
        Duration::from_millis(QUIET_MS + 1500),
    )
    .await;
    assert!(open.is_none(), "work still in flight: {open:?}");
}

/// The answer in thread `root` of `channel` that states it answers
/// `question`, waited for.
async fn answer_to(s: &Stack, channel: &str, root: &str, question: &str) -> Value {
    eventually(
        &format!("the answer to {question}"),
        Duration::from_secs(40),
        || async {
            s.answers_in(channel, root).await.into_iter().find(|a| {
                a["text"]
                    .as_str()
                    .and_then(stated)
                    .is_some_and(|st| st.answering == question)
            })
        },
    )
    .await
}

/// What the answer read as earlier messages of the person's burst.
fn earlier_read(answer: &Value) -> Vec<String> {
    stated(answer["text"].as_str().unwrap_or_default())
        .map(|st| st.earlier.into_iter().map(|(ts, _)| ts).collect())
        .unwrap_or_default()
}

/// The receipts ended as absorbed by a later request of their burst.
async fn absorbed(s: &Stack) -> usize {
    threadline_store::testing::receipts::states_and_reasons(&s.db.pool)
        .await
        .expect("receipts")
        .into_iter()
        .filter(|(state, why)| state == "ignored" && why.as_deref() == Some("double_texted"))
        .count()
}

/// The oracle finds nothing wrong, and explains every question without an
/// answer of its own by a later answer that read it.
async fn judged_clean(s: &Stack, unanswered: usize) {
    let (j, violations) = s.verdict(Duration::from_millis(500)).await;
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(
        j.explained
            .get("answered_with_a_later_question")
            .copied()
            .unwrap_or(0),
        unanswered,
        "{j:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_latest_a_burst_is_answered_once_by_its_latest_message() {
    let s = Stack::start(&[("THREADLINE_BUILTIN_LATENCY_MS", "300".to_owned())]).await;
    let inst = first_installation(&s).await;
    let said = policy(&s, &inst, &["--action", "latest", "--quiet-ms", "3000"]).await;
    assert!(said.contains("quiet for 3000 ms"), "{said}");
    let bot = s.bot_user.clone();

    // 1. Three top-level questions in quick succession: each a thread of
    //    its own. The last is answered, in its own thread, reading the two
    //    before it; they get no answer of their own.
    let first = s.post(&format!("<@{bot}> hi"), None).await;
    let second = s
        .post(&format!("<@{bot}> why did the deploy fail?"), None)
        .await;
    let third = s.post(&format!("<@{bot}> the one in staging"), None).await;
    let answer = answer_to(&s, &s.channel, &third, &third).await;
    assert_eq!(earlier_read(&answer), vec![first.clone(), second.clone()]);
    settled(&s).await;
    assert!(s.answers(&first).await.is_empty(), "no answer to {first}");
    assert!(s.answers(&second).await.is_empty(), "no answer to {second}");
    assert_eq!(absorbed(&s).await, 2);

    // 2. A question after the person was quiet is a burst of its own: it
    //    is answered, reading nobody's earlier messages.
    tokio::time::sleep(Duration::from_millis(QUIET_MS + 500)).await;
    let alone = s.post(&format!("<@{bot}> and prod?"), None).await;
    let answer = answer_to(&s, &s.channel, &alone, &alone).await;
    assert!(earlier_read(&answer).is_empty(), "{answer:#?}");

    // 3. A question and a quick follow-up in its thread: one model call,
    //    one answer, to the follow-up, which read both.
    let root = s.post(&format!("<@{bot}> is the queue stuck?"), None).await;
    let follow = s
        .post(&format!("<@{bot}> the billing one"), Some(&root))
        .await;
    let answer = answer_to(&s, &s.channel, &root, &follow).await;
    let st = stated(answer["text"].as_str().unwrap_or_default()).expect("stated");
    assert!(st.read.iter().any(|(ts, _)| *ts == root), "{st:?}");
    settled(&s).await;
    assert_eq!(s.answers(&root).await.len(), 1, "one answer in the thread");

    // 4. Two top-level questions, then a quick follow-up in the second's
    //    thread: the follow-up's answer reads its thread and the first
    //    question too (the burst before its root).
    tokio::time::sleep(Duration::from_millis(QUIET_MS + 500)).await;
    let before = s.post(&format!("<@{bot}> one more thing"), None).await;
    let top = s.post(&format!("<@{bot}> the cache is cold"), None).await;
    let reply = s.post(&format!("<@{bot}> since noon"), Some(&top)).await;
    let answer = answer_to(&s, &s.channel, &top, &reply).await;
    assert_eq!(earlier_read(&answer), vec![before.clone()]);
    settled(&s).await;
    assert!(s.answers(&before).await.is_empty(), "no answer to {before}");
    assert_eq!(s.answers(&top).await.len(), 1, "one answer in the thread");

    // 5. A burst whose latest message is deleted before its answer: the
    //    request it absorbed is released and answered after all.
    policy(&s, &inst, &["--action", "latest", "--quiet-ms", "6000"]).await;
    tokio::time::sleep(Duration::from_millis(QUIET_MS + 500)).await;
    let kept = s.post(&format!("<@{bot}> is the VPN down?"), None).await;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let gone = s.post(&format!("<@{bot}> for everyone?"), None).await;
    eventually("the first absorbed", Duration::from_secs(20), || async {
        let by =
            threadline_store::testing::threads::absorbed_by(&s.db.pool, &s.channel, &kept).await;
        (by.as_deref() == Some(gone.as_str())).then_some(())
    })
    .await;
    sim_ctl(
        &s.sim,
        "act/delete",
        json!({"channel": s.channel, "ts": gone}),
    )
    .await;
    let answer = answer_to(&s, &s.channel, &kept, &kept).await;
    assert!(earlier_read(&answer).is_empty(), "{answer:#?}");
    settled(&s).await;
    assert!(
        s.answers(&gone).await.is_empty(),
        "no answer to the deleted {gone}"
    );
    judged_clean(&s, 5).await;

    // 6. A burst of three answered by its latest, then its middle message
    //    deleted: nothing is released (the answer read them), the first
    //    gets no second answer.
    let a = s.post(&format!("<@{bot}> the printer"), None).await;
    let b = s.post(&format!("<@{bot}> on floor two"), None).await;
    let c = s.post(&format!("<@{bot}> jams"), None).await;
    let answer = answer_to(&s, &s.channel, &c, &c).await;
    assert_eq!(earlier_read(&answer), vec![a.clone(), b.clone()]);
    sim_ctl(&s.sim, "act/delete", json!({"channel": s.channel, "ts": b})).await;
    settled(&s).await;
    assert!(s.answers(&a).await.is_empty(), "no second answer to {a}");
    judged_clean(&s, 6).await;
}

/// A stack whose installation answers the latest of a burst after 3 s of
/// quiet, and a second person in its channel.
async fn latest_with_another_person(env: &[(&str, String)]) -> (Stack, String) {
    let mut env = env.to_vec();
    env.push(("THREADLINE_BUILTIN_LATENCY_MS", "300".to_owned()));
    let s = Stack::start(&env).await;
    let inst = first_installation(&s).await;
    policy(&s, &inst, &["--action", "latest", "--quiet-ms", "3000"]).await;
    let other = sim_ctl(&s.sim, "users", json!({"team_id": s.team, "name": "noor"})).await["id"]
        .as_str()
        .expect("a user id")
        .to_owned();
    sim_ctl(
        &s.sim,
        &format!("channels/{}/members", s.channel),
        json!({"user_id": other}),
    )
    .await;
    (s, other)
}

/// Slack answers the next post 503 without applying it: its outcome is
/// unknown to the publisher, which reads the thread to settle it.
async fn refuse_the_next_post(s: &Stack) {
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "http_error", "status": 503, "applied": false}),
    )
    .await;
}

/// Waits until the first answer (`what`) is of unknown outcome: being
/// looked for in Slack.
async fn first_answer_of_unknown_outcome(s: &Stack, what: &str) {
    eventually(
        &format!("{what} of unknown outcome"),
        Duration::from_secs(30),
        || async {
            let (state, _) =
                threadline_store::testing::intents::first_state_and_error_code(&s.db.pool)
                    .await
                    .ok()?;
            ["unknown", "reconciling"]
                .contains(&state.as_str())
                .then_some(())
        },
    )
    .await;
}

/// `other` asks the bot in the thread `root` ("mine too"): the reply's ts.
async fn mine_too(s: &Stack, other: &str, root: &str) -> String {
    let bot = &s.bot_user;
    s.post_as(other, &s.channel, &format!("<@{bot}> mine too"), Some(root))
        .await
}

/// The answer to `reply` in the thread `second` read `first`; once all
/// settled, `first` has no answer of its own and the thread one answer.
async fn the_reply_alone_read_the_burst(s: &Stack, first: &str, second: &str, reply: &str) {
    let answer = answer_to(s, &s.channel, second, reply).await;
    assert_eq!(earlier_read(&answer), vec![first.to_owned()]);
    settled(s).await;
    assert!(s.answers(first).await.is_empty(), "no answer to {first}");
    assert_eq!(s.answers(second).await.len(), 1, "one answer in the thread");
}

/// A burst of two top-level questions, and at once `other` asks in the
/// second's thread: (first, second, the reply).
async fn burst_and_a_reply(s: &Stack, other: &str) -> (String, String, String) {
    let bot = &s.bot_user;
    let first = s.post(&format!("<@{bot}> the build"), None).await;
    let second = s.post(&format!("<@{bot}> is red again"), None).await;
    let reply = mine_too(s, other, &second).await;
    (first, second, reply)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_whose_answer_a_reply_of_its_thread_supersedes_is_read_by_that_reply() {
    let (s, other) = latest_with_another_person(&[]).await;
    let bot = s.bot_user.clone();

    // A burst of two top-level questions, and at once someone else asks
    // in the second's thread: the second's answer (which read the first)
    // is superseded by the answer to the reply, which answers the thread's
    // root too, so it reads the burst before the root.
    let (first, second, reply) = burst_and_a_reply(&s, &other).await;
    the_reply_alone_read_the_burst(&s, &first, &second, &reply).await;

    // Once an answer went out in the thread, a later question there does
    // not read the burst again: the first answer read it.
    let later = s.post(&format!("<@{bot}> still red"), Some(&second)).await;
    let answer = answer_to(&s, &s.channel, &second, &later).await;
    assert!(earlier_read(&answer).is_empty(), "{answer:#?}");
    settled(&s).await;
    judged_clean(&s, 2).await;

    // The burst's latest is deleted (a root with replies: Slack keeps a
    // tombstone): the first was read by the reply's answer, so it is not
    // released to be answered again.
    sim_ctl(
        &s.sim,
        "act/delete",
        json!({"channel": s.channel, "ts": second}),
    )
    .await;
    settled(&s).await;
    assert!(s.answers(&first).await.is_empty(), "no answer to {first}");
    judged_clean(&s, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_on_its_way_in_the_thread_keeps_a_later_reply_from_reading_the_burst_again() {
    let (s, other) = latest_with_another_person(&[]).await;
    let bot = s.bot_user.clone();
    // The first answer's post takes 5 s to show (Slack applies it then).
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "latency", "latency_ms": 5000}),
    )
    .await;
    let (first, second, reply) = burst_and_a_reply(&s, &other).await;
    // While the reply's answer (which read the burst) is on its way, a
    // later question in the thread is built: it does not read the burst.
    eventually(
        "the first answer on its way",
        Duration::from_secs(30),
        || async {
            let (state, _) =
                threadline_store::testing::intents::first_state_and_error_code(&s.db.pool)
                    .await
                    .ok()?;
            (state != "pending").then_some(())
        },
    )
    .await;
    let later = s
        .post_as(
            &other,
            &s.channel,
            &format!("<@{bot}> any news?"),
            Some(&second),
        )
        .await;
    let answer = answer_to(&s, &s.channel, &second, &reply).await;
    assert_eq!(earlier_read(&answer), vec![first.clone()]);
    let answer = answer_to(&s, &s.channel, &second, &later).await;
    assert!(earlier_read(&answer).is_empty(), "{answer:#?}");
    settled(&s).await;
    assert!(s.answers(&first).await.is_empty(), "no answer to {first}");
    judged_clean(&s, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_found_never_to_have_landed_leaves_the_burst_to_the_reply_built_meanwhile() {
    // (a post Slack shows no trace of is posted again, not held)
    let (s, other) =
        latest_with_another_person(&[("THREADLINE_RECONCILE_ALLOW_REPOST", "true".to_owned())])
            .await;
    let bot = s.bot_user.clone();
    // The burst's answer (which reads the first message) is refused with
    // a 503 Slack never applied: its outcome is unknown while the
    // publisher reads the thread.
    refuse_the_next_post(&s).await;
    let first = s.post(&format!("<@{bot}> the build"), None).await;
    let second = s.post(&format!("<@{bot}> is red again"), None).await;
    first_answer_of_unknown_outcome(&s, "the burst's answer").await;
    // Meanwhile someone asks in its thread. That answer supersedes the
    // burst's (found never to have landed), so it is the one that reads
    // the first message: its build waits until the post's fate is known.
    let reply = mine_too(&s, &other, &second).await;
    the_reply_alone_read_the_burst(&s, &first, &second, &reply).await;
    judged_clean(&s, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_whose_deleted_latest_had_a_reply_answer_on_its_way_is_released_when_that_answer_goes()
 {
    let (s, other) =
        latest_with_another_person(&[("THREADLINE_RECONCILE_ALLOW_REPOST", "true".to_owned())])
            .await;
    // The reply's answer (which reads the burst) is refused with a 503
    // Slack never applied: its outcome is unknown while the publisher
    // reads the thread.
    refuse_the_next_post(&s).await;
    let (first, second, reply) = burst_and_a_reply(&s, &other).await;
    first_answer_of_unknown_outcome(&s, "the reply's answer").await;
    // The burst's latest is deleted meanwhile: the answer on its way may
    // still show, so the first message waits. Found never to have landed,
    // that answer is discarded (its thread changed): the first message is
    // then answered on its own, and the reply without it.
    sim_ctl(
        &s.sim,
        "act/delete",
        json!({"channel": s.channel, "ts": second}),
    )
    .await;
    let alone = answer_to(&s, &s.channel, &first, &first).await;
    assert!(earlier_read(&alone).is_empty(), "{alone:#?}");
    let answer = answer_to(&s, &s.channel, &second, &reply).await;
    assert!(earlier_read(&answer).is_empty(), "{answer:#?}");
    settled(&s).await;
    assert_eq!(s.answers(&first).await.len(), 1, "one answer to {first}");
    judged_clean(&s, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_last_stop_is_in_flight_keeps_a_reply_from_reading_the_burst_again() {
    // (the model's words come at once: the stop follows the first appends)
    let (s, other) = latest_with_another_person(&threadline_tests::streaming(1, &[])).await;
    let bot = s.bot_user.clone();
    // The burst's answer streams; its last stop takes 8 s to reach Slack,
    // which then shows the whole answer (that read the first message).
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.stopStream", "mode": "latency", "latency_ms": 8000, "times": 1}),
    )
    .await;
    let first = s.post(&format!("<@{bot}> the build"), None).await;
    let second = s.post(&format!("<@{bot}> is red again"), None).await;
    eventually(
        "the burst's answer streaming",
        Duration::from_secs(30),
        || async {
            let (state, _) =
                threadline_store::testing::intents::first_state_and_error_code(&s.db.pool)
                    .await
                    .ok()?;
            (state == "streaming").then_some(())
        },
    )
    .await;
    // While the stop is in flight someone asks in the thread: the reply's
    // build (after its quiet period) waits for the stream, which showed
    // the whole answer, so the reply does not read the burst again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reply = mine_too(&s, &other, &second).await;
    let answer = answer_to(&s, &s.channel, &second, &reply).await;
    assert!(earlier_read(&answer).is_empty(), "{answer:#?}");
    settled(&s).await;
    let streamed = answer_to(&s, &s.channel, &second, &second).await;
    assert_eq!(streamed["streaming_state"], "completed", "{streamed:#?}");
    assert_eq!(earlier_read(&streamed), vec![first.clone()]);
    // (the oracle takes a stream as whole when Slack ended it: 8 s after
    // its stop arrived, before the reply was said, so the reply crossed it
    // within that grace)
    let (j, violations) = s.verdict(Duration::from_secs(9)).await;
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(
        j.explained
            .get("answered_with_a_later_question")
            .copied()
            .unwrap_or(0),
        1,
        "{j:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_latest_releases_nothing_that_a_finishing_stream_of_its_thread_read() {
    // (the model's words come at once: the stop follows the first appends)
    let (s, other) = latest_with_another_person(&threadline_tests::streaming(1, &[])).await;
    // The reply's answer streams (it reads the burst before its thread's
    // root); its last stop takes 8 s to reach Slack, which then shows the
    // whole answer.
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.stopStream", "mode": "latency", "latency_ms": 8000, "times": 1}),
    )
    .await;
    let (first, second, reply) = burst_and_a_reply(&s, &other).await;
    eventually(
        "the reply's answer streaming",
        Duration::from_secs(30),
        || async {
            let n = threadline_store::testing::intents::count_in_state(&s.db.pool, "streaming")
                .await
                .ok()?;
            (n >= 1).then_some(())
        },
    )
    .await;
    // While that stop is in flight the person deletes the burst's latest
    // message: the stream may yet show whole (it does, having read the
    // first message), so the first message is not released to be answered
    // a second time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    sim_ctl(
        &s.sim,
        "act/delete",
        json!({"channel": s.channel, "ts": second}),
    )
    .await;
    let answer = answer_to(&s, &s.channel, &second, &reply).await;
    assert_eq!(answer["streaming_state"], "completed", "{answer:#?}");
    assert_eq!(earlier_read(&answer), vec![first.clone()]);
    settled(&s).await;
    assert!(
        s.answers(&first).await.is_empty(),
        "no second answer to {first}"
    );
    // (the oracle takes a stream as whole when Slack ended it: 8 s after
    // its stop arrived)
    let (_, violations) = s.verdict(Duration::from_secs(9)).await;
    assert!(violations.is_empty(), "{violations:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_each_every_quick_message_is_answered() {
    let s = Stack::start(&[("THREADLINE_BUILTIN_LATENCY_MS", "300".to_owned())]).await;
    let inst = first_installation(&s).await;
    // (latest, then back to each: the choice is the installation's now)
    policy(&s, &inst, &["--action", "latest"]).await;
    let said = policy(&s, &inst, &["--action", "each"]).await;
    assert!(said.contains("each answered as it comes"), "{said}");
    let bot = s.bot_user.clone();
    let first = s.post(&format!("<@{bot}> hi"), None).await;
    let second = s.post(&format!("<@{bot}> why is it slow?"), None).await;
    for q in [&first, &second] {
        let answer = answer_to(&s, &s.channel, q, q).await;
        assert!(earlier_read(&answer).is_empty(), "{answer:#?}");
    }
    settled(&s).await;
    assert_eq!(absorbed(&s).await, 0);
    judged_clean(&s, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_in_an_agents_messages_tab_is_answered_once() {
    let s = Stack::start_with_app(
        &[("THREADLINE_BUILTIN_LATENCY_MS", "300".to_owned())],
        &[
            "app_mention",
            "message.channels",
            "message.im",
            "app_home_opened",
            "app_context_changed",
        ],
        &[
            "chat:write",
            "channels:history",
            "channels:read",
            "im:history",
            "assistant:write",
        ],
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
        &["policy", "set", "--installation", &inst, "--dms", "on"],
        &[("DATABASE_URL", s.db.url.clone())],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    policy(&s, &inst, &["--action", "latest", "--quiet-ms", "3000"]).await;
    let opened = sim_ctl(
        &s.sim,
        "act/agent_open",
        json!({"user": s.user, "app_id": s.app, "entities": []}),
    )
    .await;
    let dm = opened["channel"].as_str().expect("the DM").to_owned();
    s.judge_also_as(&dm, &s.bot_user, ScopeKind::Direct);

    // Each message in the tab is a thread of its own: the last of the
    // burst is answered in its thread, reading the two before it.
    let first = s.post_as(&s.user, &dm, "hello", None).await;
    let second = s
        .post_as(&s.user, &dm, "my laptop will not boot", None)
        .await;
    let third = s
        .post_as(&s.user, &dm, "it shows a grey screen", None)
        .await;
    let answer = answer_to(&s, &dm, &third, &third).await;
    assert_eq!(earlier_read(&answer), vec![first.clone(), second.clone()]);
    settled(&s).await;
    assert!(s.answers_in(&dm, &first).await.is_empty());
    assert!(s.answers_in(&dm, &second).await.is_empty());
    judged_clean(&s, 2).await;
}

/// A stack answering the latest of a burst after 3 s of quiet, the model
/// taking `latency_ms`; the person's first message, and Slack's copy of it
/// (delivered once the first owns the action: threadline keeps whichever
/// of the two it meets first): (stack, first, copy).
async fn latest_with_a_doubled_first(latency_ms: u64) -> (Stack, String, String) {
    let s = Stack::start(&[("THREADLINE_BUILTIN_LATENCY_MS", latency_ms.to_string())]).await;
    let inst = first_installation(&s).await;
    policy(&s, &inst, &["--action", "latest", "--quiet-ms", "3000"]).await;
    let first = s.post(&format!("<@{}> hi", s.bot_user), None).await;
    eventually(
        "the first message owning its action",
        Duration::from_secs(20),
        || async {
            threadline_store::testing::threads::action_owned(&s.db.pool, &first)
                .await
                .ok()?
                .map(|_| ())
        },
    )
    .await;
    let copy = sim_ctl(
        &s.sim,
        "act/double",
        json!({"channel": s.channel, "ts": first}),
    )
    .await["ts"]
        .as_str()
        .expect("the copy's ts")
        .to_owned();
    (s, first, copy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_reads_the_copy_of_a_message_slack_doubled_once_the_person_deleted_the_kept_one() {
    // The person's first message Slack delivers twice; they delete the
    // one threadline kept while their burst goes on. The copy takes its
    // place: the latest message's answer reads it, and it has none of its
    // own.
    let (s, first, copy) = latest_with_a_doubled_first(300).await;
    let bot = s.bot_user.clone();
    let latest = s
        .post(&format!("<@{bot}> why did the deploy fail?"), None)
        .await;
    s.delete(&first).await;
    let answer = answer_to(&s, &s.channel, &latest, &latest).await;
    assert_eq!(earlier_read(&answer), vec![copy.clone()]);
    settled(&s).await;
    assert!(s.answers(&copy).await.is_empty(), "no answer to {copy}");
    assert!(s.answers(&first).await.is_empty(), "no answer to {first}");
    judged_clean(&s, 1).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_standing_in_within_a_burst_is_answered_when_the_bursts_latest_goes_unanswered() {
    // The person's first message Slack delivers twice. Once the burst's
    // latest message absorbed it, they delete the one threadline kept (its
    // copy takes its place in the burst), then the latest message too,
    // before it was answered. Nothing read the copy: it is answered on its
    // own, once. (The model takes 6 s: the burst's answer is still being
    // made when the person deletes its messages.)
    let (s, first, copy) = latest_with_a_doubled_first(6000).await;
    let bot = s.bot_user.clone();
    let latest = s
        .post(&format!("<@{bot}> why did the deploy fail?"), None)
        .await;
    eventually(
        "the first message absorbed",
        Duration::from_secs(20),
        || async { (absorbed(&s).await >= 1).then_some(()) },
    )
    .await;
    s.delete(&first).await;
    eventually(
        "the copy standing in for the deleted message",
        Duration::from_secs(20),
        || async {
            let owned = threadline_store::testing::threads::action_owned(&s.db.pool, &copy)
                .await
                .ok()?;
            (owned == Some(Some(first.clone()))).then_some(())
        },
    )
    .await;
    s.delete(&latest).await;
    let answer = answer_to(&s, &s.channel, &copy, &copy).await;
    assert!(earlier_read(&answer).is_empty(), "{answer:#?}");
    settled(&s).await;
    assert_eq!(s.answers(&copy).await.len(), 1, "one answer to {copy}");
    assert!(s.answers(&first).await.is_empty(), "no answer to {first}");
    assert!(s.answers(&latest).await.is_empty(), "no answer to {latest}");
    judged_clean(&s, 0).await;
    s.stop().await;
}
