-- Foundation: installations, event receipts, the outbox and rejections.
-- Content-free by design: these tables hold identifiers, states and timings;
-- the only message content is an outbox payload, cleared once published.

CREATE TABLE installations (
    id                    uuid PRIMARY KEY,
    app_id                text NOT NULL,
    enterprise_id         text,
    team_id               text,
    is_enterprise_install boolean NOT NULL DEFAULT false,
    bot_user_id           text NOT NULL,
    bot_id                text NOT NULL,
    -- nonce || ciphertext (XChaCha20-Poly1305), and the id of the sealing key
    bot_token_sealed      bytea,
    bot_token_key_id      text,
    scopes                text[] NOT NULL DEFAULT '{}',
    status                text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'disabled')),
    disabled_reason       text,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    CHECK ((is_enterprise_install AND enterprise_id IS NOT NULL)
        OR (NOT is_enterprise_install AND team_id IS NOT NULL)),
    CHECK ((bot_token_sealed IS NULL) = (bot_token_key_id IS NULL))
);
CREATE UNIQUE INDEX installations_by_team ON installations (app_id, team_id) WHERE NOT is_enterprise_install;
CREATE UNIQUE INDEX installations_by_enterprise ON installations (app_id, enterprise_id) WHERE is_enterprise_install;

-- One row per Slack event (api_app_id, event_id), whatever the number of
-- deliveries. State machine: accepted -> processing -> done | ignored | failed.
CREATE TABLE event_receipts (
    id                   uuid PRIMARY KEY,
    -- No foreign key on the hot path: the gateway resolves the installation
    -- before inserting, and installations are never deleted (see trigger).
    installation_id      uuid NOT NULL,
    api_app_id           text NOT NULL,
    event_id             text NOT NULL,
    team_id              text,
    enterprise_id        text,
    event_type           text NOT NULL,
    event_subtype        text,
    channel_id           text,
    message_ts           text,
    thread_ts            text,
    event_time           timestamptz NOT NULL,
    state                text NOT NULL DEFAULT 'accepted'
                         CHECK (state IN ('accepted', 'processing', 'done', 'ignored', 'failed')),
    state_reason         text,
    retry_num            integer NOT NULL DEFAULT 0,
    retry_reason         text,
    duplicate_deliveries integer NOT NULL DEFAULT 0,
    last_delivery_at     timestamptz NOT NULL DEFAULT now(),
    received_at          timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT event_receipts_identity UNIQUE (api_app_id, event_id)
);
CREATE INDEX event_receipts_open_by_thread ON event_receipts (installation_id, channel_id, thread_ts)
    WHERE state IN ('accepted', 'processing');

CREATE FUNCTION installations_never_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'installations are disabled, never deleted (receipts and audit records refer to them)';
END
$$;
CREATE TRIGGER installations_never_deleted BEFORE DELETE ON installations
    FOR EACH ROW EXECUTE FUNCTION installations_never_deleted();

-- Work committed with a receipt, waiting for the relay. A row is deleted in
-- the same transaction that counts it in outbox_ledger, after JetStream's
-- PubAck; so the payload (the bus message) never outlives its publication.
-- The receipt and its row are written by one statement, which is why there
-- is no foreign key to check on every insert.
CREATE TABLE outbox (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    installation_id uuid NOT NULL,
    receipt_id   uuid NOT NULL,
    topic        text NOT NULL,
    msg_id       text NOT NULL,
    payload      bytea NOT NULL,
    traceparent  text,
    tracestate   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    attempts     integer NOT NULL DEFAULT 0,
    last_error   text,
    -- A row whose publish failed waits before its next try, so it cannot
    -- hold up the rows behind it.
    next_attempt_at timestamptz NOT NULL DEFAULT now()
);

-- Totals of what relays have published (one row per topic).
CREATE TABLE outbox_ledger (
    topic           text PRIMARY KEY,
    published_total bigint NOT NULL DEFAULT 0,
    last_published_at timestamptz
);

-- Wake relays once per inserting statement (NOTIFY is delivered at commit
-- and collapsed within a transaction).
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('threadline_outbox', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- Signed deliveries that did not become receipts: minimal, content-free.
CREATE TABLE rejections (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reason          text NOT NULL,
    api_app_id      text,
    team_id         text,
    enterprise_id   text,
    event_id        text,
    installation_id uuid,
    received_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rejections_by_reason ON rejections (reason);

-- `app_rate_limited` notices from Slack: an operator alert.
CREATE TABLE app_rate_limit_notices (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    api_app_id          text,
    team_id             text,
    minute_rate_limited bigint,
    received_at         timestamptz NOT NULL DEFAULT now()
);
