//! The gateway's HTTP/1.1 listener: a cap on open connections, a timeout
//! for a request's head and one for a kept-alive connection with nothing
//! under way, so that sockets which never finish a request cannot take the
//! descriptors or memory signed deliveries need.
//!
//! Each connection is in one of three phases: waiting for a request head
//! (from accept, or from the first byte of a later request), in a request
//! (from the head until the answer; the request timeout of the router
//! bounds it), or idle between requests. A head that takes longer than the
//! header timeout, or an idle spell longer than the idle timeout, closes
//! the connection. At the cap, a new connection takes the place of the one
//! waiting longest outside a request; connections in a request are never
//! cut. HTTP/2 is not served: Slack and the ingress speak HTTP/1.1.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use crate::config::ConnectionLimits;
use threadline_runtime::shutdown::CancellationToken;

/// Largest read buffer of one connection (hyper's default is ~400 KiB). It
/// bounds a request head and each chunk of a body in memory per connection.
const MAX_BUF: usize = 64 * 1024;

/// Descriptors kept free for everything but client connections (database
/// pool aside): NATS, the runtime, logs, telemetry, the Slack client.
const RESERVED_DESCRIPTORS: usize = 64;

/// Connections the kernel completes and queues for `accept` while the
/// gateway is busy (Slack's retries and an ingress's bursts arrive
/// together). `TcpListener::bind` asks for 128: a burst beyond the queue
/// has its handshake dropped and comes back only with the retransmits,
/// seconds later. The kernel lowers it to `net.core.somaxconn`.
pub const LISTEN_BACKLOG: u32 = 1024;

/// The gateway's listening socket, with [`LISTEN_BACKLOG`].
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As std's bind does: a restarted gateway binds while its old
    // connections linger in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The cap actually used: `limits.max_connections`, lowered when the
/// process's open-files limit leaves less room beside the database pool.
pub fn effective_cap(limits: &ConnectionLimits, db_connections: u32) -> usize {
    let Some(nofile) = open_files_limit() else {
        return limits.max_connections;
    };
    let reserved = RESERVED_DESCRIPTORS + db_connections as usize;
    let room = nofile.saturating_sub(reserved).max(16);
    if room < limits.max_connections {
        tracing::warn!(
            configured = limits.max_connections,
            used = room,
            open_files_limit = nofile,
            "THREADLINE_GATEWAY_MAX_CONNECTIONS lowered to fit the open-files limit"
        );
        room
    } else {
        limits.max_connections
    }
}

/// The soft open-files limit of this process, when the system says.
fn open_files_limit() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request head to be complete.
    Head,
    /// A request is being read, handled or answered.
    Busy,
    /// Kept alive, nothing under way.
    Idle,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    HeaderTimeout,
    IdleTimeout,
    Evicted,
}

impl Closed {
    fn label(self) -> &'static str {
        match self {
            Closed::HeaderTimeout => "header_timeout",
            Closed::IdleTimeout => "idle_timeout",
            Closed::Evicted => "evicted",
        }
    }
}

#[derive(Debug)]
struct State {
    phase: Phase,
    since: Instant,
    /// Chosen to make room at the cap.
    evicted: bool,
}

/// One connection as the listener sees it.
#[derive(Debug)]
struct Conn {
    state: Mutex<State>,
    /// Wakes the connection's task when its deadline may have moved or it
    /// was evicted.
    changed: Notify,
}

