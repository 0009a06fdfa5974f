-- One database role per service (DESIGN §8), each granted what its store
-- statements need and nothing else, so a compromised process holds only
-- its own service's rights. Above all the gateway, the public surface,
-- cannot read any installation's sealed token: it may write the token
-- columns (the OAuth install stores the tokens it sealed to a public key)
-- but not select them, and its environment holds no key that opens them.
-- The migrator (the database owner, which the CLI and migrations use)
-- keeps every right; nobody else may change the schema.
--
-- UPDATE is granted column by column on the tables whose rows carry what
-- another service acts on (decisions: the answer the publisher posts;
-- installations: the workspace and the tokens a row stands for): each
-- role may set only the columns its statements set. A row a statement
-- locks (SELECT … FOR UPDATE / FOR SHARE) needs UPDATE on one column of
-- it, which those grants give. scripts/check-grants.py (make lint)
-- EXPLAINs every statement of each service as its role.
--
-- Roles are cluster-wide: they are created here only when missing (by
-- CloudNativePG's managed roles in a deployment, with their passwords; a
-- local or test cluster gets them from here, logging in by its own auth
-- rules), and many databases of one cluster share them. Grants are per
-- database and made here. A later migration that adds a table or a
-- statement grants what it needs itself (no default privileges: a new
-- table is nobody's until granted; the rule and its checks are in
-- migrations/README.md); `tests/tests/roles.rs` fails on a table no role
-- was considered for, and on any privilege its checked-in matrix lacks.

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['threadline_gateway', 'threadline_context_builder',
                             'threadline_inference', 'threadline_publisher'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I LOGIN', r);
            EXCEPTION
                -- another database of the cluster migrating at the same time
                WHEN duplicate_object OR unique_violation THEN NULL;
                WHEN insufficient_privilege THEN
                    RAISE EXCEPTION 'role % does not exist and % may not create it: create the service roles first (deploy/: CloudNativePG managed roles)', r, current_user;
            END;
        END IF;
    END LOOP;
END
$$;

-- No schema changes but the owner's: nobody else creates in `public`
-- (PostgreSQL 15 already revokes this; older servers granted it to all),
-- and no temporary tables either.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
DO $$
BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'not the owner of database %: TEMPORARY stays granted to PUBLIC', current_database();
END
$$;
GRANT USAGE ON SCHEMA public TO threadline_gateway, threadline_context_builder,
    threadline_inference, threadline_publisher;

-- Every service checks at start that the schema is current (sqlx's table
-- of applied migrations; absent only where the files are applied by hand,
-- as scripts/sqlx-prepare.sh does).
DO $$
BEGIN
    IF to_regclass('_sqlx_migrations') IS NOT NULL THEN
        GRANT SELECT ON _sqlx_migrations TO threadline_gateway, threadline_context_builder,
            threadline_inference, threadline_publisher;
    END IF;
END
$$;

-- The audit log is append-only for everyone (its triggers refuse UPDATE,
-- DELETE and TRUNCATE; no service is granted them either). Each service
-- appends its own records, and the triggers on decisions and reply
-- intents append in the name of whoever changes them.
GRANT INSERT ON audit_log TO threadline_gateway, threadline_context_builder,
    threadline_inference, threadline_publisher;
-- Inference copies a decision's channel pseudonym from the record of an
-- earlier decision of the same event (decisions::claim).
GRANT SELECT ON audit_log TO threadline_inference;
-- The context-builder's records of a receipt's end and of an admission
-- return the receipts recorded (threads::finish, budgets::mark_admitted).
GRANT SELECT (receipt_id) ON audit_log TO threadline_context_builder;

-- ---------------------------------------------------------------- gateway
-- Installations: it resolves a delivery's installation (lookup) and
-- registers an OAuth install (tokens::register, store_installed): INSERT
-- of the row and UPDATE of what a reinstall changes, tokens included (never
-- the workspace or app a row stands for), but SELECT only of the columns
-- that are not a token, so no statement of its role can read or copy one.
GRANT INSERT ON installations TO threadline_gateway;
GRANT UPDATE (enterprise_id, bot_user_id, bot_id, scopes, status, disabled_reason, updated_at,
              bot_token_sealed, bot_token_key_id, refresh_token_sealed, refresh_token_key_id,
              token_expires_at, refresh_lease_until, refresh_lease_holder, refresh_unknown_since)
    ON installations TO threadline_gateway;
DO $$
DECLARE
    cols text;
BEGIN
    SELECT string_agg(quote_ident(column_name), ', ' ORDER BY ordinal_position) INTO cols
      FROM information_schema.columns
     WHERE table_schema = 'public' AND table_name = 'installations'
       AND column_name NOT IN ('bot_token_sealed', 'refresh_token_sealed');
    EXECUTE format('GRANT SELECT (%s) ON installations TO threadline_gateway', cols);
END
$$;
-- Intake: receipts and their outbox rows in one commit, deduplicated by
-- the receipt's identity (receipts::insert_batch, count_duplicates);
-- undecodable signed bodies kept for replay; content-free rejections and
-- app rate-limit notices. The body it kept it need not read back.
GRANT SELECT, INSERT, UPDATE ON event_receipts TO threadline_gateway;
GRANT INSERT ON unparsed_events, rejections, app_rate_limit_notices TO threadline_gateway;
-- The outbox relay: leases, publishes and deletes rows, counting them in
-- the ledger (outbox::claim, settle, backlog).
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox TO threadline_gateway;
GRANT SELECT, INSERT, UPDATE ON outbox_ledger TO threadline_gateway;
-- The OAuth install's single-use state (oauth_states::begin, claim, and
-- the sweep of expired ones).
GRANT SELECT, INSERT, UPDATE, DELETE ON oauth_states TO threadline_gateway;
-- A review click: its verdict on the decision (locked, then moved to
-- approved or rejected, by whom and when: never its answer), the review
-- request it came from, the reviewers allowed, and the outbox row that
-- carries the verdict (review::decide).
GRANT SELECT ON decisions TO threadline_gateway;
GRANT UPDATE (status, reviewed_by, reviewed_at, updated_at) ON decisions TO threadline_gateway;
GRANT SELECT, UPDATE ON review_messages TO threadline_gateway;
GRANT SELECT ON review_settings, reply_intents TO threadline_gateway;

