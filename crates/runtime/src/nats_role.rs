//! The bus identities: one NATS user per role, and the work topics each
//! publishes and pulls ([`crate::nats_auth`] derives their rights from
//! these).

use std::fmt;

use threadline_domain::topic::Topic;

/// A bus identity: one NATS user per role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Gateway,
    Relay,
    ContextBuilder,
    Inference,
    Publisher,
    Operator,
}

impl Role {
    pub const ALL: [Role; 6] = [
        Role::Gateway,
        Role::Relay,
        Role::ContextBuilder,
        Role::Inference,
        Role::Publisher,
        Role::Operator,
    ];

    /// The NATS user name (`NATS_USER`).
    pub fn user(self) -> &'static str {
        match self {
            Role::Gateway => "gateway",
            Role::Relay => "relay",
            Role::ContextBuilder => "context-builder",
            Role::Inference => "inference",
            Role::Publisher => "publisher",
            Role::Operator => "operator",
        }
    }

    pub fn parse(user: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.user() == user)
    }

    /// The environment variable nats-server reads this user's password
    /// from (`NATS_PASSWORD_CONTEXT_BUILDER`, …).
    pub fn password_variable(self) -> String {
        format!(
            "NATS_PASSWORD_{}",
            self.user().replace('-', "_").to_ascii_uppercase()
        )
    }

    /// The prefix of this user's reply subjects: replies to its requests
    /// (PubAcks, JetStream API answers, pulled messages) arrive under it.
    pub fn inbox_prefix(self) -> String {
        format!("_INBOX.{}", self.user())
    }

    /// The work topics this role publishes.
    pub fn publishes(self) -> &'static [Topic] {
        match self {
            // Whatever the outbox carries: events (gateway intake),
            // reconsider (context-builder, publisher), proposals (review
            // approvals and operators' re-posts).
            // (and, taking deliveries itself, spools them)
            Role::Relay => &[
                Topic::Events,
                Topic::Reconsider,
                Topic::Proposals,
                Topic::Spool,
            ],
            Role::ContextBuilder => &[Topic::Contexts],
            Role::Inference => &[Topic::Proposals],
            // The sweeper re-publishes a decision's proposal.
            Role::Publisher => &[Topic::Proposals],
            // Deliveries Postgres could not take in time.
            Role::Gateway => &[Topic::Spool],
            Role::Operator => &[],
        }
    }

    /// The work topics this role pulls, each with the topic's durable
    /// consumer ([`Topic::consumer`]).
    pub fn consumes(self) -> &'static [Topic] {
        match self {
            Role::ContextBuilder => &[Topic::Events, Topic::Reconsider],
            Role::Inference => &[Topic::Contexts],
            Role::Publisher => &[Topic::Proposals],
            // The spool drainer runs beside the relay.
            Role::Relay => &[Topic::Spool],
            Role::Gateway | Role::Operator => &[],
        }
    }

    /// The work topics whose stream this role only looks at (its depth):
    /// the publisher posts nothing while acknowledged deliveries wait in
    /// the spool.
    pub fn watches(self) -> &'static [Topic] {
        match self {
            Role::Publisher => &[Topic::Spool],
            _ => &[],
        }
    }

    /// Whether this role creates and updates streams and consumers. The
    /// others only check, at start, that the parts they use exist: the
    /// right to change a stream is the right to re-route its subjects.
    pub fn declares(self) -> bool {
        matches!(self, Role::Relay | Role::Operator)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.user())
    }
}
