-- The audit log keeps one record per decision point. An answered mention
-- had three records that only said a post had begun or echoed another
-- record of the same statement:
--
-- * `delivery: sending`, a post claimed. The post's outcome (`sent`,
--   `streaming`, `unknown`, `failed_*`, `held`, …) now carries the claim's
--   time as `began_at`, with the attempts. A post in flight is the intent's
--   row in the ledger (`threadline intents`), as it was between two records
--   before, and every `sending` ends in an audited state: a claim left
--   undriven is moved to `unknown` (intents::take_undriven, load_for_post).
-- * `decision: published`. It is set only by the statement that records
--   its intent `sent` (intents::record_posts), whose record names the
--   decision; the decision's model configuration, tokens, hash and thread
--   version are on its verdict's record (`proposed`).
-- * `context: done` of a request whose context was recorded: its
--   `context_built` record, written in the build's transaction before the
--   context was handed on, stands for it (threads::finish*; not a trigger).
--
-- `decision: calling` stays: a model call claimed may never reach a
-- verdict (its context dead-lettered), and the record is then its only
-- trace.
ALTER TABLE audit_log ADD COLUMN began_at timestamptz;

CREATE OR REPLACE FUNCTION audit_decision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.status IS NOT DISTINCT FROM OLD.status THEN
        RETURN NULL;
    END IF;
    IF NEW.status = 'published' THEN
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

CREATE OR REPLACE FUNCTION audit_intent() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.state IS NOT DISTINCT FROM OLD.state THEN
        RETURN NULL;
    END IF;
    IF NEW.state = 'sending' THEN
        RETURN NULL;
    END IF;
    INSERT INTO audit_log (stage, outcome, reason, installation_id, event_id, receipt_id, decision_id, intent_id,
                           channel_ref, output_hash, delivery_status, error_code, retry_count, reviewer, began_at)
    VALUES ('delivery', NEW.state,
            CASE WHEN NEW.state = 'sent' AND NEW.reconciled THEN 'reconciled' END,
            NEW.installation_id, NEW.event_id, NEW.receipt_id, NEW.decision_id, NEW.id, NEW.channel_ref,
            NEW.body_hash, NEW.state, NEW.error_code, NEW.attempts,
            nullif(current_setting('threadline.actor', true), ''),
            -- the outcome of a claimed attempt: when that attempt was claimed
            CASE WHEN TG_OP = 'UPDATE' AND OLD.state IN ('sending', 'streaming') THEN NEW.sending_since END);
    RETURN NULL;
END
$$;
