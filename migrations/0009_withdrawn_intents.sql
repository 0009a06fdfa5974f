-- A reply intent that never reached Slack (pending, or refused with a 429)
-- whose decision was then discarded (stale, superseded, cancelled,
-- suppressed) is `withdrawn`: nothing is waiting to be posted for it, and a
-- newer decision for the same event may still claim it.
ALTER TABLE reply_intents DROP CONSTRAINT reply_intents_state_check;
ALTER TABLE reply_intents ADD CONSTRAINT reply_intents_state_check
    CHECK (state IN ('pending', 'sending', 'sent', 'failed_retryable', 'failed_permanent',
                     'unknown', 'reconciling', 'held', 'withdrawn'));
DROP INDEX reply_intents_open;
CREATE INDEX reply_intents_open ON reply_intents (state) WHERE state NOT IN ('sent', 'failed_permanent', 'withdrawn');
