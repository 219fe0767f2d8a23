//! The built shell executor passes every case of the conformance suite of `knotless-run plugin
//! check`, hosted as the runner hosts it.

use knotless_testkit::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_executor_passes_the_conformance_suite() {
    let work = tempfile::tempdir().expect("a work folder");
    let work_dir = work.path().display().to_string();
    let program = conformance::program(env!("CARGO_BIN_EXE_knotless-executor-shell"), &[("work-dir", &work_dir)]);
    let checks = conformance::assert_passes(program).await;
    assert_eq!(checks.len(), conformance::case::all().count());
}
