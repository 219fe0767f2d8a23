//! The fake API server as a test starts it: [`FakeCluster`] runs the built
//! `knotless-fake-apiserver` (the real REST, watch and exec API; controllers, scheduler,
//! autoscaler and kubelet modelled as upstream) on a free port with its kubeconfig, gives its
//! control endpoints (faults, objects, request counts, nodes, the isolation checker's record),
//! and ends it with the sandbox of every container it ran. The Kubernetes executor's tests and
//! the end-to-end tests use it; the server itself is the binary (`src/main.rs`), which a test
//! builds first (`cargo build -p knotless-fake-apiserver`).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use knotless_testkit::{bin, bin_dir};
use serde_json::Value;

static ROOTFS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The fake API server, built by `cargo build --workspace --bins` (make test does it first).
pub fn fake_apiserver() -> PathBuf {
    bin("knotless-fake-apiserver")
}

/// The pods' root filesystem, built once and cached in the target folder.
pub fn rootfs() -> PathBuf {
    let cache = bin_dir().join("knotless-rootfs.tar");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../support/rootfs.sh");
    let _one_at_a_time = ROOTFS.lock().unwrap_or_else(|poison| poison.into_inner());
    let output = Command::new("bash").arg(&script).arg(&cache).output().expect("rootfs.sh");
    assert!(output.status.success(), "rootfs.sh: {}", String::from_utf8_lossy(&output.stderr));
    cache
}

/// A fake cluster of its own for one test: the fake API server (`tests/fake-apiserver`),
/// ended with it.
pub struct FakeCluster {
    /// The folder of the state and kubeconfig, removed with the cluster.
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    /// The server's address, `127.0.0.1:PORT`.
    pub address: String,
    server: Child,
}

