//! The step reaper is a fork of the executor: it must keep nothing of the executor's but what
//! it was given. A reaper holding the executor's protocol pipes or another step's output pipe
//! would keep them from ever closing; one keeping the executor's signal handlers would ignore
//! a SIGTERM and write into descriptors it no longer has.

#[allow(dead_code)]
mod support;

use serde_json::json;
use support::*;

/// What each descriptor of a process points at, by number.
fn descriptors(pid: i32) -> Vec<(i32, String)> {
    let mut found: Vec<(i32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the reaper's descriptors")
        .flatten()
        .filter_map(|entry| {
            let fd = entry.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(entry.path()).ok()?;
            Some((fd, target.display().to_string()))
        })
        .collect();
    found.sort();
    found
}

fn kind(target: &str) -> &str {
    target.split(':').next().unwrap_or(target)
}

#[tokio::test]
async fn a_reaper_holds_its_three_standard_descriptors_its_socket_and_its_signalfd_only() {
    let harness = initialized().await;
    harness.start("a").await;
    harness.start("b").await;
    let work = |session: &str| harness.session_dir(session).join("work");
    // Two steps side by side: each reaper is forked while the other step's pipes are open.
    let script = "echo $PPID > reaper.pid; sleep 30";
    let (_, first) =
        harness.send("command", json!({"session": "a", "step": 0, "script": script, "timeout_ms": 60_000})).await;
    let reaper_a = read_pid(&work("a").join("reaper.pid")).await;
    let (_, second) =
        harness.send("command", json!({"session": "b", "step": 0, "script": script, "timeout_ms": 60_000})).await;
    let reaper_b = read_pid(&work("b").join("reaper.pid")).await;
    for reaper in [reaper_a, reaper_b] {
        let found = descriptors(reaper);
        let numbers: Vec<i32> = found.iter().map(|(fd, _)| *fd).collect();
        assert_eq!(numbers.len(), 5, "{found:?}");
        assert_eq!(&numbers[..3], &[0, 1, 2], "{found:?}");
        assert_eq!(found[0].1, "/dev/null", "{found:?}");
        assert_eq!((kind(&found[1].1), kind(&found[2].1)), ("pipe", "pipe"), "{found:?}");
        let mut rest: Vec<&str> = found[3..].iter().map(|(_, target)| kind(target)).collect();
        rest.sort();
        assert_eq!(rest, ["anon_inode", "socket"], "{found:?}");
        assert!(found[3..].iter().any(|(_, target)| target == "anon_inode:[signalfd]"), "{found:?}");
        let comm = std::fs::read_to_string(format!("/proc/{reaper}/comm")).expect("comm");
        assert_eq!(comm.trim_end(), "knotless-reaper");
    }
    // The other step's pipes are not among the first reaper's: its output closes with it.
    let pipes_of = |pid: i32| -> Vec<String> {
        descriptors(pid).into_iter().filter(|(fd, _)| (1..=2).contains(fd)).map(|(_, target)| target).collect()
    };
    assert!(pipes_of(reaper_a).iter().all(|pipe| !pipes_of(reaper_b).contains(pipe)));
    for session in ["a", "b"] {
        harness.request("stop", json!({"session": session, "timeout_ms": 30_000})).await.expect("stop");
    }
    let _ = (answer(first).await, answer(second).await);
}

#[tokio::test]
async fn a_reaper_dies_of_sigterm_even_when_the_executor_handles_it_and_its_step_loses_its_processes() {
    // The executor's process handles SIGTERM: a reaper that kept the handler would live on.
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("a SIGTERM handler");
    let harness = initialized().await;
    harness.start("s").await;
    let secret = &unique("reaper-terminator");
    let script = format!("{HIDERS}\nkill -TERM $PPID; sleep 600");
    let params =
        json!({"session": "s", "step": 0, "script": script, "secrets": {"TOKEN": secret}, "timeout_ms": 60_000});
    let error = harness.request("command", params).await.expect_err("an error");
    assert!(error.1.contains("killed or stopped the process that watches it"), "{error:?}");
    let hidden = pids(&harness.session_dir("s").join("work"));
    let living: Vec<i32> = hidden.iter().copied().filter(|&pid| alive(pid)).collect();
    assert_eq!(living, Vec::<i32>::new());
    assert_eq!(holders(secret), Vec::<String>::new());
    // The executor's own handler saw nothing: the signal was the reaper's alone.
    let seen = tokio::time::timeout(std::time::Duration::from_millis(200), terminate.recv()).await;
    assert!(seen.is_err(), "the executor's SIGTERM handler ran");
    let result = harness.command("s", 1, "echo fine", json!({}), 10_000).await.expect("command");
    assert_eq!(result["exit_code"], 0);
}
