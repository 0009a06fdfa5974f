//! The promise under adversarial faults — one reply per request, to the
//! thread as it is, nothing acknowledged lost — against the compiled
//! services, each test aimed at one way it used to break. Every test is
//! judged at the end from Slack's side by the oracle (`Stack::stop`), and
//! asserts what Slack shows besides threadline's own records.

use std::time::Duration;

use serde_json::{Value, json};
use threadline_testkit::eventually;
use threadline_tests::{Stack, cli, sim_clear_faults, sim_ctl, sim_get};
use uuid::Uuid;

/// Short recovery times, so each fault plays out in seconds: a post times
/// out after 1 s; a `sending` intent is taken for lost after 4 s; three
/// empty reads over 1.5 s hold an intent; the sweeper looks every half
/// second and reads a held intent's thread again after 2 s.
fn fast(extra: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    let mut v: Vec<(&'static str, String)> = [
        ("THREADLINE_BUILTIN_LATENCY_MS", "200"),
        ("THREADLINE_SLACK_TIMEOUT_MS", "1000"),
        ("THREADLINE_SENDING_STALE_MS", "4000"),
        ("THREADLINE_RECONCILE_WINDOW_MS", "1500"),
        ("THREADLINE_REDELIVERY_MS", "3000"),
        ("THREADLINE_SWEEP_MS", "500"),
        ("THREADLINE_SWEEP_IDLE_MS", "3000"),
        ("THREADLINE_LATE_CHECK_MS", "2000"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect();
    for (k, val) in extra {
        v.retain(|(kk, _)| kk != k);
        v.push((k, (*val).to_owned()));
    }
    v
}

/// The reply intent of the question `ts`: id, state, reconciled, Slack ts.
async fn intent(s: &Stack, ts: &str) -> Option<(Uuid, String, bool, Option<String>)> {
    threadline_store::testing::intents::intent_of_question(&s.db.pool, ts)
        .await
        .expect("intent")
        .map(|i| (i.id, i.state, i.reconciled, i.slack_ts))
}

async fn until_intent(
    s: &Stack,
    ts: &str,
    state: &str,
    limit: u64,
) -> (Uuid, bool, Option<String>) {
    eventually(
        &format!("the intent {state}"),
        Duration::from_secs(limit),
        || async {
            match intent(s, ts).await {
                Some((id, st, rec, slack)) if st == state => Some((id, rec, slack)),
                _ => None,
            }
        },
    )
    .await
}

async fn post_calls(s: &Stack) -> Vec<Value> {
    sim_get(&s.sim, "calls?method=chat.postMessage").await["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn db_env(s: &Stack) -> Vec<(&'static str, String)> {
    vec![("DATABASE_URL", s.db.url.clone())]
}

/// Hole 1, slow Slack: the post reaches Slack, which applies it only after
/// the client gave up and reconciliation found nothing and held the intent.
/// The late post is found by the sweeper's later read and recorded; a
/// re-post is then refused. Slack shows one reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_slack_applies_after_its_intent_was_held_is_recorded_and_never_repeated() {
    let s = Stack::start(&fast(&[])).await;
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "latency", "latency_ms": 6000}),
    )
    .await;
    let q = s
        .post(&format!("<@{}> is the queue draining?", s.bot_user), None)
        .await;
    let (id, _, _) = until_intent(&s, &q, "held", 30).await;
    assert!(
        s.answers(&q).await.is_empty(),
        "held before Slack applied the post"
    );
    // Slack applies it at 6 s; the sweeper reads the thread again.
    let (_, reconciled, slack_ts) = until_intent(&s, &q, "sent", 30).await;
    let answers = s.answers(&q).await;
    assert_eq!(answers.len(), 1);
    assert!(reconciled);
    assert_eq!(slack_ts.as_deref(), answers[0]["ts"].as_str());
    // An operator who comes to it now cannot post it twice.
    let out = cli(&["intents", "repost", &id.to_string()], &db_env(&s)).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not held (it is sent)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(s.answers(&q).await.len(), 1);
    assert_eq!(post_calls(&s).await.len(), 1, "one post, ever");
    s.stop().await;
}

