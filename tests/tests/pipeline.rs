//! Slack (slack-sim) → gateway → context-builder → inference → publisher →
//! Slack, all as processes, judged by Slack's ground truth.

use std::time::Duration;

use futures::StreamExt as _;
use serde_json::{Value, json};
use threadline_testkit::eventually;
use threadline_tests::{Stack, cli, sim_ctl, sim_get};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_is_answered_once_in_its_thread_and_the_answer_is_no_new_job() {
    let s = Stack::start(&[]).await;
    let root = s.post("deploy failed", None).await;
    let ask = s
        .post(&format!("<@{}> why?", s.bot_user), Some(&root))
        .await;

    // The publisher posts the labelled answer once, into the thread root.
    let answers = s.wait_answers(&root, 1).await;
    assert_eq!(answers.len(), 1);
    let answer = &answers[0];
    assert_eq!(
        answer["thread_ts"],
        root.as_str(),
        "into the root, never a reply ts"
    );
    let text = answer["text"].as_str().expect("text");
    assert!(
        text.starts_with("[threadline built-in model]")
            && text.ends_with("_AI-generated — verify before relying on it_"),
        "{text}"
    );
    assert_eq!(answer["metadata"]["event_type"], "threadline_reply");
    let threadline_store::testing::threads::CapturedContext {
        receipt_id: receipt,
        thread_version: version,
        source_ts: source,
    } = threadline_store::testing::threads::first_context(&s.db.pool)
        .await
        .expect("one context");
    assert_eq!(source, ask);
    let (intent_state, decided_version): (String, i64) =
        threadline_store::testing::intents::state_and_decided_version_by_receipt(
            &s.db.pool, receipt,
        )
        .await
        .expect("intent");
    assert_eq!((intent_state.as_str(), decided_version), ("sent", version));

    // Every receipt settles: root not addressed, one turn for the mention and
    // its message twin (either may claim it), our own answer no job.
    let settled = eventually("every receipt settled", Duration::from_secs(20), || {
        let pool = s.db.pool.clone();
        async move {
            let rows: Vec<(String, Option<String>)> =
                threadline_store::testing::receipts::states_and_reasons(&pool)
                    .await
                    .ok()?;
            (rows.len() == 4
                && rows
                    .iter()
                    .all(|r| r.0 != "accepted" && r.0 != "processing"))
            .then_some(rows)
        }
    })
    .await;
    let mut outcomes: Vec<String> = settled
        .iter()
        .map(|(st, r)| format!("{st}:{}", r.clone().unwrap_or_default()))
        .collect();
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            "done:",
            "ignored:duplicate_turn",
            "ignored:not_addressed",
            "ignored:own_bot"
        ]
    );
    let jobs: (i64, i64) =
        threadline_store::testing::decisions::count_contexts_and_decisions(&s.db.pool)
            .await
            .expect("counts");
    assert_eq!(
        jobs,
        (1, 1),
        "the bot loop produced no job and no model call"
    );
    let posts = sim_get(&s.sim, &format!("app_posts?app_id={}", s.app)).await;
    assert_eq!(
        posts["per_thread"],
        json!([{"channel": s.channel, "thread_ts": root, "count": 1}]),
        "answered exactly once"
    );
    let version: i64 = threadline_store::testing::threads::thread_version(&s.db.pool, &root)
        .await
        .expect("thread");
    // The question's message and its mention; our reply is kept but is no
    // change to what a person asked.
    assert_eq!(version, 2, "root and question; our reply bumps nothing");
    let out = cli(&["stats", "--json"], &[("DATABASE_URL", s.db.url.clone())]).await;
    let stats: Value = serde_json::from_slice(&out.stdout).expect("stats");
    assert_eq!(
        (
            &stats["receipts_total"],
            &stats["contexts_total"],
            &stats["model_calls_total"],
            &stats["duplicate_replies_total"]
        ),
        (&json!(4), &json!(1), &json!(1), &json!(0))
    );
    assert_eq!(stats["reply_intents_by_state"], json!({"sent": 1}));
    assert_eq!(
        stats["ignored_by_reason"],
        json!({"duplicate_turn": 1, "not_addressed": 1, "own_bot": 1}),
        "root not addressed, the twin a duplicate turn, our answer our own"
    );
    assert_eq!(
        (
            &stats["stale_proposals_total"],
            &stats["reconsidered_decisions_total"],
            &stats["kill_switch_suppressions_total"],
            &stats["reconciliations_by_result"]["post_found"]
        ),
        (&json!(0), &json!(0), &json!(0), &json!(0))
    );

    // The same ledger on /metrics, sampled from the database, with the
    // consumers' backlog and the Slack calls by outcome.
    let forged = reqwest::Client::new()
        .post(format!("{}/slack/events", s.services[0].base_url))
        .header("x-slack-request-timestamp", "1")
        .header("x-slack-signature", "v0=00")
        .body("{}")
        .send()
        .await
        .expect("post");
    assert_eq!(forged.status(), 401);
    let metrics = eventually(
        "the ledger on /metrics",
        Duration::from_secs(30),
        || async {
            let m = s.metrics().await;
            m.contains("threadline_reply_intents{state=\"sent\"} 1")
                .then_some(m)
        },
    )
    .await;
    for expected in [
        "threadline_reply_intents{state=\"unknown\"} 0",
        "threadline_consumer_pending_messages{consumer=\"publisher\"}",
        "threadline_consumer_oldest_message_age_seconds{consumer=\"inference\"}",
        "threadline_slack_api_calls_total{method=\"chat.postMessage\",outcome=\"ok\"} 1",
        "threadline_auth_failures_total{source=\"slack_signature\",reason=",
        "threadline_review_outcomes_total{outcome=\"approved\"} 0",
        "threadline_gateway_ack_seconds_bucket",
    ] {
        assert!(metrics.contains(expected), "/metrics lacks {expected}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_retries_and_a_lost_post_response_still_give_exactly_one_answer_in_one_trace() {
    let (otlp, _spans) = threadline_tests::otlp_collector().await;
    let s = Stack::start(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp),
        ("THREADLINE_SLACK_TIMEOUT_MS", "1000".to_owned()),
    ])
    .await;
    // Every hop of one event carries the same W3C trace id: watch the bus.
    let nats = async_nats::connect(threadline_testkit::nats_url())
        .await
        .expect("nats");
    let mut bus = nats
        .subscribe(format!("{}.>", s.prefix))
        .await
        .expect("subscribe");
    // Slack retries each delivery (the app answered "too late"), and the
    // answer's post lands but its response is lost.
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "events", "mode": "hold_past_deadline", "times": 0}),
    )
    .await;
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "lost_response", "latency_ms": 20000}),
    )
    .await;
    let root = s
        .post(&format!("<@{}> is the queue stuck?", s.bot_user), None)
        .await;
    let answers = s.wait_answers(&root, 1).await;
    assert_eq!(
        answers.len(),
        1,
        "one answer despite retries and a lost response: {answers:?}"
    );
    let calls = sim_get(&s.sim, "calls?method=chat.postMessage").await;
    assert_eq!(
        calls["calls"].as_array().map(Vec::len),
        Some(1),
        "posted once, reconciled, never re-posted"
    );
    // The publisher's call timed out: the outcome was unknown until the
    // thread showed the post (found by its metadata).
    let intent = eventually("the intent settled", Duration::from_secs(20), || {
        let pool = s.db.pool.clone();
        async move {
            let r: (String, bool) =
                threadline_store::testing::intents::first_state_and_reconciled(&pool)
                    .await
                    .ok()?;
            (r.0 == "sent").then_some(r)
        }
    })
    .await;
    assert_eq!(intent, ("sent".to_owned(), true));
    let model_calls: i64 = threadline_store::testing::decisions::count_rows(&s.db.pool)
        .await
        .expect("decisions");
    assert_eq!(model_calls, 1, "one model call for the event");
    let deliveries = sim_get(&s.sim, "deliveries").await;
    assert!(
        deliveries["deliveries"]
            .as_array()
            .map(Vec::len)
            .unwrap_or(0)
            >= 4,
        "Slack did retry"
    );

    // One trace across the hops: the context and the proposal carry the
    // trace of the event that caused them.
    let mut by_subject: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    while let Ok(Some(msg)) = tokio::time::timeout(Duration::from_millis(300), bus.next()).await {
        let tp = msg
            .headers
            .as_ref()
            .and_then(|h| h.get("traceparent"))
            .map(|v| v.as_str().to_owned());
        let subject = msg
            .subject
            .as_str()
            .rsplit('.')
            .next()
            .unwrap_or_default()
            .to_owned();
        by_subject
            .entry(subject)
            .or_default()
            .push(tp.expect("every bus message carries a traceparent"));
    }
    let trace = |tp: &String| tp.split('-').nth(1).unwrap_or_default().to_owned();
    let events: Vec<String> = by_subject["events"].iter().map(trace).collect();
    let contexts: Vec<String> = by_subject["contexts"].iter().map(trace).collect();
    let proposals: Vec<String> = by_subject["proposals"].iter().map(trace).collect();
    assert_eq!((contexts.len(), proposals.len()), (1, 1), "{by_subject:?}");
    assert!(
        events.contains(&contexts[0]),
        "the context continues its event's trace"
    );
    assert_eq!(
        proposals[0], contexts[0],
        "the proposal continues the same trace"
    );
    assert_ne!(
        by_subject["proposals"][0], by_subject["contexts"][0],
        "each hop is its own span"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_message_text_token_or_secret_reaches_logs_or_metrics() {
    // Debug logging everywhere: the strictest setting an operator might use.
    let s = Stack::start(&[
        ("RUST_LOG", "debug".to_owned()),
        ("THREADLINE_LOG_FORMAT", "json".to_owned()),
    ])
    .await;
    let marker = "MARKER-7f3a-private-words";
    let planted = "xoxb-4242-4242-plantedsecretvalue";
    let root = s
        .post(&format!("{marker} our key is {planted}"), None)
        .await;
    s.post(
        &format!("<@{}> {marker} what is the key?", s.bot_user),
        Some(&root),
    )
    .await;
    assert_eq!(s.wait_answers(&root, 1).await.len(), 1);
    let metrics = s.metrics().await;
    assert!(
        metrics.contains("threadline_gateway_ack_seconds"),
        "metrics are served"
    );
    let (bot_token, secret) = (s.token.clone(), threadline_testkit::slack::TEST_SECRET);
    let logs = s.stop().await;
    assert!(
        logs.len() > 1000,
        "debug logging produced output ({} bytes)",
        logs.len()
    );
    // Correlation ids: every line logged while handling an event names the
    // event and the trace, and one event's trace id is found in the logs of
    // every service that handled it.
    let lines: Vec<Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(lines.len() > 20, "JSON log lines");
    let field = |l: &Value, key: &str| -> Option<String> {
        l["spans"]
            .as_array()?
            .iter()
            .rev()
            .find_map(|s| s[key].as_str().map(str::to_owned))
    };
    let with_event: Vec<&Value> = lines
        .iter()
        .filter(|l| field(l, "event_id").is_some())
        .collect();
    assert!(!with_event.is_empty(), "lines name their event");
    for l in &with_event {
        assert!(
            field(l, "trace_id").is_some(),
            "a line without its trace: {l}"
        );
    }
    // Which service wrote a line shows in its spans' names.
    let service_of = |l: &Value| -> Option<&'static str> {
        l["spans"]
            .as_array()?
            .iter()
            .find_map(|s| match s["name"].as_str()? {
                "http.request" | "outbox.publish" => Some("gateway"),
                "context.build" => Some("context-builder"),
                "inference.decide" | "model.call" => Some("inference"),
                "publisher.publish" => Some("publisher"),
                _ => None,
            })
    };
    let mut services_by_trace: std::collections::HashMap<
        String,
        std::collections::BTreeSet<&'static str>,
    > = Default::default();
    for l in &lines {
        if let (Some(t), Some(service)) = (field(l, "trace_id"), service_of(l)) {
            services_by_trace.entry(t).or_default().insert(service);
        }
    }
    assert!(
        services_by_trace.values().any(|s| s.len() == 4),
        "one trace id in the logs of all four services: {services_by_trace:?}"
    );
    for (what, needle) in [
        ("message text", marker),
        ("a secret in a message", planted),
        ("the bot token", bot_token.as_str()),
        ("the signing secret", secret),
    ] {
        assert!(!logs.contains(needle), "{what} appears in a log line");
        assert!(!metrics.contains(needle), "{what} appears in a metric");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_to_two_gateways_gives_one_receipt_one_model_call_one_reply_even_after_restarting_everything()
 {
    let mut s = Stack::start(&[]).await;
    // A second gateway; Slack delivers every event to both at once.
    let owned: Vec<(String, String)> = s
        .env_of(0)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    let env: Vec<(&str, String)> = owned.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let gw2 = threadline_tests::spawn_gateway(&env).await;
    sim_ctl(
        &s.sim,
        &format!("apps/{}/request_urls", s.app),
        json!({"request_urls": [s.services[0].events_url(), gw2.events_url()]}),
    )
    .await;
    retried_then_duplicated(&s).await;
    let first = s
        .post(&format!("<@{}> two gateways?", s.bot_user), None)
        .await;
    one_receipt_one_call_one_reply(&s, &first).await;
    retries_reached_both(&s, &gw2.events_url()).await;

    // Restart everything (SIGKILL, like a crash), then again.
    for i in 0..s.services.len() {
        s.kill_and_restart(i).await;
    }
    gw2.kill().await;
    let gw2 = threadline_tests::spawn_gateway(&env).await;
    sim_ctl(
        &s.sim,
        &format!("apps/{}/request_urls", s.app),
        json!({"request_urls": [s.services[0].events_url(), gw2.events_url()]}),
    )
    .await;
    retried_then_duplicated(&s).await;
    let second = s
        .post(&format!("<@{}> after the restart?", s.bot_user), None)
        .await;
    one_receipt_one_call_one_reply(&s, &second).await;
    retries_reached_both(&s, &gw2.events_url()).await;
    assert_eq!(
        s.answers(&first).await.len(),
        1,
        "nothing re-posted after the restart"
    );
    s.assert_at_most_one_reply_per_message().await;
    assert!(gw2.terminate().await.success());
    s.stop().await;
}

/// The mention `root` got one reply in Slack, one receipt per event (the
/// mention and its message twin) though each reached both gateways, and one
/// model call.
/// Slack counts the first two deliveries as too late (so the mention and
/// its twin are retried), and delivers every later attempt to both
/// gateways at once.
async fn retried_then_duplicated(s: &Stack) {
    threadline_tests::sim_clear_faults(&s.sim).await;
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "events", "mode": "hold_past_deadline", "times": 2}),
    )
    .await;
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "events", "mode": "duplicate", "times": 0}),
    )
    .await;
}