impl Conn {
    fn new() -> Self {
        Self {
            state: Mutex::new(State {
                phase: Phase::Head,
                since: Instant::now(),
                evicted: false,
            }),
            changed: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes arrived: an idle connection starts its next request's head.
    fn on_bytes(&self) {
        let mut s = self.state();
        if s.phase == Phase::Idle {
            s.phase = Phase::Head;
            s.since = Instant::now();
            drop(s);
            self.changed.notify_one();
        }
    }

    fn begin_request(&self) {
        let mut s = self.state();
        s.phase = Phase::Busy;
        s.since = Instant::now();
    }

    fn end_request(&self) {
        let mut s = self.state();
        s.phase = Phase::Idle;
        s.since = Instant::now();
        drop(s);
        self.changed.notify_one();
    }

    /// When the connection is closed unless something happens first, and why.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<(Instant, Closed)> {
        let s = self.state();
        match s.phase {
            Phase::Head => Some((s.since + limits.header_timeout, Closed::HeaderTimeout)),
            Phase::Idle => Some((s.since + limits.idle_timeout, Closed::IdleTimeout)),
            Phase::Busy => None,
        }
    }

    /// Marks the connection for closing if it is not in a request.
    fn evict(&self) -> bool {
        let mut s = self.state();
        if s.phase == Phase::Busy || s.evicted {
            return false;
        }
        s.evicted = true;
        drop(s);
        self.changed.notify_one();
        true
    }

    /// Whether an eviction is due: `Some(true)` to close now, `Some(false)`
    /// to close after the request that began meanwhile.
    fn eviction(&self) -> Option<bool> {
        let s = self.state();
        s.evicted.then_some(s.phase != Phase::Busy)
    }
}

/// Every open connection, to choose one to evict.
#[derive(Debug, Default)]
struct Registry {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Registry {
    fn open(&self) -> MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(self: &Arc<Self>) -> Entry {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new());
        let n = {
            let mut open = self.open();
            open.insert(id, conn.clone());
            open.len()
        };
        metrics::gauge!("threadline_gateway_connections").set(n as f64);
        Entry {
            id,
            conn,
            registry: self.clone(),
        }
    }

    /// Evicts the connection that has waited longest outside a request;
    /// false when every connection is in one.
    fn evict_one(&self) -> bool {
        let open = self.open();
        let mut candidates: Vec<(Instant, &Arc<Conn>)> = open
            .values()
            .filter_map(|c| {
                let s = c.state();
                (s.phase != Phase::Busy && !s.evicted).then_some((s.since, c))
            })
            .collect();
        candidates.sort_by_key(|(since, _)| *since);
        candidates.into_iter().any(|(_, c)| c.evict())
    }
}

/// A registered connection; leaving the registry when dropped.
struct Entry {
    id: u64,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        let n = {
            let mut open = self.registry.open();
            open.remove(&self.id);
            open.len()
        };
        metrics::gauge!("threadline_gateway_connections").set(n as f64);
    }
}

/// The socket, telling its connection when bytes arrive.
struct Tracked {
    tcp: TcpStream,
    conn: Arc<Conn>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.on_bytes();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// Marks a request done when its answer is ready (or it was dropped).
struct InRequest(Arc<Conn>);

impl Drop for InRequest {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

/// Serves `app` on `listener` until `shutdown`, then lets requests under
/// way finish (idle connections close at once, one still sending its head
/// gets at most a second) and returns.
/// Requests carry the peer address as `ConnectInfo<SocketAddr>`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    cap: usize,
    shutdown: CancellationToken,
) {
    let registry = Arc::new(Registry::default());
    let slots = Arc::new(Semaphore::new(cap));
    let tasks = TaskTracker::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        // A backstop: hyper's head timer runs from the end of the previous
        // answer, so it covers the idle spell and the head together.
        .header_read_timeout(limits.idle_timeout + limits.header_timeout)
        .max_buf_size(MAX_BUF);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            () = shutdown.cancelled() => break,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of descriptors or memory: free an idle socket, pause.
                let freed = registry.evict_one();
                metrics::counter!("threadline_gateway_accept_errors_total").increment(1);
                tracing::warn!(error = %e, freed, "accepting a connection failed");
                let pause = if freed { 10 } else { 250 };
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(pause)) => {}
                    () = shutdown.cancelled() => break,
                }
                continue;
            }
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                metrics::counter!("threadline_gateway_connections_at_cap_total").increment(1);
                if let Some(unlogged) =
                    threadline_runtime::sampled::refusals().admit("connections_at_cap")
                {
                    tracing::warn!(
                        unlogged_since_last = unlogged,
                        "connections at their cap; the idlest is closed for a new one (one line a minute; the metrics count each)"
                    );
                }
                registry.evict_one();
                tokio::select! {
                    slot = slots.clone().acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => break,
                    },
                    () = shutdown.cancelled() => break,
                }
            }
        };
        // Small request/response pairs: disable Nagle, or answers wait on
        // delayed ACKs.
        let _ = tcp.set_nodelay(true);
        let entry = registry.insert();
        let (http, app, shutdown) = (http.clone(), app.clone(), shutdown.clone());
        tasks.spawn(async move {
            connection(tcp, peer, &entry, http, app, limits, shutdown).await;
            drop(entry);
            drop(slot);
        });
    }
    drop(listener);
    tasks.close();
    tasks.wait().await;
}

