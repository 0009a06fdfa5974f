-- Per-installation admission and budgets (DESIGN invariant 11), shared by
-- every replica. A trigger is admitted to the model's queue (its context
-- built and published) only while its installation is within its budgets
-- and holds fewer than its share of that queue; otherwise it is parked
-- here, in order, and resumed when there is room again. Identifiers only:
-- the context is built when the work resumes, from the thread as it is then.

-- Per-installation overrides of the services' defaults (NULL: the default;
-- 0: no limit).
ALTER TABLE installation_policies ADD COLUMN answers_per_minute integer CHECK (answers_per_minute >= 0);
ALTER TABLE installation_policies ADD COLUMN model_calls_per_minute integer CHECK (model_calls_per_minute >= 0);
ALTER TABLE installation_policies ADD COLUMN model_tokens_per_day bigint CHECK (model_tokens_per_day >= 0);

-- The per-minute budgets as token buckets: what was left at `refilled_at`
-- (each refills its whole size over a minute and holds at most its size).
-- Locked by each admission round of the installation.
CREATE TABLE tenant_budgets (
    installation_id uuid PRIMARY KEY,
    answers         float8 NOT NULL,
    model_calls     float8 NOT NULL,
    refilled_at     timestamptz NOT NULL DEFAULT now()
);

-- Model tokens used per installation and UTC day, added by inference as it
-- settles each decision.
CREATE TABLE tenant_tokens (
    installation_id uuid NOT NULL,
    day             date NOT NULL,
    tokens          bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (installation_id, day)
);

-- A triggering request's place in its installation's line: `parked`
-- (waiting; resumed in the order asked, by the question's Slack ts) or `admitted` (its context is in the model's
-- queue; the row goes when inference settles its decision). `charged`: the
-- request's units were taken from the budgets (a resume that died after
-- that is not charged again). `reason`: why it was parked (a budget, or
-- `tenant_queue`).
CREATE TABLE tenant_work (
    receipt_id      uuid PRIMARY KEY,
    installation_id uuid NOT NULL,
    event_id        text NOT NULL,
    channel_id      text NOT NULL,
    root_ts         text NOT NULL,
    source_ts       text NOT NULL,
    channel_ref     text,
    state           text NOT NULL CHECK (state IN ('parked', 'admitted')),
    reason          text,
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    parked_at       timestamptz,
    charged         boolean NOT NULL DEFAULT false,
    lease_until     timestamptz,
    admitted_at     timestamptz
);
CREATE INDEX tenant_work_parked ON tenant_work (installation_id, (source_ts::numeric), seq) WHERE state = 'parked';
CREATE INDEX tenant_work_admitted ON tenant_work (installation_id, admitted_at) WHERE state = 'admitted';

-- The note that a thread's request waits for its workspace's budget: once
-- per thread (the decision that says it goes through the reply mechanism).
CREATE TABLE budget_notes (
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    root_ts         text NOT NULL,
    decision_id     uuid NOT NULL,
    noted_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (installation_id, channel_id, root_ts)
);
