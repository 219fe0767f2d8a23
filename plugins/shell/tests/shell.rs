//! The shell executor driven through the protocol in memory: steps, timeouts, secrets,
//! transfers, stop, cleanup and shutdown, checked against `/proc` and the filesystem.

#[allow(dead_code)]
mod support;

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::PathBuf;
use std::time::Duration;

use knotless_protocol::error::code;
use knotless_protocol::tarball;
use serde_json::json;
use support::*;

#[tokio::test]
async fn initialize_says_it_isolates_nothing_and_refuses_unknown_options() {
    let harness = uninitialized();
    let error = harness.initialize(json!({"foo": "1"})).await.expect_err("refused");
    assert_eq!(error, (code::CONFIGURATION as i64, "unknown option --foo for the shell executor".to_string()));
    let work_dir = harness.work_dir().to_string_lossy().into_owned();
    let result = harness.initialize(json!({"work-dir": work_dir})).await.expect("initialize");
    assert_eq!(result["executor"]["name"], "shell");
    let capabilities = &result["capabilities"];
    assert_eq!(capabilities["isolation"], "none");
    assert_eq!(
        (capabilities["caches"].clone(), capabilities["secrets"].clone(), capabilities["outputs"].clone()),
        (json!(true), json!(true), json!(true))
    );
    assert_eq!((capabilities["images"].clone(), capabilities["network_policy"].clone()), (json!(false), json!(false)));
}

#[tokio::test]
async fn ping_is_answered_with_params_without_them_and_only_once_initialized() {
    let harness = uninitialized();
    let early = harness.request("ping", json!({})).await.expect_err("not yet initialized");
    assert_eq!(early.0, code::NOT_INITIALIZED as i64, "{early:?}");
    let work_dir = harness.work_dir().to_string_lossy().into_owned();
    harness.initialize(json!({"work-dir": work_dir})).await.expect("initialize");
    assert_eq!(harness.request("ping", json!({})).await.expect("ping"), json!({}));
    assert_eq!(harness.request("ping", serde_json::Value::Null).await.expect("ping without params"), json!({}));
    let wrong = harness.request("start", serde_json::Value::Null).await.expect_err("start needs params");
    // JSON-RPC's invalid params.
    assert_eq!(wrong.0, -32602, "{wrong:?}");
}

#[tokio::test]
async fn start_makes_private_folders_and_refuses_duplicates_and_unsafe_ids() {
    let harness = initialized().await;
    let result = harness.start("s1").await;
    let root = harness.session_dir("s1");
    assert_eq!(result["paths"]["work"], json!(root.join("work").to_string_lossy()));
    assert_eq!(result["paths"]["steps"], json!(root.join("steps").to_string_lossy()));
    assert_eq!(result["paths"]["outputs"], json!(root.join("outputs").to_string_lossy()));
    for folder in ["work", "steps", "outputs", "home", "tmp"] {
        assert!(root.join(folder).is_dir(), "{folder}");
    }
    assert_eq!(std::fs::metadata(&root).expect("stat").permissions().mode() & 0o777, 0o700);
    let again = harness.request("start", json!({"session": "s1", "timeout_ms": 1000})).await.expect_err("refused");
    assert_eq!(again.0, code::CONFIGURATION as i64);
    for bad in ["../x", ".hidden", "a/b", ""] {
        let refused = harness.request("start", json!({"session": bad, "timeout_ms": 1000})).await.expect_err("refused");
        assert_eq!(refused.0, code::CONFIGURATION as i64, "{bad:?}");
    }
    let unknown = harness.command("never", 0, "true", json!({}), 1000).await.expect_err("unknown");
    assert_eq!(unknown.0, code::UNKNOWN_SESSION as i64);
}

