-- Human review in Slack.
--
-- Per installation: the channel review requests are posted in, the Slack
-- users whose Approve / Reject clicks count, and how much of a proposed
-- answer a review request shows (0: none of its text, only the reasons
-- and where it would be posted).
CREATE TABLE review_settings (
    installation_id uuid PRIMARY KEY,
    channel_id      text,
    reviewers       text[] NOT NULL DEFAULT '{}',
    preview_chars   integer NOT NULL DEFAULT 600 CHECK (preview_chars BETWEEN 0 AND 2500),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- One review request per decision, posted by the publisher. The post is
-- claimed like a reply: `posting` (by one publisher, since posting_since)
-- → `posted` with its ts, or `unknown` when Slack's answer was lost (then
-- the review channel's history is read for the request's metadata before
-- another post), or `failed` with Slack's code when Slack refused it for
-- good (the CLI still reviews it). `shown` is the outcome the message was
-- last updated with (NULL: still asking).
CREATE TABLE review_messages (
    decision_id     uuid PRIMARY KEY,
    installation_id uuid NOT NULL,
    channel_id      text NOT NULL,
    state           text NOT NULL CHECK (state IN ('posting', 'posted', 'unknown', 'failed')),
    attempt         integer NOT NULL DEFAULT 1,
    posting_since   timestamptz NOT NULL DEFAULT now(),
    ts              text,
    error_code      text,
    shown           text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((state = 'posted') = (ts IS NOT NULL))
);
CREATE INDEX review_messages_by_ts ON review_messages (installation_id, channel_id, ts);
