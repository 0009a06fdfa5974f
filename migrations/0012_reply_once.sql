-- Replying once to the thread as it is, under adversarial faults
-- (DESIGN §5, §6, invariants 3–5 and 11).

-- What an answer read: the Slack ts of every message of its context, and,
-- when the context was truncated, the oldest reply it kept (messages older
-- than that were left out on purpose, not missed). A human message whose ts
-- falls after the context and before the reply's ts crossed the answer in
-- flight.
ALTER TABLE decisions ADD COLUMN context_ts text[];
ALTER TABLE decisions ADD COLUMN context_floor_ts text;

-- Some attempt of this intent had an unknown outcome: Slack is read again
-- for evidence before any later post of it.
ALTER TABLE reply_intents ADD COLUMN ever_unknown boolean NOT NULL DEFAULT false;
-- Held for lack of evidence: when the sweeper reads the thread again (a post
-- that lands after its intent was given up on is recorded, never forgotten),
-- and how many times it has.
ALTER TABLE reply_intents ADD COLUMN next_check_at timestamptz;
ALTER TABLE reply_intents ADD COLUMN late_checks integer NOT NULL DEFAULT 0;
-- Further posts of this intent found in Slack beyond the recorded one: a
-- duplicate-reply incident, kept as evidence.
ALTER TABLE reply_intents ADD COLUMN extra_ts text[] NOT NULL DEFAULT '{}';
-- When a post of this intent was recorded after the intent had been given
-- up on (held, failed, pending a re-post): it landed late.
ALTER TABLE reply_intents ADD COLUMN late_recorded_at timestamptz;
-- When the sweeper last handed this intent's proposal back to a publisher
-- because no delivery was driving it.
ALTER TABLE reply_intents ADD COLUMN swept_at timestamptz;
CREATE INDEX reply_intents_held_checks ON reply_intents (next_check_at) WHERE state = 'held' AND next_check_at IS NOT NULL;
-- The intents of a thread: read for every human message the thread gets
-- (did it cross a sent answer?) and by every reconciliation.
CREATE INDEX reply_intents_by_thread ON reply_intents (installation_id, channel_id, root_ts);

-- An answer that a human message crossed in flight: the message reached
-- Slack after the answer's context was taken and before the answer was
-- posted. Recorded, counted, and the thread reconsidered.
CREATE TABLE crossed_answers (
    intent_id       uuid NOT NULL,
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    root_ts         text NOT NULL,
    reply_ts        text NOT NULL,
    crossing_ts     text NOT NULL,
    -- publisher (seen when the post was recorded) or context-builder (seen
    -- when the crossing message was applied)
    detected_by     text NOT NULL CHECK (detected_by IN ('publisher', 'context-builder')),
    detected_at     timestamptz NOT NULL DEFAULT now(),
    -- what the reconsideration decided: rebuilt (the thread's latest request
    -- was decided again), no_reply_needed (its latest request is answered)
    -- or installation_inactive (disabled since)
    reconsidered_at timestamptz,
    reconsideration text CHECK (reconsideration IN ('rebuilt', 'no_reply_needed', 'installation_inactive')),
    PRIMARY KEY (intent_id, crossing_ts)
);
CREATE INDEX crossed_answers_unreconsidered ON crossed_answers (installation_id, channel_id, root_ts)
    WHERE reconsidered_at IS NULL;

-- Evidence of an intent's earlier attempts: when its first attempt was
-- claimed, and the body hash of every decision any attempt posted, so a
-- reconciliation (and the read before a re-post) looks for all of them.
ALTER TABLE reply_intents ADD COLUMN first_sending_since timestamptz;
ALTER TABLE reply_intents ADD COLUMN claimed_hashes text[] NOT NULL DEFAULT '{}';
-- Attempts Slack refused with 429 (THREADLINE_POST_MAX_ATTEMPTS bounds these,
-- not every claim).
ALTER TABLE reply_intents ADD COLUMN ratelimited_attempts integer NOT NULL DEFAULT 0;

-- When a message was deleted (a tombstone keeps the identity): a message
-- deleted after an answer's context was taken still crossed it in flight.
ALTER TABLE thread_messages ADD COLUMN deleted_at timestamptz;

-- Failures of the context-builder on this event that were not transient
-- (a defect, data it cannot cope with): after five it is marked
-- failed(handler_error) and dead-lettered, so the answers of its thread stop
-- waiting for it and an operator sees why; a dead-letter replay reopens it.
ALTER TABLE event_receipts ADD COLUMN failures integer NOT NULL DEFAULT 0;

-- Intents claimed before this migration: their one hash and first claim.
UPDATE reply_intents SET claimed_hashes = ARRAY[body_hash], first_sending_since = sending_since
 WHERE attempts > 0 AND cardinality(claimed_hashes) = 0;

-- (A 429 now pauses only the channel it came from — Slack's limit for
-- chat.postMessage is per channel — so `workspace_pauses` is no longer
-- written. It is kept for the release that still runs beside an older
-- publisher during a rolling upgrade; a later migration drops it.)
