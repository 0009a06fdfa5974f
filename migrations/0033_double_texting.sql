-- Double texting: people send one question as two or three quick messages.
-- An installation answers each message as it comes (`each`, the default)
-- or, with `latest`, waits until its asker has been quiet for
-- `double_texting_quiet_ms` and answers the latest of a burst, the earlier
-- messages of the burst read with it and not answered on their own.
ALTER TABLE installation_policies
    ADD COLUMN double_texting text NOT NULL DEFAULT 'each'
        CHECK (double_texting IN ('each', 'latest')),
    ADD COLUMN double_texting_quiet_ms integer NOT NULL DEFAULT 2000
        CHECK (double_texting_quiet_ms BETWEEN 500 AND 30000);

-- Under `latest`, what each request of a burst came to, decided once
-- (whichever comes first of the request's own build and a later request's
-- that reads it): `alone` (answered by its own answer) or `absorbed` (read
-- by the answer to `later_ts`, a later request of the same person in the
-- same conversation sent within the quiet period). Identifiers only.
-- Released (deleted) when `later_ts` is deleted before it was answered.
CREATE TABLE double_texts (
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    ts              text NOT NULL,
    outcome         text NOT NULL CHECK (outcome IN ('alone', 'absorbed')),
    later_ts        text CHECK ((outcome = 'absorbed') = (later_ts IS NOT NULL)),
    decided_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (installation_id, channel_id, ts)
);

-- The context-builder decides, reads and releases them (double_text::*:
-- the deletion of a burst's latest request before its answer releases the
-- requests it absorbed); the installation's policy columns are read with
-- the rest of its policy (table-level SELECT already granted).
GRANT SELECT, INSERT, DELETE ON double_texts TO threadline_context_builder;
-- The publisher releases them too, when it cancels the answer of a deleted
-- request that absorbed others.
GRANT SELECT, DELETE ON double_texts TO threadline_publisher;