#[tokio::test]
async fn a_step_streams_its_output_and_gives_its_exit_code() {
    let harness = initialized().await;
    harness.start("s").await;
    let result = harness.command("s", 0, "echo hi; echo oops >&2; exit 3", json!({}), 10_000).await.expect("command");
    assert_eq!(result["exit_code"], 3);
    assert_eq!(result["killed_processes"], 0);
    assert_eq!(harness.output("s", 0, "stdout"), "hi\n");
    assert_eq!(harness.output("s", 0, "stderr"), "oops\n");
    // `-e`: the first failing command ends the step.
    let result = harness.command("s", 1, "false; echo unreachable", json!({}), 10_000).await.expect("command");
    assert_eq!(result["exit_code"], 1);
    assert_eq!(harness.output("s", 1, "stdout"), "");
    // Killed by a signal: 128 + N.
    let result = harness.command("s", 2, "kill -9 $$", json!({}), 10_000).await.expect("command");
    assert_eq!(result["exit_code"], 128 + 9);
    // Runs in the work folder, with the step's variables.
    harness.command("s", 3, "pwd; echo $GREETING", json!({}), 10_000).await.expect("command");
    let work = harness.session_dir("s").join("work");
    assert_eq!(harness.output("s", 3, "stdout"), format!("{}\nhello\n", work.display()));
}

#[tokio::test]
async fn a_step_in_a_missing_folder_or_a_file_is_refused_and_the_session_runs_on() {
    let harness = initialized().await;
    harness.start("s").await;
    std::fs::write(harness.session_dir("s").join("work/file"), "").expect("a file");
    for (step, workdir) in [(0, "missing"), (1, "file")] {
        let params = json!({"session": "s", "step": step, "name": "in", "script": "touch ran", "env": {},
            "secrets": {}, "workdir": workdir, "timeout_ms": 10_000});
        let refused = harness.request("command", params).await.expect_err("refused");
        assert_eq!(refused.0, code::CONFIGURATION as i64, "{workdir}: {refused:?}");
        let wanted = format!("no folder {}", harness.session_dir("s").join("work").join(workdir).display());
        assert!(refused.1.contains(&wanted), "{workdir}: {refused:?}");
    }
    let ran = harness.command("s", 2, "pwd", json!({}), 10_000).await.expect("command");
    assert_eq!(ran["exit_code"], 0);
    assert_eq!(harness.output("s", 2, "stdout"), format!("{}\n", harness.session_dir("s").join("work").display()));
}

#[tokio::test]
async fn a_timed_out_step_and_its_background_processes_are_killed() {
    let harness = initialized().await;
    harness.start("s").await;
    let error =
        harness.command("s", 0, "sleep 100 & echo $! > bg.pid; sleep 100", json!({}), 500).await.expect_err("timeout");
    assert_eq!(error, (code::TIMEOUT as i64, "step step-0 passed its timeout of 500 ms".to_string()));
    let background = read_pid(&harness.session_dir("s").join("work/bg.pid")).await;
    assert!(!alive(background), "the background sleep {background} is gone");
}

#[tokio::test]
async fn a_cancelled_step_is_killed() {
    let harness = initialized().await;
    harness.start("s").await;
    let params =
        json!({"session": "s", "step": 0, "script": "sleep 100 & echo $! > bg.pid; sleep 100", "timeout_ms": 60_000});
    let (id, receiver) = harness.send("command", params).await;
    let background = read_pid(&harness.session_dir("s").join("work/bg.pid")).await;
    assert!(alive(background));
    harness.cancel(id).await;
    let error = answer(receiver).await.expect_err("cancelled");
    assert_eq!(error.0, code::CANCELLED as i64);
    assert!(!alive(background), "the background sleep {background} is gone");
}

#[tokio::test]
async fn what_a_secret_step_leaves_running_is_killed_and_counted() {
    let harness = initialized().await;
    harness.start("s").await;
    let script = "sleep 100 & echo $! > bg.pid; echo started";
    let result = harness.command("s", 0, script, json!({"TOKEN": "t0ps3cret"}), 10_000).await.expect("command");
    assert_eq!(result["exit_code"], 0);
    assert!(result["killed_processes"].as_u64().expect("count") >= 1, "{result}");
    assert_eq!(harness.output("s", 0, "stdout"), "started\n");
    let background = read_pid(&harness.session_dir("s").join("work/bg.pid")).await;
    assert!(!alive(background), "the background sleep {background} is gone");
    assert!(processes_with("TOKEN=t0ps3cret").is_empty());
}

