//! `knotless-run plugin check`: the shell executor passes; fake executors that break the
//! protocol fail, and the failing check is named.

use knotless_tests::{bin, fake_executor, knotless_run, ran};

#[test]
fn the_shell_executor_passes_every_check() {
    let work = tempfile::tempdir().expect("tempdir");
    let run = ran(knotless_run(&[
        "plugin",
        "check",
        &bin("knotless-executor-shell").display().to_string(),
        "--executor-option",
        &format!("work-dir={}", work.path().display()),
    ]));
    assert_eq!(run.code, Some(0), "{}", run.both());
    assert!(!run.stdout.contains("FAIL"), "{}", run.both());
    assert!(run.stdout.contains(" passed, 0 failed"), "{}", run.both());
    for check in [
        "handshake",
        "version refusal",
        "step timeout",
        "cancellation",
        "upload and download",
        "cleanup of sessions not in flight",
    ] {
        assert!(run.stdout.contains(&format!("ok    {check}")), "{check}\n{}", run.both());
    }
}

fn check_fails(mode: &str, failing: &str) {
    let scratch = tempfile::tempdir().expect("tempdir");
    let wrapper = fake_executor(scratch.path(), mode);
    let run = ran(knotless_run(&["plugin", "check", &wrapper.display().to_string(), "--executor-grace", "1"]));
    assert_eq!(run.code, Some(1), "{mode}\n{}", run.both());
    assert!(run.stdout.contains(&format!("FAIL  {failing}:")), "{mode} should fail `{failing}`\n{}", run.both());
    assert!(!run.both().contains("panicked"), "{}", run.both());
}

#[test]
fn an_executor_that_drops_output_fails_the_output_check() {
    check_fails("drop-output", "step output and exit code");
}

#[test]
fn an_executor_that_ignores_timeouts_fails_the_timeout_check() {
    check_fails("ignore-timeout", "step timeout");
}

#[test]
fn an_executor_that_answers_a_cancel_with_exit_code_0_fails_the_timeout_check() {
    check_fails("cancel-answers-ok", "step timeout");
}

#[test]
fn an_executor_that_miscounts_a_transfer_fails_the_round_trip() {
    check_fails("bad-transfer", "upload and download");
}

#[test]
fn an_executor_that_refuses_every_version_fails_the_handshake() {
    check_fails("refuse-version", "handshake");
}

#[test]
fn an_executor_that_writes_garbage_fails_a_step_check() {
    check_fails("garbage", "step output and exit code");
}
