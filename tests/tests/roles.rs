//! One database role per service (DESIGN §8,
//! `migrations/0029_service_roles.sql`; the outbox relay's, 0031): each
//! role logs in and is refused
//! what it must not read or write. Above all the gateway's role cannot
//! read any installation's sealed token (and its environment holds no key
//! that opens one: `crates/gateway/src/config.rs` refuses private keys,
//! `crates/gateway/tests/oauth.rs` installs with public keys only). That
//! the roles suffice for the work each service does is proven by every
//! test that starts a `Stack`, whose services log in as these roles.

use secrecy::SecretString;
use sqlx::postgres::PgPoolOptions;
use threadline_store::testing::roles::{
    SERVICE_ROLES, attempt, privileges, tables_no_service_may_touch,
};
use threadline_store::tokens::Registration;
use threadline_tenancy::installations::{Tokens, register};
use threadline_tenancy::secrets::{TokenKeys, TokenSealer};
use threadline_testkit::TestDb;

const GATEWAY: &str = "threadline_gateway";
const RELAY: &str = "threadline_relay";
const CONTEXT_BUILDER: &str = "threadline_context_builder";
const INFERENCE: &str = "threadline_inference";
const PUBLISHER: &str = "threadline_publisher";

/// Whether `r` is PostgreSQL's refusal for want of a privilege (42501).
fn refused(r: &sqlx::Result<()>) -> bool {
    matches!(r, Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501"))
}

async fn login(db: &TestDb, role: &str) -> sqlx::PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url_as(role))
        .await
        .unwrap_or_else(|e| panic!("logging in as {role}: {e}"))
}

