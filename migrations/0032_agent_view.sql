-- Slack's agent messaging experience (`features.agent_view`): a person's
-- DM with the app is its Messages tab. Recorded from `app_home_opened`
-- (tab `messages`) and kept current by `app_context_changed` (and the
-- context those events carry): what the person is looking at, as
-- identifiers only — the most relevant channel-like entity (a channel, or
-- the channel of a message) and its workspace; whether the channel policy
-- would answer there is decided again by each question. Other entities
-- (canvases, lists) are counted and not kept. `greeted`: the suggested
-- prompts were set at the top of the tab (by the publisher). Each
-- top-level message in the DM is a thread of its own; its question's
-- thread is recorded in `assistant_threads`, so progress shows there as in
-- the assistant pane.
CREATE TABLE agent_views (
    installation_id      uuid NOT NULL,
    channel_id           text NOT NULL,
    user_id              text NOT NULL,
    context_channel_id   text,
    context_team_id      text,
    -- Slack's event_ts of the event that set the context: an older event
    -- (a retry, another replica's) never overwrites a newer one.
    context_ts           numeric,
    greeted              boolean NOT NULL DEFAULT false,
    opened_at            timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (installation_id, channel_id)
);

-- The context-builder records the tab and its context, and the question
-- threads that copy it (agent_view::*); the publisher reads it to greet
-- and marks it greeted; inference reads nothing of it (it reads the
-- question's thread in assistant_threads).
GRANT SELECT, INSERT ON agent_views TO threadline_context_builder;
-- (column by column: whether the tab was greeted is the publisher's)
GRANT UPDATE (context_channel_id, context_team_id, context_ts, updated_at) ON agent_views
    TO threadline_context_builder;
GRANT SELECT ON agent_views TO threadline_publisher;
GRANT UPDATE (greeted, updated_at) ON agent_views TO threadline_publisher;
