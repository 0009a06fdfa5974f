-- One person's action answered once whatever its delivery, and late events
-- (issue 36). Identifiers, ages and outcomes only: no message text.

-- A person's action, by the id their client gave it (`client_msg_id`):
-- Slack has delivered one message as two `message` events with different
-- `ts` and the same `client_msg_id`. The first of its messages the thread
-- store applies owns the action (`ts`); an `app_mention` and its `message`
-- twin carry the same `ts` and own it together.
CREATE TABLE person_actions (
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    client_msg_id   text NOT NULL,
    ts              text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (installation_id, channel_id, client_msg_id)
);

-- A message that repeats an action another message owns (`kept_ts`): not
-- a change of any thread, never a request. Recorded once per message, with
-- the first receipt that delivered it.
CREATE TABLE doubled_messages (
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    ts              text NOT NULL,
    kept_ts         text NOT NULL,
    receipt_id      uuid NOT NULL,
    detected_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (installation_id, channel_id, ts)
);

-- An event that reached the gateway `age_ms` after it happened (its
-- `event_time`, else its message's `ts`), past the context-builder's
-- `THREADLINE_LATE_EVENT_MS`, and what became of it: a request skipped,
-- answered with a note of its lateness, or answered as in time under its
-- installation's policy; any other event only recorded.
CREATE TABLE late_events (
    receipt_id      uuid PRIMARY KEY,
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    message_ts      text NOT NULL,
    age_ms          bigint NOT NULL CHECK (age_ms >= 0),
    outcome         text NOT NULL CHECK (outcome IN ('skipped', 'noted', 'answered', 'recorded')),
    recorded_at     timestamptz NOT NULL DEFAULT now()
);

-- What an installation does with a request that arrived late (`threadline
-- policy late-events`); without a row, `note`.
CREATE TABLE late_event_policies (
    installation_id uuid PRIMARY KEY,
    action          text NOT NULL CHECK (action IN ('skip', 'note', 'answer')),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
