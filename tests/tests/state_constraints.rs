//! DESIGN §4: the state machines in `domain` and the database's check
//! constraints name the same states, so neither can store or expect a state
//! the other does not know.

use std::collections::BTreeSet;

use threadline_domain::state::{
    DecisionStatus, InstallationStatus, IntentState, Machine, ReceiptState, ReviewRequestState,
    WorkState,
};
use threadline_testkit::TestDb;

/// The quoted names in a `CHECK (col IN ('a', 'b'))` constraint (Postgres
/// renders it as `= ANY (ARRAY['a'::text, ...])`).
async fn allowed(db: &TestDb, constraint: &str) -> BTreeSet<String> {
    let def = threadline_store::testing::server::constraint_definition(&db.pool, constraint)
        .await
        .unwrap_or_else(|e| panic!("constraint {constraint}: {e}"));
    let names: BTreeSet<String> = def
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(!names.is_empty(), "{constraint} names no state: {def}");
    names
}

fn states<M: Machine>() -> BTreeSet<String> {
    M::ALL.iter().map(|s| s.as_str().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_machines_and_the_check_constraints_name_the_same_states() {
    let db = TestDb::new().await;
    assert_eq!(
        allowed(&db, "event_receipts_state_check").await,
        states::<ReceiptState>()
    );
    assert_eq!(
        allowed(&db, "decisions_status_check").await,
        states::<DecisionStatus>()
    );
    assert_eq!(
        allowed(&db, "reply_intents_state_check").await,
        states::<IntentState>()
    );
    assert_eq!(
        allowed(&db, "review_messages_state_check").await,
        states::<ReviewRequestState>()
    );
    assert_eq!(
        allowed(&db, "installations_status_check").await,
        states::<InstallationStatus>()
    );
    assert_eq!(
        allowed(&db, "tenant_work_state_check").await,
        states::<WorkState>()
    );
}
