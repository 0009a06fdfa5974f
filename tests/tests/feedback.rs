//! Feedback on answers, judged from Slack's side: every answer (posted
//! whole or streamed) carries Slack's feedback buttons (a `context_actions`
//! block with `feedback_buttons`), a stream ended early does not, and a
//! person's click on them (slack-sim's `block_actions`, signed, at the
//! gateway's interactivity URL) is recorded for that answer's decision with
//! each person's latest click winning; `threadline feedback export` prints
//! the verdicts without text. The services run as processes; slack-sim's
//! messages, call log and interaction log say what happened.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use threadline_domain::feedback::{FEEDBACK_ACTION, carries_buttons};
use threadline_testkit::eventually;
use threadline_tests::{Stack, cli, first_installation, ok_calls, sim_ctl, sim_get, streaming};

const CHANGED: &str = "_The thread changed while I was answering, so I stopped here. I'm reconsidering with the new messages._";

/// Clicks reach the gateway's interactivity endpoint.
async fn interactive(s: &Stack) {
    let gateway = s.services[0].base_url.clone();
    sim_ctl(
        &s.sim,
        &format!("apps/{}/interactivity", s.app),
        json!({"url": format!("{gateway}/slack/interactions")}),
    )
    .await;
}

async fn person(s: &Stack, name: &str) -> String {
    sim_ctl(&s.sim, "users", json!({"team_id": s.team, "name": name})).await["id"]
        .as_str()
        .expect("user id")
        .to_owned()
}

/// The decision an answer's feedback buttons name (Slack's side: the
/// positive button's value), checking the block's shape on the way.
fn decision_of(answer: &Value) -> String {
    let blocks = answer["blocks"].as_array().expect("blocks");
    assert!(
        blocks.iter().any(|b| b["type"] == "context"),
        "labelled: {answer:#}"
    );
    let fb = blocks
        .iter()
        .find(|b| b["type"] == "context_actions")
        .unwrap_or_else(|| panic!("feedback buttons on the answer: {answer:#}"));
    let e = &fb["elements"][0];
    assert_eq!(e["type"], "feedback_buttons");
    assert_eq!(e["action_id"], FEEDBACK_ACTION);
    let positive = e["positive_button"]["value"].as_str().expect("value");
    let negative = e["negative_button"]["value"].as_str().expect("value");
    let decision = positive
        .strip_prefix("positive:")
        .expect("positive:<decision>");
    assert_eq!(negative, format!("negative:{decision}"));
    decision.to_owned()
}

/// `user` presses one of the feedback buttons of message `ts`: the
/// interaction log's entry (Slack's side).
async fn click(s: &Stack, user: &str, ts: &str, button: &str) -> Value {
    let entry = sim_ctl(
        &s.sim,
        "act/click",
        json!({"user": user, "channel": s.channel, "ts": ts, "action_id": FEEDBACK_ACTION,
               "button": button}),
    )
    .await;
    assert_eq!(entry["status"], 200, "the gateway took the click: {entry}");
    assert_eq!(
        entry["value"]
            .as_str()
            .map(|v| v.starts_with(&format!("{button}:"))),
        Some(true),
        "the pressed button's value: {entry}"
    );
    entry
}

async fn export(s: &Stack, args: &[&str]) -> Vec<Value> {
    let env = vec![
        ("DATABASE_URL", s.db.url.clone()),
        ("NATS_URL", threadline_testkit::nats_url()),
        ("THREADLINE_BUS_PREFIX", s.prefix.clone()),
    ];
    let mut all = vec!["feedback", "export"];
    all.extend_from_slice(args);
    let out = cli(&all, &env).await;
    assert!(
        out.status.success(),
        "threadline {all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a JSON line ({e}): {l}")))
        .collect()
}

