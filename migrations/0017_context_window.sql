-- The context-builder reads a thread's newest replies first and stops when
-- the context's limits are met, instead of reading the whole thread: the
-- window index serves that order (ts as a number, as Slack's ts compare).
-- It covers what thread_messages_by_thread served, so that one goes.
CREATE INDEX thread_messages_window ON thread_messages (installation_id, channel_id, root_ts, (ts::numeric));
DROP INDEX thread_messages_by_thread;
