//! Model providers: an OpenAI-compatible chat-completions client (OpenAI,
//! vLLM, Ollama, llama.cpp server, LiteLLM) and the built-in deterministic
//! model, each behind a circuit breaker.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{Value, json};

/// What a model said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub text: String,
    /// Names of tools the model asked to run (never run: they make the
    /// proposal risky).
    pub tool_calls: Vec<String>,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProviderError {
    #[error("timed out")]
    Timeout,
    #[error("circuit open")]
    CircuitOpen,
    #[error("HTTP {0}")]
    Http(u16),
    #[error("unreachable")]
    Transport,
    #[error("malformed answer")]
    Malformed,
    /// A streamed call ended by threadline (the answer is not wanted any
    /// more: the thread moved on).
    #[error("stopped")]
    Stopped,
}

impl ProviderError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::CircuitOpen => "circuit_open",
            Self::Http(_) => "http_error",
            Self::Transport => "transport",
            Self::Malformed => "malformed",
            Self::Stopped => "stopped",
        }
    }
}

/// An OpenAI-compatible `/chat/completions` endpoint.
#[derive(Debug)]
pub struct OpenAiClient {
    pub name: String,
    base_url: String,
    model: String,
    api_key: Option<SecretString>,
    max_tokens: u32,
    http: reqwest::Client,
}

impl OpenAiClient {
    pub fn new(
        name: &str,
        base_url: &str,
        model: &str,
        api_key: Option<SecretString>,
        timeout: Duration,
        max_tokens: u32,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(Self {
            name: name.to_owned(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            model: model.to_owned(),
            api_key,
            max_tokens,
            http,
        })
    }

    pub fn describe(&self) -> String {
        format!(
            "openai-compatible {} model={} max_tokens={}",
            self.base_url, self.model, self.max_tokens
        )
    }

    /// One chat completion. No tools are offered: the request never carries
    /// a `tools` field, whatever the thread asked for.
    pub async fn complete(&self, messages: &[Value]) -> Result<Completion, ProviderError> {
        let body = json!({"model": self.model, "messages": messages, "max_tokens": self.max_tokens, "temperature": 0.2});
        let mut req = self
            .http
            .post(format!("{}/chat/completions", self.base_url))
            .json(&body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key.expose_secret());
        }
        let r = req.send().await.map_err(|e| {
            if e.is_timeout() {
                ProviderError::Timeout
            } else {
                ProviderError::Transport
            }
        })?;
        let status = r.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(ProviderError::Http(status));
        }
        let v: Value = r.json().await.map_err(|e| {
            if e.is_timeout() {
                ProviderError::Timeout
            } else {
                ProviderError::Malformed
            }
        })?;
        completion_of(&v)
    }
}

/// A whole (not streamed) chat completion's answer.
fn completion_of(v: &Value) -> Result<Completion, ProviderError> {
    let msg = v
        .pointer("/choices/0/message")
        .ok_or(ProviderError::Malformed)?;
    let text = msg
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let tool_calls: Vec<String> = msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    c.pointer("/function/name")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown") // not a state: no tool name
                        .to_owned()
                })
                .collect()
        })
        .unwrap_or_default();
    if text.trim().is_empty() && tool_calls.is_empty() {
        return Err(ProviderError::Malformed);
    }
    let tokens = |k: &str| {
        v.pointer(&format!("/usage/{k}"))
            .and_then(Value::as_i64)
            .map(|n| n as i32)
    };
    Ok(Completion {
        text,
        tool_calls,
        prompt_tokens: tokens("prompt_tokens"),
        completion_tokens: tokens("completion_tokens"),
    })
}

/// What a streamed answer does with each piece of text as it arrives:
/// false stops the call (nobody needs the rest).
pub trait Sink {
    fn text(&mut self, delta: &str) -> impl std::future::Future<Output = bool> + Send;
    /// The answer will need a reviewer whatever its text (the model asked
    /// for a tool): release nothing more.
    fn hold(&mut self);
}

