//! An executor that answers as a recorded one did (`knotless_tests::compat`): each request is
//! matched to the next recorded request of its method, checked to hold every field the recorded
//! runner sent (an executor of that release may need any of them: a request without one is
//! answered `-32602` naming it, as that executor's JSON reader answers a missing required field),
//! and answered with the recorded notifications and response, under
//! the new request's id, session and step. A side channel's stream is read to its end, or the
//! recorded one written.
//!
//! Usage: compat-replay TRANSCRIPT ROOT

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::Context as _;
use knotless_tests::compat::{self, Entry, is_request, method, missing, response_to, stream_of};
use serde_json::{Value, json};

/// One recorded request, with what the executor said before answering it, and its answer.
struct Exchange {
    request: Value,
    notifications: Vec<Value>,
    response: Value,
    stream: Option<Vec<u8>>,
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [transcript, root] = args.as_slice() else {
        anyhow::bail!("usage: compat-replay TRANSCRIPT ROOT");
    };
    let entries = compat::read(Path::new(transcript), Path::new(root))?;
    let (runner, executor) = compat::speakers(&entries);
    let mut exchanges = exchanges(&entries);
    let mut stdout = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let Ok(request) = serde_json::from_str::<Value>(&line) else { continue };
        if !is_request(&request) {
            continue;
        }
        let name = method(&request).unwrap_or_default().to_string();
        let recorded = exchanges.get_mut(&name).and_then(VecDeque::pop_front);
        let answer = match recorded {
            Some(recorded) => replay(&request, recorded, (&runner, &executor), &mut stdout)?,
            // What an executor of protocol 1 answers when the recorded run did not ask: `ping`
            // and `shutdown` always `{}`, and a sweep that finds nothing of a gone owner (the
            // replay made nothing) an empty result.
            None if ["ping", "shutdown", "cleanup"].contains(&name.as_str()) => {
                json!({"jsonrpc": "2.0", "id": request["id"], "result": {}})
            }
            None => error(
                &request,
                -32603,
                &format!(
                    "{executor} was never asked `{name}` this many times by {runner}: the transcript has no answer"
                ),
            ),
        };
        writeln!(stdout, "{answer}")?;
        stdout.flush()?;
        if name == "shutdown" {
            break;
        }
    }
    Ok(())
}

/// The recorded exchanges by method, in the order they were asked.
fn exchanges(entries: &[Entry]) -> HashMap<String, VecDeque<Exchange>> {
    let mut by_method: HashMap<String, VecDeque<Exchange>> = HashMap::new();
    for (at, entry) in entries.iter().enumerate() {
        let Entry::Runner(request) = entry else { continue };
        let (Some(name), Some(id)) = (method(request), request.get("id")) else { continue };
        let Some(response) = response_to(entries, at, id) else { continue };
        let session = request.pointer("/params/session");
        let notifications = entries[at..]
            .iter()
            .take_while(|entry| !matches!(entry, Entry::Executor(message) if message == response))
            .filter_map(|entry| match entry {
                Entry::Executor(message) if method(message).is_some() => Some(message),
                _ => None,
            })
            .filter(|message| session.is_some() && message.pointer("/params/session") == session)
            .filter(|message| message.pointer("/params/step") == request.pointer("/params/step"))
            .cloned()
            .collect();
        by_method.entry(name.to_string()).or_default().push_back(Exchange {
            request: request.clone(),
            notifications,
            response: response.clone(),
            stream: stream_of(entries, id).map(<[u8]>::to_vec),
        });
    }
    by_method
}

/// The recorded answer to `request`, after its notifications and its stream.
fn replay(
    request: &Value,
    recorded: Exchange,
    speakers: (&str, &str),
    stdout: &mut impl Write,
) -> anyhow::Result<Value> {
    let lacking = missing(&recorded.request["params"], &request["params"], "params");
    if !lacking.is_empty() {
        let fields = lacking.join("; ");
        let (runner, executor) = speakers;
        let message = format!("invalid params: {fields}, which {runner} sent and {executor} may need");
        return Ok(error(request, -32602, &message));
    }
    for mut notification in recorded.notifications {
        for field in ["session", "step"] {
            if let (Some(slot), Some(value)) =
                (notification.pointer_mut(&format!("/params/{field}")), request.pointer(&format!("/params/{field}")))
            {
                *slot = value.clone();
            }
        }
        writeln!(stdout, "{notification}")?;
    }
    stdout.flush()?;
    let mut response = recorded.response;
    response["id"] = request["id"].clone();
    if response.get("result").is_some() {
        let channel = request.pointer("/params/channel").and_then(Value::as_str);
        match (method(request), channel) {
            (Some("upload"), Some(channel)) => response["result"]["bytes"] = json!(drain(channel)?),
            (Some("download"), Some(channel)) => {
                let data = recorded.stream.unwrap_or_default();
                let mut stream = UnixStream::connect(channel).with_context(|| format!("connect {channel}"))?;
                stream.write_all(&data)?;
                stream.shutdown(std::net::Shutdown::Write)?;
                response["result"]["bytes"] = json!(data.len());
            }
            _ => {}
        }
    }
    Ok(response)
}

/// Reads a side channel to its end; the bytes read.
fn drain(channel: &str) -> anyhow::Result<u64> {
    let stream = UnixStream::connect(channel).with_context(|| format!("connect {channel}"))?;
    Ok(std::io::copy(&mut stream.take(u64::MAX), &mut std::io::sink())?)
}

fn error(request: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": request["id"], "error": {"code": code, "message": message}})
}