-- -------------------------------------------------------- context-builder
-- The thread store: threads, messages, facts, turns, a person's actions,
-- doubled messages, contexts and crossed answers (threads::*, actions::*).
GRANT SELECT, INSERT, UPDATE ON threads, thread_messages, message_facts, turns, person_actions,
    contexts, crossed_answers TO threadline_context_builder;
GRANT INSERT ON doubled_messages TO threadline_context_builder;
-- Receipts it finishes or fails (threads::finish, note_failure).
GRANT SELECT, UPDATE ON event_receipts TO threadline_context_builder;
-- Opens bot tokens for backfills and refreshes them under the lease in
-- the row; disables an installation whose refresh token Slack refused
-- (threadline_tenancy::tokens, threads::disable_installation).
GRANT SELECT ON installations TO threadline_context_builder;
GRANT UPDATE (status, disabled_reason, updated_at, bot_token_sealed, bot_token_key_id,
              refresh_token_sealed, refresh_token_key_id, token_expires_at, refresh_lease_until,
              refresh_lease_holder, refresh_unknown_since)
    ON installations TO threadline_context_builder;
-- Channel kinds learnt, read budgets, late events and their policies,
-- assistant-pane threads, and the policies a trigger is checked against.
GRANT SELECT, INSERT, UPDATE ON channel_kinds, slack_read_budgets, assistant_threads
    TO threadline_context_builder;
GRANT SELECT, INSERT ON late_events TO threadline_context_builder;
GRANT SELECT ON late_event_policies, channel_policies, installation_policies
    TO threadline_context_builder;
-- Admission: budgets, parked and admitted work, the model tokens spent,
-- and the over-budget note, a decision of threadline's own with its
-- outbox row (budgets::*), which supersedes an older note of its own.
GRANT SELECT, INSERT, UPDATE, DELETE ON tenant_work TO threadline_context_builder;
GRANT SELECT, INSERT, UPDATE ON tenant_budgets, budget_notes TO threadline_context_builder;
GRANT SELECT, INSERT ON decisions TO threadline_context_builder;
GRANT UPDATE (status, status_reason, updated_at) ON decisions TO threadline_context_builder;
GRANT SELECT ON tenant_tokens, reply_intents TO threadline_context_builder;
GRANT INSERT ON outbox TO threadline_context_builder;

