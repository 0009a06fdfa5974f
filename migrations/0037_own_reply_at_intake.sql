-- The bot's own new reply is settled at intake (receipts::insert_batch):
-- its receipt ends `ignored` (`own_bot`) with its audit record, and its
-- fact and message are kept in the thread store in the same transaction,
-- so the echo costs no outbox round and no context-builder work. A thread
-- our reply is the first to name gets its row (version 0).
--
-- The gateway inserts them and reads back only keys: never a message's
-- text, nor may it change a message or a thread already kept. What it can
-- write is no more than it could make the context-builder write before:
-- any event it adds to the outbox is applied to the thread store, so a
-- gateway's role already stood behind every fact there. The relay
-- inherits these as a member of the gateway's role.
GRANT INSERT ON message_facts TO threadline_gateway;
GRANT SELECT (installation_id, channel_id, ts) ON message_facts TO threadline_gateway;
GRANT INSERT (installation_id, channel_id, ts, root_ts, speaker, user_id, bot_id, text, text_hash, edited_ts)
    ON thread_messages TO threadline_gateway;
GRANT SELECT (installation_id, channel_id, ts) ON thread_messages TO threadline_gateway;
GRANT INSERT (installation_id, channel_id, root_ts, version) ON threads TO threadline_gateway;
GRANT SELECT (installation_id, channel_id, root_ts) ON threads TO threadline_gateway;
