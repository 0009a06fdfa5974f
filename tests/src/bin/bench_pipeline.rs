//! `make bench` (second half): the whole pipeline's overhead. People post
//! mentions through slack-sim at a fixed rate into many channels; the
//! built-in model answers at once, so the time from a mention (its ts in
//! Slack) to the reply (the reply's ts in Slack) is threadline's own work:
//! two Events API deliveries, intake, relay, context, decision, claim and
//! post. Reports p50/p99/max, replies, duplicates and each service's peak
//! resident memory. Asserts nothing.
//!
//! `threadline-bench-pipeline [--rate 500] [--seconds 20] [--channels 100] [--warmup 0] [--timeline] [--share N] [--young]`

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use threadline_store::testing::server;
use threadline_tests::{Stack, sim_ctl, sim_get};

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ts_secs(ts: &str) -> f64 {
    ts.parse().unwrap_or(0.0)
}

fn peak_rss_mib(pid: Option<u32>) -> String {
    let Some(pid) = pid else { return "?".into() };
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or("?".into(), |kb| format!("{:.1} MiB", kb / 1024.0))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Where each answered mention's time went, from the ledger's own clocks
/// (Postgres `now()`, the start of the transaction that wrote the row) and
/// Slack's ts: p50 / p99 / max of each stage, in milliseconds.
async fn stage_breakdown(pool: &sqlx::PgPool, since: f64) {
    let rows = match threadline_store::testing::intents::stage_timings(pool, since).await {
        Ok(rows) => rows,
        Err(e) => {
            println!("stage breakdown unavailable: {e}");
            return;
        }
    };
    println!("where the time went (ledger clocks, ms):            p50      p99      max   (n)");
    for threadline_store::testing::intents::StageTiming {
        stage,
        count: n,
        p50_ms: p50,
        p99_ms: p99,
        max_ms: max,
    } in rows
    {
        println!("  {stage:<60} {p50:>8.1} {p99:>8.1} {max:>8.1}   ({n})");
    }
}

/// CPU seconds (user + system, with reaped children: Postgres backends that
/// ended) of every process on the machine, by pid, with what it is.
fn cpu_by_process() -> std::collections::HashMap<String, (&'static str, f64)> {
    let tick = 100.0; // USER_HZ on Linux
    let mut out = std::collections::HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ... utime(14) stime(15) cutime(16) cstime(17)
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let t: f64 = fields
            .get(11..15)
            .map(|f| f.iter().filter_map(|x| x.parse::<f64>().ok()).sum())
            .unwrap_or(0.0);
        let who = match comm {
            c if c.starts_with("threadline-gate") => "gateway (with relay)",
            c if c.starts_with("threadline-cont") => "context-builder",
            c if c.starts_with("threadline-infe") => "inference",
            c if c.starts_with("threadline-publ") => "publisher",
            c if c.starts_with("threadline-slac") => "slack-sim",
            c if c.starts_with("threadline-benc") => "load driver (this bench)",
            c if c.starts_with("postgres") => "postgres",
            c if c.starts_with("nats-server") => "nats-server",
            _ => "everything else",
        };
        out.insert(
            e.file_name().to_string_lossy().into_owned(),
            (who, t / tick),
        );
    }
    out
}

