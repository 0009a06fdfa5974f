//! threadline's tenants, above the infrastructure of `threadline_runtime`:
//! an installation registered with its tokens sealed (`installations`), the
//! sealing itself (`secrets`), a bot token opened and refreshed for
//! outbound work (`tokens`), what a dead letter keeps of a message and how
//! it is replayed (`dead_letter`), and which failures of Slack and of a
//! token refresh are retried (`fault`, the classifier the worker's retry
//! rules take).

pub mod dead_letter;
pub mod fault;
pub mod installations;
pub mod secrets;
pub mod tokens;
