//! Shared runtime of the threadline services: configuration, telemetry,
//! database pool and migrator, JetStream topology and publishing, token
//! encryption, health routes and shutdown.

pub mod audit;
pub mod batch;
pub mod batch_error;
pub mod bus;
pub mod bus_refusal;
pub mod config;
pub mod db;
pub mod dead_letter;
pub mod health;
pub mod installations;
/// Kill switch features (pure; they live in `domain`).
pub use threadline_domain::kill_switch as killswitch;
pub mod nats_auth;
pub mod nats_role;
pub mod outbox;
pub mod redact;
pub mod secrets;
pub mod service;
pub mod settings;
pub mod shutdown;
pub mod telemetry;
pub mod tokens;
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
