//! Parses every JSON example of `docs/reference/protocol.md` against the protocol's types, so
//! the reference and the code cannot drift. `support` reads the examples and says the
//! convention their markers follow.
//!
//! A request's or notification's `params`, and a response's `result`, are deserialized into the
//! matching type of `knotless_protocol::messages`, then serialized again: every key the example
//! wrote must come back with the same value, so a misspelled field (which serde would
//! silently ignore) fails. An error must carry a code the protocol defines and a message.
//! Every method named in `messages::method` (read from its source, so a new method cannot be
//! forgotten) must have its examples: a request and a response, or a notification.
//! `tests/schema.rs` validates the same examples against the JSON Schema.

mod support;

use std::collections::BTreeSet;

use knotless_protocol::messages::method;
use serde_json::Value;
use support::{
    Example, declared_methods, examples, is_notification, params_round_trip, parse_marker, reference, result_round_trip,
};

/// Every key of `written` must come back in `typed` with the same value.
fn assert_covers(written: &Value, typed: &Value, at: &str) -> Result<(), String> {
    match (written, typed) {
        (Value::Object(written), Value::Object(typed)) => {
            for (key, value) in written {
                let Some(back) = typed.get(key) else {
                    return Err(format!("{at}.{key} is not a field of the type (misspelled or unknown)"));
                };
                assert_covers(value, back, &format!("{at}.{key}"))?;
            }
            Ok(())
        }
        (Value::Array(written), Value::Array(typed)) if written.len() == typed.len() => {
            for (position, (value, back)) in written.iter().zip(typed).enumerate() {
                assert_covers(value, back, &format!("{at}[{position}]"))?;
            }
            Ok(())
        }
        _ if written == typed => Ok(()),
        _ => Err(format!("{at} is {written} in the example but {typed} once typed")),
    }
}

/// Reads `written` into its type and checks that nothing was dropped or changed.
fn strictly(typed: Result<Value, String>, written: &Value, at: &str) -> Result<(), String> {
    let back = typed.map_err(|error| format!("{at} {error}"))?;
    assert_covers(written, &back, at)
}

fn check_params(name: &str, params: &Value) -> Result<(), String> {
    strictly(params_round_trip(name, params), params, "params")
}

fn check_result(name: &str, result: &Value) -> Result<(), String> {
    strictly(result_round_trip(name, result), result, "result")
}

fn check_error(error: &Value) -> Result<(), String> {
    let object = error.as_object().ok_or("error is not an object")?;
    if let Some(key) = object.keys().find(|key| !["code", "message", "data"].contains(&key.as_str())) {
        return Err(format!("error.{key} is not a field of a JSON-RPC error"));
    }
    let code = object.get("code").and_then(Value::as_i64).ok_or("error.code is not an integer")?;
    if !knotless_protocol::schema::ERROR_CODES.iter().any(|known| i64::from(*known) == code) {
        return Err(format!("error.code {code} is not a code of the protocol"));
    }
    match object.get("message").and_then(Value::as_str) {
        Some(message) if !message.is_empty() => Ok(()),
        _ => Err("error.message is missing or empty".to_string()),
    }
}

/// Checks one example; the error says what is wrong.
fn check(example: &Example) -> Result<(), String> {
    let message: Value = serde_json::from_str(&example.text).map_err(|error| format!("not JSON: {error}"))?;
    let object = message.as_object().ok_or("not a JSON object")?;
    if object.get("jsonrpc") != Some(&Value::from("2.0")) {
        return Err("`jsonrpc` is not \"2.0\"".to_string());
    }
    let allowed: &[&str] = match example.kind.as_str() {
        "request" => &["jsonrpc", "id", "method", "params"],
        "notification" => &["jsonrpc", "method", "params"],
        "response" => &["jsonrpc", "id", "result"],
        _ => &["jsonrpc", "id", "error"],
    };
    if let Some(key) = object.keys().find(|key| !allowed.contains(&key.as_str())) {
        return Err(format!("a {} has no `{key}` member", example.kind));
    }
    let member = |name: &str| object.get(name).ok_or(format!("a {} needs `{name}`", example.kind));
    match example.kind.as_str() {
        "request" | "notification" => {
            let name = member("method")?.as_str().ok_or("`method` is not a string")?;
            if name != example.method {
                return Err(format!("the marker names {} but the message is {name}", example.method));
            }
            if (example.kind == "notification") != is_notification(name) {
                return Err(format!("{name} is not a {}", example.kind));
            }
            if example.kind == "request" {
                let id = member("id")?;
                if !(id.is_u64() || id.is_string()) {
                    return Err("`id` must be a non-negative integer or a string".to_string());
                }
            }
            check_params(name, member("params")?)
        }
        "response" => {
            member("id")?;
            check_result(&example.method, member("result")?)
        }
        _ => {
            member("id")?;
            if is_notification(&example.method) || !declared_methods().contains(&example.method) {
                return Err(format!("{} is not a request method", example.method));
            }
            check_error(member("error")?)
        }
    }
}

#[test]
fn every_example_is_a_valid_message() {
    let markdown = reference();
    let found = examples(&markdown);
    assert!(!found.is_empty(), "the reference has no json examples");
    let failures: Vec<String> = found
        .iter()
        .filter_map(|example| {
            check(example)
                .err()
                .map(|error| format!("line {} ({} {}): {error}", example.line, example.kind, example.method))
        })
        .collect();
    assert!(failures.is_empty(), "bad examples in docs/reference/protocol.md:\n{}", failures.join("\n"));
}

#[test]
fn every_method_has_its_examples() {
    let markdown = reference();
    let found = examples(&markdown);
    let present: BTreeSet<(String, String)> =
        found.iter().map(|example| (example.kind.clone(), example.method.clone())).collect();
    let declared = declared_methods();
    assert!(declared.len() >= 12, "expected the twelve methods of version 1, read {declared:?}");
    let mut missing = Vec::new();
    for name in &declared {
        let kinds: &[&str] = if is_notification(name) { &["notification"] } else { &["request", "response"] };
        for kind in kinds {
            if !present.contains(&(kind.to_string(), name.clone())) {
                missing.push(format!("{kind} {name}"));
            }
        }
    }
    assert!(missing.is_empty(), "methods without an example in docs/reference/protocol.md: {missing:?}");
    for example in &found {
        assert!(
            declared.contains(&example.method),
            "line {}: {} is not a method of messages::method",
            example.line,
            example.method
        );
    }
}

#[test]
fn a_misspelled_field_is_caught() {
    let written = serde_json::json!({"session": "s", "keep": false, "timeout_msec": 5});
    assert!(check_params(method::STOP, &written).is_err(), "serde alone would ignore `timeout_msec`");
    let written = serde_json::json!({"session": "s", "kep": true, "timeout_ms": 5});
    assert!(check_params(method::STOP, &written).is_err(), "a misspelled optional field must fail");
    let written = serde_json::json!({"session": "s", "keep": true, "timeout_ms": 5});
    assert_eq!(check_params(method::STOP, &written), Ok(()));
}

#[test]
fn markers_and_blocks_are_read() {
    let markdown = "text\n\n<!-- example: request ping -->\n\n```json\n{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"ping\", \"params\": {}}\n```\n\n```text\nnot an example\n```\n";
    let found = examples(markdown);
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].kind.as_str(), found[0].method.as_str(), found[0].line), ("request", "ping", 5));
    assert_eq!(check(&found[0]), Ok(()));
    assert_eq!(parse_marker("<!-- example: reply ping -->"), None);
}
