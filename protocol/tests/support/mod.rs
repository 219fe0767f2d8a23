//! What the reference's tests share: the JSON examples of `docs/reference/protocol.md` with
//! their markers, the method names `messages::method` declares, and each method's types.
//!
//! The convention, which the reference states too: every fenced block with the info string
//! `json` is one complete JSON-RPC 2.0 message, and the nearest non-blank line above its fence
//! is a marker comment naming what it is:
//!
//! ```text
//! <!-- example: request start -->        a request: has `id`, its `method` is `start`
//! <!-- example: response start -->       a success response to `start`: has `id` and `result`
//! <!-- example: error start -->          an error response to `start`: has `id` and `error`
//! <!-- example: notification output -->  a notification: no `id`, its `method` is `output`
//! ```

use std::path::Path;

use knotless_protocol::messages::{self, method};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// One fenced `json` block of the reference.
pub struct Example {
    /// 1-based line of the opening fence, for messages.
    pub line: usize,
    /// `request`, `response`, `error` or `notification`.
    pub kind: String,
    /// The method the marker names.
    pub method: String,
    /// The block's text.
    pub text: String,
}

/// A file of the repository, from its root.
pub fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()))
}

pub fn reference() -> String {
    read("docs/reference/protocol.md")
}

/// Every `json` block with its marker; panics on a block without a well-formed marker or an
/// unclosed block.
pub fn examples(markdown: &str) -> Vec<Example> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut found = Vec::new();
    let mut index = 0;
    while index < lines.len() {
        let fence = lines[index].trim();
        if !fence.starts_with("```") {
            index += 1;
            continue;
        }
        let info = fence.trim_start_matches('`').trim();
        let opening = index;
        index += 1;
        let mut body = Vec::new();
        while index < lines.len() && lines[index].trim() != "```" {
            body.push(lines[index]);
            index += 1;
        }
        assert!(index < lines.len(), "line {}: the code block is never closed", opening + 1);
        index += 1;
        if info != "json" {
            continue;
        }
        let marker =
            lines[..opening].iter().rev().find(|line| !line.trim().is_empty()).map(|line| line.trim()).unwrap_or("");
        let (kind, method) = parse_marker(marker).unwrap_or_else(|| {
            panic!(
                "line {}: a json block must follow a marker such as `<!-- example: request start -->`, found {marker:?}",
                opening + 1
            )
        });
        found.push(Example { line: opening + 1, kind, method, text: body.join("\n") });
    }
    found
}

pub fn parse_marker(line: &str) -> Option<(String, String)> {
    let inner = line.strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    let rest = inner.strip_prefix("example:")?;
    let mut words = rest.split_whitespace();
    let kind = words.next()?;
    let method = words.next()?;
    if words.next().is_some() || !["request", "response", "error", "notification"].contains(&kind) {
        return None;
    }
    Some((kind.to_string(), method.to_string()))
}

/// The method names declared in `messages::method`, read from the source, so that a new method
/// cannot be forgotten.
pub fn declared_methods() -> Vec<String> {
    let source = read("protocol/src/messages.rs");
    let start = source.find("pub mod method {").expect("messages.rs declares `pub mod method`");
    let end = start + source[start..].find("\n}").expect("the method module ends");
    source[start..end]
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            if !line.starts_with("pub const ") {
                return None;
            }
            let value = line.split('=').nth(1)?.trim().trim_end_matches(';').trim();
            Some(value.trim_matches('"').to_string())
        })
        .collect()
}

pub fn is_notification(name: &str) -> bool {
    [method::OUTPUT, method::LOG, method::CANCEL].contains(&name)
}

/// Deserializes `value` into `T` and serializes it again.
fn round_trip<T: DeserializeOwned + Serialize>(value: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|error| format!("does not deserialize: {error}"))?;
    serde_json::to_value(&typed).map_err(|error| format!("does not serialize again: {error}"))
}

/// `params` of method `name` read into its type of `knotless_protocol::messages` and written
/// again.
pub fn params_round_trip(name: &str, params: &Value) -> Result<Value, String> {
    match name {
        method::INITIALIZE => round_trip::<messages::InitializeParams>(params),
        method::PING | method::SHUTDOWN => round_trip::<messages::Empty>(params),
        method::START => round_trip::<messages::StartParams>(params),
        method::COMMAND => round_trip::<messages::CommandParams>(params),
        method::STOP => round_trip::<messages::StopParams>(params),
        method::CLEANUP => round_trip::<messages::CleanupParams>(params),
        method::UPLOAD | method::DOWNLOAD => round_trip::<messages::TransferParams>(params),
        method::CANCEL => round_trip::<messages::CancelParams>(params),
        method::OUTPUT => round_trip::<messages::OutputParams>(params),
        method::LOG => round_trip::<messages::LogParams>(params),
        other => Err(format!("unknown method {other:?}")),
    }
}

/// The `result` of a request of method `name` read into its type and written again.
pub fn result_round_trip(name: &str, result: &Value) -> Result<Value, String> {
    match name {
        method::INITIALIZE => round_trip::<messages::InitializeResult>(result),
        method::PING | method::SHUTDOWN => round_trip::<messages::Empty>(result),
        method::START => round_trip::<messages::StartResult>(result),
        method::COMMAND => round_trip::<messages::CommandResult>(result),
        method::STOP => round_trip::<messages::StopResult>(result),
        method::CLEANUP => round_trip::<messages::CleanupResult>(result),
        method::UPLOAD | method::DOWNLOAD => round_trip::<messages::TransferResult>(result),
        other if is_notification(other) => Err(format!("{other} is a notification and has no response")),
        other => Err(format!("unknown method {other:?}")),
    }
}
