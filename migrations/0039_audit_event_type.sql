-- One definition of how an event's type is written into the audit log (the
-- SQL form of threadline_domain::audit::sanitise_code, which the records
-- written from Rust use): a
-- short token of `[a-z0-9_.:-]` (Slack names the type; a type threadline
-- does not know is kept as it came, and the audit log holds no free text),
-- `unknown` when nothing is left. The statements that write a record of an
-- event (intake, relay, context, late events) call it, where each spelled
-- the expression out before.
CREATE FUNCTION audit_event_type(t text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN coalesce(nullif(left(regexp_replace(lower(t), '[^a-z0-9_.:-]', '_', 'g'), 64), ''), 'unknown');
