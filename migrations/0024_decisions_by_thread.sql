-- no-transaction
-- A thread's decisions, newest first (the assistant pane's progress asks
-- which one is being answered). Built CONCURRENTLY, outside a transaction,
-- so that inference and the publisher keep writing decisions while it is
-- built on a large table.
CREATE INDEX CONCURRENTLY IF NOT EXISTS decisions_by_thread
    ON decisions (installation_id, channel_id, root_ts, created_at);
