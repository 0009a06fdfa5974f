//! Pure types and rules of threadline. Nothing here performs I/O: every function
//! is deterministic given its inputs, so `cargo test -p threadline-domain` needs
//! nothing running.

pub mod agent_view;
pub mod assistant;
pub mod audit;
pub mod budget;
pub mod classify;
pub mod context;
pub mod double_text;
pub mod envelope;
pub mod event;
pub mod feedback;
pub mod ids;
pub mod kill_switch;
pub mod late;
pub mod output;
pub mod prompt;
pub mod reply;
pub mod review;
pub mod sources;
pub mod state;
pub mod thinking;
pub mod topic;

pub use envelope::{
    Authorization, DeliveryIdentity, Envelope, EnvelopeError, EventCallback, InstallationKey,
};
pub use event::{EventKind, EventRef, MessageSubtype};
pub use ids::{AppId, BotId, ChannelId, EnterpriseId, EventId, IdError, TeamId, Ts, UserId};
