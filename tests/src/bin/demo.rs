//! `make demo`: starts slack-sim, the four services and the built-in model
//! against local Postgres and NATS, plays the scripted Slack story, prints
//! what Slack would show beside what threadline recorded, and stops
//! everything it started. `--keep-running` leaves the stack up to explore.

use std::time::Duration;

use threadline_tests::model_server::{CONTEXT, ModelServer, Outcome, ask_about_exit_code, outcome};
use threadline_tests::{Stack, sim_get, story};

const USAGE: &str = "usage: threadline-demo [--keep-running] [--real-model]

Plays a scripted Slack story against slack-sim (Slack's stand-in) and the
four threadline services, and prints a report. Needs Postgres and NATS
(`make demo` starts them when absent) and the workspace binaries built.

  --keep-running   leave everything running after the report, until Ctrl-C
  --real-model     a real model answers instead of the built-in one:
                   llama.cpp's server with SmolLM2-135M-Instruct (make demo
                   installs it once); plays one question instead of the
                   story, whose scenes are timed to the built-in model";

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut keep, mut real_model) = (false, false);
    for a in &args {
        match a.as_str() {
            "--keep-running" => keep = true,
            "--real-model" => real_model = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return std::process::ExitCode::SUCCESS;
            }
            _ => {
                eprintln!("{USAGE}");
                return std::process::ExitCode::from(2);
            }
        }
    }
    if real_model {
        return with_real_model(keep).await;
    }
    println!("starting slack-sim, a fresh database, NATS streams and the four services…");
    let mut extra: Vec<(&str, String)> = Vec::new();
    if let Ok(endpoint) = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        extra.push(("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint));
    }
    let mut s = story::start(&extra).await;
    println!(
        "playing the story (the built-in model takes {} ms per answer, like a real one)…\n",
        story::MODEL_LATENCY_MS
    );
    let told = story::play(&s).await;
    println!("{}", told.report());
    if keep {
        println!("{}", explore(&s));
        let _ = tokio::signal::ctrl_c().await;
        println!("stopping…");
        // Ctrl-C in a terminal reaches slack-sim and the services too (one
        // process group): they stop on their own, and Slack's side can no
        // longer be read. The story was judged before the stack was left
        // running; what was done by hand since is not judged.
        s.unjudged = Some("the story was judged above; what was done by hand after it is not");
    }
    s.stop().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    if told.passed() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// `--real-model`: one question answered by a real model, from Slack's side.
async fn with_real_model(keep: bool) -> std::process::ExitCode {
    println!("starting llama.cpp's server with SmolLM2-135M-Instruct…");
    let model = ModelServer::start().await;
    println!("starting slack-sim, a fresh database, NATS streams and the four services…");
    let mut s = Stack::start(&model.inference_env()).await;
    s.unjudged = Some("a real model's answer does not say which messages it read");
    let (root, ask) = ask_about_exit_code(&s).await;
    println!(
        "\nin #{}: a message, then a person asks the bot in its thread:",
        s.channel
    );
    println!("  > {CONTEXT}");
    println!("  > {ask}\n");
    let passed = match outcome(&s, &root).await {
        Outcome::Posted(answer) => {
            println!(
                "Slack shows the bot's reply in the thread, posted once, by the real model:\n"
            );
            for line in answer["text"].as_str().unwrap_or_default().lines() {
                println!("  | {line}");
            }
            let posts = sim_get(&s.sim, "calls?method=chat.postMessage").await["calls"]
                .as_array()
                .map(Vec::len)
                .unwrap_or(0);
            tokio::time::sleep(Duration::from_secs(2)).await;
            let answers = s.answers(&root).await.len();
            println!("\nchat.postMessage calls: {posts}; replies in the thread: {answers}");
            posts == 1 && answers == 1
        }
        Outcome::Held(_, reasons) => {
            println!(
                "the model's answer waits for a reviewer ({reasons:?}): it echoed Slack markup, \
                 so nothing was posted; `threadline review list` shows it"
            );
            sim_get(&s.sim, "calls?method=chat.postMessage").await["calls"]
                .as_array()
                .is_some_and(Vec::is_empty)
        }
    };
    println!("{}", if passed { "ok" } else { "FAIL" });
    if keep {
        println!("{}", explore(&s));
        println!("  model server       {}", model.url());
        let _ = tokio::signal::ctrl_c().await;
        println!("stopping…");
    }
    s.stop().await;
    drop(model);
    if passed {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

fn explore(s: &Stack) -> String {
    let sim = &s.sim.base_url;
    let [gw, cb, inf, publisher] = [0, 1, 2, 3].map(|i| s.services[i].base_url.clone());
    format!(
        "the stack keeps running (Ctrl-C stops it):

  slack-sim          {sim}   (Web API at {sim}/api/, control and ground truth at {sim}/_sim/)
  gateway            {gw}/slack/events   /metrics /readyz
  context-builder    {cb}/metrics
  inference          {inf}/metrics
  publisher          {publisher}/metrics
  database           {db}
  bus prefix         {prefix}
  logs               {logs}

try (a mention, then its thread with the bot's reply as Slack shows it):
  ts=$(curl -s -X POST {sim}/_sim/act/post -H 'content-type: application/json' \\
       -d '{{\"user\": \"{user}\", \"channel\": \"{channel}\", \"text\": \"<@{bot}> hello?\"}}' \\
       | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"ts\"])')
  sleep 3; curl -s {sim}/_sim/channels/{channel}/threads/$ts | python3 -m json.tool

the CLI against this stack needs all of these (the demo's bus prefix is its own):
  export {cli_env}
  {bin}/threadline stats --json
  {bin}/threadline dlq list

pointing a real Slack app at threadline instead (see docs/real-slack.md):
  1. create the app from deploy/slack/manifest.yaml at https://api.slack.com/apps,
  2. expose the gateway over HTTPS (a tunnel to port 3000 will do) and set the
     manifest's request URL to https://<public-host>/slack/events,
  3. run `SLACK_SIGNING_SECRET=<app signing secret> SLACK_BOT_TOKEN=xoxb-… make run`
     (it registers the installation with the token's team, app and bot),
  4. mention the bot in a channel it was invited to.",
        db = s.db.url,
        prefix = s.prefix,
        cli_env = cli_env(s).join(" \\\n         "),
        bin = bin_dir(),
        logs = threadline_tests::log_dir().display(),
        user = s.user,
        channel = s.channel,
        bot = s.bot_user,
    )
}

/// The settings the CLI reads, as the stack's services have them.
fn cli_env(s: &Stack) -> Vec<String> {
    const CLI_READS: &[&str] = &[
        "DATABASE_URL",
        "NATS_URL",
        "THREADLINE_BUS_PREFIX",
        "THREADLINE_TOKEN_KEYS",
        "THREADLINE_DEAD_LETTER_KEYS",
        "THREADLINE_AUDIT_KEY",
        "SLACK_API_URL",
    ];
    // The CLI is the owner: the common DATABASE_URL, and the private token
    // keys the publisher (service 3) holds.
    CLI_READS
        .iter()
        .filter_map(|k| {
            let v = s
                .env
                .iter()
                .find(|(name, _)| name == k)
                .or_else(|| s.service_env[3].iter().find(|(name, _)| name == k))?;
            Some(format!("{k}='{}'", v.1))
        })
        .collect()
}

/// Where the workspace binaries are (the CLI among them).
fn bin_dir() -> String {
    threadline_testkit::bin_path("threadline")
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "target/debug".to_owned())
}