/// An installation with a bot and a refresh token, sealed as an OAuth
/// install seals them (to the public key).
async fn installed(db: &TestDb) -> uuid::Uuid {
    let keys =
        TokenKeys::parse(&SecretString::from(TokenKeys::generate_entry("k1"))).expect("keys");
    let sealer = TokenSealer::parse(&keys.public_entries()).expect("public keys");
    let (id, _) = register(
        &db.pool,
        &sealer,
        &Registration {
            app_id: "A0ROLES",
            team_id: Some("T0ROLES"),
            enterprise_id: None,
            org_wide: false,
            bot_user_id: "U0BOT",
            bot_id: "B0BOT",
            scopes: &["chat:write".to_owned()],
        },
        &Tokens {
            bot_token: &SecretString::from("xoxb-roles-1".to_owned()),
            refresh_token: Some(&SecretString::from("xoxe-1-roles".to_owned())),
            expires_in: Some(43_200),
        },
    )
    .await
    .expect("installed");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_role_is_refused_what_it_must_not_touch() {
    let db = TestDb::new().await;
    let inst = installed(&db).await;
    let everyone = SERVICE_ROLES;
    // (roles, statement): each must be refused for want of a privilege.
    let refusals: Vec<(&[&str], String)> = vec![
        // The tokens: the gateway may not read them in any form, nor copy
        // them elsewhere in the row; inference not even their key ids.
        // (The relay is a member of the gateway's role: refused the same.)
        (
            &[GATEWAY, RELAY, INFERENCE],
            "SELECT bot_token_sealed FROM installations".into(),
        ),
        (
            &[GATEWAY, RELAY, INFERENCE],
            "SELECT refresh_token_sealed FROM installations".into(),
        ),
        (
            &[GATEWAY, RELAY, INFERENCE],
            "SELECT * FROM installations".into(),
        ),
        // The gateway keeps our own new reply in the thread store
        // (receipts::insert_batch) but reads no message's text back, nor
        // changes a message already kept or a thread's version.
        (&[GATEWAY, RELAY], "SELECT text FROM thread_messages".into()),
        (
            &[GATEWAY, RELAY],
            "UPDATE thread_messages SET deleted = true".into(),
        ),
        (&[GATEWAY, RELAY], "UPDATE threads SET version = 0".into()),
        (
            &[GATEWAY, RELAY],
            format!(
                "UPDATE installations SET bot_id = encode(bot_token_sealed, 'hex') WHERE id = '{inst}'"
            ),
        ),
        (
            &[GATEWAY, RELAY],
            "SELECT id FROM installations WHERE bot_token_sealed IS NOT NULL".into(),
        ),
        (
            &[INFERENCE],
            "SELECT bot_token_key_id FROM installations".into(),
        ),
        (
            &[INFERENCE],
            format!("UPDATE installations SET status = 'disabled' WHERE id = '{inst}'"),
        ),
        // Installations are never deleted, and nobody changes the schema.
        (
            &everyone,
            format!("DELETE FROM installations WHERE id = '{inst}'"),
        ),
        (&everyone, "CREATE TABLE intruder (a int)".into()),
        (&everyone, "CREATE TEMP TABLE intruder (a int)".into()),
        (
            &everyone,
            "ALTER TABLE decisions ADD COLUMN intruder int".into(),
        ),
        (&everyone, "DROP TABLE outbox".into()),
        (
            &everyone,
            "CREATE INDEX intruder ON threads (version)".into(),
        ),
        (&everyone, "TRUNCATE thread_messages".into()),
        // The audit log is appended to, never rewritten or erased.
        (&everyone, "DELETE FROM audit_log".into()),
        (&everyone, "UPDATE audit_log SET outcome = 'changed'".into()),
        (&everyone, "TRUNCATE audit_log".into()),
        // Message text: the gateway stores deliveries and reads none; the
        // body of an undecodable delivery is written once and kept from
        // every service (an operator replays it).
        (
            &[GATEWAY, RELAY, INFERENCE],
            "SELECT * FROM thread_messages".into(),
        ),
        (&everyone, "SELECT body FROM unparsed_events".into()),
        (
            &[GATEWAY, RELAY, INFERENCE, PUBLISHER],
            "SELECT * FROM contexts".into(),
        ),
        // Other services' state.
        (
            &[GATEWAY, RELAY, INFERENCE],
            "UPDATE threads SET version = version + 1".into(),
        ),
        (
            &[PUBLISHER],
            "UPDATE threads SET version = version + 1".into(),
        ),
        (
            &[GATEWAY, RELAY, CONTEXT_BUILDER, INFERENCE],
            "DELETE FROM reply_intents".into(),
        ),
        (
            &[GATEWAY, RELAY, INFERENCE],
            "UPDATE reply_intents SET state = 'sent'".into(),
        ),
        (
            &[CONTEXT_BUILDER, INFERENCE, PUBLISHER],
            "SELECT * FROM oauth_states".into(),
        ),
        // The outbox: every service queues in it, only the relay reads,
        // leases and deletes what is queued (the public gateway neither).
        (
            &[GATEWAY, CONTEXT_BUILDER, INFERENCE, PUBLISHER],
            "DELETE FROM outbox".into(),
        ),
        (
            &[GATEWAY, CONTEXT_BUILDER, INFERENCE, PUBLISHER],
            "SELECT payload FROM outbox".into(),
        ),
        (
            &[GATEWAY, CONTEXT_BUILDER, INFERENCE, PUBLISHER],
            "UPDATE outbox SET next_attempt_at = now()".into(),
        ),
        (
            &[GATEWAY, CONTEXT_BUILDER, INFERENCE, PUBLISHER],
            "UPDATE outbox_ledger SET published_total = 0".into(),
        ),
        (
            &[INFERENCE, PUBLISHER],
            "UPDATE event_receipts SET state = 'done'".into(),
        ),
        (
            &[PUBLISHER],
            "INSERT INTO decisions (id) VALUES (gen_random_uuid())".into(),
        ),
        // An answer is inference's to write: a review click sets the
        // verdict, a hold or a discard the status, never the text that is
        // posted (a grant of the whole row would allow it).
        (
            &[GATEWAY, RELAY, CONTEXT_BUILDER, PUBLISHER],
            "UPDATE decisions SET body_text = 'rewritten'".into(),
        ),
        (
            &[GATEWAY, RELAY, CONTEXT_BUILDER, PUBLISHER],
            "UPDATE decisions SET body_blocks = '[]'::jsonb, output_hash = 'x'".into(),
        ),
        (
            &[GATEWAY, RELAY, CONTEXT_BUILDER, PUBLISHER],
            "UPDATE decisions SET channel_id = 'C0ELSEWHERE'".into(),
        ),
        (
            &[CONTEXT_BUILDER, INFERENCE, PUBLISHER],
            "UPDATE decisions SET reviewed_by = 'U0NOBODY'".into(),
        ),
        // An agent's Messages tab: what the person looks at is the
        // context-builder's to record, whether it was greeted the
        // publisher's.
        (
            &[CONTEXT_BUILDER],
            "UPDATE agent_views SET greeted = true".into(),
        ),
        (
            &[PUBLISHER],
            "UPDATE agent_views SET context_channel_id = 'C0ELSEWHERE'".into(),
        ),
        // Nobody moves an installation to another workspace or app.
        (
            &everyone,
            format!("UPDATE installations SET team_id = 'T0EVIL' WHERE id = '{inst}'"),
        ),
        (
            &everyone,
            format!("UPDATE installations SET app_id = 'A0EVIL' WHERE id = '{inst}'"),
        ),
        // Kill switches and policies are the operator's.
        (&everyone, "UPDATE kill_switches SET engaged = false".into()),
        (&everyone, "DELETE FROM kill_switches".into()),
        (
            &everyone,
            "UPDATE installation_policies SET updated_at = now()".into(),
        ),
        (&everyone, "DELETE FROM channel_policies".into()),
    ];
    // What each role may do, so that a refusal above is the privilege's
    // doing, not a login that failed.
    let allowed: [(&str, String); 11] = [
        (RELAY, "DELETE FROM outbox".into()),
        (RELAY, "UPDATE outbox_ledger SET published_total = 0".into()),
        // (the gateway's rights, through its membership)
        (
            RELAY,
            format!("SELECT id, app_id, bot_token_key_id FROM installations WHERE id = '{inst}'"),
        ),
        (
            GATEWAY,
            format!("SELECT id, app_id, bot_token_key_id FROM installations WHERE id = '{inst}'"),
        ),
        (
            GATEWAY,
            format!(
                "UPDATE installations SET bot_token_sealed = '\\x00', updated_at = now() WHERE id = '{inst}'"
            ),
        ),
        (
            CONTEXT_BUILDER,
            "SELECT bot_token_sealed FROM installations".into(),
        ),
        (
            PUBLISHER,
            "SELECT refresh_token_sealed FROM installations".into(),
        ),
        (INFERENCE, "SELECT id, status FROM installations".into()),
        (PUBLISHER, "SELECT 1 FROM threads FOR SHARE".into()),
        (
            GATEWAY,
            "UPDATE decisions SET status = 'approved', reviewed_by = 'U1', reviewed_at = now(), \
             updated_at = now()"
                .into(),
        ),
        (
            INFERENCE,
            "UPDATE decisions SET body_text = 'answer', updated_at = now()".into(),
        ),
    ];
    let mut pools = std::collections::BTreeMap::new();
    for role in everyone {
        pools.insert(role, login(&db, role).await);
    }
    for (role, statement) in &allowed {
        let r = attempt(&pools[role], statement).await;
        assert!(r.is_ok(), "{role} may run {statement:?}: {r:?}");
    }
    let mut let_through = Vec::new();
    for (roles, statement) in &refusals {
        for role in *roles {
            let r = attempt(&pools[role], statement).await;
            if !refused(&r) {
                let_through.push(format!("{role}: {statement} -> {r:?}"));
            }
        }
    }
    assert!(
        let_through.is_empty(),
        "not refused for want of a privilege:\n{}",
        let_through.join("\n")
    );
}

/// A table a migration adds is nobody's until granted; this names the
/// tables no service role was given anything on, which must be exactly
/// those only an operator (the owner, through the CLI) touches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_table_no_service_touches_is_an_operators() {
    let db = TestDb::new().await;
    let untouched = tables_no_service_may_touch(&db.pool).await.expect("tables");
    assert_eq!(
        untouched,
        ["audit_timeline", "workspace_pauses"].map(String::from),
        "a table no service role may touch: grant it in its migration, or list it here as the operator's"
    );
}

