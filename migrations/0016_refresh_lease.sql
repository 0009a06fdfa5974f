-- One token refresh at a time per installation, held in the row itself so
-- that it survives the holder's database connection: the holder calls
-- Slack holding no connection, and nobody else exchanges the same refresh
-- token until the lease is given back or runs out.
ALTER TABLE installations
    ADD COLUMN refresh_lease_until timestamptz,
    ADD COLUMN refresh_lease_holder uuid,
    -- Set when an exchange of the stored refresh token ended without a
    -- known outcome (a timeout, a 5xx, internal_error…): Slack may have
    -- spent the token, so a later refusal of it is a lost refresh, not a
    -- revocation.
    ADD COLUMN refresh_unknown_since timestamptz;
