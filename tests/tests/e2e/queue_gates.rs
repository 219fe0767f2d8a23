//! Merge-queue gates a pull cannot bypass: the lander evaluates every pre-flight whatever it is
//! pinned to (one pinned to another runner is waited for, as that runner publishes it), and the gating workflows come from the base branch's tip, so a pull that deletes
//! or edits its pre-flight still meets the base's copy and is ejected by it.

use knotless_tests::{Runner, eventually};

use crate::flags;
use crate::queue::{entry, queue_of, queue_pull, queue_repo, settled};

#[test]
fn the_lander_waits_for_a_pre_flight_pinned_to_another_runner_and_takes_its_result() {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = "runners: [e2e-qg-one, e2e-qg-two]\npushers: [e2e-qg-two]\n";
    let (repo, _) = queue_repo(dir.path(), Some(record));
    repo.write(
        ".knotless/workflows/pinned.yml",
        "queue: first\nrunners: [e2e-qg-one]\nsteps:\n  - name: pinned\n    run: test ! -f bad.txt\n",
    );
    let base = repo.commit("a pinned pre-flight");
    queue_pull(&repo, 1, &base, "bad.txt", "bad\n");
    queue_pull(&repo, 2, &base, "good.txt", "good\n");
    let url = repo.url();
    let extra = ["--queue", "--force-shell"];
    let two = Runner::start(&dir.path().join("two"), &[flags("e2e-qg-two", &extra), vec![&url]].concat());
    // Alone, the lander waits: the pinned runner has published nothing.
    let waiting = eventually("the lander to wait for the pinned runner", || {
        let queue = queue_of(&two, &url);
        let first = queue["entries"].as_array()?.iter().find(|entry| entry["number"] == 1)?;
        let reason = first["reason"].as_str()?;
        reason.contains("waiting for pre-flight pinned on runner e2e-qg-one").then(|| queue.clone())
    });
    assert_eq!(entry(&waiting, 1)["state"], "waiting", "{waiting:#}");
    assert_eq!(repo.git(&["rev-parse", "main"]), base, "nothing landed unchecked: {waiting:#}");
    let one = Runner::start(&dir.path().join("one"), &[flags("e2e-qg-one", &extra), vec![&url]].concat());
    let queue = settled(&two, &url, 2);
    let bad = entry(&queue, 1);
    assert_eq!(bad["state"], "ejected", "{queue:#}");
    assert_eq!(bad["reason"], "pre-flight pinned failed on runner e2e-qg-one", "{queue:#}");
    let good = entry(&queue, 2);
    assert_eq!(good["state"], "merged", "{queue:#}");
    assert_eq!(repo.git(&["rev-parse", "main"]), good["batch"].as_str().unwrap_or_default());
    assert!(repo.git(&["ls-tree", "--name-only", "main"]).contains("good.txt"));
    // The pinned runner ran each pull's pre-flight once; the lander keeps a copy of each.
    let ran = |runner: &Runner| -> std::collections::BTreeSet<_> {
        let checks = runner.checks(&url, None);
        let pinned = checks.iter().filter(|check| check["workflow"] == "pinned" && check["event"] == "pull");
        let text = |value: &serde_json::Value| value.as_str().map(str::to_string);
        pinned.map(|check| (check["pull"].as_u64(), text(&check["runner_id"]), text(&check["status"]))).collect()
    };
    let expected: std::collections::BTreeSet<_> = [
        (Some(1), Some("e2e-qg-one".to_string()), Some("failure".to_string())),
        (Some(2), Some("e2e-qg-one".to_string()), Some("success".to_string())),
    ]
    .into();
    assert_eq!(ran(&one), expected);
    assert_eq!(ran(&two), expected);
    let pulls =
        one.checks(&url, None).into_iter().filter(|check| check["workflow"] == "pinned" && check["event"] == "pull");
    assert_eq!(pulls.count(), 2, "one run a pull");
}

#[test]
fn a_pull_that_deletes_its_pre_flight_is_still_gated_by_the_base() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, base) = queue_repo(dir.path(), None);
    repo.git(&["checkout", "-q", "-b", "draft-1", &base]);
    repo.remove(".knotless/workflows/pre.yml");
    repo.commit("drop the pre-flight");
    repo.git(&["checkout", "-q", "main"]);
    let head = queue_pull(&repo, 1, "draft-1", "preflight-fails", "x\n");
    assert_eq!(repo.git(&["rev-parse", "refs/queue/main/1"]), head);
    let url = repo.url();
    let runner = Runner::start(
        &dir.path().join("state"),
        &[flags("e2e-qg-drop", &["--queue", "--force-shell"]), vec![&url]].concat(),
    );
    let queue = settled(&runner, &url, 1);
    let pull = entry(&queue, 1);
    assert_eq!(pull["state"], "ejected", "{queue:#}");
    assert_eq!(pull["reason"], "pre-flight pre failed", "{queue:#}");
    assert_eq!(repo.git(&["rev-parse", "main"]), base, "main did not take the forbidden file");
}

