-- DESIGN §8: private channels and Slack Connect channels are denied until
-- an installation allows them (DMs already have dms_allowed).
ALTER TABLE installation_policies ADD COLUMN private_channels_allowed boolean NOT NULL DEFAULT false;
ALTER TABLE installation_policies ADD COLUMN shared_channels_allowed boolean NOT NULL DEFAULT false;
