//! An executor that misbehaves never takes the runner down: the run ends `error` naming the
//! executor and the cause, a fresh executor sweeps what the dead one left, and the next run works.

use knotless_tests::{Repo, fake_executor_once, knotless_run, ran};

/// A repository with two one-step workflows: `a` meets the misbehaviour, `b` runs after it.
fn two_workflows() -> Repo {
    let repo = Repo::new();
    repo.workflow("a", "steps:\n  - name: first\n    run: echo a-ran\n    timeout: 2s\n");
    repo.workflow("b", "steps:\n  - name: second\n    run: echo b-ran\n");
    repo.commit("two workflows");
    repo
}

fn check_mid_run(mode: &str, cause: &[&str]) {
    let repo = two_workflows();
    let scratch = tempfile::tempdir().expect("tempdir");
    let wrapper = fake_executor_once(scratch.path(), mode);
    let ledger = scratch.path().join("ledger.json");
    let work = scratch.path().join("work");
    let run = ran(knotless_run(&[
        "run",
        &repo.path().display().to_string(),
        "--executor-plugin",
        &wrapper.display().to_string(),
        "--executor-grace",
        "1",
        "--executor-option",
        &format!("ledger={}", ledger.display()),
        "--executor-option",
        &format!("work-dir={}", work.display()),
    ]));
    let both = run.both();
    assert_eq!(run.code, Some(1), "{mode}: the run did not succeed, so the exit code is 1\n{both}");
    assert!(!both.contains("panicked"), "{mode}: the runner panicked\n{both}");
    let summary_a = format!("a: error: step first: executor fake-{mode}");
    assert!(run.stdout.contains(&summary_a), "{mode}: expected `{summary_a}`\n{both}");
    for needle in cause {
        assert!(run.stdout.contains(needle), "{mode}: the cause should mention `{needle}`\n{both}");
    }
    assert!(run.stdout.contains("b: success"), "{mode}: the next run works\n{both}");
    assert!(run.stdout.contains("b/second | b-ran"), "{mode}: the next run's output\n{both}");
    let left = std::fs::read_to_string(&ledger).expect("the fake's ledger");
    assert_eq!(left.trim(), "[]", "{mode}: no session is left behind\n{both}");
}

#[test]
fn garbage_on_stdout_ends_the_run_in_error_naming_the_first_bytes() {
    check_mid_run(
        "garbage",
        &["broke the protocol", "first bytes `this is not json {{{`", "fake: about to write garbage"],
    );
}

#[test]
fn a_crash_mid_step_ends_the_run_in_error_with_the_stderr_tail() {
    check_mid_run(
        "crash-mid-step",
        &["closed its stdout during command", "exit status 101", "fake: crashing mid-step"],
    );
}

#[test]
fn a_lost_session_ends_the_run_in_error() {
    let repo = two_workflows();
    let scratch = tempfile::tempdir().expect("tempdir");
    let wrapper = fake_executor_once(scratch.path(), "lose-session");
    let args = ["run", &repo.path().display().to_string(), "--executor-plugin", &wrapper.display().to_string()];
    let run = ran(knotless_run(&args));
    let both = run.both();
    assert_eq!(run.code, Some(1), "{both}");
    // The executor lives on but has lost its environments: every run of it ends in error.
    assert!(run.stdout.contains("a: error: step first: executor fake-lose-session: command: no session a-"), "{both}");
    assert!(run.stdout.contains("b: error: step second: executor fake-lose-session: command: no session b-"), "{both}");
    let next = ran(knotless_run(&args));
    assert_eq!(next.code, Some(0), "the next run, on a sound executor, works\n{}", next.both());
}

#[test]
fn a_hung_executor_is_stopped_and_replaced() {
    check_mid_run("hang-in-step", &["did not answer command", "SIGTERM"]);
}

fn check_handshake(mode: &str, expected: &[&str]) {
    let repo = two_workflows();
    let scratch = tempfile::tempdir().expect("tempdir");
    let wrapper = fake_executor_once(scratch.path(), mode);
    let args = ["run", &repo.path().display().to_string(), "--executor-plugin", &wrapper.display().to_string()];
    let run = ran(knotless_run(&args));
    let both = run.both();
    assert_eq!(run.code, Some(2), "{mode}: a handshake failure stops before any run\n{both}");
    assert!(!both.contains("panicked"), "{mode}\n{both}");
    assert!(run.stderr.contains(&format!("executor fake-{mode}")), "{mode}: names the executor\n{both}");
    for needle in expected {
        assert!(run.stderr.contains(needle), "{mode}: expected `{needle}`\n{both}");
    }
    // The wrapper misbehaves only once: the next invocation runs.
    let next = ran(knotless_run(&args));
    assert_eq!(next.code, Some(0), "{mode}: the next run works\n{}", next.both());
}

#[test]
fn an_executor_that_exits_before_the_handshake_is_named_with_its_stderr() {
    check_handshake("exit-before-handshake", &["exit status 3", "fake: exiting before the handshake"]);
}

#[test]
fn a_version_refusal_names_both_sides_versions() {
    check_handshake("refuse-version", &["speaks protocol versions [2]", "this runner speaks [1]"]);
}

#[test]
fn an_executor_that_picks_a_version_not_offered_is_refused() {
    check_handshake("wrong-version", &["picked protocol version 99", "it speaks [1]"]);
}

#[test]
fn garbage_before_the_handshake_names_the_first_bytes() {
    check_handshake("garbage-at-start", &["first bytes `HELLO I AM NOT JSON`"]);
}
