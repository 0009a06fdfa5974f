//! The reply mechanism's records against a real database: a whole answer
//! Slack shows for an intent whose stream was interrupted is recorded, not
//! reported and dropped; an answer waiting for review is judged moved-on
//! in the transaction that discards it, so a change between the sweeper's
//! list and its discard decides what happens (a stale answer's thread is
//! reconsidered, never dropped as superseded).

use threadline_store::intents::{PostRecord, record_post};
use threadline_store::review::{MovedOn, discard_if_moved_on, moved_on};
use threadline_store::testing::{decisions, intents, outbox, threads};
use threadline_testkit::TestDb;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_seen_for_an_interrupted_intent_is_recorded() {
    let db = TestDb::new().await;
    let (intent, inst) = (Uuid::now_v7(), Uuid::now_v7());
    intents::insert_intent(
        &db.pool,
        &intents::IntentFixture {
            id: intent,
            installation_id: inst,
            event_id: "Ev1",
            action_kind: "thread_reply",
            receipt_id: Uuid::now_v7(),
            decision_id: Uuid::now_v7(),
            channel_id: "C1",
            root_ts: "1.1",
            body_hash: "h",
        },
        "interrupted",
        &intents::Standing {
            attempts: 1,
            ..Default::default()
        },
    )
    .await
    .expect("an interrupted intent");
    let r = record_post(&db.pool, intent, Uuid::now_v7(), "1.5", true)
        .await
        .expect("recorded");
    assert_eq!(r.outcome, PostRecord::Late);
    assert_eq!(
        intents::state_and_slack_ts(&db.pool, intent)
            .await
            .expect("intent"),
        ("sent".to_owned(), Some("1.5".to_owned())),
        "what Slack shows is recorded, never forgotten"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_waiting_for_review_is_judged_when_it_is_discarded() {
    let db = TestDb::new().await;
    let inst = Uuid::now_v7();
    // A question at 1.2 in thread 1.1 (version 3) waits for review; a newer
    // question 1.3 in the thread is listed as superseding it.
    threads::insert_thread(&db.pool, inst, "C1", "1.1", 3)
        .await
        .expect("thread");
    for ts in ["1.1", "1.2", "1.3"] {
        threads::insert_user_message(&db.pool, inst, "C1", ts, "1.1", "text")
            .await
            .expect("message");
    }
    threads::insert_turn(&db.pool, inst, "C1", "1.3", Uuid::now_v7(), "mention")
        .await
        .expect("turn");
    let id = Uuid::now_v7();
    decisions::insert_in_review(&db.pool, id, Uuid::now_v7(), inst, "Ev2", "an answer")
        .await
        .expect("decision");
    assert_eq!(moved_on(&db.pool, 10).await.expect("list"), vec![id]);
    // Before the sweeper discards it, the newer question is deleted (a new
    // version of the thread): the answer is stale now, not superseded.
    threads::set_message_deleted(&db.pool, inst, "C1", "1.3", true)
        .await
        .expect("deleted");
    threads::bump_thread_version(
        &mut db.pool.acquire().await.expect("conn"),
        inst,
        "C1",
        "1.1",
    )
    .await
    .expect("bumped");
    let mut tx = db.pool.begin().await.expect("tx");
    let discarded = discard_if_moved_on(&mut tx, id).await.expect("discard");
    tx.commit().await.expect("commit");
    assert_eq!(discarded.map(|(m, _)| m), Some(MovedOn::Stale));
    assert_eq!(
        decisions::decision_status(&db.pool, id)
            .await
            .expect("status")
            .0,
        "stale"
    );
    let queued = outbox::topics_and_msg_ids(&db.pool).await.expect("outbox");
    assert!(
        queued.iter().any(|(t, _)| t == "reconsider"),
        "its thread is reconsidered in the same transaction: {queued:?}"
    );
    // Judged again, nothing moves twice.
    let mut tx = db.pool.begin().await.expect("tx");
    assert_eq!(discard_if_moved_on(&mut tx, id).await.expect("again"), None);
    tx.commit().await.expect("commit");
}
