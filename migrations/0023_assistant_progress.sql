-- The assistant pane's progress, kept as state rather than as a sequence of
-- calls: `status_decision` is the decision whose progress the publisher last
-- set showing in the thread (NULL: none it set, or cleared), `status_set_at`
-- when Slack took it, and `status_gen` counts the changes, so that a
-- publisher whose `setStatus` call may have crossed another's (its record
-- lost the compare-and-set) calls again with what the thread should show
-- then, and the last call Slack receives is the right one. What the thread
-- should show is derived from its decisions (one being answered, or on its
-- way to be posted), and no lock is held across the Slack call. The
-- publisher's sweeper looks again at progress no answer is behind any more
-- (a model call whose worker died or froze past its lease).
-- `titled`: the thread's title was set from its first question (the
-- greeting then leaves it alone).
ALTER TABLE assistant_threads
    ADD COLUMN titled          boolean NOT NULL DEFAULT false,
    ADD COLUMN status_decision uuid,
    ADD COLUMN status_set_at   timestamptz,
    ADD COLUMN status_gen      bigint NOT NULL DEFAULT 0;
-- When the publisher's sweeper looks at the thread's progress next (NULL:
-- nothing of the publisher's shows). A sweeper takes due rows with SKIP
-- LOCKED and moves this on, so replicas share them; a call Slack did not
-- take now (a 429, a timeout) moves it on by Slack's Retry-After.
-- `status_confirmed`: Slack surely got what the record says (false after a
-- call Slack did not take now, which it may still apply: the next look calls
-- Slack whatever the record says).
ALTER TABLE assistant_threads
    ADD COLUMN status_due_at    timestamptz,
    ADD COLUMN status_confirmed boolean NOT NULL DEFAULT true;
CREATE INDEX assistant_threads_due ON assistant_threads (status_due_at)
    WHERE status_due_at IS NOT NULL;
