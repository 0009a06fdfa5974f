//! A real OpenAI-compatible model server for the tests and the demo:
//! llama.cpp's own server (PyPI `xllamacpp`) serving SmolLM2-135M-Instruct,
//! started by `scripts/model_server.py` with the python of the virtualenv
//! `scripts/model-venv.sh` prepares (`THREADLINE_REAL_MODEL_PYTHON`).

use std::process::Stdio;
use std::time::Duration;

use threadline_testkit::eventually;

/// The model server, killed when dropped.
pub struct ModelServer {
    child: tokio::process::Child,
    port: u16,
}

impl ModelServer {
    /// Starts the server on a free port and waits until it is ready.
    pub async fn start() -> Self {
        let python = std::env::var("THREADLINE_REAL_MODEL_PYTHON").expect(
            "THREADLINE_REAL_MODEL_PYTHON: the python of scripts/model-venv.sh's virtualenv \
             (scripts/real-model-check.sh and make demo ARGS=--real-model set it)",
        );
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/model_server.py");
        let port = crate::free_port();
        let child = tokio::process::Command::new(python)
            .args([script, "--port", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the model server");
        let health = format!("http://127.0.0.1:{port}/health");
        eventually("the model server is ready", Duration::from_secs(60), || {
            let health = health.clone();
            async move {
                let r = reqwest::get(&health).await.ok()?;
                r.status().is_success().then_some(())
            }
        })
        .await;
        Self { child, port }
    }

    /// Its OpenAI-compatible base URL (`…/v1`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server at once (SIGKILL).
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// The inference service's settings for this server.
    pub fn inference_env(&self) -> Vec<(&'static str, String)> {
        inference_env(self.url())
    }
}

/// The question the tests and the demo ask a real model: a message, then a
/// mention in its thread. Returns the thread's root and the mention's text.
pub async fn ask_about_exit_code(s: &crate::Stack) -> (String, String) {
    let root = s.post(CONTEXT, None).await;
    let ask = format!("<@{}> what does exit code 137 usually mean?", s.bot_user);
    s.post(&ask, Some(&root)).await;
    (root, ask)
}

/// The message the question is asked under.
pub const CONTEXT: &str = "The deploy of the api service failed at 14:00 with exit code 137.";

/// How a real model's answer came out: posted in the thread `root` (the
/// reply as Slack shows it), or held for a reviewer (the decision and its
/// review reasons; a small model may echo the mention it read).
pub enum Outcome {
    Posted(serde_json::Value),
    Held(uuid::Uuid, Vec<String>),
}

/// Waits (up to 60 s) until the answer in `root` is posted or held.
pub async fn outcome(s: &crate::Stack, root: &str) -> Outcome {
    eventually(
        "the answer is posted or held for review",
        Duration::from_secs(60),
        || async move {
            if let Some(a) = s.answers(root).await.into_iter().next() {
                return Some(Outcome::Posted(a));
            }
            let held =
                threadline_store::testing::decisions::decision_id_with_status(&s.db.pool, "review")
                    .await
                    .ok()
                    .flatten()?;
            let reasons = threadline_store::testing::decisions::review_reasons(&s.db.pool, held)
                .await
                .ok()?;
            Some(Outcome::Held(held, reasons))
        },
    )
    .await
}

/// The inference service's settings for an OpenAI-compatible server at `url`.
pub fn inference_env(url: String) -> Vec<(&'static str, String)> {
    vec![
        ("THREADLINE_MODEL_PROVIDER", "openai".to_owned()),
        ("THREADLINE_MODEL_BASE_URL", url),
        ("THREADLINE_MODEL_NAME", "smollm2-135m-instruct".to_owned()),
        ("THREADLINE_MODEL_MAX_TOKENS", "64".to_owned()),
        ("THREADLINE_MODEL_TIMEOUT_MS", "30000".to_owned()),
    ]
}