-- -------------------------------------------------------------- inference
-- Decisions: claimed under a lease, settled with the proposal and its
-- outbox row, the streamed text released into the row (decisions::*,
-- streams::release_text); kill switches (engaged_switch); the installation
-- and channel policies that shape the answer, and the pane's thread. It
-- calls no Slack API, so it holds no token key, and may read no token
-- column of an installation.
GRANT SELECT, INSERT ON decisions TO threadline_inference;
GRANT UPDATE (status, status_reason, action_kind, review_reasons, model_config_id, provider, fallback,
              prompt_tokens, completion_tokens, output_hash, body_text, body_blocks, lease_until,
              lease_message_seq, stream_text, stream_label, updated_at)
    ON decisions TO threadline_inference;
GRANT INSERT ON outbox TO threadline_inference;
GRANT SELECT ON kill_switches, channel_policies, installation_policies, assistant_threads
    TO threadline_inference;
DO $$
DECLARE
    cols text;
BEGIN
    SELECT string_agg(quote_ident(column_name), ', ' ORDER BY ordinal_position) INTO cols
      FROM information_schema.columns
     WHERE table_schema = 'public' AND table_name = 'installations'
       AND column_name NOT IN ('bot_token_sealed', 'bot_token_key_id', 'refresh_token_sealed',
                               'refresh_token_key_id', 'refresh_lease_until', 'refresh_lease_holder',
                               'refresh_unknown_since', 'token_expires_at');
    EXECUTE format('GRANT SELECT (%s) ON installations TO threadline_inference', cols);
END
$$;
-- Settling frees the request's place and counts the model tokens spent
-- (budgets::free, decisions::settle).
GRANT SELECT, DELETE ON tenant_work TO threadline_inference;
GRANT SELECT, INSERT, UPDATE ON tenant_tokens TO threadline_inference;

-- -------------------------------------------------------------- publisher
-- Reply intents and their posts, budgets per channel, crossed answers,
-- review requests, streams (intents::*, streams::*, review::*); decisions it
-- moves (held, discarded, reconsidered: their status, never their
-- answer) with their outbox rows.
GRANT SELECT, INSERT, UPDATE ON reply_intents, post_budgets TO threadline_publisher;
GRANT SELECT, INSERT, UPDATE, DELETE ON review_messages TO threadline_publisher;
GRANT SELECT, INSERT ON crossed_answers TO threadline_publisher;
GRANT SELECT, UPDATE ON assistant_threads, turns TO threadline_publisher;
GRANT SELECT ON decisions TO threadline_publisher;
GRANT UPDATE (status, status_reason, updated_at) ON decisions TO threadline_publisher;
GRANT INSERT ON outbox TO threadline_publisher;
-- Opens bot tokens to post and refreshes them (threadline_tenancy::tokens).
GRANT SELECT ON installations TO threadline_publisher;
GRANT UPDATE (status, disabled_reason, updated_at, bot_token_sealed, bot_token_key_id,
              refresh_token_sealed, refresh_token_key_id, token_expires_at, refresh_lease_until,
              refresh_lease_holder, refresh_unknown_since)
    ON installations TO threadline_publisher;
-- What it re-checks before posting: the thread's version and messages,
-- unprocessed receipts (pending_receipt_age), kill switches, policies.
GRANT SELECT ON threads, thread_messages, event_receipts, kill_switches, channel_kinds,
    channel_policies, installation_policies, review_settings TO threadline_publisher;
-- A claim locks its thread's row FOR SHARE so no content change commits
-- in between (intents::check_and_claim, record_posts); PostgreSQL asks
-- UPDATE on one column of a row locked so. `updated_at` is the column
-- whose change does least.
GRANT UPDATE (updated_at) ON threads TO threadline_publisher;

-- Identity columns: whoever inserts a row draws its id.
DO $$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT * FROM (VALUES
            ('audit_log', 'threadline_gateway'), ('audit_log', 'threadline_context_builder'),
            ('audit_log', 'threadline_inference'), ('audit_log', 'threadline_publisher'),
            ('outbox', 'threadline_gateway'), ('outbox', 'threadline_context_builder'),
            ('outbox', 'threadline_inference'), ('outbox', 'threadline_publisher'),
            ('rejections', 'threadline_gateway'), ('app_rate_limit_notices', 'threadline_gateway'),
            ('tenant_work', 'threadline_context_builder')) AS v(tab, who) LOOP
        EXECUTE format('GRANT USAGE ON SEQUENCE %s TO %I',
                       pg_get_serial_sequence(s.tab, CASE s.tab WHEN 'tenant_work' THEN 'seq' ELSE 'id' END),
                       s.who);
    END LOOP;
END
$$;
