//! The Kubernetes executor against the fake API server (`tests/fake-apiserver`), which speaks
//! the real REST, watch and exec API and models the Job controller, the scheduler, an
//! autoscaler, the kubelet and the node lifecycle: the failure matrix (each cause named, and
//! how soon), the steps' guarantees (exit codes, timeouts, a lost stream, node lost, Job
//! deleted), the canary secret, the sweep of a secret-bearing step's leftovers, the orphan
//! sweep, and the scoped credential.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use knotless_protocol::ErrorKind;
use support::*;
use tokio_util::sync::CancellationToken;

/// Short timings for the fake's controllers, so that a test takes seconds, not minutes.
const FAST: &[&str] = &[
    "--pull-backoff",
    "200ms",
    "--job-backoff",
    "200ms",
    "--grace",
    "2s",
    "--scale-up-delay",
    "500ms",
    "--node-provision",
    "500ms",
];

/// A start that must fail, with `options` changed: its error kind, message and how long it took.
async fn failed_start_with(
    cluster: &Cluster,
    options: &[(&str, &str)],
    image: Option<&str>,
) -> (Option<ErrorKind>, String, Duration) {
    let mut all = cluster.options();
    for (key, value) in options {
        all.insert(key.to_string(), value.to_string());
    }
    let host = cluster.host_with(&Cluster::runner_id(), all).await;
    let mut params = start_params("doomed");
    params.image = image.map(str::to_string);
    let started = Instant::now();
    let opened = host.open(params, &CancellationToken::new()).await;
    let took = started.elapsed();
    let error = opened.err().expect("the start fails");
    host.shutdown().await;
    eprintln!("time to the error: {took:?}: {error}");
    (error.kind(), error.to_string(), took)
}

/// A start that must fail: its error kind, message and how long it took.
async fn failed_start(cluster: &Cluster) -> (Option<ErrorKind>, String, Duration) {
    failed_start_with(cluster, &[], None).await
}

/// Opens a session on a fresh executor.
async fn open(
    cluster: &Cluster,
) -> (std::sync::Arc<knotless_testkit::host::ExecutorHost>, knotless_testkit::host::Session) {
    let host = cluster.host(&Cluster::runner_id()).await;
    let session = host.open(start_params("run-1"), &CancellationToken::new()).await.expect("start");
    (host, session)
}

#[tokio::test]
async fn an_image_that_does_not_exist_is_named_within_15_s() {
    let cluster = Cluster::with(FAST);
    let (kind, message, took) = failed_start_with(&cluster, &[], Some("no-such-image:1")).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("the image no-such-image:1 does not exist"), "{message}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    cluster.wait_clean();
}

#[tokio::test]
async fn a_pull_the_registry_refuses_is_named_in_its_own_words() {
    let cluster = Cluster::with(FAST);
    cluster.inject(&["pull-denied"]);
    let (kind, message, took) = failed_start(&cluster).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("does not say whether it is missing or the pull was denied"), "{message}");
    assert!(
        message.contains("pull access denied, repository does not exist or may require authorization"),
        "{message}"
    );
    assert!(took < Duration::from_secs(15), "took {took:?}");
    cluster.wait_clean();
}

#[tokio::test]
async fn a_malformed_image_reference_is_named_at_once() {
    let cluster = Cluster::with(FAST);
    let (kind, message, took) = failed_start_with(&cluster, &[], Some("Bad Image!!")).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("the image reference \"Bad Image!!\" is not valid"), "{message}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    cluster.wait_clean();
}

#[tokio::test]
async fn a_job_that_cannot_create_its_pod_is_named_from_its_event_within_5_s() {
    let cluster = Cluster::with(FAST);
    cluster.inject(&["failed-create"]);
    let (kind, message, took) = failed_start(&cluster).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("cannot create its pod (FailedCreate)") && message.contains("PodSecurity"), "{message}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    cluster.wait_clean();
}

#[tokio::test]
async fn a_service_account_that_does_not_exist_is_named() {
    let cluster = Cluster::with(FAST);
    let (kind, message, took) = failed_start_with(&cluster, &[("service-account", "no-such-account")], None).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("FailedCreate") && message.contains("no-such-account"), "{message}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    cluster.wait_clean();
}

