//! The chaos soak: a seeded generator drives several workspaces, channels
//! and threads with random human activity (mentions, replies, edits,
//! deletes), Slack retries, lost post responses, 429s and SIGKILLed
//! services; then a checker proves the invariants from Slack's ground truth
//! (slack-sim) and threadline's records:
//!
//! 1. at most one reply per source event;
//! 2. no reply bound to an outdated thread version;
//! 3. every acknowledged event reaches a terminal state;
//! 4. no outbox row, decision or reply intent stuck without an
//!    operator-visible reason.
//!
//! A failure prints the seed and the actions that touched the offending
//! thread (the minimal trace to replay).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{Stack, sim_ctl, sim_get};

/// The emulator's seeded generator (SplitMix64), so a seed replays.
pub use threadline_slack_sim::model::Rng;

/// A number below `n` (0 for 0).
fn below(rng: &mut Rng, n: u64) -> u64 {
    if n == 0 { 0 } else { rng.next_u64() % n }
}

/// The settings a soak runs the stack with: a model that takes a moment
/// (so the thread can change under it), and short recovery times, so that
/// a killed worker's message is back in 3 s (not a minute), a post whose
/// publisher died counts as unknown after 4 s, and a killed inference's
/// model call is taken over after 2 × 1 s + 10 s.
pub fn settings() -> Vec<(&'static str, String)> {
    [
        ("THREADLINE_BUILTIN_LATENCY_MS", "400"),
        ("THREADLINE_SLACK_TIMEOUT_MS", "800"),
        ("THREADLINE_RECONCILE_WINDOW_MS", "1500"),
        ("THREADLINE_REDELIVERY_MS", "3000"),
        ("THREADLINE_SENDING_STALE_MS", "4000"),
        ("THREADLINE_MODEL_TIMEOUT_MS", "1000"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect()
}

#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    pub steps: usize,
    /// Workspaces besides the stack's own.
    pub extra_workspaces: usize,
    /// Kill each service with SIGKILL (and restart it) at least once.
    pub kills: bool,
    /// Longest pause between two actions.
    pub max_pause: Duration,
}

#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub actions: usize,
    pub replies: usize,
    pub kills: usize,
    /// Kills that found acknowledged work not yet finished.
    pub kills_mid_flight: usize,
    /// How long the actions took, and then the settling.
    pub acting: Duration,
    pub settling: Duration,
    pub violations: Vec<String>,
    /// Per offending thread, the actions that touched it.
    pub traces: Vec<String>,
}

impl Report {
    pub fn render(&self) -> String {
        let mut out = format!(
            "chaos soak, seed {}: {} actions in {:.0} s, {} service kills ({} with work in flight), {} replies in Slack; settled {:.0} s later\n",
            self.seed,
            self.actions,
            self.acting.as_secs_f64(),
            self.kills,
            self.kills_mid_flight,
            self.replies,
            self.settling.as_secs_f64()
        );
        if self.violations.is_empty() {
            out.push_str("every invariant held\n");
        } else {
            out.push_str(&format!(
                "INVARIANTS BROKEN (replay with seed {}):\n",
                self.seed
            ));
            for v in &self.violations {
                out.push_str(&format!("  - {v}\n"));
            }
            for t in &self.traces {
                out.push_str(t);
            }
        }
        out
    }
}

#[derive(Clone)]
struct Person {
    user: String,
    channel: String,
    bot: String,
}

struct Thread {
    person: usize,
    root: String,
    /// Live human messages (ts).
    messages: Vec<String>,
}

const SERVICES: [&str; 4] = ["gateway", "context-builder", "inference", "publisher"];

