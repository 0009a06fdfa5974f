-- One person's action answered once whatever its delivery (issue 36).
-- Identifiers only: no message text.

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
