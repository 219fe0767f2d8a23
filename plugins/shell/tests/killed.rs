//! A `kill -9` of the shell executor while a secret-bearing step hides processes: the step's
//! reaper sees its socket end and kills them all. Its own test binary: the executor runs as
//! a child of this process, which no in-process executor's sweep of stray children may touch.

#[allow(dead_code)]
mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

#[test]
fn a_killed_executor_leaves_no_process_of_its_steps() {
    use std::io::{BufRead, BufReader, Write};
    let secret = unique("killed-executor");
    let work = tempfile::tempdir().expect("tempdir");
    let mut executor = std::process::Command::new(env!("CARGO_BIN_EXE_knotless-executor-shell"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("executor");
    let mut input = executor.stdin.take().expect("stdin");
    let mut output = BufReader::new(executor.stdout.take().expect("stdout"));
    let messages = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocol_versions": [1],
            "runner": {"name": "knotless-run", "version": "0", "id": "killed"},
            "config": {"work-dir": work.path().to_string_lossy()}}}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "start", "params": {"session": "s", "timeout_ms": 10_000}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "command", "params": {"session": "s", "step": 0,
            "script": format!("{HIDERS}\necho hidden; sleep 600"), "secrets": {"TOKEN": secret},
            "timeout_ms": 600_000}}),
    ];
    for message in messages {
        writeln!(input, "{message}").expect("write");
    }
    // The step's "hidden" comes as an output notification, base64 of "hidden\n".
    let mut line = String::new();
    loop {
        line.clear();
        assert!(output.read_line(&mut line).expect("read") > 0, "the executor ended early");
        if line.contains("\"output\"") && line.contains("aGlkZGVuCg==") {
            break;
        }
    }
    let pids = pids(&work.path().canonicalize().expect("canonical").join("killed/s/work"));
    assert_eq!(pids.len(), HIDDEN);
    executor.kill().expect("kill -9");
    executor.wait().expect("reaped");
    // The reaper kills them (SIGKILL for the one ignoring SIGTERM, after its grace), then
    // exits: the reaper itself held the secret too.
    wait_until(Duration::from_secs(20), || !pids.iter().any(|&pid| alive(pid)) && holders(&secret).is_empty());
    let living: Vec<i32> = pids.iter().copied().filter(|&pid| alive(pid)).collect();
    assert_eq!(living, Vec::<i32>::new(), "the step's processes outlived their executor");
    assert_eq!(holders(&secret), Vec::<String>::new());
}
