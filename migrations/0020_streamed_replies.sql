-- Streamed answers (chat.startStream / appendStream / stopStream).
--
-- A reply intent that streams: `sending` (the start is the claimed side
-- effect) → `streaming` once Slack gave the stream's ts (kept in slack_ts;
-- the publisher driving it touches updated_at as it appends, so a stream
-- whose publisher died is seen by its age) → `sent` when it stopped with
-- the whole answer, or `interrupted` when it was ended early with a closing
-- line (the thread moved on, a switch, review, the model failing, its
-- publisher dying). An interrupted intent answered nothing: the one
-- complete answer that may still follow claims it again (never streamed).
ALTER TABLE reply_intents DROP CONSTRAINT reply_intents_state_check;
ALTER TABLE reply_intents ADD CONSTRAINT reply_intents_state_check
    CHECK (state IN ('pending', 'sending', 'sent', 'failed_retryable', 'failed_permanent',
                     'unknown', 'reconciling', 'held', 'withdrawn', 'streaming', 'interrupted'));
-- When the stream was started, and why it was ended early.
ALTER TABLE reply_intents ADD COLUMN stream_ts text;
ALTER TABLE reply_intents ADD COLUMN interrupted_reason text;
-- An attempt of this intent started, or tried to start, a stream: it is
-- never streamed again, and an unknown outcome is reconciled from the
-- stream Slack may hold.
ALTER TABLE reply_intents ADD COLUMN streamed boolean NOT NULL DEFAULT false;
-- The attempt that streamed: only that attempt's unknown outcome is looked
-- for as a stream (a later attempt posts the whole answer, and is
-- reconciled like any post).
ALTER TABLE reply_intents ADD COLUMN stream_attempt integer;

-- The answer's text released so far while the model is still running
-- (escaped by the output policy, a prefix of the final body): written by
-- inference, read by the publisher streaming it. Message content, kept
-- where the answer's body is kept (and purged with it).
ALTER TABLE decisions ADD COLUMN stream_text text;
-- The AI label of a streamed answer, written with its first release, so
-- that a stream ended before the answer settled still carries it.
ALTER TABLE decisions ADD COLUMN stream_label text;

-- Streaming may be switched off per installation (on by default), and a
-- channel can override it (NULL: as the installation says).
ALTER TABLE installation_policies ADD COLUMN streaming_allowed boolean NOT NULL DEFAULT true;
ALTER TABLE channel_policies ADD COLUMN streaming_allowed boolean;
