//! One Slack event is one trace across the four services (spans exported
//! over OTLP and decoded here), and one audit trail of content-free records;
//! retention purges what is old and nothing else.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde_json::Value;
use threadline_store::testing::audit::Rewrite;
use threadline_tests::{CapturedSpan, Stack, cli, otlp_collector};

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

const SERVICES: [&str; 4] = [
    "threadline-gateway",
    "threadline-context-builder",
    "threadline-inference",
    "threadline-publisher",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_is_one_unbroken_trace_and_one_content_free_audit_trail() {
    let (otlp, spans) = otlp_collector().await;
    let s = Stack::start(&[("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)]).await;
    let marker = "MARKER-91c2-confidential-words";
    let planted = "xoxb-9999-9999-plantedsecretvalue";
    let root = s
        .post(&format!("{marker} the key is {planted}"), None)
        .await;
    s.post(&format!("<@{}> {marker} summary?", s.bot_user), Some(&root))
        .await;
    assert_eq!(s.wait_answers(&root, 1).await.len(), 1);
    let event_id: String =
        threadline_store::testing::intents::event_id_in_state(&s.db.pool, "sent")
            .await
            .expect("the sent intent");

    // The audit trail of that event: every stage, one channel pseudonym,
    // timings in order.
    let trail = threadline_store::testing::audit::trail_of_event(&s.db.pool, &event_id)
        .await
        .expect("audit records");
    let stages: BTreeSet<&str> = trail.iter().map(|r| r.stage.as_str()).collect();
    assert_eq!(
        stages,
        BTreeSet::from(["context", "decision", "delivery", "intake"]),
        "{trail:?}"
    );
    assert!(
        trail
            .iter()
            .any(|r| r.stage == "delivery" && r.delivery_status.as_deref() == Some("sent")),
        "{trail:?}"
    );
    // One record per decision point: none of a post only claimed, nor of a
    // step that echoes another (the decision published by its delivery,
    // the request handed on with the context built for it); the delivery
    // says when its post was claimed.
    let mut steps: Vec<(&str, &str)> = trail
        .iter()
        .map(|r| (r.stage.as_str(), r.outcome.as_str()))
        .collect();
    steps.sort();
    assert_eq!(
        steps,
        [
            ("context", "context_built"),
            ("decision", "calling"),
            ("decision", "proposed"),
            ("delivery", "sent"),
            ("intake", "accepted")
        ],
        "{trail:?}"
    );
    // The context's record, standing for the request handed on, says what
    // its ending would have: the event's type and deliveries.
    // (the mention or its `message` twin, whichever came first)
    let intake_type = trail
        .iter()
        .find(|r| r.stage == "intake")
        .and_then(|r| r.event_type.clone());
    assert!(
        intake_type.is_some()
            && trail.iter().any(|r| r.stage == "context"
                && r.event_type == intake_type
                && r.retry_count == Some(0)),
        "{trail:?}"
    );
    for r in trail.iter().filter(|r| r.stage == "delivery") {
        assert_eq!(
            r.began_before,
            Some(true),
            "when its post was claimed: {r:?}"
        );
    }
    assert!(
        trail
            .iter()
            .filter(|r| r.stage == "context" || r.stage == "intake")
            .all(|r| r.channel_ref.is_some()),
        "intake and context records name the channel by its pseudonym: {trail:?}"
    );
    // The decision record names the model configuration and the output's
    // hash (never the output).
    let (config, hash): (Option<String>, Option<String>) =
        threadline_store::testing::audit::proposed_config_and_hash(&s.db.pool, &event_id)
            .await
            .expect("the proposed decision's record");
    assert!(
        config.is_some_and(|c| !c.is_empty()),
        "model configuration id"
    );
    assert!(hash.is_some_and(|h| h.len() == 64), "output hash");
    let refs: BTreeSet<&str> = trail
        .iter()
        .filter_map(|r| r.channel_ref.as_deref())
        .collect();
    assert_eq!(refs.len(), 1, "one pseudonym for the channel: {trail:?}");
    let pseudonym = refs.into_iter().next().expect("a pseudonym");
    assert_eq!(pseudonym.len(), 32);
    assert!(!pseudonym.contains(&s.channel));
    let in_order: bool = threadline_store::testing::audit::timeline_in_order(&s.db.pool, &event_id)
        .await
        .expect("a timeline with every time set");
    assert!(in_order);
    let dump: String = threadline_store::testing::audit::dump(&s.db.pool)
        .await
        .expect("dump");
    for (what, needle) in [
        ("message text", marker),
        ("a secret from a message", planted),
        ("the channel id", s.channel.as_str()),
        ("the person's id", s.user.as_str()),
        ("the bot token", s.token.as_str()),
    ] {
        assert!(!dump.contains(needle), "{what} is in the audit log");
    }
    // Append-only, whoever asks.
    for how in [Rewrite::Update, Rewrite::Delete, Rewrite::Truncate] {
        let err = threadline_store::testing::audit::rewrite(&s.db.pool, how)
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("append-only"), "{how:?}: {err}");
    }

    // The trace: stopping the services flushes their exporters.
    let (channel, user, token) = (s.channel.clone(), s.user.clone(), s.token.clone());
    s.stop().await;
    let spans = spans.lock().expect("spans").clone();
    let publish = spans
        .iter()
        .find(|sp| sp.name == "publisher.publish" && sp.attribute("event_id") == Some(&event_id))
        .unwrap_or_else(|| panic!("the publisher's span for {event_id}: {spans:?}"));
    let trace: Vec<&CapturedSpan> = spans
        .iter()
        .filter(|sp| sp.trace_id == publish.trace_id)
        .collect();
    let services: BTreeSet<&str> = trace.iter().map(|sp| sp.service.as_str()).collect();
    assert_eq!(services, BTreeSet::from(SERVICES), "{trace:#?}");
    let by_id: HashMap<&str, &CapturedSpan> =
        trace.iter().map(|sp| (sp.span_id.as_str(), *sp)).collect();
    let roots: Vec<&&CapturedSpan> = trace
        .iter()
        .filter(|sp| sp.parent_span_id.is_empty())
        .collect();
    assert_eq!(roots.len(), 1, "one root: {roots:#?}");
    assert_eq!(
        (roots[0].service.as_str(), roots[0].name.as_str()),
        ("threadline-gateway", "http.request")
    );
    for sp in &trace {
        if !sp.parent_span_id.is_empty() {
            assert!(
                by_id.contains_key(sp.parent_span_id.as_str()),
                "{} of {} has a parent outside the trace",
                sp.name,
                sp.service
            );
        }
    }
    // Walk up from the Slack post to the request: the links are the right ones.
    let post = trace
        .iter()
        .find(|sp| sp.name == "slack.api" && sp.attribute("method") == Some("chat.postMessage"))
        .unwrap_or_else(|| panic!("the chat.postMessage span: {trace:#?}"));
    assert_eq!(post.attribute("outcome"), Some("ok"));
    let mut chain = vec![(post.service.clone(), post.name.clone())];
    let mut at = *post;
    while let Some(parent) = by_id.get(at.parent_span_id.as_str()) {
        chain.push((parent.service.clone(), parent.name.clone()));
        at = parent;
    }
    let chain_services: Vec<&str> = chain.iter().map(|c| c.0.as_str()).collect();
    for service in SERVICES {
        assert!(
            chain_services.contains(&service),
            "the post's ancestry passes through {service}: {chain:?}"
        );
    }
    assert!(
        trace
            .iter()
            .any(|sp| sp.name == "model.call" && sp.service == "threadline-inference"),
        "the model call is a span"
    );
    // Ids and outcomes only.
    let attributes: String = spans
        .iter()
        .flat_map(|sp| sp.attributes.iter().cloned())
        .collect::<Vec<_>>()
        .join("\n");
    for needle in [marker, planted, token.as_str(), user.as_str()] {
        assert!(
            !attributes.contains(needle),
            "a span attribute holds {needle}"
        );
    }
    assert!(
        !attributes.contains(&channel),
        "span attributes name no channel"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_only_what_is_past_retention() {
    let db = threadline_testkit::TestDb::new().await;
    let inst = uuid::Uuid::now_v7();
    for age in [DAY * 500, DAY * 10] {
        threadline_store::testing::audit::insert_intake_accepted_ago(&db.pool, age)
            .await
            .expect("audit");
    }
    for (event, age) in [("EvOLD", DAY * 40), ("EvNEW", HOUR)] {
        threadline_store::testing::receipts::insert_updated_ago(
            &db.pool,
            uuid::Uuid::now_v7(),
            inst,
            event,
            "done",
            age,
        )
        .await
        .expect("receipt");
    }
    threadline_store::testing::receipts::insert_updated_ago(
        &db.pool,
        uuid::Uuid::now_v7(),
        inst,
        "EvOPEN",
        "processing",
        DAY * 40,
    )
    .await
    .expect("open receipt");
    for (root, age) in [("100.000001", DAY * 40), ("200.000001", DAY)] {
        threadline_store::testing::threads::insert_thread_updated_ago(&db.pool, inst, root, age)
            .await
            .expect("thread");
        for ts in [root.to_owned(), root.replace("000001", "000002")] {
            let inserted = threadline_store::testing::threads::insert_user_message(
                &db.pool, inst, "C1", &ts, root, "words",
            )
            .await
            .expect("message");
            assert!(inserted, "a new message");
        }
    }
    // Assistant-pane threads: one whose thread goes, one whose thread is
    // still in use (kept however old its row), one with no thread left,
    // one recent.
    for (root, age) in [
        ("100.000001", DAY * 40),
        ("200.000001", DAY * 40),
        ("300.000001", DAY * 40),
        ("400.000001", DAY),
    ] {
        threadline_store::testing::assistant::insert_updated_ago(&db.pool, inst, "C1", root, age)
            .await
            .expect("assistant thread");
    }
    // Budget records: token counts a day (kept as long as the audit log),
    // over-budget notes (one whose thread is still in use, one whose
    // thread is gone, one recent).
    for days in [500, 10] {
        threadline_store::testing::budgets::insert_tokens_days_ago(&db.pool, inst, days, 1000)
            .await
            .expect("tokens");
    }
    for (root, age) in [
        ("200.000001", DAY * 40),
        ("300.000001", DAY * 40),
        ("400.000001", DAY),
    ] {
        threadline_store::testing::budgets::insert_note_ago(&db.pool, inst, root, age)
            .await
            .expect("note");
    }
    // Agent Messaging tabs: one idle past the threads' retention, one recent.
    for (channel, age) in [("D0OLDTAB", DAY * 40), ("D0NEWTAB", DAY)] {
        threadline_store::testing::agent_view::insert_ago(&db.pool, inst, channel, age)
            .await
            .expect("agent view");
    }
    // Verdicts on answers: one past the threads' retention, one recent.
    for (user, age) in [("U0OLD", DAY * 40), ("U0NEW", DAY)] {
        threadline_store::testing::feedback::insert_ago(&db.pool, inst, user, age)
            .await
            .expect("verdict");
    }
    let env = [("DATABASE_URL", db.url.clone())];
    let counts = |out: &std::process::Output| -> Value {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("a JSON report")
    };
    let remaining = || async {
        let r = threadline_store::testing::audit::retained(&db.pool)
            .await
            .expect("counts");
        (r.audit_records, r.receipts, r.threads, r.thread_messages)
    };

    let dry = counts(&cli(&["purge", "--dry-run"], &env).await);
    assert_eq!(
        (
            &dry["audit_records"],
            &dry["receipts"],
            &dry["threads"],
            &dry["thread_messages"]
        ),
        (
            &Value::from(1),
            &Value::from(1),
            &Value::from(1),
            &Value::from(2)
        ),
        "{dry}"
    );
    assert_eq!(remaining().await, (2, 3, 2, 4), "a dry run deletes nothing");

    let done = counts(&cli(&["purge"], &env).await);
    assert_eq!(done["audit_records"], 1, "{done}");
    assert_eq!(
        remaining().await,
        (1, 2, 1, 2),
        "only what is past retention"
    );
    let kept: Vec<String> = threadline_store::testing::receipts::event_ids(&db.pool)
        .await
        .expect("kept");
    assert_eq!(kept, ["EvNEW", "EvOPEN"], "unfinished work is never purged");
    assert_eq!(done["assistant_threads"], 2, "{done}");
    assert_eq!(done["budget_records"], 2, "{done}");
    assert_eq!(done["feedback_records"], 1, "{done}");
    assert_eq!(done["agent_views"], 1, "{done}");
    assert_eq!(
        threadline_store::testing::agent_view::channels(&db.pool)
            .await
            .expect("agent views"),
        ["D0NEWTAB"],
        "a tab in use is kept"
    );
    let left: Vec<String> = threadline_store::testing::feedback::verdicts(&db.pool)
        .await
        .expect("verdicts")
        .into_iter()
        .map(|(_, u, _)| u)
        .collect();
    assert_eq!(left, ["U0NEW"], "a recent verdict is kept");
    assert_eq!(
        threadline_store::testing::budgets::retained(&db.pool)
            .await
            .expect("budget records"),
        (1, vec!["200.000001".to_owned(), "400.000001".to_owned()]),
        "a day's tokens within the audit retention, and the notes of a thread in use or recent, are kept"
    );
    assert_eq!(
        threadline_store::testing::assistant::thread_roots(&db.pool)
            .await
            .expect("assistant threads"),
        ["200.000001", "400.000001"],
        "a pane thread still in use, or recent, is kept"
    );

    // Retention shorter than Slack's retry window is refused.
    let out = cli(&["purge", "--receipts-days", "0"], &env).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("THREADLINE_RECEIPT_RETENTION_DAYS"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The statements that write an event's type into the audit log (intake,
/// relay, context, late events) and the records written from Rust cut it
/// to the same short token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_logs_event_type_is_one_token_in_sql_and_in_rust() {
    let db = threadline_testkit::TestDb::new().await;
    let long = "x".repeat(100);
    for t in [
        "app_mention",
        "message",
        "Bad thing: <@U1> said \"hi\"",
        "app_home_opened.v2:x-y",
        "ümlaut_événement",
        "KELVIN_\u{212A}_İ_ÉVÉNEMENT",
        long.as_str(),
        "",
    ] {
        let sql = threadline_store::testing::audit::audit_event_type(&db.pool, t)
            .await
            .expect("audit_event_type");
        assert_eq!(sql, threadline_store::audit::sanitise_code(t), "{t:?}");
    }
}