#[tokio::test]
async fn values_the_api_server_refuses_fail_the_start_naming_the_flag() {
    let cluster = Cluster::with(FAST);
    for (option, value, flag) in [
        ("cpu-request", "2 cores", "--cpu-request"),
        ("memory-request", "lots", "--memory-request"),
        ("node-selector", "bad key=x y", "--node-selector"),
        ("service-account", "No_Such_SA", "--service-account"),
    ] {
        let (kind, message, _) = failed_start_with(&cluster, &[(option, value)], None).await;
        assert_eq!(kind, Some(ErrorKind::Configuration), "{option}={value}: {message}");
        assert!(message.contains(flag) && message.contains("refused"), "{option}={value}: {message}");
    }
    cluster.wait_clean();
}

#[tokio::test]
async fn an_unschedulable_pod_without_an_autoscaler_waits_for_the_scale_up_bound_then_names_why() {
    let cluster = Cluster::with(FAST);
    let options = [("cpu-request", "16"), ("scale-up-timeout", "2"), ("ready-timeout", "1")];
    let (kind, message, took) = failed_start_with(&cluster, &options, None).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("unschedulable") && message.contains("Insufficient cpu"), "{message}");
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(15), "took {took:?}");
    cluster.wait_clean();
}

#[tokio::test]
async fn an_unschedulable_pod_no_node_can_fit_fails_at_not_trigger_scale_up() {
    let cluster = Cluster::with(&[FAST, &["--autoscale-max", "3"]].concat());
    let (kind, message, took) = failed_start_with(&cluster, &[("cpu-request", "16")], None).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("no node will be added") && message.contains("didn't trigger scale-up"), "{message}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    cluster.wait_clean();
}

/// The nodes of the fake cluster now.
fn nodes(cluster: &Cluster) -> usize {
    cluster.control("GET", "/fake/nodes", None).as_array().map_or(0, Vec::len)
}

