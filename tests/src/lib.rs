//! Helpers for end-to-end tests that run the compiled binaries as separate
//! processes (so they can be killed like a real crash).

pub mod broker;
pub mod chaos;
pub mod model_server;
pub mod oracle;
pub mod story;

use std::time::Duration;

use threadline_testkit::{bin_path, eventually};
use tokio::process::{Child, Command};

/// An OpenAI-compatible chat-completions endpoint that answers every
/// request with `answer`: its base URL (`…/v1`) and how many requests it
/// got.
pub async fn fixed_model(
    answer: &'static str,
) -> (String, std::sync::Arc<std::sync::Mutex<usize>>) {
    use axum::Json;
    use axum::extract::State;
    use serde_json::{Value, json};
    use std::sync::{Arc, Mutex};
    let calls = Arc::new(Mutex::new(0usize));
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            axum::routing::post(
                move |State(n): State<Arc<Mutex<usize>>>, Json(_): Json<Value>| async move {
                    *n.lock().expect("lock") += 1;
                    Json(json!({"id": "c1", "object": "chat.completion",
                                "choices": [{"index": 0, "finish_reason": "stop",
                                             "message": {"role": "assistant", "content": answer}}]}))
                },
            ),
        )
        .with_state(calls.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/v1", l.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(l, app).await });
    (url, calls)
}

/// An OpenAI-compatible endpoint that streams `pieces`, one every `gap`,
/// as server-sent events.
pub async fn streaming_model(pieces: &'static [&'static str], gap: Duration) -> String {
    use futures::StreamExt as _;
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || async move {
            let chunk = |p: &str| {
                let c = serde_json::json!({"id": "c1", "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": null}]});
                format!("data: {c}\n\n")
            };
            let events = futures::stream::iter(pieces.iter().map(move |p| chunk(p)))
                .then(move |e| async move {
                    tokio::time::sleep(gap).await;
                    Ok::<_, std::convert::Infallible>(e)
                })
                .chain(futures::stream::once(async {
                    Ok("data: [DONE]\n\n".to_owned())
                }));
            (
                [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                axum::body::Body::from_stream(events),
            )
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/v1", l.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

/// A running threadline binary.
pub struct Proc {
    pub child: Child,
    pub base_url: String,
    /// For services: binary, address setting and port, to restart in place.
    pub service: Option<(String, String, u16)>,
    /// Where the process's stdout and stderr go (services only).
    pub log: Option<std::path::PathBuf>,
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Starts `threadline-gateway` with `env` (on a fresh port) and waits for
/// `/healthz`.
/// Like a deployment's, it is given the audit key when `env` has none (the
/// relay and the OAuth install refuse to start without it).
pub async fn spawn_gateway(env: &[(&str, String)]) -> Proc {
    let mut env = env.to_vec();
    if !env.iter().any(|(k, _)| *k == "THREADLINE_AUDIT_KEY") {
        env.push(("THREADLINE_AUDIT_KEY", "5a".repeat(32)));
    }
    spawn_service("threadline-gateway", "THREADLINE_GATEWAY_ADDR", &env).await
}

/// Starts `threadline-context-builder` and waits for its `/healthz`.
pub async fn spawn_context_builder(env: &[(&str, String)]) -> Proc {
    spawn_service(
        "threadline-context-builder",
        "THREADLINE_CONTEXT_BUILDER_ADDR",
        env,
    )
    .await
}

/// Starts `threadline-inference` and waits for its `/healthz`.
pub async fn spawn_inference(env: &[(&str, String)]) -> Proc {
    spawn_service("threadline-inference", "THREADLINE_INFERENCE_ADDR", env).await
}

/// Starts `threadline-publisher` and waits for its `/healthz`.
pub async fn spawn_publisher(env: &[(&str, String)]) -> Proc {
    spawn_service("threadline-publisher", "THREADLINE_PUBLISHER_ADDR", env).await
}

/// Starts a service binary on a fresh port (given by `addr_setting`) with
/// only `env` set, and waits for `/healthz`. A port another process took
/// between choosing and binding it is replaced by a new one.
pub async fn spawn_service(bin: &str, addr_setting: &str, env: &[(&str, String)]) -> Proc {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match try_spawn_service(bin, addr_setting, free_port(), env).await {
            Ok(p) => return p,
            Err(Failure::PortTaken(why)) if attempt < 5 => {
                eprintln!("{bin}: {why}; retrying on another port");
            }
            Err(Failure::PortTaken(why) | Failure::Other(why)) => panic!("{why}"),
        }
    }
}

/// Starts a service binary on `port` (a restart keeps its address).
pub async fn spawn_service_at(
    bin: &str,
    addr_setting: &str,
    port: u16,
    env: &[(&str, String)],
) -> Proc {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match try_spawn_service(bin, addr_setting, port, env).await {
            Ok(p) => return p,
            // The killed process's port can linger for a moment.
            Err(Failure::PortTaken(why)) if attempt < 20 => {
                eprintln!("{bin}: {why}; retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(Failure::PortTaken(why) | Failure::Other(why)) => panic!("{why}"),
        }
    }
}

/// Why a service did not come up.
enum Failure {
    /// It could not bind its address.
    PortTaken(String),
    Other(String),
}

/// How long a service may take to answer `/healthz` (a loaded CI machine
/// runs several stacks at once); an exit is reported at once.
const STARTUP_LIMIT: Duration = Duration::from_secs(90);

async fn try_spawn_service(
    bin: &str,
    addr_setting: &str,
    port: u16,
    env: &[(&str, String)],
) -> Result<Proc, Failure> {
    let (child, log) = launch(bin, port, "/healthz", |cmd| {
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env(addr_setting, format!("127.0.0.1:{port}"))
            .env("THREADLINE_LOG_FORMAT", "text")
            .env("RUST_LOG", "warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
    })
    .await?;
    Ok(Proc {
        child,
        base_url: format!("http://127.0.0.1:{port}"),
        service: Some((bin.to_owned(), addr_setting.to_owned(), port)),
        log: Some(log),
    })
}

/// Where the services of a test run (or a demo, a chaos soak) log: a folder
/// of this run's own under `<temp>/threadline-logs/`. One run is one
/// `THREADLINE_LOG_RUN` (which `make test-only` sets, so that `cargo test`'s
/// many test binaries share a folder), else one `cargo nextest run`
/// (`NEXTEST_RUN_ID`), else this process. Made once per process; making it
/// cleans old runs away ([`clean_old_runs`]) and the shared folder of
/// earlier versions (`<temp>/threadline-test-logs`).
pub fn log_dir() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let root = std::env::temp_dir().join("threadline-logs");
        let now = std::time::SystemTime::now();
        let (run, owned) = match (
            std::env::var("THREADLINE_LOG_RUN"),
            std::env::var("NEXTEST_RUN_ID"),
        ) {
            (Ok(run), _) if !run.is_empty() && !run.contains(['/', '.']) => (run, false),
            (_, Ok(id)) => (format!("nextest-{id}"), false),
            _ => (
                format!(
                    "{}-{}",
                    now.duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0),
                    std::process::id()
                ),
                true,
            ),
        };
        let dir = root.join(run);
        std::fs::create_dir_all(&dir).expect("log dir");
        if owned {
            // A folder of one process (a demo left running, a soak) is kept
            // while that process lives, however quiet its logs.
            let _ = std::fs::write(dir.join(OWNER_FILE), std::process::id().to_string());
        }
        clean_old_runs(&root, &dir, now);
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join("threadline-test-logs"));
        dir
    })
    .clone()
}

