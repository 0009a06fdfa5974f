-- A doubled reply (Slack delivered one action of a person as two
-- messages) is kept in its thread as a hidden copy of the message that
-- owns its action: `deleted` (no context or check sees it, and its edits
-- give the thread no new version) with `copy_of` naming that message, its
-- text kept (purged and expired with its thread's messages). A doubled
-- top-level message is a thread of its own, shown. When the person deletes
-- the owning message while a copy still shows, the oldest copy stands in
-- for it (actions::stand_in): shown, the action's owner, in its place in
-- its burst, and asked again when nothing answered the deleted message.
-- The person's deletion of a hidden copy clears `copy_of`.
ALTER TABLE thread_messages ADD COLUMN copy_of text;
ALTER TABLE thread_messages ADD CONSTRAINT thread_messages_copy_hidden
    CHECK (copy_of IS NULL OR deleted);
CREATE INDEX thread_messages_copies ON thread_messages (installation_id, channel_id, copy_of)
    WHERE copy_of IS NOT NULL;
CREATE INDEX doubled_messages_by_kept ON doubled_messages (installation_id, channel_id, kept_ts);

-- The deleted message a copy stands in for (the action's owner before it).
ALTER TABLE person_actions ADD COLUMN stood_for text;
CREATE INDEX person_actions_by_ts ON person_actions (installation_id, channel_id, ts);
CREATE INDEX person_actions_stood_for ON person_actions (installation_id, channel_id, stood_for)
    WHERE stood_for IS NOT NULL;

-- The context-builder finds a deleted message's copies, and moves the
-- deleted message's records to the copy standing in (its copies, its burst).
GRANT SELECT ON doubled_messages TO threadline_context_builder;
GRANT UPDATE (kept_ts) ON doubled_messages TO threadline_context_builder;
GRANT UPDATE (ts, later_ts) ON double_texts TO threadline_context_builder;

-- The publisher asks the copy when an answer of the deleted message is
-- discarded (decisions::discarded, actions::ask_stand_in): the action,
-- locked FOR UPDATE as the context-builder's deletion locks it, so that
-- whichever comes second sees what the other did; the copy's record (its
-- first receipt), its turn and the outbox row of its thread's
-- reconsideration. The copy's receipt stays as it ended: receipts are the
-- intake's record. The sweep of answers waiting for review releases
-- bursts as the publisher's checks do (double_texts already granted).
GRANT SELECT ON person_actions TO threadline_publisher;
GRANT UPDATE (stood_for) ON person_actions TO threadline_publisher;
GRANT SELECT ON doubled_messages TO threadline_publisher;
GRANT INSERT ON turns TO threadline_publisher;
