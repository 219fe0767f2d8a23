//! The protocol's JSON Schema, `docs/reference/protocol.schema.json`: the checked-in file is what
//! the types generate (`knotless_protocol::schema`), every JSON example of the reference
//! validates against it, and it refuses what the types refuse.
//!
//! After changing a message type, write the file again and review its diff:
//! `KNOTLESS_BLESS=1 cargo test -p knotless-protocol --test schema`.

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use jsonschema::Validator;
use knotless_protocol::messages::{Capabilities, ExecutorInfo, InitializeResult, Isolation, LogLevel, LogParams};
use knotless_protocol::schema;
use serde_json::{Value, json};
use support::{declared_methods, examples, is_notification, params_round_trip, reference, result_round_trip};

const BLESS: &str = "KNOTLESS_BLESS=1 cargo test -p knotless-protocol --test schema";

/// The checked-in document, parsed.
fn checked_in() -> Value {
    serde_json::from_str(&support::read(schema::PATH)).expect("the checked-in schema is JSON")
}

/// A validator for `subschema` of `document` (an entry of `x-methods`, say), with the
/// document's `$defs` beside it for its references: the way the reference tells outsiders to
/// validate one part of a message.
fn validator(document: &Value, subschema: &Value) -> Validator {
    let mut schema = subschema.clone();
    schema["$schema"] = document["$schema"].clone();
    schema["$defs"] = document["$defs"].clone();
    jsonschema::validator_for(&schema).unwrap_or_else(|error| panic!("not a valid schema: {error}"))
}

/// The document with every object closed to the fields it lists (`additionalProperties:
/// false` on each object schema with `properties`): what the reference suggests to a sender that
/// wants its misspellings caught.
fn closed(value: &Value) -> Value {
    match value {
        Value::Object(object) => {
            let mut object: serde_json::Map<String, Value> =
                object.iter().map(|(key, value)| (key.clone(), closed(value))).collect();
            let is_object_schema = object.get("type") == Some(&json!("object")) && object.contains_key("properties");
            if is_object_schema && !object.contains_key("additionalProperties") {
                object.insert("additionalProperties".into(), json!(false));
            }
            Value::Object(object)
        }
        Value::Array(items) => Value::Array(items.iter().map(closed).collect()),
        other => other.clone(),
    }
}

/// The schema of `part` (`params` or `result`) of method `name`.
fn part_schema<'a>(document: &'a Value, name: &str, part: &str) -> &'a Value {
    let table = if is_notification(name) { "x-notifications" } else { "x-methods" };
    let schema = &document[table][name][part];
    assert!(!schema.is_null(), "the schema has no {table}.{name}.{part}");
    schema
}

/// Every error `validator` finds in `instance`, one a line.
fn errors(validator: &Validator, instance: &Value) -> Result<(), String> {
    let found: Vec<String> = validator
        .iter_errors(instance)
        .map(|error| match error.instance_path().as_str() {
            "" => error.to_string(),
            path => format!("{path}: {error}"),
        })
        .collect();
    if found.is_empty() { Ok(()) } else { Err(found.join("; ")) }
}

#[test]
fn the_checked_in_schema_is_what_the_types_generate() {
    let generated = schema::text();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(schema::PATH);
    if std::env::var("KNOTLESS_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &generated).unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
        return;
    }
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    if written == generated {
        return;
    }
    let line = written
        .lines()
        .zip(generated.lines())
        .position(|(old, new)| old != new)
        .unwrap_or_else(|| written.lines().count().min(generated.lines().count()));
    panic!(
        "{} is not what the protocol's types generate (first difference at line {}: {:?} there, {:?} generated); run `{BLESS}` to write it again, and review the diff",
        schema::PATH,
        line + 1,
        written.lines().nth(line).unwrap_or("(end of file)"),
        generated.lines().nth(line).unwrap_or("(end of file)"),
    );
}

