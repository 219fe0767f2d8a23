//! Test support: a fake cluster (the fake kubectl's state folder and kubeconfig), the built
//! executor hosted through the runner's own host, and looks into the fake's store and log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use knotless_protocol::messages::*;
use knotless_run::host::{ExecutorHost, HostConfig, HostError, ProcessSpec, Session, SessionEvent};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

static RUNNERS: AtomicU64 = AtomicU64::new(0);
static ROOTFS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The build's output folder: the test binary lives in `<target>/debug/deps/`.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent().and_then(Path::parent).expect("target/debug").to_path_buf()
}

/// The fake kubectl, built by `cargo build --workspace --bins` (make test does it first).
pub fn fake_kubectl() -> PathBuf {
    let path = bin_dir().join("fake-kubectl");
    assert!(path.exists(), "{} is missing: run `cargo build -p knotless-fake-kubectl` first", path.display());
    path
}

/// A fake cluster of its own for one test.
pub struct Cluster {
    /// The folder of the state and kubeconfig, removed with the cluster.
    pub _dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    pub state: PathBuf,
    pub kubectl: PathBuf,
}

impl Cluster {
    /// A fresh cluster; the pods' root filesystem is built once and cached in the target folder.
    pub fn new() -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fake-kubectl/fake-cluster.sh");
        let cache = bin_dir().join("knotless-rootfs.tar");
        let output = {
            let _one_at_a_time = ROOTFS.lock().unwrap_or_else(|poison| poison.into_inner());
            std::process::Command::new("bash")
                .arg(&script)
                .arg(dir.path())
                .arg(&cache)
                .output()
                .expect("fake-cluster.sh")
        };
        assert!(output.status.success(), "fake-cluster.sh: {}", String::from_utf8_lossy(&output.stderr));
        let kubeconfig = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        let state = dir.path().canonicalize().expect("canonical").join("state");
        Cluster { _dir: dir, kubeconfig, state, kubectl: fake_kubectl() }
    }

    /// Asks the fake for failures.
    pub fn inject(&self, names: &[&str]) {
        std::fs::write(self.state.join("inject.json"), serde_json::to_vec(names).expect("json")).expect("inject.json");
    }

    /// The objects of the store.
    pub fn objects(&self) -> Vec<Value> {
        let Ok(bytes) = std::fs::read(self.state.join("store.json")) else { return Vec::new() };
        let store: Value = serde_json::from_slice(&bytes).expect("store.json");
        store["objects"].as_array().cloned().unwrap_or_default()
    }

    /// `kind/name` of what is left of Jobs, pods, NetworkPolicies and Secrets.
    pub fn leftovers(&self) -> Vec<String> {
        self.objects()
            .iter()
            .filter(|object| matches!(object["kind"].as_str(), Some("Job" | "Pod" | "NetworkPolicy" | "Secret")))
            .map(|object| format!("{}/{}", object["kind"].as_str().unwrap_or(""), object["metadata"]["name"]))
            .collect()
    }

    /// Every call the fake recorded.
    pub fn calls(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.state.join("calls.jsonl")).unwrap_or_default();
        text.lines().map(|line| serde_json::from_str(line).expect("call line")).collect()
    }

    /// The executor options for this cluster.
    pub fn options(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("kubeconfig".to_string(), self.kubeconfig.display().to_string()),
            ("kubectl".to_string(), self.kubectl.display().to_string()),
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

impl Drop for Cluster {
    /// A failed test may leave pods: kill their sandboxes (PID 1 of each takes the rest).
    fn drop(&mut self) {
        for pod in self.objects().iter().filter(|object| object["kind"] == "Pod") {
            if let Some(pid) = pod["metadata"]["annotations"]["fake.knotless.dev/init-pid"].as_str() {
                let _ = std::process::Command::new("kill").args(["-KILL", pid]).status();
            }
        }
    }
}
