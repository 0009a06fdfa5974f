//! `make chaos`: a longer chaos soak than CI's (see `threadline_tests::chaos`).
//! `threadline-chaos [--seed N] [--steps N] [--workspaces N] [--no-kills]`;
//! the seed defaults to the clock and is printed, so any failure replays.

use std::time::Duration;

use threadline_tests::{Stack, chaos};

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

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = (|| -> Result<chaos::Config, String> {
        for a in &args {
            if a.starts_with("--")
                && !["--seed", "--steps", "--workspaces", "--no-kills"].contains(&a.as_str())
            {
                return Err(format!("unknown option {a}"));
            }
        }
        let seed = arg(&args, "--seed")?.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(1)
        });
        Ok(chaos::Config {
            seed,
            steps: arg(&args, "--steps")?.unwrap_or(400),
            extra_workspaces: arg(&args, "--workspaces")?.unwrap_or(4),
            kills: !args.iter().any(|a| a == "--no-kills"),
            max_pause: Duration::from_millis(300),
        })
    })();
    let cfg = match parsed {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "threadline-chaos: {e}\nusage: threadline-chaos [--seed N] [--steps N] [--workspaces N] [--no-kills]"
            );
            return std::process::ExitCode::from(2);
        }
    };
    println!(
        "chaos soak: seed {}, {} actions, {} workspaces with 2 channels each",
        cfg.seed,
        cfg.steps,
        cfg.extra_workspaces + 1
    );
    let settings = chaos::settings();
    let extra: Vec<(&str, String)> = settings.iter().map(|(k, v)| (*k, v.clone())).collect();
    let mut s = Stack::start(&extra).await;
    let report = chaos::soak(&mut s, &cfg).await;
    println!("{}", report.render());
    s.stop().await;
    if report.violations.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
