//! Deadlines and cancellation belong to the runner: an executor that ignores a step's timeout
//! and answers the runner's `cancel` with exit code 0 gets the step recorded timed out, one that
//! answers the deadline's `cancel` with the cancelled error gets it timed out too (never
//! `cancelled`, never exit 130), and after Ctrl-C the run is cancelled whatever it answered.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use knotless_tests::{Repo, fake_executor, knotless_run, ran};

fn slow_repo() -> Repo {
    let repo = Repo::new();
    repo.workflow("slow", "steps:\n  - name: hang\n    run: echo started; sleep 30\n    timeout: 1s\n");
    repo.commit("a slow step");
    repo
}

fn args<'a>(repo: &'a str, executor: &'a str, work: &'a str) -> Vec<&'a str> {
    vec!["run", repo, "--executor-plugin", executor, "--executor-grace", "1", "--executor-option", work]
}

fn check_timed_out(mode: &str) {
    let repo = slow_repo();
    let scratch = tempfile::tempdir().expect("tempdir");
    let executor = fake_executor(scratch.path(), mode);
    let work = format!("work-dir={}", scratch.path().join("work").display());
    let repo_path = repo.path().display().to_string();
    let run = ran(knotless_run(&args(&repo_path, &executor.display().to_string(), &work)));
    let both = run.both();
    assert_eq!(run.code, Some(1), "{mode}: a timed-out step fails the run with exit code 1\n{both}");
    assert!(run.stdout.contains("slow: failure: step hang was killed at its timeout"), "{mode}\n{both}");
    let row: Vec<&str> = run
        .stdout
        .lines()
        .skip_while(|line| !line.starts_with("workflow  status"))
        .find(|line| line.starts_with("slow "))
        .map(|line| line.split_whitespace().collect())
        .unwrap_or_default();
    assert_eq!(row.get(..5), Some(&["slow", "timed", "out", "hang", "-"][..]), "{mode}\n{both}");
    assert!(!run.stdout.contains("slow: success") && !run.stdout.contains("cancelled"), "{mode}\n{both}");
}

#[test]
fn an_exit_code_0_answered_to_the_deadlines_cancel_is_a_timeout() {
    check_timed_out("cancel-answers-ok");
}

#[test]
fn a_cancelled_error_answered_to_the_deadlines_cancel_is_a_timeout_not_a_cancel() {
    check_timed_out("ignore-timeout");
}

#[test]
fn after_ctrl_c_the_run_is_cancelled_whatever_the_executor_answers() {
    let repo = Repo::new();
    repo.workflow("long", "steps:\n  - name: wait\n    run: echo started; sleep 30\n");
    repo.commit("a long step");
    let scratch = tempfile::tempdir().expect("tempdir");
    let executor = fake_executor(scratch.path(), "cancel-answers-ok").display().to_string();
    let work = format!("work-dir={}", scratch.path().join("work").display());
    let repo_path = repo.path().display().to_string();
    let mut child = knotless_run(&args(&repo_path, &executor, &work))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("line");
        let started = line.contains("long/wait | started");
        seen.push(line);
        if started {
            break;
        }
    }
    assert!(seen.iter().any(|line| line.contains("started")), "the step never started: {seen:?}");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(130), "a cancelled run exits 130: {rest:?}");
    assert!(rest.iter().any(|line| line.contains("long: cancelled: cancelled during step wait")), "{rest:?}");
    assert!(!rest.iter().any(|line| line.contains("long: success")), "{rest:?}");
}
