-- Feedback on answers (issue 36): the latest verdict of each person on each
-- answer, from the feedback buttons every answer carries. Content-free:
-- the decision, who clicked (their Slack user id, as `decisions.reviewed_by`
-- keeps a reviewer's), the verdict and when; never the answer's text.
-- Slack toggles the buttons in the client and never reports a deselect, so
-- a person's latest click (Slack's `action_ts`) is their verdict: a click
-- older than the one recorded changes nothing, whatever order they arrive in.
CREATE TABLE answer_feedback (
    decision_id     uuid NOT NULL,
    user_id         text NOT NULL,
    installation_id uuid NOT NULL,
    verdict         text NOT NULL CHECK (verdict IN ('positive', 'negative')),
    action_ts       numeric NOT NULL,
    clicks          integer NOT NULL DEFAULT 1 CHECK (clicks > 0),
    first_at        timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (decision_id, user_id)
);
CREATE INDEX answer_feedback_by_time ON answer_feedback (installation_id, updated_at);

-- A click's verdict is audited (stage `feedback`), in its transaction.
ALTER TABLE audit_log DROP CONSTRAINT audit_log_stage_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_stage_check
    CHECK (stage IN ('intake', 'context', 'decision', 'review', 'delivery', 'lifecycle',
                     'operator', 'feedback'));

-- The gateway records the clicks (threadline_store::feedback::record): it
-- reads the decision and its reply (granted in 0029) and inserts or
-- updates the person's row (`ON CONFLICT … DO UPDATE` reads the row it
-- updates). Nothing else of the services touches it; the CLI's export
-- runs as the owner.
GRANT SELECT, INSERT, UPDATE ON answer_feedback TO threadline_gateway;
