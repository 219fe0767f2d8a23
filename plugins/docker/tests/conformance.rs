//! The built Docker executor passes every case of the conformance suite of `knotless-run plugin
//! check`, hosted as the runner hosts it, against the real engine: run
//! `plugins/docker/tests/support/engine.sh` first (it starts dockerd and imports the test image).

mod support;

use knotless_testkit::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_executor_passes_the_conformance_suite() {
    let program = conformance::program(env!("CARGO_BIN_EXE_knotless-executor-docker"), &[("image", support::IMAGE)]);
    let checks = conformance::assert_passes(program).await;
    assert_eq!(checks.len(), conformance::case::all().count());
}
