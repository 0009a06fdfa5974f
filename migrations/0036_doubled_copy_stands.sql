-- A doubled message stands for its person's action once the message that
-- owned it is deleted (the person deleted one of the two messages Slack
-- made of their one action, and the other still shows): the context-builder
-- reads the copy's record when it applies the owner's deletion, moves the
-- action to the copy and forgets the copy's record
-- (threadline_store::actions::promote). Nothing new is stored.
GRANT SELECT, DELETE ON doubled_messages TO threadline_context_builder;
