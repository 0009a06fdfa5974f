-- The assistant pane's progress, kept as state rather than as a sequence of
-- calls: `status_decision` is the decision whose progress the publisher last
-- set showing in the thread (NULL: none it set, or cleared), and
-- `status_set_at` when. What the thread should show is derived from the
-- decisions (one being answered, or on its way to be posted); the publisher
-- brings Slack to it under the thread row's lock (one `setStatus` call at a
-- time per thread), and the sweeper clears progress whose answer nobody is
-- driving any more (a decision dead-lettered or lost with its worker).
ALTER TABLE assistant_threads
    ADD COLUMN status_decision uuid,
    ADD COLUMN status_set_at   timestamptz;
CREATE INDEX assistant_threads_showing ON assistant_threads (status_set_at)
    WHERE status_decision IS NOT NULL;
