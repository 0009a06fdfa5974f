//! The oracle that judges runs from Slack's side is itself tested: a bot
//! played by hand (no threadline) answers in the built-in model's format,
//! and each of the oracle's checks must catch the breach it exists for,
//! and nothing else. Deliveries are acknowledged by a small receiver.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use threadline_domain::reply::{self, Shown};
use threadline_store::testing::{decisions, threads};
use threadline_testkit::eventually;
use threadline_testkit::sim::SimWorkspace;
use threadline_tests::oracle::{self, Scope, ScopeKind, digest};
use threadline_tests::spawn_slack_sim;

const GRACE: Duration = Duration::from_millis(300);

/// An Events API receiver that answers 200, or 503 while `refusing`.
async fn receiver(refusing: Arc<AtomicBool>) -> String {
    let app = axum::Router::new().route(
        "/events",
        axum::routing::post(move || {
            let refusing = refusing.clone();
            async move {
                if refusing.load(Ordering::SeqCst) {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                } else {
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/events", l.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

struct World {
    ws: SimWorkspace,
    refusing: Arc<AtomicBool>,
    _sim: threadline_tests::Proc,
}

impl World {
    async fn new() -> Self {
        Self::with_app(
            &["app_mention", "message.channels"],
            &["chat:write", "channels:history"],
        )
        .await
    }

    /// A world whose app hears `events` and is installed with `scopes`.
    async fn with_app(events: &[&str], scopes: &[&str]) -> Self {
        let sim = spawn_slack_sim(5, 0.01).await;
        let refusing = Arc::new(AtomicBool::new(false));
        let url = receiver(refusing.clone()).await;
        let ws = SimWorkspace::create(
            &sim.base_url,
            json!({"request_urls": [url], "events": events}),
            scopes,
            None,
        )
        .await;
        Self {
            ws,
            refusing,
            _sim: sim,
        }
    }

    fn scope(&self) -> Vec<Scope> {
        vec![Scope::mentions(&self.ws.channel, &self.ws.bot_user())]
    }

    async fn ask(&self, text: &str, thread: Option<&str>) -> String {
        let ts = self.ws.post(text, thread).await;
        self.acked(&ts).await;
        ts
    }

    /// Waits until a delivery about `ts` (of `subtype`, if given) has an outcome.
    async fn acked(&self, ts: &str) {
        self.delivered(ts, None).await;
    }

    async fn delivered(&self, ts: &str, subtype: Option<&str>) {
        self.delivered_in(&self.ws.channel, ts, subtype).await;
    }

    async fn delivered_in(&self, channel: &str, ts: &str, subtype: Option<&str>) {
        eventually(
            "the deliveries answered",
            Duration::from_secs(10),
            || async {
                let d = self.ws.get(&format!("deliveries?channel={channel}")).await;
                let any = d["deliveries"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .any(|x| x["message_ts"] == ts && x["subtype"].as_str() == subtype);
                any.then_some(())
            },
        )
        .await;
    }

    /// The bot answers `question` in `thread`, saying it read `read`
    /// (each with the digest of `text`).
    async fn answer(&self, thread: &str, question: &str, read: &[(&str, &str)]) -> String {
        let read: Vec<String> = read
            .iter()
            .map(|(ts, text)| format!("{ts}/{}", digest(text)))
            .collect();
        let text = format!("an answer\nAnswering {question}; read {}", read.join(" "));
        let blocks = labelled("an answer").to_string();
        let r: Value = self
            .ws
            .http
            .post(format!("{}/api/chat.postMessage", self.ws.base))
            .bearer_auth(self.ws.token())
            .form(&[
                ("channel", self.ws.channel.as_str()),
                ("thread_ts", thread),
                ("text", text.as_str()),
                ("blocks", blocks.as_str()),
            ])
            .send()
            .await
            .expect("post")
            .json()
            .await
            .expect("json");
        r["ts"].as_str().expect("posted").to_owned()
    }

    async fn judge(&self) -> oracle::Judgement {
        oracle::judge(&self.ws.base, &self.ws.app_id(), &self.scope(), GRACE).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_answer_passes_and_a_second_answer_to_one_question_is_caught() {
    let w = World::new().await;
    let q_text = format!("<@{}> is the build green?", w.ws.bot_user());
    let q = w.ask(&q_text, None).await;
    let plain = w.ask("more context", Some(&q)).await;
    w.answer(&q, &q, &[(&q, &q_text), (&plain, "more context")])
        .await;
    let j = w.judge().await;
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    assert_eq!((j.questions, j.answered, j.replies), (1, 1, 1));

    w.answer(&q, &q, &[(&q, &q_text), (&plain, "more context")])
        .await;
    let j = w.judge().await;
    assert_eq!(j.violations.len(), 1, "{:?}", j.violations);
    assert!(j.violations[0].0 == "duplicate_reply", "{:?}", j.violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_missed_a_delivered_message_is_caught_and_one_crossed_in_flight_is_not() {
    let w = World::new().await;
    let q_text = format!("<@{}> deploy now?", w.ws.bot_user());
    let q = w.ask(&q_text, None).await;
    let late = w.ask("wait, not yet", Some(&q)).await;
    tokio::time::sleep(GRACE * 2).await;
    // The reply did not read a message delivered well before it was posted.
    w.answer(&q, &q, &[(&q, &q_text)]).await;
    let j = w.judge().await;
    assert_eq!(j.violations.len(), 1, "{:?}", j.violations);
    assert_eq!(j.violations[0].0, "missed_message");
    assert!(
        j.violations[0]
            .1
            .contains(&format!("missed message {late}")),
        "{:?}",
        j.violations
    );

    // A person replies at the moment the next post arrives: crossed in
    // flight, which is no violation but is reported for reconsideration.
    let w = World::new().await;
    let q = w.ask(&q_text, None).await;
    w.ws.ctl(
        "faults",
        json!({"method": "chat.postMessage", "mode": "inject_reply", "user": w.ws.user,
                   "text": "actually, hold on", "latency_ms": 100}),
    )
    .await;
    let reply = w.answer(&q, &q, &[(&q, &q_text)]).await;
    let j = w.judge().await;
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    assert_eq!(j.crossed.len(), 1);
    assert_eq!(j.crossed[0].reply_ts, reply);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_text_the_message_never_had_is_caught_and_an_edit_before_the_post_is_not() {
    let w = World::new().await;
    let q_text = format!("<@{}> what broke?", w.ws.bot_user());
    let q = w.ask(&q_text, None).await;
    w.ws
        .ctl(
            "act/edit",
            json!({"user": w.ws.user, "channel": w.ws.channel, "ts": q, "text": format!("{q_text} (edited)")}),
        )
        .await;
    w.answer(&q, &q, &[(&q, &format!("{q_text} (edited)"))])
        .await;
    assert!(w.judge().await.violations.is_empty());
    w.answer(&q, &q, &[(&q, "words nobody wrote")]).await;
    let j = w.judge().await;
    assert!(
        j.violations.iter().any(|v| v.0 == "text_never_had"),
        "{:?}",
        j.violations
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_questions_are_explained_by_slack_or_left_for_the_operator_record() {
    let w = World::new().await;
    let bot = w.ws.bot_user();
    // Answered together with a later question: explained.
    let q1_text = format!("<@{bot}> one?");
    let q1 = w.ask(&q1_text, None).await;
    let q2_text = format!("<@{bot}> and two?");
    let q2 = w.ask(&q2_text, Some(&q1)).await;
    w.answer(&q1, &q2, &[(&q1, &q1_text), (&q2, &q2_text)])
        .await;
    // Deleted: explained.
    let q3 = w.ask(&format!("<@{bot}> three?"), None).await;
    w.ws.ctl("act/delete", json!({"channel": w.ws.channel, "ts": q3}))
        .await;
    // Never acknowledged (the app answered 503 to every attempt): explained.
    w.refusing.store(true, Ordering::SeqCst);
    let q4 = w.ws.post(&format!("<@{bot}> four?"), None).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    w.refusing.store(false, Ordering::SeqCst);
    // Acknowledged, then nothing: unexplained by Slack.
    let q5 = w.ask(&format!("<@{bot}> five?"), None).await;
    let j = w.judge().await;
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    assert_eq!((j.questions, j.answered), (5, 1));
    assert_eq!(j.explained.get("answered_with_a_later_question"), Some(&1));
    assert_eq!(j.explained.get("deleted"), Some(&1));
    assert_eq!(j.explained.get("never_acknowledged"), Some(&1), "{q4}");
    assert_eq!(
        j.unexplained
            .iter()
            .map(|q| q.ts.clone())
            .collect::<Vec<_>>(),
        vec![q5]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_to_a_question_whose_deletion_was_delivered_is_caught() {
    let w = World::new().await;
    let q_text = format!("<@{}> drop the table?", w.ws.bot_user());
    let q = w.ask(&q_text, None).await;
    w.ws.ctl("act/delete", json!({"channel": w.ws.channel, "ts": q}))
        .await;
    w.delivered(&q, Some("message_deleted")).await;
    tokio::time::sleep(GRACE * 2).await;
    w.answer(&q, &q, &[(&q, &q_text)]).await;
    let j = w.judge().await;
    assert!(
        j.violations
            .iter()
            .any(|v| v.0 == "answered_deleted_question"),
        "{:?}",
        j.violations
    );
    // And a reply that states nothing cannot be judged: that is reported.
    let r: Value =
        w.ws.http
            .post(format!("{}/api/chat.postMessage", w.ws.base))
            .bearer_auth(w.ws.token())
            .form(&[("channel", w.ws.channel.as_str()), ("text", "hello")])
            .send()
            .await
            .expect("post")
            .json()
            .await
            .expect("json");
    assert_eq!(r["ok"], true);
    let j = w.judge().await;
    assert!(
        j.violations.iter().any(|v| v.0 == "unattributed_reply"),
        "{:?}",
        j.violations
    );
    // It carries no AI label either: that is reported too.
    assert!(
        j.violations.iter().any(|v| v.0 == "unlabelled_reply"),
        "{:?}",
        j.violations
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_read_a_text_an_acknowledged_edit_replaced_or_a_deleted_message_is_caught() {
    let w = World::new().await;
    let q_text = format!("<@{}> status?", w.ws.bot_user());
    let q = w.ask(&q_text, None).await;
    let detail = w.ask("it was fine at noon", Some(&q)).await;
    w.ws
        .ctl(
            "act/edit",
            json!({"user": w.ws.user, "channel": w.ws.channel, "ts": detail, "text": "it broke at noon"}),
        )
        .await;
    w.delivered(&detail, Some("message_changed")).await;
    tokio::time::sleep(GRACE * 2).await;
    // Read the text from before an edit threadline had well before the post.
    w.answer(&q, &q, &[(&q, &q_text), (&detail, "it was fine at noon")])
        .await;
    let j = w.judge().await;
    assert_eq!(
        j.violations.iter().map(|v| v.0).collect::<Vec<_>>(),
        ["read_outdated_text"],
        "{:?}",
        j.violations
    );

    let w = World::new().await;
    let q = w.ask(&q_text, None).await;
    let gone = w.ask("ignore this", Some(&q)).await;
    w.ws.ctl("act/delete", json!({"channel": w.ws.channel, "ts": gone}))
        .await;
    w.delivered(&gone, Some("message_deleted")).await;
    tokio::time::sleep(GRACE * 2).await;
    w.answer(&q, &q, &[(&q, &q_text), (&gone, "ignore this")])
        .await;
    let j = w.judge().await;
    assert_eq!(
        j.violations.iter().map(|v| v.0).collect::<Vec<_>>(),
        ["read_deleted_message"],
        "{:?}",
        j.violations
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_posted_outside_its_questions_thread_is_caught() {
    let w = World::new().await;
    let bot = w.ws.bot_user();
    let q_text = format!("<@{bot}> where?");
    let q = w.ask(&q_text, None).await;
    let other = w.ask(&format!("<@{bot}> another thread"), None).await;
    w.answer(&other, &q, &[(&q, &q_text)]).await;
    let j = w.judge().await;
    assert!(
        j.violations.iter().any(|v| v.0 == "reply_outside_thread"),
        "{:?}",
        j.violations
    );
}

/// What Slack cannot show is checked in threadline's records, and those
/// checks catch their breach too: a crossing the oracle saw that
/// threadline did not record, or did not reconsider, and a question with no
/// reply and no reason an operator can see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_checks_catch_unrecorded_crossings_and_unexplained_questions() {
    let db = threadline_testkit::TestDb::new().await;
    let j = oracle::Judgement {
        crossed: vec![
            oracle::Crossed {
                channel: "C1".into(),
                reply_ts: "10.000002".into(),
                crossing_ts: "10.000001".into(),
            },
            oracle::Crossed {
                channel: "C1".into(),
                reply_ts: "20.000002".into(),
                crossing_ts: "20.000001".into(),
            },
        ],
        unexplained: vec![
            oracle::Question {
                channel: "C1".into(),
                thread_ts: "30.000001".into(),
                ts: "30.000001".into(),
            },
            oracle::Question {
                channel: "C1".into(),
                thread_ts: "40.000001".into(),
                ts: "40.000001".into(),
            },
        ],
        ..Default::default()
    };
    let kinds = |v: Vec<(&'static str, String)>| v.into_iter().map(|x| x.0).collect::<Vec<_>>();
    assert_eq!(
        kinds(threadline_tests::explain_from_records(&db.pool, &j).await),
        [
            "crossed_not_recorded",
            "crossed_not_recorded",
            "unexplained_question",
            "unexplained_question"
        ]
    );
    // Recorded (one reconsidered), and one question explained by a kill
    // switch; a question merely superseded is not explained.
    let (inst, intent) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    for (intent_id, ts, reconsideration) in [
        (intent, "10", Some("no_reply_needed")),
        (uuid::Uuid::now_v7(), "20", None),
    ] {
        threads::insert_crossed_answer(
            &db.pool,
            &threads::CrossedAnswerRow {
                intent_id,
                installation_id: inst,
                channel_id: "C1",
                root_ts: &format!("{ts}.000000"),
                reply_ts: &format!("{ts}.000002"),
                crossing_ts: &format!("{ts}.000001"),
                detected_by: "publisher",
                reconsideration,
            },
        )
        .await
        .expect("crossings");
    }
    for (ts, status, reason) in [
        ("30.000001", "suppressed", "global"),
        ("40.000001", "superseded", "newer_trigger"),
    ] {
        decisions::insert_decision_with_status(
            &db.pool,
            &decisions::DecisionRow {
                id: uuid::Uuid::now_v7(),
                receipt_id: uuid::Uuid::now_v7(),
                installation_id: inst,
                event_id: &format!("Ev{}", &ts[..2]),
                channel_id: "C1",
                ts,
                thread_version: 1,
                status,
                status_reason: Some(reason),
            },
        )
        .await
        .expect("decision");
    }
    let v = threadline_tests::explain_from_records(&db.pool, &j).await;
    assert_eq!(
        kinds(v.clone()),
        ["crossed_not_reconsidered", "unexplained_question"],
        "{v:?}"
    );
    assert!(v[1].1.contains("40.000001"), "{v:?}");
    let r = threadline_tests::records_verdict(&db.pool, &j).await;
    assert_eq!(
        r.reasons
            .iter()
            .map(|(q, why)| (q.ts.as_str(), why.as_str()))
            .collect::<Vec<_>>(),
        [("30.000001", "decision suppressed:global")],
        "the reason an operator sees, for each question the records explain"
    );

    // A thread's latest answer, which would have answered its two earlier
    // questions too, was rejected: the earlier ones are explained by the
    // nearest later question's reason, a question after them all is not.
    let thread = |ts: &str| oracle::Question {
        channel: "C1".into(),
        thread_ts: "50.000001".into(),
        ts: ts.into(),
    };
    let j = oracle::Judgement {
        unexplained: vec![
            thread("50.000001"),
            thread("50.000002"),
            thread("50.000003"),
            thread("50.000004"),
        ],
        ..Default::default()
    };
    decisions::insert_decision_with_status(
        &db.pool,
        &decisions::DecisionRow {
            id: uuid::Uuid::now_v7(),
            receipt_id: uuid::Uuid::now_v7(),
            installation_id: inst,
            event_id: "Ev50",
            channel_id: "C1",
            ts: "50.000003",
            thread_version: 1,
            status: "rejected",
            status_reason: Some("reviewer"),
        },
    )
    .await
    .expect("decision");
    let r = threadline_tests::records_verdict(&db.pool, &j).await;
    assert_eq!(
        r.reasons
            .iter()
            .map(|(q, why)| (q.ts.as_str(), why.as_str()))
            .collect::<Vec<_>>(),
        [
            (
                "50.000001",
                "with a later question: decision rejected:reviewer"
            ),
            (
                "50.000002",
                "with a later question: decision rejected:reviewer"
            ),
            ("50.000003", "decision rejected:reviewer"),
        ]
    );
    assert_eq!(
        r.violations.iter().map(|v| v.0).collect::<Vec<_>>(),
        ["unexplained_question"],
        "{:?}",
        r.violations
    );
    assert!(
        r.violations[0].1.contains("50.000004"),
        "{:?}",
        r.violations
    );
    assert_eq!(r.by_reason().values().sum::<usize>(), 3);

    // A top-level question absorbed into a later one of its burst, whose
    // answer went stale when a reply came in its thread; that reply's
    // answer, which would have read the burst too, was rejected: the
    // absorbed question is explained by it, through the question that
    // absorbed it (its own thread has no later question).
    let at = |thread: &str, ts: &str| oracle::Question {
        channel: "C1".into(),
        thread_ts: thread.into(),
        ts: ts.into(),
    };
    let j = oracle::Judgement {
        unexplained: vec![
            at("60.000001", "60.000001"),
            at("61.000001", "61.000001"),
            at("61.000001", "61.000002"),
        ],
        ..Default::default()
    };
    let r = threadline_tests::records_verdict(&db.pool, &j).await;
    assert_eq!(r.violations.len(), 3, "no records yet: {:?}", r.violations);
    threads::insert_absorbed(&db.pool, inst, "C1", "60.000001", "61.000001")
        .await
        .expect("absorbed");
    decisions::insert_decision_with_status(
        &db.pool,
        &decisions::DecisionRow {
            id: uuid::Uuid::now_v7(),
            receipt_id: uuid::Uuid::now_v7(),
            installation_id: inst,
            event_id: "Ev61",
            channel_id: "C1",
            ts: "61.000002",
            thread_version: 2,
            status: "rejected",
            status_reason: Some("reviewer"),
        },
    )
    .await
    .expect("decision");
    let r = threadline_tests::records_verdict(&db.pool, &j).await;
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!(
        r.reasons
            .iter()
            .map(|(q, why)| (q.ts.as_str(), why.as_str()))
            .collect::<Vec<_>>(),
        [
            (
                "60.000001",
                "with a later question: decision rejected:reviewer"
            ),
            (
                "61.000001",
                "with a later question: decision rejected:reviewer"
            ),
            ("61.000002", "decision rejected:reviewer"),
        ]
    );
}

impl World {
    /// A Web API call of the bot (form-encoded), Slack's answer.
    async fn call(&self, method: &str, form: &[(&str, &str)]) -> Value {
        self.ws
            .http
            .post(format!("{}/api/{method}", self.ws.base))
            .bearer_auth(self.ws.token())
            .form(form)
            .send()
            .await
            .expect("call")
            .json()
            .await
            .expect("json")
    }

    /// The bot starts a stream in `thread` showing `first`; its ts.
    async fn start_stream(&self, thread: &str, first: &str) -> String {
        let r = self
            .call(
                "chat.startStream",
                &[
                    ("channel", &self.ws.channel),
                    ("thread_ts", thread),
                    ("recipient_user_id", &self.ws.user),
                    ("recipient_team_id", &self.ws.team),
                ],
            )
            .await;
        let ts = r["ts"]
            .as_str()
            .unwrap_or_else(|| panic!("started: {r}"))
            .to_owned();
        let r = self
            .call(
                "chat.appendStream",
                &[
                    ("channel", &self.ws.channel),
                    ("ts", &ts),
                    ("markdown_text", first),
                ],
            )
            .await;
        assert_eq!(r["ok"], true, "{r}");
        ts
    }

    /// The bot stops stream `ts` with `rest`, labelled as threadline
    /// labels it: with feedback buttons when `rest` finishes the answer,
    /// without when it is a closing line (an italic last line).
    async fn stop_stream(&self, ts: &str, rest: &str) {
        let last = rest.lines().last().unwrap_or_default();
        let shown = if last.len() > 1 && last.starts_with('_') && last.ends_with('_') {
            Shown::Ended {
                label: "AI-generated",
            }
        } else {
            Shown::Stopped {
                label: "AI-generated",
                decision: "d",
            }
        };
        let blocks = reply::blocks(shown).to_string();
        let r = self
            .call(
                "chat.stopStream",
                &[
                    ("channel", &self.ws.channel),
                    ("ts", ts),
                    ("markdown_text", rest),
                    ("blocks", &blocks),
                ],
            )
            .await;
        assert_eq!(r["ok"], true, "{r}");
    }

    async fn judge_streams_within(&self, stream_end: Duration) -> oracle::Judgement {
        oracle::judge_with(
            &self.ws.base,
            &self.ws.app_id(),
            &self.scope(),
            oracle::Limits {
                grace: GRACE,
                stream_end,
                ..Default::default()
            },
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_said_while_a_stream_was_open_is_judged_against_its_stop() {
    let w = World::new().await;
    let q_text = format!("<@{}> why is it slow?", w.ws.bot_user());
    let q = w.ask(&q_text, None).await;
    let ts = w.start_stream(&q, &format!("Answering {q}. Partly ")).await;
    // A person says something while the answer streams, well before it
    // stops; the whole answer does not read it.
    let during = w.ask("it is only slow at night", Some(&q)).await;
    tokio::time::sleep(GRACE * 2).await;
    w.stop_stream(
        &ts,
        &format!(
            "because of the cache.\nAnswering {q}; read {q}/{}",
            digest(&q_text)
        ),
    )
    .await;
    let j = w.judge().await;
    assert_eq!(j.streamed, 1, "{j:?}");
    assert!(
        j.violations
            .iter()
            .any(|v| v.0 == "missed_message" && v.1.contains(&format!("missed message {during}"))),
        "a message said mid-stream is judged against the stop: {:?}",
        j.violations
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_left_open_after_its_thread_changed_and_a_second_stream_are_caught() {
    let w = World::new().await;
    let q_text = format!("<@{}> what failed?", w.ws.bot_user());
    let q = w.ask(&q_text, None).await;
    let first = w.start_stream(&q, &format!("Answering {q}. The ")).await;
    // The thread changes; the stream stays open past the bound.
    w.ask("never mind, found it", Some(&q)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let j = w.judge_streams_within(Duration::from_secs(1)).await;
    let open: Vec<_> = j
        .violations
        .iter()
        .filter(|v| v.0 == "stream_left_open")
        .collect();
    assert!(
        open.iter()
            .any(|v| v.1.contains("after its thread changed")),
        "{:?}",
        j.violations
    );
    // Ended late with a closing line: still late.
    w.stop_stream(
        &first,
        "\n\n_This answer was interrupted before it finished._",
    )
    .await;
    let j = w.judge_streams_within(Duration::from_secs(1)).await;
    assert!(
        j.violations
            .iter()
            .any(|v| v.0 == "stream_left_open" && v.1.contains("ended late")),
        "{:?}",
        j.violations
    );
    // Within a generous bound it is fine, and it answered nothing.
    let j = w.judge_streams_within(Duration::from_secs(60)).await;
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    assert_eq!((j.interrupted, j.streamed), (1, 0));
    // A second stream for the same question is one too many, even ended.
    let second = w.start_stream(&q, &format!("Answering {q}. Again ")).await;
    w.stop_stream(
        &second,
        "\n\n_This answer was interrupted before it finished._",
    )
    .await;
    let j = w.judge_streams_within(Duration::from_secs(60)).await;
    assert!(
        j.violations.iter().any(|v| v.0 == "duplicate_stream"),
        "{:?}",
        j.violations
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slacks_second_delivery_of_a_streamed_question_is_no_change_of_its_thread() {
    let w = World::new().await;
    let root_text = format!("<@{}> a thread?", w.ws.bot_user());
    let root = w.ask(&root_text, None).await;
    let q_text = format!("<@{}> what failed?", w.ws.bot_user());
    let q = w.ask(&q_text, Some(&root)).await;
    let ts = w.start_stream(&root, &format!("Answering {q}. The ")).await;
    // Slack delivers the question again as another message while the
    // answer streams: one action, nothing new to answer.
    let v = threadline_tests::sim_ctl(
        &w._sim,
        "act/double",
        json!({"channel": w.ws.channel, "ts": q}),
    )
    .await;
    let copy = v["ts"].as_str().expect("the copy's ts").to_owned();
    w.acked(&copy).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // (a stream still open when judged is one violation of its own)
    let changed = |j: &oracle::Judgement| {
        j.violations.iter().any(|v| {
            v.0 == "stream_left_open"
                && v.1.contains(&ts)
                && v.1.contains("after its thread changed")
        })
    };
    let j = w.judge_streams_within(Duration::from_secs(1)).await;
    assert!(!changed(&j), "{:?}", j.violations);
    // A person's new message is a change: the stream left open is caught.
    w.ask("never mind, found it", Some(&root)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let j = w.judge_streams_within(Duration::from_secs(1)).await;
    assert!(changed(&j), "{:?}", j.violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_feedback_buttons_and_a_closing_line_with_them_are_caught() {
    let w = World::new().await;
    let bot = w.ws.bot_user();
    let q_text = format!("<@{bot}> why is it slow?");
    let q = w.ask(&q_text, None).await;
    // An answer with its label and no buttons.
    let plain = json!([{"type": "section", "text": {"type": "mrkdwn", "text": "an answer"}},
                       {"type": "context", "elements": [{"type": "mrkdwn", "text": "AI-generated"}]}]);
    let answer = format!("an answer\nAnswering {q}; read {q}/{}", digest(&q_text));
    let a = w.bot_post(&w.ws.channel, Some(&q), &answer, &plain).await;
    let j = w.judge().await;
    assert!(
        caught(
            &j,
            "answer_without_feedback",
            &format!("answer {a} in thread {q}")
        ),
        "{:?}",
        j.violations
    );
    // A stream ended early, stopped with buttons as if it were an answer.
    let q2_text = format!("<@{bot}> what failed?");
    let q2 = w.ask(&q2_text, None).await;
    let ts = w.start_stream(&q2, &format!("Answering {q2}. The ")).await;
    let blocks = reply::blocks(Shown::Stopped {
        label: "AI-generated",
        decision: "d",
    })
    .to_string();
    let r = w
        .call(
            "chat.stopStream",
            &[
                ("channel", &w.ws.channel),
                ("ts", &ts),
                (
                    "markdown_text",
                    "\n\n_This answer was interrupted before it finished._",
                ),
                ("blocks", &blocks),
            ],
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let j = w.judge().await;
    assert!(
        caught(
            &j,
            "feedback_on_no_answer",
            &format!("stream {ts} in thread {q2}")
        ),
        "{:?}",
        j.violations
    );
}

/// Thinking steps are judged: a stream ended early that shows its writing
/// step complete says something untrue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ended_early_whose_writing_step_shows_complete_is_caught() {
    let w = World::new().await;
    let bot = w.ws.bot_user();
    let q_text = format!("<@{bot}> what failed?");
    let q = w.ask(&q_text, None).await;
    // (a stream of chunks throughout: Slack refuses to mix them with
    // markdown_text in one stream)
    let first =
        json!([{"type": "markdown_text", "text": format!("Answering {q}. The ")}]).to_string();
    let r = w
        .call(
            "chat.startStream",
            &[
                ("channel", &w.ws.channel),
                ("thread_ts", &q),
                ("recipient_user_id", &w.ws.user),
                ("recipient_team_id", &w.ws.team),
                ("chunks", &first),
            ],
        )
        .await;
    let ts = r["ts"]
        .as_str()
        .unwrap_or_else(|| panic!("started: {r}"))
        .to_owned();
    let chunks = json!([
        {"type": "markdown_text", "text": "\n\n_This answer was interrupted before it finished._"},
        {"type": "task_update", "id": "threadline_write", "title": "Writing the answer",
         "status": "complete"}])
    .to_string();
    let blocks =
        json!([{"type": "context", "elements": [{"type": "mrkdwn", "text": "AI-generated"}]}])
            .to_string();
    let r = w
        .call(
            "chat.stopStream",
            &[
                ("channel", &w.ws.channel),
                ("ts", &ts),
                ("chunks", &chunks),
                ("blocks", &blocks),
            ],
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let j = w.judge().await;
    assert!(
        caught(
            &j,
            "thinking_step_untrue",
            &format!("reply {ts} in thread {q}: ended early, yet its writing step shows complete")
        ),
        "{:?}",
        j.violations
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_request_is_not_an_answer() {
    let w = World::new().await;
    let q_text = format!("<@{}> delete the branch?", w.ws.bot_user());
    let q = w.ask(&q_text, None).await;
    let blocks = json!([
        {"type": "section", "text": {"type": "mrkdwn", "text": "An answer waits for review"}},
        {"type": "actions", "elements": [
            {"type": "button", "action_id": "approve", "text": {"type": "plain_text", "text": "Approve"}}]},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "AI-generated"}]}])
    .to_string();
    let r = w
        .call(
            "chat.postMessage",
            &[
                ("channel", &w.ws.channel),
                ("text", "An answer waits for review"),
                ("blocks", &blocks),
            ],
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let j = w.judge().await;
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    assert_eq!((j.review_requests, j.replies, j.answered), (1, 0, 0), "{q}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_replies_answer_one_question_each_and_no_more() {
    const FALLBACK: &str = "threadline could not process this request.";
    let w = World::new().await;
    let judge = || async {
        oracle::judge_with(
            &w.ws.base,
            &w.ws.app_id(),
            &w.scope(),
            oracle::Limits {
                grace: GRACE,
                stream_end: Duration::from_secs(60),
                fallback: Some(FALLBACK.to_owned()),
                ..Default::default()
            },
        )
        .await
    };
    let bot = w.ws.bot_user();
    let q1 = w.ask(&format!("<@{bot}> first?"), None).await;
    let _q2 = w.ask(&format!("<@{bot}> second?"), Some(&q1)).await;
    let blocks = labelled(FALLBACK).to_string();
    let fallback = || async {
        let r = w
            .call(
                "chat.postMessage",
                &[
                    ("channel", &w.ws.channel),
                    ("thread_ts", &q1),
                    ("text", &format!("{FALLBACK}\nAI-generated")),
                    ("blocks", &blocks),
                ],
            )
            .await;
        assert_eq!(r["ok"], true, "{r}");
    };
    // One fallback for two questions: one of them is not answered.
    fallback().await;
    let j = judge().await;
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    assert_eq!((j.questions, j.answered, j.unexplained.len()), (2, 1, 1));
    // Two: each answered.
    fallback().await;
    let j = judge().await;
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    assert_eq!((j.questions, j.answered, j.unexplained.len()), (2, 2, 0));
    // Three: one answers nothing.
    fallback().await;
    let j = judge().await;
    assert!(
        j.violations.iter().any(|v| v.0 == "unattributed_reply"),
        "{:?}",
        j.violations
    );
}

impl World {
    /// The bot posts `text` with `blocks` in `channel` (in `thread`); its ts.
    async fn bot_post(
        &self,
        channel: &str,
        thread: Option<&str>,
        text: &str,
        blocks: &Value,
    ) -> String {
        let blocks = blocks.to_string();
        let mut form = vec![
            ("channel", channel),
            ("text", text),
            ("blocks", blocks.as_str()),
        ];
        if let Some(t) = thread {
            form.push(("thread_ts", t));
        }
        let r = self.call("chat.postMessage", &form).await;
        r["ts"]
            .as_str()
            .unwrap_or_else(|| panic!("posted: {r}"))
            .to_owned()
    }

    /// The bot updates its message `ts` to an answer saying `text`,
    /// labelled.
    async fn update_answer(&self, ts: &str, text: String) {
        let blocks = labelled("an answer").to_string();
        let r = self
            .call(
                "chat.update",
                &[
                    ("channel", &self.ws.channel),
                    ("ts", ts),
                    ("text", &text),
                    ("blocks", &blocks),
                ],
            )
            .await;
        assert_eq!(r["ok"], true, "Slack updates it: {r}");
    }

    async fn judge_with(&self, scopes: &[Scope], limits: oracle::Limits) -> oracle::Judgement {
        oracle::judge_with(&self.ws.base, &self.ws.app_id(), scopes, limits).await
    }
}

/// Whether `j` found a violation of `kind` whose text mentions `what`.
fn caught(j: &oracle::Judgement, kind: &str, what: &str) -> bool {
    j.violations
        .iter()
        .any(|v| v.0 == kind && v.1.contains(what))
}

/// An answer's blocks as threadline posts them: its text, its AI label,
/// its feedback buttons.
fn labelled(text: &str) -> Value {
    let stored = json!([{"type": "section", "text": {"type": "mrkdwn", "text": text}},
                        {"type": "context", "elements": [{"type": "mrkdwn", "text": "AI-generated"}]}]);
    reply::blocks(Shown::Posted {
        blocks: Some(&stored),
        decision: "d",
    })
}

fn limits() -> oracle::Limits {
    oracle::Limits {
        grace: GRACE,
        stream_end: Duration::from_secs(60),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_direct_conversation_every_message_is_a_question_and_the_pane_is_judged() {
    let w = World::with_app(
        &[
            "app_mention",
            "message.channels",
            "message.im",
            "assistant_thread_started",
        ],
        &[
            "chat:write",
            "channels:history",
            "im:history",
            "assistant:write",
        ],
    )
    .await;
    // The person opens the pane looking at the channel, which has a message.
    let seen_text = "the deploy is at noon";
    let seen = w.ask(seen_text, None).await;
    let opened =
        w.ws.ctl(
            "act/assistant_open",
            json!({"user": w.ws.user, "app_id": w.ws.app_id(), "context_channel": w.ws.channel}),
        )
        .await;
    let (dm, root) = (
        opened["channel"].as_str().expect("dm").to_owned(),
        opened["ts"].as_str().expect("thread").to_owned(),
    );
    let say = |text: &'static str| {
        let (dm, root) = (dm.clone(), root.clone());
        let w = &w;
        async move {
            let ts =
                w.ws.ctl(
                    "act/post",
                    json!({"user": w.ws.user, "channel": dm, "thread_ts": root, "text": text}),
                )
                .await["ts"]
                    .as_str()
                    .expect("ts")
                    .to_owned();
            w.delivered_in(&dm, &ts, None).await;
            ts
        }
    };
    // No mention: in a DM, a question all the same.
    let q1 = say("when is the deploy?").await;
    let direct = vec![Scope {
        channel: dm.clone(),
        bot_user: w.ws.bot_user(),
        kind: ScopeKind::Direct,
    }];
    let j = w.judge_with(&direct, limits()).await;
    assert!(
        j.violations.is_empty(),
        "the pane's opening message is no reply: {:?}",
        j.violations
    );
    assert_eq!(
        (j.questions, j.answered, j.unexplained.len()),
        (1, 0, 1),
        "{j:?}"
    );
    // Judged as a channel, the same message asks nothing.
    let as_channel = vec![Scope::mentions(&dm, &w.ws.bot_user())];
    let j = w.judge_with(&as_channel, limits()).await;
    assert_eq!(j.questions, 0, "{j:?}");
    // The pane's answer adds what it read of the channel the person looks
    // at; what it read of the thread is still judged.
    let answer = format!(
        "an answer\nAnswering {q1}; read {q1}/{}; and 1 message(s) of channel {}, the one you are looking at: {seen}/{}",
        digest("when is the deploy?"),
        w.ws.channel,
        digest(seen_text)
    );
    w.bot_post(&dm, Some(&root), &answer, &labelled("an answer"))
        .await;
    let j = w.judge_with(&direct, limits()).await;
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    assert_eq!(
        (j.questions, j.answered, j.pane, j.whole),
        (1, 1, 1, 1),
        "{j:?}"
    );
    // A second question answered without reading the first is caught.
    let q2 = say("and who deploys?").await;
    tokio::time::sleep(GRACE * 2).await;
    let answer = format!(
        "an answer\nAnswering {q2}; read {q2}/{}; and 0 message(s) of channel {}, the one you are looking at: ",
        digest("and who deploys?"),
        w.ws.channel
    );
    w.bot_post(&dm, Some(&root), &answer, &labelled("an answer"))
        .await;
    let j = w.judge_with(&direct, limits()).await;
    assert!(
        caught(&j, "missed_message", &format!("missed message {q1}")),
        "{:?}",
        j.violations
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decided_review_request_is_no_answer_in_its_review_channel() {
    let w = World::new().await;
    let review =
        w.ws.ctl(
            "channels",
            json!({"team_id": w.ws.team, "name": "answers-review", "kind": "public",
                   "members": [w.ws.user, w.ws.bot_user()]}),
        )
        .await["id"]
            .as_str()
            .expect("channel")
            .to_owned();
    // A request quotes the answer it asks about, and shows buttons.
    let quoted = "Answering 1.000001; read 1.000001/ca978112";
    let buttons = json!([
        {"type": "section", "text": {"type": "mrkdwn", "text": quoted}},
        {"type": "actions", "elements": [
            {"type": "button", "action_id": "approve", "text": {"type": "plain_text", "text": "Approve"}}]}]);
    let asking = w.bot_post(&review, None, quoted, &buttons).await;
    let rejected = w.bot_post(&review, None, quoted, &buttons).await;
    // Decided, a request loses its buttons and says so.
    let decided = json!([{"type": "section", "text": {"type": "mrkdwn", "text": "Rejected by <@U1>: not posted."}}]).to_string();
    let r = w
        .call(
            "chat.update",
            &[
                ("channel", review.as_str()),
                ("ts", rejected.as_str()),
                ("text", "Rejected by <@U1>: not posted."),
                ("blocks", decided.as_str()),
            ],
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let scope = |kind| {
        vec![Scope {
            channel: review.clone(),
            bot_user: w.ws.bot_user(),
            kind,
        }]
    };
    let j = w.judge_with(&scope(ScopeKind::Review), limits()).await;
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    assert_eq!(
        (
            j.review_requests,
            j.review_decided,
            j.review_rejected,
            j.replies
        ),
        (2, 1, 1, 0),
        "{asking}: {j:?}"
    );
    // Read as a channel of answers, the decided request is a reply that
    // answers nothing of its thread: the kind of the scope matters.
    let j = w.judge_with(&scope(ScopeKind::Mentions), limits()).await;
    assert!(
        j.violations
            .iter()
            .any(|v| v.0 == "unattributed_reply" || v.0 == "unlabelled_reply"),
        "{:?}",
        j.violations
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_slack_expired_answers_nothing_and_its_open_time_counts() {
    let w = World::new().await;
    let q_text = format!("<@{}> is it up?", w.ws.bot_user());
    let q = w.ask(&q_text, None).await;
    // The whole answer streamed, but never stopped: Slack expires it.
    let ts = w
        .start_stream(&q, &format!("Answering {q}; read {q}/{}", digest(&q_text)))
        .await;
    let seen_open = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as u64;
    w.ask("it is back", Some(&q)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    w.ws.ctl("settings", json!({"stream_lifetime_ms": 200}))
        .await;
    let j = w.judge_with(&w.scope(), limits()).await;
    assert!(
        j.violations.is_empty(),
        "an expired stream is no reply to judge: {:?}",
        j.violations
    );
    assert_eq!(
        (j.expired, j.streamed, j.answered, j.unexplained.len()),
        (1, 0, 0, 1),
        "an expired stream answered nothing: {j:?}"
    );
    // Slack dates the expiry at its start plus the lifetime; a stream seen
    // open after its thread changed was open until then at least.
    let mut seen = limits();
    seen.stream_end = Duration::from_secs(1);
    let j = w.judge_with(&w.scope(), seen.clone()).await;
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    seen.seen_open
        .insert((w.ws.channel.clone(), ts.clone()), seen_open + 1_500_000);
    let j = w.judge_with(&w.scope(), seen).await;
    assert!(caught(&j, "stream_left_open", &ts), "{:?}", j.violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_slack_expired_then_updated_to_the_whole_answer_is_that_answer() {
    let w = World::new().await;
    let q_text = format!("<@{}> is it up?", w.ws.bot_user());
    let q = w.ask(&q_text, None).await;
    // Half an answer streamed; Slack expires the stream.
    let ts = w.start_stream(&q, &format!("Answering {q}. I re")).await;
    w.ws.ctl("settings", json!({"stream_lifetime_ms": 200}))
        .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let j = w.judge_with(&w.scope(), limits()).await;
    assert_eq!(
        (j.expired, j.expired_finished, j.answered),
        (1, 0, 0),
        "not updated: it answered nothing: {j:?}"
    );
    // Said after the expiry, before the update: judged against the update.
    let more_text = "it was down at noon";
    let more = w.ask(more_text, Some(&q)).await;
    tokio::time::sleep(GRACE * 2).await;
    let update =
        |read: String| w.update_answer(&ts, format!("an answer\nAnswering {q}; read {read}"));
    let q_read = format!("{q}/{}", digest(&q_text));
    update(q_read.clone()).await;
    let j = w.judge_with(&w.scope(), limits()).await;
    assert!(
        caught(&j, "missed_message", &format!("missed message {more}")),
        "whole when updated, not when Slack expired it: {:?}",
        j.violations
    );
    update(format!("{q_read} {more}/{}", digest(more_text))).await;
    let j = w.judge_with(&w.scope(), limits()).await;
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    assert_eq!(
        (j.expired, j.expired_finished, j.streamed, j.answered),
        (0, 1, 1, 1),
        "the updated stream is the answer: {j:?}"
    );
    // An answer beside it is a second one.
    w.answer(&q, &q, &[(&q, &q_text), (&more, more_text)]).await;
    let j = w.judge_with(&w.scope(), limits()).await;
    assert!(caught(&j, "duplicate_reply", &q), "{:?}", j.violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_context_may_leave_out_older_messages_and_no_other() {
    let w = World::new().await;
    let bot = w.ws.bot_user();
    let root_text = format!("<@{bot}> what changed?");
    let root = w.ask(&root_text, None).await;
    let mut replies = Vec::new();
    for i in 0..5 {
        let text = format!("detail {i}");
        let ts = w.ask(&text, Some(&root)).await;
        replies.push((ts, text));
    }
    let q_text = format!("<@{bot}> so?");
    let q = w.ask(&q_text, Some(&root)).await;
    // A context of 4: the root, the question and the two newest replies.
    let read: Vec<(&str, &str)> = vec![
        (root.as_str(), root_text.as_str()),
        (replies[3].0.as_str(), replies[3].1.as_str()),
        (replies[4].0.as_str(), replies[4].1.as_str()),
        (q.as_str(), q_text.as_str()),
    ];
    // (well after the messages were acknowledged: none crossed it)
    tokio::time::sleep(GRACE * 2).await;
    w.answer(&root, &q, &read).await;
    let mut full = limits();
    full.context_max_messages = Some(4);
    let j = w.judge_with(&w.scope(), full.clone()).await;
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    assert_eq!(j.truncated, 3, "{j:?}");
    // Without the limit, the same answer missed three messages.
    let j = w.judge_with(&w.scope(), limits()).await;
    assert_eq!(
        j.violations
            .iter()
            .filter(|v| v.0 == "missed_message")
            .count(),
        3,
        "{:?}",
        j.violations
    );
    // With a larger limit than it read, a gap is a miss.
    full.context_max_messages = Some(5);
    let j = w.judge_with(&w.scope(), full).await;
    assert!(
        j.violations.iter().any(|v| v.0 == "missed_message"),
        "{:?}",
        j.violations
    );
}
