//! `knotless-run plugin check`: the fake executor in its `ok` mode passes every case, each
//! reported with its time; in each of its misbehaving modes it fails the case that mode breaks,
//! and a fatal fault is reported once, the cases after it not run. (The shell, Docker and
//! Kubernetes executors run the suite in their own tests, through `knotless-testkit`.)

use knotless_tests::{Ran, fake_executor, knotless_run, ran};

/// Every case of the suite, in order.
const CASES: &[&str] = &[
    "handshake",
    "version refusal",
    "requests before initialize",
    "unknown option",
    "malformed and unknown requests",
    "ping",
    "cleanup at start",
    "start",
    "output before the result",
    "step output and exit code",
    "non-zero exit",
    "every byte of output",
    "death by signal",
    "ping during a step",
    "duplicate start",
    "unknown sessions",
    "variables and secrets",
    "working folder",
    "step timeout",
    "processes left after a timeout",
    "cancellation",
    "processes left after a cancel",
    "processes left after a step given secrets",
    "upload and download",
    "upload refusals",
    "setuid, setgid and sticky bits",
    "long names in an upload",
    "a link already in an upload's destination",
    "special files in a download",
    "download of a missing path",
    "transfer deadlines and cancel",
    "download over max_bytes",
    "stop",
    "1 MiB of output with a slow reader",
    "secrets out of sight",
    "shutdown with a step in flight",
    "a deadline already passed",
    "stop with keep",
    "cleanup of sessions not in flight",
    "end of stdin",
    "shutdown",
];

/// The report's line of each case, in order: `(verdict, name, the rest)`.
fn report(run: &Ran) -> Vec<(String, String, String)> {
    run.stdout
        .lines()
        .filter_map(|line| {
            let line = line.strip_prefix("  ")?;
            let (verdict, rest) = ["ok", "FAIL", "not run"].iter().find_map(|verdict| {
                let rest = line.strip_prefix(verdict)?.strip_prefix(' ')?;
                Some((verdict.to_string(), rest.trim_start()))
            })?;
            let name = CASES
                .iter()
                .find(|name| rest.starts_with(&format!("{name} (")) || rest.starts_with(&format!("{name}:")))?;
            Some((verdict, name.to_string(), rest[name.len()..].to_string()))
        })
        .collect()
}

#[test]
fn a_well_behaved_executor_passes_every_case_each_with_its_time() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let wrapper = fake_executor(scratch.path(), "ok");
    let run = ran(knotless_run(&["plugin", "check", &wrapper.display().to_string()]));
    assert_eq!(run.code, Some(0), "{}", run.both());
    let lines = report(&run);
    let names: Vec<&str> = lines.iter().map(|(_, name, _)| name.as_str()).collect();
    assert_eq!(names, CASES, "{}", run.both());
    for (verdict, name, rest) in &lines {
        assert_eq!(verdict, "ok", "{name}\n{}", run.both());
        // `  ok       working folder (12 ms): steps run in ...`
        let took = rest.strip_prefix(" (").and_then(|rest| rest.split_once(" ms): "));
        assert!(took.is_some_and(|(ms, _)| ms.parse::<u64>().is_ok()), "{name}: {rest}\n{}", run.both());
    }
    assert!(run.stdout.ends_with(&format!("{} passed, 0 failed, 0 not run\n", CASES.len())), "{}", run.both());
}

/// The fake in `mode` fails the case `failing` and no other: the cases after it pass, or are
/// not run when the executor is gone. Returns the run.
fn fails_only(mode: &str, failing: &str) -> Ran {
    let scratch = tempfile::tempdir().expect("tempdir");
    let wrapper = fake_executor(scratch.path(), mode);
    let run = ran(knotless_run(&["plugin", "check", &wrapper.display().to_string(), "--executor-grace", "1"]));
    assert_eq!(run.code, Some(1), "{mode}\n{}", run.both());
    let lines = report(&run);
    assert_eq!(lines.len(), CASES.len(), "{mode}\n{}", run.both());
    let failed: Vec<&str> =
        lines.iter().filter(|(verdict, _, _)| verdict == "FAIL").map(|(_, name, _)| name.as_str()).collect();
    assert_eq!(failed, [failing], "{mode} should fail `{failing}` alone\n{}", run.both());
    assert!(!run.both().contains("panicked"), "{}", run.both());
    run
}

