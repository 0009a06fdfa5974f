//! The scripted Slack story of `make demo`, also run as an end-to-end test:
//! each chapter drives slack-sim like people and Slack would, then reads
//! what Slack shows (the emulator's ground truth) and what threadline
//! recorded, and says whether the invariants held.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use threadline_store::testing::{decisions, intents, receipts};

use crate::{Stack, cli, sim_ctl, sim_get};

/// How long the built-in model takes in the story: long enough for a thread
/// to change while it "thinks", like a real model.
pub const MODEL_LATENCY_MS: u64 = 1500;

/// The settings the story needs on top of a [`Stack`]'s.
pub fn settings() -> Vec<(&'static str, String)> {
    vec![
        (
            "THREADLINE_BUILTIN_LATENCY_MS",
            MODEL_LATENCY_MS.to_string(),
        ),
        ("THREADLINE_SLACK_TIMEOUT_MS", "1000".to_owned()),
        ("THREADLINE_RECONCILE_WINDOW_MS", "2000".to_owned()),
        // Streaming is on in the services, and switched on by policy for
        // the streaming chapter only (the story switches it off first).
        ("THREADLINE_STREAMING", "true".to_owned()),
        ("THREADLINE_BUILTIN_STREAM_PACE_MS", "120".to_owned()),
        ("THREADLINE_STREAM_RELEASE_MS", "100".to_owned()),
        ("THREADLINE_STREAM_APPEND_MS", "300".to_owned()),
    ]
}

/// The app's events and its installation's scopes: what
/// `deploy/slack/manifest.yaml` asks for, with the opt-in items of Slack's
/// agent messaging experience (the Messages tab) that the last chapter
/// plays.
pub const EVENTS: &[&str] = &[
    "app_mention",
    "message.channels",
    "message.im",
    "app_home_opened",
    "app_context_changed",
];
pub const SCOPES: &[&str] = &[
    "chat:write",
    "channels:history",
    "channels:read",
    "im:history",
    "assistant:write",
];

/// Starts the stack the story plays on: [`settings`] and `extra` for every
/// service, the app with [`EVENTS`] and [`SCOPES`] and, as the manifest
/// gives it, the agent messaging experience (`features.agent_view`).
pub async fn start(extra: &[(&str, String)]) -> Stack {
    let mut all: Vec<(&str, String)> = settings();
    all.extend(extra.iter().cloned());
    let s = Stack::start_with_app(&all, EVENTS, SCOPES).await;
    let set = sim_ctl(
        &s.sim,
        &format!("apps/{}/experience", s.app),
        json!({"experience": "agent_view"}),
    )
    .await;
    assert_eq!(
        set["experience"], "agent_view",
        "the app's experience: {set}"
    );
    s
}

#[derive(Debug, Clone)]
pub struct Chapter {
    pub title: &'static str,
    /// What Slack would show (from the emulator).
    pub slack: String,
    /// What threadline recorded (from its tables).
    pub recorded: String,
    /// Whether everything the chapter expects held; why not otherwise.
    pub verdict: Result<(), String>,
}

#[derive(Debug, Clone, Default)]
pub struct Totals {
    pub events: i64,
    pub duplicates_absorbed: i64,
    /// Decisions a model answered (`threadline stats`: `model_calls_total`).
    pub model_calls: i64,
    /// The same, as the inference service counted it on `/metrics`.
    pub model_calls_metrics: i64,
    pub replies: i64,
    pub stale: i64,
    pub reconciled: i64,
    pub duplicate_replies: i64,
    /// Of the replies, streams ended early with their closing line (each
    /// followed by at most one answer: not a duplicate).
    pub ended_early: i64,
}

#[derive(Debug, Clone)]
pub struct Story {
    pub chapters: Vec<Chapter>,
    pub totals: Totals,
    /// The oracle's judgement of the whole story from Slack's side.
    pub oracle: OracleSummary,
}

/// What the oracle (which reads only slack-sim and the answer texts) found.
#[derive(Debug, Clone, Default)]
pub struct OracleSummary {
    pub replies: usize,
    pub questions: usize,
    pub answered: usize,
    pub explained: Vec<(String, usize)>,
    pub crossed: usize,
    pub violations: Vec<String>,
}

impl OracleSummary {
    pub fn render(&self) -> String {
        let explained: Vec<String> = self
            .explained
            .iter()
            .map(|(why, n)| format!("{n} {why}"))
            .collect();
        format!(
            "Slack's side (an oracle reading only slack-sim and the answers' text): {} replies to {} questions; {} answered once, {} explained by Slack ({}), {} others explained by an operator-visible reason; {} answers crossed in flight (each recorded and reconsidered); {} violations\n",
            self.replies,
            self.questions,
            self.answered,
            self.explained.iter().map(|e| e.1).sum::<usize>(),
            if explained.is_empty() {
                "none".to_owned()
            } else {
                explained.join(", ")
            },
            self.questions - self.answered - self.explained.iter().map(|e| e.1).sum::<usize>(),
            self.crossed,
            self.violations.len()
        )
    }
}

impl Story {
    pub fn passed(&self) -> bool {
        self.chapters.iter().all(|c| c.verdict.is_ok())
            && self.totals.duplicate_replies == 0
            && self.totals_disagree().is_none()
            && self.oracle.violations.is_empty()
    }

    /// Where the ledger (`threadline stats`) and the inference service's
    /// `/metrics` count model calls differently (the story kills no
    /// inference process, so every call it counted settled a decision).
    pub fn totals_disagree(&self) -> Option<String> {
        let t = &self.totals;
        (t.model_calls < 0 || t.model_calls != t.model_calls_metrics).then(|| {
            format!(
                "threadline stats counts {} model calls, the inference service's /metrics {}",
                t.model_calls, t.model_calls_metrics
            )
        })
    }