#[test]
fn a_pull_that_weakens_its_pre_flight_runs_its_copy_as_a_pull_check_that_does_not_gate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, base) = queue_repo(dir.path(), None);
    repo.git(&["checkout", "-q", "-b", "draft-1", &base]);
    repo.write(
        ".knotless/workflows/pre.yml",
        "on: [queue, pull]\nqueue: first\nsteps:\n  - name: pre\n    run: 'true'\n",
    );
    repo.commit("weaken the pre-flight");
    repo.git(&["checkout", "-q", "main"]);
    queue_pull(&repo, 1, "draft-1", "preflight-fails", "x\n");
    let url = repo.url();
    let extra = ["--queue", "--pulls", "--force-shell"];
    let runner = Runner::start(&dir.path().join("state"), &[flags("e2e-qg-weak", &extra), vec![&url]].concat());
    let queue = settled(&runner, &url, 1);
    let pull = entry(&queue, 1);
    assert_eq!(pull["state"], "ejected", "{queue:#}");
    assert_eq!(pull["reason"], "pre-flight pre failed", "{queue:#}");
    assert_eq!(repo.git(&["rev-parse", "main"]), base);
    let checks = eventually("the pull's own copy to have run", || {
        let checks = runner.checks(&url, None);
        let pre: Vec<_> = checks.iter().filter(|c| c["workflow"] == "pre" && c["event"] == "pull").cloned().collect();
        (pre.len() == 2 && pre.iter().all(knotless_tests::is_final)).then_some(pre)
    });
    let statuses: Vec<_> = checks.iter().map(|c| c["status"].as_str().unwrap_or_default().to_string()).collect();
    assert!(statuses.contains(&"success".to_string()) && statuses.contains(&"failure".to_string()), "{checks:#?}");
}

#[test]
fn queueing_an_ejected_head_again_retries_its_pre_flights() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("flake-gone");
    let (repo, _) = queue_repo(dir.path(), None);
    let flaky = format!("queue: first\nsteps:\n  - name: flaky\n    run: test -f {}\n", marker.display());
    repo.write(".knotless/workflows/flaky.yml", &flaky);
    let base = repo.commit("a flaky pre-flight");
    let head = queue_pull(&repo, 1, &base, "one.txt", "one\n");
    let url = repo.url();
    let runner = Runner::start(
        &dir.path().join("state"),
        &[flags("e2e-qg-retry", &["--queue", "--force-shell"]), vec![&url]].concat(),
    );
    let queue = settled(&runner, &url, 1);
    assert_eq!(entry(&queue, 1)["reason"], "pre-flight flaky failed", "{queue:#}");
    assert_eq!(repo.git(&["rev-parse", "main"]), base);
    std::fs::write(&marker, "").expect("the flake goes");
    repo.git(&["update-ref", "refs/queue/main/1", &head]);
    runner.notify(&url);
    let queue = settled(&runner, &url, 2);
    let entries = queue["entries"].as_array().expect("entries");
    assert_eq!(entries[1]["head"], head.as_str(), "{queue:#}");
    assert_eq!(entries[1]["retry"], true, "{queue:#}");
    assert_eq!(entries[1]["state"], "merged", "{queue:#}");
    assert_eq!(repo.git(&["rev-parse", "main"]), entries[1]["batch"].as_str().expect("a batch"));
}

#[test]
fn a_batch_whose_check_passed_as_the_runner_stopped_is_not_recorded_failed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = dir.path().join("gate");
    let slow = format!(
        "on: [queue]\nsteps:\n  - name: wait\n    run: |\n      echo started\n      while [ ! -f '{}' ]; do sleep 0.05; done\n",
        gate.display()
    );
    let (repo, base) = crate::repo_with(dir.path(), &[("slow", &slow)]);
    repo.git(&["config", "receive.denyCurrentBranch", "updateInstead"]);
    queue_pull(&repo, 1, &base, "one.txt", "one\n");
    let url = repo.url();
    let state = dir.path().join("state");
    let args = [flags("e2e-qg-term", &["--queue", "--force-shell"]), vec![&url]].concat();
    let mut runner = Runner::start(&state, &args);
    eventually("the batch check to start", || {
        let checks = runner.checks(&url, None);
        let run = checks.iter().find(|c| c["event"] == "queue")?["run_id"].as_str()?.to_string();
        runner.run_log(&run).contains("/wait | started").then_some(())
    });
    runner.signal(nix::sys::signal::Signal::SIGTERM);
    eventually("the runner to stop taking work", || runner.stderr().contains("stopping: no new work").then_some(()));
    std::fs::write(&gate, "").expect("open the gate");
    assert!(runner.wait().success());
    let queue = crate::queue::queue_of(&runner, &url);
    let batch = &queue["batches"][0];
    assert_eq!(batch["status"], "stopped", "{queue:#}");
    let checks = runner.checks(&url, None);
    assert!(checks.iter().any(|c| c["event"] == "queue" && c["status"] == "success"), "{checks:#?}");
    drop(runner);
    let again = Runner::start(&state, &args);
    let queue = settled(&again, &url, 1);
    assert_eq!(entry(&queue, 1)["state"], "merged", "{queue:#}");
    let batch_checks = again.checks(&url, None).into_iter().filter(|c| c["event"] == "queue").count();
    assert_eq!(batch_checks, 1, "the passing check was reused");
}

