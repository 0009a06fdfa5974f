//! A real model in the loop: llama.cpp's own OpenAI-compatible server
//! (PyPI `xllamacpp`) serving SmolLM2-135M-Instruct answers mentions
//! through `/v1/chat/completions`, judged from Slack's side. The tests
//! start the server themselves from the virtualenv that
//! `scripts/real-model-check.sh` prepares (it runs them, in `make test`);
//! the workspace run skips them, since they need that virtualenv.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;
use threadline_tests::model_server::{
    ModelServer, Outcome, ask_about_exit_code, inference_env, outcome,
};
use threadline_tests::{Stack, cli, sim_get};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const LABEL: &str = "_AI-generated — verify before relying on it_";

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

/// Runs the CLI against the stack's database and bus.
async fn run_cli(s: &Stack, args: &[&str]) {
    let env = [
        ("DATABASE_URL", s.db.url.clone()),
        ("NATS_URL", threadline_testkit::nats_url()),
        ("THREADLINE_BUS_PREFIX", s.prefix.clone()),
    ];
    let out = cli(args, &env).await;
    assert!(
        out.status.success(),
        "threadline {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Review reasons a small model's words can earn by echoing Slack markup
/// (the thread it reads holds the bot's mention).
const MARKUP_REASONS: &[&str] = &["mention", "mass_mention", "disguised_link", "slack_command"];

/// A mention answered by the real model: one post in the thread, the
/// model's own words (not the built-in model's, not the fallback), the AI
/// label, decided at the thread version its context read. A small model
/// may echo the mention it read, which holds the answer for a reviewer:
/// then nothing reaches Slack until a reviewer approves, and the approved
/// answer is posted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the model virtualenv: scripts/real-model-check.sh runs it"]
async fn a_real_model_answers_a_mention_once_bound_to_its_thread_version() {
    let model = ModelServer::start().await;
    let mut s = Stack::start(&model.inference_env()).await;
    s.unjudged = Some("a real model's answer does not say which messages it read");
    let (root, _) = ask_about_exit_code(&s).await;
    if let Outcome::Held(decision, reasons) = outcome(&s, &root).await {
        assert!(
            !reasons.is_empty() && reasons.iter().all(|r| MARKUP_REASONS.contains(&r.as_str())),
            "held only for markup the model echoed: {reasons:?}"
        );
        assert!(posts(&s).await.is_empty(), "nothing posted while held");
        eprintln!("the model's answer was held for review ({reasons:?}); approving it");
        run_cli(
            &s,
            &["review", "approve", &decision.to_string(), "--by", "ana"],
        )
        .await;
    }
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

/// One HTTP/1.1 request as the client sent it: its head and a body of
/// its `Content-Length`.
async fn read_request(client: &mut tokio::net::TcpStream) -> Vec<u8> {
    let (mut buf, mut chunk) = (Vec::new(), [0u8; 8192]);
    loop {
        let n = client.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return buf;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return buf;
            }
        }
    }
}

/// Whether the model server is generating an answer now (its `/slots`).
async fn generating(port: u16) -> bool {
    let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/slots")).await else {
        return false;
    };
    r.json::<Value>()
        .await
        .ok()
        .and_then(|v| v.as_array().cloned())
        .is_some_and(|slots| slots.iter().any(|s| s["is_processing"] == true))
}

/// A proxy in front of the model server: the first request goes to the
/// server whole; once the server says it is generating the answer, the
/// server is killed and the caller's connection closed without an answer.
/// The flag says the kill happened while the model was answering.
async fn killing_proxy(mut model: ModelServer) -> (String, Arc<AtomicBool>) {
    let killed_mid_answer = Arc::new(AtomicBool::new(false));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/v1", l.local_addr().expect("addr"));
    let port = model.port();
    let flag = killed_mid_answer.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = l.accept().await {
            let request = read_request(&mut client).await;
            let upstream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
            if let Ok(mut server) = upstream {
                let _ = server.write_all(&request).await;
                let mut answering = false;
                for _ in 0..1000 {
                    if generating(port).await {
                        answering = true;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                model.kill().await;
                flag.fetch_or(answering, Ordering::SeqCst);
                drop(server);
            }
            drop(client);
        }
    });
    (url, killed_mid_answer)
}