/// The checked-in matrix of what the service roles hold: every table,
/// column, sequence, function, schema and database privilege granted to
/// them, and their attributes. A migration that widens (or narrows) a grant
/// changes it, so the change is seen and reviewed here, not found in
/// production; `THREADLINE_BLESS=1` rewrites the file after a deliberate
/// change (migrations/README.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_roles_hold_exactly_the_checked_in_privileges() {
    const FILE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/service-role-privileges.txt"
    );
    let db = TestDb::new().await;
    let now = privileges(&db.pool).await.expect("privileges");
    // Whatever the file says: no role is more than a login.
    for role in SERVICE_ROLES {
        let attrs = now
            .iter()
            .find(|l| l.starts_with(&format!("role {role}: login=")))
            .unwrap_or_else(|| panic!("{role} does not exist"));
        for a in [
            "superuser",
            "createrole",
            "createdb",
            "bypassrls",
            "replication",
        ] {
            assert!(attrs.contains(&format!(" {a}=f")), "{role} is {a}: {attrs}");
        }
    }
    // One membership only: the relay holds the gateway's rights (it is
    // the gateway binary, recording what it drains through the intake) and
    // the outbox's consumption on top. Any other (the gateway a member of
    // the relay, a service of another's) would hand a role rights it was
    // not granted.
    let members: Vec<&str> = now
        .iter()
        .filter(|l| l.contains(": member of "))
        .map(String::as_str)
        .collect();
    assert_eq!(
        members,
        ["role threadline_relay: member of threadline_gateway"],
        "a service role is a member of another role"
    );

    let header = "# What the service roles hold in a database migrated to the latest migration\n\
                  # (tests/tests/roles.rs compares it; migrations/README.md). Regenerate after a\n\
                  # deliberate grant change: THREADLINE_BLESS=1 cargo nextest run -p threadline-tests --test roles\n";
    if std::env::var("THREADLINE_BLESS").as_deref() == Ok("1") {
        std::fs::write(FILE, format!("{header}{}\n", now.join("\n"))).expect("writing the matrix");
        return;
    }
    let text = std::fs::read_to_string(FILE).unwrap_or_default();
    let want: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    let got: std::collections::BTreeSet<&str> = now.iter().map(String::as_str).collect();
    let mut diff: Vec<String> = want.difference(&got).map(|l| format!("- {l}")).collect();
    diff.extend(got.difference(&want).map(|l| format!("+ {l}")));
    assert!(
        diff.is_empty(),
        "the service roles' privileges differ from tests/fixtures/service-role-privileges.txt \
         (- only in the file, + only in the database):\n{}\n\
         A deliberate grant change? Regenerate the file and review its diff: \
         THREADLINE_BLESS=1 cargo nextest run -p threadline-tests --test roles",
        diff.join("\n")
    );
}

