//! Helpers for end-to-end tests that run the compiled binaries as separate
//! processes (so they can be killed like a real crash).

use std::process::Stdio;
use std::time::Duration;

use threadline_testkit::{bin_path, eventually};
use tokio::process::{Child, Command};

/// A running threadline binary.
pub struct Proc {
    pub child: Child,
    pub base_url: String,
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
pub async fn spawn_gateway(env: &[(&str, String)]) -> Proc {
    spawn_service("threadline-gateway", "THREADLINE_GATEWAY_ADDR", env).await
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
/// only `env` set, and waits for `/healthz`.
pub async fn spawn_service(bin: &str, addr_setting: &str, env: &[(&str, String)]) -> Proc {
    let port = free_port();
    let mut cmd = Command::new(bin_path(bin));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env(addr_setting, format!("127.0.0.1:{port}"))
        .env("THREADLINE_LOG_FORMAT", "text")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("starting {bin}: {e}"));
    let base_url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    eventually(&format!("{bin} /healthz"), Duration::from_secs(15), || {
        let (c, u) = (client.clone(), format!("{base_url}/healthz"));
        async move {
            c.get(u)
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ())
        }
    })
    .await;
    Proc { child, base_url }
}

impl Proc {
    pub fn events_url(&self) -> String {
        format!("{}/slack/events", self.base_url)
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

/// Starts `threadline-slack-sim` on a fresh port and waits until it answers.
pub async fn spawn_slack_sim(seed: u64, time_scale: f64) -> Proc {
    let port = free_port();
    let child = Command::new(bin_path("threadline-slack-sim"))
        .args([
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--seed",
            &seed.to_string(),
        ])
        .args(["--time-scale", &time_scale.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting threadline-slack-sim");
    let base_url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    eventually("threadline-slack-sim", Duration::from_secs(15), || {
        let (c, u) = (client.clone(), format!("{base_url}/_sim/calls"));
        async move {
            c.get(u)
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ())
        }
    })
    .await;
    Proc { child, base_url }
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
