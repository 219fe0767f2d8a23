//! The Kubernetes executor against the fake kubectl: the failure matrix (image missing, pull
//! denied, unschedulable, non-zero exit, timeout, runner killed, node lost, Job deleted, policy
//! denied, token expired, exec stream dropped), the canary secret, and the sweep of a
//! secret-bearing step's leftovers.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use knotless_protocol::ErrorKind;
use support::*;
use tokio_util::sync::CancellationToken;

/// A start that must fail: its error message.
async fn failed_start(cluster: &Cluster) -> (Option<ErrorKind>, String) {
    let host = cluster.host(&Cluster::runner_id()).await;
    let opened = host.open(start_params("doomed"), &CancellationToken::new()).await;
    let error = opened.err().expect("the start fails");
    host.shutdown().await;
    (error.kind(), error.to_string())
}

/// Opens a session on a fresh executor.
async fn open(cluster: &Cluster) -> (std::sync::Arc<knotless_run::host::ExecutorHost>, knotless_run::host::Session) {
    let host = cluster.host(&Cluster::runner_id()).await;
    let session = host.open(start_params("run-1"), &CancellationToken::new()).await.expect("start");
    (host, session)
}

#[tokio::test]
async fn an_image_that_does_not_exist_fails_the_start_with_its_cause() {
    let cluster = Cluster::new();
    cluster.inject(&["image-missing"]);
    let (kind, message) = failed_start(&cluster).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("the image busybox does not exist"), "{message}");
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn a_denied_image_pull_fails_the_start_with_its_cause() {
    let cluster = Cluster::new();
    cluster.inject(&["pull-denied"]);
    let (kind, message) = failed_start(&cluster).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("was denied") && message.contains("401 Unauthorized"), "{message}");
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn an_unschedulable_pod_fails_the_start_quickly() {
    let cluster = Cluster::new();
    cluster.inject(&["unschedulable"]);
    let started = std::time::Instant::now();
    let (kind, message) = failed_start(&cluster).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("unschedulable") && message.contains("Insufficient cpu"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(30), "waited {:?}", started.elapsed());
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn a_denied_network_policy_stops_the_run_before_any_job() {
    let cluster = Cluster::new();
    cluster.inject(&["policy-denied"]);
    let (kind, message) = failed_start(&cluster).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("NetworkPolicy") && message.contains("forbidden"), "{message}");
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn an_expired_token_gives_one_clear_error_and_a_refresh_recovers() {
    let cluster = Cluster::new();
    cluster.inject(&["token-expired"]);
    let (kind, message) = failed_start(&cluster).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("token expired") && message.contains("Unauthorized"), "{message}");
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
    cluster.inject(&[]);
    let (host, session) = open(&cluster).await;
    assert_eq!(step(&session, "true", 30_000, &[]).await.result.expect("step").exit_code, 0);
    stop(session).await.expect("stop");
    host.shutdown().await;
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn a_step_that_exits_non_zero_is_a_failure_with_its_code() {
    let cluster = Cluster::new();
    let (host, session) = open(&cluster).await;
    let ran = step(&session, "echo about to fail >&2; exit 3", 30_000, &[]).await;
    assert_eq!(ran.result.expect("a result").exit_code, 3);
    assert_eq!(ran.stderr, "about to fail\n");
    stop(session).await.expect("stop");
    host.shutdown().await;
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn a_step_that_overruns_is_killed_in_the_pod() {
    let cluster = Cluster::new();
    let (host, session) = open(&cluster).await;
    let ran = step(&session, "sleep 300", 1_000, &[]).await;
    let error = ran.result.expect_err("timed out");
    assert_eq!(error.kind(), Some(ErrorKind::Timeout), "{error}");
    let ps = step(&session, "ps -o args | grep -c '^sleep 300' || true", 30_000, &[]).await;
    assert_eq!(ps.stdout.trim(), "0", "the overrun step still runs in the pod");
    stop(session).await.expect("stop");
    host.shutdown().await;
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn a_node_lost_mid_step_is_an_error_naming_it() {
    let cluster = Cluster::new();
    cluster.inject(&["node-lost-after-ready"]);
    let (host, session) = open(&cluster).await;
    let error = step(&session, "echo started; sleep 300", 60_000, &[]).await.result.expect_err("lost");
    assert_eq!(error.kind(), Some(ErrorKind::Infrastructure));
    assert!(error.to_string().contains("the node was lost"), "{error}");
    stop(session).await.expect("stop");
    host.shutdown().await;
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn a_job_deleted_mid_step_is_an_error_naming_it() {
    let cluster = Cluster::new();
    cluster.inject(&["job-deleted-mid-step"]);
    let (host, session) = open(&cluster).await;
    let error = step(&session, "echo started; sleep 300", 60_000, &[]).await.result.expect_err("lost");
    assert_eq!(error.kind(), Some(ErrorKind::Infrastructure));
    assert!(error.to_string().contains("is gone"), "{error}");
    stop(session).await.expect("stop");
    host.shutdown().await;
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn a_dropped_exec_stream_is_never_a_result() {
    let cluster = Cluster::new();
    cluster.inject(&["drop-exec-stream"]);
    let (host, session) = open(&cluster).await;
    let error = step(&session, "echo started; sleep 300; exit 0", 60_000, &[]).await.result.expect_err("lost");
    assert_eq!(error.kind(), Some(ErrorKind::Infrastructure));
    assert!(error.to_string().contains("lost the exec stream"), "{error}");
    let ps = step(&session, "ps -o args | grep -c '^sleep 300' || true", 30_000, &[]).await;
    assert_eq!(ps.stdout.trim(), "0", "the step whose stream was lost still runs");
    stop(session).await.expect("stop");
    host.shutdown().await;
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

/// The executor's binary as a child of this test, initialized for `runner` on `cluster`, sent
/// each of `requests` in turn and answered with a result; returns it and its stdin.
fn spawn_executor(
    cluster: &Cluster,
    runner: &str,
    requests: Vec<serde_json::Value>,
) -> (std::process::Child, std::process::ChildStdin) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_knotless-executor-kubernetes"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("executor");
    let mut input = child.stdin.take().expect("stdin");
    let mut output = BufReader::new(child.stdout.take().expect("stdout"));
    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocol_versions": [1], "runner": {"name": "knotless-run", "version": "0", "id": runner}, "config": cluster.options()}});
    for message in std::iter::once(initialize).chain(requests) {
        writeln!(input, "{message}").expect("write");
        let mut line = String::new();
        // Notifications (log lines) may come before the answer.
        while !line.contains("\"id\"") {
            line.clear();
            assert!(output.read_line(&mut line).expect("answer") > 0, "the executor closed its stdout");
        }
        assert!(line.contains("\"result\""), "{line}");
    }
    (child, input)
}

#[tokio::test]
async fn a_runner_killed_mid_run_leaves_a_job_that_cleanup_removes() {
    let cluster = Cluster::new();
    let runner = Cluster::runner_id();
    let start =
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "start", "params": start_params("left-behind")});
    let (mut child, _input) = spawn_executor(&cluster, &runner, vec![start]);
    child.kill().expect("kill -9");
    child.wait().expect("reaped");
    assert!(cluster.leftovers().iter().any(|object| object.starts_with("Job/")), "{:?}", cluster.leftovers());

    let host = cluster.host(&runner).await;
    let swept = host.cleanup(Duration::from_secs(60)).await.expect("cleanup");
    assert!(swept.removed.iter().any(|r| r.kind == "job" && r.session.as_deref() == Some("left-behind")), "{swept:?}");
    assert!(swept.failures.is_empty(), "{swept:?}");
    host.shutdown().await;
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn a_secret_reaches_only_its_step_and_leaves_no_copy() {
    let cluster = Cluster::new();
    let canary = "canary-7f3a9c1e5b";
    let (host, session) = open(&cluster).await;
    let script = "echo \"len=${#CANARY}\"; (sleep 300 &); sleep 300 &";
    let ran = step(&session, script, 30_000, &[("CANARY", canary)]).await;
    let result = ran.result.expect("a result");
    assert_eq!(ran.stdout, "len=17\n");
    assert!(result.killed_processes >= 2, "killed {}", result.killed_processes);
    let next = step(&session, "echo \"${CANARY-unset}\"; ps -o args | grep -c '^sleep 300' || true", 30_000, &[]).await;
    assert_eq!(next.stdout, "unset\n0\n", "the secret or its step's processes outlived the step");
    let pod_root = cluster.state.join("pods");
    stop(session).await.expect("stop");
    host.shutdown().await;

    for call in cluster.calls() {
        let argv = call["argv"].to_string();
        let env = call["env"].to_string();
        assert!(!argv.contains(canary) && !env.contains(canary), "a call carries the secret: {argv}");
        let exec_payload = call["argv"].as_array().is_some_and(|argv| argv.iter().any(|a| a == "exec"));
        if !exec_payload {
            let stdin = call["stdin"].as_str().unwrap_or("");
            assert!(!stdin.contains(canary), "a manifest carries the secret");
            assert!(!stdin.contains("\"kind\":\"Secret\""), "a Secret object was applied");
        }
    }
    assert_eq!(files_holding(&pod_root, canary), Vec::<std::path::PathBuf>::new());
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

/// A short proof against a real cluster: one Job, two steps, a download, the delete.
/// `KNOTLESS_K8S_LIVE=1 KUBECONFIG=... [KNOTLESS_K8S_NAMESPACE=...] cargo test -- --ignored live`
#[tokio::test]
#[ignore = "needs a cluster: KNOTLESS_K8S_LIVE=1 and KUBECONFIG"]
async fn live_one_job_two_steps_and_delete() {
    if std::env::var("KNOTLESS_K8S_LIVE").as_deref() != Ok("1") {
        return;
    }
    let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG names the cluster");
    let namespace = std::env::var("KNOTLESS_K8S_NAMESPACE").unwrap_or_else(|_| "default".into());
    let options = std::collections::BTreeMap::from([
        ("kubeconfig".to_string(), kubeconfig),
        ("namespace".to_string(), namespace),
        ("image".to_string(), "busybox:1.36".to_string()),
    ]);
    let process = knotless_run::host::ProcessSpec {
        name: "kubernetes".into(),
        path: env!("CARGO_BIN_EXE_knotless-executor-kubernetes").into(),
        pass_env: vec![],
    };
    let runner =
        knotless_protocol::RunnerInfo { name: "knotless-run".into(), version: "0".into(), id: Cluster::runner_id() };
    let config = knotless_run::host::HostConfig::new(process, runner, options);
    let host = knotless_run::host::ExecutorHost::start(config).await.expect("executor");
    let mut params = start_params("live-1");
    params.timeout_ms = 300_000;
    let session = host.open(params, &CancellationToken::new()).await.expect("start");
    assert_eq!(step(&session, "echo one > /outputs/one", 60_000, &[]).await.result.expect("step").exit_code, 0);
    assert_eq!(step(&session, "cat /outputs/one", 60_000, &[]).await.stdout, "one\n");
    stop(session).await.expect("stop");
    let swept = host.cleanup(Duration::from_secs(120)).await.expect("cleanup");
    assert!(swept.failures.is_empty(), "{swept:?}");
    host.shutdown().await;
}

/// Runs a deploy script with the fake kubectl.
fn deploy(script: &str, args: &[&std::path::Path], duration: &str) -> std::process::Output {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(script);
    Command::new("bash")
        .arg(path)
        .args(args)
        .arg("knotless-runner")
        .env("KUBECTL", fake_kubectl())
        .env("DURATION", duration)
        .output()
        .expect("bash")
}

#[tokio::test]
async fn the_scoped_kubeconfig_runs_jobs_and_a_refresh_takes_effect_without_a_restart() {
    let cluster = Cluster::new();
    let scoped = cluster.state.parent().expect("dir").join("scoped/kubeconfig");
    let namespace = std::path::Path::new("knotless-runs");
    let made = deploy("scoped-kubeconfig.sh", &[&cluster.kubeconfig, namespace, &scoped], "24h");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&scoped).expect("written").permissions().mode() & 0o777, 0o600);
    // A day passes: the token's expiry (its last field, in the fake) is in the past.
    let text = std::fs::read_to_string(&scoped).expect("scoped kubeconfig");
    let line = text.lines().find(|line| line.contains("token: fake-token.")).expect("a token").to_string();
    let expired = format!("{}.1", &line[..line.rfind('.').expect("expiry")]);
    std::fs::write(&scoped, text.replace(&line, &expired)).expect("expire the token");
    let mut options = cluster.options();
    options.insert("kubeconfig".into(), scoped.display().to_string());
    let host = cluster.host_with(&Cluster::runner_id(), options).await;
    let error = host.open(start_params("expired"), &CancellationToken::new()).await.err().expect("refused");
    assert!(error.to_string().contains("token expired"), "{error}");
    // The refresh replaces the file; the same executor process uses it for the next Job.
    let refreshed = deploy(
        "refresh-kubeconfig.sh",
        &[std::path::Path::new("--force"), &cluster.kubeconfig, namespace, &scoped],
        "24h",
    );
    assert!(refreshed.status.success(), "{}", String::from_utf8_lossy(&refreshed.stderr));
    let session = host.open(start_params("fresh"), &CancellationToken::new()).await.expect("start with the new token");
    assert_eq!(step(&session, "true", 30_000, &[]).await.result.expect("step").exit_code, 0);
    stop(session).await.expect("stop");
    host.shutdown().await;
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

/// Leftovers that hide in every way an attacker would (see the script).
const HIDE: &str = include_str!("../../../tests/scripts/hide.sh");

/// Which of them live, and which processes hold `./needle`.
const HOLDERS: &str = include_str!("../../../tests/scripts/holders.sh");

#[tokio::test]
async fn no_process_of_a_secret_step_outlives_it_however_it_hides() {
    let cluster = Cluster::new();
    let (host, session) = open(&cluster).await;
    let ran = step(&session, HIDE, 60_000, &[("TOKEN", "hidden-s3cret-k8s")]).await;
    let result = ran.result.expect("a result");
    assert_eq!((result.exit_code, result.killed_processes), (0, 5), "{}", ran.stderr);
    let check = format!("printf '%s%s' 'hidden-' 's3cret-k8s' > needle\n{HOLDERS}");
    let checked = step(&session, &check, 60_000, &[]).await;
    assert_eq!(checked.stdout, "checked\n", "a hidden process or the secret outlived its step: {}", checked.stderr);
    stop(session).await.expect("stop");
    host.shutdown().await;
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn a_timed_out_step_loses_every_process_however_it_hides() {
    let cluster = Cluster::new();
    let (host, session) = open(&cluster).await;
    let ran = step(&session, &format!("{HIDE}\nsleep 600"), 3_000, &[]).await;
    let error = ran.result.expect_err("timed out");
    assert_eq!(error.kind(), Some(ErrorKind::Timeout), "{error}");
    let check = format!("printf no-such-value-91f3 > needle\n{HOLDERS}");
    let checked = step(&session, &check, 60_000, &[]).await;
    assert_eq!(checked.stdout, "checked\n", "a hidden process outlived its step: {}", checked.stderr);
    stop(session).await.expect("stop");
    host.shutdown().await;
}

#[tokio::test]
async fn the_end_of_stdin_deletes_every_job_but_kept_ones() {
    let cluster = Cluster::new();
    let runner = Cluster::runner_id();
    let kept = knotless_protocol::StartParams { keep: true, ..start_params("kept") };
    let starts = vec![
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "start", "params": start_params("gone")}),
        serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "start", "params": kept}),
    ];
    let (mut child, input) = spawn_executor(&cluster, &runner, starts);
    assert_eq!(cluster.leftovers().iter().filter(|object| object.starts_with("Job/")).count(), 2);
    // Its runner died: stdin ends.
    drop(input);
    let status = child.wait().expect("the executor exits");
    assert!(status.success(), "{status:?}");
    let jobs: Vec<String> = cluster.leftovers().into_iter().filter(|object| object.starts_with("Job/")).collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(jobs[0].contains("kept"), "{jobs:?}");
    let host = cluster.host(&runner).await;
    host.cleanup(Duration::from_secs(60)).await.expect("cleanup");
    host.shutdown().await;
    assert_eq!(cluster.leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn an_upload_with_a_device_node_or_a_climbing_path_is_refused() {
    let cluster = Cluster::new();
    let (host, session) = open(&cluster).await;
    for (entry_type, name) in [(tar::EntryType::Block, "disk"), (tar::EntryType::Regular, "../../etc/planted")] {
        let mut builder = tar::Builder::new(Vec::new());
        // A good entry first: a refused upload leaves none of it behind.
        let mut good = tar::Header::new_gnu();
        good.set_size(2);
        good.set_mode(0o644);
        builder.append_data(&mut good, "good", &b"ok"[..]).expect("append");
        let mut header = tar::Header::new_old();
        let field = &mut header.as_old_mut().name;
        field[..name.len()].copy_from_slice(name.as_bytes());
        header.set_entry_type(entry_type);
        header.set_size(0);
        header.set_mode(0o666);
        header.set_cksum();
        builder.append(&header, std::io::empty()).expect("append");
        let archive = builder.into_inner().expect("finish");
        let never = CancellationToken::new();
        let error = session
            .upload("/work/in", archive.as_slice(), 1 << 20, Duration::from_secs(60), &never)
            .await
            .expect_err("refused");
        assert_eq!(error.kind(), Some(ErrorKind::TooLarge), "{error}");
        assert!(error.to_string().contains(&format!("refused tar entry {name:?}")), "{error}");
    }
    let ran = step(&session, "test ! -e /etc/planted && ls -A /work/in && echo clean", 30_000, &[]).await;
    assert_eq!(ran.stdout, "clean\n", "nothing of the refused uploads is left: {}", ran.stderr);
    stop(session).await.expect("stop");
    host.shutdown().await;
}