    /// The report `make demo` prints.
    pub fn report(&self) -> String {
        let mut out =
            String::from("threadline demo — a scripted Slack story against slack-sim\n\n");
        for (i, c) in self.chapters.iter().enumerate() {
            let mark = if c.verdict.is_ok() { "ok  " } else { "FAIL" };
            out.push_str(&format!("{mark} {}. {}\n", i + 1, c.title));
            out.push_str(&format!("       Slack shows:          {}\n", c.slack));
            out.push_str(&format!("       threadline recorded:  {}\n", c.recorded));
            if let Err(why) = &c.verdict {
                out.push_str(&format!("       expected otherwise:   {why}\n"));
            }
            out.push('\n');
        }
        let t = &self.totals;
        out.push_str(&format!(
            "totals, as `threadline stats` counts them: {}, {} absorbed, {} ({} on the inference service's /metrics), {} discarded, {}\n",
            plural(t.events, "event", "events"),
            plural(t.duplicates_absorbed, "duplicate delivery", "duplicate deliveries"),
            plural(t.model_calls, "model call", "model calls"),
            t.model_calls_metrics,
            plural(t.stale, "stale answer", "stale answers"),
            plural(t.reconciled, "reconciled post", "reconciled posts"),
        ));
        out.push_str(&format!(
            "totals, as Slack shows them: {} ({} ended early, each followed by one answer), {}\n",
            plural(t.replies, "reply", "replies"),
            plural(t.ended_early, "stream", "streams"),
            plural(t.duplicate_replies, "duplicate reply", "duplicate replies"),
        ));
        if let Some(why) = self.totals_disagree() {
            out.push_str(&format!("  DISAGREEMENT: {why}\n"));
        }
        out.push_str(&self.oracle.render());
        for v in &self.oracle.violations {
            out.push_str(&format!("  VIOLATION: {v}\n"));
        }
        out.push_str(if self.passed() {
            "every invariant held\n"
        } else {
            "SOMETHING BROKE — see the chapters marked FAIL\n"
        });
        out
    }
}

fn check(conditions: &[(bool, String)]) -> Result<(), String> {
    let failed: Vec<&str> = conditions
        .iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, why)| why.as_str())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// Polls `probe` every 100 ms until it gives a value or `limit` passes.
async fn until<T, F, Fut>(limit: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Teller<'a> {
    s: &'a Stack,
}

