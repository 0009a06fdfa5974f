//! Socket Mode: an app opens WebSocket connections to Slack instead of
//! serving a request URL, and Slack sends it events and interactions over
//! them as envelopes. Shaped after Slack's Socket Mode reference and
//! python-slack-sdk's `socket_mode` clients:
//!
//! * `apps.connections.open` with the app-level token (`xapp-…`) answers a
//!   `ws://` URL whose ticket is single use and short-lived
//!   (`socket_ticket_ttl_ms`, 30 s by default);
//! * on connect the app gets `{"type": "hello", "num_connections": N, …}`;
//!   it may hold several connections at once (Slack: up to 10; an 11th is
//!   refused);
//! * an event goes over one of the app's connections as an `events_api`
//!   envelope carrying the same `event_callback` body as an HTTP delivery;
//!   the app acknowledges it with `{"envelope_id": …}` (optionally with a
//!   `payload`) within the delivery deadline, or it is retried on the HTTP
//!   schedule with `retry_attempt` and `retry_reason` set, over another
//!   connection when there is one. With no connection open the attempt
//!   fails (`no_connection`) and is retried the same way;
//! * a click goes as an `interactive` envelope, once (not retried);
//! * `disconnect` messages (`refresh_requested`, `warning`,
//!   `link_disabled`) come from the control API; `refresh_requested` and
//!   `link_disabled` close the connection a little later.
//!
//! Chosen where Slack documents nothing: the first attempt goes over the
//! app's connections in turn; a retry prefers a connection other than the
//! previous attempt's; `retry_reason` is `timeout` when no ack came (the
//! deadline passed, or the connection closed before an ack) and
//! `connection_failed` when the app had no connection open.

use std::time::Duration;

use axum::Json;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::Sim;
use crate::model::Envelope;
use crate::model::{DeliveryRecord, FaultMode, World, now_micros};
use crate::refusal::{Refusal, bad, not_found};

/// Connections an app may hold at once (Slack: 10).
pub const MAX_CONNECTIONS: usize = 10;

use crate::socket_state::{AckOutcome, Pending};
pub use crate::socket_state::{Connection, Outbound, SocketRecord, SocketState};

impl SocketState {
    fn log(&mut self, app_id: &str, connection: u64, direction: &'static str, kind: &str) -> usize {
        let seq = self.log.len() as u64 + 1;
        self.log.push(SocketRecord {
            seq,
            app_id: app_id.to_owned(),
            connection,
            direction,
            kind: kind.to_owned(),
            envelope_id: None,
            event_id: None,
            retry_attempt: None,
            reason: None,
            matched: None,
            has_payload: None,
            at_micros: now_micros(),
        });
        self.log.len() - 1
    }

    /// The app's open connections, oldest first.
    fn of_app(&self, app_id: &str) -> Vec<u64> {
        self.connections
            .iter()
            .filter(|(_, c)| c.app_id == app_id)
            .map(|(id, _)| *id)
            .collect()
    }
}

/// An envelope id shaped like Slack's (a UUID).
fn envelope_id(w: &mut World) -> String {
    let h = w.rng.hex(32);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..]
    )
}

/// A new single-use ticket for `app_id` and its URL on `host`.
pub fn open_ticket(w: &mut World, app_id: &str, host: &str) -> String {
    let now = now_micros();
    w.socket.tickets.retain(|_, (_, exp)| *exp > now);
    let ticket = w.rng.hex(40);
    let expires = now + w.settings.socket_ticket_ttl_ms * 1000;
    w.socket
        .tickets
        .insert(ticket.clone(), (app_id.to_owned(), expires));
    format!("ws://{host}/socket/{ticket}")
}

/// `GET /socket/{ticket}`: the WebSocket, for a ticket not used yet and
/// not expired (else 401 before the upgrade).
pub async fn connect(
    State(sim): State<Sim>,
    Path(ticket): Path<String>,
    ws: WebSocketUpgrade,
) -> Response {
    let opened = {
        let mut w = sim.lock();
        match w.socket.tickets.remove(&ticket) {
            Some((app, exp)) if exp > now_micros() => {
                if w.socket.of_app(&app).len() >= MAX_CONNECTIONS {
                    Err("too many connections")
                } else {
                    Ok(register(&mut w, &app))
                }
            }
            Some(_) => Err("expired ticket"),
            None => Err("invalid ticket"),
        }
    };
    match opened {
        Ok((id, app, rx, hello)) => {
            let (failed_sim, failed_app) = (sim.clone(), app.clone());
            ws.on_failed_upgrade(move |_| closed(&failed_sim, id, &failed_app, "upgrade_failed"))
                .on_upgrade(move |socket| run(sim, id, app, socket, rx, hello))
        }
        Err(why) => (StatusCode::UNAUTHORIZED, why).into_response(),
    }
}

