-- A review request whose post's outcome is unknown is looked for in the
-- review channel, never posted blindly again. `post_started_at`: when the
-- latest attempt went to post (its fence); an attempt that only read the
-- channel does not move it, so the window after a post counts from it.
-- `unknown_since`: when the first attempt of unknown outcome went to post
-- (a later claim does not move it: the channel is read from there). Past
-- the window without a find, the request is held, as a reply is, and the
-- publisher's sweeper reads the channel again at `next_check_at`, then
-- less and less often (`checks` so far), for about a week; a request found
-- then is recorded as posted.
ALTER TABLE review_messages
    ADD COLUMN post_started_at timestamptz,
    ADD COLUMN unknown_since timestamptz,
    ADD COLUMN next_check_at timestamptz,
    ADD COLUMN checks integer NOT NULL DEFAULT 0;
CREATE INDEX review_messages_late_checks ON review_messages (next_check_at)
    WHERE next_check_at IS NOT NULL;
-- Requests already of unknown outcome are looked for from now on.
UPDATE review_messages
   SET unknown_since = posting_since, next_check_at = now()
 WHERE state = 'unknown';
