//! Test support: the Docker executor served in memory through `serve_io`, spoken to with
//! JSON-RPC lines, with side channels for tar streams and helpers that ask the engine directly.
//!
//! Every harness is its own runner id (`knotless-test-<pid>-<n>`), so every container a test
//! makes carries a label that [`Harness::finish`] checks is gone.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use knotless_executor_docker::DockerExecutor;
use knotless_protocol::channel::ChannelListener;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::oneshot;

/// The image of the tests, made by `tests/support/engine.sh` with `docker import`.
pub const IMAGE: &str = "knotless-test/busybox:1";

/// How long any one answer may take before a test fails.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

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
    pub runner_id: String,
    pub scratch: tempfile::TempDir,
}

impl Harness {
    /// A fresh executor of a fresh runner id, initialized with the test image as default.
    pub async fn new() -> Harness {
        let runner_id = format!("knotless-test-{}-{}", std::process::id(), RUNNERS.fetch_add(1, Ordering::SeqCst));
        Harness::for_runner(&runner_id).await
    }

    /// A fresh executor process of a given runner id (a runner restarted after a crash).
    pub async fn for_runner(runner_id: &str) -> Harness {
        let mut harness = Harness::uninitialized(runner_id).await;
        harness.initialize(json!({"image": IMAGE})).await.expect("initialize");
        harness
    }

    pub async fn uninitialized(runner_id: &str) -> Harness {
        let (input, executor_input) = tokio::io::duplex(1 << 20);
        let (executor_output, output) = tokio::io::duplex(1 << 20);
        let served =
            tokio::spawn(knotless_protocol::sdk::serve_io(DockerExecutor::default(), executor_input, executor_output));
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
            runner_id: runner_id.to_string(),
            scratch: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub async fn initialize(&mut self, config: Value) -> Result<Value, RpcError> {
        let runner = json!({"name": "knotless-run", "version": "0.1.0", "id": self.runner_id});
        self.request("initialize", json!({"protocol_versions": [1], "runner": runner, "config": config})).await
    }

    pub async fn send(&self, method: &str, params: Value) -> (u64, oneshot::Receiver<Value>) {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (sender, receiver) = oneshot::channel();
        self.pending.lock().expect("lock").insert(id, sender);
        let mut line = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .expect("encode");
        line.push(b'\n');
        let mut input = self.input.lock().await;
        input.as_mut().expect("input open").write_all(&line).await.expect("write");
        (id, receiver)
    }

    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let (_, receiver) = self.send(method, params).await;
        answer(receiver).await
    }

    /// Starts a session with the default image and no network.
    pub async fn start(&self, session: &str) -> Value {
        self.request("start", json!({"session": session, "timeout_ms": 60_000})).await.expect("start")
    }

    /// The name of a session's container.
    pub fn container(&self, session: &str) -> String {
        format!("knotless-{}-{session}", self.runner_id)
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

    /// Every notification so far, as text (to search for leaked values).
    pub fn notifications_text(&self) -> String {
        let notifications = self.notifications.lock().expect("lock");
        notifications.iter().map(Value::to_string).collect::<Vec<_>>().join("\n")
    }

    /// Uploads a tar archive into a session path.
    pub async fn upload(&self, session: &str, path: &str, archive: Vec<u8>) -> Result<Value, RpcError> {
        let socket = self.scratch.path().join(format!("up-{}.sock", self.next_id.load(Ordering::SeqCst)));
        let listener = ChannelListener::bind(&socket).expect("bind");
        let params = json!({"session": session, "path": path, "channel": socket.to_string_lossy(),
            "max_bytes": 1u64 << 30, "timeout_ms": 60_000});
        let (_, receiver) = self.send("upload", params).await;
        let writer = async {
            if let Ok(Ok(mut stream)) = tokio::time::timeout(ANSWER_WITHIN, listener.accept()).await {
                stream.write_all(&archive).await.expect("write the archive");
                let _ = stream.shutdown().await;
            }
        };
        let (_, answered) = tokio::join!(writer, answer(receiver));
        answered
    }

    /// Downloads a session path as a tar archive.
    pub async fn download(&self, session: &str, path: &str) -> (Result<Value, RpcError>, Vec<u8>) {
        let socket = self.scratch.path().join(format!("down-{}.sock", self.next_id.load(Ordering::SeqCst)));
        let listener = ChannelListener::bind(&socket).expect("bind");
        let params = json!({"session": session, "path": path, "channel": socket.to_string_lossy(),
            "max_bytes": 1u64 << 30, "timeout_ms": 60_000});
        let (_, receiver) = self.send("download", params).await;
        let reader = async {
            let mut bytes = Vec::new();
            if let Ok(Ok(mut stream)) = tokio::time::timeout(ANSWER_WITHIN, listener.accept()).await {
                let _ = stream.read_to_end(&mut bytes).await;
            }
            bytes
        };
        let (bytes, answered) = tokio::join!(reader, answer(receiver));
        (answered, bytes)
    }

    /// Closes the executor's stdin (its runner died) and waits for `serve_io` to return.
    pub async fn close_input(&mut self) {
        *self.input.lock().await = None;
        let served = self.served.take().expect("served once");
        tokio::time::timeout(ANSWER_WITHIN, served).await.expect("serve_io returns").expect("join").expect("serve_io");
    }

    /// Closes the executor's stdin, waits for `serve_io` to return, and checks that no
    /// container of this runner id is left.
    pub async fn finish(mut self) {
        self.close_input().await;
        assert_eq!(containers_of(&self.runner_id), Vec::<String>::new(), "containers left by {}", self.runner_id);
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

/// Every readable `/proc/*/cmdline` on the host that contains `needle`.
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

/// Whether `haystack` holds `needle`.
pub fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle.as_bytes())
}
