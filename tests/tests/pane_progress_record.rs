//! The assistant pane's progress record (migrations 0023, 0035), against a
//! real database: a `setStatus` call is recorded only by compare-and-set on
//! the thread's generation, so a publisher whose call may have crossed
//! another's learns it and calls again; a call Slack did not take keeps
//! what may show and is due again after Slack's wait; sweepers share due
//! threads without taking one twice; what a thread should show is its
//! question being read, then its decision's stage.

use std::time::Duration;

use threadline_domain::thinking::Stage;
use threadline_store::assistant::{
    Target, look_again, not_reading, not_taken, progress, reading, set_shown, take_due,
};
use threadline_store::testing::assistant::{due_in, hold};
use threadline_testkit::TestDb;
use uuid::Uuid;

const DM: &str = "D0PANE";
const TS: &str = "1700000000.000100";

/// The thread's progress record.
async fn read(db: &TestDb, inst: Uuid) -> threadline_store::assistant::Progress {
    progress(&db.pool, inst, DM, TS)
        .await
        .expect("reading the record")
        .expect("a pane thread")
}

/// A decision's model call, as the status shows it.
fn write(id: Uuid) -> Target {
    Target {
        id,
        stage: Stage::Write,
    }
}

async fn thread(db: &TestDb) -> Uuid {
    let inst = Uuid::now_v7();
    threadline_store::testing::assistant::insert_updated_ago(
        &db.pool,
        inst,
        DM,
        TS,
        Duration::ZERO,
    )
    .await
    .expect("thread");
    inst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_one_of_two_crossing_calls_is_recorded_and_the_other_learns_it() {
    let db = TestDb::new().await;
    let inst = thread(&db).await;
    let p = progress(&db.pool, inst, DM, TS)
        .await
        .expect("read")
        .expect("a pane thread");
    assert_eq!((p.live, p.shown), (None, None));
    // Two publishers read the same generation and both call Slack.
    let (a, b) = (write(Uuid::now_v7()), write(Uuid::now_v7()));
    assert!(
        set_shown(&db.pool, inst, DM, TS, p.generation, Some(a), 5.0)
            .await
            .expect("record")
    );
    assert!(
        !set_shown(&db.pool, inst, DM, TS, p.generation, Some(b), 5.0)
            .await
            .expect("record"),
        "the second record lost: its publisher calls again"
    );
    let now = progress(&db.pool, inst, DM, TS)
        .await
        .expect("read")
        .expect("thread");
    assert_eq!(now.shown, Some(a));
    assert_eq!(now.generation, p.generation + 1);
    // Cleared: nothing shows and nothing is due.
    assert!(
        set_shown(&db.pool, inst, DM, TS, now.generation, None, 5.0)
            .await
            .expect("record")
    );
    assert_eq!(
        progress(&db.pool, inst, DM, TS)
            .await
            .expect("read")
            .expect("thread")
            .shown,
        None
    );
    assert_eq!(
        due_in(&db.pool, DM, TS).await.expect("due"),
        None,
        "nothing of the publisher's shows: never due"
    );
    // A clear Slack did not take with nothing shown leaves nothing due.
    let p = read(&db, inst).await;
    assert!(
        not_taken(&db.pool, inst, DM, TS, p.generation, None, 5.0)
            .await
            .expect("recording")
    );
    assert_eq!(due_in(&db.pool, DM, TS).await.expect("due"), None);
    assert!(take_due(&db.pool, 10, 10.0).await.expect("due").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_slack_did_not_take_keeps_what_may_show_and_is_due_again() {
    let db = TestDb::new().await;
    let inst = thread(&db).await;
    let d = Target {
        id: Uuid::now_v7(),
        stage: Stage::Check,
    };
    let p = read(&db, inst).await;
    // A set that timed out may still land: recorded as possibly showing.
    assert!(
        not_taken(&db.pool, inst, DM, TS, p.generation, Some(d), 0.0)
            .await
            .expect("recording")
    );
    let p = read(&db, inst).await;
    assert_eq!(p.shown, Some(d));
    // A clear Slack refused for now (a 429) keeps it showing, due again
    // after the wait, never forgotten.
    assert!(
        not_taken(&db.pool, inst, DM, TS, p.generation, None, 0.0)
            .await
            .expect("recording")
    );
    let p = read(&db, inst).await;
    assert_eq!(p.shown, Some(d), "still shows as far as anyone knows");
    assert!(
        !p.confirmed,
        "the next look calls Slack whatever the record says"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A sweeper holding the row: another skips it at once, never waits.
    let held = hold(&db.pool, DM, TS).await.expect("lock");
    let other = tokio::time::timeout(Duration::from_secs(5), take_due(&db.pool, 10, 10.0))
        .await
        .expect("SKIP LOCKED: no wait")
        .expect("taking due threads");
    assert!(other.is_empty(), "{other:?}");
    held.rollback().await.expect("releasing the row");
    // One takes it and leases it; the next finds it leased.
    let first = take_due(&db.pool, 10, 10.0)
        .await
        .expect("taking due threads");
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].installation, inst);
    assert!(
        due_in(&db.pool, DM, TS)
            .await
            .expect("recording")
            .is_some_and(|s| s > 5.0)
    );
    assert!(
        take_due(&db.pool, 10, 10.0)
            .await
            .expect("taking due threads")
            .is_empty()
    );
    // A wait from Slack moves it on by that much.
    let p = read(&db, inst).await;
    assert!(
        not_taken(&db.pool, inst, DM, TS, p.generation, None, 30.0)
            .await
            .expect("recording")
    );
    assert!(
        due_in(&db.pool, DM, TS)
            .await
            .expect("recording")
            .is_some_and(|s| s > 25.0),
        "due after Slack's wait"
    );
    // Taken again and recorded: confirmed.
    let p = read(&db, inst).await;
    assert!(
        set_shown(&db.pool, inst, DM, TS, p.generation, Some(d), 5.0)
            .await
            .expect("recording")
    );
    assert!(read(&db, inst).await.confirmed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_that_gave_up_has_the_thread_looked_at_again_whatever_the_record_says() {
    let db = TestDb::new().await;
    let inst = thread(&db).await;
    let p = read(&db, inst).await;
    assert!(p.confirmed);
    look_again(&db.pool, inst, DM, TS, 0.0)
        .await
        .expect("look again");
    let q = read(&db, inst).await;
    assert!(!q.confirmed);
    assert!(q.generation > p.generation, "a record in flight loses");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        take_due(&db.pool, 10, 10.0)
            .await
            .expect("taking due threads")
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_shows_as_read_until_its_decision_and_then_at_the_decisions_stage() {
    let db = TestDb::new().await;
    let inst = thread(&db).await;
    let receipt = Uuid::now_v7();
    assert!(
        !reading(&db.pool, inst, "D0NOTPANE", TS, receipt, "Ev1")
            .await
            .expect("mark"),
        "no assistant thread: nothing marked, nothing queued"
    );
    assert!(
        threadline_store::testing::outbox::topics_and_msg_ids(&db.pool)
            .await
            .expect("outbox")
            .is_empty()
    );
    assert!(
        reading(&db.pool, inst, DM, TS, receipt, "Ev1")
            .await
            .expect("mark")
    );
    let queued = threadline_store::testing::outbox::topics_and_msg_ids(&db.pool)
        .await
        .expect("outbox");
    assert_eq!(queued.len(), 1);
    assert!(
        queued[0].1.starts_with(&format!("pane-read:{receipt}:")),
        "the publisher is asked to show it: {queued:?}"
    );
    let read_stage = Target {
        id: receipt,
        stage: Stage::Read,
    };
    assert_eq!(read(&db, inst).await.live, Some(read_stage));
    // Recorded as shown, the stage comes back with it.
    let p = read(&db, inst).await;
    assert!(
        set_shown(&db.pool, inst, DM, TS, p.generation, Some(read_stage), 5.0)
            .await
            .expect("record")
    );
    assert_eq!(read(&db, inst).await.shown, Some(read_stage));
    // Its decision exists, its answer waiting to be posted: checked.
    let d = Uuid::now_v7();
    threadline_store::testing::decisions::insert_proposed_decision(
        &db.pool,
        &threadline_store::testing::decisions::ProposedDecision {
            id: d,
            receipt_id: receipt,
            installation_id: inst,
            event_id: "Ev1",
            channel_id: DM,
            root_ts: TS,
            source_ts: TS,
            thread_version: 1,
            body_text: "an answer",
            output_hash: "h",
        },
    )
    .await
    .expect("decision");
    let checked = Target {
        id: d,
        stage: Stage::Check,
    };
    assert_eq!(read(&db, inst).await.live, Some(checked));
    // A newer question being read shows before it; one whose build came to
    // nothing shows no more.
    let newer = Uuid::now_v7();
    assert!(
        reading(&db.pool, inst, DM, TS, newer, "Ev2")
            .await
            .expect("mark")
    );
    assert_eq!(
        read(&db, inst).await.live.map(|t| (t.id, t.stage)),
        Some((newer, Stage::Read))
    );
    not_reading(&db.pool, inst, DM, TS, receipt)
        .await
        .expect("not the newer one's");
    assert_eq!(read(&db, inst).await.live.map(|t| t.id), Some(newer));
    not_reading(&db.pool, inst, DM, TS, newer)
        .await
        .expect("unmark");
    assert_eq!(read(&db, inst).await.live, Some(checked));
    // Its context built again while it is decided (a coalesced rebuild at
    // the same version makes no new decision): still checked, never read.
    assert!(
        reading(&db.pool, inst, DM, TS, receipt, "Ev1")
            .await
            .expect("mark")
    );
    assert_eq!(read(&db, inst).await.live, Some(checked));
    // Its decision discarded (the thread moved on) and its context built
    // again: read, until the new decision.
    threadline_store::testing::decisions::set_decision_status(&db.pool, d, "stale")
        .await
        .expect("stale");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        reading(&db.pool, inst, DM, TS, receipt, "Ev1")
            .await
            .expect("mark")
    );
    assert_eq!(read(&db, inst).await.live, Some(read_stage));
}
