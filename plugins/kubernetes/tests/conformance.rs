//! The built Kubernetes executor passes every case of the conformance suite of `knotless-run
//! plugin check`, hosted as the runner hosts it, against the fake API server
//! (`tests/fake-apiserver`, built first by `cargo build -p knotless-fake-apiserver`).

#[allow(dead_code)]
mod support;

use knotless_testkit::conformance;
use support::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_executor_passes_the_conformance_suite() {
    // Three nodes: the suite runs sessions at once, and the required anti-affinity gives each
    // run a node of its own.
    let cluster = Cluster::with(&["--grace", "2s", "--nodes", "3"]);
    let options = cluster.options();
    let options: Vec<(&str, &str)> = options.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
    let program = conformance::program(env!("CARGO_BIN_EXE_knotless-executor-kubernetes"), &options);
    let checks = conformance::assert_passes(program).await;
    assert_eq!(checks.len(), conformance::case::all().count());
}
