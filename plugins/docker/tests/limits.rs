//! The Docker executor's limits against the real engine (run
//! `plugins/docker/tests/support/engine.sh` first): a fork bomb that exhausts its container's
//! pids and a step over its memory, each named as the step's own fault. A test binary of its
//! own, so that the bomb, which keeps the host's cores busy, runs beside no other test.

mod support;

use std::time::{Duration, Instant};

use knotless_protocol::error::code;
use serde_json::json;
use support::*;

/// A step whose processes fork until the container's pids limit holds them: at its timeout the
/// container is killed (no sweep could start there), the answer names the step's own fault and
/// comes within the runner's grace, and the executor answers every other request meanwhile.
#[tokio::test]
async fn a_fork_bomb_is_ended_with_its_container_named_as_its_own_and_never_stalls_the_executor() {
    let harness = initialized().await;
    harness.start("bomb").await;
    harness.start("innocent").await;
    // Shells that fork until the limit holds them, each dying when a fork fails and another
    // taking its place: the pids stay exhausted. The step's own shell waits without forking.
    let script = "b() { while :; do b & done; }; b 2>/dev/null & exec sleep 600";
    let params = json!({"session": "bomb", "step": 0, "name": "bomb", "script": script, "env": {}, "secrets": {},
        "timeout_ms": 8_000});
    let started = Instant::now();
    let (_, bomb) = harness.send("command", params).await;
    let bomb = tokio::spawn(knotless_testkit::answer(bomb));
    // While the bomb forks and is ended, the pings are answered at once: nine in ten under
    // 100 ms, and none stalls (a host busy with other work as well delays a few).
    let mut took_each = Vec::new();
    while !bomb.is_finished() {
        let asked = Instant::now();
        harness.request("ping", json!({})).await.expect("ping");
        took_each.push(asked.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    took_each.sort();
    let pings = took_each.len();
    let slowest = took_each.last().copied().unwrap_or_default();
    let ninth_decile = took_each.get(pings * 9 / 10).copied().unwrap_or_default();
    eprintln!("{pings} pings; 90th percentile {ninth_decile:?}, slowest {slowest:?}");
    let took = started.elapsed();
    let (code, message) = bomb.await.expect("the bomb's request").expect_err("the bomb fails");
    assert_eq!(code, i64::from(code::STEP_FAILED), "{message}");
    assert!(message.contains("exhausted its pids limit of 1024") && message.contains("was killed at"), "{message}");
    assert!(took < Duration::from_secs(8 + 9), "the answer came {took:?} after the request, past the grace");
    assert!(pings > 20, "{pings} pings");
    assert!(ninth_decile < Duration::from_millis(100), "pings during the bomb: {took_each:?}");
    assert!(slowest < Duration::from_secs(1), "a ping took {slowest:?} during the bomb");
    // The other session runs on.
    let after = harness.command("innocent", 0, "echo fine", json!({}), 30_000).await.expect("the innocent step");
    assert_eq!(after["exit_code"], 0);
    harness.finish().await;
}

/// A step that takes more memory than its container has is ended by the kernel, and named so.
#[tokio::test]
async fn a_step_over_its_memory_is_named_out_of_memory() {
    let harness = initialized().await;
    let params = json!({"session": "hungry", "timeout_ms": 60_000, "resources": {"memory": "32Mi"}});
    harness.request("start", params).await.expect("start");
    let script = "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo never";
    let (code, message) = harness.command("hungry", 0, script, json!({}), 60_000).await.expect_err("killed");
    assert_eq!(code, i64::from(code::STEP_FAILED), "{message}");
    assert!(message.contains("out of memory (OOMKilled)") && message.contains("exit code 137"), "{message}");
    // A step within its memory is not.
    let fine = harness.command("hungry", 1, "x=$(head -c 1000000 /dev/zero | tr '\\0' a); echo ok", json!({}), 60_000);
    assert_eq!(fine.await.expect("within its memory")["exit_code"], 0);
    harness.finish().await;
}
