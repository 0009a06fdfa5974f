-- Which delivery of the ContextReady message holds a decision's lease: its
-- JetStream stream sequence. JetStream redelivers a message only once the
-- delivery before it gave up (nak) or stopped answering (ack deadline), so
-- a redelivery of the same message may take the lease over at once instead
-- of waiting for it to run out (up to twice the model timeout) after a
-- transient failure between the claim and the settle.
ALTER TABLE decisions ADD COLUMN lease_message_seq bigint;
