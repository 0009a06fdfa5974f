//! Socket Mode intake, for workspaces that cannot expose a public URL: the
//! gateway opens WebSocket connections to Slack (`apps.connections.open`
//! with the app-level token, several at once as Slack recommends) and
//! receives the same event bodies and interactions over them as envelopes.
//!
//! Each envelope is acknowledged only after its receipt and outbox row (or
//! its verdict) are committed: it runs through exactly the code an HTTP
//! delivery does (the same parsing, installation, deduplication by
//! `(api_app_id, event_id)` and group commit), and the acknowledgement
//! takes the place of the 200. An envelope that could not be committed is
//! not acknowledged, so Slack sends it again. Bolt and the SDKs acknowledge
//! before any durable step; threadline does not.
//!
//! A `disconnect` message (Slack refreshing the connection, or warning
//! that it will) opens a fresh connection before the old one is left; a
//! dropped connection is opened again with a growing pause.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use futures::{SinkExt as _, StreamExt as _};
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{Value, json};
use threadline_runtime::shutdown::CancellationToken;
use threadline_slack::WebClient;
use tokio::sync::Mutex;
use tokio_tungstenite::tungstenite::Message;

use crate::AppState;

/// Socket Mode settings.
#[derive(Clone)]
pub struct SocketMode {
    /// `SLACK_APP_TOKEN`: the app-level token (`xapp-…`, scope
    /// `connections:write`).
    pub app_token: SecretString,
    /// `THREADLINE_SOCKET_CONNECTIONS`, default 2: connections held open.
    pub connections: usize,
}

impl std::fmt::Debug for SocketMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketMode")
            .field("connections", &self.connections)
            .finish_non_exhaustive()
    }
}

/// Holds `mode.connections` connections open until `shutdown`.
pub async fn run(app: AppState, web: WebClient, mode: SocketMode, shutdown: CancellationToken) {
    // wss:// to Slack: rustls is built with two crypto providers here, so
    // the one it uses is named (once per process; a second call is a no-op).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut tasks = tokio::task::JoinSet::new();
    for slot in 0..mode.connections.max(1) {
        let (app, web, mode, shutdown) = (app.clone(), web.clone(), mode.clone(), shutdown.clone());
        tasks.spawn(async move { hold(slot, app, web, mode, shutdown).await });
    }
    while tasks.join_next().await.is_some() {}
}

/// One connection slot: open, serve, open again.
async fn hold(
    slot: usize,
    app: AppState,
    web: WebClient,
    mode: SocketMode,
    shutdown: CancellationToken,
) {
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        let served = tokio::select! {
            r = connect_and_serve(slot, &app, &web, &mode) => r,
            () = shutdown.cancelled() => return,
        };
        match served {
            Ok(why) => {
                failures = 0;
                tracing::info!(slot, why, "socket mode connection ended; opening another");
            }
            Err(e) => {
                failures += 1;
                metrics::counter!("threadline_socket_connection_failures_total").increment(1);
                tracing::warn!(
                    slot,
                    error = format!("{e:#}"),
                    failures,
                    "socket mode connection failed"
                );
                let pause = Duration::from_millis((250u64 << failures.min(7)).min(30_000));
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = shutdown.cancelled() => return,
                }
            }
        }
    }
}

type Sink = Arc<
    Mutex<
        futures::stream::SplitSink<
            tokio_tungstenite::WebSocketStream<
                tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
            >,
            Message,
        >,
    >,
>;

