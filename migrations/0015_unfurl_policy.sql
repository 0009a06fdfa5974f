-- DESIGN §8: a reply's links and media are not unfurled unless the policy
-- allows it (an unfurl makes Slack fetch a link nobody clicked, and shows a
-- preview nobody wrote). Installation-wide switch, off by default; a
-- channel can override it (NULL: as the installation says).
ALTER TABLE installation_policies ADD COLUMN unfurl_allowed boolean NOT NULL DEFAULT false;
ALTER TABLE channel_policies ADD COLUMN unfurl_allowed boolean;