/// End to end: a real gateway process, given what a
/// deployment gives it (its role, the public keys), completes an OAuth
/// install against slack-sim's `oauth.v2.access`; the token it stored opens
/// with nothing in its environment and cannot be read on its role, while
/// on the publisher's role and with the publisher's key it opens and
/// speaks for the workspace's bot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_process_installs_a_token_it_can_neither_read_nor_open() {
    use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
    use secrecy::ExposeSecret as _;
    use serde_json::json;
    use threadline_tenancy::secrets::{Sealed, SymmetricKeys, token_aad};
    use threadline_tests::{free_port, sim_ctl, spawn_service_at, spawn_slack_sim};

    let db = TestDb::new().await;
    let sim = spawn_slack_sim(5, 0.01).await;
    let team = sim_ctl(&sim, "teams", json!({"name": "Acme"})).await["id"]
        .as_str()
        .expect("team")
        .to_owned();
    let app = sim_ctl(&sim, "apps", json!({"name": "Threadline"})).await;
    let private = TokenKeys::generate_entry("k1");
    let keys = TokenKeys::parse(&SecretString::from(private.clone())).expect("keys");
    let port = free_port();
    let gw = format!("http://127.0.0.1:{port}");
    let prefix = threadline_testkit::unique_prefix();
    let env: Vec<(&str, String)> = vec![
        ("DATABASE_URL", db.url_as(GATEWAY)),
        ("NATS_URL", threadline_testkit::nats_url()),
        ("THREADLINE_BUS_PREFIX", prefix.clone()),
        // (the public gateway: the relay runs apart, on its own role)
        ("THREADLINE_RELAY_ENABLED", "false".to_owned()),
        (
            "SLACK_SIGNING_SECRET",
            threadline_testkit::slack::TEST_SECRET.to_owned(),
        ),
        ("SLACK_API_URL", format!("{}/api/", sim.base_url)),
        (
            "SLACK_AUTHORIZE_URL",
            format!("{}/oauth/v2/authorize", sim.base_url),
        ),
        (
            "SLACK_CLIENT_ID",
            app["client_id"].as_str().expect("client id").to_owned(),
        ),
        (
            "SLACK_CLIENT_SECRET",
            app["client_secret"].as_str().expect("secret").to_owned(),
        ),
        (
            "THREADLINE_OAUTH_REDIRECT_URL",
            format!("{gw}/slack/oauth/callback"),
        ),
        ("THREADLINE_TOKEN_PUBLIC_KEYS", keys.public_entries()),
        ("THREADLINE_AUDIT_KEY", "5a".repeat(32)),
    ];
    let gateway =
        spawn_service_at("threadline-gateway", "THREADLINE_GATEWAY_ADDR", port, &env).await;

    // A person installs the app: /slack/install, Slack's consent, the
    // callback, which exchanges the code with oauth.v2.access.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let r = http
        .get(format!("{gw}/slack/install"))
        .send()
        .await
        .expect("install");
    assert_eq!(r.status(), 302);
    let consent = r.headers()[LOCATION].to_str().expect("location").to_owned();
    let cookie = r.headers()[SET_COOKIE]
        .to_str()
        .expect("cookie")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();
    let r = http
        .get(format!("{consent}&team={team}"))
        .send()
        .await
        .expect("consent");
    assert_eq!(r.status(), 303);
    let callback = r.headers()[LOCATION].to_str().expect("callback").to_owned();
    let r = http
        .get(callback)
        .header(COOKIE, cookie)
        .send()
        .await
        .expect("callback");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let inst = threadline_store::testing::installations::first_id(&db.pool)
        .await
        .expect("the install stored an installation");

    // On the gateway's role the token cannot be read, by the very
    // statement the services read it with.
    let gateway_pool = login(&db, GATEWAY).await;
    let read = threadline_store::tokens::read(&gateway_pool, inst).await;
    assert!(
        matches!(&read, Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501")),
        "the gateway's role read the token row: {:?}",
        read.as_ref().map(|_| "a row")
    );
    // On the publisher's role it can, and the publisher's key opens it.
    let publisher_pool = login(&db, PUBLISHER).await;
    let stored = threadline_store::tokens::read(&publisher_pool, inst)
        .await
        .expect("the publisher reads the token")
        .expect("the installation");
    let sealed = Sealed {
        key_id: stored.bot_key_id.expect("sealed"),
        bytes: stored.bot_sealed.expect("sealed"),
    };
    let aad = token_aad(&inst, "bot");
    // Nothing in the gateway's environment opens it: no private key is
    // there, and no value read as one (a public key taken for a private
    // one, any value as a symmetric key) opens it.
    assert!(!env.iter().any(|(k, _)| *k == "THREADLINE_TOKEN_KEYS"));
    for (name, value) in &env {
        let mut tries = vec![value.clone()];
        // (a public entry's key taken for a private one: `id:x25519pub:hex`)
        tries.extend(value.split(',').filter_map(|e| {
            e.split_once(':').map(|(id, rest)| {
                format!("{id}:x25519:{}", rest.rsplit(':').next().unwrap_or(rest))
            })
        }));
        for t in &tries {
            if let Ok(k) = TokenKeys::parse(&SecretString::from(t.clone())) {
                assert!(k.open(&sealed, &aad).is_err(), "{name} opened the token");
            }
            if let Ok(k) = SymmetricKeys::parse_setting(&SecretString::from(t.clone()), name) {
                assert!(
                    k.open_bytes(&sealed, &aad).is_err(),
                    "{name} opened the token"
                );
            }
        }
    }
    let token = keys.open(&sealed, &aad).expect("the private key opens it");
    let who: serde_json::Value = http
        .post(format!("{}/api/auth.test", sim.base_url))
        .bearer_auth(token.expose_secret())
        .send()
        .await
        .expect("auth.test")
        .json()
        .await
        .expect("json");
    assert_eq!(who["ok"], true, "{who}");
    assert_eq!(who["team_id"].as_str(), Some(team.as_str()), "{who}");
    gateway.kill().await;
    let js = async_nats::jetstream::new(
        async_nats::connect(threadline_testkit::nats_url())
            .await
            .expect("nats"),
    );
    threadline_testkit::delete_streams(&js, &prefix).await;
}

