-- The assistant pane's status shows the stage a question is at, as a
-- streamed answer's thinking steps do (threadline_domain::thinking::Stage):
-- its thread read while its context is built, its answer written while
-- the model is called, its thread checked before the post.
-- `status_stage`: the stage last set showing, beside `status_decision`,
-- which names the decision shown, or while the question is being read
-- (before any decision exists) its request's receipt.
-- `reading_receipt`, `reading_at`: the context-builder began building the
-- context of that request's question in this thread then; it shows as
-- read until a decision for the request is created after it (or for
-- Slack's two minutes at most). Identifiers and times only.
ALTER TABLE assistant_threads
    ADD COLUMN status_stage    text CHECK (status_stage IN ('read', 'write', 'check')),
    ADD COLUMN reading_receipt uuid,
    ADD COLUMN reading_at      timestamptz;

-- The context-builder sets the reading mark and the publisher the stage:
-- both already hold UPDATE on the whole table (0029), so nothing is
-- granted here.
