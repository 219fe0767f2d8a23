//! Test support: the Docker executor served in memory by the test kit's harness, and helpers
//! that ask the engine directly.
//!
//! Every harness is its own runner id (`knotless-test-<pid>-<n>`), so every container a test
//! makes carries a label that [`Containers::finish`] checks is gone.

// Each test binary uses a part of it.
#![allow(dead_code, unused_imports)]

use knotless_executor_docker::DockerExecutor;
pub use knotless_testkit::processes::cmdlines_containing;
pub use knotless_testkit::{Harness, answer, eventually, unique_runner_id};
use serde_json::json;

/// The image of the tests, made by `tests/support/engine.sh` with `docker import`.
pub const IMAGE: &str = "knotless-test/busybox:1";

/// A fresh executor of a fresh runner id, initialized with the test image as default.
pub async fn initialized() -> Harness {
    for_runner(&unique_runner_id("knotless-test")).await
}

/// A fresh executor process of a given runner id (a runner restarted after a crash).
pub async fn for_runner(runner_id: &str) -> Harness {
    let harness = uninitialized(runner_id);
    harness.initialize(json!({"image": IMAGE})).await.expect("initialize");
    harness
}

/// A fresh executor of a given runner id, not initialized yet.
pub fn uninitialized(runner_id: &str) -> Harness {
    Harness::serve(DockerExecutor::default(), runner_id)
}

/// The containers of a harness of the Docker executor.
pub trait Containers {
    /// The name of a session's container.
    fn container(&self, session: &str) -> String;
    /// Closes the executor's stdin, waits for `serve_io` to return, and checks that no
    /// container of this runner id is left.
    async fn finish(self);
}

impl Containers for Harness {
    fn container(&self, session: &str) -> String {
        format!("knotless-{}-{session}", self.runner_id())
    }

    async fn finish(mut self) {
        self.close_input().await;
        let runner_id = self.runner_id();
        assert_eq!(containers_of(runner_id), Vec::<String>::new(), "containers left by {runner_id}");
    }
}

/// Runs the docker CLI; returns (success, stdout, stderr).
pub fn docker(args: &[&str]) -> (bool, Vec<u8>, String) {
    let output = std::process::Command::new("docker").args(args).output().expect("run docker");
    (output.status.success(), output.stdout, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// The containers labelled with a runner id.
pub fn containers_of(runner_id: &str) -> Vec<String> {
    let filter = format!("label=dev.knotless.runner={runner_id}");
    let (ok, stdout, stderr) = docker(&["ps", "--all", "--filter", &filter, "--format", "{{.Names}}"]);
    assert!(ok, "docker ps: {stderr}");
    String::from_utf8_lossy(&stdout).lines().map(str::to_string).collect()
}

/// Whether `haystack` holds `needle`.
pub fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle.as_bytes())
}
