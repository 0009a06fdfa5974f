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
    /// Whether a `ws://` URL (no TLS) is accepted: only when the Web API
    /// itself is plain HTTP (a local emulator).
    pub allow_plain: bool,
    /// Connections open now (Slack said `hello` on them): the gateway is
    /// ready once one is.
    pub open: Arc<std::sync::atomic::AtomicUsize>,
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

/// Envelopes one connection commits at once; beyond them it stops reading
/// (Slack holds the rest, and sends again what waits too long).
const IN_FLIGHT: usize = 64;

/// A connection with nothing from Slack (not even a ping) for this long is
/// taken for dead and replaced.
const IDLE: Duration = Duration::from_secs(120);

/// The largest message (and frame) read from a connection: an envelope
/// carries one delivery body (at most `THREADLINE_GATEWAY_MAX_BODY_BYTES`,
/// 1 MiB) and a little JSON around it. A larger one closes the connection
/// unread (tungstenite would hold up to 64 MiB of each of [`IN_FLIGHT`]).
pub const MAX_MESSAGE: usize = 2 << 20;

/// How long a connection Slack asked to replace is still read: Slack
/// closes it within seconds; whatever it sends (pings included), it is
/// closed by this deadline.
const REPLACED: Duration = Duration::from_secs(15);

/// One connection slot: open, serve, open again. A connection that ended
/// quickly (before `hello`, or within seconds) is replaced only after a
/// growing pause, so that a refusing Slack is not asked in a loop.
async fn hold(
    slot: usize,
    app: AppState,
    web: WebClient,
    mode: SocketMode,
    shutdown: CancellationToken,
) {
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        let started = std::time::Instant::now();
        let served = tokio::select! {
            r = connect_and_serve(slot, &app, &web, &mode, &shutdown) => r,
            () = shutdown.cancelled() => return,
        };
        let pause = match served {
            Ok(End { why, greeted }) if greeted && started.elapsed() > Duration::from_secs(10) => {
                failures = 0;
                tracing::info!(slot, why, "socket mode connection ended; opening another");
                Duration::ZERO
            }
            Ok(End {
                why: "link_disabled",
                ..
            }) => {
                failures += 1;
                tracing::error!(
                    alert = "socket_mode_disabled",
                    slot,
                    "Slack disabled Socket Mode for the app (link_disabled); trying again in a minute"
                );
                Duration::from_secs(60)
            }
            Ok(End { why, .. }) => {
                failures += 1;
                tracing::warn!(slot, why, failures, "socket mode connection ended early");
                backoff(failures, None)
            }
            Err(e) => {
                failures += 1;
                metrics::counter!("threadline_socket_connection_failures_total").increment(1);
                let retry_after = match e.downcast_ref::<threadline_slack::WebError>() {
                    Some(threadline_slack::WebError::RateLimited { retry_after }) => {
                        Some(*retry_after)
                    }
                    _ => None,
                };
                tracing::warn!(
                    slot,
                    error = format!("{e:#}"),
                    failures,
                    "socket mode connection failed"
                );
                backoff(failures, retry_after)
            }
        };
        if !pause.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }
}

/// 0.5 s, 1 s, 2 s, … up to 30 s (at least Slack's `Retry-After`).
fn backoff(failures: u32, retry_after: Option<Duration>) -> Duration {
    let grown = Duration::from_millis((250u64 << failures.min(7)).min(30_000));
    retry_after.map_or(grown, |r| r.max(grown))
}