/// The CPU seconds each kind of process spent between two samples: each
/// process's own difference (a process that started meanwhile counts from
/// zero; one that ended meanwhile is left out, unless a sampled parent
/// reaped it), so a process that exits cannot make a figure negative.
fn cpu_between(
    before: &std::collections::HashMap<String, (&'static str, f64)>,
    after: &std::collections::HashMap<String, (&'static str, f64)>,
) -> std::collections::BTreeMap<&'static str, f64> {
    let mut out = std::collections::BTreeMap::new();
    for (pid, (who, t)) in after {
        let was = before
            .get(pid)
            .filter(|(w, _)| w == who)
            .map_or(0.0, |(_, t)| *t);
        *out.entry(*who).or_insert(0.0) += (t - was).max(0.0);
    }
    out
}

/// Top-level statements and commits in this database so far: statements
/// from `pg_stat_statements` where the server preloads it (`None`
/// otherwise), commits from `pg_stat_database`.
async fn statement_counts(pool: &sqlx::PgPool) -> (Option<i64>, i64) {
    let statements = server::statement_calls(pool)
        .await
        .ok()
        .map(|n| n.unwrap_or(0));
    let commits = server::commit_count(pool).await.unwrap_or(0);
    (statements, commits)
}

/// How long a backend may keep its statistics before reporting them
/// (Postgres reports an idle backend's counters within 10 s).
const STATS_LAG: Duration = Duration::from_secs(11);

/// Rows inserted, updated or deleted in each table of this database so
/// far (`pg_stat_user_tables`), and the WAL the whole server has written
/// (`pg_stat_wal`, bytes).
async fn write_counts(
    pool: &sqlx::PgPool,
) -> (std::collections::BTreeMap<String, i64>, Option<i64>) {
    let rows = match server::table_write_counts(pool).await {
        Ok(rows) => rows,
        Err(e) => {
            println!("(table counters unreadable: {e})");
            Vec::new()
        }
    };
    let wal = server::wal_bytes(pool).await.ok();
    (rows.into_iter().collect(), wal)
}

/// Audit records so far by `stage:outcome`.
async fn audit_steps(pool: &sqlx::PgPool) -> std::collections::BTreeMap<String, i64> {
    match server::audit_records_by_step(pool).await {
        Ok(rows) => rows.into_iter().collect(),
        Err(e) => {
            println!("(audit records unreadable: {e})");
            Default::default()
        }
    }
}

/// Posts `count` mentions at `rate` a second, round robin over `chans`;
/// returns each one's channel and ts.
async fn post_mentions(
    http: &reqwest::Client,
    url: &str,
    s: &Stack,
    chans: &[String],
    rate: u64,
    count: u64,
) -> Vec<(String, String)> {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::with_capacity(count as usize);
    for n in 0..count {
        tick.tick().await;
        let channel = chans[n as usize % chans.len()].clone();
        let body = json!({"user": s.user, "channel": channel,
                          "text": format!("<@{}> bench question {n}", s.bot_user)});
        let (http, url) = (http.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move {
            let r: Option<Value> = http
                .post(url)
                .json(&body)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok();
            Some((channel, r?["ts"].as_str()?.to_owned()))
        }));
    }
    let mut mentions = Vec::new();
    for t in tasks {
        if let Ok(Some(m)) = t.await {
            mentions.push(m);
        }
    }
    mentions
}