#[test]
fn the_schema_maps_every_method() {
    let document = checked_in();
    let mapped: BTreeSet<String> = ["x-methods", "x-notifications"]
        .iter()
        .flat_map(|table| document[table].as_object().expect("a table of methods").keys().cloned())
        .collect();
    let declared: BTreeSet<String> = declared_methods().into_iter().collect();
    assert_eq!(mapped, declared, "x-methods and x-notifications must name exactly the methods of messages::method");
    for name in &declared {
        part_schema(&document, name, "params");
        if !is_notification(name) {
            part_schema(&document, name, "result");
        }
    }
}

#[test]
fn every_example_of_the_reference_validates() {
    let document = checked_in();
    let strict = closed(&document);
    let whole = validator(&document, &document);
    let whole_strict = validator(&strict, &strict);
    let mut failures = Vec::new();
    for example in examples(&reference()) {
        let message: Value = match serde_json::from_str(&example.text) {
            Ok(message) => message,
            Err(error) => {
                failures.push(format!("line {}: not JSON: {error}", example.line));
                continue;
            }
        };
        let mut checks =
            vec![("message", errors(&whole, &message)), ("message, closed", errors(&whole_strict, &message))];
        let part = match example.kind.as_str() {
            "request" | "notification" => Some("params"),
            "response" => Some("result"),
            _ => None,
        };
        if let Some(part) = part {
            let schema = validator(&strict, part_schema(&strict, &example.method, part));
            checks.push((part, errors(&schema, &message[part])));
        }
        for (what, outcome) in checks {
            if let Err(error) = outcome {
                failures.push(format!("line {} ({} {}), {what}: {error}", example.line, example.kind, example.method));
            }
        }
    }
    assert!(failures.is_empty(), "examples of docs/reference/protocol.md the schema refuses:\n{}", failures.join("\n"));
}

/// `value` as `part` of method `name`: the schema and serde must both accept it, or both refuse
/// it.
fn check(name: &str, part: &str, value: Value, accepted: bool) {
    let document = checked_in();
    let by_schema = errors(&validator(&document, part_schema(&document, name, part)), &value);
    let by_serde = if part == "params" { params_round_trip(name, &value) } else { result_round_trip(name, &value) };
    assert_eq!(by_schema.is_ok(), accepted, "{name} {part} {value}: the schema says {by_schema:?}");
    assert_eq!(by_serde.is_ok(), accepted, "{name} {part} {value}: serde says {by_serde:?}");
}

#[test]
fn the_schema_refuses_what_the_types_refuse() {
    check("stop", "params", json!({"session": "s", "timeout_ms": 5}), true);
    check("stop", "params", json!({"session": "s"}), false);
    check("stop", "params", json!({"session": 42, "timeout_ms": 5}), false);
    check("stop", "params", json!({"session": "s", "timeout_ms": -1}), false);
    check("stop", "params", json!({"session": "s", "timeout_ms": 5, "keep": "yes"}), false);
    check(
        "command",
        "params",
        json!({"session": "s", "step": 4294967295_u64, "script": "true", "timeout_ms": 1}),
        true,
    );
    check(
        "command",
        "params",
        json!({"session": "s", "step": 4294967296_u64, "script": "true", "timeout_ms": 1}),
        false,
    );
    check(
        "command",
        "params",
        json!({"session": "s", "step": 0, "script": "true", "timeout_ms": 1, "env": {"A": 1}}),
        false,
    );
    check("command", "result", json!({"exit_code": -1, "duration_ms": 0}), true);
    check("command", "result", json!({"exit_code": 2147483648_u64, "duration_ms": 0}), false);
    check("command", "result", json!({"duration_ms": 0}), false);
    check("output", "params", json!({"session": "s", "step": 0, "stream": "stdout", "data": ""}), true);
    check("output", "params", json!({"session": "s", "step": 0, "stream": "stdlog", "data": ""}), false);
    check("log", "params", json!({"session": null, "level": "warn", "message": "m"}), true);
    check("log", "params", json!({"level": "debug", "message": "m"}), false);
    check("start", "params", json!({"session": "s", "timeout_ms": 1, "run": {"id": 7}}), false);
    check("start", "result", json!({"paths": {"work": "/w", "steps": "/s"}}), false);
    check("initialize", "result", json!({"protocol_version": 1, "executor": {"name": "x", "version": "1"}}), true);
    check("initialize", "result", json!({"protocol_version": 1, "executor": {"name": "x"}}), false);
    check("cleanup", "result", json!({"removed": [{"kind": "job"}]}), false);
    check("upload", "result", json!({"bytes": 1.5}), false);
}

