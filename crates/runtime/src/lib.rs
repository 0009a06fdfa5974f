//! Shared runtime of the threadline services, infrastructure only:
//! configuration, telemetry, the database pool and schema check, the
//! JetStream topology and worker loop, health routes and shutdown. It knows
//! no table and no Slack: installations, tokens, sealing and dead letters
//! are `threadline_tenancy`'s, statements `threadline_store`'s (a test in
//! `tests/tests/shape.rs` keeps it so).

pub mod audit;
pub mod batch;
pub mod batch_error;
pub mod bus;
pub mod bus_refusal;
pub mod config;
pub mod db;
pub mod health;
/// Kill switch features (pure; they live in `domain`).
pub use threadline_domain::kill_switch as killswitch;
pub mod nats_auth;
pub mod nats_role;
pub mod outbox;
pub mod redact;
pub mod sampled;
pub mod service;
pub mod settings;
pub mod shutdown;
pub mod telemetry;
pub mod transient;
pub mod worker;

/// Ends a binary: a clean exit, or one line naming what failed (with its
/// causes) and exit code 1. No backtrace: the message is for an operator.
pub fn exit_with(program: &str, result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
