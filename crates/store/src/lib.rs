//! threadline's tables, one module per table family, each with named row
//! types. Every statement is a `query!`/`query_as!` macro checked against
//! the schema at build time from the offline data in `.sqlx` (so a build
//! needs no database); `scripts/sqlx-prepare.sh` regenerates that data from
//! `migrations/`, and `make lint` fails when it no longer matches them.
//!
//! The crate depends on `domain` and the bus contracts only: services, the
//! CLI and the tests go through it; it knows nothing of the bus, HTTP or
//! configuration. What the caller computes with keys it holds (an audit
//! pseudonym, a sealed token) comes in as a value.

pub mod decisions;
pub mod installations;
pub mod intents;
pub mod kill_switches;
pub mod ledger;
pub mod oauth_states;
pub mod operator;
pub mod outbox;
pub mod policies;
pub mod receipts;
pub mod rejections;
pub mod retention;
