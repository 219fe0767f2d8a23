//! Restarts: a runner killed mid-run is finished as `error` at its next start (from the check
//! records, even with `state.json` moved away) and its executor's and cache store's leftovers
//! are swept; a check that could not be written is written once it can be; SIGTERM finishes
//! started runs, cancels waiting ones, and exits.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use knotless_tests::{Runner, bin, by_workflow, eventually, fake_executor};
use nix::sys::signal::Signal;

use crate::{flags, repo_with};

/// A step that says it started and waits for `gate` to exist.
fn gated(gate: &Path) -> String {
    format!(
        "steps:\n  - name: wait\n    run: |\n      echo started\n      while [ ! -f '{}' ]; do sleep 0.05; done\n      echo gate open\n",
        gate.display()
    )
}

/// Waits until a run of `rev` says its step started, and returns its run id. Any of the
/// commit's runs may be the one started: `checks` lists runs queued together in no fixed order.
fn wait_until_started(runner: &Runner, url: &str, rev: &str) -> String {
    eventually("the step to start", || {
        runner.checks(url, Some(rev)).iter().find_map(|check| {
            let run = check["run_id"].as_str()?;
            runner.run_log(run).contains("/wait | started").then(|| run.to_string())
        })
    })
}

/// The live sessions the fake's ledger names (a JSON array).
fn ledger_sessions(ledger: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(ledger).expect("the ledger");
    serde_json::from_str::<Vec<serde_json::Value>>(&text).expect("the ledger is a JSON array")
}

fn is_empty_dir(path: &Path) -> bool {
    std::fs::read_dir(path).map(|mut entries| entries.next().is_none()).unwrap_or(true)
}

#[test]
fn a_runner_killed_mid_run_ends_the_check_as_error_and_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = dir.path().join("gate-never-opened");
    let (repo, commit) = repo_with(dir.path(), &[("long", &gated(&gate))]);
    let url = repo.url();
    let state = dir.path().join("state");
    let args = [flags("e2e-kill", &[]), vec![url.as_str()]].concat();
    let runner = Runner::start(&state, &args);
    wait_until_started(&runner, &url, &commit);
    assert!(!is_empty_dir(&state.join("work/e2e-kill")), "the session's folder exists while it runs");
    runner.signal(Signal::SIGKILL);
    drop(runner);
    let runner = Runner::start(&state, &args);
    let checks = runner.final_checks(&url, &commit, 1);
    assert_eq!(checks[0]["status"], "error");
    assert_eq!(checks[0]["cause"], "the runner stopped during this run");
    eventually("the sweep to log", || runner.stderr().contains("startup sweep").then_some(()));
    // The killed runner's executor, seeing its stdin end, stops its session; if it was still
    // doing so when the new executor swept (its owner alive), the sweep left it to it.
    eventually("the dead run's folder to be removed", || is_empty_dir(&state.join("work/e2e-kill")).then_some(()));
    let again = runner.checks(&url, Some(&commit));
    assert_eq!(again.len(), 1, "the killed run is not started again");
}

#[test]
fn a_runner_killed_mid_run_under_the_fake_executor_leaves_no_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = dir.path().join("gate-never-opened");
    let (repo, commit) = repo_with(dir.path(), &[("long", &gated(&gate))]);
    let wrapper = dir.path().join("fake-ok");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec '{}' --mode ok \"$@\"\n", bin("knotless-executor-fake").display()),
    )
    .expect("write the wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let ledger = dir.path().join("ledger");
    let work = dir.path().join("fake-work");
    let (wrapper, ledger_option, work_option) = (
        wrapper.to_string_lossy().into_owned(),
        format!("ledger={}", ledger.display()),
        format!("work-dir={}", work.display()),
    );
    let url = repo.url();
    let args = [
        vec!["--executor-plugin", wrapper.as_str(), "--executor-option", ledger_option.as_str()],
        vec![
            "--executor-option",
            work_option.as_str(),
            "--runner-id",
            "e2e-fake",
            "--poll",
            "3600",
            "--disk-floor",
            "0",
        ],
        vec![url.as_str()],
    ]
    .concat();
    let state = dir.path().join("state");
    let runner = Runner::start(&state, &args);
    wait_until_started(&runner, &url, &commit);
    assert_eq!(ledger_sessions(&ledger).len(), 1, "the ledger names the live session");
    runner.signal(Signal::SIGKILL);
    drop(runner);
    let runner = Runner::start(&state, &args);
    let checks = runner.final_checks(&url, &commit, 1);
    assert_eq!(checks[0]["status"], "error");
    eventually("the sweep to log", || runner.stderr().contains("startup sweep").then_some(()));
    assert!(ledger_sessions(&ledger).is_empty(), "the ledger is empty after the sweep");
    assert!(is_empty_dir(&work.join("e2e-fake")), "the fake's session folder is gone");
}

