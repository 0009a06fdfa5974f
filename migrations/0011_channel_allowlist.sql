-- DESIGN §8: per-workspace channel allow-list. A channel on the list
-- (`channel_policies.allowed`) may trigger even when it is private or a
-- Slack Connect channel; an installation with `allowlist_only` answers in
-- listed channels only (DMs stay governed by `dms_allowed`).
ALTER TABLE installation_policies ADD COLUMN allowlist_only boolean NOT NULL DEFAULT false;
ALTER TABLE channel_policies ADD COLUMN allowed boolean NOT NULL DEFAULT false;
