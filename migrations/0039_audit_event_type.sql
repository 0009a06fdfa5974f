-- One definition of how an event's type is written into the audit log,
-- the SQL form of threadline_domain::audit::sanitise_code (which the
-- records written from Rust use): a short token of `[a-z0-9_.:-]` (Slack
-- names the type; a type threadline does not know is kept as it came, and
-- the audit log holds no free text), `unknown` when nothing is left.
-- Characters are replaced before the rest is lowercased, so that only
-- ASCII letters are lowercased, as in Rust (Postgres's lower() makes the
-- sign U+212A a `k`). The statements that write a record of an event
-- (intake, relay, context, late events) call it, where each spelled the
-- expression out before.
CREATE FUNCTION audit_event_type(t text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN coalesce(nullif(left(lower(regexp_replace(t, '[^A-Za-z0-9_.:-]', '_', 'g')), 64), ''), 'unknown');
