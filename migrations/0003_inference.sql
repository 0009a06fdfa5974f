-- Kill switches and model decisions (DESIGN §3.8, §4).

-- A switch is engaged for the whole service, one installation, or one
-- feature. Checked before every model call and again before posting.
CREATE TABLE kill_switches (
    scope      text NOT NULL CHECK (scope IN ('global', 'installation', 'feature')),
    target     text NOT NULL DEFAULT '',
    engaged    boolean NOT NULL,
    reason     text,
    changed_by text NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, target)
);

-- One decision per (event, thread version): the model output bound to the
-- context it read. `body_text` is the labelled reply waiting to be posted or
-- reviewed (the only place a proposal's text is kept).
CREATE TABLE decisions (
    id                uuid PRIMARY KEY,
    receipt_id        uuid NOT NULL,
    installation_id   uuid NOT NULL,
    event_id          text NOT NULL,
    channel_id        text NOT NULL,
    root_ts           text NOT NULL,
    source_ts         text NOT NULL,
    thread_version    bigint NOT NULL,
    status            text NOT NULL CHECK (status IN ('calling', 'proposed', 'review', 'suppressed', 'approved',
                                                      'rejected', 'published', 'stale', 'superseded', 'cancelled')),
    status_reason     text,
    action_kind       text NOT NULL DEFAULT 'thread_reply',
    review_reasons    text[] NOT NULL DEFAULT '{}',
    model_config_id   text,
    provider          text,
    fallback          boolean NOT NULL DEFAULT false,
    prompt_tokens     integer,
    completion_tokens integer,
    output_hash       text,
    body_text         text,
    body_blocks       jsonb,
    -- a worker holds the model call until this time; after it, another may take over
    lease_until       timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT decisions_binding UNIQUE (receipt_id, thread_version)
);
CREATE INDEX decisions_by_status ON decisions (status) WHERE status IN ('calling', 'review', 'proposed');
