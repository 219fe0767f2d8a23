//! Drives the built `knotless-executor-fake` over its stdin and stdout: the well-behaved mode
//! end to end, and the misbehaviours the runner's tests rely on.

use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use knotless_protocol::channel::ChannelListener;
use knotless_protocol::error::code;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// A guard against a test hanging forever on a broken fake, not a wait for a race.
const PATIENCE: Duration = Duration::from_secs(30);

struct Fake {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Fake {
    fn spawn(mode: Option<&str>) -> Fake {
        let mut command = Command::new(env!("CARGO_BIN_EXE_knotless-executor-fake"));
        if let Some(mode) = mode {
            command.args(["--mode", mode]);
        }
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = command.spawn().expect("spawn the fake");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Fake { child, stdin, stdout }
    }

    async fn send(&mut self, message: Value) {
        let mut line = serde_json::to_vec(&message).expect("encode");
        line.push(b'\n');
        self.stdin.write_all(&line).await.expect("write to the fake");
        self.stdin.flush().await.expect("flush");
    }

    async fn request(&mut self, id: u64, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
    }

    /// The next stdout line, or `None` at the end of stdout.
    async fn next_line(&mut self) -> Option<String> {
        tokio::time::timeout(PATIENCE, self.stdout.next_line()).await.expect("the fake answers in time").expect("read")
    }

    async fn next(&mut self) -> Value {
        let line = self.next_line().await.expect("a line before the end of stdout");
        serde_json::from_str(&line).unwrap_or_else(|error| panic!("not json ({error}): {line}"))
    }

    /// Reads until the answer to `id`, collecting the notifications before it.
    async fn answer(&mut self, id: u64) -> (Value, Vec<Value>) {
        let mut notifications = Vec::new();
        loop {
            let message = self.next().await;
            if message.get("id") == Some(&json!(id)) {
                return (message, notifications);
            }
            assert!(message.get("method").is_some(), "an answer to another request: {message}");
            notifications.push(message);
        }
    }

    async fn call(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.request(id, method, params).await;
        let (answer, _) = self.answer(id).await;
        answer
    }

    async fn initialize(&mut self, config: Value) -> Value {
        let params = json!({
            "protocol_versions": [1],
            "runner": {"name": "knotless-run", "version": "0.1.0", "id": "runner-1"},
            "config": config,
        });
        self.call(1, "initialize", params).await
    }

    /// Waits for the fake to exit, returning its code and its stderr.
    async fn exit(mut self) -> (Option<i32>, String) {
        drop(self.stdin);
        let mut stderr = String::new();
        let mut pipe = self.child.stderr.take().expect("stderr");
        tokio::time::timeout(PATIENCE, pipe.read_to_string(&mut stderr))
            .await
            .expect("stderr ends")
            .expect("read stderr");
        let status = tokio::time::timeout(PATIENCE, self.child.wait()).await.expect("the fake exits").expect("wait");
        (status.code(), stderr)
    }
}

fn decoded(notifications: &[Value], stream: &str) -> String {
    let mut text = Vec::new();
    for notification in notifications.iter().filter(|n| n["method"] == "output" && n["params"]["stream"] == stream) {
        let data = notification["params"]["data"].as_str().expect("data");
        text.extend(base64::engine::general_purpose::STANDARD.decode(data).expect("base64"));
    }
    String::from_utf8(text).expect("utf-8")
}

fn ledger(path: &std::path::Path) -> Vec<String> {
    serde_json::from_str(&std::fs::read_to_string(path).expect("ledger")).expect("ledger json")
}

#[tokio::test]
async fn ok_mode_handshakes_runs_a_step_and_cleans_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger_path = dir.path().join("ledger.json");
    let config = json!({"work-dir": dir.path().join("work"), "ledger": ledger_path});
    let mut fake = Fake::spawn(None);
    let init = fake.initialize(config).await;
    assert_eq!(init["result"]["protocol_version"], 1, "{init}");
    assert_eq!(init["result"]["executor"]["name"], "fake");
    assert_eq!(init["result"]["capabilities"]["isolation"], "none");
    assert_eq!(init["result"]["capabilities"]["outputs"], true);

    let start = fake.call(2, "start", json!({"session": "s1", "timeout_ms": 5000})).await;
    let work = start["result"]["paths"]["work"].as_str().expect("work path").to_string();
    assert!(std::path::Path::new(&work).is_dir());
    assert_eq!(ledger(&ledger_path), ["s1"]);

    let script = "echo \"hello $GREETING\"; echo oops >&2; test -z \"$HOME\"; pwd; exit 3";
    let params =
        json!({"session": "s1", "step": 4, "script": script, "env": {"GREETING": "world"}, "timeout_ms": 10000});
    fake.request(3, "command", params).await;
    let (answer, notifications) = fake.answer(3).await;
    assert_eq!(answer["result"]["exit_code"], 3, "{answer}");
    assert!(notifications.iter().all(|n| n["params"]["step"] == 4 && n["params"]["session"] == "s1"));
    assert_eq!(decoded(&notifications, "stdout"), format!("hello world\n{work}\n"));
    assert_eq!(decoded(&notifications, "stderr"), "oops\n");

    let unknown = fake.call(4, "no-such-method", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32601);
    assert_eq!(fake.call(5, "ping", json!({})).await["result"], json!({}));