#[tokio::test]
async fn what_a_plain_step_leaves_running_lives_on_until_stop() {
    let harness = initialized().await;
    harness.start("s").await;
    let script = "sleep 100 & echo $! > bg.pid; echo started";
    let result = harness.command("s", 0, script, json!({}), 10_000).await.expect("command");
    assert_eq!((result["exit_code"].clone(), result["killed_processes"].clone()), (json!(0), json!(0)));
    assert!(
        result["duration_ms"].as_u64().expect("duration") < 5_000,
        "the step did not wait for the background sleep"
    );
    let background = read_pid(&harness.session_dir("s").join("work/bg.pid")).await;
    assert!(alive(background), "a plain step may leave a service running");
    // A later secret step does not kill what was there before it.
    let result = harness.command("s", 1, "true", json!({"TOKEN": "x"}), 10_000).await.expect("command");
    assert_eq!(result["killed_processes"], 0);
    assert!(alive(background));
    let stopped = harness.request("stop", json!({"session": "s", "timeout_ms": 10_000})).await.expect("stop");
    assert!(!alive(background), "stop kills the session's processes");
    let removed = stopped["removed"].as_array().expect("removed");
    assert!(removed.contains(&json!({"kind": "process", "name": background.to_string(), "session": "s"})), "{stopped}");
    let folder = harness.session_dir("s").to_string_lossy().into_owned();
    assert!(removed.contains(&json!({"kind": "folder", "name": folder, "session": "s"})), "{stopped}");
    assert!(!harness.session_dir("s").exists());
    let again = harness.command("s", 2, "true", json!({}), 1000).await.expect_err("stopped");
    assert_eq!(again.0, code::UNKNOWN_SESSION as i64);
}

#[tokio::test]
async fn a_step_ends_with_its_shell_though_what_it_left_floods_its_output() {
    let harness = initialized().await;
    harness.start("s").await;
    // `yes` writes as fast as the executor reads, so its pipe rarely stands empty; its output
    // after the step's end is nobody's, and a write to the closed pipe ends it.
    let script = "yes flood & echo $! > bg.pid";
    let result = tokio::time::timeout(Duration::from_secs(30), harness.command("s", 0, script, json!({}), 60_000))
        .await
        .expect("the step ended")
        .expect("command");
    assert_eq!(result["exit_code"], 0);
    assert!(result["duration_ms"].as_u64().expect("duration") < 5_000, "{result}");
    assert!(harness.output("s", 0, "stdout").starts_with("flood\nflood\n"));
    let background = read_pid(&harness.session_dir("s").join("work/bg.pid")).await;
    harness.request("stop", json!({"session": "s", "timeout_ms": 10_000})).await.expect("stop");
    assert!(!alive(background), "nothing of the session outlives stop");
}

#[tokio::test]
async fn a_step_sees_only_its_own_secrets_and_a_clean_environment() {
    let harness = initialized().await;
    harness.start("s").await;
    harness.command("s", 0, "env", json!({"FIRST": "alpha-secret"}), 10_000).await.expect("command");
    harness.command("s", 1, "env", json!({"SECOND": "beta-secret"}), 10_000).await.expect("command");
    let first = harness.output("s", 0, "stdout");
    let second = harness.output("s", 1, "stdout");
    assert!(first.lines().any(|line| line == "FIRST=alpha-secret"), "{first}");
    assert!(second.lines().any(|line| line == "SECOND=beta-secret"), "{second}");
    assert!(!second.contains("alpha-secret") && !second.contains("FIRST="), "{second}");
    let root = harness.session_dir("s");
    // The user's HOME, when the executor has one, else the session's own folder.
    let home = std::env::var("HOME").ok().filter(|home| !home.is_empty());
    let home = home.unwrap_or_else(|| root.join("home").display().to_string());
    for expected in
        [format!("HOME={home}"), format!("TMPDIR={}", root.join("tmp").display()), "GREETING=hello".to_string()]
    {
        assert!(second.lines().any(|line| line == expected), "{expected} in {second}");
    }
    // Of the executor's own environment, only PATH and the user's variables (cargo sets
    // CARGO_* for tests).
    assert!(!second.contains("CARGO_") && !second.contains("KNOTLESS_"), "{second}");
}