async fn connect_and_serve(
    slot: usize,
    app: &AppState,
    web: &WebClient,
    mode: &SocketMode,
) -> anyhow::Result<&'static str> {
    let opened = web
        .call("apps.connections.open", mode.app_token.expose_secret(), &[])
        .await?;
    let url = opened
        .get("url")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow::anyhow!("apps.connections.open answered no url"))?;
    let (ws, _) = tokio_tungstenite::connect_async(url).await?;
    let (sink, mut stream) = ws.split();
    let sink: Sink = Arc::new(Mutex::new(sink));
    metrics::gauge!("threadline_socket_connections").increment(1.0);
    let _open = scopeguard(|| metrics::gauge!("threadline_socket_connections").decrement(1.0));
    let mut inflight = tokio::task::JoinSet::new();
    let why = loop {
        let Some(msg) = stream.next().await else {
            break "closed";
        };
        let text = match msg? {
            Message::Text(t) => t.to_string(),
            Message::Ping(p) => {
                sink.lock().await.send(Message::Pong(p)).await?;
                continue;
            }
            Message::Close(_) => break "closed",
            _ => continue,
        };
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            tracing::warn!(slot, "socket mode message is not JSON; ignored");
            continue;
        };
        match v.get("type").and_then(Value::as_str).unwrap_or("") {
            "hello" => tracing::info!(slot, "socket mode connection ready"),
            "disconnect" => {
                // Slack asks for a fresh connection (refresh, warning): the
                // slot opens one at once; envelopes in flight still finish
                // (an unacknowledged one comes again).
                let reason = v.get("reason").and_then(|r| r.as_str()).unwrap_or("");
                tracing::info!(slot, reason, "socket mode disconnect");
                break "disconnect";
            }
            kind @ ("events_api" | "interactive" | "slash_commands") => {
                let Some(envelope_id) = v.get("envelope_id").and_then(Value::as_str) else {
                    continue;
                };
                let (app, sink, envelope_id, kind) = (
                    app.clone(),
                    sink.clone(),
                    envelope_id.to_owned(),
                    kind.to_owned(),
                );
                inflight.spawn(async move {
                    if let Err(e) = envelope(&app, &sink, &envelope_id, &kind, &v).await {
                        tracing::warn!(
                            error = format!("{e:#}"),
                            "socket mode envelope not acknowledged"
                        );
                    }
                });
            }
            _ => {}
        }
    };
    // Envelopes being committed finish (and are acknowledged if the
    // connection still takes it).
    while inflight.join_next().await.is_some() {}
    Ok(why)
}

/// Commits one envelope the way an HTTP delivery is committed, then
/// acknowledges it; an envelope that could not be committed is left
/// unacknowledged (Slack sends it again).
async fn envelope(
    app: &AppState,
    sink: &Sink,
    envelope_id: &str,
    kind: &str,
    v: &Value,
) -> anyhow::Result<()> {
    let payload = v.get("payload").cloned().unwrap_or(Value::Null);
    let status = match kind {
        "events_api" => {
            // Slack's retry of an envelope, as the HTTP headers say it.
            let mut headers = HeaderMap::new();
            let attempt = v.get("retry_attempt").and_then(Value::as_i64).unwrap_or(0);
            if let Ok(h) = HeaderValue::from_str(&attempt.to_string()) {
                headers.insert("x-slack-retry-num", h);
            }
            if let Some(h) = v
                .get("retry_reason")
                .and_then(Value::as_str)
                .and_then(|r| HeaderValue::from_str(r).ok())
            {
                headers.insert("x-slack-retry-reason", h);
            }
            let body = serde_json::to_vec(&payload)?;
            crate::events::accept_body(app, &headers, &body).await
        }
        "interactive" => crate::interactions::handle_payload(app, &payload).await,
        // (no slash commands are handled: acknowledged, nothing to keep)
        _ => StatusCode::OK,
    };
    metrics::counter!("threadline_socket_envelopes_total", "type" => kind.to_owned(), "acked" => if status.is_success() { "true" } else { "false" })
        .increment(1);
    if !status.is_success() {
        anyhow::bail!("not committed ({status}); left for Slack to send again");
    }
    let ack = json!({"envelope_id": envelope_id}).to_string();
    sink.lock().await.send(Message::Text(ack.into())).await?;
    Ok(())
}

/// Runs `f` when dropped.
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}
