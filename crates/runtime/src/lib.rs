//! Shared runtime of the threadline services: configuration, telemetry,
//! database pool and migrator, JetStream topology and publishing, token
//! encryption, health routes and shutdown.

pub mod bus;
pub mod config;
pub mod db;
pub mod health;
pub mod secrets;
pub mod shutdown;
pub mod telemetry;
