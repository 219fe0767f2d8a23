//! The Docker executor against the real engine: run `plugins/docker/tests/support/engine.sh`
//! first (it starts dockerd and imports the test image). Every test ends with
//! [`Containers::finish`](support::Containers::finish), which checks that no container labelled with its runner id is left.

mod support;

use std::os::unix::fs::{PermissionsExt, symlink};
use std::time::{Duration, Instant};

use knotless_protocol::error::code;
use knotless_protocol::tarball;
use serde_json::json;
use support::*;

#[tokio::test]
async fn initialize_refuses_unknown_options_and_a_missing_engine_naming_the_flag() {
    let harness = uninitialized("knotless-test-init");
    let (code, message) = harness.initialize(json!({"namespace": "x"})).await.expect_err("refused");
    assert_eq!(code, i64::from(code::CONFIGURATION));
    assert!(message.contains("unknown option --namespace"), "{message}");

    let harness = uninitialized("knotless-test-init");
    let (code, message) = harness.initialize(json!({"docker": "/nonexistent/docker"})).await.expect_err("refused");
    assert_eq!(code, i64::from(code::CONFIGURATION));
    assert!(message.contains("--executor-option docker=PATH"), "{message}");

    let harness = uninitialized("knotless-test-init");
    let started = Instant::now();
    let (code, message) =
        harness.initialize(json!({"host": "unix:///nonexistent/docker.sock"})).await.expect_err("refused");
    assert_eq!(code, i64::from(code::CONFIGURATION));
    assert!(message.starts_with("no Docker engine answers at unix:///nonexistent/docker.sock"), "{message}");
    assert!(message.contains("--executor-option host="), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn the_container_is_locked_down_labelled_and_limited() {
    let harness = initialized().await;
    let params = json!({"session": "locked", "timeout_ms": 60_000, "run": {"id": "run-1", "workflow": "ci",
        "repository": "demo"}, "resources": {"cpu": "500m", "memory": "256Mi"}});
    let started = harness.request("start", params).await.expect("start");
    assert_eq!(started["paths"], json!({"work": "/work", "steps": "/steps", "outputs": "/outputs"}));
    let container = harness.container("locked");
    let format = "{{json .HostConfig}}|{{json .Config.Labels}}|{{json .Mounts}}";
    let (ok, stdout, stderr) = docker(&["inspect", "--format", format, &container]);
    assert!(ok, "{stderr}");
    let text = String::from_utf8_lossy(&stdout);
    let parts: Vec<&str> = text.trim().split('|').collect();
    let host: serde_json::Value = serde_json::from_str(parts[0]).expect("host config");
    let labels: serde_json::Value = serde_json::from_str(parts[1]).expect("labels");
    assert_eq!(host["CapDrop"], json!(["ALL"]));
    assert_eq!(host["SecurityOpt"], json!(["no-new-privileges"]));
    assert_eq!(host["Init"], json!(true));
    assert_eq!(host["NetworkMode"], json!("none"));
    assert_eq!(host["PidsLimit"], json!(1024));
    assert_eq!(host["Memory"], json!(268_435_456));
    assert_eq!(host["NanoCpus"], json!(500_000_000));
    assert_eq!(host["Binds"], json!(null));
    assert_eq!(parts[2], "[]", "nothing is mounted");
    assert_eq!(labels["dev.knotless.runner"], json!(harness.runner_id()));
    assert_eq!(labels["dev.knotless.session"], json!("locked"));
    assert_eq!(labels["dev.knotless.run"], json!("run-1"));

    let script = "ls /sys/class/net; cat /proc/1/cmdline | tr '\\0' ' '; echo; ls -d /work /steps /outputs; pwd";
    let result = harness.command("locked", 0, script, json!({}), 30_000).await.expect("step");
    assert_eq!(result["exit_code"], 0);
    let stdout = harness.output("locked", 0, "stdout");
    assert!(stdout.starts_with("lo\n"), "only the loopback interface: {stdout}");
    assert!(stdout.contains("docker-init"), "an init process is pid 1: {stdout}");
    assert!(stdout.ends_with("/outputs\n/steps\n/work\n/work\n"), "{stdout}");
    harness.finish().await;
}

#[tokio::test]
async fn a_missing_image_fails_at_once_naming_it() {
    let harness = initialized().await;
    let started = Instant::now();
    let params = json!({"session": "noimage", "image": "knotless-test/missing:0", "timeout_ms": 60_000});
    let (code, message) = harness.request("start", params).await.expect_err("refused");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    assert_eq!(code, i64::from(code::INFRASTRUCTURE));
    assert!(message.contains("image knotless-test/missing:0 is not on the docker engine"), "{message}");
    harness.finish().await;
}

#[tokio::test]
async fn a_step_streams_output_and_gives_its_exit_code() {
    let harness = initialized().await;
    harness.start("exit").await;
    let script = "echo \"$GREETING out\"; echo err >&2; exit 3";
    let result = harness.command("exit", 0, script, json!({}), 30_000).await.expect("step");
    assert_eq!(result["exit_code"], 3);
    assert_eq!(harness.output("exit", 0, "stdout"), "hello out\n");
    assert_eq!(harness.output("exit", 0, "stderr"), "err\n", "the exit report is taken out of stderr");
    harness.finish().await;
}

#[tokio::test]
async fn a_secret_step_sees_only_its_secrets_and_what_it_leaves_running_is_killed() {
    let harness = initialized().await;
    harness.start("secrets").await;
    let first = harness
        .command("secrets", 0, "sleep 300 & env", json!({"FIRST_SECRET": "first-value"}), 30_000)
        .await
        .expect("first step");
    assert_eq!(first["exit_code"], 0);
    assert!(first["killed_processes"].as_u64().expect("count") >= 1, "{first}");
    let second = harness
        .command("secrets", 1, "env; ps -o args", json!({"SECOND_SECRET": "second-value"}), 30_000)
        .await
        .expect("second step");
    assert_eq!(second["exit_code"], 0);
    let (first_env, second_out) = (harness.output("secrets", 0, "stdout"), harness.output("secrets", 1, "stdout"));
    assert!(first_env.contains("FIRST_SECRET=first-value") && !first_env.contains("second-value"), "{first_env}");
    assert!(second_out.contains("SECOND_SECRET=second-value"), "{second_out}");
    assert!(!second_out.contains("first-value") && !second_out.contains("FIRST_SECRET"), "{second_out}");
    assert!(!second_out.contains("sleep 300"), "the first step's leftover was killed: {second_out}");
    harness.finish().await;
}

#[tokio::test]
async fn a_plain_step_may_leave_a_service_running_and_returns_at_once() {
    let harness = initialized().await;
    harness.start("service").await;
    let started = Instant::now();
    let result = harness.command("service", 0, "sleep 300 & echo up", json!({}), 30_000).await.expect("step");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert_eq!((result["exit_code"].as_i64(), result["killed_processes"].as_u64()), (Some(0), Some(0)));
    let alive = harness.command("service", 1, "ps -o args | grep -q '^sleep 300'", json!({}), 30_000).await;
    assert_eq!(alive.expect("step")["exit_code"], 0, "the service lives on");
    harness.finish().await;
}

#[tokio::test]
async fn a_canary_secret_is_on_no_command_line_in_no_inspect_file_or_output() {
    let harness = initialized().await;
    harness.start("canary").await;
    let canary = format!("canary-{}-{}", std::process::id(), "c4n4ry-v4lu3-n0t-3ls3wh3r3");
    let script = "[ ${#CANARY} -gt 20 ] && sleep 300 & echo started; sleep 2; echo done";
    let (_, receiver) = harness
        .send(
            "command",
            json!({"session": "canary", "step": 0, "script": script, "secrets": {"CANARY": canary}, "timeout_ms": 30_000}),
        )
        .await;
    let mut sampled = 0;
    while !harness.output("canary", 0, "stdout").contains("done") && sampled < 1000 {
        assert_eq!(cmdlines_containing(&canary), Vec::<String>::new(), "the canary is on a host command line");
        sampled += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let result = answer(receiver).await.expect("step");
    assert_eq!(result["exit_code"], 0);
    assert!(sampled > 5, "sampled the host's processes while the step ran");
    let container = harness.container("canary");
    let (ok, inspect, stderr) = docker(&["inspect", &container]);
    assert!(ok, "{stderr}");
    assert!(!contains(&inspect, &canary), "the canary is in docker inspect");
    let (ok, exported, stderr) = docker(&["export", &container]);
    assert!(ok, "{stderr}");
    assert!(exported.len() > 100_000, "exported the container's files");
    assert!(!contains(&exported, &canary), "the canary is in a file of the container");
    assert!(!harness.notifications_text().contains(&canary), "the canary is in the step's output or log");
    harness.finish().await;
}

#[tokio::test]
async fn a_hanging_step_is_killed_at_its_timeout() {
    let harness = initialized().await;
    harness.start("hang").await;
    let started = Instant::now();
    let (code, message) = harness.command("hang", 0, "sleep 120", json!({}), 1_000).await.expect_err("timed out");
    assert_eq!(code, i64::from(code::TIMEOUT), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    let after = harness.command("hang", 1, "ps -o args", json!({}), 30_000).await.expect("step");
    assert_eq!(after["exit_code"], 0);
    assert!(!harness.output("hang", 1, "stdout").contains("sleep 120"), "the step was killed in the container");
    harness.finish().await;
}

#[tokio::test]
async fn a_container_removed_under_a_running_step_is_an_infrastructure_error() {
    let harness = initialized().await;
    harness.start("removed").await;
    let (_, receiver) = harness
        .send(
            "command",
            json!({"session": "removed", "step": 0, "script": "echo started; sleep 300", "timeout_ms": 120_000}),
        )
        .await;
    assert!(
        eventually(Duration::from_secs(20), || harness.output("removed", 0, "stdout").contains("started")).await,
        "the step started"
    );
    let started = Instant::now();
    let (ok, _, stderr) = docker(&["rm", "--force", &harness.container("removed")]);
    assert!(ok, "{stderr}");
    let (code, message) = answer(receiver).await.expect_err("an error");
    assert_eq!(code, i64::from(code::INFRASTRUCTURE), "{message}");
    assert!(message.contains(&harness.container("removed")), "{message}");
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    harness.finish().await;
}

#[tokio::test]
async fn an_exec_that_ends_without_the_sentinel_is_a_lost_stream_not_a_step_failure() {
    let harness = initialized().await;
    harness.start("lost").await;
    // The step kills the shell that would report its exit code: the exec ends, the container
    // runs on, and nothing proved the step's end.
    let (code, message) =
        harness.command("lost", 0, "echo started; kill -9 $PPID; sleep 5", json!({}), 60_000).await.expect_err("lost");
    assert_eq!(code, i64::from(code::INFRASTRUCTURE), "{message}");
    assert!(message.contains("lost the exec stream"), "{message}");
    let after = harness.command("lost", 1, "true", json!({}), 30_000).await.expect("the session still works");
    assert_eq!(after["exit_code"], 0);
    harness.finish().await;
}

#[tokio::test]
async fn cleanup_removes_what_a_killed_runner_left_and_keeps_sessions_in_flight() {
    let crashed = initialized().await;
    crashed.start("orphan").await;
    crashed.start("inflight").await;
    // The runner dies without a word: its executor never stops the sessions. A new executor
    // of the same runner id sweeps them.
    let runner_id = crashed.runner_id().to_string();
    std::mem::forget(crashed);
    let fresh = for_runner(&runner_id).await;
    let result = fresh.request("cleanup", json!({"keep": ["inflight"], "timeout_ms": 60_000})).await.expect("cleanup");
    let orphan = format!("knotless-{runner_id}-orphan");
    assert_eq!(result["removed"], json!([{"kind": "container", "name": orphan, "session": "orphan"}]));
    assert_eq!(containers_of(&runner_id), vec![format!("knotless-{runner_id}-inflight")]);
    let result = fresh.request("cleanup", json!({"keep": [], "timeout_ms": 60_000})).await.expect("cleanup");
    assert_eq!(result["removed"].as_array().map(Vec::len), Some(1));
    fresh.finish().await;
}

fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::create_dir_all(root.join("src/empty")).expect("mkdir");
    std::fs::write(root.join("src/run.sh"), "#!/bin/sh\necho ran\n").expect("write");
    std::fs::set_permissions(root.join("src/run.sh"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(root.join("readme"), "text").expect("write");
    std::fs::set_permissions(root.join("readme"), std::fs::Permissions::from_mode(0o640)).expect("chmod");
    symlink("src/run.sh", root.join("link")).expect("symlink");
    dir
}

#[tokio::test]
async fn upload_then_download_round_trips_modes_links_and_empty_folders() {
    let harness = initialized().await;
    harness.start("files").await;
    round_trip(&harness, "files").await;
    harness.finish().await;
}

/// Uploads a tree, runs what it holds, downloads it back: modes, links and empty folders kept.
async fn round_trip(harness: &Harness, session: &str) {
    let source = tree();
    let archive = tarball::pack_dir(source.path(), Vec::new()).expect("pack");
    let sent = harness.upload(session, "/work/tree", archive.clone()).await.expect("upload");
    assert_eq!(sent["bytes"], archive.len());
    let ran = harness.command(session, 0, "./tree/link && stat -c '%a %n' tree/readme", json!({}), 30_000).await;
    assert_eq!(ran.expect("step")["exit_code"], 0);
    assert_eq!(harness.output(session, 0, "stdout"), "ran\n640 tree/readme\n");
    // Nothing of the staging is left, and an upload into a folder that holds files merges in.
    let again = tarball::pack_dir(source.path(), Vec::new()).expect("pack");
    harness.upload(session, "/work/tree", again).await.expect("upload again");
    let listed = harness.command(session, 1, "ls -A /work/tree", json!({}), 30_000).await.expect("step");
    assert_eq!(listed["exit_code"], 0);
    assert_eq!(harness.output(session, 1, "stdout"), "link\nreadme\nsrc\n");

    let (answered, bytes) = harness.download(session, "/work/tree").await;
    assert_eq!(answered.expect("download")["bytes"], bytes.len());
    let back = tempfile::tempdir().expect("tempdir");
    tarball::unpack_vetted(bytes.as_slice(), back.path(), 1 << 30).expect("unpack");
    let root = back.path();
    let mode = |path: &str| std::fs::symlink_metadata(root.join(path)).expect(path).permissions().mode() & 0o777;
    assert_eq!((mode("src/run.sh"), mode("readme")), (0o755, 0o640));
    assert!(root.join("src/empty").is_dir(), "the empty folder came back");
    assert_eq!(std::fs::read_link(root.join("link")).expect("a symlink"), std::path::Path::new("src/run.sh"));
    assert!(!root.join("tree").exists(), "entries are relative to the folder");

    let (answered, _) = harness.download(session, "/work/no-such-folder").await;
    assert_eq!(answered.expect_err("missing").0, i64::from(code::NOT_FOUND));
}

#[tokio::test]
async fn an_upload_with_a_device_node_is_refused() {
    let harness = initialized().await;
    harness.start("hostile").await;
    refused_device(&harness, "hostile", 0).await;
    harness.finish().await;
}

/// An upload whose second entry is a device node is refused and leaves nothing behind.
async fn refused_device(harness: &Harness, session: &str, step: u32) {
    let mut builder = tar::Builder::new(Vec::new());
    // A good entry first: a refused upload leaves none of it behind.
    let mut good = tar::Header::new_gnu();
    good.set_size(2);
    good.set_mode(0o644);
    builder.append_data(&mut good, "good", &b"ok"[..]).expect("append");
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Block);
    header.set_size(0);
    header.set_mode(0o666);
    header.set_device_major(8).expect("major");
    header.set_device_minor(0).expect("minor");
    builder.append_data(&mut header, "disk", std::io::empty()).expect("append");
    let archive = builder.into_inner().expect("finish");
    let (code, message) = harness.upload(session, "/work/in", archive).await.expect_err("refused");
    assert_eq!(code, i64::from(code::TOO_LARGE), "{message}");
    assert!(message.contains("refused tar entry \"disk\""), "{message}");
    let ran = harness.command(session, step, "ls -A /work/in", json!({}), 30_000).await.expect("step");
    assert_eq!(ran["exit_code"], 0);
    assert_eq!(harness.output(session, step, "stdout"), "", "nothing of the refused upload is left");
}

/// The test image with dash for its `sh` and no `tar` (`support/image-without-tar.sh`).
fn image_without_tar() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/image-without-tar.sh");
    let made = std::process::Command::new("bash").arg(script).output().expect("bash");
    assert!(made.status.success(), "{made:?}");
    String::from_utf8(made.stdout).expect("utf-8").trim().to_string()
}

#[tokio::test]
async fn an_image_without_tar_uploads_through_docker_cp_with_the_same_guarantees() {
    let image = image_without_tar();
    let runner_id = format!("knotless-test-without-tar-{}", std::process::id());
    let harness = uninitialized(&runner_id);
    harness.initialize(json!({"image": image})).await.expect("initialize");
    harness.start("bare").await;
    let probed = harness.command("bare", 10, "command -v tar || echo none", json!({}), 30_000).await;
    assert_eq!(probed.expect("step")["exit_code"], 0);
    assert_eq!(harness.output("bare", 10, "stdout"), "none\n", "the image has no tar");
    round_trip(&harness, "bare").await;
    refused_device(&harness, "bare", 11).await;
    harness.finish().await;
}

#[tokio::test]
async fn a_container_stops_by_itself_past_its_run_timeout_and_its_margin() {
    let runner_id = format!("knotless-test-lifetime-{}", std::process::id());
    let harness = uninitialized(&runner_id);
    harness.initialize(json!({"image": support::IMAGE, "lifetime-margin": "1"})).await.expect("initialize");
    harness
        .request("start", json!({"session": "short", "timeout_ms": 60_000, "run_timeout_ms": 1_000}))
        .await
        .expect("start");
    let container = harness.container("short");
    let running = || {
        let (ok, stdout, _) = docker(&["inspect", "--format", "{{.State.Running}}", &container]);
        ok && String::from_utf8_lossy(&stdout).trim() == "true"
    };
    assert!(running(), "the container runs at first");
    // A run of 1 s plus a margin of 1 s: the keep-alive ends and the container with it.
    assert!(eventually(Duration::from_secs(30), || !running()).await, "{container} outlived its lifetime");
    let (code, message) = harness
        .request("command", json!({"session": "short", "step": 0, "script": "true", "timeout_ms": 10_000}))
        .await
        .expect_err("a step in a stopped container");
    assert_eq!(code, i64::from(code::INFRASTRUCTURE), "{message}");
    harness.request("stop", json!({"session": "short", "timeout_ms": 60_000})).await.expect("stop");
    assert!(containers_of(&runner_id).is_empty(), "stop removes the stopped container");
    harness.finish().await;
}

/// Leftovers that hide in every way an attacker would (see the script).
const HIDE: &str = include_str!("../../../tests/scripts/hide.sh");

/// Which of them live, and which processes hold `./needle`.
const HOLDERS: &str = include_str!("../../../tests/scripts/holders.sh");

#[tokio::test]
async fn no_process_of_a_secret_step_outlives_it_however_it_hides() {
    let harness = initialized().await;
    harness.start("hide").await;
    let result =
        harness.command("hide", 0, HIDE, json!({"TOKEN": "hidden-s3cret-docker"}), 60_000).await.expect("hiding step");
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(result["killed_processes"], 5, "{result}");
    let check = format!("printf '%s%s' 'hidden-' 's3cret-docker' > needle\n{HOLDERS}");
    let checked = harness.command("hide", 1, &check, json!({}), 60_000).await.expect("check step");
    assert_eq!(checked["exit_code"], 0);
    assert_eq!(harness.output("hide", 1, "stdout"), "checked\n", "a hidden process or the secret outlived its step");
    harness.finish().await;
}

#[tokio::test]
async fn a_timed_out_step_loses_every_process_however_it_hides() {
    let harness = initialized().await;
    harness.start("hide").await;
    let script = format!("{HIDE}\nsleep 600");
    let error = harness.command("hide", 0, &script, json!({}), 3_000).await.expect_err("timed out");
    assert_eq!(error.0, knotless_protocol::error::code::TIMEOUT as i64, "{error:?}");
    let check = format!("printf no-such-value-91f3 > needle\n{HOLDERS}");
    harness.command("hide", 1, &check, json!({}), 60_000).await.expect("check step");
    assert_eq!(harness.output("hide", 1, "stdout"), "checked\n", "a hidden process outlived its step");
    harness.finish().await;
}

#[tokio::test]
async fn the_end_of_stdin_ends_running_steps_and_removes_every_container_but_kept_ones() {
    let mut harness = initialized().await;
    harness.start("gone").await;
    harness.request("start", json!({"session": "kept", "keep": true, "timeout_ms": 60_000})).await.expect("start");
    let params = json!({"session": "gone", "step": 0, "script": "echo running; sleep 600", "timeout_ms": 600_000});
    let (_, _running) = harness.send("command", params).await;
    let started = std::time::Instant::now();
    while harness.output("gone", 0, "stdout") != "running\n" {
        assert!(started.elapsed() < Duration::from_secs(30), "the step never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    harness.close_input().await;
    let left = containers_of(harness.runner_id());
    assert_eq!(left, [harness.container("kept")], "only the kept container stays");
    assert_eq!(knotless_protocol::kept::sessions(harness.runner_id()), ["kept"], "marked kept");
    docker(&["rm", "--force", &harness.container("kept")]);
    knotless_protocol::kept::unmark(harness.runner_id(), "kept");
}