type Registered = (u64, String, mpsc::UnboundedReceiver<Outbound>, String);

/// Adds a connection for `app` and builds its `hello`.
fn register(w: &mut World, app: &str) -> Registered {
    let (tx, rx) = mpsc::unbounded_channel();
    w.socket.next_connection += 1;
    let id = w.socket.next_connection;
    w.socket.connections.insert(
        id,
        Connection {
            app_id: app.to_owned(),
            opened_at_micros: now_micros(),
            tx,
        },
    );
    w.socket.log(app, id, "opened", "opened");
    let num = w.socket.of_app(app).len();
    let host = format!("applink-{}", w.rng.id("", 5).to_ascii_lowercase());
    let hello = json!({
        "type": "hello",
        "num_connections": num,
        "debug_info": {"host": host, "build_number": 1, "approximate_connection_time": 18060},
        "connection_info": {"app_id": app},
    });
    w.socket.log(app, id, "sent", "hello");
    (id, app.to_owned(), rx, hello.to_string())
}

/// A connection's life: `hello`, then what the emulator sends and what
/// the app answers, until either side closes.
async fn run(
    sim: Sim,
    id: u64,
    app: String,
    mut ws: WebSocket,
    mut rx: mpsc::UnboundedReceiver<Outbound>,
    hello: String,
) {
    let mut why = "app";
    if ws.send(Message::Text(hello.into())).await.is_ok() {
        loop {
            tokio::select! {
                out = rx.recv() => match out {
                    Some(Outbound::Text(t)) => {
                        if ws.send(Message::Text(t.into())).await.is_err() {
                            break;
                        }
                    }
                    Some(Outbound::TextThenDrop(t)) => {
                        let _ = ws.send(Message::Text(t.into())).await;
                        why = "dropped";
                        break;
                    }
                    Some(Outbound::Close) | None => {
                        let _ = ws.send(Message::Close(None)).await;
                        why = "server";
                        break;
                    }
                    Some(Outbound::Ping) => {
                        if ws.send(Message::Ping(Vec::new().into())).await.is_err() {
                            break;
                        }
                    }
                },
                msg = ws.recv() => match msg {
                    Some(Ok(Message::Text(t))) => received(&sim, id, &app, t.as_str()),
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => {}
                },
            }
        }
    }
    drop(ws);
    closed(&sim, id, &app, why);
}

/// A message from the app: an ack resolves its envelope's wait.
fn received(sim: &Sim, id: u64, app: &str, text: &str) {
    let msg: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let mut w = sim.lock();
    let Some(env_id) = msg["envelope_id"].as_str() else {
        let kind = msg["type"].as_str().unwrap_or("unknown").to_owned();
        w.socket.log(app, id, "received", &kind);
        return;
    };
    let waiting = w.socket.pending.remove(env_id);
    let i = w.socket.log(app, id, "received", "ack");
    let r = &mut w.socket.log[i];
    r.envelope_id = Some(env_id.to_owned());
    r.matched = Some(waiting.is_some());
    r.has_payload = Some(msg.get("payload").is_some_and(|p| !p.is_null()));
    if let Some(p) = waiting {
        let _ = p.tx.send(AckOutcome::Acked { connection: id });
    }
}

/// A connection is gone: envelopes that went only over it stop waiting.
fn closed(sim: &Sim, id: u64, app: &str, why: &str) {
    let mut w = sim.lock();
    if w.socket
        .connections
        .get(&id)
        .is_none_or(|c| c.app_id != app)
    {
        // (the world was reset meanwhile)
        return;
    }
    w.socket.connections.remove(&id);
    w.socket.log(app, id, "closed", why);
    let gone: Vec<String> = w
        .socket
        .pending
        .iter_mut()
        .filter_map(|(env, p)| {
            p.connections.retain(|c| *c != id);
            p.connections.is_empty().then(|| env.clone())
        })
        .collect();
    for env in gone {
        if let Some(p) = w.socket.pending.remove(&env) {
            let _ = p.tx.send(AckOutcome::Closed);
        }
    }
}

