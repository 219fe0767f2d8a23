//! Wire compatibility between releases. A transcript is what a runner and an executor of one
//! release said to each other during one `knotless-run run`, recorded by the `compat-record`
//! binary (`make compat-record`) and committed under `tests/compat/RELEASE/EXECUTOR.jsonl`: one
//! JSON object a line, each a line of the protocol as one side wrote it, or the tar stream of
//! a side channel. The recording's own folder is written `$ROOT`, so a replay puts the paths
//! under a folder of its own.
//!
//! Two replays read it: this tree's executors answer the recorded runner's requests (the test
//! compares their answers with the recorded ones, [`missing`]), and this tree's runner runs the
//! workflow against `compat-replay`, which answers as the recorded executor did.

use std::path::Path;

use base64::Engine as _;
use serde_json::{Map, Value};

/// What stands for the recording's folder in a transcript.
pub const ROOT: &str = "$ROOT";

/// One line of a transcript.
#[derive(Debug, Clone)]
pub enum Entry {
    /// A message the runner wrote to the executor.
    Runner(Value),
    /// A message the executor wrote to the runner.
    Executor(Value),
    /// The tar stream of the side channel of the request with this id.
    Stream { id: Value, data: Vec<u8> },
}

impl Entry {
    /// The entry as a transcript line (without its newline).
    pub fn line(&self) -> String {
        let value = match self {
            Entry::Runner(message) => serde_json::json!({"from": "runner", "message": message}),
            Entry::Executor(message) => serde_json::json!({"from": "executor", "message": message}),
            Entry::Stream { id, data } => serde_json::json!({
                "from": "stream",
                "id": id,
                "data": base64::engine::general_purpose::STANDARD.encode(data),
            }),
        };
        value.to_string()
    }

    fn parse(line: &str) -> anyhow::Result<Entry> {
        let value: Value = serde_json::from_str(line)?;
        let message = || value.get("message").cloned().ok_or_else(|| anyhow::anyhow!("no message"));
        Ok(match value.get("from").and_then(Value::as_str) {
            Some("runner") => Entry::Runner(message()?),
            Some("executor") => Entry::Executor(message()?),
            Some("stream") => {
                let data = value.get("data").and_then(Value::as_str).unwrap_or_default();
                Entry::Stream {
                    id: value.get("id").cloned().unwrap_or(Value::Null),
                    data: base64::engine::general_purpose::STANDARD.decode(data)?,
                }
            }
            other => anyhow::bail!("an entry from {other:?}: only runner, executor and stream are known"),
        })
    }
}

/// A transcript read from its file, with `$ROOT` standing for `root`.
pub fn read(path: &Path, root: &Path) -> anyhow::Result<Vec<Entry>> {
    let text = std::fs::read_to_string(path).map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
    let root = root.to_str().ok_or_else(|| anyhow::anyhow!("{} is not UTF-8", root.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(number, line)| {
            Entry::parse(&line.replace(ROOT, root))
                .map_err(|error| anyhow::anyhow!("{}:{}: {error}", path.display(), number + 1))
        })
        .collect()
}

/// The method of a request or notification.
pub fn method(message: &Value) -> Option<&str> {
    message.get("method").and_then(Value::as_str)
}

/// Whether a message is a request (it has a method and an id).
pub fn is_request(message: &Value) -> bool {
    method(message).is_some() && message.get("id").is_some()
}

/// Whether a message is a response (an id, and no method).
pub fn is_response(message: &Value) -> bool {
    method(message).is_none() && message.get("id").is_some()
}

/// The recorded response to the request with `id`, after the entry at `from`.
pub fn response_to<'a>(entries: &'a [Entry], from: usize, id: &Value) -> Option<&'a Value> {
    entries[from..].iter().find_map(|entry| match entry {
        Entry::Executor(message) if is_response(message) && message.get("id") == Some(id) => Some(message),
        _ => None,
    })
}

/// The recorded tar stream of the request with `id`.
pub fn stream_of<'a>(entries: &'a [Entry], id: &Value) -> Option<&'a [u8]> {
    entries.iter().find_map(|entry| match entry {
        Entry::Stream { id: of, data } if of == id => Some(data.as_slice()),
        _ => None,
    })
}

/// Each place where `new` lacks what `old` holds: a field of an object that is missing, or a
/// value of another JSON type (`null` in `old` stands for any value, as an optional field does).
/// Arrays are compared by their first elements. `at` names the root (`result`, `params`).
pub fn missing(old: &Value, new: &Value, at: &str) -> Vec<String> {
    let mut found = Vec::new();
    compare(old, new, at, &mut found);
    found
}

fn compare(old: &Value, new: &Value, at: &str, found: &mut Vec<String>) {
    match (old, new) {
        (Value::Null, _) => {}
        (Value::Object(old), Value::Object(new)) => compare_fields(old, new, at, found),
        (Value::Array(old), Value::Array(new)) => {
            if let (Some(old), Some(new)) = (old.first(), new.first()) {
                compare(old, new, &format!("{at}[0]"), found);
            }
        }
        _ if kind(old) == kind(new) => {}
        _ => found.push(format!("`{at}` is {} where it was {}", kind(new), kind(old))),
    }
}

fn compare_fields(old: &Map<String, Value>, new: &Map<String, Value>, at: &str, found: &mut Vec<String>) {
    for (key, value) in old {
        let path = format!("{at}.{key}");
        match new.get(key) {
            None if !value.is_null() => found.push(format!("`{path}` is missing")),
            None => {}
            Some(new) => compare(value, new, &path, found),
        }
    }
}

/// A JSON value's type, in words; integers apart from other numbers.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(number) if number.is_i64() || number.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Who spoke in a transcript, from its `initialize`: (`knotless-run 0.1.0`, `knotless-executor-shell 0.1.0`).
pub fn speakers(entries: &[Entry]) -> (String, String) {
    let mut runner = String::from("the recorded runner");
    let mut executor = String::from("the recorded executor");
    for entry in entries {
        match entry {
            Entry::Runner(message) if method(message) == Some("initialize") => {
                if let Some(version) = message.pointer("/params/runner/version").and_then(Value::as_str) {
                    runner = format!("knotless-run {version}");
                }
            }
            Entry::Executor(message) => {
                let name = message.pointer("/result/executor/name").and_then(Value::as_str);
                let version = message.pointer("/result/executor/version").and_then(Value::as_str);
                if let (Some(name), Some(version)) = (name, version) {
                    executor = format!("knotless-executor-{name} {version}");
                }
            }
            _ => {}
        }
    }
    (runner, executor)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::missing;

    #[test]
    fn a_renamed_or_retyped_field_is_named_and_an_added_one_is_not() {
        let old = json!({"exit_code": 0, "duration_ms": 5, "left_out": [{"path": "a"}], "description": null});
        let new = json!({"exit_status": 0, "duration_ms": "5", "left_out": [{"name": "a"}], "more": true});
        let mut found = missing(&old, &new, "result");
        found.sort();
        assert_eq!(
            found,
            vec![
                "`result.duration_ms` is a string where it was an integer",
                "`result.exit_code` is missing",
                "`result.left_out[0].path` is missing",
            ]
        );
        assert!(missing(&old, &json!({"exit_code": 1, "duration_ms": 9, "left_out": []}), "result").is_empty());
    }
}
