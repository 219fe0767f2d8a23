//! A closed pipe is not a crash: `knotless-run run` whose stdout or stderr (or both) is a pipe
//! nobody reads any more still runs its workflows and exits with their result.

use std::process::Stdio;

use knotless_tests::{Repo, knotless_run};

/// The write end of a pipe whose read end is already closed: every write fails with EPIPE.
fn closed_pipe() -> Stdio {
    let (read, write) = nix::unistd::pipe().expect("pipe");
    drop(read);
    Stdio::from(write)
}

#[test]
fn a_run_with_closed_stdout_or_stderr_completes_with_its_result() {
    for (stdout_closed, stderr_closed) in [(true, false), (false, true), (true, true)] {
        let repo = Repo::new();
        let marker = tempfile::tempdir().expect("tempdir");
        let done = marker.path().join("done");
        repo.workflow(
            "ci",
            &format!("steps:\n  - name: work\n    run: echo lots of output; touch '{}'\n", done.display()),
        );
        repo.workflow("broken", "steps:\n  - name: fail\n    run: exit 4\n");
        let work = tempfile::tempdir().expect("tempdir");
        let status = knotless_run(&[
            "run",
            &repo.path().display().to_string(),
            "--executor",
            "shell",
            "--executor-option",
            &format!("work-dir={}", work.path().display()),
        ])
        .stdout(if stdout_closed { closed_pipe() } else { Stdio::null() })
        .stderr(if stderr_closed { closed_pipe() } else { Stdio::null() })
        .status()
        .expect("run");
        let what = format!("stdout closed: {stdout_closed}, stderr closed: {stderr_closed}");
        assert_eq!(status.code(), Some(1), "{what}: the failing workflow's result, not a panic (101)");
        assert!(done.exists(), "{what}: the workflow ran");
    }
}