#[tokio::test]
async fn a_secret_is_never_in_an_argv() {
    let harness = initialized().await;
    harness.start("s").await;
    let secret = "v3ry-s3cret-value-in-argv-check";
    let script = "echo ready; while [ ! -e go ]; do sleep 0.02; done; test -n \"$API_TOKEN\"";
    let params =
        json!({"session": "s", "step": 0, "script": script, "secrets": {"API_TOKEN": secret}, "timeout_ms": 30_000});
    let (_, receiver) = harness.send("command", params).await;
    assert!(eventually(Duration::from_secs(10), || harness.output("s", 0, "stdout") == "ready\n").await);
    assert!(
        !processes_with(&format!("API_TOKEN={secret}")).is_empty(),
        "the step runs with the secret in its environment"
    );
    assert_eq!(cmdlines_containing(secret), Vec::<String>::new());
    std::fs::write(harness.session_dir("s").join("work/go"), "").expect("write go");
    let result = answer(receiver).await.expect("command");
    assert_eq!(result["exit_code"], 0);
}

fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::create_dir_all(root.join("bin")).expect("mkdir");
    std::fs::create_dir_all(root.join("empty")).expect("mkdir");
    std::fs::write(root.join("bin/run.sh"), "#!/bin/sh\necho ran\n").expect("write");
    std::fs::set_permissions(root.join("bin/run.sh"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    symlink("bin/run.sh", root.join("link")).expect("symlink");
    dir
}

fn check_tree(root: &std::path::Path) {
    let mode = std::fs::metadata(root.join("bin/run.sh")).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(std::fs::read_link(root.join("link")).expect("readlink"), PathBuf::from("bin/run.sh"));
    assert!(root.join("empty").is_dir());
    assert_eq!(std::fs::read_dir(root.join("empty")).expect("list").count(), 0);
}

#[tokio::test]
async fn upload_then_download_round_trips_modes_links_and_empty_folders() {
    let harness = initialized().await;
    let started = harness.start("s").await;
    let work = started["paths"]["work"].as_str().expect("work").to_string();

    let source = tree();
    let archive = tarball::pack_dir(source.path(), Vec::new()).expect("pack");
    let result = harness.upload("s", &format!("{work}/checkout"), archive.clone()).await.expect("upload");
    assert_eq!(result["bytes"], archive.len() as u64);
    check_tree(&harness.session_dir("s").join("work/checkout"));
    // The step sees it and can run it.
    harness.command("s", 0, "./checkout/link", json!({}), 10_000).await.expect("command");
    assert_eq!(harness.output("s", 0, "stdout"), "ran\n");

    let (result, received) = harness.download("s", "work/checkout").await;
    assert_eq!(result.expect("download")["bytes"], received.len() as u64);
    let dest = tempfile::tempdir().expect("tempdir");
    tarball::unpack_vetted(received.as_slice(), dest.path(), 1 << 20).expect("unpack");
    check_tree(dest.path());
}

#[tokio::test]
async fn paths_outside_the_session_are_refused_and_missing_ones_not_found() {
    let harness = initialized().await;
    harness.start("s").await;
    // A symlink a step made that leads out of the session.
    harness.command("s", 0, "ln -s /etc escape", json!({}), 10_000).await.expect("command");
    for path in ["../other", "/etc", "work/../../x", "work/escape/sub"] {
        let error = harness.upload("s", path, Vec::new()).await.expect_err("refused");
        assert_eq!(error, (code::CONFIGURATION as i64, format!("path {path} is outside session s")));
    }
    let (answered, _) = harness.download("s", "outputs/none").await;
    assert_eq!(answered.expect_err("missing").0, code::NOT_FOUND as i64);
}

#[tokio::test]
async fn cleanup_removes_sessions_not_kept_and_leaves_other_runners_alone() {
    let harness = initialized().await;
    harness.start("gone").await;
    harness.start("kept").await;
    harness.command("gone", 0, "sleep 100 & echo $! > bg.pid", json!({}), 10_000).await.expect("command");
    harness.command("kept", 0, "sleep 100 & echo $! > bg.pid", json!({}), 10_000).await.expect("command");
    let gone_pid = read_pid(&harness.session_dir("gone").join("work/bg.pid")).await;
    let kept_pid = read_pid(&harness.session_dir("kept").join("work/bg.pid")).await;
    let other_runner = harness.work_dir().join("other-runner/session");
    std::fs::create_dir_all(&other_runner).expect("mkdir");

    let result = harness.request("cleanup", json!({"keep": ["kept"], "timeout_ms": 10_000})).await.expect("cleanup");
    assert_eq!(result["failures"], json!([]));
    let removed = result["removed"].as_array().expect("removed");
    assert!(removed.contains(&json!({"kind": "process", "name": gone_pid.to_string(), "session": "gone"})), "{result}");
    assert!(removed.iter().all(|resource| resource["session"] == "gone"), "{result}");
    assert!(!harness.session_dir("gone").exists());
    assert!(!alive(gone_pid));
    assert!(harness.session_dir("kept").is_dir());
    assert!(alive(kept_pid));
    assert!(other_runner.is_dir());
    let error = harness.command("gone", 1, "true", json!({}), 1000).await.expect_err("gone");
    assert_eq!(error.0, code::UNKNOWN_SESSION as i64);
    harness.request("stop", json!({"session": "kept", "timeout_ms": 10_000})).await.expect("stop");
    assert!(!alive(kept_pid));
}

#[tokio::test]
async fn the_end_of_stdin_stops_every_session() {
    let mut harness = initialized().await;
    harness.start("a").await;
    harness.start("b").await;
    harness.command("a", 0, "sleep 100 & echo $! > bg.pid", json!({}), 10_000).await.expect("command");
    let background = read_pid(&harness.session_dir("a").join("work/bg.pid")).await;
    assert!(alive(background));
    harness.close_input().await;
    assert!(!harness.session_dir("a").exists());
    assert!(!harness.session_dir("b").exists());
    assert!(!alive(background));
}

#[tokio::test]
async fn stop_removes_folders_a_step_made_read_only() {
    let harness = initialized().await;
    harness.start("s").await;
    let result = harness
        .command("s", 0, "mkdir -p cache/mod && touch cache/mod/file && chmod -R a-w cache", json!({}), 10_000)
        .await;
    assert_eq!(result.expect("command")["exit_code"], 0);
    harness.request("stop", json!({"session": "s", "timeout_ms": 10_000})).await.expect("stop");
    assert!(!harness.session_dir("s").exists());
}

#[tokio::test]
async fn stop_with_keep_leaves_the_folder() {
    let harness = initialized().await;
    harness.start("s").await;
    let stopped =
        harness.request("stop", json!({"session": "s", "keep": true, "timeout_ms": 10_000})).await.expect("stop");
    assert_eq!(stopped["removed"], json!([]));
    assert!(harness.session_dir("s").join("work").is_dir());
    let error = harness.command("s", 0, "true", json!({}), 1000).await.expect_err("forgotten");
    assert_eq!(error.0, code::UNKNOWN_SESSION as i64);
}

#[tokio::test]
async fn a_secret_step_spares_a_service_an_earlier_step_started_and_its_workers() {
    let harness = initialized().await;
    harness.start("s").await;
    // A service that forks a short-lived worker again and again.
    let service = "sh -c 'while :; do sleep 0.05; done' > /dev/null 2>&1 & echo $! > service.pid";
    harness.command("s", 0, service, json!({}), 10_000).await.expect("command");
    let service = read_pid(&harness.session_dir("s").join("work/service.pid")).await;
    let result = harness.command("s", 1, "sleep 0.2", json!({"TOKEN": "x"}), 10_000).await.expect("command");
    assert_eq!(result["killed_processes"], 0, "{result}");
    assert!(alive(service));
    harness.request("stop", json!({"session": "s", "timeout_ms": 10_000})).await.expect("stop");
    assert!(!alive(service));
}

#[tokio::test]
async fn stop_kills_a_step_still_running_in_the_session() {
    let harness = initialized().await;
    harness.start("s").await;
    let params = json!({"session": "s", "step": 0, "script": "setsid sleep 100 & echo $! > bg.pid; sleep 100", "timeout_ms": 60_000});
    let (_, receiver) = harness.send("command", params).await;
    let background = read_pid(&harness.session_dir("s").join("work/bg.pid")).await;
    harness.request("stop", json!({"session": "s", "timeout_ms": 30_000})).await.expect("stop");
    let error = answer(receiver).await.expect_err("the step ends with its session");
    assert_eq!(error.0, code::CANCELLED as i64);
    assert!(!alive(background), "the step's background process {background} is gone");
    assert!(!harness.session_dir("s").exists());
}
