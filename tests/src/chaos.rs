//! The chaos soak: a seeded generator drives several workspaces, channels
//! and threads with random human activity (mentions, replies, edits,
//! deletes) while faults are thrown at every part: Slack retries, lost
//! post responses, 429s, posts Slack applies after the client gave up,
//! human replies injected the moment an answer reaches Slack, services
//! SIGKILLed and restarted, services frozen (SIGSTOP) for longer than the
//! sending stale time, a Postgres outage and a NATS outage longer than the
//! ack wait. Human activity goes on through all of it.
//!
//! The verdict comes from the oracle (`crate::oracle`), which reads only
//! what Slack shows and the answers' text, plus threadline's own records
//! for what Slack cannot show: every acknowledged delivery reaches a
//! terminal state, no dead letters (no fault here is poison), nothing stuck
//! without a reason, every crossed-in-flight answer recorded and
//! reconsidered, every unanswered question explained to an operator.
//!
//! A failure prints the seed and the actions that touched each offending
//! thread (the minimal trace to replay).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{Stack, sim_ctl};

/// The emulator's seeded generator (SplitMix64), so a seed replays.
pub use threadline_slack_sim::model::Rng;

/// A number below `n` (0 for 0).
fn below(rng: &mut Rng, n: u64) -> u64 {
    if n == 0 { 0 } else { rng.next_u64() % n }
}