#[test]
fn sigterm_finishes_the_started_run_cancels_the_waiting_one_and_exits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = dir.path().join("gate");
    let (repo, commit) = repo_with(dir.path(), &[("first", &gated(&gate)), ("second", &gated(&gate))]);
    let url = repo.url();
    let mut runner = Runner::start(
        &dir.path().join("state"),
        &[flags("e2e-term", &["--concurrency", "1"]), vec![url.as_str()]].concat(),
    );
    wait_until_started(&runner, &url, &commit);
    runner.signal(Signal::SIGTERM);
    eventually("the runner to stop taking work", || runner.stderr().contains("stopping: no new work").then_some(()));
    std::fs::write(&gate, "").expect("open the gate");
    let status = runner.wait();
    assert!(status.success(), "{status:?}");
    assert!(runner.stderr().contains("handed over"));
    let checks = runner.checks(&url, Some(&commit));
    let statuses: Vec<_> =
        ["first", "second"].iter().map(|name| by_workflow(&checks, name)["status"].clone()).collect();
    assert!(
        statuses.contains(&"success".into()) && statuses.contains(&"cancelled".into()),
        "{statuses:?} {:?}",
        checks.iter().map(|c| c["cause"].clone()).collect::<Vec<_>>()
    );
}

/// The run a handover cancelled before it started runs again at the next start, with a new
/// check that names it; the run that finished is not run again; a run dropped with its need is
/// queued again waiting for it.
#[test]
fn runs_dropped_at_a_handover_run_again_at_the_next_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = dir.path().join("gate");
    let needing = "needs: [second]\nsteps:\n  - name: go\n    run: echo third\n";
    let (repo, commit) =
        repo_with(dir.path(), &[("first", &gated(&gate)), ("second", &gated(&gate)), ("third", needing)]);
    let url = repo.url();
    let state = dir.path().join("state");
    let args = [flags("e2e-requeue", &["--concurrency", "1"]), vec![url.as_str()]].concat();
    let mut runner = Runner::start(&state, &args);
    let started = wait_until_started(&runner, &url, &commit);
    runner.signal(Signal::SIGTERM);
    eventually("the runner to stop taking work", || runner.stderr().contains("stopping: no new work").then_some(()));
    std::fs::write(&gate, "").expect("open the gate");
    assert!(runner.wait().success());
    let checks = runner.checks(&url, Some(&commit));
    let cancelled: Vec<&serde_json::Value> = checks.iter().filter(|check| check["status"] == "cancelled").collect();
    let dropped: Vec<String> =
        cancelled.iter().map(|check| check["run_id"].as_str().expect("a run id").to_string()).collect();
    let dropped_workflows: std::collections::BTreeSet<String> =
        cancelled.iter().filter_map(|check| check["workflow"].as_str().map(str::to_string)).collect();
    // `third` waited for `second`, and one of `first` and `second` for the one slot.
    assert_eq!(dropped.len(), 2, "{checks:#?}");
    assert!(dropped_workflows.contains("third"), "{checks:#?}");
    drop(runner);

    let runner = Runner::start(&state, &args);
    let checks = runner.final_checks(&url, &commit, 5);
    let again: Vec<&serde_json::Value> = checks.iter().filter(|check| check["reruns"].is_string()).collect();
    assert_eq!(again.len(), 2, "{checks:#?}");
    for check in &again {
        assert_eq!(check["status"], "success", "{check:#}");
        assert!(dropped.iter().any(|run| check["reruns"] == run.as_str()), "{check:#}");
        assert_ne!(check["reruns"], started.as_str(), "the run that finished is not run again");
    }
    let workflows: std::collections::BTreeSet<String> =
        again.iter().filter_map(|check| check["workflow"].as_str().map(str::to_string)).collect();
    assert_eq!(workflows, dropped_workflows, "{checks:#?}");
    assert!(runner.stderr().contains("dropped at the last stop runs again as"), "{}", runner.stderr());
    // A third start queues nothing again.
    drop(runner);
    let runner = Runner::start(&state, &args);
    eventually("the runner to serve", || runner.stderr().contains("knotless-run serving as runner").then_some(()));
    assert_eq!(runner.checks(&url, Some(&commit)).len(), 5, "nothing is queued again twice");
}