/// Hole 1, a frozen publisher: it sends the post and is stopped (SIGSTOP)
/// for longer than the stale time; another publisher takes the intent
/// over, finds nothing yet and holds it; Slack applies the post later; the
/// frozen one resumes. The post is recorded, never forgotten, and nothing
/// is posted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_frozen_past_the_stale_time_never_leads_to_a_second_post() {
    let s = Stack::start(&fast(&[])).await;
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "latency", "latency_ms": 12000}),
    )
    .await;
    let q = s
        .post(&format!("<@{}> can I merge?", s.bot_user), None)
        .await;
    until_intent(&s, &q, "sending", 30).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.services[3].pause();
    let other = s.spawn_replica(3, &[]).await;
    // The other publisher takes the intent over and holds it for lack of
    // evidence: the post is still inside Slack.
    let (id, _, _) = until_intent(&s, &q, "held", 30).await;
    // Slack applies it; the frozen publisher resumes.
    eventually(
        "Slack applied the post",
        Duration::from_secs(30),
        || async { (s.answers(&q).await.len() == 1).then_some(()) },
    )
    .await;
    s.services[3].resume();
    let (_, _, slack_ts) = until_intent(&s, &q, "sent", 30).await;
    let answers = s.answers(&q).await;
    assert_eq!(slack_ts.as_deref(), answers[0]["ts"].as_str());
    let out = cli(&["intents", "repost", &id.to_string()], &db_env(&s)).await;
    assert!(!out.status.success(), "a sent intent is never re-posted");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(s.answers(&q).await.len(), 1);
    assert_eq!(post_calls(&s).await.len(), 1, "one post, ever");
    assert!(other.terminate().await.success());
    s.stop().await;
}

/// Hole 2: two questions in one thread both get the fallback answer (same
/// text), and Slack keeps the first without its metadata, so only its text
/// tells whose it is. The second post is refused before it is applied
/// (503), so its outcome is unknown, and the first post falls inside its
/// window. Reconciliation must not take the first answer for the second's:
/// with re-posting allowed, the second question gets its own reply. Slack
/// shows two replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_never_takes_another_answers_message_for_its_own() {
    let s = Stack::start(&fast(&[
        ("THREADLINE_MODEL_PROVIDER", "openai"),
        ("THREADLINE_MODEL_BASE_URL", "http://127.0.0.1:9/v1"),
        ("THREADLINE_MODEL_NAME", "absent"),
        ("THREADLINE_RECONCILE_ALLOW_REPOST", "true"),
    ]))
    .await;
    // (fallback answers state no question: the oracle counts one answered
    // question per fallback reply in the thread, so an intent that took the
    // first reply for its own leaves a question unanswered in Slack while
    // threadline records it answered: a violation)
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "drop_metadata"}),
    )
    .await;
    let q1 = s
        .post(&format!("<@{}> first question", s.bot_user), None)
        .await;
    assert_eq!(s.wait_answers(&q1, 1).await.len(), 1);
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "http_error", "status": 503, "applied": false}),
    )
    .await;
    let q2 = s
        .post(&format!("<@{}> second question", s.bot_user), Some(&q1))
        .await;
    // Judged from Slack's side once the second intent is settled: each
    // fallback reply answers one question, so an intent that took the first
    // reply for its own leaves a question unanswered that threadline
    // records as answered.
    until_intent(&s, &q2, "sent", 30).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (j, violations) = s.verdict(threadline_tests::ORACLE_GRACE).await;
    assert!(violations.is_empty(), "the oracle: {violations:#?}");
    assert_eq!((j.questions, j.answered), (2, 2));
    let answers = s.wait_answers(&q1, 2).await;
    assert_eq!(answers.len(), 2, "each question its own reply: {answers:?}");
    assert_eq!(
        answers[0]["text"], answers[1]["text"],
        "the same fallback text"
    );
    let (_, _, first_ts) = until_intent(&s, &q1, "sent", 10).await;
    let (_, _, second_ts) = until_intent(&s, &q2, "sent", 10).await;
    assert_ne!(first_ts, second_ts, "no intent adopted the other's post");
    s.stop().await;
}