impl OpenAiClient {
    /// One chat completion streamed as server-sent events (`stream: true`):
    /// each piece of content goes to `sink` as it arrives; the whole
    /// completion is returned at the end. A stream that ends without its
    /// `[DONE]` (the server died, the connection dropped) is an error, as
    /// is one the sink stopped.
    pub async fn complete_streaming<S: Sink + Send>(
        &self,
        messages: &[Value],
        sink: &mut S,
    ) -> Result<Completion, ProviderError> {
        let body = json!({"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                          "temperature": 0.2, "stream": true, "stream_options": {"include_usage": true}});
        let mut req = self
            .http
            .post(format!("{}/chat/completions", self.base_url))
            .json(&body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key.expose_secret());
        }
        let transport = |e: reqwest::Error| {
            if e.is_timeout() {
                ProviderError::Timeout
            } else {
                ProviderError::Transport
            }
        };
        let mut r = req.send().await.map_err(transport)?;
        let status = r.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(ProviderError::Http(status));
        }
        let is_json = r
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if is_json {
            // A server that does not stream answers whole: that is the
            // answer (nothing released before it; posted at the end).
            let v: Value = r.json().await.map_err(|_| ProviderError::Malformed)?;
            let c = completion_of(&v)?;
            if !c.tool_calls.is_empty() {
                sink.hold();
            }
            return Ok(c);
        }
        let mut events = SseLines::default();
        let mut out = Completion {
            text: String::new(),
            tool_calls: Vec::new(),
            prompt_tokens: None,
            completion_tokens: None,
        };
        while let Some(chunk) = r.chunk().await.map_err(transport)? {
            for data in events.push(&chunk)? {
                if data == "[DONE]" {
                    if out.text.trim().is_empty() && out.tool_calls.is_empty() {
                        return Err(ProviderError::Malformed);
                    }
                    return Ok(out);
                }
                let v: Value = serde_json::from_str(&data).map_err(|_| ProviderError::Malformed)?;
                if v.get("error").is_some() {
                    return Err(ProviderError::Malformed);
                }
                let delta = v.pointer("/choices/0/delta");
                if let Some(calls) = delta
                    .and_then(|d| d.get("tool_calls"))
                    .and_then(Value::as_array)
                {
                    for c in calls {
                        if let Some(name) = c.pointer("/function/name").and_then(Value::as_str) {
                            out.tool_calls.push(name.to_owned());
                        }
                    }
                    sink.hold();
                }
                if let Some(text) = delta
                    .and_then(|d| d.get("content"))
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                {
                    out.text.push_str(text);
                    if !sink.text(text).await {
                        return Err(ProviderError::Stopped);
                    }
                }
                let tokens = |k: &str| {
                    v.pointer(&format!("/usage/{k}"))
                        .and_then(Value::as_i64)
                        .map(|n| n as i32)
                };
                out.prompt_tokens = tokens("prompt_tokens").or(out.prompt_tokens);
                out.completion_tokens = tokens("completion_tokens").or(out.completion_tokens);
            }
        }
        // The body ended without `[DONE]`: cut off.
        Err(ProviderError::Transport)
    }
}

/// Splits a server-sent event stream into the `data` of its events.
#[derive(Default)]
struct SseLines {
    buf: Vec<u8>,
    data: Vec<String>,
}

impl SseLines {
    /// The events completed by `chunk`, each event's `data` lines joined.
    fn push(&mut self, chunk: &[u8]) -> Result<Vec<String>, ProviderError> {
        self.buf.extend_from_slice(chunk);
        let mut done = Vec::new();
        while let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=nl).collect();
            let line = std::str::from_utf8(&line)
                .map_err(|_| ProviderError::Malformed)?
                .trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() {
                    done.push(self.data.join("\n"));
                    self.data.clear();
                }
            } else if let Some(d) = line.strip_prefix("data:") {
                self.data.push(d.strip_prefix(' ').unwrap_or(d).to_owned());
            }
            // (comments, `event:`, `id:` and `retry:` lines carry nothing here)
        }
        Ok(done)
    }
}

/// One message of the thread as the built-in model reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read<'a> {
    pub ts: &'a str,
    pub user: &'a str,
    pub text: &'a str,
}

/// The short digest of a message's text that the built-in model states
/// for each message it read: the first 8 hex digits of its SHA-256.
pub fn text_digest(text: &str) -> String {
    use sha2::{Digest as _, Sha256};
    hex::encode(&Sha256::digest(text.as_bytes())[..4])
}

