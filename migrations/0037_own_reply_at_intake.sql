-- The bot's own new reply is settled at intake (receipts::insert_batch):
-- its receipt ends `ignored` (`own_bot`) with its audit record, and its
-- fact and message are kept in the thread store in the same statement, so
-- the echo costs no outbox round and no context-builder work. The gateway
-- inserts them, and reads back only the keys its statement returns: never
-- a message's text (it writes the text it was just sent, and cannot read
-- any). A thread our reply is the first to name gets its row (version 0).
-- The relay inherits these as a member of the gateway's role.
GRANT INSERT ON message_facts TO threadline_gateway;
GRANT SELECT (installation_id, channel_id, ts) ON message_facts TO threadline_gateway;
GRANT INSERT (installation_id, channel_id, ts, root_ts, speaker, user_id, bot_id, text, text_hash, edited_ts)
    ON thread_messages TO threadline_gateway;
GRANT SELECT (installation_id, channel_id, ts, root_ts) ON thread_messages TO threadline_gateway;
GRANT INSERT (installation_id, channel_id, root_ts, version) ON threads TO threadline_gateway;
GRANT SELECT (installation_id, channel_id, root_ts) ON threads TO threadline_gateway;
