-- Thread store of the context-builder (DESIGN §2, §5), trigger policy, and
-- the record of built contexts. Message text lives only in thread_messages
-- (and is blanked when a message is deleted).

-- Per-installation trigger policy; channels default to mentions only.
CREATE TABLE installation_policies (
    installation_id uuid PRIMARY KEY,
    dms_allowed     boolean NOT NULL DEFAULT false,
    -- bot_ids whose messages are context (never triggers)
    approved_bots   text[] NOT NULL DEFAULT '{}',
    -- Slack read limits this app is under: Tier 3, or the 1-per-minute /
    -- 15-message conversations.replies limit of non-Marketplace apps
    read_limits     text NOT NULL DEFAULT 'tier3' CHECK (read_limits IN ('tier3', 'non_marketplace')),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE channel_policies (
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    mode            text NOT NULL DEFAULT 'mentions' CHECK (mode IN ('mentions', 'keywords', 'every_message')),
    keywords        text[] NOT NULL DEFAULT '{}',
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (installation_id, channel_id)
);

-- A thread: (installation, channel, root ts). `version` counts the distinct
-- content facts applied to it, so it is monotonic and the same whatever the
-- order or number of deliveries.
CREATE TABLE threads (
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    root_ts         text NOT NULL,
    version         bigint NOT NULL DEFAULT 0,
    backfill_state  text NOT NULL DEFAULT 'none' CHECK (backfill_state IN ('none', 'complete', 'partial')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (installation_id, channel_id, root_ts)
);

-- One Slack message as it is now: (installation, channel, ts).
CREATE TABLE thread_messages (
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    ts              text NOT NULL,
    root_ts         text NOT NULL,
    speaker         text NOT NULL CHECK (speaker IN ('user', 'assistant', 'bot')),
    user_id         text,
    bot_id          text,
    text            text NOT NULL,
    text_hash       text NOT NULL,
    edited_ts       numeric,
    deleted         boolean NOT NULL DEFAULT false,
    PRIMARY KEY (installation_id, channel_id, ts)
);
CREATE INDEX thread_messages_by_thread ON thread_messages (installation_id, channel_id, root_ts);

-- Every content fact applied: create, edit (keyed by edited ts), delete.
CREATE TABLE message_facts (
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    ts              text NOT NULL,
    fact            text NOT NULL CHECK (fact IN ('create', 'edit', 'delete')),
    fact_key        text NOT NULL DEFAULT '',
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (installation_id, channel_id, ts, fact, fact_key)
);

-- One turn per human message: app_mention and message.* for the same
-- message collapse here, and exactly one receipt triggers.
CREATE TABLE turns (
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    ts              text NOT NULL,
    receipt_id      uuid NOT NULL,
    source          text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- set by the publisher when a reply for this turn was sent
    answered_at     timestamptz,
    -- an edit of the source arrived after the answer: recorded, never re-answered
    source_changed_after_answer_at timestamptz,
    PRIMARY KEY (installation_id, channel_id, ts)
);

-- What each triggering receipt's context was built from (no text).
CREATE TABLE contexts (
    receipt_id       uuid PRIMARY KEY,
    installation_id  uuid NOT NULL,
    channel_id       text NOT NULL,
    root_ts          text NOT NULL,
    source_ts        text NOT NULL,
    thread_version   bigint NOT NULL,
    content_hash     text NOT NULL,
    message_count    integer NOT NULL,
    truncated        boolean NOT NULL,
    backfill_partial boolean NOT NULL,
    captured_at      timestamptz NOT NULL DEFAULT now()
);

-- Shared Slack read budgets (per installation and method), so that every
-- replica respects Slack's limits together.
CREATE TABLE slack_read_budgets (
    installation_id uuid NOT NULL,
    method          text NOT NULL,
    window_start    timestamptz NOT NULL DEFAULT now(),
    calls           integer NOT NULL DEFAULT 0,
    paused_until    timestamptz,
    PRIMARY KEY (installation_id, method)
);
