//! `make bench` (second half): the whole pipeline's overhead. People post
//! mentions through slack-sim at a fixed rate into many channels; the
//! built-in model answers at once, so the time from a mention (its ts in
//! Slack) to the reply (the reply's ts in Slack) is threadline's own work:
//! two Events API deliveries, intake, relay, context, decision, claim and
//! post. Reports p50/p99/max, replies, duplicates and each service's peak
//! resident memory. Asserts nothing.
//!
//! `threadline-bench-pipeline [--rate 500] [--seconds 20] [--channels 100]`

use std::time::{Duration, Instant};

use serde_json::{Value, json};
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

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rate = arg(&args, "--rate", 500).max(1);
    let seconds = arg(&args, "--seconds", 20).max(1);
    let channels = arg(&args, "--channels", 100).max(1) as usize;
    let s = Stack::start(&[
        ("RUST_LOG", "warn".to_owned()),
        ("THREADLINE_POST_SPACING_MS", "0".to_owned()),
        ("THREADLINE_CONTEXT_CONCURRENCY", "64".to_owned()),
        ("THREADLINE_INFERENCE_CONCURRENCY", "64".to_owned()),
        ("THREADLINE_PUBLISHER_CONCURRENCY", "64".to_owned()),
    ])
    .await;
    // Slack's per-channel post limit and Tier 3 are not what is measured.
    sim_ctl(
        &s.sim,
        "settings",
        json!({"posts_per_second": 1e6, "post_burst": 1e6, "tier3_per_minute": 1000000}),
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
    let total = rate * seconds;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for n in 0..total {
        tick.tick().await;
        let channel = chans[n as usize % chans.len()].clone();
        let body = json!({"user": s.user, "channel": channel,
                          "text": format!("<@{}> bench question {n}", s.bot_user)});
        let (http, url) = (http.clone(), post_url.clone());
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
    let offered = mentions.len() as f64 / started.elapsed().as_secs_f64();

    // Wait for the replies (or a minute of silence).
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = (0u64, Instant::now());
    loop {
        let posts = sim_get(&s.sim, &format!("app_posts?app_id={}", s.app)).await;
        let replies: u64 = posts["per_thread"]
            .as_array()
            .map(|a| a.iter().map(|x| x["count"].as_u64().unwrap_or(0)).sum())
            .unwrap_or(0);
        if replies >= mentions.len() as u64 || Instant::now() > deadline {
            break;
        }
        if replies != last.0 {
            last = (replies, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Slack's ground truth: the reply in each mention's thread.
    let mut latencies = Vec::with_capacity(mentions.len());
    let mut duplicates = 0;
    let (mut first_mention, mut last_reply) = (f64::MAX, 0.0f64);
    for chunk in mentions.chunks(32) {
        let fetched = futures::future::join_all(chunk.iter().map(|(c, ts)| {
            let url = format!("{}/_sim/channels/{c}/threads/{ts}", s.sim.base_url);
            let http = http.clone();
            async move {
                let v: Value = http.get(url).send().await.ok()?.json().await.ok()?;
                Some((ts.clone(), v))
            }
        }))
        .await;
        for (ts, v) in fetched.into_iter().flatten() {
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
                last_reply = last_reply.max(first);
            }
        }
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let sustained = latencies.len() as f64 / (last_reply - first_mention).max(0.001);
    println!(
        "offered {offered:.0} mentions/s ({} posted), {} answered ({sustained:.0}/s sustained, first mention to last reply), {duplicates} with more than one reply",
        mentions.len(),
        latencies.len()
    );
    println!(
        "mention → reply in Slack: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN)
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
    s.unjudged = Some("a benchmark");
    s.stop().await;
}
