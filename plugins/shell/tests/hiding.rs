//! A step that hides processes from the executor, as an attacker would: it unsets
//! variables, leaves its process group and session, double-forks, clears its environment,
//! ignores SIGTERM, stops itself, and kills the process that watches it. After a
//! secret-bearing step, a timeout or a `stop`, none of its processes is left, and the count
//! of what was killed is right.

#[allow(dead_code)]
mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

#[tokio::test]
async fn no_process_of_a_secret_step_outlives_it_however_it_hides() {
    let harness = initialized().await;
    harness.start("s").await;
    let secret = &unique("hidden");
    let params =
        json!({"session": "s", "step": 0, "script": HIDERS, "secrets": {"TOKEN": secret}, "timeout_ms": 60_000});
    let result = harness.request("command", params).await.expect("command");
    assert_eq!(result["exit_code"], 0, "{result}");
    let hidden = pids(&harness.session_dir("s").join("work"));
    assert_eq!(hidden.len(), HIDDEN);
    assert_eq!(result["killed_processes"], json!(HIDDEN), "{result}");
    let living: Vec<i32> = hidden.iter().copied().filter(|&pid| alive(pid)).collect();
    assert_eq!(living, Vec::<i32>::new(), "every hidden process is killed before the result");
    assert_eq!(holders(secret), Vec::<String>::new());
}

#[tokio::test]
async fn a_timed_out_step_loses_every_process_however_it_hides() {
    let harness = initialized().await;
    harness.start("s").await;
    let script = format!("{HIDERS}\necho hidden; sleep 600");
    let params = json!({"session": "s", "step": 0, "script": script, "timeout_ms": 60_000});
    let (id, receiver) = harness.send("command", params).await;
    assert!(eventually(Duration::from_secs(20), || harness.output("s", 0, "stdout") == "hidden\n").await);
    harness.cancel(id).await;
    answer(receiver).await.expect_err("cancelled");
    let hidden = pids(&harness.session_dir("s").join("work"));
    let living: Vec<i32> = hidden.iter().copied().filter(|&pid| alive(pid)).collect();
    assert_eq!(living, Vec::<i32>::new());
}

#[tokio::test]
async fn what_a_plain_step_hides_lives_until_stop_and_then_dies() {
    let harness = initialized().await;
    harness.start("s").await;
    let result = harness.command("s", 0, HIDERS, json!({}), 60_000).await.expect("command");
    assert_eq!((result["exit_code"].clone(), result["killed_processes"].clone()), (json!(0), json!(0)));
    let hidden = pids(&harness.session_dir("s").join("work"));
    assert!(hidden.iter().all(|&pid| alive(pid)), "a plain step may leave services running");
    let stopped = harness.request("stop", json!({"session": "s", "timeout_ms": 30_000})).await.expect("stop");
    let removed = stopped["removed"].as_array().expect("removed");
    for pid in &hidden {
        assert!(!alive(*pid), "{pid} is gone after stop");
        assert!(removed.contains(&json!({"kind": "process", "name": pid.to_string(), "session": "s"})), "{stopped}");
    }
}

#[tokio::test]
async fn a_step_that_kills_its_watcher_loses_its_processes() {
    let harness = initialized().await;
    harness.start("s").await;
    let secret = &unique("watcher-killer");
    let script = format!("{HIDERS}\nkill -9 $PPID; sleep 600");
    let params =
        json!({"session": "s", "step": 0, "script": script, "secrets": {"TOKEN": secret}, "timeout_ms": 60_000});
    let error = harness.request("command", params).await.expect_err("an error");
    assert_eq!(error.0, knotless_protocol::error::code::INFRASTRUCTURE as i64, "{error:?}");
    assert!(error.1.contains("killed or stopped the process that watches it"), "{error:?}");
    let hidden = pids(&harness.session_dir("s").join("work"));
    let living: Vec<i32> = hidden.iter().copied().filter(|&pid| alive(pid)).collect();
    assert_eq!(living, Vec::<i32>::new());
    assert_eq!(holders(secret), Vec::<String>::new());
    // The session goes on.
    let result = harness.command("s", 1, "echo fine", json!({}), 10_000).await.expect("command");
    assert_eq!(result["exit_code"], 0);
}

#[tokio::test]
async fn a_step_that_stops_its_watcher_loses_its_processes() {
    let harness = initialized().await;
    harness.start("s").await;
    let secret = &unique("watcher-stopper");
    let script = format!("{HIDERS}\nkill -STOP $PPID; sleep 600");
    let params =
        json!({"session": "s", "step": 0, "script": script, "secrets": {"TOKEN": secret}, "timeout_ms": 3_000});
    let error = harness.request("command", params).await.expect_err("an error");
    assert_eq!(error.0, knotless_protocol::error::code::TIMEOUT as i64, "{error:?}");
    let hidden = pids(&harness.session_dir("s").join("work"));
    let living: Vec<i32> = hidden.iter().copied().filter(|&pid| alive(pid)).collect();
    assert_eq!(living, Vec::<i32>::new());
    assert_eq!(holders(secret), Vec::<String>::new());
}