/// Deliveries the gateways shed on Slack's first try, so far.
async fn shed_mentions(s: &Stack) -> f64 {
    s.metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("threadline_gateway_shed_total") && l.contains("retry=\"first\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until `expected` threads have a reply of the app (or 400 s pass,
/// or 75 s without a new one).
async fn wait_for_replies(s: &Stack, expected: u64) {
    // (a mention the gateway shed comes back with Slack's retry a minute
    // later: waited for)
    let deadline = Instant::now() + Duration::from_secs(400);
    let mut last = (0u64, Instant::now());
    loop {
        let posts = sim_get(&s.sim, &format!("app_posts?app_id={}", s.app)).await;
        let replies: u64 = posts["per_thread"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|x| x["count"].as_u64().unwrap_or(0) > 0)
                    .count() as u64
            })
            .unwrap_or(0);
        if replies >= expected || Instant::now() > deadline {
            break;
        }
        if replies != last.0 {
            last = (replies, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(75) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What Slack's delivery log says of the mentions left without a reply:
/// one threadline acknowledged (an event of it answered 2xx) and did not
/// answer breaks the promise; one never acknowledged is Slack's to retry
/// (its tries a minute and five minutes later), or lost by Slack after its
/// last.
async fn print_unanswered(s: &Stack, unanswered: &[(String, String)]) {
    let log = sim_get(&s.sim, &format!("deliveries?app_id={}", s.app)).await;
    let mut tries: std::collections::HashMap<(&str, &str), (u32, bool)> = unanswered
        .iter()
        .map(|(c, ts)| ((c.as_str(), ts.as_str()), (0, false)))
        .collect();
    for d in log["deliveries"].as_array().into_iter().flatten() {
        let (Some(c), Some(ts)) = (d["channel"].as_str(), d["message_ts"].as_str()) else {
            continue;
        };
        if let Some((n, acked)) = tries.get_mut(&(c, ts)) {
            *n += 1;
            *acked |= d["status"]
                .as_u64()
                .is_some_and(|code| (200..300).contains(&code));
        }
    }
    let acked: Vec<_> = tries
        .iter()
        .filter(|(_, (_, a))| *a)
        .map(|(k, _)| *k)
        .collect();
    let most = tries.values().map(|(n, _)| *n).max().unwrap_or(0);
    println!(
        "unanswered at the end: {} (acknowledged by threadline: {}; never acknowledged: {}, at most {most} deliveries each: Slack tries again after one and five minutes)",
        unanswered.len(),
        acked.len(),
        unanswered.len() - acked.len()
    );
    for (c, ts) in acked.iter().take(10) {
        println!("  acknowledged, not answered: {c} {ts}");
    }
}

/// The statements Postgres ran most during the measured load (with
/// `--statements`, where `pg_stat_statements` is preloaded).
async fn print_statements(pool: &sqlx::PgPool) {
    let rows = match server::top_statements(pool).await {
        Ok(rows) => rows,
        Err(e) => {
            println!("statements unavailable: {e}");
            return;
        }
    };
    println!("statements by calls (calls, total ms, text):");
    for server::StatementCalls {
        calls,
        total_exec_ms: ms,
        text: q,
    } in rows
    {
        println!("  {calls:>7} {ms:>9.1}  {q}");
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rate = arg(&args, "--rate", 500).max(1);
    let seconds = arg(&args, "--seconds", 20).max(1);
    let channels = arg(&args, "--channels", 100).max(1) as usize;
    let mut env = vec![
        ("RUST_LOG", "warn".to_owned()),
        ("THREADLINE_POST_SPACING_MS", "0".to_owned()),
        ("THREADLINE_CONTEXT_CONCURRENCY", "64".to_owned()),
        ("THREADLINE_INFERENCE_CONCURRENCY", "64".to_owned()),
        ("THREADLINE_PUBLISHER_CONCURRENCY", "64".to_owned()),
    ];
    // `--share N`: the installation's share of the model's queue (the
    // services' default otherwise); a small one parks the bench's one
    // installation's work and measures the resumer.
    if let Some(i) = args.iter().position(|a| a == "--share") {
        let given = args.get(i + 1).map(String::as_str).unwrap_or_default();
        match given.parse::<u32>() {
            Ok(share) if (1..=100_000).contains(&share) => {
                env.push(("THREADLINE_TENANT_QUEUE_SHARE", share.to_string()));
            }
            _ => {
                eprintln!("--share takes a number of requests from 1 to 100000, not {given:?}");
                std::process::exit(2)
            }
        }
    }
    // `--no-shed`: the gateway takes every delivery it can write, to
    // compare with the default.
    if args.iter().any(|a| a == "--no-shed") {
        env.push(("THREADLINE_SHED_PARKED", "0".to_owned()));
    }
    let s = Stack::start(&env).await;
    // Slack's per-channel post limit and Tier 3 are not what is measured;
    // Slack's retries of a failed delivery come on its real schedule (at
    // once, a minute later, five minutes later), as what a gateway sheds
    // is judged by.
    sim_ctl(
        &s.sim,
        "settings",
        json!({"posts_per_second": 1e6, "post_burst": 1e6, "tier3_per_minute": 1000000,
               "time_scale": 1.0}),
    )
    .await;
    let mut chans = vec![s.channel.clone()];
    for i in 1..channels {
        let c = sim_ctl(
            &s.sim,
            "channels",
            json!({"team_id": s.team, "name": format!("bench-{i}"), "kind": "public",
                   "members": [s.user, s.bot_user]}),
        )
        .await;
        chans.push(c["id"].as_str().unwrap_or_default().to_owned());
    }
    println!(
        "pipeline bench: {rate} mentions/s for {seconds} s across {channels} channels, built-in model with no think time, cores: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let http = reqwest::Client::new();
    let post_url = format!("{}/_sim/act/post", s.sim.base_url);
    // Warm-up: the same load first, answered and left out of the figures
    // (connections, caches and pools fill on first use; the first second
    // of a cold stack is reported by a run with --warmup 0).
    let warmup = arg(&args, "--warmup", 0);
    let mut expected = 0u64;
    if warmup > 0 {
        let w = post_mentions(&http, &post_url, &s, &chans, rate, rate * warmup).await;
        expected += w.len() as u64;
        wait_for_replies(&s, expected).await;
        println!(
            "warm-up: {} mentions at {rate}/s answered; measuring now",
            w.len()
        );
    }
    // The planner's statistics, as autovacuum gathers them about a minute
    // into a table's life (its default naptime): without them the stack
    // runs on plans made for empty tables, which a run shorter than that
    // would measure instead of a database in service (--young keeps them;
    // without a warm-up there is nothing to gather them from).
    if warmup > 0 && !args.iter().any(|a| a == "--young") {
        match server::analyze(&s.db.pool).await {
            Ok(()) => println!(
                "statistics gathered after the warm-up (ANALYZE); --young measures without"
            ),
            Err(e) => println!("(statistics not gathered: {e})"),
        }
    }
    // pg_stat_statements where the server preloads it (see docs/performance.md).
    let _ = server::create_pg_stat_statements(&s.db.pool).await;
    let _ = server::reset_pg_stat_statements(&s.db.pool).await;
    // Backends report their commit and table counters once idle for 10 s
    // at the latest: let the warm-up's (and its replies fed back) land
    // before counting from here.
    tokio::time::sleep(STATS_LAG).await;
    let (statements_before, commits_before) = statement_counts(&s.db.pool).await;
    let writes_before = write_counts(&s.db.pool).await;
    let audit_before = audit_steps(&s.db.pool).await;
    let cpu_before = cpu_by_process();
    let shed_before = shed_mentions(&s).await;

    let started = Instant::now();
    let mentions = post_mentions(&http, &post_url, &s, &chans, rate, rate * seconds).await;
    let offered = mentions.len() as f64 / started.elapsed().as_secs_f64();
    expected += mentions.len() as u64;
    wait_for_replies(&s, expected).await;

    let cpu_after = cpu_by_process();
    // (the same wait: the run's counters land, and the bot's own replies
    // fed back are processed, as they are part of each mention's cost)
    tokio::time::sleep(STATS_LAG).await;
    let (statements_after, commits_after) = statement_counts(&s.db.pool).await;
    let writes_after = write_counts(&s.db.pool).await;
    let audit_after = audit_steps(&s.db.pool).await;

    // Slack's ground truth: the reply in each mention's thread.
    let mut latencies = Vec::with_capacity(mentions.len());
    let mut timeline: Vec<(f64, f64)> = Vec::with_capacity(mentions.len());
    let mut duplicates = 0;
    let mut unanswered: Vec<(String, String)> = Vec::new();
    let (mut first_mention, mut last_reply) = (f64::MAX, 0.0f64);
    for chunk in mentions.chunks(32) {
        let fetched = futures::future::join_all(chunk.iter().map(|(c, ts)| {
            let url = format!("{}/_sim/channels/{c}/threads/{ts}", s.sim.base_url);
            let http = http.clone();
            async move {
                let v: Value = http.get(url).send().await.ok()?.json().await.ok()?;
                Some((c.clone(), ts.clone(), v))
            }
        }))
        .await;
        for (c, ts, v) in fetched.into_iter().flatten() {
            let replies: Vec<f64> = v["messages"]
                .as_array()
                .map(|m| {
                    m.iter()
                        .filter(|x| x["app_id"].is_string())
                        .filter_map(|x| x["ts"].as_str().map(ts_secs))
                        .collect()
                })
                .unwrap_or_default();
            if replies.len() > 1 {
                duplicates += 1;
            }
            first_mention = first_mention.min(ts_secs(&ts));
            if let Some(first) = replies.iter().cloned().reduce(f64::min) {
                latencies.push((first - ts_secs(&ts)) * 1000.0);
                timeline.push((ts_secs(&ts), (first - ts_secs(&ts)) * 1000.0));
                last_reply = last_reply.max(first);
            } else {
                unanswered.push((c, ts));
            }
        }
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let sustained = latencies.len() as f64 / (last_reply - first_mention).max(0.001);
    // Goodput while the load was offered: mentions answered between the
    // first mention and the last (what overload is judged by; a mention the
    // gateway shed is answered after Slack's retry, later).
    let last_mention = mentions
        .iter()
        .map(|(_, ts)| ts_secs(ts))
        .fold(0.0f64, f64::max);
    let in_window = timeline
        .iter()
        .filter(|(at, ms)| at + ms / 1000.0 <= last_mention)
        .count();
    let window = (last_mention - first_mention).max(0.001);
    let shed = shed_mentions(&s).await - shed_before;
    println!(
        "offered {offered:.0} mentions/s ({} posted), {} answered ({sustained:.0}/s sustained, first mention to last reply), {duplicates} with more than one reply",
        mentions.len(),
        latencies.len()
    );
    println!(
        "while offered: {in_window} answered in {window:.1} s ({:.0}/s); deliveries shed on their first try: {shed:.0} (a mention's two events each; answered after Slack's retry a minute later)",
        in_window as f64 / window
    );
    if !unanswered.is_empty() {
        print_unanswered(&s, &unanswered).await;
    }
    println!(
        "mention → reply in Slack: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN)
    );
    // When the slow ones were posted: spread out (queueing) or bunched at
    // a few moments (a stall that held everything).
    if args.iter().any(|a| a == "--timeline") {
        let start = timeline.iter().map(|t| t.0).fold(f64::MAX, f64::min);
        let mut by_second: std::collections::BTreeMap<i64, (usize, f64, f64)> = Default::default();
        for (at, ms) in &timeline {
            let e = by_second
                .entry((at - start) as i64)
                .or_insert((0, 0.0, 0.0));
            e.0 += 1;
            e.1 += ms;
            e.2 = e.2.max(*ms);
        }
        println!("second: mentions, mean ms, max ms");
        for (sec, (n, sum, max)) in by_second {
            println!("  {sec:>4}: {n:>5} {:>8.1} {max:>8.1}", sum / n as f64);
        }
    }
    stage_breakdown(&s.db.pool, first_mention).await;
    let answered = latencies.len().max(1) as f64;
    let mut total = 0.0;
    let mut cpu: Vec<String> = Vec::new();
    for (who, secs) in cpu_between(&cpu_before, &cpu_after) {
        let ms = secs * 1000.0 / answered;
        total += ms;
        cpu.push(format!("{who} {ms:.2}"));
    }
    println!(
        "CPU ms per answered mention (whole machine {total:.2}): {}",
        cpu.join(", ")
    );
    let commits = (commits_after - commits_before) as f64 / answered;
    match (statements_before, statements_after) {
        (Some(b), Some(a)) => println!(
            "Postgres per answered mention: {:.1} top-level statements (BEGIN and COMMIT included), {commits:.1} commits",
            (a - b) as f64 / answered
        ),
        _ => println!(
            "Postgres per answered mention: {commits:.1} commits (statements: pg_stat_statements is not preloaded on this server; see docs/performance.md)"
        ),
    }
    let mut by_table: Vec<(String, f64)> = writes_after
        .0
        .iter()
        .map(|(t, n)| {
            let was = writes_before.0.get(t).copied().unwrap_or(0);
            (t.clone(), (n - was) as f64 / answered)
        })
        .filter(|(_, n)| *n >= 0.05)
        .collect();
    by_table.sort_by(|a, b| b.1.total_cmp(&a.1));
    let rows: f64 = by_table.iter().map(|(_, n)| n).sum();
    let wal = match (writes_before.1, writes_after.1) {
        (Some(b), Some(a)) => format!(
            ", WAL {:.1} kB (the whole server)",
            (a - b) as f64 / answered / 1024.0
        ),
        _ => String::new(),
    };
    println!(
        "Postgres writes per answered mention: {rows:.1} rows ({}){wal}",
        by_table
            .iter()
            .map(|(t, n)| format!("{t} {n:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut steps: Vec<(&String, f64)> = audit_after
        .iter()
        .map(|(k, n)| {
            (
                k,
                (n - audit_before.get(k).copied().unwrap_or(0)) as f64 / answered,
            )
        })
        .filter(|(_, n)| *n >= 0.05)
        .collect();
    steps.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!(
        "audit records per answered mention, by stage:outcome: {}",
        steps
            .iter()
            .map(|(k, n)| format!("{k} {n:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let names = ["gateway", "context-builder", "inference", "publisher"];
    let peaks: Vec<String> = s
        .services
        .iter()
        .zip(names)
        .map(|(p, n)| format!("{n} {}", peak_rss_mib(p.child.id())))
        .collect();
    println!("peak resident memory: {}", peaks.join(", "));
    // A benchmark measures; its answers are judged by the tests.
    let mut s = s;
    if args.iter().any(|a| a == "--statements") {
        print_statements(&s.db.pool).await;
    }
    s.unjudged = Some("a benchmark");
    s.stop().await;
}
