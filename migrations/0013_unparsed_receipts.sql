-- Unparsed receipts (invariant 10): a signed `event_callback` delivery that
-- carries an identity (event_id, api_app_id, team or enterprise) but does not
-- parse is recorded, deduplicated and answered like any other receipt, in
-- state `unparsed` with a content-free `parse_error`, and held until an
-- operator replays it (`threadline events replay`) after an upgrade.
-- State machine: unparsed -> accepted (replayed) | failed (unparsed_expired,
-- by `threadline purge` past the receipts' retention).

ALTER TABLE event_receipts DROP CONSTRAINT event_receipts_state_check;
ALTER TABLE event_receipts ADD CONSTRAINT event_receipts_state_check
    CHECK (state IN ('accepted', 'processing', 'done', 'ignored', 'failed', 'unparsed'));

-- Why the delivery did not parse: a reason code and the parser's message,
-- which names fields, never values.
ALTER TABLE event_receipts ADD COLUMN parse_error text;
ALTER TABLE event_receipts ADD CONSTRAINT event_receipts_unparsed_has_reason
    CHECK (state <> 'unparsed' OR parse_error IS NOT NULL);

-- An unparsed delivery may name an installation threadline does not know
-- (recorded as NULL) and may have no readable event_time; only a receipt
-- that arrived unparsed may lack them. A replay fills both in.
ALTER TABLE event_receipts ALTER COLUMN installation_id DROP NOT NULL;
ALTER TABLE event_receipts ALTER COLUMN event_time DROP NOT NULL;
ALTER TABLE event_receipts ADD CONSTRAINT event_receipts_identified
    CHECK ((installation_id IS NOT NULL AND event_time IS NOT NULL) OR parse_error IS NOT NULL);

-- The raw body of each unparsed receipt, kept only so that it can be
-- replayed. It holds message text, so it is one of the few places text is
-- stored: a replay deletes it in the transaction that accepts the receipt,
-- and `threadline purge` deletes it past THREADLINE_RECEIPT_RETENTION_DAYS.
-- Nothing else is stored here. Written by the same statement as its receipt
-- (the gateway's group commit), hence no foreign key.
CREATE TABLE unparsed_events (
    receipt_id  uuid PRIMARY KEY,
    body        bytea NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX unparsed_events_by_age ON unparsed_events (received_at);