/// Hole 3: Postgres away for 80 s while acknowledged work is in flight
/// (events being opened, model answers being recorded), with a broker
/// that redelivers unacknowledged work after 1 s. Nothing is
/// dead-lettered however many deliveries the outage costs; every question
/// is answered once after it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eighty_second_database_outage_dead_letters_nothing_and_loses_nothing() {
    let s = Stack::start(&fast(&[
        ("THREADLINE_BUILTIN_LATENCY_MS", "1500"),
        ("THREADLINE_INSTALLATION_CACHE_MS", "0"),
        ("THREADLINE_REDELIVERY_MS", "1000"),
    ]))
    .await;
    let mut questions = Vec::new();
    for i in 0..3 {
        questions.push(
            s.post(&format!("<@{}> question {i}?", s.bot_user), None)
                .await,
        );
    }
    eventually(
        "the receipts committed",
        Duration::from_secs(10),
        || async {
            let n = threadline_store::testing::receipts::count_receipts_of_type(
                &s.db.pool,
                "app_mention",
            )
            .await
            .ok()?;
            (n == 3).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    s.db.take_down().await;
    tokio::time::sleep(Duration::from_secs(80)).await;
    s.db.bring_up().await;
    let dlq = threadline_runtime::bus::Topology::new(s.prefix.clone()).dead_letter_stream();
    assert_eq!(
        threadline_testkit::stream_len(&s.js, &dlq).await,
        0,
        "nothing was given up during the outage"
    );
    for q in &questions {
        eventually("the answer", Duration::from_secs(60), || async {
            (s.answers(q).await.len() == 1).then_some(())
        })
        .await;
    }
    assert_eq!(
        threadline_testkit::stream_len(&s.js, &dlq).await,
        0,
        "an outage is no reason to dead-letter"
    );
    s.stop().await;
}

/// Hole 3: the post landed and its publisher died before recording it,
/// and then its proposal was lost (dead-lettered, purged). No delivery
/// drives the intent any more: the sweeper finds it `sending` past the
/// stale time, hands its proposal back, and reconciliation records the post.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_whose_proposal_vanished_after_its_post_is_settled_by_the_sweeper() {
    let mut s = Stack::start(&fast(&[
        ("THREADLINE_SLACK_TIMEOUT_MS", "5000"),
        ("THREADLINE_SENDING_STALE_MS", "11000"),
    ]))
    .await;
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "latency", "latency_ms": 1500}),
    )
    .await;
    let q = s
        .post(&format!("<@{}> what is the ETA?", s.bot_user), None)
        .await;
    until_intent(&s, &q, "sending", 30).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let publisher = s.services.remove(3);
    let (bin, setting, port) = publisher.service.clone().expect("service");
    publisher.kill().await;
    // The proposal is gone from the bus, as if dead-lettered and dropped.
    let stream = threadline_runtime::bus::Topology::new(s.prefix.clone())
        .stream(threadline_runtime::bus::Topic::Proposals);
    s.js.get_stream(&stream)
        .await
        .expect("stream")
        .purge()
        .await
        .expect("purge");
    eventually(
        "Slack applied the post",
        Duration::from_secs(10),
        || async { (s.answers(&q).await.len() == 1).then_some(()) },
    )
    .await;
    assert_eq!(
        intent(&s, &q).await.map(|i| i.1).as_deref(),
        Some("sending")
    );
    let owned: Vec<(String, String)> = s
        .env_of(3)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    let env: Vec<(&str, String)> = owned.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    s.services.insert(
        3,
        threadline_tests::spawn_service_at(&bin, &setting, port, &env).await,
    );
    let (_, reconciled, slack_ts) = until_intent(&s, &q, "sent", 40).await;
    assert!(reconciled);
    assert_eq!(slack_ts.as_deref(), s.answers(&q).await[0]["ts"].as_str());
    let metrics = s.metrics().await;
    assert!(
        metrics.contains("threadline_sweeper_resumed_total{state=\"sending\"}"),
        "the sweeper drove it"
    );
    assert_eq!(post_calls(&s).await.len(), 1);
    s.stop().await;
}

/// Hole 4: a person replies at the very moment the answer reaches Slack
/// (injected by slack-sim when the post arrives, before it is applied).
/// No design can stop that post; threadline records the answer as crossed
/// in flight, counts it, and reconsiders the thread. A reply that is a new
/// question gets its own single answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_crosses_the_answer_in_flight_is_recorded_counted_and_reconsidered() {
    let s = Stack::start(&fast(&[])).await;
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "inject_reply", "user": s.user,
               "text": "oh, and it only fails on Mondays", "latency_ms": 300}),
    )
    .await;
    let q = s
        .post(&format!("<@{}> why does the job fail?", s.bot_user), None)
        .await;
    assert_eq!(s.wait_answers(&q, 1).await.len(), 1);
    let crossed: (String, Option<String>) =
        eventually("the crossing recorded", Duration::from_secs(20), || async {
            threadline_store::testing::threads::any_crossed_answer(&s.db.pool)
                .await
                .ok()
                .flatten()
                .filter(|r: &(String, Option<String>)| r.1.is_some())
        })
        .await;
    let injected = post_calls(&s).await[0]["injected_ts"].clone();
    assert_eq!(Some(crossed.0.as_str()), injected.as_str());
    // A plain reply asks nothing new: the latest request stays answered.
    assert_eq!(crossed.1.as_deref(), Some("no_reply_needed"));
    assert!(
        s.metrics()
            .await
            .contains("threadline_crossed_in_flight_total")
    );

    // The crossing reply is itself a question: it is answered once.
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "inject_reply", "user": s.user,
               "text": format!("<@{}> and what about Tuesdays?", s.bot_user), "latency_ms": 300}),
    )
    .await;
    let q2 = s
        .post(&format!("<@{}> is the cache warm?", s.bot_user), None)
        .await;
    let answers = s.wait_answers(&q2, 2).await;
    assert_eq!(
        answers.len(),
        2,
        "the question and the crossing question, once each"
    );
    sim_clear_faults(&s.sim).await;
    s.stop().await;
}