#[test]
fn a_check_left_running_is_finished_and_not_run_again_when_state_json_was_moved_away() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = dir.path().join("gate-never-opened");
    let (repo, commit) = repo_with(dir.path(), &[("long", &gated(&gate))]);
    let url = repo.url();
    let state = dir.path().join("state");
    let args = [flags("e2e-moved-state", &[]), vec![url.as_str()]].concat();
    let runner = Runner::start(&state, &args);
    let run = wait_until_started(&runner, &url, &commit);
    runner.signal(Signal::SIGKILL);
    drop(runner);
    // What an operator does when told the state file is broken: move it away.
    std::fs::rename(state.join("state.json"), state.join("state.json.moved")).expect("move state.json away");
    let runner = Runner::start(&state, &args);
    let checks = runner.final_checks(&url, &commit, 1);
    assert_eq!(checks[0]["run_id"], run.as_str());
    assert_eq!(checks[0]["status"], "error");
    assert_eq!(checks[0]["cause"], "the runner stopped during this run");
    assert!(runner.run_log(&run).contains("==> error: the runner stopped during this run"));
    // The state forgot the repository: once it has looked at it again, the head still has one run.
    eventually("the repository to be remembered again", || {
        let text = std::fs::read_to_string(state.join("state.json")).ok()?;
        text.contains(&url).then_some(())
    });
    assert_eq!(runner.checks(&url, Some(&commit)).len(), 1, "the head ran again");
}

#[test]
fn a_check_that_could_not_be_written_is_written_once_it_can_be() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = dir.path().join("gate");
    let (repo, commit) = repo_with(dir.path(), &[("long", &gated(&gate))]);
    let url = repo.url();
    let state = dir.path().join("state");
    let runner = Runner::start(&state, &[flags("e2e-unwritten", &[]), vec![url.as_str()]].concat());
    let run = wait_until_started(&runner, &url, &commit);
    // The record's place taken by a folder that is not empty: nothing can be renamed onto it, as
    // nothing can be written on a full disk (root included, unlike a folder's permissions).
    let checks = state.join("checks");
    let record = std::fs::read_dir(&checks)
        .expect("the checks")
        .flatten()
        .map(|repository| repository.path().join(format!("{run}.json")))
        .find(|record| record.is_file())
        .expect("the run's record");
    std::fs::remove_file(&record).expect("remove the record");
    std::fs::create_dir_all(record.join("blocked")).expect("block the record's place");
    std::fs::write(&gate, "").expect("open the gate");
    let refused = format!("cannot write the check of {run}");
    eventually("the final record to fail", || runner.stderr().contains(&refused).then_some(()));
    std::fs::remove_dir_all(&record).expect("free the record's place");
    runner.notify(&url);
    let checks = runner.final_checks(&url, &commit, 1);
    assert_eq!(checks[0]["run_id"], run.as_str());
    assert_eq!(checks[0]["status"], "success");
}

#[test]
fn a_runner_killed_mid_save_leaves_no_cache_layer_after_its_next_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workflow = "cache: [c]\nsteps:\n  - name: fill\n    run: mkdir -p c && head -c 100000 /dev/zero > c/layer\n";
    let (repo, commit) = repo_with(dir.path(), &[("save", workflow)]);
    let stall = fake_executor(dir.path(), "stall-download");
    let work_option = format!("work-dir={}", dir.path().join("fake-work").display());
    let url = repo.url();
    let args = [
        vec!["--executor-plugin", stall.to_str().expect("a path"), "--executor-option", work_option.as_str()],
        vec!["--runner-id", "e2e-mid-save", "--poll", "3600", "--disk-floor", "0", url.as_str()],
    ]
    .concat();
    let state = dir.path().join("state");
    let upper = state.join("caches").join(".upper");
    let entries = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&upper)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let runner = Runner::start(&state, &args);
    let layer = eventually("the save to start", || entries().into_iter().find(|name| !name.ends_with(".owner")));
    runner.signal(Signal::SIGKILL);
    drop(runner);
    assert!(upper.join(&layer).is_dir(), "the killed run left its layer");
    let runner = Runner::start(&state, &args);
    let checks = runner.final_checks(&url, &commit, 1);
    assert_eq!(checks[0]["status"], "error");
    eventually("the sweep to log", || runner.stderr().contains("startup sweep").then_some(()));
    assert!(entries().is_empty(), "left after the next start: {:?}", entries());
    assert!(runner.stderr().contains("removed what dead runs left in the cache store"), "{}", runner.stderr());
}