/// Runs the soak on `s` and checks the invariants.
pub async fn soak(s: &mut Stack, cfg: &Config) -> Report {
    let mut rng = Rng::new(cfg.seed);
    let mut people = vec![Person {
        user: s.user.clone(),
        channel: s.channel.clone(),
        bot: s.bot_user.clone(),
    }];
    let mut teams = vec![s.team.clone()];
    for i in 0..cfg.extra_workspaces {
        let w = s.add_workspace(&format!("Chaos {i}")).await;
        teams.push(w.team.clone());
        people.push(Person {
            user: w.user,
            channel: w.channel,
            bot: w.bot_user,
        });
    }
    // A second channel in every workspace, the bot a member: threads run
    // in several channels of each workspace at once.
    for (p, team) in people.clone().into_iter().zip(teams) {
        let channel = sim_ctl(
            &s.sim,
            "channels",
            json!({"team_id": team, "name": "incidents", "kind": "public",
                   "members": [p.user, p.bot]}),
        )
        .await["id"]
            .as_str()
            .expect("a channel id")
            .to_owned();
        people.push(Person { channel, ..p });
    }
    // Kill each service once, at a random step of its own quarter.
    let mut kill_at: BTreeMap<usize, usize> = BTreeMap::new();
    if cfg.kills && cfg.steps >= 8 {
        let quarter = cfg.steps / 4;
        for (n, service) in [1usize, 2, 3, 0].into_iter().enumerate() {
            let at = n * quarter + 1 + below(&mut rng, (quarter - 1) as u64) as usize;
            kill_at.insert(at, service);
        }
    }
    let mut threads: Vec<Thread> = Vec::new();
    let mut log: Vec<(Option<String>, String)> = Vec::new();
    let mut kills = 0;
    let mut kills_mid_flight = 0;
    let started = Instant::now();
    for step in 0..cfg.steps {
        if let Some(&i) = kill_at.get(&step) {
            // What was in flight when the process died (for the log).
            let in_flight: i64 = sqlx::query_scalar(
                "SELECT (SELECT count(*) FROM event_receipts WHERE state IN ('accepted', 'processing'))
                      + (SELECT count(*) FROM outbox)
                      + (SELECT count(*) FROM decisions WHERE status IN ('calling', 'proposed'))
                      + (SELECT count(*) FROM reply_intents WHERE state IN ('pending', 'sending'))",
            )
            .fetch_one(&s.db.pool)
            .await
            .unwrap_or(-1);
            s.kill_and_restart(i).await;
            kills += 1;
            if in_flight > 0 {
                kills_mid_flight += 1;
            }
            log.push((
                None,
                format!(
                    "step {step}: SIGKILL {} and restart ({in_flight} items in flight)",
                    SERVICES[i]
                ),
            ));
        }
        let roll = below(&mut rng, 100);
        let pick_thread = |rng: &mut Rng, threads: &Vec<Thread>| {
            (!threads.is_empty()).then(|| below(rng, threads.len() as u64) as usize)
        };
        match roll {
            0..=24 => {
                let p = below(&mut rng, people.len() as u64) as usize;
                let who = &people[p];
                let root = post(s, who, &format!("<@{}> issue {step}?", who.bot), None).await;
                log.push((
                    Some(root.clone()),
                    format!(
                        "step {step}: mention starts thread {root} in {}",
                        who.channel
                    ),
                ));
                threads.push(Thread {
                    person: p,
                    root: root.clone(),
                    messages: vec![root],
                });
            }
            25..=59 => {
                let Some(t) = pick_thread(&mut rng, &threads) else {
                    continue;
                };
                let mention = roll >= 45;
                let who = people[threads[t].person].clone();
                let text = if mention {
                    format!("<@{}> and now? ({step})", who.bot)
                } else {
                    format!("more detail {step}")
                };
                let root = threads[t].root.clone();
                let ts = post(s, &who, &text, Some(&root)).await;
                threads[t].messages.push(ts.clone());
                log.push((
                    Some(root),
                    format!(
                        "step {step}: {} reply {ts}",
                        if mention { "mention" } else { "plain" }
                    ),
                ));
            }
            60..=71 => {
                let Some(t) = pick_thread(&mut rng, &threads) else {
                    continue;
                };
                if threads[t].messages.is_empty() {
                    continue;
                }
                let m = threads[t].messages
                    [below(&mut rng, threads[t].messages.len() as u64) as usize]
                    .clone();
                let who = people[threads[t].person].clone();
                sim_ctl(
                    &s.sim,
                    "act/edit",
                    json!({"user": who.user, "channel": who.channel, "ts": m,
                           "text": format!("<@{}> edited at {step}", who.bot)}),
                )
                .await;
                log.push((
                    Some(threads[t].root.clone()),
                    format!("step {step}: edit {m}"),
                ));
            }
            72..=77 => {
                let Some(t) = pick_thread(&mut rng, &threads) else {
                    continue;
                };
                if threads[t].messages.len() < 2 {
                    continue;
                }
                // Never the root: a deleted root leaves nothing to check.
                let k = 1 + below(&mut rng, (threads[t].messages.len() - 1) as u64) as usize;
                let m = threads[t].messages.remove(k);
                let who = people[threads[t].person].clone();
                sim_ctl(
                    &s.sim,
                    "act/delete",
                    json!({"channel": who.channel, "ts": m}),
                )
                .await;
                log.push((
                    Some(threads[t].root.clone()),
                    format!("step {step}: delete {m}"),
                ));
            }
            78..=85 => {
                sim_ctl(
                    &s.sim,
                    "faults",
                    json!({"method": "events", "mode": "hold_past_deadline", "times": 3}),
                )
                .await;
                log.push((
                    None,
                    format!("step {step}: the next 3 deliveries count as too late (retries)"),
                ));
            }
            86..=92 => {
                sim_ctl(
                    &s.sim,
                    "faults",
                    json!({"method": "chat.postMessage", "mode": "lost_response", "latency_ms": 1500}),
                )
                .await;
                log.push((
                    None,
                    format!("step {step}: the next post's response is lost"),
                ));
            }
            _ => {
                sim_ctl(
                    &s.sim,
                    "faults",
                    json!({"method": "chat.postMessage", "mode": "ratelimited", "retry_after": 1}),
                )
                .await;
                log.push((None, format!("step {step}: the next post is answered 429")));
            }
        }
        let pause = below(&mut rng, cfg.max_pause.as_millis() as u64 + 1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    crate::sim_clear_faults(&s.sim).await;
    let acting = started.elapsed();
    quiesce(s).await;
    let settling = started.elapsed() - acting;
    let (violations, offending, replies) = check(s, &people).await;
    let traces = offending
        .iter()
        .map(|root| {
            let mut t = format!("  trace of thread {root} (with the global faults and kills):\n");
            for (thread, line) in &log {
                if thread.as_deref().is_none_or(|r| r == root) {
                    t.push_str(&format!("    {line}\n"));
                }
            }
            t
        })
        .collect();
    Report {
        seed: cfg.seed,
        actions: cfg.steps,
        replies,
        kills,
        kills_mid_flight,
        acting,
        settling,
        violations,
        traces,
    }
}

async fn post(s: &Stack, who: &Person, text: &str, thread: Option<&str>) -> String {
    s.post_as(&who.user, &who.channel, text, thread).await
}

/// Waits until nothing is in flight (and stays so for three seconds), or
/// 50 s pass; the checker reports whatever is still open.
async fn quiesce(s: &Stack) {
    let start = Instant::now();
    let mut quiet_since: Option<Instant> = None;
    while start.elapsed() < Duration::from_secs(50) {
        let open: Option<i64> = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM event_receipts WHERE state IN ('accepted', 'processing'))
                  + (SELECT count(*) FROM outbox)
                  + (SELECT count(*) FROM decisions WHERE status IN ('calling', 'proposed', 'approved'))
                  + (SELECT count(*) FROM reply_intents WHERE state IN ('pending', 'sending', 'unknown', 'reconciling', 'failed_retryable'))",
        )
        .fetch_one(&s.db.pool)
        .await
        .ok();
        if open == Some(0) {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(3) {
                return;
            }
        } else {
            quiet_since = None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The invariants; returns violations, offending thread roots and the
/// number of replies Slack shows.
async fn check(s: &Stack, people: &[Person]) -> (Vec<String>, BTreeSet<String>, usize) {
    let mut violations = Vec::new();
    let mut offending = BTreeSet::new();
    let pool = &s.db.pool;

    // 1. At most one reply per source event (Slack's side).
    let posts = sim_get(&s.sim, &format!("app_posts?app_id={}", s.app)).await;
    for t in posts["per_trigger"].as_array().cloned().unwrap_or_default() {
        if t["count"].as_i64().unwrap_or(0) > 1 {
            let root = t["thread_ts"].as_str().unwrap_or_default().to_owned();
            violations.push(format!(
                "{} replies to message {} in thread {root}",
                t["count"], t["trigger_ts"]
            ));
            offending.insert(root);
        }
    }
    let replies: usize = posts["per_thread"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| x["count"].as_u64().unwrap_or(0) as usize)
                .sum()
        })
        .unwrap_or(0);

    // 2. No reply bound to an outdated thread version: every content fact
    // recorded a second or more before the reply was claimed is in the
    // version the reply was computed from.
    let mut threads: BTreeSet<(String, String)> = BTreeSet::new();
    for t in posts["per_thread"].as_array().cloned().unwrap_or_default() {
        threads.insert((
            t["channel"].as_str().unwrap_or_default().to_owned(),
            t["thread_ts"].as_str().unwrap_or_default().to_owned(),
        ));
    }
    for (channel, root) in &threads {
        let v = sim_get(&s.sim, &format!("channels/{channel}/threads/{root}")).await;
        for m in v["messages"].as_array().cloned().unwrap_or_default() {
            let Some(intent) = m
                .pointer("/metadata/event_payload/intent_id")
                .and_then(Value::as_str)
                .and_then(|i| uuid::Uuid::parse_str(i).ok())
            else {
                continue;
            };
            let row: Option<(i64, i64)> = sqlx::query_as(
                "SELECT d.thread_version,
                        (SELECT count(*) FROM message_facts f
                           JOIN thread_messages tm ON tm.installation_id = f.installation_id
                                                  AND tm.channel_id = f.channel_id AND tm.ts = f.ts
                          WHERE f.installation_id = i.installation_id AND f.channel_id = i.channel_id
                            AND tm.root_ts = i.root_ts
                            -- our own replies are kept without a new version
                            AND NOT (f.fact = 'create' AND tm.speaker = 'assistant')
                            AND f.recorded_at < i.sending_since - interval '1 second')
                   FROM reply_intents i JOIN decisions d ON d.id = i.decision_id
                  WHERE i.id = $1",
            )
            .bind(intent)
            .fetch_optional(pool)
            .await
            .ok()
            .flatten();
            match row {
                Some((version, known)) if version >= known => {}
                Some((version, known)) => {
                    violations.push(format!(
                        "reply {} in thread {root} was computed at version {version} though {known} changes were recorded before it was claimed",
                        m["ts"]
                    ));
                    offending.insert(root.clone());
                }
                None => {
                    violations.push(format!(
                        "reply {} in thread {root} names intent {intent}, which threadline does not know",
                        m["ts"]
                    ));
                    offending.insert(root.clone());
                }
            }
        }
    }

    // 3. Every acknowledged event reaches a terminal state, and every
    // delivery the gateway acknowledged has its receipt.
    let acked: BTreeSet<String> = sim_get(&s.sim, "deliveries").await["deliveries"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|d| {
            d["status"]
                .as_u64()
                .is_some_and(|c| (200..300).contains(&c))
        })
        .filter_map(|d| d["event_id"].as_str().map(str::to_owned))
        .collect();
    let receipts: BTreeMap<String, (String, Option<String>)> =
        sqlx::query_as::<_, (String, String, Option<String>)>(
            "SELECT event_id, state, thread_ts FROM event_receipts",
        )
        .fetch_all(pool)
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|(e, st, t)| (e, (st, t)))
        .collect();
    for event in &acked {
        match receipts.get(event) {
            None => violations.push(format!("acknowledged event {event} has no receipt (lost)")),
            Some((state, thread)) if state == "accepted" || state == "processing" => {
                violations.push(format!("event {event} never finished ({state})"));
                if let Some(t) = thread {
                    offending.insert(t.clone());
                }
            }
            _ => {}
        }
    }

    // 4. Nothing stuck without a reason an operator can see.
    let outbox: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE last_error IS NULL")
        .fetch_one(pool)
        .await
        .unwrap_or(-1);
    if outbox != 0 {
        violations.push(format!("{outbox} outbox rows unpublished without an error"));
    }
    let stuck: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT 'decision ' || d.id, d.status, d.root_ts FROM decisions d
          WHERE d.status IN ('calling', 'proposed', 'approved')
            -- waiting on an intent held for an operator is a visible reason
            AND NOT EXISTS (SELECT 1 FROM reply_intents i
                             WHERE i.installation_id = d.installation_id AND i.event_id = d.event_id
                               AND i.state = 'held' AND i.error_code IS NOT NULL)
         UNION ALL
         SELECT 'reply intent ' || id || ' (' || coalesce(error_code, '-') || ', attempts ' || attempts
                || ', due in ' || round(extract(epoch FROM next_attempt_at - now()))::text || ' s, decision '
                || decision_id || ')', state, root_ts FROM reply_intents
          WHERE state IN ('pending', 'sending', 'unknown', 'reconciling', 'failed_retryable')
             OR (state IN ('held', 'failed_permanent') AND error_code IS NULL)",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    for (what, state, root) in stuck {
        violations.push(format!("{what} stuck in {state} (thread {root})"));
        offending.insert(root);
    }
    // Nothing in the soak is poison: a dead letter means retries ran out.
    let dlq = threadline_runtime::bus::Topology::new(s.prefix.clone()).dead_letter_stream();
    let dead = threadline_testkit::stream_len(&s.js, &dlq).await;
    if dead > 0 {
        violations.push(format!(
            "{dead} message(s) dead-lettered (retries exhausted)"
        ));
    }
    let _ = people;
    (violations, offending, replies)
}