impl Teller<'_> {
    /// Decision statuses of the thread `root`, oldest first.
    async fn decisions(&self, root: &str) -> Vec<String> {
        decisions::decision_statuses_of_thread(&self.s.db.pool, root)
            .await
            .unwrap_or_default()
    }

    /// Waits until the thread's work has settled: every decision final,
    /// every intent sent or closed, no receipt open — and still so two
    /// seconds later (a stale answer is followed by a reconsideration that
    /// opens new work a moment after).
    async fn settle(&self, root: &str) {
        let mut quiet_since: Option<Instant> = None;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            let open = decisions::thread_open_work(&self.s.db.pool, root)
                .await
                .ok();
            match open {
                Some((0, n)) if n > 0 => {
                    let since = *quiet_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= Duration::from_secs(2) {
                        return;
                    }
                }
                _ => quiet_since = None,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the model is working on the thread.
    async fn model_running(&self, root: &str) -> bool {
        let pool = self.s.db.pool.clone();
        let root = root.to_owned();
        until(Duration::from_secs(20), || {
            let (pool, root) = (pool.clone(), root.clone());
            async move {
                let n = decisions::count_thread_decisions_with_status(&pool, &root, "calling")
                    .await
                    .ok()?;
                (n > 0).then_some(())
            }
        })
        .await
        .is_some()
    }

    async fn calls(&self, method: &str, root: &str) -> Vec<Value> {
        sim_get(&self.s.sim, &format!("calls?method={method}")).await["calls"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c["thread_ts"] == root)
            .collect()
    }

    async fn mention(&self, text: &str, thread: Option<&str>) -> String {
        self.s
            .post(&format!("<@{}> {text}", self.s.bot_user), thread)
            .await
    }
}

fn replies(n: usize) -> String {
    match n {
        1 => "1 reply".into(),
        n => format!("{n} replies"),
    }
}

fn times(n: usize) -> String {
    match n {
        1 => "once".into(),
        2 => "twice".into(),
        n => format!("{n} times"),
    }
}

fn chain(decisions: &[String]) -> String {
    if decisions.is_empty() {
        "no decision".into()
    } else {
        format!("decision {}", decisions.join(" → "))
    }
}

fn label_ok(answer: &Value) -> bool {
    answer["text"]
        .as_str()
        .is_some_and(|t| t.ends_with("_AI-generated — verify before relying on it_"))
}

/// Plays every chapter on `s` (started with [`settings`]).
pub async fn play(s: &Stack) -> Story {
    let t = Teller { s };
    let mut chapters = Vec::new();
    // Answers are posted whole until the streaming chapter.
    let inst = crate::first_installation(s).await;
    let db = [("DATABASE_URL", s.db.url.clone())];
    let off = cli(
        &[
            "policy",
            "set",
            "--installation",
            &inst,
            "--streaming",
            "off",
        ],
        &db,
    )
    .await
    .status
    .success();
    assert!(off, "streaming switched off for the story's first chapters");

    // 1. A mention answered once.
    let root = s.post("deploy of api-7 failed at 02:10", None).await;
    t.mention("why did it fail?", Some(&root)).await;
    t.settle(&root).await;
    let answers = s.answers(&root).await;
    let decisions = t.decisions(&root).await;
    chapters.push(Chapter {
        title: "A mention is answered once, in its thread, labelled",
        slack: format!("{} in the thread, labelled as AI", replies(answers.len())),
        recorded: chain(&decisions),
        verdict: check(&[
            (
                answers.len() == 1,
                format!("one reply, not {}", answers.len()),
            ),
            (
                answers.iter().all(label_ok),
                "the AI label on the reply".into(),
            ),
            (decisions == ["published"], "one decision, published".into()),
        ]),
    });

    // 2. The bot's own reply, fed back by Slack, is no new job.
    let reply_ts = answers
        .first()
        .and_then(|a| a["ts"].as_str())
        .unwrap_or_default()
        .to_owned();
    let own: Option<(String, Option<String>)> =
        receipts::receipt_state_of_message(&s.db.pool, &reply_ts)
            .await
            .ok()
            .flatten();
    let jobs = decisions::count_decisions_of_message(&s.db.pool, &reply_ts)
        .await
        .unwrap_or(-1);
    // Slack's side: what it delivered back for the reply, and whether the
    // app said anything more in the thread.
    let delivered_back = sim_get(&s.sim, "deliveries").await["deliveries"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter(|x| x["event_type"] == "message" && x["status"] == 200)
                .count()
        })
        .unwrap_or(0);
    let app_messages = s.answers(&root).await.len();
    chapters.push(Chapter {
        title: "The bot's own reply is ignored (no loop)",
        slack: format!(
            "{delivered_back} message event(s) delivered so far; {} in the thread",
            replies(app_messages)
        ),
        recorded: format!(
            "its receipt {}, {jobs} model calls for it",
            own.as_ref()
                .map(|(st, r)| format!("{st} ({})", r.as_deref().unwrap_or("-")))
                .unwrap_or_else(|| "missing".into())
        ),
        verdict: check(&[
            (
                own == Some(("ignored".into(), Some("own_bot".into()))),
                "the reply's receipt ignored as own_bot".into(),
            ),
            (jobs == 0, "no model call for it".into()),
            (
                app_messages == 1,
                format!("still one reply in Slack, not {app_messages}"),
            ),
        ]),
    });

    // 3. A Slack retry storm is absorbed: every delivery counts as too late.
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "events", "mode": "hold_past_deadline", "times": 0}),
    )
    .await;
    let root = t.mention("is the queue stuck?", None).await;
    t.settle(&root).await;
    crate::sim_clear_faults(&s.sim).await;
    let answers = s.answers(&root).await;
    let (receipts, dups) = receipts::receipt_and_duplicate_counts(&s.db.pool, &root)
        .await
        .unwrap_or((-1, -1));
    let deliveries = sim_get(&s.sim, "deliveries").await["deliveries"]
        .as_array()
        .map(|d| d.iter().filter(|x| x["attempt"].as_u64() > Some(0)).count())
        .unwrap_or(0);
    let calls = decisions::count_thread_decisions(&s.db.pool, &root)
        .await
        .unwrap_or(-1);
    chapters.push(Chapter {
        title: "A Slack retry storm is absorbed",
        slack: format!("{deliveries} retried deliveries so far, {}", replies(answers.len())),
        recorded: format!("{receipts} receipts (mention + message twin), {dups} duplicate deliveries, {calls} model call(s)"),
        verdict: check(&[
            (answers.len() == 1, format!("one reply, not {}", answers.len())),
            (receipts == 2, "one receipt per event".into()),
            (dups >= 2, "the retries were seen as duplicates".into()),
            (calls == 1, "one model call".into()),
        ]),
    });

    // 4. The question is edited while the model works on it.
    let root = s.post("the nightly job is red", None).await;
    let ask = t.mention("what failed?", Some(&root)).await;
    let running = t.model_running(&root).await;
    sim_ctl(
        &s.sim,
        "act/edit",
        json!({"user": s.user, "channel": s.channel, "ts": ask,
               "text": format!("<@{}> what failed in the nightly job, and since when?", s.bot_user)}),
    )
    .await;
    t.settle(&root).await;
    let answers = s.answers(&root).await;
    let decisions = t.decisions(&root).await;
    chapters.push(Chapter {
        title: "An edit during inference: the old answer is discarded, the edited question answered",
        slack: replies(answers.len()),
        recorded: format!("{} (the edit made the first answer stale)", chain(&decisions)),
        verdict: check(&[
            (running, "the model was running when the edit came".into()),
            (answers.len() == 1, format!("one reply, not {}", answers.len())),
            (
                decisions.first().map(String::as_str) == Some("stale")
                    && decisions.last().map(String::as_str) == Some("published"),
                "the first answer stale, the second published".into(),
            ),
        ]),
    });

    // 5. A person replies while the model works: the answer is stale, the
    // thread is reconsidered.
    let root = t.mention("is prod down?", None).await;
    let running = t.model_running(&root).await;
    let human = s.post("looks like it's back up", Some(&root)).await;
    t.settle(&root).await;
    let answers = s.answers(&root).await;
    let decisions = t.decisions(&root).await;
    let after = answers
        .iter()
        .all(|a| a["ts"].as_str().unwrap_or("0") > human.as_str());
    let reconsidered = decisions::count_thread_versions(&s.db.pool, &root)
        .await
        .unwrap_or(-1);
    chapters.push(Chapter {
        title: "A human reply makes the answer stale; the thread is reconsidered",
        slack: format!("{}, after the person's", replies(answers.len())),
        recorded: format!("{}, at {reconsidered} thread versions", chain(&decisions)),
        verdict: check(&[
            (running, "the model was running when the reply came".into()),
            (answers.len() <= 1, "never two replies".into()),
            (
                after,
                "no reply bound to the version before the person's".into(),
            ),
            (
                decisions.first().map(String::as_str) == Some("stale"),
                "the first answer discarded as stale".into(),
            ),
            (
                reconsidered >= 2,
                "a new context for the new version".into(),
            ),
        ]),
    });

    // 6. Slack accepts the post but the response is lost.
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "lost_response", "latency_ms": 5000}),
    )
    .await;
    let root = t.mention("did the backup run?", None).await;
    t.settle(&root).await;
    let answers = s.answers(&root).await;
    let posts = t.calls("chat.postMessage", &root).await;
    let intent: Option<(String, bool)> = intents::intent_state_of_thread(&s.db.pool, &root)
        .await
        .ok()
        .flatten();
    chapters.push(Chapter {
        title: "A post accepted but its response lost is reconciled, not re-posted",
        slack: format!(
            "{}, {} chat.postMessage call(s)",
            replies(answers.len()),
            posts.len()
        ),
        recorded: match &intent {
            Some((state, true)) => {
                format!("reply intent {state}, settled by reconciliation (found by its metadata)")
            }
            Some((state, false)) => format!("reply intent {state}, not reconciled"),
            None => "no reply intent".into(),
        },
        verdict: check(&[
            (
                answers.len() == 1,
                format!("one reply, not {}", answers.len()),
            ),
            (posts.len() == 1, "posted once".into()),
            (
                intent == Some(("sent".into(), true)),
                "sent, by reconciliation".into(),
            ),
        ]),
    });

    // 7. Slack rate-limits the post: threadline waits as told.
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "ratelimited", "retry_after": 2}),
    )
    .await;
    let root = t.mention("how full is the disk?", None).await;
    t.settle(&root).await;
    let answers = s.answers(&root).await;
    let posts = t.calls("chat.postMessage", &root).await;
    let limited = posts
        .iter()
        .filter(|c| c["outcome"] == "ratelimited")
        .count();
    let waited = match (posts.first(), posts.last()) {
        (Some(a), Some(b)) => {
            (b["at_micros"].as_u64().unwrap_or(0) - a["at_micros"].as_u64().unwrap_or(0)) as f64
                / 1e6
        }
        _ => 0.0,
    };
    chapters.push(Chapter {
        title: "A 429 is waited out (Retry-After), then one post",
        slack: format!("{}; {limited} call(s) answered 429", replies(answers.len())),
        recorded: format!("waited {waited:.1} s before the post that landed"),
        verdict: check(&[
            (
                answers.len() == 1,
                format!("one reply, not {}", answers.len()),
            ),
            (limited == 1, "one 429".into()),
            (waited >= 1.9, "waited the Retry-After".into()),
        ]),
    });

    // 8. A kill switch stops answers.
    let env = [("DATABASE_URL", s.db.url.clone())];
    let engaged = cli(
        &[
            "kill-switch",
            "engage",
            "--global",
            "--reason",
            "demo",
            "--by",
            "demo",
        ],
        &env,
    )
    .await
    .status
    .success();
    let root = t.mention("restart the cluster?", None).await;
    t.settle(&root).await;
    let answers = s.answers(&root).await;
    let decisions = t.decisions(&root).await;
    let released = cli(
        &["kill-switch", "release", "--global", "--by", "demo"],
        &env,
    )
    .await
    .status
    .success();
    chapters.push(Chapter {
        title: "A kill switch suppresses answers",
        slack: replies(answers.len()),
        recorded: format!("{} before the model call", chain(&decisions)),
        verdict: check(&[
            (
                engaged && released,
                "the switch engaged and released".into(),
            ),
            (answers.is_empty(), "no reply".into()),
            (decisions == ["suppressed"], "the job suppressed".into()),
        ]),
    });

    // 9. A streamed answer the thread overtakes.
    let on = cli(
        &[
            "policy",
            "set",
            "--installation",
            &inst,
            "--streaming",
            "on",
        ],
        &db,
    )
    .await
    .status
    .success();
    let root = s.post("the queue is backing up", None).await;
    t.mention("what should we check first?", Some(&root)).await;
    let showing = until(Duration::from_secs(20), || async {
        (!t.calls("chat.appendStream", &root).await.is_empty()).then_some(())
    })
    .await
    .is_some();
    let human = s
        .post("it's the consumer, it just restarted", Some(&root))
        .await;
    t.settle(&root).await;
    let answers = s.answers(&root).await;
    let decisions = t.decisions(&root).await;
    let starts = t.calls("chat.startStream", &root).await.len();
    let appends = t.calls("chat.appendStream", &root).await.len();
    let text = |i: usize| {
        answers
            .get(i)
            .and_then(|a| a["text"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let closing = "_The thread changed while I was answering, so I stopped here. I'm reconsidering with the new messages._";
    chapters.push(Chapter {
        title: "A streamed answer stops when a person replies; one reconsidered answer follows",
        slack: format!(
            "a stream grown in {appends} appends, ended with its closing line; then {}",
            replies(answers.len().saturating_sub(1))
        ),
        recorded: chain(&decisions),
        verdict: check(&[
            (
                on && showing,
                "the answer was streaming when the person replied".into(),
            ),
            (starts == 1, "one stream, never a second".into()),
            (
                text(0).ends_with(closing),
                "the stream ends with its closing line".into(),
            ),
            (answers.len() == 2, "then exactly one answer".into()),
            (
                text(1).contains(&format!("{human}/")),
                "the answer read the person's reply".into(),
            ),
            (
                answers.get(1).is_some_and(label_ok),
                "the answer is labelled".into(),
            ),
        ]),
    });

    // 10. Review by button, in the review channel.
    let chapter = review_by_button(&t, &inst, &db).await;
    chapters.push(chapter);

    // 11. Socket Mode intake.
    let chapter = socket_mode(&t).await;
    chapters.push(chapter);

    // 12. The agent's Messages tab.
    let chapter = agent_tab(&t, &inst, &db).await;
    chapters.push(chapter);

    let (j, violations) = s.verdict(crate::ORACLE_GRACE).await;
    Story {
        chapters,
        totals: settled_totals(s).await,
        oracle: OracleSummary {
            replies: j.replies,
            questions: j.questions,
            answered: j.answered,
            explained: j
                .explained
                .iter()
                .map(|(k, v)| ((*k).replace('_', " "), *v))
                .collect(),
            crossed: j.crossed.len(),
            violations,
        },
    }
}

/// The totals once the ledger and `/metrics` have caught up with each
/// other: a model call is counted on `/metrics` a moment before its decision
/// is recorded, so a reconsideration still running would read as a
/// disagreement. Reads again (every 250 ms, for up to 15 s) until the two
/// agree; a disagreement that lasts is reported.
async fn settled_totals(s: &Stack) -> Totals {
    let _ = crate::quiesce(
        &s.db.pool,
        Some((&s.js, &s.prefix)),
        Duration::from_secs(15),
        Duration::from_millis(500),
    )
    .await;
    let start = Instant::now();
    loop {
        let t = totals(s).await;
        if t.model_calls == t.model_calls_metrics || start.elapsed() > Duration::from_secs(15) {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn totals(s: &Stack) -> Totals {
    // threadline's figures exactly as `threadline stats --json` gives them,
    // so that the demo and the CLI cannot disagree.
    let out = crate::cli(&["stats", "--json"], &[("DATABASE_URL", s.db.url.clone())]).await;
    let stats: serde_json::Value = if out.status.success() {
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    } else {
        eprintln!(
            "threadline stats --json failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::Value::Null
    };
    let stat = |key: &str| stats[key].as_i64().unwrap_or(-1);
    let posts = sim_get(&s.sim, &format!("app_posts?app_id={}", s.app)).await;
    let replies = posts["per_thread"]
        .as_array()
        .map(|a| a.iter().map(|x| x["count"].as_i64().unwrap_or(0)).sum())
        .unwrap_or(-1);
    // Streams ended early, per thread (from the channel's messages).
    let messages = sim_get(&s.sim, &format!("channels/{}/messages", s.channel)).await;
    let mut ended: std::collections::BTreeMap<String, i64> = Default::default();
    for m in messages["messages"].as_array().cloned().unwrap_or_default() {
        if m["app_id"].as_str() == Some(s.app.as_str()) && crate::oracle::ended_early(&m) {
            let root = m["thread_ts"]
                .as_str()
                .or(m["ts"].as_str())
                .unwrap_or_default();
            *ended.entry(root.to_owned()).or_default() += 1;
        }
    }
    // From Slack's side: source messages with more than one reply, a
    // stream ended early in the thread not counted.
    let duplicates = posts["per_trigger"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|x| {
                    let n = x["count"].as_i64().unwrap_or(0);
                    let early = x["thread_ts"]
                        .as_str()
                        .and_then(|t| ended.get(t))
                        .copied()
                        .unwrap_or(0);
                    n - early > 1
                })
                .count() as i64
        })
        .unwrap_or(-1);
    Totals {
        events: stat("receipts_total"),
        duplicates_absorbed: stat("duplicate_deliveries_total"),
        model_calls: stat("model_calls_total"),
        model_calls_metrics: model_calls_answered(&s.metrics().await),
        replies,
        stale: stat("stale_proposals_total"),
        reconciled: stat("reconciled_total"),
        duplicate_replies: duplicates,
        ended_early: ended.values().sum(),
    }
}

/// Model calls that answered, summed from `/metrics` text:
/// `threadline_model_calls_total{…,result="ok"}` over every provider.
pub fn model_calls_answered(metrics: &str) -> i64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("threadline_model_calls_total{") && l.contains("result=\"ok\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as i64
}

fn plural(n: i64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Chapter 11: the workspace cannot expose a public URL, so the app is
/// switched to Socket Mode and a gateway holds two WebSocket connections;
/// a connection dropped right after an envelope, and an envelope sent over
/// both connections, still give one receipt per event and one answer.
async fn socket_mode(t: &Teller<'_>) -> Chapter {
    let s = t.s;
    let gateway = s.spawn_socket_gateway().await;
    let socket = || async { sim_get(&s.sim, &format!("socket?app_id={}", s.app)).await };
    let connected = until(Duration::from_secs(20), || async {
        (socket().await["connections"].as_array()?.len() >= 2).then_some(())
    })
    .await
    .is_some();
    let mut answered = Vec::new();
    let mut receipts = Vec::new();
    for fault in ["drop_mid_envelope", "duplicate_envelope"] {
        sim_ctl(&s.sim, "faults", json!({"method": "socket", "mode": fault})).await;
        let root = t.mention("is the queue draining?", None).await;
        t.settle(&root).await;
        answered.push(s.answers(&root).await.len());
        let events: Vec<String> =
            sim_get(&s.sim, &format!("deliveries?app_id={}", s.app)).await["deliveries"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|d| d["message_ts"] == json!(root))
                .filter_map(|d| d["event_id"].as_str().map(str::to_owned))
                .collect();
        let mut distinct = events.clone();
        distinct.sort();
        distinct.dedup();
        for id in &distinct {
            receipts.push(
                receipts::count_receipts_of(&s.db.pool, id)
                    .await
                    .unwrap_or(-1),
            );
        }
    }
    let log = socket().await;
    let entries = log["log"].as_array().cloned().unwrap_or_default();
    let dropped = entries
        .iter()
        .any(|e| e["direction"] == "closed" && e["kind"] == "dropped");
    let unmatched = entries
        .iter()
        .filter(|e| e["kind"] == "ack" && e["matched"] == false)
        .count();
    let sent = entries
        .iter()
        .filter(|e| e["direction"] == "sent" && e["kind"] == "events_api")
        .count();
    let acked = entries
        .iter()
        .filter(|e| e["kind"] == "ack" && e["matched"] == true)
        .count();
    // Back to HTTP intake for whatever follows.
    sim_ctl(
        &s.sim,
        &format!("apps/{}/socket_mode", s.app),
        json!({"enabled": false}),
    )
    .await;
    gateway.kill().await;
    Chapter {
        title: "Socket Mode: a dropped connection and a duplicate envelope, one receipt each",
        slack: format!(
            "{sent} envelopes sent over 2 connections (one dropped mid-envelope), {acked} acknowledged \
             after their commits, {unmatched} duplicate acknowledgement(s); {} and {}",
            replies(answered.first().copied().unwrap_or(0)),
            replies(answered.get(1).copied().unwrap_or(0))
        ),
        recorded: format!("{} receipt(s), one per event", receipts.len()),
        verdict: check(&[
            (connected, "the gateway held two connections".into()),
            (
                acked >= 2 && unmatched >= 1,
                "each event acknowledged, the duplicate's second ack unmatched".into(),
            ),
            (dropped, "a connection was dropped mid-envelope".into()),
            (answered == [1, 1], "each mention answered once".into()),
            (
                !receipts.is_empty() && receipts.iter().all(|n| *n == 1),
                "one receipt per event".into(),
            ),
        ]),
    }
}

/// Chapter 10: an answer that would repeat a credential-like string waits
/// for a reviewer in the installation's review channel; a click from a
/// member who is not a reviewer is refused; the reviewer's double click
/// approves once; the request then says who approved it and where it went.
async fn review_by_button(t: &Teller<'_>, inst: &str, db: &[(&'static str, String)]) -> Chapter {
    let s = t.s;
    let user = |name: &'static str| async move {
        sim_ctl(&s.sim, "users", json!({"team_id": s.team, "name": name})).await["id"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let (rita, otto) = (user("rita").await, user("otto").await);
    let review = sim_ctl(
        &s.sim,
        "channels",
        json!({"team_id": s.team, "name": "answers-review", "kind": "public",
               "members": [rita, otto, s.bot_user]}),
    )
    .await["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    sim_ctl(
        &s.sim,
        &format!("apps/{}/interactivity", s.app),
        json!({"url": format!("{}/slack/interactions", s.services[0].base_url)}),
    )
    .await;
    // (answers are posted whole again: this chapter is about the review)
    let whole = cli(
        &[
            "policy",
            "set",
            "--installation",
            inst,
            "--streaming",
            "off",
        ],
        db,
    )
    .await
    .status
    .success();
    let setup = whole
        && cli(
            &[
                "review",
                "setup",
                "--installation",
                inst,
                "--channel",
                &review,
                "--reviewers",
                &rita,
            ],
            db,
        )
        .await
        .status
        .success();
    let root = s.post("the deploy docs show a token", None).await;
    t.mention(
        "is xoxb-example-placeholder the token the deploy uses?",
        Some(&root),
    )
    .await;
    let requests = || async {
        sim_get(&s.sim, &format!("channels/{review}/messages")).await["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m["app_id"].is_string())
            .collect::<Vec<Value>>()
    };
    let request = until(Duration::from_secs(30), || async { requests().await.pop() }).await;
    let ts = request
        .as_ref()
        .and_then(|m| m["ts"].as_str())
        .unwrap_or_default()
        .to_owned();
    let shown = request
        .as_ref()
        .map(|m| m["blocks"].to_string())
        .unwrap_or_default();
    let held = s.answers(&root).await.is_empty();
    let click = |user: String| {
        let (review, ts) = (review.clone(), ts.clone());
        async move {
            sim_ctl(
                &s.sim,
                "act/click",
                json!({"user": user, "channel": review, "ts": ts,
                       "action_id": threadline_domain::review::APPROVE_ACTION}),
            )
            .await
        }
    };
    click(otto.clone()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let refused = s.answers(&root).await.is_empty();
    let (a, b) = tokio::join!(click(rita.clone()), click(rita.clone()));
    let clicked = a["status"] == 200 && b["status"] == 200;
    t.settle(&root).await;
    let approved_line = format!("Approved by <@{rita}>: posted in <#{}>.", s.channel);
    let outcome = until(Duration::from_secs(20), || async {
        requests()
            .await
            .into_iter()
            .find(|m| m["ts"] == json!(ts) && m["blocks"].to_string().contains(&approved_line))
    })
    .await;
    let answers = s.answers(&root).await;
    let decisions = t.decisions(&root).await;
    let requests_n = requests().await.len();
    Chapter {
        title: "An answer that needs review is approved by button in the review channel",
        slack: format!(
            "a review request in #answers-review (the token redacted), a non-reviewer's click refused, \
             the reviewer's double click: {}; the request now says who approved it",
            replies(answers.len())
        ),
        recorded: chain(&decisions),
        verdict: check(&[
            (
                setup && request.is_some(),
                "a review request was posted in the review channel".into(),
            ),
            (
                shown.contains("[redacted]") && !shown.contains("xoxb-example"),
                "the request shows the answer with the token redacted".into(),
            ),
            (
                held && refused,
                "nothing posted before a reviewer approved".into(),
            ),
            (clicked, "Slack delivered both clicks".into()),
            (
                answers.len() == 1,
                "exactly one answer after the double click".into(),
            ),
            (
                answers.first().is_some_and(label_ok),
                "the answer is labelled".into(),
            ),
            (
                outcome.is_some(),
                "the request says who approved it, without buttons".into(),
            ),
            (requests_n == 1, "one request for the decision".into()),
        ]),
    }
}

/// The thinking steps a message shows (Slack's task cards): each task's
/// title and status, in order.
fn steps(m: &Value) -> Vec<(String, String)> {
    m["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "task_card")
        .map(|b| {
            let s = |k: &str| b[k].as_str().unwrap_or_default().to_owned();
            (s("title"), s("status"))
        })
        .collect()
}

/// The steps as the report shows them: `Reading the thread ✓ · …`.
fn render_steps(steps: &[(String, String)]) -> String {
    if steps.is_empty() {
        return "no steps".into();
    }
    steps
        .iter()
        .map(|(title, status)| match status.as_str() {
            "complete" => format!("{title} ✓"),
            other => format!("{title} ({other})"),
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

/// The decision an answer's feedback buttons name, when it carries both
/// buttons naming the same one.
fn feedback_decision(answer: &Value) -> Option<String> {
    use threadline_domain::feedback::{FEEDBACK_ACTION, Verdict};
    let buttons = answer["blocks"]
        .as_array()?
        .iter()
        .find(|b| b["type"] == "context_actions")?["elements"]
        .as_array()?
        .iter()
        .find(|e| e["type"] == "feedback_buttons" && e["action_id"] == FEEDBACK_ACTION)?
        .clone();
    let side = |key: &str| Verdict::of_value(buttons[key]["value"].as_str()?);
    match (side("positive_button")?, side("negative_button")?) {
        ((Verdict::Positive, p), (Verdict::Negative, n)) if p == n => Some(p.to_owned()),
        _ => None,
    }
}

/// Chapter 12: Slack's agent messaging experience, the manifest's default.
/// A person opens the app's Messages tab (their DM with the app) and is
/// greeted once however often they open it, looks at the channel, and asks
/// at the top of the DM; the answer streams in the question's own thread
/// with its thinking steps, reads the channel they look at as background,
/// and carries the AI label and feedback buttons; their 👍 is recorded for
/// that answer, without text.
async fn agent_tab(t: &Teller<'_>, inst: &str, db: &[(&'static str, String)]) -> Chapter {
    use threadline_domain::feedback::FEEDBACK_ACTION;
    use threadline_domain::thinking::Stage;
    let s = t.s;
    // (DMs are denied until the operator allows them; answers stream again)
    let allowed = cli(
        &[
            "policy",
            "set",
            "--installation",
            inst,
            "--dms",
            "on",
            "--streaming",
            "on",
        ],
        db,
    )
    .await
    .status
    .success();
    sim_ctl(
        &s.sim,
        &format!("apps/{}/interactivity", s.app),
        json!({"url": format!("{}/slack/interactions", s.services[0].base_url)}),
    )
    .await;
    // What the person will look at: the channel, with its latest news.
    let said = [
        s.post("api-7 was rolled back at 02:40", None).await,
        s.post("api-7 has been green since the rollback", None)
            .await,
    ];
    let open = || async {
        sim_ctl(
            &s.sim,
            "act/agent_open",
            json!({"user": s.user, "app_id": s.app}),
        )
        .await["channel"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let dm = open().await;
    // (the oracle judges the DM too: every message there is a question)
    s.judge_also_as(&dm, &s.bot_user, crate::oracle::ScopeKind::Direct);
    let tab =
        || async { sim_get(&s.sim, &format!("agent_tabs?channel={dm}")).await["tabs"][0].clone() };
    let prompts = until(Duration::from_secs(30), || async {
        tab().await["suggested_prompts"].as_array().map(Vec::len)
    })
    .await
    .unwrap_or(0);
    let reopened = open().await == dm;
    sim_ctl(
        &s.sim,
        "act/agent_context",
        json!({"user": s.user, "app_id": s.app, "channel": s.channel}),
    )
    .await;
    let viewed = until(Duration::from_secs(30), || async {
        let c = threadline_store::testing::agent_view::context_channel(&s.db.pool, &dm).await;
        (c == Some(Some(s.channel.clone()))).then_some(())
    })
    .await
    .is_some();
    let history_reads = || async {
        sim_get(&s.sim, "calls?method=conversations.history").await["calls"]
            .as_array()
            .map(|c| {
                c.iter()
                    .filter(|c| c["channel"] == json!(s.channel))
                    .count()
            })
            .unwrap_or(0)
    };
    let reads_before = history_reads().await;

    let question = "what happened to api-7 tonight?";
    let asked = s.post_as(&s.user, &dm, question, None).await;
    let streaming = until(Duration::from_secs(30), || async {
        s.answers_in(&dm, &asked)
            .await
            .into_iter()
            .find(|m| m["streaming_state"] == "in_progress" && !steps(m).is_empty())
            .map(|m| steps(&m))
    })
    .await
    .unwrap_or_default();
    t.settle(&asked).await;
    let answers = s.answers_in(&dm, &asked).await;
    let decisions = t.decisions(&asked).await;
    let starts = t.calls("chat.startStream", &asked).await.len();
    let read = history_reads().await.saturating_sub(reads_before);
    let answer = answers.first().cloned().unwrap_or_default();
    let text = answer["text"].as_str().unwrap_or_default();
    let shown = steps(&answer);
    let step = |stage: Stage, status: &str| (stage.title().to_owned(), status.to_owned());
    let background = text.contains(&format!("of channel {}", s.channel))
        && said.iter().all(|ts| text.contains(&format!("{ts}/")));
    let labelled = answer["blocks"].as_array().is_some_and(|b| {
        b.iter()
            .any(|b| b["type"] == "context" && b.to_string().contains("AI-generated"))
    });
    let decision = feedback_decision(&answer);
    let top: Vec<Value> = sim_get(&s.sim, &format!("channels/{dm}/messages")).await["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m["thread_ts"].is_null() || m["thread_ts"] == m["ts"])
        .collect();
    let only_the_question = top.len() == 1 && top[0]["ts"] == json!(asked);

    // The person finds the answer helpful (no answer: nothing to click).
    let click = match answer["ts"].as_str() {
        Some(ts) => {
            sim_ctl(
                &s.sim,
                "act/click",
                json!({"user": s.user, "channel": dm, "ts": ts, "action_id": FEEDBACK_ACTION,
                       "button": "positive"}),
            )
            .await
        }
        None => Value::Null,
    };
    let export = || async {
        let out = cli(&["feedback", "export", "--installation", inst], db).await;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect::<Vec<Value>>()
    };
    let line = match &decision {
        Some(d) => {
            until(Duration::from_secs(10), || async {
                export()
                    .await
                    .into_iter()
                    .find(|l| l["decision"] == json!(d))
            })
            .await
        }
        None => None,
    };
    let exported = line.as_ref().map(Value::to_string).unwrap_or_default();
    let keys: Vec<&str> = line
        .as_ref()
        .and_then(Value::as_object)
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let textless = line.is_some()
        && keys.iter().all(|k| {
            [
                "decision",
                "labels",
                "model",
                "thread_version",
                "time",
                "verdict",
            ]
            .contains(k)
        })
        && !exported.contains("api-7")
        && !exported.contains("Answering");
    let verdict = line
        .as_ref()
        .and_then(|l| l["verdict"].as_str())
        .unwrap_or("none");
    let labels: Vec<&str> = line
        .as_ref()
        .and_then(|l| l["labels"].as_array())
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    // Greeted once: both openings reached threadline, one greeting.
    let openings = sim_get(&s.sim, &format!("deliveries?app_id={}", s.app)).await["deliveries"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter(|x| x["event_type"] == "app_home_opened" && x["status"] == 200)
                .count()
        })
        .unwrap_or(0);
    // (the story's one tab: Slack's call log names no channel for
    // `channel_id`)
    let greetings =
        sim_get(&s.sim, "calls?method=assistant.threads.setSuggestedPrompts").await["calls"]
            .as_array()
            .map(|c| c.iter().filter(|c| c["outcome"] == "ok").count())
            .unwrap_or(0);
    let opened = tab().await["opened"].as_u64().unwrap_or(0);
    let answered = if answers.is_empty() {
        "no reply in the question's own thread".to_owned()
    } else {
        format!(
            "{} in the question's own thread, {}, {}, {}, {} feedback buttons",
            replies(answers.len()),
            if answer["streaming_state"].is_string() {
                format!("streamed ({})", render_steps(&shown))
            } else {
                "posted whole".into()
            },
            if labelled {
                "labelled as AI"
            } else {
                "unlabelled"
            },
            if background {
                format!(
                    "with the channel's {} newest messages as background",
                    said.len()
                )
            } else {
                "without the channel as background".into()
            },
            if decision.is_some() {
                "with"
            } else {
                "without"
            },
        )
    };
    let clicked = match &click["status"] {
        Value::Null => "nothing to click".to_owned(),
        status => format!("👍 clicked, Slack's request answered {status}"),
    };
    let exported_as = match &line {
        Some(_) => format!(
            "{verdict} for that answer's decision ({}), {}",
            labels.join(", "),
            if textless {
                "ids and labels only"
            } else {
                "with more than ids"
            }
        ),
        None => "no line for the answer".to_owned(),
    };
    Chapter {
        title: "The agent's Messages tab: greeted once, a DM question streamed with its steps, a 👍 recorded",
        slack: format!(
            "the tab opened {} ({openings} app_home_opened delivered), its {prompts} suggested prompts set {}; \
             looking at <#{}>, the person asks at the top of the DM: {answered}; {clicked}",
            times(opened as usize),
            times(greetings),
            s.channel,
        ),
        recorded: format!(
            "the tab's viewed channel {}; {}; `threadline feedback export`: {exported_as}",
            if viewed {
                s.channel.as_str()
            } else {
                "not recorded"
            },
            chain(&decisions),
        ),
        verdict: check(&[
            (allowed, "DMs allowed and streaming on by policy".into()),
            (
                prompts == 3 && greetings == 1,
                format!("the tab's 3 prompts set once, not {prompts} set {greetings} times"),
            ),
            (
                reopened && opened == 2 && openings == 2,
                "the tab opened twice, both openings delivered".into(),
            ),
            (
                viewed,
                "the channel looked at recorded as the tab's context".into(),
            ),
            (
                answers.len() == 1 && answer["thread_ts"] == json!(asked),
                format!(
                    "one answer in the question's own thread, not {}",
                    answers.len()
                ),
            ),
            (
                only_the_question,
                "only the question at the top of the DM, nothing of the app".into(),
            ),
            (
                streaming
                    == [
                        step(Stage::Read, "complete"),
                        step(Stage::Write, "in_progress"),
                    ],
                "seen streaming: the thread read, the answer being written".into(),
            ),
            (
                starts == 1 && answer["streaming_state"] == "completed",
                "one stream, stopped".into(),
            ),
            (
                shown
                    == [
                        step(Stage::Read, "complete"),
                        step(Stage::Write, "complete"),
                        step(Stage::Check, "complete"),
                    ],
                "its three steps complete".into(),
            ),
            (
                background && read == 1,
                "the viewed channel read once, its latest messages in the answer".into(),
            ),
            (labelled, "the answer is labelled".into()),
            (decisions == ["published"], "one decision, published".into()),
            (
                decision.is_some(),
                "feedback buttons naming the answer's decision".into(),
            ),
            (click["status"] == 200, "Slack delivered the click".into()),
            (
                verdict == "positive" && labels == ["streamed", "assistant_pane"],
                "the export holds the 👍 for the streamed answer to a DM question".into(),
            ),
            (textless, "the export holds no text".into()),
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_calls_count_only_answered_calls_of_every_provider() {
        let text = "# TYPE threadline_model_calls_total counter
threadline_model_calls_total{provider=\"builtin\",result=\"ok\"} 8
threadline_model_calls_total{provider=\"primary\",result=\"ok\"} 2
threadline_model_calls_total{provider=\"primary\",result=\"timeout\"} 5
threadline_model_calls_total{provider=\"primary\",result=\"circuit_open\"} 1
threadline_model_latency_seconds_count{provider=\"primary\",result=\"ok\"} 7
";
        assert_eq!(model_calls_answered(text), 10);
        assert_eq!(model_calls_answered(""), 0);
    }

    #[test]
    fn an_answer_names_its_decision_only_with_both_buttons_naming_it() {
        let answer = |blocks: Value| json!({"blocks": blocks});
        let label = json!({"type": "context", "elements": []});
        let block = threadline_domain::feedback::block("0193-d");
        assert_eq!(
            feedback_decision(&answer(json!([label, block]))).as_deref(),
            Some("0193-d")
        );
        assert_eq!(feedback_decision(&answer(json!([label]))), None);
        assert_eq!(feedback_decision(&json!({})), None);
        let mut crossed = block.clone();
        crossed["elements"][0]["negative_button"]["value"] = "negative:0193-e".into();
        assert_eq!(feedback_decision(&answer(json!([crossed]))), None);
        let mut swapped = block;
        swapped["elements"][0]["positive_button"]["value"] = "negative:0193-d".into();
        assert_eq!(feedback_decision(&answer(json!([swapped]))), None);
    }

    #[test]
    fn steps_are_read_from_task_cards_in_order_and_rendered_with_their_status() {
        let m = json!({"blocks": [
            {"type": "task_card", "task_id": "threadline_read", "title": "Reading the thread", "status": "complete"},
            {"type": "markdown", "text": "words"},
            {"type": "task_card", "task_id": "threadline_write", "title": "Writing the answer", "status": "in_progress"},
        ]});
        let s = steps(&m);
        assert_eq!(
            s,
            [
                ("Reading the thread".to_owned(), "complete".to_owned()),
                ("Writing the answer".to_owned(), "in_progress".to_owned())
            ]
        );
        assert_eq!(
            render_steps(&s),
            "Reading the thread ✓ · Writing the answer (in_progress)"
        );
        assert_eq!(render_steps(&steps(&json!({"text": "whole"}))), "no steps");
        assert_eq!(
            (times(1), times(2), times(0)),
            ("once".into(), "twice".into(), "0 times".into())
        );
    }

    #[test]
    fn totals_that_disagree_fail_the_story() {
        let mut story = Story {
            chapters: vec![],
            totals: Totals {
                model_calls: 8,
                model_calls_metrics: 8,
                ..Totals::default()
            },
            oracle: OracleSummary {
                replies: 0,
                questions: 0,
                answered: 0,
                explained: vec![],
                crossed: 0,
                violations: vec![],
            },
        };
        assert!(story.passed(), "{}", story.report());
        assert!(story.report().contains("8 model calls (8 on"));
        story.totals.model_calls = 9;
        assert!(!story.passed());
        assert!(story.report().contains("DISAGREEMENT"));
        story.totals.model_calls = 1;
        story.totals.model_calls_metrics = 1;
        assert!(story.report().contains("1 model call (1 on"));
    }
}
