-- no-transaction
-- A thread's decisions, newest first (the assistant pane's progress asks
-- which one is being answered). Built CONCURRENTLY, outside a transaction,
-- so that inference and the publisher keep writing decisions while it is
-- built on a large table. A build that was interrupted leaves an INVALID
-- index behind and records nothing: running the migration again then fails
-- loudly ("already exists") rather than accept it; drop it
-- (`DROP INDEX CONCURRENTLY decisions_by_thread`) and migrate again.
CREATE INDEX CONCURRENTLY decisions_by_thread
    ON decisions (installation_id, channel_id, root_ts, created_at);
