//! One database role per service (DESIGN §8,
//! `migrations/0029_service_roles.sql`): each role logs in and is refused
//! what it must not read or write. Above all the gateway's role cannot
//! read any installation's sealed token (and its environment holds no key
//! that opens one: `crates/gateway/src/config.rs` refuses private keys,
//! `crates/gateway/tests/oauth.rs` installs with public keys only). That
//! the roles suffice for the work each service does is proven by every
//! test that starts a `Stack`, whose services log in as these roles.

use secrecy::SecretString;
use sqlx::postgres::PgPoolOptions;
use threadline_store::testing::roles::{SERVICE_ROLES, attempt, tables_no_service_may_touch};
use threadline_store::tokens::Registration;
use threadline_tenancy::installations::{Tokens, register};
use threadline_tenancy::secrets::{TokenKeys, TokenSealer};
use threadline_testkit::TestDb;

const GATEWAY: &str = "threadline_gateway";
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
        (
            &[GATEWAY, INFERENCE],
            "SELECT bot_token_sealed FROM installations".into(),
        ),
        (
            &[GATEWAY, INFERENCE],
            "SELECT refresh_token_sealed FROM installations".into(),
        ),
        (&[GATEWAY, INFERENCE], "SELECT * FROM installations".into()),
        (
            &[GATEWAY],
            format!(
                "UPDATE installations SET bot_id = encode(bot_token_sealed, 'hex') WHERE id = '{inst}'"
            ),
        ),
        (
            &[GATEWAY],
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
            &[GATEWAY, INFERENCE],
            "SELECT * FROM thread_messages".into(),
        ),
        (&everyone, "SELECT body FROM unparsed_events".into()),
        (
            &[GATEWAY, INFERENCE, PUBLISHER],
            "SELECT * FROM contexts".into(),
        ),
        // Other services' state.
        (
            &[GATEWAY, INFERENCE],
            "UPDATE threads SET version = version + 1".into(),
        ),
        (
            &[PUBLISHER],
            "UPDATE threads SET version = version + 1".into(),
        ),
        (
            &[GATEWAY, CONTEXT_BUILDER, INFERENCE],
            "DELETE FROM reply_intents".into(),
        ),
        (
            &[GATEWAY, INFERENCE],
            "UPDATE reply_intents SET state = 'sent'".into(),
        ),
        (
            &[CONTEXT_BUILDER, INFERENCE, PUBLISHER],
            "SELECT * FROM oauth_states".into(),
        ),
        (
            &[CONTEXT_BUILDER, INFERENCE, PUBLISHER],
            "DELETE FROM outbox".into(),
        ),
        (
            &[INFERENCE, PUBLISHER],
            "UPDATE event_receipts SET state = 'done'".into(),
        ),
        (
            &[PUBLISHER],
            "INSERT INTO decisions (id) VALUES (gen_random_uuid())".into(),
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
    let allowed: [(&str, String); 6] = [
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
