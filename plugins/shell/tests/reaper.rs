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
async fn a_reaper_holds_dev_null_on_its_standard_descriptors_its_socket_and_its_signalfd_only() {
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
        // The step's pipes are its shell's alone: the reaper's are `/dev/null`.
        assert!(found[..3].iter().all(|(_, target)| target == "/dev/null"), "{found:?}");
        let mut rest: Vec<&str> = found[3..].iter().map(|(_, target)| kind(target)).collect();
        rest.sort();
        assert_eq!(rest, ["anon_inode", "socket"], "{found:?}");
        assert!(found[3..].iter().any(|(_, target)| target == "anon_inode:[signalfd]"), "{found:?}");
        let comm = std::fs::read_to_string(format!("/proc/{reaper}/comm")).expect("comm");
        assert_eq!(comm.trim_end(), "knotless-reaper");
    }
    // Neither holds a pipe: a step's output closes with the step's own processes.
    for reaper in [reaper_a, reaper_b] {
        assert!(descriptors(reaper).iter().all(|(_, target)| kind(target) != "pipe"));
    }
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

#[tokio::test]
async fn a_session_reuses_the_reaper_of_a_step_that_left_nothing_and_ends_every_other() {
    let harness = initialized().await;
    harness.start("s").await;
    let work = harness.session_dir("s").join("work");
    let secret = json!({"TOKEN": unique("reused-reaper")});
    let mut reapers = Vec::new();
    for (step, script, secrets) in [
        (0, "echo $PPID > 0.pid", json!({})),
        (1, "echo $PPID > 1.pid", json!({})),
        (2, "echo $PPID > 2.pid", secret.clone()),
        (3, "echo $PPID > 3.pid; sleep 600 &", json!({})),
        (4, "echo $PPID > 4.pid", json!({})),
    ] {
        let result = harness.command("s", step, script, secrets, 20_000).await.expect("command");
        assert_eq!(result["exit_code"], 0, "{result}");
        let reaper = read_pid(&work.join(format!("{step}.pid"))).await;
        reapers.push(reaper);
        match step {
            // A step given secrets ended its reaper before its result came.
            2 => assert!(!alive(reaper), "the reaper of a step given secrets outlived it"),
            // A step that left a process running keeps its reaper.
            3 => assert!(alive(reaper), "the reaper of a process left running is gone"),
            _ => assert!(alive(reaper), "the reaper of step {step} is gone, not kept for the next step"),
        }
    }
    // A step that left nothing gave its reaper to the next one; the others took new ones.
    assert_eq!(reapers[0], reapers[1]);
    assert_eq!(reapers[1], reapers[2]);
    assert!(reapers[3] != reapers[2] && reapers[4] != reapers[3] && reapers[4] != reapers[2], "{reapers:?}");
    harness.request("stop", json!({"session": "s", "timeout_ms": 30_000})).await.expect("stop");
    for reaper in [reapers[3], reapers[4]] {
        assert!(!alive(reaper), "reaper {reaper} outlived its session");
    }
}

#[tokio::test]
async fn a_variable_holding_a_nul_byte_fails_its_step_and_the_next_step_runs() {
    let harness = initialized().await;
    harness.start("s").await;
    let params = json!({"session": "s", "step": 0, "script": "true", "env": {"BAD": "a\u{0}b"}, "timeout_ms": 10_000});
    let error = harness.request("command", params).await.expect_err("an error");
    assert!(error.1.contains("cannot start the step") && error.1.contains("NUL byte"), "{error:?}");
    let result = harness.command("s", 1, "echo fine", json!({}), 10_000).await.expect("command");
    assert_eq!(result["exit_code"], 0);
}

#[tokio::test]
async fn a_step_runs_when_the_idle_reaper_it_would_take_was_killed_while_it_waited() {
    let harness = initialized().await;
    harness.start("s").await;
    let work = harness.session_dir("s").join("work");
    let result = harness.command("s", 0, "echo $PPID > 0.pid", json!({}), 10_000).await.expect("command");
    assert_eq!(result["exit_code"], 0);
    let idle = read_pid(&work.join("0.pid")).await;
    assert!(alive(idle), "the idle reaper is not kept");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(idle), nix::sys::signal::Signal::SIGKILL).expect("kill");
    // Killed, it stays a zombie of the executor's until the next step finds it gone.
    assert!(eventually(std::time::Duration::from_secs(10), || !alive(idle)).await, "the idle reaper lives on");
    let result = harness.command("s", 1, "echo $PPID > 1.pid; echo fine", json!({}), 10_000).await.expect("command");
    assert_eq!(result["exit_code"], 0, "{result}");
    let next = read_pid(&work.join("1.pid")).await;
    assert_ne!(next, idle);
}

