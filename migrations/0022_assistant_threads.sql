-- The assistant pane: a person's thread with the app in their DM (its
-- channel is a `D…` DM, so the DM policy governs it). Recorded from
-- `assistant_thread_started` and kept current by
-- `assistant_thread_context_changed`: the channel the person is looking at
-- (identifiers only), and whether the channel policy would answer there
-- (a context channel it would not answer in is never read).
CREATE TABLE assistant_threads (
    installation_id      uuid NOT NULL,
    channel_id           text NOT NULL,
    thread_ts            text NOT NULL,
    user_id              text NOT NULL,
    context_channel_id   text,
    context_team_id      text,
    context_readable     boolean NOT NULL DEFAULT false,
    -- The suggested prompts and title were shown (by the publisher).
    greeted              boolean NOT NULL DEFAULT false,
    started_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (installation_id, channel_id, thread_ts)
);