#[test]
fn queueing_again_retries_a_pre_flight_pinned_to_another_runner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("flake-gone");
    let record = "runners: [e2e-qg-rone, e2e-qg-rtwo]\npushers: [e2e-qg-rtwo]\n";
    let (repo, _) = queue_repo(dir.path(), Some(record));
    let flaky = format!(
        "queue: first\nrunners: [e2e-qg-rone]\nsteps:\n  - name: flaky\n    run: test -f {}\n",
        marker.display()
    );
    repo.write(".knotless/workflows/flaky.yml", &flaky);
    let base = repo.commit("a flaky pinned pre-flight");
    let head = queue_pull(&repo, 1, &base, "one.txt", "one\n");
    let url = repo.url();
    let extra = ["--queue", "--force-shell"];
    let one = Runner::start(&dir.path().join("one"), &[flags("e2e-qg-rone", &extra), vec![&url]].concat());
    let two = Runner::start(&dir.path().join("two"), &[flags("e2e-qg-rtwo", &extra), vec![&url]].concat());
    let queue = settled(&two, &url, 1);
    assert_eq!(entry(&queue, 1)["reason"], "pre-flight flaky failed on runner e2e-qg-rone", "{queue:#}");
    std::fs::write(&marker, "").expect("the flake goes");
    repo.git(&["update-ref", "refs/queue/main/1", &head]);
    two.notify(&url);
    // The lander took the failed check away and waits for a new one.
    eventually("the lander to wait for the retry", || {
        let queue = queue_of(&two, &url);
        let retry = queue["entries"].as_array()?.get(1)?.clone();
        let reason = retry["reason"].as_str()?;
        reason.contains("waiting for pre-flight flaky on runner e2e-qg-rone").then_some(())
    });
    one.notify(&url);
    let queue = settled(&two, &url, 2);
    let entries = queue["entries"].as_array().expect("entries");
    assert_eq!(entries[1]["retry"], true, "{queue:#}");
    assert_eq!(entries[1]["state"], "merged", "{queue:#}");
    let runs: Vec<_> = one
        .checks(&url, None)
        .into_iter()
        .filter(|check| check["workflow"] == "flaky" && check["event"] == "pull")
        .map(|check| check["status"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(runs.len(), 2, "the pinned runner ran it again: {runs:?}");
    assert!(runs.contains(&"failure".to_string()) && runs.contains(&"success".to_string()), "{runs:?}");
}

#[test]
fn a_batch_workflow_pinned_away_from_the_lander_ejects_naming_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = "runners: [e2e-qg-bone, e2e-qg-btwo]\npushers: [e2e-qg-btwo]\n";
    let (repo, _) = queue_repo(dir.path(), Some(record));
    repo.write(
        ".knotless/workflows/pinned.yml",
        "on: [queue]\nrunners: [e2e-qg-bone]\nsteps:\n  - name: pinned\n    run: exit 1\n",
    );
    let base = repo.commit("a pinned batch workflow");
    queue_pull(&repo, 1, &base, "one.txt", "one\n");
    let url = repo.url();
    let two = Runner::start(
        &dir.path().join("two"),
        &[flags("e2e-qg-btwo", &["--queue", "--force-shell"]), vec![&url]].concat(),
    );
    let queue = settled(&two, &url, 1);
    let pull = entry(&queue, 1);
    assert_eq!(pull["state"], "ejected", "{queue:#}");
    let reason = pull["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("pinned.yml is pinned to runners [e2e-qg-bone]"), "{reason}");
    assert!(reason.contains("add e2e-qg-btwo to its runners:"), "{reason}");
    assert_eq!(repo.git(&["rev-parse", "main"]), base, "the pull did not land unchecked");
}

/// The two-runner example (the first of `runners` runs the pull runs, the second lands), a
/// pre-flight `both` that is also a pull check, and pull 1 off main; gives its head.
fn two_runner_pull(dir: &std::path::Path, [pulls, lands]: [&str; 2]) -> (knotless_tests::Repo, String) {
    let record = format!("runners: [{pulls}, {lands}]\npushers: [{lands}]\n");
    let (repo, _) = queue_repo(dir, Some(&record));
    repo.write(".knotless/workflows/both.yml", "on: [pull]\nqueue: first\nsteps:\n  - name: both\n    run: 'true'\n");
    let base = repo.commit("a pre-flight that is a pull check too");
    repo.git(&["checkout", "-q", "-b", "pull-1", &base]);
    repo.write("one.txt", "one\n");
    let head = repo.commit("pull 1");
    repo.git(&["checkout", "-q", "main"]);
    repo.git(&["update-ref", "refs/pulls/1/head", &head]);
    (repo, head)
}

/// The pull checks of `both` a runner holds.
fn both_pull_checks(runner: &Runner, url: &str) -> Vec<serde_json::Value> {
    let checks = runner.checks(url, None).into_iter();
    checks.filter(|check| check["workflow"] == "both" && check["event"] == "pull").collect()
}

#[test]
fn a_pre_flight_the_pull_runner_ran_on_the_same_merge_is_taken_not_run_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, head) = two_runner_pull(dir.path(), ["e2e-qg-pone", "e2e-qg-ptwo"]);
    let url = repo.url();
    let extra = ["--queue", "--pulls", "--force-shell"];
    let one = Runner::start(&dir.path().join("one"), &[flags("e2e-qg-pone", &extra), vec![&url]].concat());
    let both = |runner: &Runner| both_pull_checks(runner, &url);
    eventually("the pull run", || both(&one).first().filter(|check| knotless_tests::is_final(check)).cloned());
    repo.git(&["update-ref", "refs/queue/main/1", &head]);
    one.notify(&url);
    eventually("the pull run to be published", || {
        (!repo.git(&["for-each-ref", "refs/checks"]).is_empty()).then_some(())
    });
    let two = Runner::start(&dir.path().join("two"), &[flags("e2e-qg-ptwo", &extra), vec![&url]].concat());
    let queue = settled(&two, &url, 1);
    assert_eq!(entry(&queue, 1)["state"], "merged", "{queue:#}");
    let ran = both(&one);
    assert_eq!(ran.len(), 1, "{ran:#?}");
    let kept = both(&two);
    assert_eq!(kept.len(), 1, "the lander ran it again: {kept:#?}");
    assert_eq!(kept[0]["run_id"], ran[0]["run_id"], "the lander keeps the pull run's check: {kept:#?}");
    assert_eq!(kept[0]["runner_id"], "e2e-qg-pone");
    let preflights = entry(&queue, 1)["preflights"].as_array().cloned().unwrap_or_default();
    assert!(preflights.contains(&ran[0]["run_id"]), "its pre-flights: {queue:#}");
}

