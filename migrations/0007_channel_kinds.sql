-- DESIGN §8: private channels are denied until allowed. An app_mention has no
-- channel_type and Slack gives new private channels C… ids, so the kind of a
-- channel is learned from message events (which carry channel_type) or from
-- conversations.info, and remembered per installation.
CREATE TABLE channel_kinds (
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    is_private      boolean NOT NULL,
    learned_from    text NOT NULL CHECK (learned_from IN ('event', 'conversations.info')),
    checked_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (installation_id, channel_id)
);