/// The built-in deterministic model: its answer is derived from the
/// context, so tests and demos can predict it, and it says what it is.
/// It states the question it answers (its text and Slack ts, the ts in
/// its first words too, so that a stream ended early still says which
/// question it was answering) and every message it read (`ts/digest`), so
/// that a checker reading only Slack can tell which question a reply
/// answers and whether it missed a message.
/// The question is quoted as a reader sees it (`<@U1> why?` as `@U1
/// why?`): the model mentions and links nobody.
pub fn builtin(thread: &[Read<'_>], source_ts: &str, version: i64) -> Completion {
    let people: std::collections::BTreeSet<&str> = thread.iter().map(|m| m.user).collect();
    let asked: String = thread
        .iter()
        .find(|m| m.ts == source_ts)
        .map(|m| threadline_domain::output::markup::readable(m.text))
        .unwrap_or_default()
        .chars()
        .take(120)
        .collect();
    let read: Vec<String> = thread
        .iter()
        .map(|m| format!("{}/{}", m.ts, text_digest(m.text)))
        .collect();
    Completion {
        text: format!(
            "[threadline built-in model] Answering {source_ts}. I read {} message(s) from {} participant(s) in this thread (version {version}). \
             You asked: \u{201c}{}\u{201d}. The built-in model does not answer questions; configure a model provider \
             for real answers.\nAnswering {source_ts}; read {}",
            thread.len(),
            people.len(),
            asked.trim(),
            read.join(" ")
        ),
        tool_calls: Vec::new(),
        prompt_tokens: None,
        completion_tokens: None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    fn gauge(self) -> f64 {
        match self {
            Self::Closed => 0.0,
            Self::HalfOpen => 1.0,
            Self::Open => 2.0,
        }
    }
}

/// Opens after `threshold` consecutive failures; after `cooldown` lets one
/// probe through (half-open): success closes it, failure opens it again.
#[derive(Debug)]
pub struct Breaker {
    name: String,
    threshold: u32,
    cooldown: Duration,
    inner: Mutex<(BreakerState, u32, Option<Instant>, bool)>,
}

impl Breaker {
    pub fn new(name: &str, threshold: u32, cooldown: Duration) -> Self {
        Self {
            name: name.to_owned(),
            threshold: threshold.max(1),
            cooldown,
            inner: Mutex::new((BreakerState::Closed, 0, None, false)),
        }
    }

    pub fn state(&self) -> BreakerState {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).0
    }

    /// May a call go through now? (In half-open, only one probe at a time.)
    pub fn admit(&self) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match g.0 {
            BreakerState::Closed => true,
            BreakerState::Open => {
                if g.2.is_some_and(|t| t.elapsed() >= self.cooldown) {
                    g.0 = BreakerState::HalfOpen;
                    g.3 = true;
                    self.report(g.0);
                    true
                } else {
                    false
                }
            }
            BreakerState::HalfOpen => {
                if g.3 {
                    false
                } else {
                    g.3 = true;
                    true
                }
            }
        }
    }

    pub fn record(&self, ok: bool) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.3 = false;
        if ok {
            g.0 = BreakerState::Closed;
            g.1 = 0;
        } else {
            g.1 += 1;
            if g.0 == BreakerState::HalfOpen || g.1 >= self.threshold {
                g.0 = BreakerState::Open;
                g.2 = Some(Instant::now());
            }
        }
        self.report(g.0);
    }

    fn report(&self, s: BreakerState) {
        metrics::gauge!("threadline_model_breaker_state", "provider" => self.name.clone())
            .set(s.gauge());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_opens_probes_and_closes() {
        let b = Breaker::new("p", 3, Duration::from_millis(50));
        for _ in 0..2 {
            assert!(b.admit());
            b.record(false);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.admit());
        b.record(false);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.admit(), "open: calls are refused");
        std::thread::sleep(Duration::from_millis(60));
        assert!(b.admit(), "after the cooldown one probe goes through");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(!b.admit(), "only one probe at a time");
        b.record(false);
        assert_eq!(
            b.state(),
            BreakerState::Open,
            "a failed probe opens it again"
        );
        std::thread::sleep(Duration::from_millis(60));
        assert!(b.admit());
        b.record(true);
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.admit());
    }

    #[test]
    fn server_sent_events_split_into_their_data_across_chunks() {
        let mut s = SseLines::default();
        assert_eq!(s.push(b"data: {\"a\"").unwrap(), Vec::<String>::new());
        assert_eq!(
            s.push(b":1}\r\n\r\n: keep-alive\n\ndata: x\ndata: y\n\nevent: e\ndata:[DONE]\n")
                .unwrap(),
            vec!["{\"a\":1}".to_owned(), "x\ny".to_owned()]
        );
        assert_eq!(s.push(b"\n").unwrap(), vec!["[DONE]".to_owned()]);
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let b = Breaker::new("p", 2, Duration::from_secs(60));
        b.record(false);
        b.record(true);
        b.record(false);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn the_builtin_model_is_deterministic_and_says_what_it_is() {
        let read = |ts, user, text| Read { ts, user, text };
        let thread = vec![
            read("1.000001", "U1", "a"),
            read("1.000002", "U2", "why did it fail?"),
            read("1.000003", "U1", "c"),
        ];
        let a = builtin(&thread, "1.000002", 7);
        assert_eq!(a, builtin(&thread, "1.000002", 7));
        assert!(a.text.starts_with("[threadline built-in model]"));
        assert!(a.text.contains("3 message(s) from 2 participant(s)"));
        assert!(a.text.contains("version 7"));
        assert!(a.text.contains("why did it fail?"));
        // The question and every message read, each with its text digest.
        assert!(
            a.text.ends_with(&format!(
                "Answering 1.000002; read 1.000001/{} 1.000002/{} 1.000003/{}",
                text_digest("a"),
                text_digest("why did it fail?"),
                text_digest("c")
            )),
            "{}",
            a.text
        );
        assert_eq!(text_digest("a"), "ca978112");
    }
}