/// Slack's own log shows retries, delivered to the second gateway too.
async fn retries_reached_both(s: &Stack, second_gateway: &str) {
    let d = sim_get(&s.sim, "deliveries").await;
    let retried_to_second = d["deliveries"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter(|x| x["attempt"].as_u64() > Some(0) && x["url"] == second_gateway)
                .count()
        })
        .unwrap_or(0);
    assert!(
        retried_to_second >= 1,
        "Slack retried, and a retry reached the second gateway: {d}"
    );
}

async fn one_receipt_one_call_one_reply(s: &Stack, root: &str) {
    let answers = s.wait_answers(root, 1).await;
    assert_eq!(answers.len(), 1, "one reply: {answers:?}");
    let threadline_store::testing::receipts::RootLedger {
        receipts,
        duplicates: dups,
        decisions,
        ..
    } = threadline_store::testing::receipts::ledger_by_root(&s.db.pool, root)
        .await
        .expect("counts");
    assert_eq!(receipts, 2, "one receipt per event");
    assert!(
        dups >= 2,
        "each event reached both gateways ({dups} duplicates)"
    );
    assert_eq!(decisions, 1, "one model call");
}

/// The model takes longer than Slack's 3 s window and every delivery is
/// answered too late, so Slack retries the mention (and its message twin)
/// while the answer is being made: one model call, one intent, one reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_delayed_past_three_seconds_while_slack_retries_gives_one_call_one_intent_one_reply()
 {
    let s = Stack::start(&[("THREADLINE_BUILTIN_LATENCY_MS", "3500".to_owned())]).await;
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "events", "mode": "hold_past_deadline", "times": 0}),
    )
    .await;
    let root = s
        .post(&format!("<@{}> why is the deploy slow?", s.bot_user), None)
        .await;
    // Slack's retries (1 and 5 minutes, scaled) land while the model runs.
    let retried_during_the_call = eventually(
        "Slack's retries while the model runs",
        Duration::from_secs(30),
        || {
            let pool = s.db.pool.clone();
            async move {
                let (calling, dups): (i64, i64) =
                    threadline_store::testing::decisions::calling_and_duplicates(&pool)
                        .await
                        .ok()?;
                (calling == 1 && dups >= 1).then_some(dups)
            }
        },
    )
    .await;
    assert!(retried_during_the_call >= 1);
    let answers = s.wait_answers(&root, 1).await;
    assert_eq!(answers.len(), 1, "one reply: {answers:?}");
    // Every retry Slack makes has arrived (attempts 0 to 3 per event).
    eventually("every retry delivered", Duration::from_secs(30), || async {
        let d = sim_get(&s.sim, "deliveries").await;
        let third = d["deliveries"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter(|x| x["attempt"].as_u64() == Some(3))
                    .count()
            })
            .unwrap_or(0);
        (third >= 2).then_some(())
    })
    .await;
    let threadline_store::testing::receipts::RootLedger {
        receipts,
        duplicates: dups,
        decisions,
        intents,
    } = threadline_store::testing::receipts::ledger_by_root(&s.db.pool, &root)
        .await
        .expect("ledger");
    assert_eq!(receipts, 2, "one receipt per event (mention and its twin)");
    assert!(dups >= 4, "every retry absorbed as a duplicate: {dups}");
    assert_eq!(decisions, 1, "one model call");
    assert_eq!(intents, 1, "one reply intent");
    let posts = sim_get(&s.sim, "calls?method=chat.postMessage").await;
    assert_eq!(posts["calls"].as_array().map(Vec::len), Some(1), "one post");
    s.assert_at_most_one_reply_per_message().await;
    s.stop().await;
}

