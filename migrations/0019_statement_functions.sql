-- Two checks that several statements make, defined once in the schema so
-- that every statement can name them in its text (statements are checked
-- at build time, so their text is fixed; see crates/store). Both are SQL
-- functions whose body is one expression, which the planner inlines into
-- the calling statement: no call overhead, the same plan as the subquery
-- written out.

-- The first engaged kill switch covering an installation (as text) and a
-- feature, as `scope[:target]`, or NULL: global first, then the
-- installation, then the feature. Used by the inference service before
-- and after a model call and by the publisher's claim and fence.
CREATE FUNCTION engaged_switch(installation text, feature text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (SELECT CASE WHEN s.target = '' THEN s.scope ELSE s.scope || ':' || s.target END
              FROM kill_switches s
             WHERE s.engaged
               AND (s.scope = 'global'
                 OR (s.scope = 'installation' AND s.target = installation)
                 OR (s.scope = 'feature' AND s.target = feature))
             ORDER BY CASE s.scope WHEN 'global' THEN 0 WHEN 'installation' THEN 1 ELSE 2 END
             LIMIT 1)
$$;

-- The age in seconds of the oldest event of a thread accepted by the
-- gateway but not processed yet (an edit that arrived before the trigger
-- counts too), however old, or NULL: an answer waits for it, so a
-- context-builder backlog cannot make it miss what changed the thread.
-- The source's twin (the `message` event of an `app_mention`, or the
-- reverse) is the same message being created and changes nothing; the
-- answer's own receipt is left out.
CREATE FUNCTION pending_receipt_age(installation uuid, channel text, root text, own_receipt uuid, source_ts text)
RETURNS float8
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (SELECT extract(epoch FROM now() - min(r.received_at))::float8
              FROM event_receipts r
             WHERE r.installation_id = installation AND r.channel_id = channel AND r.thread_ts = root
               AND r.state IN ('accepted', 'processing') AND r.id <> own_receipt
               AND NOT coalesce(r.message_ts = source_ts AND r.event_subtype IS NULL
                                AND r.event_type IN ('message', 'app_mention'), false))
$$;
