-- OAuth install flow: single-use, expiring `state` bound to the browser
-- (only hashes are stored), and the refresh token of rotating installs.
CREATE TABLE oauth_states (
    state_hash   text PRIMARY KEY,
    browser_hash text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    used_at      timestamptz
);

ALTER TABLE installations ADD COLUMN refresh_token_sealed bytea;
ALTER TABLE installations ADD COLUMN refresh_token_key_id text;
ALTER TABLE installations ADD COLUMN token_expires_at timestamptz;
