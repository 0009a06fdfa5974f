//! Service logs are kept per run, and old runs are cleaned away.

use std::time::{Duration, SystemTime};

use threadline_tests::{LOG_RUNS_KEPT, clean_old_runs, log_dir};

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
    clean_old_runs(&root, &current, now);
    let mut left: Vec<String> = std::fs::read_dir(&root)
        .expect("root")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    let mut want: Vec<String> = (0..LOG_RUNS_KEPT - 1)
        .map(|i| format!("recent-{i:02}"))
        .collect();
    want.push("current".into());
    want.push("not-a-run.txt".into());
    want.sort();
    assert_eq!(
        left, want,
        "the current run (however old) and the newest others"
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
