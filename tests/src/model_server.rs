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