/// Slack answers the post with a 503 and never applied it: the outcome is
/// unknown, the thread shows no such post, so the intent is held for an
/// operator; nothing is posted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_that_never_landed_is_held_and_never_posted_again() {
    let s = Stack::start(&[]).await;
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "http_error", "status": 503, "applied": false}),
    )
    .await;
    let root = s
        .post(&format!("<@{}> is the cache warm?", s.bot_user), None)
        .await;
    let held = eventually("the intent held", Duration::from_secs(30), || {
        let pool = s.db.pool.clone();
        async move {
            let r: (String, Option<String>) =
                threadline_store::testing::intents::first_state_and_error_code(&pool)
                    .await
                    .ok()?;
            (r.0 == "held").then_some(r)
        }
    })
    .await;
    assert_eq!(held.1.as_deref(), Some("no_evidence_of_post"), "{held:?}");
    // Give a re-post every chance to happen (none may).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(s.answers(&root).await.is_empty(), "nothing in Slack");
    let posts = sim_get(&s.sim, "calls?method=chat.postMessage").await;
    assert_eq!(
        posts["calls"].as_array().map(Vec::len),
        Some(1),
        "one attempt, never repeated: {posts}"
    );
    let reads = sim_get(&s.sim, "calls?method=conversations.replies").await;
    assert!(
        reads["calls"].as_array().is_some_and(|c| !c.is_empty()),
        "the thread was read for evidence before holding"
    );
    s.stop().await;
}

