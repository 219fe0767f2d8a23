//! Merge-queue gates a pull cannot bypass: the lander evaluates every pre-flight whatever it is
//! pinned to, and the gating workflows come from the base branch's tip, so a pull that deletes
//! or edits its pre-flight still meets the base's copy and is ejected by it.

use knotless_tests::{Runner, eventually};

use crate::flags;
use crate::queue::{entry, queue_pull, queue_repo, settled};

#[test]
fn a_pre_flight_pinned_to_another_runner_is_never_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = "runners: [e2e-qg-one, e2e-qg-two]\npushers: [e2e-qg-two]\n";
    let (repo, _) = queue_repo(dir.path(), Some(record));
    repo.write(
        ".knotless/workflows/pinned.yml",
        "queue: first\nrunners: [e2e-qg-one]\nsteps:\n  - name: pinned\n    run: exit 1\n",
    );
    let base = repo.commit("a pinned pre-flight");
    queue_pull(&repo, 1, &base, "one.txt", "one\n");
    let url = repo.url();
    let two = Runner::start(
        &dir.path().join("two"),
        &[flags("e2e-qg-two", &["--queue", "--force-shell"]), vec![&url]].concat(),
    );
    let queue = settled(&two, &url, 1);
    let pull = entry(&queue, 1);
    assert_eq!(pull["state"], "ejected", "{queue:#}");
    let reason = pull["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("pinned.yml is pinned to runners [e2e-qg-one]"), "{reason}");
    assert!(reason.contains("runner e2e-qg-two lands"), "{reason}");
    assert_eq!(repo.git(&["rev-parse", "main"]), base, "the pull did not land unchecked");
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
        runner.run_log(&run).contains("[wait] started").then_some(())
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