/// How many runs' log folders [`log_dir`] keeps.
pub const LOG_RUNS_KEPT: usize = 10;

/// The file in a run's log folder naming the process that owns it.
pub const OWNER_FILE: &str = ".owner-pid";

/// Removes the run folders under `root`, other than `current` and those
/// whose owner process ([`OWNER_FILE`]) still runs, that were last written
/// (the folder or any log in it) more than a day before `now`, and all but
/// the newest [`LOG_RUNS_KEPT`] of the others. Folders another process
/// removes at the same time are skipped.
pub fn clean_old_runs(
    root: &std::path::Path,
    current: &std::path::Path,
    now: std::time::SystemTime,
) {
    const MAX_AGE: Duration = Duration::from_secs(24 * 3600);
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let last_written = |dir: &std::path::Path| -> Option<std::time::SystemTime> {
        let own = std::fs::metadata(dir).ok()?.modified().ok()?;
        let inner = std::fs::read_dir(dir)
            .ok()?
            .filter_map(Result::ok)
            .filter_map(|e| e.metadata().ok()?.modified().ok())
            .max();
        Some(inner.map_or(own, |i| i.max(own)))
    };
    let alive = |dir: &std::path::Path| {
        std::fs::read_to_string(dir.join(OWNER_FILE))
            .ok()
            .and_then(|pid| pid.trim().parse::<u32>().ok())
            .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
    };
    let mut runs: Vec<(std::time::SystemTime, std::path::PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path() != current && e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| !alive(&e.path()))
        .filter_map(|e| Some((last_written(&e.path())?, e.path())))
        .collect();
    runs.sort_by_key(|r| std::cmp::Reverse(r.0));
    for (i, (modified, path)) in runs.iter().enumerate() {
        let old = now.duration_since(*modified).is_ok_and(|age| age > MAX_AGE);
        // The current run counts as one of those kept.
        if old || i + 1 >= LOG_RUNS_KEPT {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// Runs `bin` (set up by `configure`) with its output appended to a log
/// file, and waits until `health_path` on `port` answers. An exit is
/// reported at once, with what the process printed.
async fn launch(
    bin: &str,
    port: u16,
    health_path: &str,
    configure: impl FnOnce(&mut Command),
) -> Result<(Child, std::path::PathBuf), Failure> {
    let mut cmd = Command::new(bin_path(bin));
    configure(&mut cmd);
    cmd.kill_on_drop(true);
    let log = log_dir().join(format!("{bin}-{port}.log"));
    // Appended to: a restarted service keeps the log of the one killed.
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .expect("log file");
    let start_offset = file.metadata().map(|m| m.len()).unwrap_or(0);
    cmd.stdout(file.try_clone().expect("log file")).stderr(file);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("starting {bin}: {e}"));
    let url = format!("http://127.0.0.1:{port}{health_path}");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("http client");
    let deadline = tokio::time::Instant::now() + STARTUP_LIMIT;
    loop {
        let healthy = client
            .get(&url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        // Answered by this child, not by whatever else holds the port.
        if healthy && matches!(child.try_wait(), Ok(None)) {
            return Ok((child, log));
        }
        if let Ok(Some(status)) = child.try_wait() {
            let output = log_since(&log, start_offset);
            let why = format!(
                "{bin} on port {port} exited ({status}) before answering {health_path}; it printed:\n{output}"
            );
            return Err(if output.contains("binding") || output.contains("in use") {
                Failure::PortTaken(why)
            } else {
                Failure::Other(why)
            });
        }
        if tokio::time::Instant::now() >= deadline {
            let _ = child.kill().await;
            return Err(Failure::Other(format!(
                "{bin} on port {port} did not answer {health_path} within {} s; it printed:\n{}",
                STARTUP_LIMIT.as_secs(),
                log_since(&log, start_offset)
            )));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The last lines a process wrote to `log` after `offset`.
fn log_since(log: &std::path::Path, offset: u64) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(text.get(offset as usize..).unwrap_or_default());
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

impl Proc {
    pub fn events_url(&self) -> String {
        format!("{}/slack/events", self.base_url)
    }

    /// SIGSTOP: the process freezes mid-step, as in a long GC or VM pause
    /// (its timers, sockets and leases go on without it).
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// SIGCONT: a paused process carries on from where it stopped.
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("a running process");
        let ok = std::process::Command::new("kill")
            .args([format!("-{sig}"), pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig} {pid}");
    }

    /// SIGKILL: no shutdown path runs.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("SIGKILL");
    }

    /// SIGTERM and wait; returns the exit status.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("process exits within 20 s of SIGTERM")
            .expect("wait")
    }
}

/// Runs the `threadline` CLI to completion.
pub async fn cli(args: &[&str], env: &[(&str, String)]) -> std::process::Output {
    let mut cmd = Command::new(bin_path("threadline"));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().await.expect("running threadline")
}

/// [`cli`] with `stdin` written to its standard input (a secret an
/// operator pipes in, never an argument).
pub async fn cli_with_stdin(
    args: &[&str],
    env: &[(&str, String)],
    stdin: &str,
) -> std::process::Output {
    use tokio::io::AsyncWriteExt as _;
    let mut cmd = Command::new(bin_path("threadline"));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("running threadline");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).await.expect("stdin");
    drop(input);
    child.wait_with_output().await.expect("running threadline")
}

/// Starts `threadline-slack-sim` on a fresh port and waits until it answers.
pub async fn spawn_slack_sim(seed: u64, time_scale: f64) -> Proc {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let port = free_port();
        let started = launch("threadline-slack-sim", port, "/_sim/calls", |cmd| {
            cmd.args(["--addr", &format!("127.0.0.1:{port}")])
                .args(["--seed", &seed.to_string()])
                .args(["--time-scale", &time_scale.to_string()]);
        })
        .await;
        match started {
            Ok((child, log)) => {
                return Proc {
                    child,
                    base_url: format!("http://127.0.0.1:{port}"),
                    service: None,
                    log: Some(log),
                };
            }
            Err(Failure::PortTaken(why)) if attempt < 5 => {
                eprintln!("{why}; retrying on another port");
            }
            Err(Failure::PortTaken(why) | Failure::Other(why)) => panic!("{why}"),
        }
    }
}

/// Clears every fault the emulator has been told to inject.
pub async fn sim_clear_faults(sim: &Proc) {
    reqwest::Client::new()
        .delete(format!("{}/_sim/faults", sim.base_url))
        .send()
        .await
        .expect("clearing slack-sim's faults");
}

/// POSTs to the emulator's control API and returns the JSON answer.
pub async fn sim_ctl(sim: &Proc, path: &str, body: serde_json::Value) -> serde_json::Value {
    let r = reqwest::Client::new()
        .post(format!("{}/_sim/{path}", sim.base_url))
        .json(&body)
        .send()
        .await
        .expect("slack-sim control call");
    assert!(r.status().is_success(), "slack-sim {path}: {}", r.status());
    r.json().await.expect("slack-sim answers JSON")
}

/// GETs from the emulator's inspection API.
pub async fn sim_get(sim: &Proc, path: &str) -> serde_json::Value {
    reqwest::get(format!("{}/_sim/{path}", sim.base_url))
        .await
        .expect("slack-sim inspection call")
        .json()
        .await
        .expect("slack-sim answers JSON")
}

/// The index in [`Stack::services`] of the outbox relay (the gateway binary
/// with `THREADLINE_RELAY_ENABLED`, on its own role, the spool's drainer
/// beside it): after the gateway (0), the context-builder (1), inference
/// (2) and the publisher (3).
pub const RELAY: usize = 4;

/// The whole of threadline as processes, with slack-sim playing Slack and a
/// workspace where the app is installed in one public channel.
pub struct Stack {
    pub db: threadline_testkit::TestDb,
    pub prefix: String,
    pub js: async_nats::jetstream::Context,
    pub sim: Proc,
    pub services: Vec<Proc>,
    pub team: String,
    pub user: String,
    pub channel: String,
    pub app: String,
    pub bot_user: String,
    pub token: String,
    /// The app-level token (`xapp-…`), for Socket Mode.
    pub app_token: String,
    /// The settings every service was started with (for restarts).
    pub env: Vec<(String, String)>,
    /// Each service's own settings on top of `env`, by index (its NATS
    /// user on a broker with authorization; empty otherwise).
    pub service_env: Vec<Vec<(String, String)>>,
    /// Conversations besides the stack's own channel that the oracle judges.
    pub more_scopes: std::sync::Mutex<Vec<oracle::Scope>>,
    /// Streams seen open, with when (see [`oracle::Limits::seen_open`]).
    pub streams_seen_open: std::sync::Mutex<std::collections::BTreeMap<(String, String), u64>>,
    /// Why the oracle cannot judge this run (a model whose answers do not
    /// state what they read); `None` judges it at `stop`.
    pub unjudged: Option<&'static str>,
}

/// The deterministic fallback answer's text when a stack does not set
/// `THREADLINE_FALLBACK_TEXT` (inference's default, written out here).
pub const DEFAULT_FALLBACK: &str = "threadline could not process this request. No action was taken. Try again or contact the service owner.";

/// How late after a message was acknowledged a reply may still be posted
/// without having read it (it then crossed in flight).
pub const ORACLE_GRACE: Duration = Duration::from_millis(500);

/// Settings that stream answers: the built-in model writing a word every
/// `pace_ms`, released every 100 ms and appended every 250 ms; `extra`
/// settings replace or add to these.
pub fn streaming(pace_ms: u64, extra: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    let mut v: Vec<(&'static str, String)> = vec![
        ("THREADLINE_STREAMING", "true".into()),
        ("THREADLINE_BUILTIN_LATENCY_MS", "100".into()),
        ("THREADLINE_BUILTIN_STREAM_PACE_MS", pace_ms.to_string()),
        ("THREADLINE_STREAM_RELEASE_MS", "100".into()),
        ("THREADLINE_STREAM_APPEND_MS", "250".into()),
    ];
    for (k, val) in extra {
        v.retain(|(kk, _)| kk != k);
        v.push((k, (*val).to_owned()));
    }
    v
}

/// The calls of `method` Slack answered `ok`, from its call log.
pub async fn ok_calls(sim: &Proc, method: &str) -> Vec<serde_json::Value> {
    sim_get(sim, &format!("calls?method={method}")).await["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["outcome"] == "ok")
        .collect()
}

/// The stack's installation id (the first registered), as the CLI takes it.
pub async fn first_installation(s: &Stack) -> String {
    threadline_store::testing::installations::first_id(&s.db.pool)
        .await
        .expect("an installation")
        .to_string()
}

/// Waits until nothing is in flight (and stays so for `quiet`), or `limit`
/// passes; returns what was still open then (the checker reports it too).
/// With `bus` (a JetStream context and the bus prefix), a message still in
/// a work queue counts as open too: a context waiting out its redelivery
/// backoff after an outage leaves no open row behind it (its receipt is
/// done, its decision not yet claimed).
pub async fn quiesce(
    pool: &sqlx::PgPool,
    bus: Option<(&async_nats::jetstream::Context, &str)>,
    limit: Duration,
    quiet: Duration,
) -> Option<String> {
    let start = std::time::Instant::now();
    let mut quiet_since: Option<std::time::Instant> = None;
    let mut last = None;
    while start.elapsed() < limit {
        let queued = match bus {
            Some((js, prefix)) => work_queued(js, prefix).await,
            None => 0,
        };
        let open = threadline_store::testing::receipts::open_work(pool)
            .await
            .ok()
            .map(|w| {
                (
                    w.receipts,
                    w.outbox,
                    w.decisions,
                    w.intents,
                    w.crossed,
                    queued,
                )
            });
        if open == Some((0, 0, 0, 0, 0, 0)) {
            let since = *quiet_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() > quiet {
                return None;
            }
        } else {
            quiet_since = None;
            last = open;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Some(match last {
        Some((r, o, d, i, c, q)) => format!(
            "still open after {:.0} s: {r} receipts, {o} outbox rows, {d} decisions, {i} reply intents, {c} crossed answers awaiting reconsideration, {q} messages the workers' consumers have yet to deliver or see acknowledged",
            limit.as_secs_f64()
        ),
        None => "the database did not answer".to_owned(),
    })
}

/// Messages the workers' consumers still have to deliver or await an
/// acknowledgement for: a message deferred or waiting for its redelivery
/// counts. (Not the streams' message counts: nats-server 2.9 can keep a
/// message acknowledged before a restart in a work-queue stream, below its
/// consumer's ack floor, where no worker will ever see it again.) A broker
/// that does not answer counts as one (not quiet).
pub async fn work_queued(js: &async_nats::jetstream::Context, prefix: &str) -> u64 {
    let mut n = 0;
    for topic in threadline_domain::topic::Topic::ALL {
        let name = format!("{prefix}_{}", topic.as_str()).to_ascii_uppercase();
        let info = match js.get_stream(&name).await {
            Ok(s) => s.consumer_info(topic.consumer()).await.ok(),
            Err(_) => None,
        };
        n += info.map_or(1, |i| i.num_pending + i.num_ack_pending as u64);
    }
    n
}

/// What Slack cannot show: each crossed-in-flight answer the oracle found
/// is recorded by threadline and its thread reconsidered, and each question
/// Slack does not explain has a reason an operator can see (a decision
/// suppressed, cancelled, rejected or waiting for review with its reason, a
/// reply held or failed with its code, an event ignored with its reason).
pub async fn explain_from_records(
    pool: &sqlx::PgPool,
    j: &oracle::Judgement,
) -> Vec<(&'static str, String)> {
    records_verdict(pool, j).await.violations
}

/// What threadline's records add to a judgement: the violations Slack
/// cannot show, and the reason an operator sees for each question Slack
/// does not explain.
#[derive(Debug, Default)]
pub struct RecordsVerdict {
    pub violations: Vec<(&'static str, String)>,
    /// Each question the records explain, with its reason as the records
    /// give it (`decision rejected:…`, `reply held:…`, `event ignored:…`),
    /// or `with a later question: <its reason>`.
    pub reasons: Vec<(oracle::Question, String)>,
}

impl RecordsVerdict {
    /// How many questions each reason explains.
    pub fn by_reason(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for (_, r) in &self.reasons {
            *m.entry(r.clone()).or_default() += 1;
        }
        m
    }
}

/// The reason threadline's records give for question `ts` of `channel`
/// having no reply; for one absorbed into a later request of its burst
/// (double texting), the reason of that later request, which answered for
/// it (say, a reviewer rejected the burst's answer).
async fn outcome_reason(pool: &sqlx::PgPool, channel: &str, ts: &str) -> Option<String> {
    let mut ts = ts.to_owned();
    let mut via_later = false;
    let mut seen = std::collections::HashSet::new();
    // (a burst is a chain: at most as long as the run's questions)
    for _ in 0..1000 {
        seen.insert(ts.clone());
        let own = threadline_store::testing::decisions::question_outcome_reason(pool, channel, &ts)
            .await
            .unwrap_or(None);
        // (a doubled message: its action's reason is the kept message's,
        // or, the kept one deleted, the copy's that stands in for it; the
        // copy's own delivery ended as doubled too, naming the deleted one)
        if own.as_deref() == Some("event ignored:doubled_message") {
            let kept = threadline_store::testing::threads::kept_for(pool, channel, &ts).await;
            if let Some(kept) = kept.filter(|k| !seen.contains(k)) {
                ts = kept;
                continue;
            }
        }
        if own.as_deref() != Some("event ignored:double_texted") {
            return match (own, via_later) {
                (Some(r), true) => Some(format!("with a later question: {r}")),
                (own, _) => own,
            };
        }
        match threadline_store::testing::threads::absorbed_by(pool, channel, &ts).await {
            Some(later) => {
                ts = later;
                via_later = true;
            }
            None => return own,
        }
    }
    None
}

/// [`explain_from_records`] with the reasons. A question with no reason of
/// its own is explained by the reason of the nearest later unanswered
/// question of its thread that has one: that question's answer would have
/// read it (answering both), and the reason it has none holds for both.
pub async fn records_verdict(pool: &sqlx::PgPool, j: &oracle::Judgement) -> RecordsVerdict {
    let mut v = Vec::new();
    for c in &j.crossed {
        let row = threadline_store::testing::threads::crossed_answer_reconsideration(
            pool,
            &c.channel,
            &c.reply_ts,
            &c.crossing_ts,
        )
        .await
        .unwrap_or(None);
        match row {
            Some(Some(_)) => {}
            Some(None) => v.push((
                "crossed_not_reconsidered",
                format!(
                    "reply {} crossed message {} in flight: recorded but never reconsidered",
                    c.reply_ts, c.crossing_ts
                ),
            )),
            None => v.push((
                "crossed_not_recorded",
                format!(
                    "reply {} crossed message {} in flight and threadline did not record it",
                    c.reply_ts, c.crossing_ts
                ),
            )),
        }
    }
    // The question's own outcome: its latest decision discarded for a
    // reason an operator sees (not merely superseded: a superseding answer
    // would have read it), its reply held or failed with a code, or its
    // event ignored or failed with a reason.
    let mut own: Vec<Option<String>> = Vec::new();
    for q in &j.unexplained {
        own.push(outcome_reason(pool, &q.channel, &q.ts).await);
    }
    let mut first: Vec<Option<String>> = Vec::new();
    for q in &j.unexplained {
        let key = |ts: &str| {
            let (a, b) = ts.split_once('.').unwrap_or((ts, "0"));
            (a.parse::<u64>().unwrap_or(0), b.parse::<u64>().unwrap_or(0))
        };
        let later = || {
            j.unexplained
                .iter()
                .zip(&own)
                .filter(|(o, r)| {
                    o.channel == q.channel
                        && o.thread_ts == q.thread_ts
                        && key(&o.ts) > key(&q.ts)
                        && r.is_some()
                })
                .min_by_key(|(o, _)| key(&o.ts))
                .and_then(|(_, r)| r.clone())
        };
        let i = first.len();
        first.push(
            own[i]
                .clone()
                .or_else(|| later().map(|r| format!("with a later question: {r}"))),
        );
    }
    // A question absorbed into a later request of its burst (double
    // texting) whose own thread has no later question is explained as
    // that request is: say, by a later question of the request's thread,
    // whose answer would have read the burst too (an answer to a reply
    // reads the burst before its thread's root while no answer there went
    // out).
    let mut reasons = Vec::new();
    for (i, q) in j.unexplained.iter().enumerate() {
        let mut reason = first[i].clone();
        let mut at = q.ts.clone();
        let mut seen = std::collections::HashSet::new();
        while reason.is_none() && seen.insert(at.clone()) {
            let Some(later) =
                threadline_store::testing::threads::absorbed_by(pool, &q.channel, &at).await
            else {
                break;
            };
            reason = j
                .unexplained
                .iter()
                .zip(&first)
                .find(|(o, _)| o.channel == q.channel && o.ts == later)
                .and_then(|(_, r)| r.clone())
                .map(|r| {
                    if r.starts_with("with a later question: ") {
                        r
                    } else {
                        format!("with a later question: {r}")
                    }
                });
            at = later;
        }
        if let Some(r) = reason {
            reasons.push((q.clone(), r));
        } else {
            let mut state = records_of(pool, &q.channel, &q.ts).await;
            // (absorbed into a later request of its burst: what became of
            // that one, which should have read it)
            if let Some(later) =
                threadline_store::testing::threads::absorbed_by(pool, &q.channel, &q.ts).await
            {
                let of_later = records_of(pool, &q.channel, &later).await;
                state.push_str(&format!(" — absorbed by {later}, which holds: {of_later}"));
                let thread =
                    threadline_store::testing::threads::thread_of(pool, &q.channel, &later).await;
                state.push_str(&format!("; its thread: [{}]", thread.join(" | ")));
            }
            v.push((
                "unexplained_question",
                format!(
                    "question {} in thread {} of {} has no reply and no reason an operator can see; threadline holds: {state}",
                    q.ts, q.thread_ts, q.channel
                ),
            ));
        }
    }
    RecordsVerdict {
        violations: v,
        reasons,
    }
}

/// What threadline's tables say about one message (receipts, turn,
/// decisions, intents), for a violation's diagnosis.
pub async fn records_of(pool: &sqlx::PgPool, channel: &str, ts: &str) -> String {
    let rows = threadline_store::testing::receipts::message_records(pool, channel, ts)
        .await
        .unwrap_or_else(|e| vec![format!("(unreadable: {e})")]);
    if rows.is_empty() {
        "nothing".to_owned()
    } else {
        rows.join("; ")
    }
}

/// Another workspace of the same app on the emulator, registered with
/// threadline: its own team, person, public channel and bot.
pub struct Workspace {
    pub team: String,
    pub user: String,
    pub channel: String,
    pub bot_user: String,
    pub token: String,
    pub inst: uuid::Uuid,
}

/// Registers an installation with `threadline install add`, as an operator
/// would.
async fn register(
    db_url: &str,
    keys: &str,
    team: &str,
    app: &str,
    bot_user: &str,
    bot_id: &str,
    token: &str,
) {
    let out = cli(
        &[
            "install",
            "add",
            "--team",
            team,
            "--app",
            app,
            "--bot-user",
            bot_user,
            "--bot-id",
            bot_id,
        ],
        &[
            ("DATABASE_URL", db_url.to_owned()),
            ("THREADLINE_TOKEN_KEYS", keys.to_owned()),
            // (the token through the environment, never an argument)
            ("SLACK_BOT_TOKEN", token.to_owned()),
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn id_of(v: &serde_json::Value, what: &str) -> String {
    v[what]
        .as_str()
        .unwrap_or_else(|| panic!("slack-sim answer without {what}: {v}"))
        .to_owned()
}

impl Stack {
    /// Starts everything; `extra` settings go to every service.
    pub async fn start(extra: &[(&str, String)]) -> Self {
        Self::start_on(extra, None, None).await
    }

    /// [`Stack::start`] with the app subscribed to `events` and installed
    /// with `scopes` (instead of mentions and public channels only).
    pub async fn start_with_app(
        extra: &[(&str, String)],
        events: &[&str],
        scopes: &[&str],
    ) -> Self {
        Self::start_on(extra, None, Some((events, scopes))).await
    }

    /// Starts everything on a broker with authorization (its `NATS_URL` in
    /// `extra`): each service logs in as its own user, the outbox relay
    /// runs as its own process (service 4, user relay) and the gateway
    /// (user gateway) does not relay; the stack's own client is the
    /// operator.
    pub async fn start_with_logins(
        extra: &[(&str, String)],
        logins: &crate::broker::Logins,
    ) -> Self {
        Self::start_on(extra, Some(logins), None).await
    }

    async fn start_on(
        extra: &[(&str, String)],
        logins: Option<&crate::broker::Logins>,
        app: Option<(&[&str], &[&str])>,
    ) -> Self {
        use serde_json::json;
        use threadline_runtime::nats_auth::Role;
        let db = threadline_testkit::TestDb::new().await;
        // A broker's users are made for one prefix.
        let prefix = logins
            .map(|l| l.prefix().to_owned())
            .unwrap_or_else(threadline_testkit::unique_prefix);
        // The broker the services use (a private one when the test wants
        // to take it away), with reconnects so the stack's own client
        // comes back after an outage too.
        let nats_url = extra
            .iter()
            .find(|(k, _)| *k == "NATS_URL")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(threadline_testkit::nats_url);
        let mut options = async_nats::ConnectOptions::new().retry_on_initial_connect();
        if let Some(l) = logins {
            options = options
                .user_and_password(Role::Operator.user().to_owned(), l.password(Role::Operator))
                .custom_inbox_prefix(Role::Operator.inbox_prefix());
        }
        let js = async_nats::jetstream::new(options.connect(&nats_url).await.expect("nats"));
        let sim = spawn_slack_sim(11, 0.01).await;
        // Tokens are sealed to an X25519 key: the gateway gets the public
        // half only, the services that post or read Slack the private one.
        let keys = threadline_tenancy::secrets::TokenKeys::generate_entry("k1");
        let public_keys = threadline_tenancy::secrets::TokenKeys::parse(&keys.clone().into())
            .expect("keys")
            .public_entries();
        let mut env: Vec<(&str, String)> = vec![
            ("DATABASE_URL", db.url.clone()),
            ("NATS_URL", threadline_testkit::nats_url()),
            ("THREADLINE_BUS_PREFIX", prefix.clone()),
            ("THREADLINE_AUDIT_KEY", "5a".repeat(32)),
            (
                "THREADLINE_DEAD_LETTER_KEYS",
                "d1:".to_owned() + &"17".repeat(32),
            ),
            ("THREADLINE_RELAY_SWEEP_MS", "200".to_owned()),
            (
                "SLACK_SIGNING_SECRET",
                threadline_testkit::slack::TEST_SECRET.to_owned(),
            ),
            ("SLACK_API_URL", format!("{}/api/", sim.base_url)),
            ("THREADLINE_POST_SPACING_MS", "0".to_owned()),
        ];
        env.extend(extra.iter().cloned());
        let saved: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        // Each service's own settings: its user, when the broker has
        // authorization; the relay (which declares the bus) starts first.
        let own = |role: Role, more: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
            let mut v = logins.map(|l| l.env(role)).unwrap_or_default();
            v.extend(more.iter().map(|(k, v)| (*k, (*v).to_owned())));
            v
        };
        let with = |own: &[(&'static str, String)]| -> Vec<(&str, String)> {
            env.iter().cloned().chain(own.iter().cloned()).collect()
        };
        // Each service logs in to Postgres as its own role
        // (migrations/0029_service_roles.sql), so every test of a stack
        // proves the grants suffice.
        let own_db = |v: &mut Vec<(&'static str, String)>, role: &str, token_keys: Option<&str>| {
            v.push(("DATABASE_URL", db.url_as(role)));
            match (role, token_keys) {
                ("threadline_gateway" | "threadline_relay", _) => {
                    v.push(("THREADLINE_TOKEN_PUBLIC_KEYS", public_keys.clone()));
                }
                (_, Some(k)) => v.push(("THREADLINE_TOKEN_KEYS", k.to_owned())),
                (_, None) => {}
            }
        };
        // As deployed: the outbox relay (and the spool's drainer beside
        // it) is a process of its own on its own role, service 4, and the
        // gateway that serves Slack does not relay, on the gateway's role,
        // so every test of a stack runs the public gateway as deployed.
        let mut relay_env = own(Role::Relay, &[("THREADLINE_RELAY_ENABLED", "true")]);
        own_db(&mut relay_env, "threadline_relay", None);
        let relay = spawn_gateway(&with(&relay_env)).await;
        let mut service_env = vec![
            own(Role::Gateway, &[("THREADLINE_RELAY_ENABLED", "false")]),
            own(Role::ContextBuilder, &[]),
            own(Role::Inference, &[]),
            own(Role::Publisher, &[]),
        ];
        for (v, (role, token_keys)) in service_env.iter_mut().zip([
            ("threadline_gateway", None),
            ("threadline_context_builder", Some(keys.as_str())),
            ("threadline_inference", None),
            ("threadline_publisher", Some(keys.as_str())),
        ]) {
            own_db(v, role, token_keys);
        }
        let gw = spawn_gateway(&with(&service_env[0])).await;
        let events_url = gw.events_url();
        let mut services = vec![
            gw,
            spawn_context_builder(&with(&service_env[1])).await,
            spawn_inference(&with(&service_env[2])).await,
            spawn_publisher(&with(&service_env[3])).await,
        ];
        services.push(relay);
        service_env.push(relay_env);
        let service_env: Vec<Vec<(String, String)>> = service_env
            .into_iter()
            .map(|v| v.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            .collect();

        let (events, scopes) = app.unwrap_or((
            &["app_mention", "message.channels"],
            &["chat:write", "channels:history", "channels:read"],
        ));
        let ws = threadline_testkit::sim::SimWorkspace::create(
            &sim.base_url,
            json!({"signing_secret": threadline_testkit::slack::TEST_SECRET, "request_urls": [events_url],
                   "events": events}),
            scopes,
            None,
        )
        .await;
        let (team, user, channel, app) = (
            ws.team.clone(),
            ws.user.clone(),
            ws.channel.clone(),
            ws.app_id(),
        );
        let (bot_user, bot_id, token) = (ws.bot_user(), ws.bot_id(), ws.token());
        let app_token = ws.app_token();
        register(&db.url, &keys, &team, &app, &bot_user, &bot_id, &token).await;
        Self {
            db,
            prefix,
            js,
            sim,
            services,
            team,
            user,
            channel,
            app,
            bot_user,
            token,
            app_token,
            env: saved,
            service_env,
            more_scopes: Default::default(),
            streams_seen_open: Default::default(),
            unjudged: None,
        }
    }

    /// Starts another replica of service `i` (0 gateway, 1 context-builder,
    /// 2 inference, 3 publisher) with the stack's settings plus `extra`.
    pub async fn spawn_replica(&self, i: usize, extra: &[(&str, String)]) -> Proc {
        let (bin, setting, _) = self.services[i].service.clone().expect("a service");
        let mut env = self.env_of(i);
        env.extend(extra.iter().cloned());
        spawn_service(&bin, &setting, &env).await
    }

    /// Switches the app to Socket Mode and starts a gateway replica that
    /// holds two connections to slack-sim (the HTTP gateway gets no events
    /// any more); the replica, once its connections are open or 30 s passed.
    pub async fn spawn_socket_gateway(&self) -> Proc {
        sim_ctl(
            &self.sim,
            &format!("apps/{}/socket_mode", self.app),
            serde_json::json!({"enabled": true}),
        )
        .await;
        let gateway = self
            .spawn_replica(
                0,
                &[
                    ("THREADLINE_SOCKET_MODE", "true".to_owned()),
                    ("SLACK_APP_TOKEN", self.app_token.clone()),
                    ("THREADLINE_SOCKET_CONNECTIONS", "2".to_owned()),
                ],
            )
            .await;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            let v = sim_get(&self.sim, &format!("socket?app_id={}", self.app)).await;
            if v["connections"].as_array().is_some_and(|c| c.len() >= 2) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        gateway
    }

    /// The settings service `i` was started with.
    pub fn env_of(&self, i: usize) -> Vec<(&str, String)> {
        self.env
            .iter()
            .chain(self.service_env.get(i).into_iter().flatten())
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect()
    }

    /// The conversations the oracle judges: every channel of the stack's
    /// workspaces where the bot is, with the bot a mention must name.
    pub fn scopes(&self) -> Vec<oracle::Scope> {
        let mut all = vec![oracle::Scope::mentions(&self.channel, &self.bot_user)];
        all.extend(
            self.more_scopes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned(),
        );
        all
    }

    /// Adds a channel for the oracle to judge (mentions are questions).
    pub fn judge_also(&self, channel: &str, bot_user: &str) {
        self.judge_also_as(channel, bot_user, oracle::ScopeKind::Mentions);
    }

    /// Adds a conversation of `kind` for the oracle to judge: a channel, a
    /// direct conversation (the pane), or a review channel.
    pub fn judge_also_as(&self, channel: &str, bot_user: &str, kind: oracle::ScopeKind) {
        let mut scopes = self.more_scopes.lock().unwrap_or_else(|p| p.into_inner());
        if scopes.iter().any(|s| s.channel == channel) {
            return;
        }
        scopes.push(oracle::Scope {
            channel: channel.to_owned(),
            bot_user: bot_user.to_owned(),
            kind,
        });
    }

    /// Judges the run from Slack's side (see [`oracle`]), then checks in
    /// threadline's records what Slack cannot show: each crossed-in-flight
    /// answer was recorded and reconsidered, and each question Slack does
    /// not explain has a reason an operator can see. Returns the judgement
    /// and every violation.
    pub async fn verdict(&self, grace: Duration) -> (oracle::Judgement, Vec<String>) {
        let (j, violations) = self.verdict_by_kind(grace).await;
        (j, violations.into_iter().map(|(_, v)| v).collect())
    }

    /// The oracle's limits for this stack: `grace`, and a stream's end
    /// bound from the stack's own settings (a stream nobody drives is taken
    /// over after the stream stale time, found at the next sweep, and ended
    /// by two stops, each within the Slack timeout), with a margin of 10 s
    /// for Slack's `Retry-After`; and the context's message limit
    /// (`THREADLINE_CONTEXT_MAX_MESSAGES`, 50 by default), past which a
    /// reply leaves older messages out.
    pub fn oracle_limits(&self, grace: Duration) -> oracle::Limits {
        let ms = |key: &str, default: u64| {
            self.env
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| v.parse::<u64>().ok())
                .unwrap_or(default)
        };
        let bound = ms("THREADLINE_STREAM_STALE_MS", 45_000)
            + ms("THREADLINE_SWEEP_MS", 5_000)
            + 3 * ms("THREADLINE_SLACK_TIMEOUT_MS", 10_000)
            + 10_000;
        let fallback = self
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "THREADLINE_FALLBACK_TEXT")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| DEFAULT_FALLBACK.to_owned());
        oracle::Limits {
            grace,
            stream_end: Duration::from_millis(bound),
            fallback: Some(fallback),
            context_max_messages: Some(ms("THREADLINE_CONTEXT_MAX_MESSAGES", 50) as usize),
            seen_open: self
                .streams_seen_open
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    /// [`Stack::verdict`] with each violation's kind.
    pub async fn verdict_by_kind(
        &self,
        grace: Duration,
    ) -> (oracle::Judgement, Vec<(&'static str, String)>) {
        let (j, records) = self.verdict_with_reasons(grace).await;
        let mut violations = j.violations.clone();
        violations.extend(records.violations);
        (j, violations)
    }

    /// The oracle's judgement and what threadline's records add to it
    /// (their violations, and the reason for each question they explain).
    pub async fn verdict_with_reasons(
        &self,
        grace: Duration,
    ) -> (oracle::Judgement, RecordsVerdict) {
        let j = oracle::judge_with(
            &self.sim.base_url,
            &self.app,
            &self.scopes(),
            self.oracle_limits(grace),
        )
        .await;
        let records = records_verdict(&self.db.pool, &j).await;
        (j, records)
    }

    /// SIGKILLs service `i` (0 gateway, 1 context-builder, 2 inference,
    /// 3 publisher) and starts it again on the same address.
    pub async fn kill_and_restart(&mut self, i: usize) {
        let old = self.services.remove(i);
        let (bin, setting, port) = old.service.clone().expect("a service");
        old.kill().await;
        let env = self.env_of(i);
        let fresh = spawn_service_at(&bin, &setting, port, &env).await;
        self.services.insert(i, fresh);
    }

    /// Adds a workspace `name` of the same app (public channel, a person,
    /// the bot joined) and registers its installation.
    pub async fn add_workspace(&self, name: &str) -> Workspace {
        self.add_workspace_with_scopes(name, &["chat:write", "channels:history", "channels:read"])
            .await
    }

    /// [`Stack::add_workspace`] with the app installed with `scopes`.
    pub async fn add_workspace_with_scopes(&self, name: &str, scopes: &[&str]) -> Workspace {
        use serde_json::json;
        let team = id_of(
            &sim_ctl(&self.sim, "teams", json!({"name": name})).await,
            "id",
        );
        let user = id_of(
            &sim_ctl(&self.sim, "users", json!({"team_id": team, "name": "bo"})).await,
            "id",
        );
        let channel = id_of(
            &sim_ctl(
                &self.sim,
                "channels",
                json!({"team_id": team, "name": "ops", "kind": "public", "members": [user]}),
            )
            .await,
            "id",
        );
        let install = sim_ctl(
            &self.sim,
            &format!("apps/{}/installs", self.app),
            json!({"team_id": team, "scopes": scopes, "join_channels": [channel]}),
        )
        .await;
        let (bot_user, bot_id, token) = (
            id_of(&install, "bot_user_id"),
            id_of(&install, "bot_id"),
            id_of(&install, "bot_token"),
        );
        let keys = self.service_env[3]
            .iter()
            .find(|(k, _)| k == "THREADLINE_TOKEN_KEYS")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        register(
            &self.db.url,
            &keys,
            &team,
            &self.app,
            &bot_user,
            &bot_id,
            &token,
        )
        .await;
        let inst = threadline_store::testing::installations::id_by_team(&self.db.pool, &team)
            .await
            .expect("the new installation");
        self.judge_also(&channel, &bot_user);
        Workspace {
            team,
            user,
            channel,
            bot_user,
            token,
            inst,
        }
    }

    /// A person posts (a reply when `thread_ts` is given); returns its ts.
    pub async fn post(&self, text: &str, thread_ts: Option<&str>) -> String {
        self.post_as(&self.user, &self.channel, text, thread_ts)
            .await
    }

    /// The person deletes their message `ts` in the stack's channel.
    pub async fn delete(&self, ts: &str) {
        sim_ctl(
            &self.sim,
            "act/delete",
            serde_json::json!({"channel": self.channel, "ts": ts}),
        )
        .await;
    }

    /// `user` posts in `channel` (a reply when `thread_ts` is given).
    pub async fn post_as(
        &self,
        user: &str,
        channel: &str,
        text: &str,
        thread_ts: Option<&str>,
    ) -> String {
        let mut body = serde_json::json!({"user": user, "channel": channel, "text": text});
        if let Some(t) = thread_ts {
            body["thread_ts"] = t.into();
        }
        id_of(&sim_ctl(&self.sim, "act/post", body).await, "ts")
    }

    /// Slack's ground truth: no message got more than one reply of the app.
    pub async fn assert_at_most_one_reply_per_message(&self) {
        let posts = sim_get(&self.sim, &format!("app_posts?app_id={}", self.app)).await;
        for t in posts["per_trigger"].as_array().cloned().unwrap_or_default() {
            assert_eq!(t["count"], 1, "at most one reply per message: {posts}");
        }
    }

    /// The app's messages in a thread, from Slack's side.
    pub async fn answers(&self, root: &str) -> Vec<serde_json::Value> {
        self.answers_in(&self.channel, root).await
    }

    /// The app's messages in thread `root` of `channel`, from Slack's side.
    pub async fn answers_in(&self, channel: &str, root: &str) -> Vec<serde_json::Value> {
        let v = sim_get(&self.sim, &format!("channels/{channel}/threads/{root}")).await;
        v["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m["app_id"].is_string())
            .collect()
    }

    /// Waits until `root` holds `n` answers, then a moment more to catch extras.
    pub async fn wait_answers(&self, root: &str, n: usize) -> Vec<serde_json::Value> {
        eventually(
            &format!("{n} answer(s) in the thread"),
            Duration::from_secs(30),
            || async move {
                let a = self.answers(root).await;
                (a.len() >= n).then_some(())
            },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        self.answers(root).await
    }

    /// Every service's `/metrics` text.
    pub async fn metrics(&self) -> String {
        let mut all = String::new();
        for p in &self.services {
            let text = reqwest::get(format!("{}/metrics", p.base_url))
                .await
                .expect("metrics")
                .text()
                .await
                .expect("text");
            all.push_str(&text);
        }
        all
    }

    /// Stops every service cleanly (each must exit 0), removes the streams,
    /// and returns everything the services logged. Before that, the run is
    /// judged from Slack's side by the oracle (unless the test said it
    /// cannot be, with [`Stack::unjudged`]): a violation fails the test.
    pub async fn stop(self) -> String {
        if let Some(why_not) = &self.unjudged {
            eprintln!("not judged by the oracle: {why_not}");
        } else {
            // Let what is in flight (a reconsideration, a late check)
            // finish first; the oracle reports what never does.
            if let Some(open) = quiesce(
                &self.db.pool,
                Some((&self.js, &self.prefix)),
                Duration::from_secs(30),
                Duration::from_millis(500),
            )
            .await
            {
                eprintln!("judging with work in flight: {open}");
            }
            let (j, violations) = self.verdict(ORACLE_GRACE).await;
            eprintln!(
                "judged by the oracle: {} questions, {} answered, {} replies",
                j.questions, j.answered, j.replies
            );
            assert!(
                violations.is_empty(),
                "the oracle (Slack's side) found violations:\n  {}\n({} replies, {} questions, {} answered)",
                violations.join("\n  "),
                j.replies,
                j.questions,
                j.answered
            );
        }
        let mut logs = String::new();
        for p in self.services.into_iter().rev() {
            let log = p.log.clone();
            assert!(
                p.terminate().await.success(),
                "a service did not stop cleanly"
            );
            if let Some(path) = log {
                logs.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
        threadline_testkit::delete_streams(&self.js, &self.prefix).await;
        logs
    }
}

/// One span as an OTLP/HTTP receiver got it.
#[derive(Debug, Clone)]
pub struct CapturedSpan {
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// Every attribute, rendered `key=value`.
    pub attributes: Vec<String>,
}

impl CapturedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find_map(|a| a.strip_prefix(key)?.strip_prefix('='))
    }
}

pub type Spans = std::sync::Arc<std::sync::Mutex<Vec<CapturedSpan>>>;

/// A local OTLP/HTTP receiver (what Jaeger or a collector would be): decodes
/// every `POST /v1/traces` and keeps the spans. Returns its base URL.
pub async fn otlp_collector() -> (String, Spans) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    use prost::Message as _;
    fn render(v: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
        match v.and_then(|v| v.value.as_ref()) {
            Some(V::StringValue(s)) => s.clone(),
            Some(V::IntValue(i)) => i.to_string(),
            Some(V::BoolValue(b)) => b.to_string(),
            Some(V::DoubleValue(d)) => d.to_string(),
            Some(other) => format!("{other:?}"),
            None => String::new(),
        }
    }
    let spans: Spans = Default::default();
    let store = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let store = store.clone();
            async move {
                let Ok(req) = ExportTraceServiceRequest::decode(body.as_ref()) else {
                    return axum::http::StatusCode::BAD_REQUEST;
                };
                let mut out = store.lock().unwrap_or_else(|p| p.into_inner());
                for rs in req.resource_spans {
                    let service = rs
                        .resource
                        .as_ref()
                        .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                        .map(|a| render(a.value.as_ref()))
                        .unwrap_or_default();
                    for ss in rs.scope_spans {
                        for sp in ss.spans {
                            out.push(CapturedSpan {
                                service: service.clone(),
                                name: sp.name.clone(),
                                trace_id: hex(&sp.trace_id),
                                span_id: hex(&sp.span_id),
                                parent_span_id: hex(&sp.parent_span_id),
                                attributes: sp
                                    .attributes
                                    .iter()
                                    .map(|a| format!("{}={}", a.key, render(a.value.as_ref())))
                                    .collect(),
                            });
                        }
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), spans)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