/// An edit that leaves the text as it was (Slack sends `message_changed`
/// for unfurls and the like) changes nothing: the answer being made is
/// posted, with no second model call and nothing stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_with_unchanged_text_changes_nothing() {
    let s = Stack::start(&[("THREADLINE_BUILTIN_LATENCY_MS", "1500".to_owned())]).await;
    let text = format!("<@{}> what changed in the release?", s.bot_user);
    let root = s.post(&text, None).await;
    eventually("the model running", Duration::from_secs(20), || {
        let pool = s.db.pool.clone();
        async move {
            let n: i64 = threadline_store::testing::decisions::count_with_status(&pool, "calling")
                .await
                .ok()?;
            (n == 1).then_some(())
        }
    })
    .await;
    let version_before: i64 = threadline_store::testing::threads::thread_version(&s.db.pool, &root)
        .await
        .expect("thread");
    sim_ctl(
        &s.sim,
        "act/edit",
        json!({"user": s.user, "channel": s.channel, "ts": root, "text": text}),
    )
    .await;
    let answers = s.wait_answers(&root, 1).await;
    assert_eq!(answers.len(), 1, "the answer is posted once: {answers:?}");
    // The edit was received, and recorded as no change.
    let reason = eventually("the edit processed", Duration::from_secs(20), || {
        let pool = s.db.pool.clone();
        async move {
            threadline_store::testing::receipts::processed_reason_by_subtype(
                &pool,
                "message_changed",
            )
            .await
            .ok()
            .flatten()
        }
    })
    .await;
    assert_eq!(reason.as_deref(), Some("edit_without_text_change"));
    let threadline_store::testing::threads::VersionAndDecisions {
        version: version_after,
        decisions,
        stale,
    } = threadline_store::testing::threads::version_and_decisions_by_root(&s.db.pool, &root)
        .await
        .expect("ledger");
    assert_eq!(
        version_after, version_before,
        "neither the unchanged edit nor our own reply changed the thread"
    );
    assert_eq!((decisions, stale), (1, 0), "one model call, nothing stale");
    s.assert_at_most_one_reply_per_message().await;
    s.stop().await;
}
