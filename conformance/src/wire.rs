//! The cases of the wire itself, each on an executor process of its own that the case writes
//! lines to by hand: requests before `initialize` (§4), an unknown option (§5.1), and frames that
//! are not JSON, not requests, of an unknown method or with params that do not fit (§2).

use std::time::Duration;

use knotless_protocol::envelope::Request;
use knotless_protocol::messages::*;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};

use super::Outcome;
use knotless_host::{ExecutorProcess, HostConfig};

/// How long an answer may take.
const ANSWER: Duration = Duration::from_secs(30);

/// The longest line read from the executor: a frame's bound.
const MAX_LINE: u64 = knotless_protocol::version::MAX_FRAME_BYTES as u64;

/// The rule of §4 that requests before `initialize` break.
const NOT_INITIALIZED_RULE: &str = "§4: until a successful `initialize`, an executor MUST answer every request but \
                                    `shutdown` with -32009 (NOT_INITIALIZED)";

/// The rule of §5.1 that accepting an unknown option breaks.
const UNKNOWN_OPTION_RULE: &str =
    "§5.1: an executor MUST refuse an unknown option with -32002 (CONFIGURATION), in a message naming the option";

/// The option no executor takes.
const UNKNOWN_OPTION: &str = "knotless-check-no-such-option";

/// An executor process, written to and read from line by line.
struct Lines {
    process: ExecutorProcess,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Lines {
    fn spawn(config: &HostConfig) -> Result<Lines, String> {
        let (process, stdin, stdout) = ExecutorProcess::spawn(&config.process).map_err(|error| format!("{error:#}"))?;
        Ok(Lines { process, stdin: Some(stdin), stdout: BufReader::new(stdout) })
    }

    async fn send(&mut self, line: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("stdin is closed")?;
        let written = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.write_all(b"\n").await?;
            stdin.flush().await
        };
        written
            .await
            .map_err(|error| format!("cannot write to the executor: {error}; {}", self.process.tail().render()))
    }

    /// Reads messages until the response of `id`, skipping notifications.
    async fn answer(&mut self, id: &Value) -> Result<Value, String> {
        let read = async {
            loop {
                let mut line = Vec::new();
                let read = (&mut self.stdout).take(MAX_LINE).read_until(b'\n', &mut line).await;
                match read {
                    Ok(0) => return Err("the executor closed its stdout".to_string()),
                    Ok(_) if !line.ends_with(b"\n") => {
                        return Err(format!("a line longer than {MAX_LINE} bytes, or an unfinished one"));
                    }
                    Ok(_) => {}
                    Err(error) => return Err(format!("cannot read the executor's stdout: {error}")),
                }
                let message: Value = serde_json::from_slice(&line).map_err(|error| {
                    format!("the executor wrote a line that is not JSON ({error}): {}", String::from_utf8_lossy(&line))
                })?;
                if message.get("method").is_none() && message.get("id") == Some(id) {
                    return Ok(message);
                }
            }
        };
        match tokio::time::timeout(ANSWER, read).await {
            Ok(Ok(message)) => Ok(message),
            Ok(Err(why)) => Err(format!("{why}; {}", self.process.tail().render())),
            Err(_) => Err(format!("no answer with id {id} within {ANSWER:?}; {}", self.process.tail().render())),
        }
    }

    /// Sends a request and reads its answer.
    async fn call(&mut self, id: Value, method: &str, params: Value) -> Result<Value, String> {
        let request = Request::named(&id, method, &params);
        self.send(&serde_json::to_string(&request).map_err(|error| error.to_string())?).await?;
        self.answer(&id).await
    }

    async fn initialize(&mut self, config: &HostConfig, options: Value) -> Result<Value, String> {
        let params = json!({
            "protocol_versions": config.offer_versions,
            "runner": config.runner,
            "config": options,
        });
        self.call(json!(1), method::INITIALIZE, params).await
    }

    /// Asks it to shut down, closes its stdin, and makes sure it is gone.
    async fn end(mut self, grace: Duration) {
        let _ = tokio::time::timeout(grace, self.call(json!("check-shutdown"), method::SHUTDOWN, json!({}))).await;
        drop(self.stdin.take());
        if self.process.wait_exit(grace).await.is_none() {
            self.process.terminate(grace).await;
        }
    }
}

/// The code of an error answer.
fn code_of(answer: &Value) -> Option<i64> {
    answer.get("error")?.get("code")?.as_i64()
}

fn message_of(answer: &Value) -> String {
    answer.get("error").and_then(|error| error.get("message")).and_then(Value::as_str).unwrap_or("").to_string()
}

/// `answer` is the error `code`; otherwise why not, with `rule`.
fn expect_error(answer: &Value, code: i64, what: &str, rule: &str) -> Result<(), String> {
    match (code_of(answer), answer.get("result")) {
        (Some(got), _) if got == code => Ok(()),
        (Some(got), _) => Err(format!("{what} was answered {got} ({}), expected {code}; {rule}", message_of(answer))),
        (None, Some(result)) => Err(format!("{what} was answered with a result, {result}, expected {code}; {rule}")),
        (None, None) => Err(format!("{what} was answered with neither a result nor an error: {answer}")),
    }
}