/// The lander that sees a queued pull before the pull runner has made its pull run waits for
/// that runner's run instead of racing it: one check of the workflow on the merge, the pull
/// runner's.
#[test]
fn the_lander_that_sees_a_pull_first_waits_for_the_pull_runners_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, head) = two_runner_pull(dir.path(), ["e2e-qg-wone", "e2e-qg-wtwo"]);
    repo.git(&["update-ref", "refs/queue/main/1", &head]);
    let url = repo.url();
    let extra = ["--queue", "--pulls", "--force-shell"];
    // The lander first: the pull runner is not started yet.
    let two = Runner::start(&dir.path().join("two"), &[flags("e2e-qg-wtwo", &extra), vec![&url]].concat());
    eventually("the lander to wait for the pull run", || {
        let queue = queue_of(&two, &url);
        let reason = queue["entries"].as_array()?.first()?["reason"].as_str()?.to_string();
        reason.contains("waiting for runner e2e-qg-wone's pull run of pre-flight both").then_some(())
    });
    let one = Runner::start(&dir.path().join("one"), &[flags("e2e-qg-wone", &extra), vec![&url]].concat());
    let queue = settled(&two, &url, 1);
    assert_eq!(entry(&queue, 1)["state"], "merged", "{queue:#}");
    let both = |runner: &Runner| both_pull_checks(runner, &url);
    let ran = both(&one);
    assert_eq!(ran.len(), 1, "{ran:#?}");
    let kept = both(&two);
    assert_eq!(kept.len(), 1, "the lander ran it too: {kept:#?}");
    assert_eq!(kept[0]["run_id"], ran[0]["run_id"], "the lander keeps the pull run's check: {kept:#?}");
    assert_eq!(kept[0]["runner_id"], "e2e-qg-wone");
}