/// Errors about one connection that the next accept does not share.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    entry: &Entry,
    http: hyper::server::conn::http1::Builder,
    app: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let conn = entry.conn.clone();
    let io = TokioIo::new(Tracked {
        tcp,
        conn: conn.clone(),
    });
    let in_service = conn.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        in_service.begin_request();
        let done = InRequest(in_service.clone());
        req.extensions_mut().insert(ConnectInfo(peer));
        let app = app.clone();
        async move {
            let response = app.oneshot(req).await;
            drop(done);
            response.map_err(|e: Infallible| match e {})
        }
    });
    let mut served = pin!(http.serve_connection(io, service));
    let mut draining = false;
    // Once draining: how long a connection outside a request may still take
    // to finish its head or stay idle (hyper closes idle ones at once).
    let mut drain_at: Option<Instant> = None;
    let due = |conn: &Conn, drain_at: Option<Instant>| {
        conn.deadline(&limits).map(|(at, why)| match drain_at {
            Some(d) if d < at => (d, why),
            _ => (at, why),
        })
    };
    loop {
        let deadline = due(&conn, drain_at);
        let expiry = async {
            match deadline {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = served.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = expiry => {
                // Still the same deadline (nothing moved it meanwhile)?
                if let Some((at, why)) = due(&conn, drain_at)
                    && at <= Instant::now()
                {
                    closed(why);
                    return;
                }
            }
            () = conn.changed.notified() => match conn.eviction() {
                Some(true) => {
                    closed(Closed::Evicted);
                    return;
                }
                Some(false) if !draining => {
                    draining = true;
                    served.as_mut().graceful_shutdown();
                }
                _ => {}
            },
            () = shutdown.cancelled(), if !draining => {
                // Let hyper close it: an idle connection at once, one whose
                // answer is still being written once it is out (the
                // request guard is gone before the answer is written, so
                // "not busy" is no proof that nothing is in flight).
                draining = true;
                drain_at = Some(Instant::now() + limits.header_timeout.min(Duration::from_secs(1)));
                served.as_mut().graceful_shutdown();
            }
        }
    }
}

fn closed(why: Closed) {
    metrics::counter!("threadline_gateway_connections_closed_total", "reason" => why.label())
        .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(75),
            max_connections: 1024,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn phases_move_the_deadline_and_busy_connections_are_never_evicted() {
        let c = Conn::new();
        let (at, why) = c.deadline(&limits()).expect("waiting for a head");
        assert_eq!(why, Closed::HeaderTimeout);
        assert_eq!(at, c.state().since + Duration::from_secs(5));
        c.begin_request();
        assert!(c.deadline(&limits()).is_none());
        assert!(!c.evict(), "a connection in a request is not evicted");
        c.end_request();
        assert_eq!(
            c.deadline(&limits()).map(|(_, w)| w),
            Some(Closed::IdleTimeout)
        );
        tokio::time::advance(Duration::from_secs(30)).await;
        c.on_bytes();
        let (at, why) = c.deadline(&limits()).expect("a new head");
        assert_eq!(why, Closed::HeaderTimeout);
        assert_eq!(at, Instant::now() + Duration::from_secs(5));
        assert!(c.evict());
        assert_eq!(c.eviction(), Some(true));
        assert!(!c.evict(), "once");
    }

    #[tokio::test(start_paused = true)]
    async fn the_connection_waiting_longest_is_evicted_first() {
        let r = Arc::new(Registry::default());
        let old = r.insert();
        tokio::time::advance(Duration::from_secs(1)).await;
        let busy = r.insert();
        busy.conn.begin_request();
        let young = r.insert();
        assert!(r.evict_one());
        assert_eq!(old.conn.eviction(), Some(true));
        assert_eq!(young.conn.eviction(), None);
        assert!(r.evict_one());
        assert_eq!(young.conn.eviction(), Some(true));
        assert!(!r.evict_one(), "only a busy connection is left");
        assert_eq!(busy.conn.eviction(), None);
    }

    #[test]
    fn the_open_files_limit_is_read_from_proc() {
        // Linux only; elsewhere there is nothing to read.
        if std::path::Path::new("/proc/self/limits").exists() {
            assert!(open_files_limit().is_some_and(|n| n > 0));
        }
    }
}