/// How a connection ended, and whether Slack had said hello on it.
struct End {
    why: &'static str,
    greeted: bool,
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
    shutdown: &CancellationToken,
) -> anyhow::Result<End> {
    let opened = web
        .call("apps.connections.open", mode.app_token.expose_secret(), &[])
        .await?;
    let url = opened
        .get("url")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow::anyhow!("apps.connections.open answered no url"))?;
    // The payloads are taken as Slack's because the connection is: only
    // over TLS, unless the Web API itself is plain HTTP (a local emulator).
    if !url.starts_with("wss://") && !mode.allow_plain {
        anyhow::bail!("apps.connections.open answered a URL without TLS; refused");
    }
    let limits = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    let (ws, _) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::connect_async_with_config(url, Some(limits), false),
    )
    .await
    .map_err(|_| anyhow::anyhow!("the WebSocket handshake timed out"))??;
    let (sink, mut stream) = ws.split();
    let sink: Sink = Arc::new(Mutex::new(sink));
    let limit = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    metrics::gauge!("threadline_socket_connections").increment(1.0);
    let _open = scopeguard(|| metrics::gauge!("threadline_socket_connections").decrement(1.0));
    let mut greeted = false;
    // (counted open from `hello` until this connection is given up)
    let mut counted = None;
    loop {
        let next = tokio::select! {
            n = tokio::time::timeout(IDLE, stream.next()) => n,
            // (envelopes being committed finish on their own tasks)
            () = shutdown.cancelled() => return Ok(End { why: "shutdown", greeted }),
        };
        let msg = match next {
            Err(_) => {
                return Ok(End {
                    why: "idle",
                    greeted,
                });
            }
            Ok(None) => {
                return Ok(End {
                    why: "closed",
                    greeted,
                });
            }
            Ok(Some(m)) => m?,
        };
        let text = match msg {
            Message::Text(t) => t.to_string(),
            Message::Close(_) => {
                return Ok(End {
                    why: "closed",
                    greeted,
                });
            }
            // (tungstenite answers pings itself)
            _ => continue,
        };
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            tracing::warn!(slot, "socket mode message is not JSON; ignored");
            continue;
        };
        match v.get("type").and_then(Value::as_str).unwrap_or("") {
            "hello" => {
                greeted = true;
                if counted.is_none() {
                    let open = mode.open.clone();
                    open.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    counted = Some(scopeguard(move || {
                        open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    }));
                }
                tracing::info!(slot, "socket mode connection ready");
            }
            "disconnect" => {
                // Slack asks for a fresh connection (refresh, warning, or
                // the app's Socket Mode switched off): the slot opens one at
                // once, while what this connection still sends is read and
                // committed by a task of its own until it closes.
                let reason = v.get("reason").and_then(|r| r.as_str()).unwrap_or("");
                tracing::info!(slot, reason, "socket mode disconnect");
                let why = if reason == "link_disabled" {
                    "link_disabled"
                } else {
                    "disconnect"
                };
                let (app, sink, limit) = (app.clone(), sink.clone(), limit.clone());
                tokio::spawn(async move {
                    let deadline = tokio::time::Instant::now() + REPLACED;
                    loop {
                        match tokio::time::timeout_at(deadline, stream.next()).await {
                            Ok(Some(Ok(Message::Text(t)))) => {
                                if let Ok(v) = serde_json::from_str::<Value>(&t) {
                                    dispatch(&app, &sink, &limit, v).await;
                                }
                            }
                            Ok(Some(Ok(Message::Close(_))))
                            | Ok(Some(Err(_)))
                            | Ok(None)
                            | Err(_) => break,
                            Ok(Some(Ok(_))) => {}
                        }
                    }
                    // (envelopes still being committed ack on their own)
                    let _ = tokio::time::timeout(Duration::from_secs(5), async {
                        sink.lock().await.send(Message::Close(None)).await
                    })
                    .await;
                });
                return Ok(End { why, greeted });
            }
            _ => dispatch(app, &sink, &limit, v).await,
        }
    }
}

/// Commits an envelope on a task of its own (at most [`IN_FLIGHT`] at once:
/// waits for a free place first, so that a burst stops the reading).
async fn dispatch(app: &AppState, sink: &Sink, limit: &Arc<tokio::sync::Semaphore>, v: Value) {
    let kind = match v.get("type").and_then(Value::as_str) {
        Some(k @ ("events_api" | "interactive" | "slash_commands")) => k.to_owned(),
        _ => return,
    };
    let Some(envelope_id) = v
        .get("envelope_id")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return;
    };
    let Ok(permit) = limit.clone().acquire_owned().await else {
        return;
    };
    let (app, sink) = (app.clone(), sink.clone());
    tokio::spawn(async move {
        let _permit = permit;
        if let Err(e) = envelope(&app, &sink, &envelope_id, &kind, &v).await {
            tracing::warn!(
                error = format!("{e:#}"),
                "socket mode envelope not acknowledged"
            );
        }
    });
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
    // Acknowledged once what it brought is committed: accepted, a
    // duplicate, or recorded as refused (a malformed body: sending it again
    // would change nothing). Not when nothing could be recorded (5xx).
    let acked = !status.is_server_error();
    metrics::counter!("threadline_socket_envelopes_total", "type" => kind.to_owned(), "acked" => if acked { "true" } else { "false" })
        .increment(1);
    if !acked {
        anyhow::bail!("not committed ({status}); left for Slack to send again");
    }
    let ack = json!({"envelope_id": envelope_id}).to_string();
    tokio::time::timeout(Duration::from_secs(10), async {
        sink.lock().await.send(Message::Text(ack.into())).await
    })
    .await
    .map_err(|_| anyhow::anyhow!("the acknowledgement could not be sent in time"))??;
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
