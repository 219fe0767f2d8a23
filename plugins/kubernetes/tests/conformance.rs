//! The built Kubernetes executor passes every case of the conformance suite of `knotless-run
//! plugin check`, hosted as the runner hosts it, against the fake API server
//! (`tests/fake-apiserver`, built first by `cargo build -p knotless-fake-apiserver`): on three
//! nodes, and on one (the suite holds one session at a time, and the required anti-affinity
//! gives each run a node of its own).

#[allow(dead_code)]
mod support;

use std::time::Instant;

use knotless_testkit::conformance;
use support::Cluster;

/// Runs the suite against a fake cluster of `nodes` nodes with `extra` options.
async fn passes_on(nodes: &str, extra: &[(&str, &str)]) {
    let cluster = Cluster::with(&["--grace", "2s", "--nodes", nodes]);
    let mut options = cluster.options();
    options.extend(extra.iter().map(|(key, value)| (key.to_string(), value.to_string())));
    let options: Vec<(&str, &str)> = options.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
    let program = conformance::program(env!("CARGO_BIN_EXE_knotless-executor-kubernetes"), &options);
    let started = Instant::now();
    let checks = conformance::assert_passes(program).await;
    assert_eq!(checks.len(), conformance::case::all().count());
    cluster.wait_clean();
    println!("the suite on {nodes} node(s): {} ms", started.elapsed().as_millis());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_executor_passes_the_conformance_suite() {
    passes_on("3", &[]).await;
}

/// One node and no autoscaler: a second session at once would wait for a node that never
/// frees; the bounds here make such a wait fail the case within a minute rather than hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_executor_passes_the_conformance_suite_on_one_node() {
    passes_on("1", &[("ready-timeout", "60"), ("scale-up-timeout", "60")]).await;
}