/// What one attempt to deliver an event over Socket Mode came to.
pub struct Attempt {
    /// Acknowledged (no more retries).
    pub done: bool,
    /// The `retry_reason` of the next attempt.
    pub next_reason: Option<&'static str>,
    /// The connection the envelope went over first (none: no connection).
    pub connection: Option<u64>,
}

/// Sends `env` as an `events_api` envelope over one of its app's
/// connections (two, for a `duplicate_envelope` fault) and waits for the
/// ack until the deadline; logs the attempt in the delivery log.
pub async fn deliver(
    sim: &Sim,
    env: &Envelope,
    attempt: u32,
    retry_reason: Option<&'static str>,
    previous: Option<u64>,
) -> Attempt {
    let sent_at = now_micros();
    let (rx, env_id, targets, deadline) = {
        let mut w = sim.lock();
        let deadline = Duration::from_millis(w.settings.delivery_deadline_ms);
        let mut open = w.socket.of_app(&env.app_id);
        if open.is_empty() {
            let r = record(env, attempt, retry_reason, sent_at, "no_connection");
            w.deliveries.push(r);
            return Attempt {
                done: false,
                next_reason: Some("connection_failed"),
                connection: None,
            };
        }
        // A retry goes over another connection when there is one.
        if open.len() > 1
            && let Some(p) = previous
        {
            open.retain(|c| *c != p);
        }
        let turn = w.socket.turn;
        w.socket.turn = turn.wrapping_add(1);
        let first = open[turn % open.len()];
        let fault = w.take_fault_if(
            "socket",
            Some(&env.app_id),
            env.channel.as_deref(),
            |w, f| f.mode != FaultMode::DuplicateEnvelope || w.socket.of_app(&env.app_id).len() > 1,
        );
        let mode = fault.map(|f| f.mode);
        let mut targets = vec![first];
        if mode == Some(FaultMode::DuplicateEnvelope)
            && let Some(other) = w
                .socket
                .of_app(&env.app_id)
                .into_iter()
                .find(|c| *c != first)
        {
            targets.push(other);
        }
        let env_id = envelope_id(&mut w);
        let text = json!({
            "envelope_id": env_id,
            "payload": env.body,
            "type": "events_api",
            "accepts_response_payload": false,
            "retry_attempt": attempt,
            "retry_reason": retry_reason.unwrap_or(""),
        })
        .to_string();
        let (tx, rx) = oneshot::channel();
        w.socket.pending.insert(
            env_id.clone(),
            Pending {
                connections: targets.clone(),
                tx,
            },
        );
        for c in &targets {
            let i = w.socket.log(&env.app_id, *c, "sent", "events_api");
            let r = &mut w.socket.log[i];
            r.envelope_id = Some(env_id.clone());
            r.event_id = Some(env.event_id.clone());
            r.retry_attempt = Some(attempt);
            r.reason = retry_reason.map(str::to_owned);
            let out = if mode == Some(FaultMode::DropMidEnvelope) {
                Outbound::TextThenDrop(text.clone())
            } else {
                Outbound::Text(text.clone())
            };
            if let Some(conn) = w.socket.connections.get(c) {
                let _ = conn.tx.send(out);
            }
        }
        (rx, env_id, targets, deadline)
    };
    let (result, acked_on) = match tokio::time::timeout(deadline, rx).await {
        Ok(Ok(AckOutcome::Acked { connection })) => ("acked", Some(connection)),
        Ok(Ok(AckOutcome::Closed)) | Ok(Err(_)) => ("connection_closed", None),
        Err(_) => ("ack_timeout", None),
    };
    let mut w = sim.lock();
    w.socket.pending.remove(&env_id);
    for c in &targets {
        w.deliveries.push(DeliveryRecord {
            envelope_id: Some(env_id.clone()),
            connection: Some(*c),
            ack_connection: acked_on,
            ..record(env, attempt, retry_reason, sent_at, result)
        });
    }
    Attempt {
        done: result == "acked",
        next_reason: (result != "acked").then_some("timeout"),
        connection: Some(targets[0]),
    }
}