/// `answer` is a result; otherwise why not.
fn expect_result(answer: &Value, what: &str, rule: &str) -> Result<(), String> {
    match (answer.get("result"), code_of(answer)) {
        (Some(_), _) => Ok(()),
        (None, Some(code)) => Err(format!("{what} was answered {code} ({}); {rule}", message_of(answer))),
        (None, None) => Err(format!("{what} was answered with neither a result nor an error: {answer}")),
    }
}

/// `ping` and `start` before `initialize` are refused with NOT_INITIALIZED.
pub(super) async fn before_initialize(config: &HostConfig, start: StartParams) -> Outcome {
    let mut lines = Lines::spawn(config)?;
    let outcome = async {
        let ping = lines.call(json!(1), method::PING, json!({})).await?;
        expect_error(&ping, -32009, "`ping` before `initialize`", NOT_INITIALIZED_RULE)?;
        let start = serde_json::to_value(&start).map_err(|error| error.to_string())?;
        let start = lines.call(json!(2), method::START, start).await?;
        expect_error(&start, -32009, "`start` before `initialize`", NOT_INITIALIZED_RULE)?;
        Ok("`ping` and `start` before `initialize` answered -32009 (NOT_INITIALIZED)".to_string())
    }
    .await;
    lines.end(config.grace).await;
    outcome
}

/// `initialize` with an option no executor takes is refused, naming it.
pub(super) async fn unknown_option(config: &HostConfig) -> Outcome {
    let mut lines = Lines::spawn(config)?;
    let mut options = serde_json::to_value(&config.options).map_err(|error| error.to_string())?;
    options[UNKNOWN_OPTION] = json!("1");
    let outcome = async {
        let answer = lines.initialize(config, options).await?;
        let what = format!("`initialize` with the option {UNKNOWN_OPTION}");
        expect_error(&answer, -32002, &what, UNKNOWN_OPTION_RULE)?;
        let message = message_of(&answer);
        if !message.contains(UNKNOWN_OPTION) {
            return Err(format!("{what} was refused without naming it: {message:?}; {UNKNOWN_OPTION_RULE}"));
        }
        Ok(format!("refused with -32002: {message}"))
    }
    .await;
    lines.end(config.grace).await;
    outcome
}

/// After `initialize`: a line that is not JSON, a message with an id and no method, an unknown
/// method and params that do not fit are each answered with their error, a string id is
/// answered with the same string, an unknown notification is ignored, and the executor goes on
/// reading after each.
pub(super) async fn malformed(config: &HostConfig) -> Outcome {
    let mut lines = Lines::spawn(config)?;
    let outcome = async {
        let options = serde_json::to_value(&config.options).map_err(|error| error.to_string())?;
        let answer = lines.initialize(config, options).await?;
        expect_result(&answer, "`initialize`", "the handshake must succeed")?;
        let mut faults = Vec::new();
        lines.send("this line is not json {").await?;
        let answer = lines.answer(&Value::Null).await?;
        if let Err(why) = expect_error(
            &answer,
            -32700,
            "a line that is not JSON",
            "§2: an executor answers a line it cannot read with -32700 and `\"id\": null`, and goes on reading",
        ) {
            faults.push(why);
        }
        lines.send(r#"{"jsonrpc": "2.0", "id": 2}"#).await?;
        let answer = lines.answer(&json!(2)).await?;
        if let Err(why) = expect_error(
            &answer,
            -32600,
            "a message with an id and no method",
            "§2: a message with an `id` but no `method` gets -32600 (invalid request)",
        ) {
            faults.push(why);
        }
        let answer = lines.call(json!("check-string-id"), method::PING, json!({})).await?;
        if let Err(why) = expect_result(
            &answer,
            "a `ping` with the string id \"check-string-id\"",
            "§2: request ids are integers or strings, and the answer carries the same id",
        ) {
            faults.push(why);
        }
        let answer = lines.call(json!(3), "knotless-check/no-such-method", json!({})).await?;
        if let Err(why) = expect_error(
            &answer,
            -32601,
            "the unknown method knotless-check/no-such-method",
            "§2: an unknown method MUST be answered -32601 (method not found), never with a result",
        ) {
            faults.push(why);
        }
        let answer = lines.call(json!(4), method::STOP, json!({"session": 7, "timeout_ms": "soon"})).await?;
        if let Err(why) = expect_error(
            &answer,
            -32602,
            "`stop` with a number for its session and a string for its timeout",
            "§2: params that do not fit the method get -32602 (invalid params)",
        ) {
            faults.push(why);
        }
        lines.send(r#"{"jsonrpc": "2.0", "method": "knotless-check/no-such-notification", "params": {}}"#).await?;
        let answer = lines.call(json!(5), method::PING, json!({})).await?;
        expect_result(&answer, "a `ping` after them", "§2: an executor goes on reading after a malformed frame")?;
        if !faults.is_empty() {
            return Err(faults.join("; "));
        }
        Ok("-32700 with id null, -32600, -32601 and -32602 answered, a string id kept, an unknown notification \
            ignored, and a ping answered after them"
            .to_string())
    }
    .await;
    lines.end(config.grace).await;
    outcome
}
