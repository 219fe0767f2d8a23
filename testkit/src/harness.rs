//! An executor served in memory: [`Harness`] runs any [`Executor`] through the SDK's
//! [`serve_io`] over a pair of in-memory pipes and speaks JSON-RPC lines to it, as a runner
//! would, recording every answer and notification for the test to look at.
//!
//! The pipes hold 64 KiB each way, as a Linux pipe does, so an executor that writes faster than
//! it is read waits as it would on a real pipe; every line it writes is one bounded frame
//! ([`knotless_protocol::framing`]). A line that is not a JSON-RPC message, or an answer to no
//! request waiting, is a protocol error: the harness records it, and every answer waited on
//! from then on fails with it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt as _;
use knotless_protocol::framing;
use knotless_protocol::messages::Method;
use knotless_protocol::sdk::{Executor, lock, serve_io};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, DuplexStream};
use tokio::sync::oneshot;
use tokio_util::codec::FramedRead;

/// How long any one answer may take before a test fails.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// How many bytes each in-memory pipe holds: a Linux pipe's capacity.
pub const PIPE_BYTES: usize = 64 * 1024;

/// A JSON-RPC error: its code and message.
pub type RpcError = (i64, String);

/// An answer on its way: the whole response message, or the protocol error that stopped it.
pub struct Reply(oneshot::Receiver<Result<Value, String>>);

/// What the reader of the executor's output shares with the harness.
#[derive(Default)]
struct Received {
    waiting: Mutex<Waiting>,
    notifications: Mutex<Vec<Value>>,
}

impl Received {
    /// Waits for the answer to request `id`, unless no answer comes any more.
    fn waiting_for(&self, id: u64, sender: oneshot::Sender<Result<Value, String>>) {
        let mut waiting = lock(&self.waiting);
        match waiting.ended.clone() {
            Some(why) => {
                let _ = sender.send(Err(why));
            }
            None => {
                waiting.pending.insert(id, sender);
            }
        }
    }
}

/// The requests waiting for an answer, and why none will come any more, once none will.
#[derive(Default)]
struct Waiting {
    pending: HashMap<u64, oneshot::Sender<Result<Value, String>>>,
    /// The executor's first protocol error, or the end of its output.
    ended: Option<String>,
}

impl Waiting {
    /// No answer comes any more, for `why`: every request waiting fails with the first reason.
    fn end(&mut self, why: String) {
        let why = self.ended.get_or_insert(why).clone();
        for (_, sender) in self.pending.drain() {
            let _ = sender.send(Err(why.clone()));
        }
    }
}

/// An executor served in memory through `serve_io`, and the runner's end of its pipes.
pub struct Harness {
    input: tokio::sync::Mutex<Option<DuplexStream>>,
    received: Arc<Received>,
    next_id: AtomicU64,
    served: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    runner_id: String,
    /// A private folder of this harness: the side channels' sockets, and whatever the test
    /// keeps there.
    scratch: tempfile::TempDir,
}

/// A runner id of its own for one harness, `PREFIX-<pid>-<n>`, so that one test's `cleanup`
/// never touches another's.
pub fn unique_runner_id(prefix: &str) -> String {
    static RUNNERS: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}-{}", std::process::id(), RUNNERS.fetch_add(1, Ordering::SeqCst))
}

impl Harness {
    /// Serves `executor` in memory as runner `runner_id`; nothing is sent yet, not even
    /// `initialize`. Call it inside a tokio runtime.
    pub fn serve<E: Executor>(executor: E, runner_id: impl Into<String>) -> Harness {
        let (input, executor_input) = tokio::io::duplex(PIPE_BYTES);
        let (executor_output, output) = tokio::io::duplex(PIPE_BYTES);
        let served = tokio::spawn(serve_io(executor, executor_input, executor_output));
        let mut harness = Harness::over(input, output, runner_id.into());
        harness.served = Some(served);
        harness
    }

    /// The runner's end of a peer's pipes: `input` is what the peer reads, `output` what it
    /// writes.
    fn over(input: DuplexStream, output: impl AsyncRead + Send + Unpin + 'static, runner_id: String) -> Harness {
        let received = Arc::new(Received::default());
        tokio::spawn(read_output(output, received.clone()));
        Harness {
            input: tokio::sync::Mutex::new(Some(input)),
            received,
            next_id: AtomicU64::new(1),
            served: None,
            runner_id,
            scratch: tempfile::tempdir().expect("a scratch folder"),
        }
    }