/// A Socket Mode attempt's delivery log entry, without an envelope.
fn record(
    env: &Envelope,
    attempt: u32,
    retry_reason: Option<&str>,
    sent_at: u64,
    result: &str,
) -> DeliveryRecord {
    DeliveryRecord {
        event_id: env.event_id.clone(),
        app_id: env.app_id.clone(),
        event_type: env.event_type.clone(),
        url: "socket".to_owned(),
        attempt,
        retry_reason: retry_reason.map(str::to_owned),
        status: None,
        result: result.to_owned(),
        at_micros: now_micros(),
        sent_at_micros: sent_at,
        channel: env.channel.clone(),
        message_ts: env.message_ts.clone(),
        subtype: env.subtype.clone(),
        envelope_id: None,
        connection: None,
        ack_connection: None,
    }
}

/// Sends an interaction's payload as an `interactive` envelope over one
/// of the app's connections, once, and waits for the ack until the
/// deadline: `acked`, `ack_timeout`, `connection_closed` or
/// `no_connection`.
pub async fn interactive(sim: &Sim, app_id: &str, payload: Value) -> &'static str {
    let (rx, env_id, deadline) = {
        let mut w = sim.lock();
        let deadline = Duration::from_millis(w.settings.delivery_deadline_ms);
        let open = w.socket.of_app(app_id);
        if open.is_empty() {
            return "no_connection";
        }
        let turn = w.socket.turn;
        w.socket.turn = turn.wrapping_add(1);
        let c = open[turn % open.len()];
        let env_id = envelope_id(&mut w);
        let text = json!({
            "envelope_id": env_id,
            "payload": payload,
            "type": "interactive",
            "accepts_response_payload": false,
        })
        .to_string();
        let (tx, rx) = oneshot::channel();
        w.socket.pending.insert(
            env_id.clone(),
            Pending {
                connections: vec![c],
                tx,
            },
        );
        let i = w.socket.log(app_id, c, "sent", "interactive");
        w.socket.log[i].envelope_id = Some(env_id.clone());
        if let Some(conn) = w.socket.connections.get(&c) {
            let _ = conn.tx.send(Outbound::Text(text));
        }
        (rx, env_id, deadline)
    };
    let result = match tokio::time::timeout(deadline, rx).await {
        Ok(Ok(AckOutcome::Acked { .. })) => "acked",
        Ok(Ok(AckOutcome::Closed)) | Ok(Err(_)) => "connection_closed",
        Err(_) => "ack_timeout",
    };
    sim.lock().socket.pending.remove(&env_id);
    result
}

#[derive(Deserialize)]
pub struct SocketModeReq {
    enabled: bool,
}

/// `POST /_sim/apps/{app}/socket_mode`: events and interactions go over
/// the app's connections (on) or its request URLs (off).
pub async fn set_socket_mode(
    State(sim): State<Sim>,
    Path(app_id): Path<String>,
    Json(r): Json<SocketModeReq>,
) -> Result<Json<Value>, Refusal> {
    let mut w = sim.lock();
    let app = w
        .apps
        .get_mut(&app_id)
        .ok_or_else(|| not_found("app", &app_id))?;
    app.socket_mode = r.enabled;
    Ok(Json(json!({"ok": true, "socket_mode": r.enabled})))
}

#[derive(Deserialize)]
pub struct DisconnectReq {
    app_id: String,
    reason: String,
    /// One connection (default: every connection of the app).
    connection: Option<u64>,
    /// For `refresh_requested` and `link_disabled`: when the connection
    /// closes after the message (default 1000 ms).
    close_after_ms: Option<u64>,
}

/// `POST /_sim/socket/disconnect`: a `disconnect` message; for
/// `refresh_requested` and `link_disabled`, the connection closes
/// `close_after_ms` later.
pub async fn disconnect(
    State(sim): State<Sim>,
    Json(r): Json<DisconnectReq>,
) -> Result<Json<Value>, Refusal> {
    if !matches!(
        r.reason.as_str(),
        "refresh_requested" | "warning" | "link_disabled"
    ) {
        return Err(bad(
            "reason must be refresh_requested, warning or link_disabled",
        ));
    }
    let targets = {
        let mut w = sim.lock();
        if !w.apps.contains_key(&r.app_id) {
            return Err(not_found("app", &r.app_id));
        }
        let targets: Vec<u64> = w
            .socket
            .of_app(&r.app_id)
            .into_iter()
            .filter(|c| r.connection.is_none_or(|x| x == *c))
            .collect();
        if let Some(c) = r.connection
            && targets.is_empty()
        {
            return Err(not_found("connection", &c.to_string()));
        }
        for c in &targets {
            let host = format!("applink-{}", w.rng.id("", 5).to_ascii_lowercase());
            let text =
                json!({"type": "disconnect", "reason": r.reason, "debug_info": {"host": host}})
                    .to_string();
            let i = w.socket.log(&r.app_id, *c, "sent", "disconnect");
            w.socket.log[i].reason = Some(r.reason.clone());
            if let Some(conn) = w.socket.connections.get(c) {
                let _ = conn.tx.send(Outbound::Text(text));
            }
        }
        targets
    };
    if r.reason != "warning" {
        let wait = Duration::from_millis(r.close_after_ms.unwrap_or(1000));
        let sim = sim.clone();
        let closing = targets.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let w = sim.lock();
            for c in closing {
                if let Some(conn) = w.socket.connections.get(&c) {
                    let _ = conn.tx.send(Outbound::Close);
                }
            }
        });
    }
    Ok(Json(json!({"ok": true, "connections": targets})))
}