/// The settings a soak runs the stack with: a model that takes a moment
/// (so the thread can change under it), and short recovery times, so that
/// a killed worker's message is back in 3 s (not a minute), a post whose
/// publisher died counts as unknown after 4 s, a killed inference's model
/// call is taken over after 2 × 1 s + 10 s, and a held reply's thread is
/// read again after 2 s.
pub fn settings() -> Vec<(&'static str, String)> {
    [
        ("THREADLINE_BUILTIN_LATENCY_MS", "400"),
        ("THREADLINE_SLACK_TIMEOUT_MS", "800"),
        ("THREADLINE_RECONCILE_WINDOW_MS", "1500"),
        ("THREADLINE_REDELIVERY_MS", "3000"),
        ("THREADLINE_SENDING_STALE_MS", "4000"),
        ("THREADLINE_MODEL_TIMEOUT_MS", "1000"),
        ("THREADLINE_SWEEP_MS", "1000"),
        ("THREADLINE_SWEEP_IDLE_MS", "5000"),
        ("THREADLINE_LATE_CHECK_MS", "2000"),
        ("THREADLINE_INSTALLATION_CACHE_MS", "0"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect()
}

/// The faults beyond Slack's own (retries, 429s, lost responses), each
/// switched off by a zero.
#[derive(Debug, Clone)]
pub struct Adversary {
    /// Services frozen with SIGSTOP, each for `pause` (longer than the
    /// sending stale time), then resumed.
    pub pauses: usize,
    pub pause: Duration,
    /// One Postgres outage of this length (the database refuses
    /// connections and its sessions are cut).
    pub db_outage: Duration,
    /// One outage of the broker of this length (longer than the ack wait).
    pub nats_outage: Duration,
    /// Every service SIGKILLed and restarted this many times.
    pub kill_rounds: usize,
}

impl Adversary {
    /// Everything, at the lengths the issue asks for.
    pub fn full() -> Self {
        Self {
            pauses: 4,
            pause: Duration::from_secs(6),
            db_outage: Duration::from_secs(90),
            nats_outage: Duration::from_secs(8),
            kill_rounds: 1,
        }
    }

    /// Slack's faults only.
    pub fn none() -> Self {
        Self {
            pauses: 0,
            pause: Duration::ZERO,
            db_outage: Duration::ZERO,
            nats_outage: Duration::ZERO,
            kill_rounds: 0,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    /// Human actions (posts, replies, edits, deletes), each a Slack event
    /// or two.
    pub events: usize,
    /// Workspaces besides the stack's own.
    pub extra_workspaces: usize,
    /// Channels of each workspace besides its first.
    pub extra_channels: usize,
    /// Mean human actions per second.
    pub rate: f64,
    pub adversary: Adversary,
    /// How late after its acknowledgement a message may be missing from a
    /// reply without counting against it (then it crossed in flight).
    pub grace: Duration,
}

#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub events: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, usize>,
    /// Kills and pauses that found acknowledged work not yet finished.
    pub hit_mid_flight: usize,
    pub replies: usize,
    pub questions: usize,
    pub answered: usize,
    /// Questions without a reply that Slack explains, by reason, and those
    /// an operator's view explains.
    pub explained: BTreeMap<String, usize>,
    pub crossed: usize,
    /// How long the actions took, and then the settling.
    pub acting: Duration,
    pub settling: Duration,
    /// Every violation, by kind.
    pub violations: Vec<(&'static str, String)>,
    /// Per offending thread, the actions that touched it.
    pub traces: Vec<String>,
}

impl Report {
    pub fn violations_by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for (k, _) in &self.violations {
            *m.entry(*k).or_default() += 1;
        }
        m
    }

    pub fn render(&self) -> String {
        let list = |m: &BTreeMap<&'static str, usize>| {
            if m.is_empty() {
                "none".to_owned()
            } else {
                m.iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let explained: Vec<String> = self
            .explained
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let mut out = format!(
            "chaos soak, seed {}: {} human events in {:.0} s, settled {:.0} s later\n\
             faults injected: {}\n\
             kills and pauses that hit acknowledged work mid-flight: {}\n\
             Slack shows {} replies to {} questions: {} answered once; explained: {}\n\
             answers crossed in flight (recorded and reconsidered): {}\n\
             violations: {}\n",
            self.seed,
            self.events,
            self.acting.as_secs_f64(),
            self.settling.as_secs_f64(),
            list(&self.faults),
            self.hit_mid_flight,
            self.replies,
            self.questions,
            self.answered,
            if explained.is_empty() {
                "none".to_owned()
            } else {
                explained.join(", ")
            },
            self.crossed,
            list(&self.violations_by_kind()),
        );
        if self.violations.is_empty() {
            out.push_str("every invariant held\n");
        } else {
            out.push_str(&format!(
                "INVARIANTS BROKEN (replay with --seed {}):\n",
                self.seed
            ));
            for (k, v) in self.violations.iter().take(200) {
                out.push_str(&format!("  - [{k}] {v}\n"));
            }
            for t in self.traces.iter().take(20) {
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

/// Something under way that ends at a given time.
enum Episode {
    Paused { service: usize, pid: u32 },
    DbDown,
    NatsDown,
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status();
}

/// Runs the soak on `s` (whose services use `broker`, when a NATS outage
/// is asked for) and checks the invariants.
pub async fn soak(
    s: &mut Stack,
    mut broker: Option<&mut crate::broker::Broker>,
    cfg: &Config,
) -> Report {
    let mut rng = Rng::new(cfg.seed);
    let mut report = Report {
        seed: cfg.seed,
        events: cfg.events,
        ..Default::default()
    };
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
    // More channels in every workspace, the bot a member: threads run in
    // several channels of each workspace at once.
    for (p, team) in people.clone().into_iter().zip(teams) {
        for c in 0..cfg.extra_channels {
            let channel = sim_ctl(
                &s.sim,
                "channels",
                json!({"team_id": team, "name": format!("incidents-{c}"), "kind": "public",
                       "members": [p.user, p.bot]}),
            )
            .await["id"]
                .as_str()
                .expect("a channel id")
                .to_owned();
            s.judge_also(&channel, &p.bot);
            people.push(Person {
                channel,
                ..p.clone()
            });
        }
    }

    // The schedule of the big faults, by event index.
    let adv = &cfg.adversary;
    let n = cfg.events.max(1);
    let mut at: BTreeMap<usize, Vec<&'static str>> = BTreeMap::new();
    let mut spread = |rng: &mut Rng, k: usize, what: &'static str, from: f64, to: f64| {
        for i in 0..k {
            let lo = from + (to - from) * i as f64 / k as f64;
            let hi = from + (to - from) * (i + 1) as f64 / k as f64;
            let span = ((hi - lo) * n as f64).max(1.0) as u64;
            let step = (lo * n as f64) as usize + below(rng, span) as usize;
            at.entry(step.min(n - 1)).or_default().push(what);
        }
    };
    // Kills and pauses first, then the broker's outage, then the
    // database's (the longest): activity goes on through each, and what
    // Slack could not deliver during an outage it gives up on.
    for r in 0..adv.kill_rounds {
        let (from, to) = (
            0.05 + 0.5 * r as f64 / adv.kill_rounds as f64,
            0.05 + 0.5 * (r + 1) as f64 / adv.kill_rounds as f64,
        );
        for what in [
            "kill:context-builder",
            "kill:inference",
            "kill:publisher",
            "kill:gateway",
        ] {
            spread(&mut rng, 1, what, from, to);
        }
    }
    spread(&mut rng, adv.pauses, "pause", 0.05, 0.6);
    if !adv.nats_outage.is_zero() && broker.is_some() {
        spread(&mut rng, 1, "nats_outage", 0.6, 0.65);
    }
    if !adv.db_outage.is_zero() {
        spread(&mut rng, 1, "db_outage", 0.7, 0.75);
    }

    let mut threads: Vec<Thread> = Vec::new();
    let mut log: Vec<(Option<String>, String)> = Vec::new();
    let mut episodes: Vec<(Instant, Episode)> = Vec::new();
    let started = Instant::now();
    let mut faults: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut pauses_done = 0usize;
    for step in 0..cfg.events {
        // End what is due.
        let now = Instant::now();
        let (due, rest): (Vec<_>, Vec<_>) = episodes.into_iter().partition(|(end, _)| *end <= now);
        episodes = rest;
        for (_, e) in due {
            end_episode(s, broker.as_deref_mut(), e, step, &mut log).await;
        }
        for what in at.remove(&step).unwrap_or_default() {
            let busy = episodes
                .iter()
                .any(|(_, e)| matches!(e, Episode::Paused { .. }));
            let outage = episodes
                .iter()
                .any(|(_, e)| matches!(e, Episode::DbDown | Episode::NatsDown));
            match what {
                // A service restarted during an outage waits for it at start
                // (up to a minute): kills wait for the outage to end.
                w if w.starts_with("kill:") && outage => {
                    at.entry(step + 1).or_default().push(w);
                }
                w if w.starts_with("kill:") => {
                    let i = SERVICES
                        .iter()
                        .position(|x| *x == &w[5..])
                        .expect("a service");
                    if episodes
                        .iter()
                        .any(|(_, e)| matches!(e, Episode::Paused { service, .. } if *service == i))
                    {
                        // Killed once it is running again.
                        at.entry(step + 1).or_default().push(w);
                        continue;
                    }
                    let in_flight = in_flight(s).await;
                    s.kill_and_restart(i).await;
                    *faults.entry("service_killed").or_default() += 1;
                    if in_flight > 0 {
                        report.hit_mid_flight += 1;
                    }
                    log.push((
                        None,
                        format!(
                            "step {step}: SIGKILL {} and restart ({in_flight} items in flight)",
                            SERVICES[i]
                        ),
                    ));
                }
                "pause" if !busy => {
                    // Each service in turn, the publisher first.
                    let i = [3usize, 1, 2, 0][pauses_done % 4];
                    pauses_done += 1;
                    let pid = s.services[i].child.id().expect("a running service");
                    let in_flight = in_flight(s).await;
                    signal(pid, "STOP");
                    *faults
                        .entry(
                            [
                                "gateway_paused",
                                "context_builder_paused",
                                "inference_paused",
                                "publisher_paused",
                            ][i],
                        )
                        .or_default() += 1;
                    if in_flight > 0 {
                        report.hit_mid_flight += 1;
                    }
                    log.push((
                        None,
                        format!(
                            "step {step}: SIGSTOP {} for {:?} ({in_flight} items in flight)",
                            SERVICES[i], adv.pause
                        ),
                    ));
                    episodes.push((
                        Instant::now() + adv.pause,
                        Episode::Paused { service: i, pid },
                    ));
                }
                // Another service is frozen now: this one waits its turn.
                "pause" => at.entry(step + 1).or_default().push("pause"),
                "db_outage" => {
                    s.db.take_down().await;
                    *faults.entry("postgres_outage").or_default() += 1;
                    log.push((
                        None,
                        format!("step {step}: Postgres down for {:?}", adv.db_outage),
                    ));
                    episodes.push((Instant::now() + adv.db_outage, Episode::DbDown));
                }
                "nats_outage" => {
                    if let Some(b) = broker.as_deref_mut() {
                        b.down().await;
                        *faults.entry("nats_outage").or_default() += 1;
                        log.push((
                            None,
                            format!("step {step}: NATS down for {:?}", adv.nats_outage),
                        ));
                        episodes.push((Instant::now() + adv.nats_outage, Episode::NatsDown));
                    }
                }
                _ => {}
            }
        }

        let roll = below(&mut rng, 100);
        let pick_thread = |rng: &mut Rng, threads: &Vec<Thread>| {
            (!threads.is_empty()).then(|| below(rng, threads.len() as u64) as usize)
        };
        match roll {
            0..=21 => {
                let p = below(&mut rng, people.len() as u64) as usize;
                let who = &people[p];
                let root = post(s, who, &format!("<@{}> issue {step}?", who.bot), None).await;
                if let Some(root) = root {
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
            }
            22..=55 => {
                let Some(t) = pick_thread(&mut rng, &threads) else {
                    continue;
                };
                let mention = roll >= 42;
                let who = people[threads[t].person].clone();
                let text = if mention {
                    format!("<@{}> and now? ({step})", who.bot)
                } else {
                    format!("more detail {step}")
                };
                let root = threads[t].root.clone();
                if let Some(ts) = post(s, &who, &text, Some(&root)).await {
                    threads[t].messages.push(ts.clone());
                    log.push((
                        Some(root),
                        format!(
                            "step {step}: {} reply {ts}",
                            if mention { "mention" } else { "plain" }
                        ),
                    ));
                }
            }
            56..=65 => {
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
                try_ctl(
                    s,
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
            66..=70 => {
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
                try_ctl(s, "act/delete", json!({"channel": who.channel, "ts": m})).await;
                log.push((
                    Some(threads[t].root.clone()),
                    format!("step {step}: delete {m}"),
                ));
            }
            71..=77 => {
                fault(
                    s,
                    json!({"method": "events", "mode": "hold_past_deadline", "times": 3}),
                )
                .await;
                *faults.entry("slack_retries").or_default() += 1;
                log.push((
                    None,
                    format!("step {step}: the next 3 deliveries count as too late (retries)"),
                ));
            }
            78..=81 => {
                fault(s, json!({"method": "chat.postMessage", "mode": "lost_response", "latency_ms": 1500})).await;
                *faults.entry("post_response_lost").or_default() += 1;
                log.push((
                    None,
                    format!("step {step}: the next post's response is lost"),
                ));
            }
            82..=85 => {
                fault(
                    s,
                    json!({"method": "chat.postMessage", "mode": "ratelimited", "retry_after": 1}),
                )
                .await;
                *faults.entry("post_429").or_default() += 1;
                log.push((None, format!("step {step}: the next post is answered 429")));
            }
            86..=89 => {
                // Slower than the client waits; Slack applies it anyway.
                fault(
                    s,
                    json!({"method": "chat.postMessage", "mode": "latency", "latency_ms": 2500}),
                )
                .await;
                *faults.entry("post_slower_than_timeout").or_default() += 1;
                log.push((
                    None,
                    format!("step {step}: the next post is applied after the client gave up"),
                ));
            }
            _ => {
                // A person replies the moment an answer reaches Slack.
                let p = below(&mut rng, people.len() as u64) as usize;
                let who = &people[p];
                let question = roll >= 95;
                let text = if question {
                    format!("<@{}> crossing question {step}?", who.bot)
                } else {
                    format!("crossing detail {step}")
                };
                fault(
                    s,
                    json!({"method": "chat.postMessage", "mode": "inject_reply", "user": who.user,
                                 "channel": who.channel, "text": text, "latency_ms": 200}),
                )
                .await;
                *faults
                    .entry(if question {
                        "question_injected_at_post"
                    } else {
                        "reply_injected_at_post"
                    })
                    .or_default() += 1;
                log.push((
                    None,
                    format!(
                        "step {step}: the next post in {} is crossed by a reply",
                        who.channel
                    ),
                ));
            }
        }
        if cfg.events >= 1000 && step > 0 && step % (cfg.events / 10) == 0 {
            eprintln!(
                "  … {step}/{} human events, {:.0} s",
                cfg.events,
                started.elapsed().as_secs_f64()
            );
        }
        // Pace: a mean of `rate` actions a second.
        let mean = 1000.0 / cfg.rate.max(0.1);
        let pause = below(&mut rng, (2.0 * mean) as u64 + 1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    // Whatever is still under way ends when it is due (an outage lasts
    // its whole length even when the activity ends first).
    episodes.sort_by_key(|(end, _)| *end);
    for (end, e) in std::mem::take(&mut episodes) {
        tokio::time::sleep_until(end.into()).await;
        end_episode(s, broker.as_deref_mut(), e, cfg.events, &mut log).await;
    }
    // Kills that had to wait past the last action happen now.
    for w in at
        .into_values()
        .flatten()
        .filter(|w| w.starts_with("kill:"))
    {
        let i = SERVICES
            .iter()
            .position(|x| *x == &w[5..])
            .expect("a service");
        s.kill_and_restart(i).await;
        *faults.entry("service_killed").or_default() += 1;
        log.push((
            None,
            format!("after the last action: SIGKILL {} and restart", SERVICES[i]),
        ));
    }
    crate::sim_clear_faults(&s.sim).await;
    let acting = started.elapsed();
    let unsettled = crate::quiesce(
        &s.db.pool,
        Some((&s.js, &s.prefix)),
        Duration::from_secs(120 + cfg.events as u64 / 20),
        Duration::from_secs(3),
    )
    .await;
    let settling = started.elapsed() - acting;

    let (j, mut violations) = s.verdict_by_kind(cfg.grace).await;
    let mut offending: BTreeSet<String> = j.offending.iter().map(|(_, r)| r.clone()).collect();
    violations.extend(records(s, &mut offending).await);
    if let Some(open) = unsettled {
        violations.push(("never_settled", open));
    }
    report.faults = faults;
    report.replies = j.replies;
    report.questions = j.questions;
    report.answered = j.answered;
    report.crossed = j.crossed.len();
    for (k, v) in &j.explained {
        report.explained.insert((*k).to_owned(), *v);
    }
    let by_operator = j.unexplained.len()
        - violations
            .iter()
            .filter(|(k, _)| *k == "unexplained_question")
            .count();
    if by_operator > 0 {
        report
            .explained
            .insert("operator_visible_reason".to_owned(), by_operator);
    }
    report.acting = acting;
    report.settling = settling;
    report.violations = violations;
    report.traces = offending
        .iter()
        .map(|root| {
            let mut t = format!("  trace of thread {root} (with the global faults):\n");
            for (thread, line) in &log {
                if thread.as_deref().is_none_or(|r| r == root) {
                    t.push_str(&format!("    {line}\n"));
                }
            }
            t
        })
        .collect();
    report
}

async fn end_episode(
    s: &Stack,
    broker: Option<&mut crate::broker::Broker>,
    e: Episode,
    step: usize,
    log: &mut Vec<(Option<String>, String)>,
) {
    match e {
        Episode::Paused { service, pid } => {
            signal(pid, "CONT");
            log.push((None, format!("step {step}: SIGCONT {}", SERVICES[service])));
        }
        Episode::DbDown => {
            s.db.bring_up().await;
            log.push((None, format!("step {step}: Postgres back")));
        }
        Episode::NatsDown => {
            if let Some(b) = broker {
                b.up().await;
                log.push((None, format!("step {step}: NATS back")));
            }
        }
    }
}

/// Acknowledged work not finished (for the log); -1 while Postgres is away.
async fn in_flight(s: &Stack) -> i64 {
    threadline_store::testing::receipts::in_flight_total(&s.db.pool)
        .await
        .unwrap_or(-1)
}

async fn try_ctl(s: &Stack, path: &str, body: Value) -> Option<Value> {
    let r = reqwest::Client::new()
        .post(format!("{}/_sim/{path}", s.sim.base_url))
        .json(&body)
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

async fn fault(s: &Stack, body: Value) {
    try_ctl(s, "faults", body).await;
}

async fn post(s: &Stack, who: &Person, text: &str, thread: Option<&str>) -> Option<String> {
    let mut body = json!({"user": who.user, "channel": who.channel, "text": text});
    if let Some(t) = thread {
        body["thread_ts"] = t.into();
    }
    try_ctl(s, "act/post", body)
        .await
        .and_then(|v| v["ts"].as_str().map(str::to_owned))
}

/// What Slack cannot show, from threadline's records.
async fn records(s: &Stack, offending: &mut BTreeSet<String>) -> Vec<(&'static str, String)> {
    let mut violations = Vec::new();
    let pool = &s.db.pool;
    // Every delivery the gateway acknowledged has its receipt, and every
    // receipt reached a terminal state.
    let acked: BTreeSet<String> = crate::sim_get(&s.sim, "deliveries").await["deliveries"]
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
        threadline_store::testing::receipts::receipt_outcomes(pool)
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.event_id, (r.state, r.thread_ts)))
            .collect();
    for event in &acked {
        match receipts.get(event) {
            None => violations.push((
                "lost_event",
                format!("acknowledged event {event} has no receipt"),
            )),
            Some((state, thread)) if state == "accepted" || state == "processing" => {
                violations.push((
                    "unfinished_event",
                    format!("event {event} never finished ({state})"),
                ));
                if let Some(t) = thread {
                    offending.insert(t.clone());
                }
            }
            _ => {}
        }
    }
    let outbox = threadline_store::testing::outbox::count_outbox(pool)
        .await
        .unwrap_or(-1);
    if outbox != 0 {
        violations.push(("stuck", format!("{outbox} outbox rows never published")));
    }
    let stuck = threadline_store::testing::decisions::stuck_work(pool)
        .await
        .unwrap_or_default();
    for threadline_store::testing::decisions::StuckWork {
        what,
        state,
        root_ts: root,
    } in stuck
    {
        violations.push(("stuck", format!("{what} stuck in {state} (thread {root})")));
        offending.insert(root);
    }
    let unreconsidered =
        threadline_store::testing::threads::count_unreconsidered_crossed_answers(pool)
            .await
            .unwrap_or(-1);
    if unreconsidered != 0 {
        violations.push((
            "crossed_not_reconsidered",
            format!(
                "{unreconsidered} answers recorded as crossed in flight were never reconsidered"
            ),
        ));
    }
    // No fault here is poison: a dead letter means work was given up.
    let dlq = threadline_runtime::bus::Topology::new(s.prefix.clone()).dead_letter_stream();
    let dead = threadline_testkit::stream_len(&s.js, &dlq).await;
    if dead > 0 {
        violations.push(("dead_letter", format!("{dead} message(s) dead-lettered")));
    }
    violations
}
