//! Statements that only the tests, the demo, the soak and the benches run
//! (feature `testing`, never enabled by a service): fixtures that put a
//! table into the state a scenario needs, bypassing the service that would
//! normally get it there, and reads that check what a service left behind.
//! They live here, one module per table family as in the crate's root, so
//! that every statement in the repository is checked against the schema at
//! build time and a schema change breaks the build, not a test at run time.
//!
//! Production code must not call these: a fixture skips the state machines'
//! transitions on purpose (a test sets a row to the state it needs).

pub mod agent_view;
pub mod assistant;
pub mod audit;
pub mod budgets;
pub mod channels;
pub mod decisions;
pub mod feedback;
pub mod installations;
pub mod intents;
pub mod kill_switches;
pub mod oauth_states;
pub mod outbox;
pub mod receipts;
pub mod rejections;
pub mod roles;
pub mod server;
pub mod threads;