#[test]
fn unknown_fields_pass_unless_the_schema_is_closed() {
    // A receiver ignores fields it does not know (section 3 of the reference), so the schema
    // accepts them as serde does; closed, it refuses a misspelled field.
    let document = checked_in();
    let misspelled = json!({"session": "s", "kep": true, "timeout_ms": 5});
    check("stop", "params", misspelled.clone(), true);
    let strict = closed(&document);
    assert!(errors(&validator(&strict, part_schema(&strict, "stop", "params")), &misspelled).is_err());
    let example = json!({"jsonrpc": "2.0", "id": 3, "method": "start", "params": {"session": "s", "timeout_ms": 1, "imgae": "debian"}});
    assert_eq!(errors(&validator(&document, &document), &example), Ok(()));
    assert!(errors(&validator(&strict, &strict), &example).is_err(), "the closed schema refuses `imgae`");
}

#[test]
fn the_schema_refuses_malformed_messages() {
    let document = checked_in();
    let whole = validator(&document, &document);
    let refused = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "frobnicate", "params": {}}),
        json!({"jsonrpc": "2.0", "method": "ping", "params": {}}),
        json!({"jsonrpc": "2.0", "id": -1, "method": "ping", "params": {}}),
        json!({"jsonrpc": "2.0", "id": null, "method": "ping", "params": {}}),
        json!({"jsonrpc": "1.0", "id": 1, "method": "ping", "params": {}}),
        json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "start", "params": {"session": "s"}}),
        json!({"jsonrpc": "2.0", "id": 1, "method": "output", "params": {"session": "s", "step": 0, "stream": "stdout", "data": ""}}),
        json!({"jsonrpc": "2.0", "method": "output", "params": {"session": "s", "step": 0, "stream": "stdlog", "data": ""}}),
        json!({"jsonrpc": "2.0", "method": "cancel", "params": {"id": null}}),
        json!({"jsonrpc": "2.0", "id": 1, "result": []}),
        json!({"jsonrpc": "2.0", "id": 1, "error": {"code": 12345, "message": "what"}}),
        json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "message": ""}}),
        json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32005, "message": "no common version"}}),
        json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32005, "message": "v", "data": {"offered": [2]}}}),
    ];
    for message in refused {
        assert!(whole.validate(&message).is_err(), "the schema accepts {message}");
    }
    let accepted = [
        json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "parse error"}}),
        json!({"jsonrpc": "2.0", "id": "a", "result": {}}),
        json!({"jsonrpc": "2.0", "method": "cancel", "params": {"id": "a"}}),
    ];
    for message in accepted {
        assert_eq!(errors(&whole, &message), Ok(()), "{message}");
    }
}

#[test]
fn what_the_types_write_validates() {
    let document = checked_in();
    // Serde reads an isolation it does not know as `Unknown`, and writes that as "unknown".
    let capabilities = Capabilities { isolation: Isolation::Unknown, max_sessions: Some(4), ..Capabilities::default() };
    let result = InitializeResult {
        protocol_version: 1,
        executor: ExecutorInfo { name: "x".into(), version: "1".into() },
        capabilities,
    };
    let written = serde_json::to_value(&result).expect("serializes");
    assert_eq!(errors(&validator(&document, part_schema(&document, "initialize", "result")), &written), Ok(()));
    check(
        "initialize",
        "result",
        json!({"protocol_version": 1, "executor": {"name": "x", "version": "1"}, "capabilities": {"isolation": "gvisor"}}),
        true,
    );
    let log = LogParams { session: None, level: LogLevel::Info, message: "m".into() };
    let written = serde_json::to_value(&log).expect("serializes");
    assert_eq!(errors(&validator(&document, part_schema(&document, "log", "params")), &written), Ok(()));
}
