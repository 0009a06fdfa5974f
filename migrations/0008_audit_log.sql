-- DESIGN invariant 9 and §8: one content-free audit record per decision
-- point. Identifiers, hashes, decisions and timings only: no message text,
-- names, emails, tokens or headers. The channel is pseudonymised with a keyed
-- hash (channel_ref) computed by the service; the raw id is never written here.
CREATE TABLE audit_log (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                timestamptz NOT NULL DEFAULT now(),
    stage             text NOT NULL CHECK (stage IN ('intake', 'context', 'decision', 'review',
                                                     'delivery', 'lifecycle', 'operator')),
    outcome           text NOT NULL,
    reason            text,
    installation_id   uuid,
    event_id          text,
    receipt_id        uuid,
    decision_id       uuid,
    intent_id         uuid,
    channel_ref       text,
    event_type        text,
    thread_version    bigint,
    received_at       timestamptz,
    acked_at          timestamptz,
    model_config_id   text,
    prompt_tokens     integer,
    completion_tokens integer,
    output_hash       text,
    delivery_status   text,
    error_code        text,
    retry_count       integer,
    reviewer          text
);
CREATE INDEX audit_log_by_time ON audit_log (at);
CREATE INDEX audit_log_by_event ON audit_log (installation_id, event_id);

-- Append-only: no UPDATE or TRUNCATE ever; DELETE only by the retention
-- purge (`threadline purge`), which sets threadline.audit_purge in its
-- transaction.
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('threadline.audit_purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP;
END
$$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();

-- One line per event across its decision points: when it was received,
-- acknowledged, processed, reviewed and answered.
CREATE VIEW audit_timeline AS
SELECT installation_id, event_id,
       min(received_at)                                                   AS received_at,
       min(acked_at)                                                      AS acked_at,
       max(at) FILTER (WHERE stage = 'context')                           AS processed_at,
       max(at) FILTER (WHERE stage = 'review')                            AS reviewed_at,
       max(at) FILTER (WHERE stage = 'delivery' AND delivery_status = 'sent') AS sent_at,
       (array_agg(outcome ORDER BY id DESC))[1]                           AS last_outcome
  FROM audit_log
 WHERE event_id IS NOT NULL
 GROUP BY installation_id, event_id;

-- Decisions and reply intents are audited by trigger on every status change,
-- whichever path made it (services, operator commands), in the transaction
-- that made it. The channel pseudonym is computed by the service that
-- creates the row (it holds the key) and kept beside the raw id.
ALTER TABLE decisions ADD COLUMN channel_ref text;
ALTER TABLE reply_intents ADD COLUMN channel_ref text;

CREATE FUNCTION audit_decision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.status IS NOT DISTINCT FROM OLD.status THEN
        RETURN NULL;
    END IF;
    INSERT INTO audit_log (stage, outcome, reason, installation_id, event_id, receipt_id, decision_id, channel_ref,
                           thread_version, model_config_id, prompt_tokens, completion_tokens, output_hash, reviewer)
    VALUES (CASE WHEN TG_OP = 'UPDATE' AND OLD.status = 'review' AND NEW.status IN ('approved', 'rejected')
                 THEN 'review' ELSE 'decision' END,
            NEW.status,
            coalesce(NEW.status_reason, nullif(array_to_string(NEW.review_reasons, ','), '')),
            NEW.installation_id, NEW.event_id, NEW.receipt_id, NEW.id, NEW.channel_ref,
            NEW.thread_version, NEW.model_config_id, NEW.prompt_tokens, NEW.completion_tokens, NEW.output_hash,
            NEW.reviewed_by);
    RETURN NULL;
END
$$;
CREATE TRIGGER decisions_audit AFTER INSERT OR UPDATE OF status ON decisions
    FOR EACH ROW EXECUTE FUNCTION audit_decision();

CREATE FUNCTION audit_intent() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.state IS NOT DISTINCT FROM OLD.state THEN
        RETURN NULL;
    END IF;
    INSERT INTO audit_log (stage, outcome, reason, installation_id, event_id, receipt_id, decision_id, intent_id,
                           channel_ref, output_hash, delivery_status, error_code, retry_count, reviewer)
    VALUES ('delivery', NEW.state,
            CASE WHEN NEW.state = 'sent' AND NEW.reconciled THEN 'reconciled' END,
            NEW.installation_id, NEW.event_id, NEW.receipt_id, NEW.decision_id, NEW.id, NEW.channel_ref,
            NEW.body_hash, NEW.state, NEW.error_code, NEW.attempts,
            nullif(current_setting('threadline.actor', true), ''));
    RETURN NULL;
END
$$;
CREATE TRIGGER reply_intents_audit AFTER INSERT OR UPDATE OF state ON reply_intents
    FOR EACH ROW EXECUTE FUNCTION audit_intent();

-- Operators engaging and releasing kill switches (the free-text reason is
-- not copied).
CREATE FUNCTION audit_kill_switch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit_log (stage, outcome, reason, reviewer)
    VALUES ('operator', CASE WHEN NEW.engaged THEN 'kill_switch_engaged' ELSE 'kill_switch_released' END,
            NEW.scope || ':' || NEW.target, NEW.changed_by);
    RETURN NULL;
END
$$;
CREATE TRIGGER kill_switches_audit AFTER INSERT OR UPDATE ON kill_switches
    FOR EACH ROW EXECUTE FUNCTION audit_kill_switch();

-- The review outcomes counted by the publisher's ledger gauges.
CREATE INDEX decisions_reviewed ON decisions (status) WHERE reviewed_by IS NOT NULL;