    /// The runner id this harness speaks as.
    pub fn runner_id(&self) -> &str {
        &self.runner_id
    }

    /// The harness's private folder, removed with it.
    pub fn scratch(&self) -> &Path {
        self.scratch.path()
    }

    /// Sends `initialize` with protocol version 1, this harness's runner id, and `config`.
    pub async fn initialize(&self, config: Value) -> Result<Value, RpcError> {
        let runner = json!({"name": "knotless-run", "version": "0.1.0", "id": self.runner_id});
        self.request("initialize", json!({"protocol_versions": [1], "runner": runner, "config": config})).await
    }

    /// Sends a request; its answer comes through the [`Reply`] (see [`answer`]).
    pub async fn send(&self, method: &str, params: Value) -> (u64, Reply) {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (sender, receiver) = oneshot::channel();
        self.received.waiting_for(id, sender);
        self.write(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        (id, Reply(receiver))
    }

    /// Writes one message as a line on the executor's stdin.
    pub async fn write(&self, message: Value) {
        let mut line = serde_json::to_vec(&message).expect("a message encodes");
        line.push(b'\n');
        let mut input = self.input.lock().await;
        input.as_mut().expect("the executor's stdin is open").write_all(&line).await.expect("write to the executor");
    }

    /// Sends `cancel` for the request `id`.
    pub async fn cancel(&self, id: u64) {
        self.write(json!({"jsonrpc": "2.0", "method": "cancel", "params": {"id": id}})).await;
    }

    /// Sends a request and waits for its answer.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let (_, reply) = self.send(method, params).await;
        answer(reply).await
    }

    /// Sends a request of method `M` with typed parameters and reads its typed result.
    pub async fn call<M: Method>(&self, params: &M::Params) -> Result<M::Result, RpcError> {
        let params = serde_json::to_value(params).expect("parameters encode");
        let result = self.request(M::NAME, params).await?;
        Ok(serde_json::from_value(result)
            .unwrap_or_else(|error| panic!("the answer to {} is not its result type: {error}", M::NAME)))
    }

    /// Starts a session with the executor's defaults, giving it a minute.
    pub async fn start(&self, session: &str) -> Value {
        self.request("start", json!({"session": session, "timeout_ms": 60_000})).await.expect("start")
    }

    /// Runs step `step` of `session`: `script` with `GREETING=hello` and `secrets`.
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

    /// Every notification so far, in the order the executor sent them.
    pub fn notifications(&self) -> Vec<Value> {
        lock(&self.received.notifications).clone()
    }

    /// Every notification so far, as text (to search for leaked values).
    pub fn notifications_text(&self) -> String {
        let notifications = lock(&self.received.notifications);
        notifications.iter().map(Value::to_string).collect::<Vec<_>>().join("\n")
    }