/// The model server dies in the middle of an answer: the policy's fallback
/// is posted once, labelled, and nothing else reaches the thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the model virtualenv: scripts/real-model-check.sh runs it"]
async fn a_model_server_killed_mid_answer_leads_to_one_fallback_reply() {
    let model = ModelServer::start().await;
    let (url, killed) = killing_proxy(model).await;
    let mut s = Stack::start(&inference_env(url)).await;
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

/// The settings that stream answers (on top of the model server's).
fn streamed(mut env: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    env.extend([
        ("THREADLINE_STREAMING", "true".to_owned()),
        ("THREADLINE_STREAM_RELEASE_MS", "100".to_owned()),
        ("THREADLINE_STREAM_APPEND_MS", "200".to_owned()),
    ]);
    env
}

async fn ok_calls(s: &Stack, method: &str) -> Vec<Value> {
    sim_get(&s.sim, &format!("calls?method={method}")).await["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["outcome"] == "ok")
        .collect()
}

fn labelled(m: &Value) -> bool {
    m["blocks"].as_array().is_some_and(|b| {
        b.iter().any(|b| {
            b["type"] == "context"
                && b.to_string()
                    .contains("AI-generated — verify before relying on it")
        })
    })
}

const REVIEW_LINE: &str = "_The rest of this answer needs a person's review before it is shown._";
const INTERRUPTED_LINE: &str = "_This answer was interrupted before it finished._";

/// The real model's answer streamed through `/v1/chat/completions` with
/// `stream: true`: one stream in the thread, grown as the server wrote,
/// stopped with the AI label and the intent's metadata, bound to the
/// thread version its context read. Should the model echo markup, the
/// stream ends for review showing none of it, and the approved answer is
/// posted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the model virtualenv: scripts/real-model-check.sh runs it"]
async fn a_real_model_streams_its_answer_once_labelled_and_bound() {
    let model = ModelServer::start().await;
    let mut s = Stack::start(&streamed(model.inference_env())).await;
    s.unjudged = Some("a real model's answer does not say which messages it read");
    let (root, _) = ask_about_exit_code(&s).await;
    let done =
        threadline_testkit::eventually("the stream stopped", Duration::from_secs(60), || async {
            s.answers(&root)
                .await
                .into_iter()
                .find(|m| m["streaming_state"] == "completed")
        })
        .await;
    let text = done["text"].as_str().expect("text").to_owned();
    assert!(labelled(&done), "labelled: {done}");
    if text.ends_with(REVIEW_LINE) {
        let decision =
            threadline_store::testing::decisions::decision_id_with_status(&s.db.pool, "review")
                .await
                .expect("read")
                .expect("held for review");
        eprintln!("the streamed answer went to review; approving it");
        run_cli(
            &s,
            &["review", "approve", &decision.to_string(), "--by", "ana"],
        )
        .await;
        let answers = s.wait_answers(&root, 2).await;
        assert_eq!(answers.len(), 2, "{answers:?}");
        assert_eq!(ok_calls(&s, "chat.postMessage").await.len(), 1);
    } else {
        assert!(
            !text.starts_with("[threadline built-in model]") && text.trim().len() > 10,
            "the real model's words: {text}"
        );
        assert_eq!(done["metadata"]["event_type"], "threadline_reply");
        // (Slack shows the stream stopped a moment before the publisher
        // has recorded it)
        let (receipt, version, state, decided) = threadline_testkit::eventually(
            "the stream recorded as sent",
            Duration::from_secs(10),
            || async {
                let b = bound_version(&s).await;
                (b.2 == "sent").then_some(b)
            },
        )
        .await;
        assert_eq!((state.as_str(), decided), ("sent", version));
        let (provider, fallback, _) =
            threadline_store::testing::decisions::answered_by(&s.db.pool, receipt)
                .await
                .expect("decision");
        assert!(!fallback && provider.as_deref().is_some_and(|p| p != "builtin"));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(s.answers(&root).await.len(), 1);
        assert!(ok_calls(&s, "chat.postMessage").await.is_empty());
    }
    // One stream, never a second.
    assert_eq!(ok_calls(&s, "chat.startStream").await.len(), 1);
    assert_eq!(ok_calls(&s, "chat.stopStream").await.len(), 1);
    s.stop().await;
    drop(model);
}

/// A proxy that relays the model server's streamed answer and, after
/// `events` of its server-sent events, kills the server and drops the
/// connection: the answer is cut off mid-stream. The flag says the cut
/// came after some of the answer had been relayed.
async fn cutting_proxy(mut model: ModelServer, events: usize) -> (String, Arc<AtomicBool>) {
    let cut_mid_answer = Arc::new(AtomicBool::new(false));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/v1", l.local_addr().expect("addr"));
    let port = model.port();
    let flag = cut_mid_answer.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = l.accept().await {
            let request = read_request(&mut client).await;
            let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                drop(client);
                continue;
            };
            let _ = server.write_all(&request).await;
            let (mut seen, mut buf) = (0usize, [0u8; 4096]);
            loop {
                let n = server.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                let _ = client.write_all(&buf[..n]).await;
                seen += String::from_utf8_lossy(&buf[..n])
                    .matches("\"content\":\"")
                    .count();
                if seen >= events {
                    flag.store(true, Ordering::SeqCst);
                    break;
                }
            }
            model.kill().await;
            drop(server);
            drop(client);
        }
    });
    (url, cut_mid_answer)
}

