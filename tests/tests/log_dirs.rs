//! Service logs are kept per run, and old runs are cleaned away.

use std::time::{Duration, SystemTime};

use threadline_tests::{LOG_RUNS_KEPT, OWNER_FILE, clean_old_runs, log_dir};

fn touch_dir(path: &std::path::Path, at: SystemTime) {
    std::fs::create_dir_all(path).expect("dir");
    std::fs::File::open(path)
        .and_then(|f| f.set_modified(at))
        .expect("set mtime");
}

#[test]
fn runs_older_than_a_day_and_beyond_the_newest_kept_are_removed() {
    let root = std::env::temp_dir().join(format!("threadline-log-clean-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let now = SystemTime::now();
    let current = root.join("current");
    touch_dir(&current, now - Duration::from_secs(3 * 24 * 3600));
    // Two old runs, then more recent ones than are kept.
    touch_dir(&root.join("old-1"), now - Duration::from_secs(25 * 3600));
    touch_dir(&root.join("old-2"), now - Duration::from_secs(40 * 3600));
    for i in 0..LOG_RUNS_KEPT + 2 {
        touch_dir(
            &root.join(format!("recent-{i:02}")),
            now - Duration::from_secs(60 * (i as u64 + 1)),
        );
    }
    std::fs::write(root.join("not-a-run.txt"), "x").expect("file");
    // Old folders kept: one whose owner still runs (this test), one with a
    // log written a minute ago; removed: one whose owner is gone.
    let week = Duration::from_secs(7 * 24 * 3600);
    let owned = root.join("owned-live");
    std::fs::create_dir_all(&owned).expect("dir");
    std::fs::write(owned.join(OWNER_FILE), std::process::id().to_string()).expect("owner");
    touch_dir(&owned, now - week);
    let dead = root.join("owned-dead");
    std::fs::create_dir_all(&dead).expect("dir");
    std::fs::write(dead.join(OWNER_FILE), "4194304999").expect("owner");
    std::fs::File::options()
        .append(true)
        .open(dead.join(OWNER_FILE))
        .and_then(|f| f.set_modified(now - week))
        .expect("owner mtime");
    touch_dir(&dead, now - week);
    let active = root.join("active");
    std::fs::create_dir_all(&active).expect("dir");
    std::fs::write(active.join("svc.log"), "x").expect("log");
    touch_dir(&active, now - week);
    std::fs::File::options()
        .append(true)
        .open(active.join("svc.log"))
        .and_then(|f| f.set_modified(now - Duration::from_secs(30)))
        .expect("log mtime");
    clean_old_runs(&root, &current, now);
    let mut left: Vec<String> = std::fs::read_dir(&root)
        .expect("root")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    // "active" is the newest of the others: the newest LOG_RUNS_KEPT - 1
    // others are it and the first recent ones.
    let mut want: Vec<String> = (0..LOG_RUNS_KEPT - 2)
        .map(|i| format!("recent-{i:02}"))
        .collect();
    want.push("active".into());
    want.push("owned-live".into());
    want.push("current".into());
    want.push("not-a-run.txt".into());
    want.sort();
    assert_eq!(
        left, want,
        "the current run and a live owner's (however old), and the newest others by their last log"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn the_log_folder_is_the_runs_own() {
    let dir = log_dir();
    assert!(dir.is_dir());
    assert_eq!(
        dir.parent().and_then(|p| p.file_name()),
        Some(std::ffi::OsStr::new("threadline-logs"))
    );
    // Under nextest, every test process of one run shares the folder.
    if let Ok(id) = std::env::var("NEXTEST_RUN_ID") {
        assert_eq!(
            dir.file_name(),
            Some(std::ffi::OsStr::new(&format!("nextest-{id}")[..]))
        );
    }
    assert_eq!(log_dir(), dir, "made once per process");
}
