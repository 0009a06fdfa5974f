//! Socket Mode's state in the world: tickets, connections, envelopes
//! waiting for their acks, and the log ([`crate::socket`] drives it).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

/// What a connection's task is told to do.
#[derive(Debug)]
pub enum Outbound {
    /// Send this text frame.
    Text(String),
    /// Send this text frame, then drop the connection at once (no close
    /// frame, no ack read).
    TextThenDrop(String),
    /// Close the connection.
    Close,
    /// Send a ping frame (as a server keeping a connection alive does).
    Ping,
}

/// How the wait for an envelope's ack ended.
#[derive(Debug)]
pub(crate) enum AckOutcome {
    Acked {
        connection: u64,
    },
    /// Every connection the envelope went over closed before an ack.
    Closed,
}

/// An envelope waiting for its ack.
#[derive(Debug)]
pub(crate) struct Pending {
    /// The connections it went over and that are still open.
    pub(crate) connections: Vec<u64>,
    pub(crate) tx: oneshot::Sender<AckOutcome>,
}

/// An open connection.
#[derive(Debug)]
pub struct Connection {
    pub app_id: String,
    pub opened_at_micros: u64,
    pub(crate) tx: mpsc::UnboundedSender<Outbound>,
}

/// Socket Mode's state in the world.
#[derive(Debug, Default)]
pub struct SocketState {
    /// Ticket → (app, expiry in micros): the URLs `apps.connections.open`
    /// answered and nobody connected to yet.
    pub(crate) tickets: HashMap<String, (String, u64)>,
    pub connections: BTreeMap<u64, Connection>,
    pub(crate) next_connection: u64,
    /// Turns over the app's connections for first attempts.
    pub(crate) turn: usize,
    pub(crate) pending: HashMap<String, Pending>,
    pub log: Vec<SocketRecord>,
}

/// One thing that happened on a Socket Mode connection: opened, closed, a
/// message sent (slack-sim → app) or received (app → slack-sim).
#[derive(Debug, Clone, Serialize)]
pub struct SocketRecord {
    /// 1, 2, … in order.
    pub seq: u64,
    pub app_id: String,
    pub connection: u64,
    /// `opened`, `closed`, `sent` or `received`.
    pub direction: &'static str,
    /// Sent: `hello`, `events_api`, `interactive`, `disconnect`. Received:
    /// `ack` (a message with an `envelope_id`), else the message's `type`
    /// (`unknown` when it has none). Closed: why (`app`, `dropped`,
    /// `server`, `upgrade_failed`).
    pub kind: String,
    pub envelope_id: Option<String>,
    /// The event an `events_api` envelope carries.
    pub event_id: Option<String>,
    pub retry_attempt: Option<u32>,
    /// `retry_reason` of an envelope, `reason` of a `disconnect`.
    pub reason: Option<String>,
    /// For an ack: whether an envelope was waiting for it (false: it came
    /// after the deadline, or names no envelope sent).
    pub matched: Option<bool>,
    /// For an ack: whether it carried a `payload`.
    pub has_payload: Option<bool>,
    pub at_micros: u64,
}
