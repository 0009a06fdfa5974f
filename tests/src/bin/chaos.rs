//! `make chaos`: the chaos soak at scale (see `threadline_tests::chaos`).
//! `threadline-chaos [--events N] [--seed N] [--workspaces N] [--channels N]
//! [--rate N] [--calm]`; the seed defaults to the clock and is printed, so
//! any failure replays. Exits non-zero when an invariant broke.

use std::time::Duration;

use threadline_tests::broker::Broker;
use threadline_tests::{ORACLE_GRACE, Stack, chaos};

const USAGE: &str = "usage: threadline-chaos [--events N] [--seed N] [--workspaces N] [--channels N] [--rate N] [--calm]

  --events N      human actions (posts, replies, edits, deletes); default 400
  --seed N        replays a run; default: the clock
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
    const NAMED: [&str; 6] = [
        "--events",
        "--seed",
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
    }
    Ok(chaos::Config {
        seed,
        events,
        extra_workspaces: arg(args, "--workspaces")?.unwrap_or(3),
        extra_channels: arg(args, "--channels")?.unwrap_or(2),
        rate,
        adversary,
        grace: ORACLE_GRACE,
    })
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return std::process::ExitCode::SUCCESS;
    }
    let cfg = match parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("threadline-chaos: {e}\n{USAGE}");
            return std::process::ExitCode::from(2);
        }
    };
    println!(
        "chaos soak: seed {}, {} human events at about {}/s, {} workspaces with {} channels each; faults: {:?}",
        cfg.seed,
        cfg.events,
        cfg.rate,
        cfg.extra_workspaces + 1,
        cfg.extra_channels + 1,
        cfg.adversary
    );
    // A broker of its own, so that it can be taken away.
    let mut broker = Broker::start().await;
    let mut settings = chaos::settings();
    settings.push(("NATS_URL", broker.url()));
    let extra: Vec<(&str, String)> = settings.iter().map(|(k, v)| (*k, v.clone())).collect();
    let mut s = Stack::start(&extra).await;
    let started = std::time::Instant::now();
    let report = chaos::soak(&mut s, Some(&mut broker), &cfg).await;
    println!("{}", report.render());
    println!(
        "total {:.0} s (stack started before); judged with a grace of {} ms",
        started.elapsed().as_secs_f64(),
        cfg.grace.as_millis()
    );
    // The oracle has judged already; stop without judging again.
    s.unjudged = Some("judged by the soak");
    s.stop().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    if report.violations.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