#[derive(Deserialize)]
pub struct SendReq {
    app_id: String,
    /// One connection (default: every connection of the app).
    connection: Option<u64>,
    /// A text frame of about this many bytes: an `events_api` envelope
    /// padded with a field of `x`s (an app must not hold a message of any
    /// size in memory).
    pad_bytes: Option<usize>,
    /// Ping frames, one every this many milliseconds…
    ping_every_ms: Option<u64>,
    /// …this many times (default 60).
    pings: Option<u32>,
}

/// `POST /_sim/socket/send`: odd traffic on an app's connections, to see
/// what the app does with it: an oversized frame, or pings that keep a
/// connection alive after its `disconnect`.
pub async fn send(State(sim): State<Sim>, Json(r): Json<SendReq>) -> Result<Json<Value>, Refusal> {
    let targets: Vec<u64> = {
        let w = sim.lock();
        if !w.apps.contains_key(&r.app_id) {
            return Err(not_found("app", &r.app_id));
        }
        w.socket
            .of_app(&r.app_id)
            .into_iter()
            .filter(|c| r.connection.is_none_or(|x| x == *c))
            .collect()
    };
    if let Some(c) = r.connection
        && targets.is_empty()
    {
        return Err(not_found("connection", &c.to_string()));
    }
    let to = |sim: &Sim, out: Outbound| {
        let w = sim.lock();
        for c in &targets {
            if let Some(conn) = w.socket.connections.get(c) {
                let _ = conn.tx.send(match &out {
                    Outbound::Text(t) => Outbound::Text(t.clone()),
                    _ => Outbound::Ping,
                });
            }
        }
    };
    if let Some(n) = r.pad_bytes {
        if n > 64 << 20 {
            return Err(bad("pad_bytes is at most 64 MiB"));
        }
        let text = json!({"type": "events_api", "envelope_id": "sim-padded",
            "payload": {"pad": "x".repeat(n)}})
        .to_string();
        to(&sim, Outbound::Text(text));
    }
    if let Some(every) = r.ping_every_ms {
        let (sim, count) = (sim.clone(), r.pings.unwrap_or(60));
        let targets = targets.clone();
        tokio::spawn(async move {
            for _ in 0..count {
                tokio::time::sleep(Duration::from_millis(every.max(10))).await;
                let w = sim.lock();
                for c in &targets {
                    if let Some(conn) = w.socket.connections.get(c) {
                        let _ = conn.tx.send(Outbound::Ping);
                    }
                }
            }
        });
    }
    Ok(Json(json!({"ok": true, "connections": targets})))
}

#[derive(Deserialize)]
pub struct SocketQuery {
    app_id: Option<String>,
    envelope_id: Option<String>,
}

/// `GET /_sim/socket`: the open connections and everything that happened
/// on every connection, in order.
pub async fn log(State(sim): State<Sim>, Query(q): Query<SocketQuery>) -> Json<Value> {
    let w = sim.lock();
    let connections: Vec<Value> = w
        .socket
        .connections
        .iter()
        .filter(|(_, c)| q.app_id.as_deref().is_none_or(|a| a == c.app_id))
        .map(
            |(id, c)| json!({"id": id, "app_id": c.app_id, "opened_at_micros": c.opened_at_micros}),
        )
        .collect();
    let log: Vec<&SocketRecord> = w
        .socket
        .log
        .iter()
        .filter(|r| {
            q.app_id.as_deref().is_none_or(|a| a == r.app_id)
                && q.envelope_id
                    .as_deref()
                    .is_none_or(|e| Some(e) == r.envelope_id.as_deref())
        })
        .collect();
    Json(json!({"connections": connections, "log": log}))
}
