//! Test support: a fake cluster (the fake API server of `tests/fake-apiserver`, its
//! kubeconfig and its control endpoints), the built executor hosted as the runner hosts it
//! (`knotless-host`, through the test kit), and looks into the fake's objects and request counts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use knotless_protocol::messages::*;
use knotless_testkit::host::{ExecutorHost, HostConfig, HostError, ProcessSpec, Session, SessionEvent};
use tokio_util::sync::CancellationToken;

pub use knotless_fake_apiserver::FakeCluster;

static RUNNERS: AtomicU64 = AtomicU64::new(0);

/// A fake cluster of its own for one test (see [`FakeCluster`]).
pub struct Cluster(pub FakeCluster);

impl std::ops::Deref for Cluster {
    type Target = FakeCluster;
    fn deref(&self) -> &FakeCluster {
        &self.0
    }
}

impl std::ops::DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut FakeCluster {
        &mut self.0
    }
}

impl Cluster {
    /// A fresh cluster started with `flags` (timings, nodes, the autoscaler).
    pub fn with(flags: &[&str]) -> Cluster {
        Cluster(FakeCluster::start(flags))
    }

    /// The executor options for this cluster.
    pub fn options(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("kubeconfig".to_string(), self.kubeconfig.display().to_string()),
            ("image".to_string(), "busybox".to_string()),
            ("namespace".to_string(), "knotless-runs".to_string()),
        ])
    }

    /// A fresh runner id.
    pub fn runner_id() -> String {
        format!("test-runner-{}-{}", std::process::id(), RUNNERS.fetch_add(1, Ordering::SeqCst))
    }

    /// The built executor, hosted as the runner hosts it.
    pub async fn host(&self, runner_id: &str) -> Arc<ExecutorHost> {
        self.host_with(runner_id, self.options()).await
    }

    /// The built executor with other options.
    pub async fn host_with(&self, runner_id: &str, options: BTreeMap<String, String>) -> Arc<ExecutorHost> {
        let process = ProcessSpec {
            name: "kubernetes".into(),
            path: PathBuf::from(env!("CARGO_BIN_EXE_knotless-executor-kubernetes")),
            pass_env: Vec::new(),
        };
        let runner = RunnerInfo { name: "knotless-run".into(), version: "0".into(), id: runner_id.to_string() };
        ExecutorHost::start(HostConfig::new(process, runner, options)).await.expect("executor starts")
    }
}

/// `start` parameters for a session.
pub fn start_params(session: &str) -> StartParams {
    StartParams {
        session: session.to_string(),
        run: RunInfo { id: session.into(), check_key: format!("check/{session}"), ..RunInfo::default() },
        image: None,
        resources: Resources::default(),
        network: false,
        run_timeout_ms: Some(600_000),
        timeout_ms: 60_000,
        keep: false,
        services: Vec::new(),
    }
}

/// What a step gave back.
pub struct Ran {
    pub result: Result<CommandResult, HostError>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs a step.
pub async fn step(session: &Session, script: &str, timeout_ms: u64, secrets: &[(&str, &str)]) -> Ran {
    let params = CommandParams {
        session: session.id().to_string(),
        step: 0,
        name: "test".into(),
        script: script.into(),
        env: BTreeMap::from([("PLAIN".to_string(), "plain value".to_string())]),
        secrets: secrets.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        workdir: None,
        timeout_ms,
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let result = session
        .command(params, &CancellationToken::new(), |event| {
            if let SessionEvent::Output { stream, bytes, .. } = event {
                if stream == Stream::Stdout { stdout.extend(bytes) } else { stderr.extend(bytes) }
            }
        })
        .await;
    Ran {
        result,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// Stops a session within a minute.
pub async fn stop(session: Session) -> Result<StopResult, HostError> {
    session.stop(false, Duration::from_secs(60)).await
}

/// Every file under `root` that holds `needle` (`proc`, `sys` and `dev` are skipped).
pub fn files_holding(root: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            if !matches!(entry.file_name().to_str(), Some("proc" | "sys" | "dev")) {
                found.extend(files_holding(&path, needle));
            }
        } else if kind.is_file()
            && std::fs::read(&path).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
        {
            found.push(path);
        }
    }
    found
}
