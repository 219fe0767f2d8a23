//! Retention: a daemon prunes at its start what is older than `--retention` (checks with their
//! logs and outputs, unused cache archives, mirrors of repositories no longer watched) and keeps
//! the newest check of each workflow on each branch.

use std::time::{Duration, SystemTime};

use knotless_tests::{Runner, eventually};

use crate::{flags, repo_with};

const PASS: &str = "steps:\n  - name: one\n    run: echo one\n";

fn age(path: &std::path::Path, days: u64) {
    let then = SystemTime::now() - Duration::from_secs(days * 86_400);
    std::fs::File::open(path).and_then(|file| file.set_modified(then)).expect("set the time");
}

#[test]
fn a_start_prunes_what_is_older_than_the_retention_and_keeps_the_newest_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, commit) = repo_with(dir.path(), &[("pass", PASS)]);
    let url = repo.url();
    let state = dir.path().join("state");
    let args = [flags("e2e-retention", &["--retention", "30d"]), vec![url.as_str()]].concat();
    let runner = Runner::start(&state, &args);
    let checks = runner.final_checks(&url, &commit, 1);
    drop(runner);
    let key = checks[0]["repository_key"].as_str().expect("a key").to_string();
    let run_id = checks[0]["run_id"].as_str().expect("a run id").to_string();
    let folder = state.join("checks").join(&key);

    // An older run of the same workflow, 40 days ago, with its log and outputs.
    let mut old = checks[0].clone();
    let forty_days_ago =
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("now").as_millis() as u64 - 40 * 86_400_000;
    old["run_id"] = "pass-old".into();
    old["queued_at"] = forty_days_ago.into();
    old["finished_at"] = (forty_days_ago + 1000).into();
    std::fs::write(folder.join("pass-old.json"), serde_json::to_vec(&old).expect("json")).expect("write");
    std::fs::write(folder.join("pass-old.log"), "[one] one\n").expect("write");
    let outputs = state.join("outputs").join(&key).join("pass-old");
    std::fs::create_dir_all(&outputs).expect("mkdir");
    std::fs::write(outputs.join("report.txt"), "old").expect("write");
    // A cache archive last used 40 days ago, and the mirror of a repository no longer watched.
    let cache = state.join("caches").join(&key).join("pass/trusted/target-0.tar");
    std::fs::create_dir_all(cache.parent().expect("folder")).expect("mkdir");
    std::fs::write(&cache, "archive").expect("write");
    age(&cache, 40);
    let gone = state.join("mirrors/gone-0123abcd.git");
    std::fs::create_dir_all(&gone).expect("mkdir");
    std::fs::write(gone.join("FETCH_HEAD"), "").expect("write");
    age(&gone.join("FETCH_HEAD"), 40);
    age(&gone, 40);
    let watched_mirror = state.join("mirrors").join(format!("{key}.git"));
    age(&watched_mirror, 40);

    let runner = Runner::start(&state, &args);
    eventually("the pruning to log", || runner.stderr().contains("pruned 1 check(s)").then_some(()));
    assert!(runner.stderr().contains("1 cache archive(s) and 1 mirror(s)"), "{}", runner.stderr());
    assert!(!folder.join("pass-old.json").exists() && !folder.join("pass-old.log").exists());
    assert!(!outputs.exists() && !cache.exists() && !gone.exists());
    assert!(watched_mirror.exists(), "a watched repository's mirror stays");
    let listed = runner.checks(&url, None);
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert_eq!(listed[0]["run_id"], run_id.as_str(), "the newest check stays");
}

#[test]
fn a_retention_that_is_not_a_duration_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (value, why) in [("soon", "soon is not a duration"), ("10m", "shorter than an hour")] {
        let output =
            knotless_tests::knotless_run(&["--retention", value, "--state", &dir.path().display().to_string()])
                .output()
                .expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("--retention") && stderr.contains(why), "{stderr}");
    }
}
