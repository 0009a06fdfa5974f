-- NOTIFY takes one cluster-wide lock at commit and holds it until the
-- commit is durable, so every transaction that notifies commits after the
-- one before it has flushed: the gateway's group commits queued behind one
-- another (waits of 300 ms and more measured while the CPU was busy). A
-- writer that wakes the relays itself once its commit is done (the
-- gateway's intake: its own relay in-process, or a separate NOTIFY after
-- the commit) says so for its session, and the trigger leaves it alone.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('threadline.outbox_wake', true), '') <> 'after_commit' THEN
        PERFORM pg_notify('threadline_outbox', '');
    END IF;
    RETURN NULL;
END
$$;