/// The public gateway's role only adds to the outbox: a gateway that would
/// relay on it (reading, leasing and deleting what every service queued)
/// refuses to start and names the role it needs; on the relay's role the
/// same process starts and relays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_on_the_gateways_role_refuses_to_start_and_on_its_own_relays() {
    let db = TestDb::new().await;
    let env = |role: &str| {
        vec![
            ("DATABASE_URL", db.url_as(role)),
            ("NATS_URL", threadline_testkit::nats_url()),
            ("THREADLINE_BUS_PREFIX", threadline_testkit::unique_prefix()),
            ("SLACK_SIGNING_SECRET", "x".to_owned()),
            ("THREADLINE_AUDIT_KEY", "5a".repeat(32)),
            ("THREADLINE_RELAY_ENABLED", "true".to_owned()),
        ]
    };
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        tokio::process::Command::new(threadline_testkit::bin_path("threadline-gateway"))
            .env_clear()
            .envs(env(GATEWAY))
            .env(
                "THREADLINE_GATEWAY_ADDR",
                format!("127.0.0.1:{}", threadline_tests::free_port()),
            )
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("a relay on the gateway's role exits at once instead of relaying")
    .expect("run");
    assert!(
        !out.status.success(),
        "a relay on the gateway's role started"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("THREADLINE_RELAY_ENABLED") && err.contains(RELAY),
        "{err}"
    );
    let relay = threadline_tests::spawn_gateway(&env(RELAY)).await;
    relay.kill().await;
}