/// The fake in `mode` fails `failing`, among others.
fn check_fails(mode: &str, failing: &str) {
    let scratch = tempfile::tempdir().expect("tempdir");
    let wrapper = fake_executor(scratch.path(), mode);
    let run = ran(knotless_run(&["plugin", "check", &wrapper.display().to_string(), "--executor-grace", "1"]));
    assert_eq!(run.code, Some(1), "{mode}\n{}", run.both());
    assert!(
        report(&run).iter().any(|(verdict, name, _)| verdict == "FAIL" && name == failing),
        "{mode} should fail `{failing}`\n{}",
        run.both()
    );
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
fn an_executor_that_refuses_every_version_fails_the_handshake_and_nothing_else_runs() {
    let run = fails_only("refuse-version", "handshake");
    let not_run = report(&run)
        .iter()
        .filter(|(verdict, _, rest)| verdict == "not run" && rest == ": the handshake failed")
        .count();
    assert_eq!(not_run, CASES.len() - 1, "{}", run.both());
}

#[test]
fn an_executor_that_writes_garbage_fails_its_first_step_once() {
    fails_only("garbage", "output before the result");
}

#[test]
fn a_crash_is_reported_once_in_its_case_and_every_later_case_is_not_run() {
    let run = fails_only("crash-mid-step", "output before the result");
    let lines = report(&run);
    let at = CASES.iter().position(|name| *name == "output before the result").expect("the case");
    let (_, _, fault) = &lines[at];
    assert!(fault.contains("closed its stdout during command (exit status 101)"), "{}", run.both());
    assert!(fault.contains("crashing mid-step"), "the fault carries the stderr tail\n{}", run.both());
    for (verdict, name, rest) in &lines[at + 1..] {
        assert_eq!(verdict, "not run", "{name}\n{}", run.both());
        assert_eq!(rest, ": the executor was gone in `output before the result`", "{name}\n{}", run.both());
    }
    let summary = format!("{at} passed, 1 failed, {} not run\n", CASES.len() - at - 1);
    assert!(run.stdout.ends_with(&summary), "{}", run.both());
    assert_eq!(run.stdout.matches("exit status 101").count(), 1, "the fault is said once\n{}", run.both());
}

#[test]
fn an_executor_that_runs_steps_elsewhere_fails_the_working_folder() {
    fails_only("wrong-workdir", "working folder");
}

#[test]
fn an_executor_that_starts_a_live_session_again_fails_the_duplicate_start() {
    fails_only("duplicate-start", "duplicate start");
}

#[test]
fn an_executor_that_stops_a_session_it_never_started_fails_the_unknown_sessions() {
    fails_only("stop-unknown-ok", "unknown sessions");
}

#[test]
fn an_executor_that_sends_output_after_the_result_fails_that_case() {
    let run = fails_only("late-output", "output before the result");
    assert!(run.stdout.contains("when the result came, 0 of the"), "{}", run.both());
    assert!(run.stdout.contains("while it runs no step"), "{}", run.both());
}

#[test]
fn an_executor_that_drops_output_for_a_slow_reader_fails_that_case() {
    fails_only("drop-output-when-slow", "1 MiB of output with a slow reader");
}

#[test]
fn an_executor_that_skips_special_files_in_an_upload_fails_the_refusals() {
    let run = fails_only("accept-special-uploads", "upload refusals");
    assert!(run.stdout.contains("a FIFO was accepted; a device node was accepted"), "{}", run.both());
}

#[test]
fn an_executor_that_downloads_special_files_fails_that_case() {
    fails_only("archive-special-files", "special files in a download");
}

#[test]
fn an_executor_that_leaves_a_setsid_process_at_a_timeout_fails_that_case() {
    let run = fails_only("leave-processes-at-timeout", "processes left after a timeout");
    assert!(run.stdout.contains("outlived the answer -32004 (TIMEOUT): the one after setsid"), "{}", run.both());
}

#[test]
fn an_executor_that_leaves_a_setsid_process_at_a_cancel_fails_that_case() {
    let run = fails_only("leave-processes-at-cancel", "processes left after a cancel");
    assert!(run.stdout.contains("outlived the answer -32003 (CANCELLED): the one after setsid"), "{}", run.both());
}

#[test]
fn an_executor_that_leaves_its_sessions_at_the_end_of_stdin_fails_that_case() {
    let run = fails_only("leave-sessions-at-eof", "end of stdin");
    assert!(run.stdout.contains("exited without stopping session"), "{}", run.both());
}

/// The fake's modes that each break one MUST of the reference, the case that must fail for it,
/// and the words of the rule its failure must quote.
const BREAKS_A_MUST: &[(&str, &str, &str)] = &[
    ("secret-on-command-line", "secrets out of sight", "MUST NOT put a secret on any command line"),
    ("secret-on-stderr", "secrets out of sight", "MUST NOT put a secret in its own environment"),
    ("secret-in-file", "secrets out of sight", "in a file (in the environment or on the host)"),
    ("secret-in-log", "secrets out of sight", "in a `log` notification"),
    ("leave-processes-after-secrets", "processes left after a step given secrets", "MUST be killed before"),
    ("ping-before-initialize", "requests before initialize", "MUST answer every request but `shutdown`"),
    ("accept-unknown-options", "unknown option", "MUST refuse an unknown option"),
    ("answer-unknown-methods", "malformed and unknown requests", "MUST be answered -32601"),
    ("lossy-output", "every byte of output", "MUST NOT decode, re-encode"),
    ("signal-as-zero", "death by signal", "MUST be 128 + N"),
    ("no-transfer-deadline", "transfer deadlines and cancel", "MUST end within `timeout_ms`"),
    ("download-past-max", "download over max_bytes", "MUST stop writing before `max_bytes`"),
    ("keep-mode-bits", "setuid, setgid and sticky bits", "MUST drop setuid, setgid and sticky bits"),
    ("serial-requests", "ping during a step", "MUST handle requests concurrently"),
    ("shutdown-drops-requests", "shutdown with a step in flight", "are still answered -32003"),
    ("ignore-long-names", "long names in an upload", "MUST accept POSIX ustar, GNU tar and pax"),
    ("write-through-links", "a link already in an upload's destination", "never write through a link"),
    ("no-session-deadline", "a deadline already passed", "MUST answer -32004 (TIMEOUT) without beginning"),
    ("ignore-keep", "stop with keep", "MUST leave the environment in place"),
    ("sweep-kept", "stop with keep", "MUST leave a kept session's environment"),
];

/// Mutation testing of the suite: each of the fake's modes that breaks one MUST fails the case
/// of that MUST alone, quoting it. They run side by side, each a `plugin check` of its own.
/// `make conformance` runs it and prints how many modes were caught.
#[test]
#[ignore = "run by `make conformance`, which prints the count of modes caught"]
fn every_mode_that_breaks_a_must_fails_the_case_that_names_it() {
    let scratch = tempfile::tempdir().expect("tempdir");
    // Every wrapper is written before any is run: a script written while another thread forks
    // can be held open for writing by that child, and its exec then fails (ETXTBSY).
    let wrappers: Vec<_> = BREAKS_A_MUST.iter().map(|&(mode, _, _)| fake_executor(scratch.path(), mode)).collect();
    let runs: Vec<(&str, &str, &str, Ran)> = std::thread::scope(|scope| {
        let threads: Vec<_> = BREAKS_A_MUST
            .iter()
            .zip(wrappers)
            .map(|(&(mode, case, rule), wrapper)| {
                scope.spawn(move || {
                    let path = wrapper.display().to_string();
                    (mode, case, rule, ran(knotless_run(&["plugin", "check", &path, "--executor-grace", "1"])))
                })
            })
            .collect();
        threads.into_iter().map(|thread| thread.join().expect("a plugin check thread")).collect()
    });
    let mut missed = Vec::new();
    for (mode, case, rule, run) in &runs {
        let lines = report(run);
        let failed: Vec<&(String, String, String)> = lines.iter().filter(|(verdict, _, _)| verdict == "FAIL").collect();
        let caught = run.code == Some(1)
            && lines.len() == CASES.len()
            && failed.len() == 1
            && failed[0].1 == *case
            && failed[0].2.contains(rule);
        if !caught {
            missed.push(format!("{mode} (expected `{case}` to fail quoting {rule:?}):\n{}", run.both()));
        }
    }
    eprintln!(
        "conformance suite: {} of {} fake executor modes that each break a MUST were caught",
        runs.len() - missed.len(),
        runs.len()
    );
    assert!(missed.is_empty(), "modes not caught as expected:\n{}", missed.join("\n"));
}
