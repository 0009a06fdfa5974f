-- Every form of answer through one reply mechanism (a whole post, a stream).
--
-- `ending`: the intent's stream is open in Slack and must be stopped with
-- its closing line (the thread moved on, a switch, its publisher died, its
-- finishing stop was refused); Slack has not confirmed it yet. Whoever
-- finds it stops it, after Slack's Retry-After, until Slack confirms the
-- stream ended (`interrupted`) or shows the whole answer (`sent`). An
-- intent is `interrupted` only once Slack confirmed its stream ended.
ALTER TABLE reply_intents DROP CONSTRAINT reply_intents_state_check;
ALTER TABLE reply_intents ADD CONSTRAINT reply_intents_state_check
    CHECK (state IN ('pending', 'sending', 'sent', 'failed_retryable', 'failed_permanent',
                     'unknown', 'reconciling', 'held', 'withdrawn', 'streaming', 'interrupted',
                     'ending'));
-- Why an `ending` intent's stream is being stopped (the closing line it
-- gets: thread_changed, source_deleted, switched_off, needs_review,
-- interrupted).
ALTER TABLE reply_intents ADD COLUMN end_reason text;
-- When the intent's answer became whole in Slack: a post's own ts, a
-- stream's stop (the database's clock when it was recorded). What a person
-- said before it and the answer did not read crossed the answer in flight,
-- as the publisher and the context-builder both judge it.
ALTER TABLE reply_intents ADD COLUMN whole_ts numeric;
UPDATE reply_intents SET whole_ts = slack_ts::numeric WHERE slack_ts IS NOT NULL;
-- The stream may show some of the answer (from its start on; not a stream
-- an unknown start left, found by reconciliation): its closing line then
-- follows a blank line.
ALTER TABLE reply_intents ADD COLUMN stream_shown boolean NOT NULL DEFAULT false;
-- When the stream's start was sent: a start whose outcome is unknown is
-- looked for in Slack around this time only (its own attempt's window).
ALTER TABLE reply_intents ADD COLUMN stream_started_at timestamptz;
-- The sweeper finds the streams to stop by their due time.
CREATE INDEX reply_intents_ending ON reply_intents (next_attempt_at) WHERE state = 'ending';
