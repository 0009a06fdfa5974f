//! The bus's work topics: names, as stored in the outbox, and the durable
//! consumer that works each. The streams and subjects they live in are the
//! runtime's (`threadline_runtime::bus::Topology`).

/// A work topic on the bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Topic {
    /// `EventAccepted`, gateway outbox relay → context-builder.
    Events,
    /// `ContextReady`, context-builder → inference.
    Contexts,
    /// `ProposalReady`, inference → publisher.
    Proposals,
    /// `Reconsider`, publisher → context-builder.
    Reconsider,
    /// `SpooledDelivery`, gateway → the spool drainer (beside the relay):
    /// deliveries acknowledged to Slack while Postgres could not take them.
    Spool,
}

impl Topic {
    pub const ALL: [Topic; 5] = [
        Topic::Events,
        Topic::Contexts,
        Topic::Proposals,
        Topic::Reconsider,
        Topic::Spool,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Topic::Events => "events",
            Topic::Contexts => "contexts",
            Topic::Proposals => "proposals",
            Topic::Reconsider => "reconsider",
            Topic::Spool => "spool",
        }
    }

    pub fn parse(s: &str) -> Option<Topic> {
        Topic::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The durable pull consumer that works this topic.
    pub fn consumer(self) -> &'static str {
        match self {
            Topic::Events => "context-builder",
            Topic::Contexts => "inference",
            Topic::Proposals => "publisher",
            Topic::Reconsider => "context-builder-reconsider",
            Topic::Spool => "spool-drainer",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_topic_parses_from_its_name_and_nothing_else_does() {
        for topic in Topic::ALL {
            assert_eq!(Topic::parse(topic.as_str()), Some(topic));
        }
        assert_eq!(Topic::parse("nope"), None);
    }
}
