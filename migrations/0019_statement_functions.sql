-- Two checks that several statements make, defined once in the schema so
-- that every statement can name them in its fixed text (statements are
-- checked at build time; see crates/store). Each is a set-returning SQL
-- function of one SELECT, which the planner inlines into the calling
-- statement as a subquery (a scalar SQL function whose body holds a
-- subquery would not be inlined): the plan is the one of the subquery
-- written out. Callers read them as `(SELECT x FROM f(...) x)`. Parameters
-- are positional, so that no column can ever capture them.

-- The first engaged kill switch covering an installation (as text) and a
-- feature, as `scope[:target]`; no row when none is: global first, then
-- the installation, then the feature. Used by the inference service before
-- and after a model call and by the publisher's claim and fence.
CREATE FUNCTION engaged_switch(installation text, feature text) RETURNS TABLE (switch text)
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.target = '' THEN s.scope ELSE s.scope || ':' || s.target END
      FROM kill_switches s
     WHERE s.engaged
       AND (s.scope = 'global'
         OR (s.scope = 'installation' AND s.target = $1)
         OR (s.scope = 'feature' AND s.target = $2))
     ORDER BY CASE s.scope WHEN 'global' THEN 0 WHEN 'installation' THEN 1 ELSE 2 END
     LIMIT 1
$$;

-- The age in seconds of the oldest event of a thread accepted by the
-- gateway but not processed yet (an edit that arrived before the trigger
-- counts too), however old; NULL when there is none: an answer waits for
-- it, so a context-builder backlog cannot make it miss what changed the
-- thread. The source's twin (the `message` event of an `app_mention`, or
-- the reverse) is the same message being created and changes nothing; the
-- answer's own receipt is left out.
CREATE FUNCTION pending_receipt_age(installation uuid, channel text, root text, own_receipt uuid, source_ts text)
RETURNS TABLE (age float8)
LANGUAGE sql STABLE AS $$
    SELECT extract(epoch FROM now() - min(r.received_at))::float8
      FROM event_receipts r
     WHERE r.installation_id = $1 AND r.channel_id = $2 AND r.thread_ts = $3
       AND r.state IN ('accepted', 'processing') AND r.id <> $4
       AND NOT coalesce(r.message_ts = $5 AND r.event_subtype IS NULL
                        AND r.event_type IN ('message', 'app_mention'), false)
$$;
