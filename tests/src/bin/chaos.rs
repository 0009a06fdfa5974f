//! `make chaos`: the chaos soak at scale (see `threadline_tests::chaos`).
//! `threadline-chaos [--events N] [--seed N] [--runs N] [--workspaces N]
//! [--channels N] [--rate N] [--calm]`; the seed defaults to the clock and
//! is printed, so any failure replays. `--runs N` is a campaign: N soaks of
//! seeds `seed`, `seed + 1`, …, each on a fresh stack, database and broker,
//! with a table of every seed's verdict at the end (`make chaos-campaign`).
//! Exits non-zero when an invariant broke in any run.

use std::time::Duration;

use threadline_tests::broker::Broker;
use threadline_tests::{ORACLE_GRACE, chaos};

const USAGE: &str = "usage: threadline-chaos [--events N] [--seed N] [--runs N] [--workspaces N] [--channels N] [--rate N] [--calm]

  --events N      human actions (posts, replies, edits, deletes); default 400
  --seed N        replays a run; default: the clock
  --runs N        a campaign of N runs, seeds N, N+1, ... (fresh stack each); default 1
  --workspaces N  workspaces besides the first; default 3
  --channels N    channels of each workspace besides its first; default 2
  --rate N        mean human actions a second; default 12
  --calm          Slack's own faults only (no kills, pauses or outages)";

fn arg<T: std::str::FromStr>(args: &[String], name: &str) -> Result<Option<T>, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .map(Some)
            .ok_or_else(|| format!("{name} needs a number")),
    }
}

fn parse(args: &[String]) -> Result<chaos::Config, String> {
    const NAMED: [&str; 7] = [
        "--events",
        "--seed",
        "--runs",
        "--workspaces",
        "--channels",
        "--rate",
        "--calm",
    ];
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if !NAMED.contains(&a) {
            return Err(format!("unknown argument {a}"));
        }
        i += if a == "--calm" { 1 } else { 2 };
    }
    let seed = arg(args, "--seed")?.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1)
    });
    let events: usize = arg(args, "--events")?.unwrap_or(400);
    if events == 0 {
        return Err("--events must be at least 1".into());
    }
    let rate: f64 = arg(args, "--rate")?.unwrap_or(12.0);
    if !(0.1..=500.0).contains(&rate) {
        return Err("--rate must be within 0.1..=500".into());
    }
    let mut adversary = if args.iter().any(|a| a == "--calm") {
        chaos::Adversary::none()
    } else {
        chaos::Adversary::full()
    };
    // Longer runs: more kills and pauses, spread over the run.
    if adversary.kill_rounds > 0 {
        adversary.kill_rounds = (events / 2500).max(1);
        adversary.pauses = (events / 500).clamp(4, 40);
        adversary.stream_hits = (events / 1000).clamp(1, 10);
    }
    adversary.expiries = (events / 100).clamp(3, 30);
    Ok(chaos::Config {
        seed,
        events,
        extra_workspaces: arg(args, "--workspaces")?.unwrap_or(3),
        extra_channels: arg(args, "--channels")?.unwrap_or(2),
        rate,
        adversary,
        grace: ORACLE_GRACE,
        stream_fault_percent: 10,
    })
}

/// One soak on a fresh broker and stack; returns its report and how long
/// the whole run took (stack included).
async fn run(cfg: &chaos::Config) -> (chaos::Report, Duration) {
    let started = std::time::Instant::now();
    // A broker of its own, so that it can be taken away.
    let mut broker = Broker::start().await;
    let mut s = chaos::start_stack(Some(broker.url())).await;
    let report = chaos::soak(&mut s, Some(&mut broker), cfg).await;
    // The oracle has judged already; stop without judging again.
    s.unjudged = Some("judged by the soak");
    s.stop().await;
    drop(broker);
    tokio::time::sleep(Duration::from_millis(200)).await;
    (report, started.elapsed())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return std::process::ExitCode::SUCCESS;
    }
    let (cfg, runs) = match parse(&args).and_then(|c| {
        let runs: u64 = arg(&args, "--runs")?.unwrap_or(1);
        if !(1..=1000).contains(&runs) {
            return Err("--runs must be within 1..=1000".into());
        }
        Ok((c, runs))
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("threadline-chaos: {e}\n{USAGE}");
            return std::process::ExitCode::from(2);
        }
    };
    let campaign = std::time::Instant::now();
    let mut verdicts = Vec::new();
    for i in 0..runs {
        let cfg = chaos::Config {
            seed: cfg.seed + i,
            ..cfg.clone()
        };
        println!(
            "chaos soak{}: seed {}, {} human events at about {}/s, {} workspaces with {} channels each; faults: {:?}",
            if runs > 1 {
                format!(" {}/{runs}", i + 1)
            } else {
                String::new()
            },
            cfg.seed,
            cfg.events,
            cfg.rate,
            cfg.extra_workspaces + 1,
            cfg.extra_channels + 1,
            cfg.adversary
        );
        let (report, took) = run(&cfg).await;
        println!("{}", report.render());
        println!(
            "total {:.0} s (stack included); judged with a grace of {} ms",
            took.as_secs_f64(),
            cfg.grace.as_millis()
        );
        verdicts.push((report, took));
    }
    if runs > 1 {
        println!(
            "campaign: {runs} runs of {} human events, seeds {}..={}, in {:.0} s",
            cfg.events,
            cfg.seed,
            cfg.seed + runs - 1,
            campaign.elapsed().as_secs_f64()
        );
        println!(
            "| seed | questions | answered once | whole (approved) | streamed | pane | ended early | expired | review requests (rejected) | explained | crossed | violations | time |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for (r, took) in &verdicts {
            let explained: usize =
                r.explained.values().sum::<usize>() + r.reasons.values().sum::<usize>();
            let violations = r.violations_by_kind();
            println!(
                "| {} | {} | {} | {} ({}) | {} | {} | {} | {} | {} ({}) | {} | {} | {} | {:.0} s |",
                r.seed,
                r.questions,
                r.answered,
                r.whole,
                r.approved,
                r.streamed,
                r.pane,
                r.ended_early,
                r.expired + r.expired_answered + r.expired_closed,
                r.review_requests,
                r.rejected,
                explained,
                r.crossed,
                if violations.is_empty() {
                    "none".to_owned()
                } else {
                    violations
                        .iter()
                        .map(|(k, v)| format!("{k} {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                took.as_secs_f64()
            );
        }
    }
    let broken: Vec<u64> = verdicts
        .iter()
        .filter(|(r, _)| !r.violations.is_empty())
        .map(|(r, _)| r.seed)
        .collect();
    if broken.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        eprintln!("invariants broken in the runs of seeds {broken:?}");
        std::process::ExitCode::FAILURE
    }
}
