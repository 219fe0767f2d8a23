//! Test support: the shell executor served in memory by the test kit's harness with a private
//! work folder, and what the shell executor's tests look for on this host: pids a step wrote,
//! the processes that hide as an attacker would, and who holds a secret.

// Each test binary uses a part of what it re-exports.
#![allow(unused_imports)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use knotless_executor_shell::ShellExecutor;
pub use knotless_testkit::processes::{alive, cmdlines_containing, processes_with};
pub use knotless_testkit::{Harness, answer, eventually, unique_runner_id, wait_until};
use serde_json::json;

/// A fresh shell executor served in memory, not initialized yet, as a runner of its own.
pub fn uninitialized() -> Harness {
    let harness = Harness::serve(ShellExecutor::default(), unique_runner_id("runner"));
    std::fs::create_dir_all(harness.work_dir()).expect("the work folder");
    harness
}

/// A fresh shell executor served in memory and initialized with a private work folder.
pub async fn initialized() -> Harness {
    let harness = uninitialized();
    harness.initialize(json!({"work-dir": harness.work_dir()})).await.expect("initialize");
    harness
}

/// Where a harness of the shell executor keeps its sessions.
pub trait WorkFolders {
    /// The work folder the executor is given (`work-dir`).
    fn work_dir(&self) -> PathBuf;
    /// The folder of a session of this harness's runner.
    fn session_dir(&self, session: &str) -> PathBuf;
}

impl WorkFolders for Harness {
    fn work_dir(&self) -> PathBuf {
        self.scratch().join("work")
    }

    fn session_dir(&self, session: &str) -> PathBuf {
        self.work_dir().canonicalize().expect("canonical").join(self.runner_id()).join(session)
    }
}

/// The pid a step wrote in a file.
pub async fn read_pid(path: &Path) -> i32 {
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(path).is_ok_and(|text| text.ends_with('\n')))
            .await,
        "{} written",
        path.display()
    );
    std::fs::read_to_string(path).expect("pid file").trim().parse().expect("a pid")
}

/// Leftovers that hide in every way an attacker would, each writing its pid to `pids`
/// (`tests/scripts/hide.sh`), and how many there are.
pub const HIDERS: &str = include_str!("../../../../tests/scripts/hide.sh");
pub const HIDDEN: usize = 5;

/// The pids the hiders wrote in `work/pids`.
pub fn pids(work: &Path) -> Vec<i32> {
    let text = std::fs::read_to_string(work.join("pids")).expect("pids written");
    text.lines().map(|line| line.trim().parse().expect("a pid")).collect()
}

/// Every live process holding `secret` as `TOKEN` or `COPY` in its environment, or anywhere
/// in its command line.
pub fn holders(secret: &str) -> Vec<String> {
    let mut found: Vec<String> = processes_with(&format!("TOKEN={secret}"))
        .into_iter()
        .chain(processes_with(&format!("COPY={secret}")))
        .map(|pid| format!("environ of {pid}"))
        .collect();
    found.extend(cmdlines_containing(secret));
    found
}

/// A secret value of this test process only: tests scan the whole host's `/proc` for it, and
/// another run of the same tests must not be taken for a leak.
pub fn unique(name: &str) -> String {
    format!("{name}-s3cret-{}", std::process::id())
}
