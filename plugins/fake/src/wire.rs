//! The fake's side of the wire: the one writer that owns stdout, the error it answers with,
//! and the JSON-RPC shapes of replies and notifications.

use std::sync::Arc;

use base64::Engine as _;
use knotless_protocol::error::code;
use knotless_protocol::messages::{OutputParams, Stream, method};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

/// JSON-RPC's own codes, which the protocol crate leaves to JSON-RPC.
pub mod rpc {
    /// The line is not JSON.
    pub const PARSE_ERROR: i32 = -32700;
    /// The message is not a request.
    pub const INVALID_REQUEST: i32 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i32 = -32601;
    /// The parameters do not fit the method.
    pub const INVALID_PARAMS: i32 = -32602;
}

/// An error answer: a code, a lowercase message and optional detail.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// The JSON-RPC error code.
    pub code: i32,
    /// One line, lowercase.
    pub message: String,
    /// Structured detail.
    pub data: Option<Value>,
}

impl Fault {
    /// A fault with a code and a message.
    pub fn new(code: i32, message: impl Into<String>) -> Fault {
        Fault { code, message: message.into(), data: None }
    }

    /// Adds structured detail.
    pub fn with_data(mut self, data: Value) -> Fault {
        self.data = Some(data);
        self
    }

    /// The environment failed.
    pub fn infrastructure(message: impl Into<String>) -> Fault {
        Fault::new(code::INFRASTRUCTURE, message)
    }

    /// The configuration or the request is wrong.
    pub fn configuration(message: impl Into<String>) -> Fault {
        Fault::new(code::CONFIGURATION, message)
    }

    /// The session is not known.
    pub fn unknown_session(session: &str) -> Fault {
        Fault::new(code::UNKNOWN_SESSION, format!("no session {session}"))
    }

    /// The request was cancelled.
    pub fn cancelled() -> Fault {
        Fault::new(code::CANCELLED, "cancelled")
    }

    fn to_json(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(data) = &self.data {
            error["data"] = data.clone();
        }
        error
    }
}

/// Parses a request's params into a message type, or answers INVALID_PARAMS.
pub fn params<T: serde::de::DeserializeOwned>(params: Option<&Value>) -> Result<T, Fault> {
    let value = params.cloned().unwrap_or(Value::Null);
    serde_json::from_value(value).map_err(|error| Fault::new(rpc::INVALID_PARAMS, format!("invalid params: {error}")))
}

/// Serializes a result, or answers an internal error.
pub fn result<T: Serialize>(value: &T) -> Result<Value, Fault> {
    serde_json::to_value(value).map_err(|error| Fault::new(-32603, format!("cannot encode the result: {error}")))
}

/// The single writer of stdout: every line is written whole and flushed under one lock.
#[derive(Clone)]
pub struct Out {
    stdout: Arc<Mutex<tokio::io::Stdout>>,
}

impl Out {
    /// The writer of this process's stdout.
    pub fn stdout() -> Out {
        Out { stdout: Arc::new(Mutex::new(tokio::io::stdout())) }
    }

    /// Writes bytes and a newline, then flushes.
    pub async fn line(&self, bytes: &[u8]) -> anyhow::Result<()> {
        let mut frame = Vec::with_capacity(bytes.len() + 1);
        frame.extend_from_slice(bytes);
        frame.push(b'\n');
        let mut stdout = self.stdout.lock().await;
        stdout.write_all(&frame).await?;
        stdout.flush().await?;
        Ok(())
    }

    /// Answers a request. A runner that went away is only reported on stderr.
    pub async fn reply(&self, id: Value, outcome: Result<Value, Fault>) {
        self.reply_then(id, outcome, Vec::new()).await
    }

    /// Answers a request and writes the lines `after` it in the same write, so that nothing
    /// comes between (`late-output`).
    pub async fn reply_then(&self, id: Value, outcome: Result<Value, Fault>, after: Vec<Vec<u8>>) {
        let message = match outcome {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err(fault) => json!({"jsonrpc": "2.0", "id": id, "error": fault.to_json()}),
        };
        let mut frames = serde_json::to_vec(&message).unwrap_or_default();
        frames.push(b'\n');
        for line in after {
            frames.extend_from_slice(&line);
            frames.push(b'\n');
        }
        let mut stdout = self.stdout.lock().await;
        let written = async {
            stdout.write_all(&frames).await?;
            stdout.flush().await
        };
        if let Err(error) = written.await {
            eprintln!("fake: cannot write a reply: {error}");
        }
    }

    /// Sends bytes a step wrote as an `output` notification.
    pub async fn output(&self, session: &str, step: u32, stream: Stream, bytes: &[u8]) -> anyhow::Result<()> {
        self.line(&output_frame(session, step, stream, bytes)?).await
    }

    /// Sends a `log` line for a session.
    pub async fn log(&self, session: &str, message: &str) -> anyhow::Result<()> {
        let frame = json!({"jsonrpc": "2.0", "method": method::LOG, "params": {"session": session, "level": "info", "message": message}});
        self.line(&serde_json::to_vec(&frame)?).await
    }

    /// Whether stdout is full: the runner does not read it as fast as the fake writes
    /// (`drop-output-when-slow`).
    pub fn is_full(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd as _;
        let stdout = std::io::stdout();
        let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::POLLOUT)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(0))
    }
}

/// An `output` notification of bytes a step wrote, as one line without its newline.
pub fn output_frame(session: &str, step: u32, stream: Stream, bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    let params = OutputParams {
        session: session.to_string(),
        step,
        stream,
        data: base64::engine::general_purpose::STANDARD.encode(bytes),
    };
    Ok(serde_json::to_vec(&json!({"jsonrpc": "2.0", "method": method::OUTPUT, "params": params}))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_carries_its_data_only_when_given() {
        assert_eq!(Fault::cancelled().to_json(), json!({"code": -32003, "message": "cancelled"}));
        let fault = Fault::new(1, "x").with_data(json!({"a": 1}));
        assert_eq!(fault.to_json()["data"], json!({"a": 1}));
    }

    #[test]
    fn bad_params_are_invalid_params() {
        let fault = params::<knotless_protocol::messages::StopParams>(Some(&json!({"x": 1})));
        assert_eq!(fault.map_err(|fault| fault.code), Err(rpc::INVALID_PARAMS));
    }
}
