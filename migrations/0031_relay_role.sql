-- The outbox relay logs in as a role of its own, `threadline_relay`, so
-- the public gateway's role may only add to the outbox, never read, lease
-- or delete what another service queued in it. The relay is the gateway
-- binary with THREADLINE_RELAY_ENABLED=true: it also records what it
-- drains from the spool through the gateway's intake (and serves Slack
-- itself where one process does both, as locally), so it is a member of
-- `threadline_gateway` and inherits its rights, and holds the outbox's
-- consumption on top: claim, settle and count (outbox::claim, settle,
-- backlog; the ledger).
--
-- Like 0029: the role is cluster-wide and created here only when missing
-- (a deployment's CloudNativePG managed roles create it with its password
-- and its membership, `inRoles`); many databases of one cluster share it.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'threadline_relay') THEN
        BEGIN
            CREATE ROLE threadline_relay LOGIN;
        EXCEPTION
            -- another database of the cluster migrating at the same time
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'role threadline_relay does not exist and % may not create it: create the service roles first (deploy/: CloudNativePG managed roles)', current_user;
        END;
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM pg_auth_members m
          JOIN pg_roles g ON g.oid = m.roleid AND g.rolname = 'threadline_gateway'
          JOIN pg_roles r ON r.oid = m.member AND r.rolname = 'threadline_relay'
    ) THEN
        BEGIN
            GRANT threadline_gateway TO threadline_relay;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'threadline_relay is not a member of threadline_gateway and % may not make it one: declare it (deploy/k8s/postgres/cluster.yaml: inRoles)', current_user;
        END;
    END IF;
END
$$;

-- The gateway keeps INSERT on the outbox (its intake queues each event
-- with its receipt, a review click its verdict) and nothing else of it.
REVOKE SELECT, UPDATE, DELETE ON outbox FROM threadline_gateway;
REVOKE ALL ON outbox_ledger FROM threadline_gateway;
GRANT SELECT, UPDATE, DELETE ON outbox TO threadline_relay;
GRANT SELECT, INSERT, UPDATE ON outbox_ledger TO threadline_relay;
