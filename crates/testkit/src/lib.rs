//! Development-only helpers shared by the test suites: a fresh database per
//! test, unique bus prefixes, signed Slack deliveries and fixture access.
//! Tests use the real Postgres and NATS named by `DATABASE_URL` / `NATS_URL`
//! (defaults: the local servers), never in-memory stand-ins.

pub mod db;
pub mod sim;
pub mod slack;

use std::path::PathBuf;
use std::time::Duration;

pub use db::TestDb;

/// NATS for tests: `NATS_URL` or the local default.
pub fn nats_url() -> String {
    std::env::var("NATS_URL")
        .unwrap_or_else(|_| threadline_runtime::config::DEFAULT_NATS_URL.to_owned())
}

/// A bus prefix no other test (or run) uses: `t` + 12 random hex digits.
pub fn unique_prefix() -> String {
    format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// The repository root (for fixtures and binaries).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A Slack fixture from `tests/fixtures/slack/<rel>`.
pub fn fixture(rel: &str) -> Vec<u8> {
    let path = repo_root().join("tests/fixtures/slack").join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// A compiled workspace binary next to the running test executable
/// (`target/<profile>/<name>`). `make test` builds them before the tests.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current test executable");
    // Tests run from target/<profile>/deps, binaries (the demo) from
    // target/<profile>.
    let parent = exe.parent().expect("the executable's directory");
    let dir = if parent.file_name().is_some_and(|n| n == "deps") {
        parent.parent().expect("target/<profile>")
    } else {
        parent
    };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (make test does)",
        path.display()
    );
    path
}

/// Polls `check` until it returns `Some`, or panics with `what` after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Number of messages currently in a JetStream stream (0 when it does not exist).
pub async fn stream_len(js: &async_nats::jetstream::Context, stream: &str) -> u64 {
    match js.get_stream(stream).await {
        Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Deletes every stream whose name starts with the prefix's stream prefix.
pub async fn delete_streams(js: &async_nats::jetstream::Context, prefix: &str) {
    use futures::StreamExt as _;
    let upper = format!("{}_", prefix.to_ascii_uppercase());
    let mut names = js.stream_names();
    let mut doomed = Vec::new();
    while let Some(Ok(name)) = names.next().await {
        if name.starts_with(&upper) {
            doomed.push(name);
        }
    }
    for name in doomed {
        let _ = js.delete_stream(&name).await;
    }
}

/// [`delete_streams`] from a `Drop` (no runtime to await in): on a thread
/// of its own with a runtime of its own.
pub fn delete_streams_blocking(js: &async_nats::jetstream::Context, prefix: &str) {
    let (js, prefix) = (js.clone(), prefix.to_owned());
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(delete_streams(&js, &prefix));
        }
    })
    .join();
}