/// Hole 5: a workspace whose channel answers every post with 429 and a
/// long `Retry-After` fills no worker slot: with two slots and four
/// answers waiting there, another workspace, and another channel of the
/// same workspace, are answered long before that `Retry-After` ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_waiting_out_a_429_does_not_stall_the_others() {
    let s = Stack::start(&fast(&[("THREADLINE_PUBLISHER_CONCURRENCY", "2")])).await;
    let quiet = s.add_workspace("Quiet").await;
    let side = sim_ctl(
        &s.sim,
        "channels",
        json!({"team_id": s.team, "name": "side", "kind": "public", "members": [s.user, s.bot_user]}),
    )
    .await["id"]
        .as_str()
        .expect("channel")
        .to_owned();
    s.judge_also(&side, &s.bot_user);
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "ratelimited", "retry_after": 40, "times": 0,
               "channel": s.channel}),
    )
    .await;
    let mut busy = Vec::new();
    for i in 0..4 {
        busy.push(s.post(&format!("<@{}> busy {i}?", s.bot_user), None).await);
    }
    eventually(
        "all four refused with 429",
        Duration::from_secs(20),
        || async {
            let refused = post_calls(&s)
                .await
                .iter()
                .filter(|c| c["outcome"] == "ratelimited")
                .count();
            (refused >= 1).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let q = s
        .post_as(
            &quiet.user,
            &quiet.channel,
            &format!("<@{}> quiet here?", quiet.bot_user),
            None,
        )
        .await;
    let q_side = s
        .post_as(
            &s.user,
            &side,
            &format!("<@{}> and this channel?", s.bot_user),
            None,
        )
        .await;
    eventually(
        "the quiet workspace answered",
        Duration::from_secs(20),
        || async { (s.answers_in(&quiet.channel, &q).await.len() == 1).then_some(()) },
    )
    .await;
    eventually(
        "the workspace's other channel answered",
        Duration::from_secs(20),
        || async { (s.answers_in(&side, &q_side).await.len() == 1).then_some(()) },
    )
    .await;
    for b in &busy {
        assert!(
            s.answers(b).await.is_empty(),
            "still waiting out Retry-After"
        );
    }
    // Slack lets the channel post again: every waiting answer lands once.
    sim_clear_faults(&s.sim).await;
    for b in &busy {
        eventually("the waiting answer", Duration::from_secs(90), || async {
            (s.answers(b).await.len() == 1).then_some(())
        })
        .await;
    }
    s.stop().await;
}

/// `intents mark-sent` settles like the publisher: the decision published
/// and the turn answered, not just the intent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marking_a_held_intent_sent_settles_its_decision_and_turn() {
    let s = Stack::start(&fast(&[])).await;
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "http_error", "status": 503, "applied": false}),
    )
    .await;
    let q = s
        .post(&format!("<@{}> who is on call?", s.bot_user), None)
        .await;
    let (id, _, _) = until_intent(&s, &q, "held", 30).await;
    // The operator found it in Slack (here: a message they posted by hand).
    let out = cli(
        &[
            "intents",
            "mark-sent",
            &id.to_string(),
            "--ts",
            "1700000000.000100",
        ],
        &db_env(&s),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (decision, answered) =
        threadline_store::testing::decisions::status_and_turn_answered(&s.db.pool, &q)
            .await
            .expect("settled");
    assert_eq!((decision.as_str(), answered), ("published", true));
    let again = cli(
        &[
            "intents",
            "mark-sent",
            &id.to_string(),
            "--ts",
            "1700000000.000100",
        ],
        &db_env(&s),
    )
    .await;
    assert!(
        !again.status.success(),
        "only a held intent is settled by hand"
    );
    // Slack shows no reply (the operator's word stands for it).
    let mut s = s;
    s.unjudged = Some("the operator marked the answer sent with a ts Slack does not hold");
    s.stop().await;
}