/// Waits (up to 30 s) for the autoscaler to remove every node.
async fn nodes_go_back_to_zero(cluster: &Cluster) {
    let until = Instant::now() + Duration::from_secs(30);
    while nodes(cluster) > 0 {
        assert!(Instant::now() < until, "the autoscaler kept {} nodes", nodes(cluster));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn concurrent_runs_wait_for_the_autoscaler_and_the_nodes_go_back_to_zero() {
    let flags = [FAST, &["--nodes", "0", "--autoscale-max", "3", "--scale-down-after", "1s"]].concat();
    let cluster = Cluster::with(&flags);
    let before = nodes(&cluster);
    let host = cluster.host(&Cluster::runner_id()).await;
    let never = CancellationToken::new();
    let (one, two) =
        tokio::join!(host.open(start_params("scale-1"), &never), host.open(start_params("scale-2"), &never));
    let (one, two) = (one.expect("the first run starts"), two.expect("the second run starts"));
    let during = nodes(&cluster);
    assert_eq!(step(&one, "echo one", 30_000, &[]).await.stdout, "one\n");
    assert_eq!(step(&two, "echo two", 30_000, &[]).await.stdout, "two\n");
    stop(one).await.expect("stop");
    stop(two).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
    nodes_go_back_to_zero(&cluster).await;
    println!("nodes: {before} before, {during} with the two runs, 0 after idle");
    assert_eq!((before, during), (0, 2), "the required anti-affinity puts each run on its own node");
}

/// However soon the autoscaler removes an empty node, it never removes the node it added for a
/// pending pod before the scheduler places that pod (upstream's DisableScaleDownForLoop while a
/// pending pod fits a node): the run starts, and the node goes once the run ended.
#[tokio::test]
async fn a_node_added_for_a_pending_pod_outlives_its_emptiness_until_the_pod_is_placed() {
    let flags = [FAST, &["--nodes", "0", "--autoscale-max", "1", "--scale-down-after", "0s"]].concat();
    let cluster = Cluster::with(&flags);
    let host = cluster.host(&Cluster::runner_id()).await;
    let session = host.open(start_params("eager"), &CancellationToken::new()).await.expect("the run starts");
    assert_eq!(step(&session, "echo placed", 30_000, &[]).await.stdout, "placed\n");
    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
    nodes_go_back_to_zero(&cluster).await;
}

/// A run of N steps takes at most N + 6 API requests, counted by the fake API server (a watch
/// once): the policy, the Job, the watches, one exec a step, the delete.
#[tokio::test]
async fn a_run_of_n_steps_takes_at_most_n_plus_6_api_requests() {
    let cluster = Cluster::with(FAST);
    let host = cluster.host(&Cluster::runner_id()).await;
    let count = |cluster: &Cluster| cluster.requests()["requests"].as_u64().expect("a request count");
    for steps in [1u64, 10] {
        let before = count(&cluster);
        let session =
            host.open(start_params(&format!("count-{steps}")), &CancellationToken::new()).await.expect("start");
        for _ in 0..steps {
            assert_eq!(step(&session, "true", 30_000, &[]).await.result.expect("step").exit_code, 0);
        }
        stop(session).await.expect("stop");
        let used = count(&cluster) - before;
        println!(
            "a run of {steps} step(s): {used} API requests (bound {}); so far: {}",
            steps + 6,
            cluster.requests()["by"]
        );
        assert!(used <= steps + 6, "{used} requests for {steps} step(s): {:#}", cluster.requests());
        assert!(used > steps, "each step is an exec: {used} requests for {steps} step(s)");
    }
    host.shutdown().await;
    cluster.wait_clean();
}

#[tokio::test]
async fn a_forbidden_network_policy_stops_the_run_before_any_job() {
    let cluster = Cluster::with(FAST);
    cluster.inject(&["policy-forbidden"]);
    let (kind, message, _) = failed_start(&cluster).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("NetworkPolicy") && message.contains("forbidden"), "{message}");
    assert!(message.contains("scoped-kubeconfig"), "{message}");
    cluster.wait_clean();
}

#[tokio::test]
async fn an_expired_token_gives_one_clear_error_and_a_refreshed_kubeconfig_is_used_at_once() {
    let cluster = Cluster::with(FAST);
    let host = cluster.host(&Cluster::runner_id()).await;
    let never = CancellationToken::new();
    cluster.inject(&["token-expired"]);
    let error = host.open(start_params("expired"), &never).await.err().expect("refused");
    assert_eq!(error.kind(), Some(ErrorKind::Infrastructure));
    let message = error.to_string();
    assert!(message.contains("401 Unauthorized") && message.contains("expired or was revoked"), "{message}");
    assert!(message.contains("refresh") && message.contains(&cluster.kubeconfig.display().to_string()), "{message}");
    // The refresh writes a new token into the kubeconfig; the same executor uses it next.
    cluster.inject(&[]);
    let text = std::fs::read_to_string(&cluster.kubeconfig).expect("kubeconfig");
    let old = text.lines().find_map(|line| line.trim().strip_prefix("token: ")).expect("a token").to_string();
    cluster.control("POST", "/fake/tokens", Some(serde_json::json!({"token": "fresh-token-1", "expires_in_s": 3600})));
    cluster.control("POST", "/fake/tokens/revoke", Some(serde_json::json!({"token": old})));
    let fresh = cluster.dir.path().join("kubeconfig.new");
    std::fs::write(&fresh, text.replace(&old, "fresh-token-1")).expect("write");
    std::fs::rename(&fresh, &cluster.kubeconfig).expect("replace the kubeconfig");
    let session = host.open(start_params("fresh"), &never).await.expect("the new token is used");
    assert_eq!(step(&session, "true", 30_000, &[]).await.result.expect("step").exit_code, 0);
    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
}

#[tokio::test]
async fn an_api_server_that_is_gone_is_named_by_its_url() {
    let mut cluster = Cluster::with(FAST);
    let host = cluster.host(&Cluster::runner_id()).await;
    cluster.kill_server();
    let error = host.open(start_params("unreachable"), &CancellationToken::new()).await.err().expect("refused");
    let message = error.to_string();
    assert_eq!(error.kind(), Some(ErrorKind::Infrastructure), "{message}");
    assert!(message.contains(&format!("cannot reach the API server http://{}", cluster.address)), "{message}");
    host.shutdown().await;
}

#[tokio::test]
async fn a_step_that_exits_non_zero_is_a_failure_with_its_code() {
    let cluster = Cluster::with(FAST);
    let (host, session) = open(&cluster).await;
    let ran = step(&session, "echo about to fail >&2; exit 3", 30_000, &[]).await;
    assert_eq!(ran.result.expect("a result").exit_code, 3);
    assert_eq!(ran.stderr, "about to fail\n");
    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
}

#[tokio::test]
async fn a_step_that_overruns_is_killed_in_the_pod() {
    let cluster = Cluster::with(FAST);
    let (host, session) = open(&cluster).await;
    let ran = step(&session, "sleep 300", 1_000, &[]).await;
    let error = ran.result.expect_err("timed out");
    assert_eq!(error.kind(), Some(ErrorKind::Timeout), "{error}");
    let ps = step(&session, "ps -o args | grep -c '^sleep 300' || true", 30_000, &[]).await;
    assert_eq!(ps.stdout.trim(), "0", "the overrun step still runs in the pod");
    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
}

#[tokio::test]
async fn a_node_lost_mid_step_is_named_from_the_watch_though_the_stream_hangs() {
    let cluster = Cluster::with(&[FAST, &["--node-monitor-grace", "2s", "--eviction-toleration", "3s"]].concat());
    cluster.inject(&["node-lost-mid-step"]);
    let (host, session) = open(&cluster).await;
    let started = Instant::now();
    let error = step(&session, "echo started; sleep 300", 120_000, &[]).await.result.expect_err("lost");
    let took = started.elapsed();
    eprintln!("time to the error: {took:?}: {error}");
    assert_eq!(error.kind(), Some(ErrorKind::Infrastructure));
    assert!(
        error.to_string().contains("is not Ready any more") || error.to_string().contains("node was lost"),
        "{error}"
    );
    assert!(took < Duration::from_secs(60), "took {took:?}");
    // The pod stays terminating on a lost node: stop deletes it with no grace.
    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
}

#[tokio::test]
async fn a_job_deleted_mid_step_is_an_error_naming_it() {
    let cluster = Cluster::with(FAST);
    cluster.inject(&["job-deleted-mid-step"]);
    let (host, session) = open(&cluster).await;
    let error = step(&session, "echo started; sleep 300", 60_000, &[]).await.result.expect_err("lost");
    assert_eq!(error.kind(), Some(ErrorKind::Infrastructure));
    let message = error.to_string();
    assert!(message.contains("is gone") || message.contains("being deleted"), "{message}");
    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
}

#[tokio::test]
async fn a_dropped_exec_stream_is_never_a_result() {
    let cluster = Cluster::with(FAST);
    cluster.inject(&["drop-exec-stream"]);
    let (host, session) = open(&cluster).await;
    let error = step(&session, "echo started; sleep 300; exit 0", 60_000, &[]).await.result.expect_err("lost");
    assert_eq!(error.kind(), Some(ErrorKind::Infrastructure));
    assert!(error.to_string().contains("lost the exec stream"), "{error}");
    let ps = step(&session, "ps -o args | grep -c '^sleep 300' || true", 30_000, &[]).await;
    assert_eq!(ps.stdout.trim(), "0", "the step whose stream was lost still runs");
    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
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
    let cluster = Cluster::with(FAST);
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
    cluster.wait_clean();
}

/// Two executor processes of one runner id, as two `knotless-run run`s of one user: the
/// second's sweep at its start leaves the first's live run (its Job, pod and policy), which
/// goes on, and the pod never runs unprotected.
#[tokio::test]
async fn a_sweep_by_another_process_of_the_runner_leaves_a_live_run() {
    let cluster = Cluster::with(FAST);
    let runner = Cluster::runner_id();
    let first = cluster.host(&runner).await;
    let session = first.open(start_params("first-live"), &CancellationToken::new()).await.expect("start");
    let second = cluster.host(&runner).await;
    let swept = second.cleanup(Duration::from_secs(60)).await.expect("cleanup");
    assert!(swept.removed.is_empty() && swept.failures.is_empty(), "the second process swept the first's: {swept:?}");
    let ran = step(&session, "echo still here", 30_000, &[]).await;
    assert_eq!(ran.stdout, "still here\n", "the first run did not survive: {}", ran.stderr);
    stop(session).await.expect("stop");
    first.shutdown().await;
    second.shutdown().await;
    cluster.wait_clean();
    assert_eq!(cluster.violations(), Vec::<String>::new(), "the pod ran unprotected");
}

#[tokio::test]
async fn a_secret_reaches_only_its_step_and_leaves_no_copy() {
    let cluster = Cluster::with(FAST);
    let canary = "canary-7f3a9c1e5b";
    let (host, session) = open(&cluster).await;
    let script = "echo \"len=${#CANARY}\"; (sleep 300 &); sleep 300 &";
    let ran = step(&session, script, 30_000, &[("CANARY", canary)]).await;
    let result = ran.result.expect("a result");
    assert_eq!(ran.stdout, "len=17\n");
    assert!(result.killed_processes >= 2, "killed {}", result.killed_processes);
    let next = step(&session, "echo \"${CANARY-unset}\"; ps -o args | grep -c '^sleep 300' || true", 30_000, &[]).await;
    assert_eq!(next.stdout, "unset\n0\n", "the secret or its step's processes outlived the step");
    let pod_root = cluster.state().join("pods");
    stop(session).await.expect("stop");
    host.shutdown().await;

    let objects = serde_json::to_string(&cluster.objects()).expect("json");
    assert!(!objects.contains(canary), "an object carries the secret");
    assert!(!objects.contains("\"kind\":\"Secret\""), "a Secret object was made");
    let by = cluster.requests()["by"].to_string();
    assert!(!by.contains("secrets"), "the executor asked for secrets: {by}");
    assert_eq!(files_holding(&pod_root, canary), Vec::<std::path::PathBuf>::new());
    cluster.wait_clean();
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
    let process = knotless_testkit::host::ProcessSpec {
        name: "kubernetes".into(),
        path: env!("CARGO_BIN_EXE_knotless-executor-kubernetes").into(),
        pass_env: vec![],
    };
    let runner =
        knotless_protocol::RunnerInfo { name: "knotless-run".into(), version: "0".into(), id: Cluster::runner_id() };
    let config = knotless_testkit::host::HostConfig::new(process, runner, options);
    let host = knotless_testkit::host::ExecutorHost::start(config).await.expect("executor");
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

/// Leftovers that hide in every way an attacker would (see the script).
const HIDE: &str = include_str!("../../../tests/scripts/hide.sh");

/// Which of them live, and which processes hold `./needle`.
const HOLDERS: &str = include_str!("../../../tests/scripts/holders.sh");

#[tokio::test]
async fn no_process_of_a_secret_step_outlives_it_however_it_hides() {
    let cluster = Cluster::with(FAST);
    let (host, session) = open(&cluster).await;
    let ran = step(&session, HIDE, 60_000, &[("TOKEN", "hidden-s3cret-k8s")]).await;
    let result = ran.result.expect("a result");
    assert_eq!((result.exit_code, result.killed_processes), (0, 5), "{}", ran.stderr);
    let check = format!("printf '%s%s' 'hidden-' 's3cret-k8s' > needle\n{HOLDERS}");
    let checked = step(&session, &check, 60_000, &[]).await;
    assert_eq!(checked.stdout, "checked\n", "a hidden process or the secret outlived its step: {}", checked.stderr);
    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
}

#[tokio::test]
async fn a_timed_out_step_loses_every_process_however_it_hides() {
    let cluster = Cluster::with(FAST);
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
async fn the_end_of_stdin_and_sweeps_delete_every_job_but_kept_ones() {
    // Two sessions of one runner need two nodes: the required anti-affinity.
    let cluster = Cluster::with(&[FAST, &["--nodes", "2"]].concat());
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
    // A Job deleted in the foreground goes once its pod has.
    let until = Instant::now() + Duration::from_secs(30);
    let jobs = loop {
        let jobs: Vec<String> = cluster.leftovers().into_iter().filter(|object| object.starts_with("Job/")).collect();
        if jobs.len() <= 1 || Instant::now() > until {
            break jobs;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(jobs[0].contains("kept"), "{jobs:?}");
    let host = cluster.host(&runner).await;
    // A sweep leaves the kept Job; one with `remove_kept` takes it.
    let swept = host.cleanup(Duration::from_secs(60)).await.expect("cleanup");
    assert!(swept.removed.is_empty(), "{swept:?}");
    assert_eq!(cluster.leftovers().iter().filter(|object| object.starts_with("Job/")).count(), 1);
    let params = knotless_protocol::CleanupParams { keep: Vec::new(), remove_kept: true, timeout_ms: 60_000 };
    let never = tokio_util::sync::CancellationToken::new();
    let swept = host.call::<knotless_protocol::rpc::Cleanup>(&params, Duration::from_secs(60), &never).await;
    let swept = swept.expect("cleanup with remove_kept");
    assert!(swept.removed.iter().any(|resource| resource.kind == "job" && resource.name.contains("kept")), "{swept:?}");
    host.shutdown().await;
    cluster.wait_clean();
}

/// An upload whose exec stream drops without its Status, after `tar x` said it ended, is
/// whole: the unpack's own exit code stands in for the Status.
#[tokio::test]
async fn an_upload_whose_stream_drops_after_the_unpack_ended_is_whole() {
    let cluster = Cluster::with(FAST);
    let (host, session) = open(&cluster).await;
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(2);
    header.set_mode(0o644);
    builder.append_data(&mut header, "good", &b"ok"[..]).expect("append");
    let archive = builder.into_inner().expect("finish");
    // The next exec, the unpack, loses its Status: its output (its exit code) comes whole,
    // then the connection breaks.
    cluster.inject(&["drop-exec-status"]);
    let never = CancellationToken::new();
    session.upload("/work/in", archive.as_slice(), 1 << 20, Duration::from_secs(60), &never).await.expect("upload");
    let ran = step(&session, "cat /work/in/good", 30_000, &[]).await;
    assert_eq!(ran.stdout, "ok", "{}", ran.stderr);
    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
}

#[tokio::test]
async fn an_upload_with_a_device_node_or_a_climbing_path_is_refused() {
    let cluster = Cluster::with(FAST);
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

/// The resources of the run's container in the pod the fake made, as the API server stored it.
fn run_container_resources(cluster: &Cluster) -> serde_json::Value {
    let pod = cluster.objects().into_iter().find(|object| object["kind"] == "Pod").expect("the run's pod");
    let containers = pod["spec"]["containers"].as_array().cloned().unwrap_or_default();
    containers.first().map(|container| container["resources"].clone()).expect("a container")
}

#[tokio::test]
async fn every_pod_has_requests_and_a_memory_limit_and_a_workflow_asks_within_the_most() {
    let cluster = Cluster::with(FAST);
    let (host, session) = open(&cluster).await;
    let resources = run_container_resources(&cluster);
    assert_eq!(resources["requests"], serde_json::json!({"cpu": "250m", "memory": "512Mi"}), "{resources}");
    assert_eq!(resources["limits"], serde_json::json!({"memory": "8Gi"}), "{resources}");
    stop(session).await.expect("stop");
    cluster.wait_clean();
    // A workflow's memory is its request and its limit.
    let mut params = start_params("asks");
    params.resources.memory = Some("1Gi".into());
    params.resources.cpu = Some("500m".into());
    let session = host.open(params, &CancellationToken::new()).await.expect("start");
    let resources = run_container_resources(&cluster);
    assert_eq!(resources["requests"], serde_json::json!({"cpu": "500m", "memory": "1Gi"}), "{resources}");
    assert_eq!(resources["limits"], serde_json::json!({"memory": "1Gi"}), "{resources}");
    stop(session).await.expect("stop");
    cluster.wait_clean();
    // More than the operator's most fails the start naming the option, and makes nothing.
    let mut params = start_params("greedy");
    params.resources.memory = Some("17Gi".into());
    let error = host.open(params, &CancellationToken::new()).await.err().expect("refused");
    assert_eq!(error.kind(), Some(ErrorKind::Configuration), "{error}");
    assert!(error.to_string().contains("--executor-option memory-max"), "{error}");
    host.shutdown().await;
    cluster.wait_clean();
}
