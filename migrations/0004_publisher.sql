-- Reply intents, shared posting budgets and reconciliation (DESIGN §4, §6).

-- One intent per (installation, source event, action kind): the only
-- permission to post. pending → sending → sent; sending → failed_retryable
-- → pending; sending → failed_permanent; sending → unknown → reconciling →
-- sent | held | pending.
CREATE TABLE reply_intents (
    id               uuid PRIMARY KEY,
    installation_id  uuid NOT NULL,
    event_id         text NOT NULL,
    action_kind      text NOT NULL,
    receipt_id       uuid NOT NULL,
    decision_id      uuid NOT NULL,
    channel_id       text NOT NULL,
    root_ts          text NOT NULL,
    body_hash        text NOT NULL,
    state            text NOT NULL CHECK (state IN ('pending', 'sending', 'sent', 'failed_retryable', 'failed_permanent',
                                                    'unknown', 'reconciling', 'held')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    sending_since    timestamptz,
    slack_ts         text,
    error_code       text,
    reconciled       boolean NOT NULL DEFAULT false,
    reconcile_reads  integer NOT NULL DEFAULT 0,
    unknown_since    timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT reply_intents_once UNIQUE (installation_id, event_id, action_kind)
);
CREATE INDEX reply_intents_open ON reply_intents (state) WHERE state NOT IN ('sent', 'failed_permanent');

-- About one post per second per channel, shared by every publisher replica.
CREATE TABLE post_budgets (
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    next_allowed_at timestamptz NOT NULL,
    PRIMARY KEY (installation_id, channel_id)
);

-- A workspace-wide pause while Slack says to wait (Retry-After).
CREATE TABLE workspace_pauses (
    installation_id uuid PRIMARY KEY,
    paused_until    timestamptz NOT NULL
);

ALTER TABLE decisions ADD COLUMN reviewed_by text;
ALTER TABLE decisions ADD COLUMN reviewed_at timestamptz;
