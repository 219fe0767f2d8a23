//! Test support: the shell executor served in memory through `serve_io`, spoken to with
//! JSON-RPC lines, and helpers to look at `/proc`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use knotless_executor_shell::ShellExecutor;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::oneshot;

/// How long any one answer may take before a test fails.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// Each harness is its own runner, so that one test's `cleanup` never touches another's.
static RUNNERS: AtomicU64 = AtomicU64::new(0);

/// A JSON-RPC error: code and message.
pub type RpcError = (i64, String);

/// An executor served in memory, and the client end of its streams.
pub struct Harness {
    input: tokio::sync::Mutex<Option<DuplexStream>>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>,
    notifications: Arc<Mutex<Vec<Value>>>,
    next_id: AtomicU64,
    served: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    pub work_dir: tempfile::TempDir,
    pub runner_id: String,
}

impl Harness {
    /// Serves a fresh executor and initializes it with a private work folder.
    pub async fn new() -> Harness {
        let mut harness = Harness::uninitialized().await;
        let work_dir = harness.work_dir.path().to_string_lossy().into_owned();
        harness.initialize(json!({"work-dir": work_dir})).await.expect("initialize");
        harness
    }

    /// Serves a fresh executor without initializing it.
    pub async fn uninitialized() -> Harness {
        let (input, executor_input) = tokio::io::duplex(1 << 20);
        let (executor_output, output) = tokio::io::duplex(1 << 20);
        let served = tokio::spawn(knotless_protocol::sdk::serve_io(executor(), executor_input, executor_output));
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>> = Arc::default();
        let notifications: Arc<Mutex<Vec<Value>>> = Arc::default();
        let (reader_pending, reader_notifications) = (pending.clone(), notifications.clone());
        tokio::spawn(async move {
            let mut lines = BufReader::new(output).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let message: Value = serde_json::from_str(&line).expect("the executor writes JSON lines only");
                match message.get("id").and_then(Value::as_u64) {
                    Some(id) => {
                        if let Some(sender) = reader_pending.lock().expect("lock").remove(&id) {
                            let _ = sender.send(message);
                        }
                    }
                    None => reader_notifications.lock().expect("lock").push(message),
                }
            }
        });
        Harness {
            input: tokio::sync::Mutex::new(Some(input)),
            pending,
            notifications,
            next_id: AtomicU64::new(1),
            served: Some(served),
            work_dir: tempfile::tempdir().expect("tempdir"),
            runner_id: format!("runner-{}-{}", std::process::id(), RUNNERS.fetch_add(1, Ordering::SeqCst)),
        }
    }

    pub async fn initialize(&mut self, config: Value) -> Result<Value, RpcError> {
        let runner = json!({"name": "knotless-run", "version": "0.1.0", "id": self.runner_id});
        self.request("initialize", json!({"protocol_versions": [1], "runner": runner, "config": config})).await
    }

    /// Sends a request; the receiver gets the whole response message.
    pub async fn send(&self, method: &str, params: Value) -> (u64, oneshot::Receiver<Value>) {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (sender, receiver) = oneshot::channel();
        self.pending.lock().expect("lock").insert(id, sender);
        self.write(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        (id, receiver)
    }

    pub async fn write(&self, message: Value) {
        let mut line = serde_json::to_vec(&message).expect("encode");
        line.push(b'\n');
        let mut input = self.input.lock().await;
        input.as_mut().expect("input open").write_all(&line).await.expect("write");
    }

    /// Sends a request and waits for its answer.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let (_, receiver) = self.send(method, params).await;
        answer(receiver).await
    }

    pub async fn start(&self, session: &str) -> Value {
        self.request("start", json!({"session": session, "timeout_ms": 10_000})).await.expect("start")
    }

    pub async fn command(
        &self,
        session: &str,
        step: u32,
        script: &str,
        secrets: Value,
        timeout_ms: u64,
    ) -> Result<Value, RpcError> {
        let params = json!({"session": session, "step": step, "name": format!("step-{step}"), "script": script,
            "env": {"GREETING": "hello"}, "secrets": secrets, "timeout_ms": timeout_ms});
        self.request("command", params).await
    }

    /// Everything a step wrote on a stream so far.
    pub fn output(&self, session: &str, step: u32, stream: &str) -> String {
        let notifications = self.notifications.lock().expect("lock");
        let mut bytes = Vec::new();
        for notification in notifications.iter().filter(|message| message["method"] == "output") {
            let params = &notification["params"];
            if params["session"] == session && params["step"] == step && params["stream"] == stream {
                let data = params["data"].as_str().expect("data");
                bytes.extend(base64::engine::general_purpose::STANDARD.decode(data).expect("base64"));
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The folder of a session of this harness's runner.
    pub fn session_dir(&self, session: &str) -> PathBuf {
        self.work_dir.path().canonicalize().expect("canonical").join(&self.runner_id).join(session)
    }

    /// Closes the executor's stdin and waits for `serve_io` to return.
    pub async fn close_input(&mut self) {
        *self.input.lock().await = None;
        let served = self.served.take().expect("served once");
        tokio::time::timeout(ANSWER_WITHIN, served).await.expect("serve_io returns").expect("join").expect("serve_io");
    }
}

/// Waits for an answer: the result, or the error's code and message.
pub async fn answer(receiver: oneshot::Receiver<Value>) -> Result<Value, RpcError> {
    let message = tokio::time::timeout(ANSWER_WITHIN, receiver).await.expect("answered in time").expect("answered");
    match message.get("error") {
        Some(error) => {
            Err((error["code"].as_i64().expect("code"), error["message"].as_str().expect("message").to_string()))
        }
        None => Ok(message["result"].clone()),
    }
}

/// Polls `condition` until it holds or `within` passes; returns whether it held.
pub async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a process lives (exists and is not a zombie).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').map(|(_, fields)| !fields.trim_start().starts_with('Z')).unwrap_or(false),
        Err(_) => false,
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

/// The live processes whose environment holds `NAME=value` exactly.
pub fn processes_with(variable: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else {
            continue;
        };
        if !alive(pid) {
            continue;
        }
        if let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ"))
            && environ.split(|&byte| byte == 0).any(|entry| entry == variable.as_bytes())
        {
            found.push(pid);
        }
    }
    found
}

/// Every readable `/proc/*/cmdline` that contains `needle`.
pub fn cmdlines_containing(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && cmdline.windows(needle.len()).any(|window| window == needle.as_bytes())
        {
            found.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
        }
    }
    found
}

/// The executor served in this test process.
pub fn executor() -> ShellExecutor {
    ShellExecutor::default()
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