impl FakeCluster {
    /// A fresh cluster started with `flags` (timings, nodes, the autoscaler).
    pub fn start(flags: &[&str]) -> FakeCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let mut server = Command::new(fake_apiserver())
            .arg("--state")
            .arg(&state)
            .arg("--rootfs")
            .arg(rootfs())
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the fake API server starts");
        let mut line = String::new();
        BufReader::new(server.stdout.take().expect("stdout")).read_line(&mut line).expect("its ready line");
        let kubeconfig =
            PathBuf::from(line.trim().strip_prefix("ready ").unwrap_or_else(|| panic!("not ready: {line:?}")));
        let text = std::fs::read_to_string(&kubeconfig).expect("the kubeconfig");
        let address = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("server: http://"))
            .expect("a server URL")
            .trim_end_matches('/')
            .to_string();
        FakeCluster { dir, kubeconfig, address, server }
    }

    /// The state folder.
    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// One request to the fake's control endpoints: the JSON answered.
    pub fn control(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|body| body.to_string()).unwrap_or_default();
        let mut stream = std::net::TcpStream::connect(&self.address).expect("the fake API server answers");
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.address,
            body.len()
        )
        .expect("send");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("answer");
        let (head, rest) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
        assert!(head.starts_with("HTTP/1.1 2"), "{method} {path}: {head}");
        let rest = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            unchunk(rest)
        } else {
            rest.to_string()
        };
        serde_json::from_str(&rest).unwrap_or(Value::Null)
    }

    /// Asks the fake for failures (replacing those asked before).
    pub fn inject(&self, names: &[&str]) {
        self.control("POST", "/fake/faults", Some(serde_json::json!({ "faults": names })));
    }

    /// Ends every open watch, as a restarting or overloaded API server does.
    pub fn end_watches(&self) {
        self.control("POST", "/fake/watches/end", None);
    }

    /// Opens a watch gap: every watch ends, the Jobs and pods of `namespace` are deleted while
    /// none is open, and the history is compacted (a resumed watch gets 410 Gone); what was
    /// deleted, as `resource/name`.
    pub fn watch_gap(&self, namespace: &str) -> Vec<String> {
        let answer = self.control("POST", "/fake/watches/gap", Some(serde_json::json!({ "namespace": namespace })));
        answer["deleted"].as_array().into_iter().flatten().filter_map(|d| d.as_str().map(str::to_string)).collect()
    }

    /// Every object the fake stores.
    pub fn objects(&self) -> Vec<Value> {
        self.control("GET", "/fake/objects", None).as_array().cloned().unwrap_or_default()
    }

    /// `Kind/name` of what is left of Jobs, pods, NetworkPolicies and Secrets.
    pub fn leftovers(&self) -> Vec<String> {
        self.objects()
            .iter()
            .filter(|object| matches!(object["kind"].as_str(), Some("Job" | "Pod" | "NetworkPolicy" | "Secret")))
            .map(|object| format!("{}/{}", object["kind"].as_str().unwrap_or(""), object["metadata"]["name"]))
            .collect()
    }

    /// Waits (a minute at most) until nothing of a run is left: a pod's deletion takes its
    /// grace period on a real kubelet too.
    pub fn wait_clean(&self) {
        let until = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let left = self.leftovers();
            if left.is_empty() {
                return;
            }
            assert!(std::time::Instant::now() < until, "left behind: {left:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the isolation checker recorded: every episode of a running pod that no
    /// default-deny ingress NetworkPolicy selected (`violations`), and how many were dropped.
    pub fn isolation(&self) -> Value {
        self.control("GET", "/fake/violations", None)
    }

    /// The violations the isolation checker recorded, each as one line (pod, what was
    /// missing, during what), dropped ones counted.
    pub fn violations(&self) -> Vec<String> {
        let report = self.isolation();
        let mut lines: Vec<String> = report["violations"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| {
                let lasted = match (v["at_ms"].as_u64(), v["ended_ms"].as_u64()) {
                    (Some(at), Some(ended)) => format!("{} ms", ended.saturating_sub(at)),
                    _ => "until now".to_string(),
                };
                format!(
                    "pod {}/{} at {}: {} (seen at the {}; lasted {lasted})",
                    v["namespace"].as_str().unwrap_or(""),
                    v["pod"].as_str().unwrap_or(""),
                    v["at"].as_str().unwrap_or(""),
                    v["missing"].as_str().unwrap_or(""),
                    v["during"].as_str().unwrap_or(""),
                )
            })
            .collect();
        if let Some(dropped) = report["dropped"].as_u64().filter(|dropped| *dropped > 0) {
            lines.push(format!("and {dropped} more"));
        }
        lines
    }

    /// The API requests the fake counted.
    pub fn requests(&self) -> Value {
        self.control("GET", "/fake/stats", None)
    }

    /// Stops the server as a lost API server would be: nothing answers at its address.
    pub fn kill_server(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// The body of a chunked HTTP answer.
fn unchunk(mut text: &str) -> String {
    let mut body = String::new();
    while let Some((size, rest)) = text.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        body.push_str(&rest[..size]);
        text = rest[size..].trim_start_matches("\r\n");
    }
    body
}

impl Drop for FakeCluster {
    /// Ends the server (it kills its containers' sandboxes), then kills any sandbox it left:
    /// the PID 1 in `pods/<ns>/<pod>/<container>/init.pid` of every container still running.
    fn drop(&mut self) {
        let _ = self.server.stdin.take();
        let _ = Command::new("kill").args(["-TERM", &self.server.id().to_string()]).status();
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while self.server.try_wait().ok().flatten().is_none() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.server.kill();
        let _ = self.server.wait();
        let pods = self.state().join("pods");
        for namespace in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
            for pod in std::fs::read_dir(namespace.path()).into_iter().flatten().flatten() {
                for container in std::fs::read_dir(pod.path()).into_iter().flatten().flatten() {
                    if let Ok(pid) = std::fs::read_to_string(container.path().join("init.pid")) {
                        let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
                    }
                }
            }
        }
    }
}