    /// Everything a step wrote on a stream (`stdout` or `stderr`) so far.
    pub fn output(&self, session: &str, step: u32, stream: &str) -> String {
        let notifications = lock(&self.received.notifications);
        let mut bytes = Vec::new();
        for notification in notifications.iter().filter(|message| message["method"] == "output") {
            let params = &notification["params"];
            if params["session"] == session && params["step"] == step && params["stream"] == stream {
                let data = params["data"].as_str().expect("output data is a string");
                bytes.extend(base64::engine::general_purpose::STANDARD.decode(data).expect("output data is base64"));
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Uploads a tar archive to `path` in `session` over a side channel.
    pub async fn upload(&self, session: &str, path: &str, archive: Vec<u8>) -> Result<Value, RpcError> {
        let (reply, stream) = self.transfer("upload", session, path).await;
        let writer = tokio::spawn(async move {
            if let Some(mut stream) = stream.await {
                stream.write_all(&archive).await.expect("write the archive");
                let _ = stream.shutdown().await;
            }
        });
        let answered = answer(reply).await;
        // A refused upload may never have read the stream: the writer is not waited for then.
        if answered.is_ok() {
            writer.await.expect("the archive's writer");
        } else {
            writer.abort();
        }
        answered
    }

    /// Downloads `path` in `session` over a side channel: the answer, and the bytes that came.
    pub async fn download(&self, session: &str, path: &str) -> (Result<Value, RpcError>, Vec<u8>) {
        let (reply, stream) = self.transfer("download", session, path).await;
        let reader = tokio::spawn(async move {
            let mut bytes = Vec::new();
            if let Some(mut stream) = stream.await {
                stream.read_to_end(&mut bytes).await.expect("read the archive");
            }
            bytes
        });
        let answered = answer(reply).await;
        // An executor answers a download once it has written it all; one that refused it may
        // never have connected.
        let bytes = if answered.is_ok() {
            reader.await.expect("the archive's reader")
        } else {
            reader.abort();
            Vec::new()
        };
        (answered, bytes)
    }

    /// Sends an `upload` or `download` over a fresh side channel: its reply, and the stream
    /// the executor connects (`None` if it does not within [`ANSWER_WITHIN`]).
    async fn transfer(
        &self,
        method: &str,
        session: &str,
        path: &str,
    ) -> (Reply, impl Future<Output = Option<impl AsyncRead + AsyncWrite + Unpin>> + Send + 'static) {
        let number = self.next_id.load(Ordering::SeqCst);
        let socket = self.scratch.path().join(format!("{method}-{number}.sock"));
        let listener = knotless_protocol::channel::ChannelListener::bind(&socket).expect("bind a side channel");
        let params = json!({"session": session, "path": path, "channel": socket.to_string_lossy(),
            "max_bytes": 1u64 << 30, "timeout_ms": 60_000});
        let (_, reply) = self.send(method, params).await;
        let stream = async move { tokio::time::timeout(ANSWER_WITHIN, listener.accept()).await.ok()?.ok() };
        (reply, stream)
    }

    /// Closes the executor's stdin (as a runner that died would) and waits for `serve_io` to
    /// return, which it must do without an error.
    pub async fn close_input(&mut self) {
        *self.input.lock().await = None;
        let served = self.served.take().expect("the executor is served, and only once");
        tokio::time::timeout(ANSWER_WITHIN, served)
            .await
            .expect("serve_io returns at the end of its stdin")
            .expect("serve_io does not panic")
            .expect("serve_io ends without an error");
    }
}

/// Waits for an answer: the result, or the error's code and message. Fails the test when no
/// answer comes within [`ANSWER_WITHIN`] or the executor broke the protocol.
pub async fn answer(reply: Reply) -> Result<Value, RpcError> {
    let message = tokio::time::timeout(ANSWER_WITHIN, reply.0)
        .await
        .expect("answered in time")
        .expect("the executor's output is read to its end")
        .unwrap_or_else(|fault| panic!("no answer came: the executor {fault}"));
    match message.get("error") {
        Some(error) => Err((
            error["code"].as_i64().expect("an error has a code"),
            error["message"].as_str().expect("an error has a message").to_string(),
        )),
        None => Ok(message["result"].clone()),
    }
}

/// Reads the executor's output to its end: answers to their requests, notifications kept in
/// order. After its first protocol error, or the end of its output, every answer waited on
/// fails.
async fn read_output(output: impl AsyncRead + Unpin, received: Arc<Received>) {
    let mut frames = FramedRead::new(output, framing::codec());
    while let Some(frame) = frames.next().await {
        let fault = match frame {
            Ok(frame) => match serde_json::from_slice::<Value>(&frame) {
                Ok(message) => route(message, &received),
                Err(_) => Some(format!("wrote a line that is not JSON: {}", framing::first_bytes(&frame))),
            },
            Err(error) => Some(format!("wrote a frame that cannot be read: {error}")),
        };
        if let Some(fault) = fault {
            lock(&received.waiting).end(fault);
        }
    }
    lock(&received.waiting).end("closed its stdout".into());
}

/// Hands an answer to its request, or keeps a notification; says why a message is neither.
fn route(message: Value, received: &Received) -> Option<String> {
    if message.get("jsonrpc") != Some(&json!("2.0")) {
        return Some(format!("wrote a message that is not JSON-RPC 2.0: {message}"));
    }
    match message.get("id") {
        Some(id) => {
            let sender = id.as_u64().and_then(|id| lock(&received.waiting).pending.remove(&id));
            match sender {
                Some(sender) => {
                    let _ = sender.send(Ok(message));
                    None
                }
                None => Some(format!("answered no request waiting: {message}")),
            }
        }
        None if message.get("method").is_some() => {
            lock(&received.notifications).push(message);
            None
        }
        None => Some(format!("wrote a message that is neither an answer nor a notification: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eventually;
    use tokio::io::{AsyncBufReadExt as _, BufReader};

    /// A harness over a hand-written peer: the peer's end of both pipes.
    fn with_peer() -> (Harness, BufReader<DuplexStream>, DuplexStream) {
        let (input, peer_input) = tokio::io::duplex(PIPE_BYTES);
        let (peer_output, output) = tokio::io::duplex(PIPE_BYTES);
        (Harness::over(input, output, "runner".into()), BufReader::new(peer_input), peer_output)
    }

    async fn read_request(peer: &mut BufReader<DuplexStream>) -> Value {
        let mut line = String::new();
        peer.read_line(&mut line).await.expect("a request");
        serde_json::from_str(&line).expect("a JSON request")
    }

    #[tokio::test]
    async fn answers_reach_their_requests_and_notifications_are_kept_in_order() {
        let (harness, mut peer_input, mut peer_output) = with_peer();
        let (first, first_reply) = harness.send("ping", json!({})).await;
        let (second, second_reply) = harness.send("ping", json!({})).await;
        assert_eq!(read_request(&mut peer_input).await["id"], first);
        assert_eq!(read_request(&mut peer_input).await["method"], "ping");
        let lines = [
            json!({"jsonrpc": "2.0", "method": "output", "params": {"session": "s", "step": 0, "stream": "stdout", "data": "aGk="}}),
            json!({"jsonrpc": "2.0", "id": second, "error": {"code": -32001, "message": "no"}}),
            json!({"jsonrpc": "2.0", "method": "output", "params": {"session": "s", "step": 0, "stream": "stdout", "data": "IQ=="}}),
            json!({"jsonrpc": "2.0", "id": first, "result": {}}),
        ];
        for line in lines {
            peer_output.write_all(format!("{line}\n").as_bytes()).await.expect("write");
        }
        assert_eq!(answer(second_reply).await, Err((-32001, "no".to_string())));
        assert_eq!(answer(first_reply).await, Ok(json!({})));
        assert_eq!(harness.output("s", 0, "stdout"), "hi!");
        assert_eq!(harness.notifications().len(), 2);
    }

    #[tokio::test]
    async fn a_line_that_is_not_json_fails_the_answers_waited_on() {
        let (harness, _peer_input, mut peer_output) = with_peer();
        let (_, reply) = harness.send("ping", json!({})).await;
        peer_output.write_all(b"hello from a careless print\n").await.expect("write");
        let failed = tokio::spawn(answer(reply)).await.expect_err("the answer fails");
        assert!(failed.is_panic());
        let message = failed.into_panic();
        let message = message.downcast_ref::<String>().expect("a message");
        assert!(message.ends_with("not JSON: hello from a careless print"), "{message}");
    }

    #[tokio::test]
    async fn an_answer_to_no_request_is_a_protocol_error() {
        let (harness, _peer_input, mut peer_output) = with_peer();
        peer_output.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":99,\"result\":{}}\n").await.expect("write");
        // The fault stands for every later request: its answer fails at once.
        assert!(eventually(ANSWER_WITHIN, || lock(&harness.received.waiting).ended.is_some()).await);
        let (_, reply) = harness.send("ping", json!({})).await;
        let failed = tokio::spawn(answer(reply)).await.expect_err("the answer fails");
        let message = failed.into_panic();
        let message = message.downcast_ref::<String>().expect("a message");
        assert!(message.contains("answered no request waiting"), "{message}");
    }

    #[tokio::test]
    async fn the_end_of_the_output_fails_the_answers_waited_on() {
        let (harness, _peer_input, peer_output) = with_peer();
        let (_, reply) = harness.send("ping", json!({})).await;
        drop(peer_output);
        let failed = tokio::spawn(answer(reply)).await.expect_err("the answer fails");
        let message = failed.into_panic();
        let message = message.downcast_ref::<String>().expect("a message");
        assert!(message.contains("closed its stdout"), "{message}");
    }

    #[test]
    fn runner_ids_are_unique_in_a_test_process() {
        let (one, two) = (unique_runner_id("t"), unique_runner_id("t"));
        assert_ne!(one, two);
        assert!(one.starts_with(&format!("t-{}-", std::process::id())), "{one}");
    }
}
