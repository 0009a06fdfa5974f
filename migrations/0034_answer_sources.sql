-- The links a streamed answer's writing step shows as its sources: every
-- link of the answer that also appears in a message the answer was built on
-- (its thread's context, or the channel the person looks at from the
-- assistant pane), once each, in the answer's order, at most ten
-- (threadline_domain::sources). Inference derives them when it settles the
-- answer, since only it holds that context; they are a part of the stored
-- answer (`body_text`) and nothing more, so they hold no text the row does
-- not already hold, and `threadline purge` empties them with it.
ALTER TABLE decisions ADD COLUMN sources text[] NOT NULL DEFAULT '{}';

-- Inference settles them with the answer (decisions::settle_many); the
-- publisher reads them at a stream's stop (granted SELECT in 0029).
GRANT UPDATE (sources) ON decisions TO threadline_inference;
