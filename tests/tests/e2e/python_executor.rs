//! The Python example executor of the guide (`docs/examples/python-executor/`) passes every
//! check of `knotless-run plugin check`, so the guide walks through an executor that conforms.

use std::path::PathBuf;

use knotless_tests::{knotless_run, ran};

/// The example, from the workspace root.
fn python_executor() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/python-executor/knotless_executor_python.py")
}

#[test]
fn the_python_example_executor_passes_every_check() {
    let executor = python_executor();
    assert!(executor.exists(), "{} is missing", executor.display());
    let work = tempfile::tempdir().expect("tempdir");
    let run = ran(knotless_run(&[
        "plugin",
        "check",
        &executor.display().to_string(),
        "--executor-option",
        &format!("work-dir={}", work.path().display()),
    ]));
    assert_eq!(run.code, Some(0), "{}", run.both());
    assert!(!run.stdout.contains("FAIL"), "{}", run.both());
    assert!(run.stdout.ends_with(" passed, 0 failed, 0 not run\n"), "{}", run.both());
    assert!(
        run.stdout.contains("ok       handshake (") && run.stdout.contains(" ms): python-example"),
        "{}",
        run.both()
    );
}