    let stop = fake.call(6, "stop", json!({"session": "s1", "timeout_ms": 5000})).await;
    assert_eq!(stop["result"]["removed"][0]["session"], "s1", "{stop}");
    assert!(!std::path::Path::new(&work).exists());
    assert!(ledger(&ledger_path).is_empty());

    assert_eq!(fake.call(7, "shutdown", json!({})).await["result"], json!({}));
    assert_eq!(fake.next_line().await, None, "nothing after the shutdown answer");
    let (code, _) = fake.exit().await;
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn a_step_is_killed_at_its_timeout_and_on_cancel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fake = Fake::spawn(None);
    fake.initialize(json!({"work-dir": dir.path()})).await;
    fake.call(2, "start", json!({"session": "s1", "timeout_ms": 5000})).await;

    let timed_out =
        fake.call(3, "command", json!({"session": "s1", "step": 0, "script": "sleep 60", "timeout_ms": 100})).await;
    assert_eq!(timed_out["error"]["code"], code::TIMEOUT, "{timed_out}");

    let params = json!({"session": "s1", "step": 1, "script": "echo started; sleep 60", "timeout_ms": 60000});
    fake.request(4, "command", params).await;
    let started = fake.next().await;
    assert_eq!(started["method"], "output", "the step starts before it is cancelled");
    fake.send(json!({"jsonrpc": "2.0", "method": "cancel", "params": {"id": 4}})).await;
    let (cancelled, _) = fake.answer(4).await;
    assert_eq!(cancelled["error"]["code"], code::CANCELLED, "{cancelled}");
    let (code, _) = fake.exit().await;
    assert_eq!(code, Some(0), "the end of stdin is a clean exit");
}

#[tokio::test]
async fn upload_and_download_count_the_tar_stream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fake = Fake::spawn(None);
    fake.initialize(json!({"work-dir": dir.path().join("work"), "mode": "bad-transfer"})).await;
    fake.call(2, "start", json!({"session": "s1", "timeout_ms": 5000})).await;

    let source = dir.path().join("source");
    std::fs::create_dir_all(source.join("sub")).expect("mkdir");
    std::fs::write(source.join("sub/file.txt"), "payload").expect("write");
    let archive = knotless_protocol::tarball::pack_dir(&source, Vec::new()).expect("pack");
    let listener = ChannelListener::bind(&dir.path().join("up.sock")).expect("bind");
    let params =
        json!({"session": "s1", "path": "in", "channel": listener.path(), "max_bytes": 1 << 20, "timeout_ms": 10000});
    fake.request(3, "upload", params).await;
    let mut stream = listener.accept().await.expect("accept");
    stream.write_all(&archive).await.expect("send the archive");
    drop(stream);
    let (upload, _) = fake.answer(3).await;
    assert_eq!(upload["result"]["bytes"], archive.len() as u64, "{upload}");

    let listener = ChannelListener::bind(&dir.path().join("down.sock")).expect("bind");
    let params =
        json!({"session": "s1", "path": "in", "channel": listener.path(), "max_bytes": 1 << 20, "timeout_ms": 10000});
    fake.request(4, "download", params).await;
    let mut stream = listener.accept().await.expect("accept");
    let mut received = Vec::new();
    stream.read_to_end(&mut received).await.expect("read the archive");
    let (download, _) = fake.answer(4).await;
    let back = dir.path().join("back");
    knotless_protocol::tarball::unpack_vetted(&received[..], &back, 1 << 20).expect("unpack");
    assert_eq!(std::fs::read_to_string(back.join("sub/file.txt")).expect("read"), "payload");
    assert_eq!(download["result"]["bytes"], received.len() as u64 + 1, "bad-transfer claims one byte more");
}

#[tokio::test]
async fn refuse_version_answers_unsupported_version() {
    let mut fake = Fake::spawn(Some("refuse-version"));
    let answer = fake.initialize(json!({})).await;
    assert_eq!(answer["error"]["code"], code::UNSUPPORTED_VERSION, "{answer}");
    assert_eq!(answer["error"]["data"], json!({"offered": [1], "supported": [2]}));
    let (code, _) = fake.exit().await;
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn exit_before_handshake_exits_3_with_its_line() {
    let fake = Fake::spawn(Some("exit-before-handshake"));
    let (code, stderr) = fake.exit().await;
    assert_eq!(code, Some(3));
    assert!(stderr.contains("fake: exiting before the handshake"), "{stderr}");
}

#[tokio::test]
async fn crash_mid_step_exits_101_after_one_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fake = Fake::spawn(Some("crash-mid-step"));
    assert_eq!(fake.initialize(json!({"work-dir": dir.path()})).await["result"]["protocol_version"], 1);
    fake.call(2, "start", json!({"session": "s1", "timeout_ms": 5000})).await;
    fake.request(3, "command", json!({"session": "s1", "step": 0, "script": "echo never", "timeout_ms": 5000})).await;
    let output = fake.next().await;
    assert_eq!(output["method"], "output");
    assert_eq!(decoded(&[output], "stdout"), "partial output\n");
    assert_eq!(fake.next_line().await, None, "nothing after the partial output");
    let (code, stderr) = fake.exit().await;
    assert_eq!(code, Some(101));
    assert!(stderr.contains("fake: crashing mid-step (simulated)"), "{stderr}");
}