/// The (decision, verdict) of every exported line, with its shape checked.
fn verdicts(lines: &[Value]) -> Vec<(String, String)> {
    lines
        .iter()
        .map(|l| {
            let keys: BTreeSet<&str> = l
                .as_object()
                .expect("an object")
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(
                keys,
                BTreeSet::from([
                    "decision",
                    "model",
                    "thread_version",
                    "labels",
                    "verdict",
                    "time"
                ]),
                "{l}"
            );
            (
                l["decision"].as_str().expect("decision").to_owned(),
                l["verdict"].as_str().expect("verdict").to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_persons_latest_click_on_an_answer_is_its_verdict() {
    let s = Stack::start(&[]).await;
    interactive(&s).await;
    let bo = person(&s, "bo").await;
    let q = s
        .post(
            &format!("<@{}> why does the deploy fail?", s.bot_user),
            None,
        )
        .await;
    let a = s.wait_answers(&q, 1).await;
    assert_eq!(a.len(), 1, "{a:#?}");
    let (first_ts, first) = (
        a[0]["ts"].as_str().expect("ts").to_owned(),
        decision_of(&a[0]),
    );

    // A person's toggles (their latest click wins) and a second person.
    click(&s, &s.user, &first_ts, "positive").await;
    click(&s, &s.user, &first_ts, "negative").await;
    click(&s, &bo, &first_ts, "positive").await;
    // A newer question in the thread gets its own answer, with buttons
    // naming its own decision; a click on the older answer still counts
    // for the older answer's decision.
    s.post(&format!("<@{}> and only on Mondays?", s.bot_user), Some(&q))
        .await;
    let a = s.wait_answers(&q, 2).await;
    assert_eq!(a.len(), 2, "{a:#?}");
    let (second_ts, second) = (
        a[1]["ts"].as_str().expect("ts").to_owned(),
        decision_of(&a[1]),
    );
    assert_ne!(first, second, "each answer names its own decision");
    click(&s, &bo, &first_ts, "negative").await;
    click(&s, &s.user, &second_ts, "positive").await;

    // Signed clicks Slack did not make from these buttons: a click of ana
    // older than her latest (arriving late) changes nothing; a decision's
    // buttons on a message that is not its answer (the question, the
    // other answer) count for nothing.
    let signed = |message_ts: String, value: String, action_ts: &'static str| {
        let payload = json!({"type": "block_actions", "api_app_id": s.app,
            "team": {"id": s.team, "domain": "acme"}, "user": {"id": s.user, "team_id": s.team},
            "container": {"type": "message", "channel_id": s.channel, "message_ts": message_ts},
            "actions": [{"action_id": FEEDBACK_ACTION, "block_id": "b", "value": value,
                         "type": "feedback_buttons", "action_ts": action_ts,
                         "text": {"type": "plain_text", "text": "x"}}]});
        let gateway = format!("{}/slack/interactions", s.services[0].base_url);
        async move {
            let body = serde_urlencoded::to_string([("payload", payload.to_string())]).unwrap();
            let (ts, sig) = threadline_testkit::slack::signature(
                threadline_testkit::slack::TEST_SECRET,
                threadline_testkit::slack::now_unix(),
                body.as_bytes(),
            );
            reqwest::Client::new()
                .post(gateway)
                .header("content-type", "application/x-www-form-urlencoded")
                .header("x-slack-request-timestamp", ts)
                .header("x-slack-signature", sig)
                .body(body)
                .send()
                .await
                .expect("gateway")
                .status()
                .as_u16()
        }
    };
    let (p1, n2) = (format!("positive:{first}"), format!("negative:{second}"));
    assert_eq!(
        signed(first_ts.clone(), p1.clone(), "1000000000.000001").await,
        200
    );
    assert_eq!(signed(q.clone(), p1, "9999999999.000001").await, 200);
    assert_eq!(signed(first_ts.clone(), n2, "9999999999.000002").await, 200);

    // Slack's side: every click went out once, as feedback_buttons.
    let log = sim_get(&s.sim, "interactions").await["interactions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(log.len(), 5, "{log:#?}");

    // The export: one line per person and answer, their latest verdict.
    let lines = export(&s, &[]).await;
    let got: BTreeSet<(String, String)> = verdicts(&lines).into_iter().collect();
    let want = BTreeSet::from([
        (first.clone(), "negative".to_owned()),
        (second.clone(), "positive".to_owned()),
    ]);
    assert_eq!(got, want, "{lines:#?}");
    assert_eq!(
        lines.len(),
        3,
        "ana and bo on the first, ana on the second: {lines:#?}"
    );
    for l in &lines {
        assert_eq!(l["labels"], json!(["posted"]), "{l}");
        assert!(l["thread_version"].as_i64().is_some_and(|v| v > 0), "{l}");
        assert!(l["model"].is_string(), "{l}");
    }
    let text = serde_json::to_string(&lines).expect("json");
    for said in ["deploy", "Mondays", "Answering"] {
        assert!(!text.contains(said), "no text in the export: {text}");
    }
    let inst = first_installation(&s).await;
    assert_eq!(export(&s, &["--installation", &inst]).await.len(), 3);
    assert_eq!(
        export(&s, &["--installation", &uuid::Uuid::now_v7().to_string()])
            .await
            .len(),
        0
    );
    assert_eq!(
        export(&s, &["--since", "2999-01-01T00:00:00Z"]).await.len(),
        0
    );

    // The audit log holds each counted click, content-free.
    let records = threadline_store::testing::audit::feedback_records(&s.db.pool)
        .await
        .expect("audit");
    let outcomes: Vec<&str> = records.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(
        outcomes,
        ["positive", "negative", "positive", "negative", "positive"],
        "{records:?}"
    );
    assert!(records.iter().all(|r| r.0.is_some() && !r.2), "{records:?}");
    // And the gateway counts them by verdict.
    let metrics = s.metrics().await;
    for line in [
        "threadline_feedback_total{verdict=\"positive\"} 3",
        "threadline_feedback_total{verdict=\"negative\"} 2",
        "threadline_feedback_clicks_total{outcome=\"counted\"} 5",
        "threadline_feedback_clicks_total{outcome=\"outdated\"} 1",
        "threadline_feedback_clicks_total{outcome=\"not_the_answer\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_gets_its_buttons_with_its_stop_and_a_stream_ended_early_none() {
    let s = Stack::start(&streaming(
        150,
        &[
            ("THREADLINE_SLACK_TIMEOUT_MS", "800"),
            ("THREADLINE_SWEEP_MS", "500"),
        ],
    ))
    .await;
    interactive(&s).await;
    // A stream whose thread changes ends early with its closing line, and
    // one whole answer follows.
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
    s.wait_answers(&q, 2).await;
    let answers = eventually(
        "the ended stream and its answer",
        Duration::from_secs(30),
        || async {
            let a = s.answers(&q).await;
            (a.len() == 2 && a.iter().all(|m| m["streaming_state"] != "in_progress")).then_some(a)
        },
    )
    .await;
    let ended = &answers[0];
    assert!(
        ended["text"].as_str().expect("text").ends_with(CHANGED),
        "{ended:#}"
    );
    assert!(
        !carries_buttons(&ended["blocks"]),
        "a stream ended early answered nothing: no buttons ({ended:#})"
    );
    let whole = decision_of(&answers[1]);

    // A question answered by one stream: the buttons come with its stop.
    let q2 = s
        .post(&format!("<@{}> what does the queue do?", s.bot_user), None)
        .await;
    let streamed = eventually("the stream stopped", Duration::from_secs(30), || async {
        let a = s.answers(&q2).await;
        (a.len() == 1 && a[0]["streaming_state"] == "completed").then(|| a[0].clone())
    })
    .await;
    let streamed_ts = streamed["ts"].as_str().expect("ts").to_owned();
    let decision = decision_of(&streamed);
    let stops: Vec<Value> = ok_calls(&s.sim, "chat.stopStream")
        .await
        .into_iter()
        .filter(|c| c["ts"] == streamed_ts.as_str())
        .collect();
    assert_eq!(stops.len(), 1, "one stop: {stops:#?}");

    click(&s, &s.user, &streamed_ts, "negative").await;
    click(
        &s,
        &s.user,
        answers[1]["ts"].as_str().expect("ts"),
        "positive",
    )
    .await;
    let lines = export(&s, &[]).await;
    let got: BTreeSet<(String, String)> = verdicts(&lines).into_iter().collect();
    assert_eq!(
        got,
        BTreeSet::from([
            (decision.clone(), "negative".to_owned()),
            (whole, "positive".to_owned()),
        ])
    );
    let of_stream = lines
        .iter()
        .find(|l| l["decision"] == decision.as_str())
        .expect("the stream's line");
    assert_eq!(of_stream["labels"], json!(["streamed"]), "{of_stream}");
    s.stop().await;
}