#[tokio::test]
async fn a_step_larger_than_the_socket_takes_at_once_reaches_its_reaper_whole() {
    let harness = initialized().await;
    harness.start("s").await;
    // A script of 100 KiB and four variables of 100 KiB: more than the socket pair takes in
    // one write, so the step reaches the reaper in pieces, twice in a row to the same reaper.
    let filler = format!("# {}\n", "x".repeat(100 << 10));
    let value = |letter: &str| letter.repeat(100 << 10);
    let env = json!({"A": value("a"), "B": value("b"), "C": value("c"), "D": value("d")});
    let check = "test \"${#A}${#B}${#C}${#D}\" = 102400102400102400102400";
    for step in 0..2 {
        let script =
            format!("{filler}{check} && test \"$D\" = \"$(printf %0102400d 0 | tr 0 d)\" && echo whole-{step}");
        let params = json!({"session": "s", "step": step, "script": script, "env": env, "timeout_ms": 30_000});
        let result = harness.request("command", params).await.expect("command");
        assert_eq!(result["exit_code"], 0, "{result}");
        assert_eq!(harness.output("s", step, "stdout"), format!("whole-{step}\n"));
    }
    // A script longer than one argument may be (128 KiB on Linux) is refused by name, and
    // the reaper that could not start it runs the next step.
    let script = format!("# {}\ntrue", "x".repeat(200 << 10));
    let params = json!({"session": "s", "step": 2, "script": script, "timeout_ms": 30_000});
    let error = harness.request("command", params).await.expect_err("an error");
    assert!(error.1.contains("cannot start the step") && error.1.contains("Argument list too long"), "{error:?}");
    let result = harness.command("s", 3, "echo fine", json!({}), 10_000).await.expect("command");
    assert_eq!(result["exit_code"], 0);
}

#[tokio::test]
async fn a_steps_shell_starts_with_default_signals_none_blocked_stdin_read_only_and_its_own_process_group() {
    let harness = initialized().await;
    harness.start("s").await;
    // The reaper ignores SIGPIPE and blocks SIGCHLD; neither may reach a step (`yes | head`
    // relies on SIGPIPE's default). The shell reads its own status with builtins, and its
    // descriptors are listed by a child started with no pipe: while a child of it runs, `dash`
    // may still hold every signal blocked from starting it, and a pipeline's pipes open.
    let script = "while read -r line; do case $line in SigBlk:*|SigIgn:*) echo \"$line\";; esac; done < /proc/$$/status; \
                  ls /proc/$$/fd; for fd in 0 1 2; do grep '^flags:' /proc/$$/fdinfo/$fd; done; \
                  echo \"$$ $(cut -d' ' -f5 /proc/$$/stat)\"; pwd; echo x >&0 2>/dev/null && echo wrote-stdin; \
                  yes | head -c 3; echo";
    for step in 0..2 {
        let result = harness.command("s", step, script, json!({}), 10_000).await.expect("command");
        assert_eq!(result["exit_code"], 0, "{result}");
        let output = harness.output("s", step, "stdout");
        let lines: Vec<&str> = output.lines().collect();
        assert_eq!(lines[0], "SigBlk:\t0000000000000000", "{output}");
        assert_eq!(lines[1], "SigIgn:\t0000000000000000", "{output}");
        assert_eq!(lines[2..5], ["0", "1", "2"], "{output}");
        let flags: Vec<u32> = lines[5..8]
            .iter()
            .map(|line| u32::from_str_radix(line.trim_start_matches("flags:").trim(), 8).expect("flags"))
            .collect();
        assert_eq!(flags[0] & 3, 0, "stdin is not read-only: {output}");
        // A program expects blocking output: a non-blocking pipe fails its writes with EAGAIN.
        assert!(flags.iter().all(|flags| flags & 0o4000 == 0), "a descriptor is non-blocking: {output}");
        let (pid, group) = lines[8].split_once(' ').expect("pid and group");
        assert_eq!(pid, group, "{output}");
        assert_eq!(std::path::Path::new(lines[9]), harness.session_dir("s").join("work"), "{output}");
        assert_eq!(lines[10..], ["y", "y"], "{output}");
    }
}