/// The model server dies in the middle of a streamed answer: the stream is
/// closed honestly (its closing line, the label) and the policy's fallback
/// follows once; or, when nothing had been shown yet, the fallback is what
/// the one stream says. Never a second stream, never a partial answer
/// left as if it were whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the model virtualenv: scripts/real-model-check.sh runs it"]
async fn a_model_server_killed_mid_stream_closes_the_stream_honestly_and_falls_back_once() {
    let model = ModelServer::start().await;
    let (url, cut) = cutting_proxy(model, 12).await;
    let mut s = Stack::start(&streamed(inference_env(url))).await;
    s.unjudged = Some("the fallback does not say which messages it read");
    let root = s
        .post(&format!("<@{}> summarise the incident", s.bot_user), None)
        .await;
    threadline_testkit::eventually("the stream stopped", Duration::from_secs(60), || async {
        s.answers(&root)
            .await
            .into_iter()
            .find(|m| m["streaming_state"] == "completed")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let answers = s.answers(&root).await;
    assert!(cut.load(Ordering::SeqCst), "the answer was cut mid-stream");
    for a in &answers {
        assert!(labelled(a), "labelled: {a}");
    }
    let first = answers[0]["text"].as_str().expect("text");
    eprintln!(
        "after the cut Slack shows {} message(s); the stream says: {first:?}",
        answers.len()
    );
    if answers.len() == 2 {
        assert!(
            first.ends_with(INTERRUPTED_LINE),
            "closed honestly: {first}"
        );
        assert_eq!(ok_calls(&s, "chat.postMessage").await.len(), 1);
    } else {
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert!(
            first.starts_with("threadline could not process this request"),
            "nothing was shown before the cut, so the one stream is the fallback: {first}"
        );
    }
    let receipt = threadline_store::testing::threads::first_context(&s.db.pool)
        .await
        .expect("one context")
        .receipt_id;
    let (_, fallback, _) = threadline_store::testing::decisions::answered_by(&s.db.pool, receipt)
        .await
        .expect("decision");
    assert!(fallback, "the answer is the fallback");
    assert_eq!(ok_calls(&s, "chat.startStream").await.len(), 1);
    s.stop().await;
}
