//! Every way a run ends on Kubernetes ends within its bound after the cause is known, against
//! the fake API server's models of what a real cluster does: an API server that refuses or is
//! gone (10 s), a watch gap that hid a pod's deletion (10 s), a lost node (the node's grace,
//! plus the toleration, plus 10 s), and the count of NetworkPolicy deletes of a run. Each test
//! prints the time from the fault to the run's end.

#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use knotless_protocol::ErrorKind;
use support::*;
use tokio_util::sync::CancellationToken;

/// Short timings for the fake's controllers, so that a test takes seconds, not minutes.
const FAST: &[&str] =
    &["--pull-backoff", "200ms", "--job-backoff", "200ms", "--grace", "2s", "--scale-up-delay", "500ms"];

/// The bound of an ending once the API refuses or cannot be reached.
const REFUSED_BOUND: Duration = Duration::from_secs(10);

/// The run's Jobs in the fake, by name.
fn jobs(cluster: &Cluster) -> Vec<String> {
    cluster
        .objects()
        .iter()
        .filter(|object| object["kind"] == "Job" && !object["metadata"]["labels"]["dev.knotless.runner"].is_null())
        .filter_map(|object| object["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// The API server refuses the Job's delete (overloaded, failing, behind a load balancer with
/// no backend, or the token expired): `stop` ends within 10 s naming the cause, sends no
/// forced delete, and leaves the labelled Job for the next sweep.
#[tokio::test]
async fn a_stop_whose_job_delete_is_refused_ends_within_10_s_and_leaves_the_job_to_the_sweep() {
    let cluster = Cluster::with(FAST);
    let host = cluster.host(&Cluster::runner_id()).await;
    for (fault, said) in
        [("api-429", "429"), ("api-500", "500"), ("api-503", "503"), ("token-expired", "401 Unauthorized")]
    {
        let session =
            host.open(start_params(&format!("refused-{fault}")), &CancellationToken::new()).await.expect("start");
        assert_eq!(step(&session, "true", 30_000, &[]).await.result.expect("step").exit_code, 0);
        cluster.inject(&[fault]);
        let at_fault = Instant::now();
        let stopped = stop(session).await;
        let took = at_fault.elapsed();
        cluster.inject(&[]);
        println!(
            "{fault}: from the refused delete to the end of stop: {took:.1?} (bound {REFUSED_BOUND:?}): {stopped:?}"
        );
        let error = stopped.expect_err("the delete was refused");
        assert_eq!(error.kind(), Some(ErrorKind::Infrastructure), "{error}");
        assert!(error.to_string().contains(said), "{fault}: {error}");
        assert!(took <= REFUSED_BOUND, "{fault}: stop took {took:?}, over {REFUSED_BOUND:?}: {error}");
        assert_eq!(jobs(&cluster).len(), 1, "{fault}: the Job is left, labelled, for the sweep");
        // The next sweep takes it: the session is no longer in flight.
        host.cleanup(Duration::from_secs(60)).await.expect("cleanup");
        cluster.wait_clean();
    }
    host.shutdown().await;
}

/// The API server is gone (nothing answers at its address): `stop` ends within 10 s naming it.
#[tokio::test]
async fn a_stop_with_the_api_server_gone_ends_within_10_s() {
    let mut cluster = Cluster::with(FAST);
    let host = cluster.host(&Cluster::runner_id()).await;
    let session = host.open(start_params("gone"), &CancellationToken::new()).await.expect("start");
    cluster.kill_server();
    let at_fault = Instant::now();
    let stopped = stop(session).await;
    let took = at_fault.elapsed();
    println!("from the API server's end to the end of stop: {took:.1?} (bound {REFUSED_BOUND:?}): {stopped:?}");
    let error = stopped.expect_err("nothing answers");
    assert!(error.to_string().contains("cannot reach the API server"), "{error}");
    assert!(took <= REFUSED_BOUND, "stop took {took:?}, over {REFUSED_BOUND:?}: {error}");
    host.shutdown().await;
}

/// The pod watch is away while the run's Job and pod are deleted, and its resume gets 410
/// Gone: the watch lists again and sees the pod gone, so `stop` ends at once.
#[tokio::test]
async fn a_pod_deleted_while_the_watch_was_away_is_seen_gone() {
    let cluster = Cluster::with(FAST);
    let host = cluster.host(&Cluster::runner_id()).await;
    let session = host.open(start_params("gap"), &CancellationToken::new()).await.expect("start");
    assert_eq!(step(&session, "true", 30_000, &[]).await.result.expect("step").exit_code, 0);
    let deleted = cluster.watch_gap("knotless-runs");
    assert!(deleted.iter().any(|d| d.starts_with("pods/")), "the gap deleted the pod: {deleted:?}");
    let at_fault = Instant::now();
    let stopped = stop(session).await;
    let took = at_fault.elapsed();
    println!("from the watch gap to the end of stop: {took:.1?} (bound {REFUSED_BOUND:?}): {stopped:?}");
    stopped.expect("stop");
    assert!(took <= REFUSED_BOUND, "stop took {took:?}, over {REFUSED_BOUND:?}");
    host.shutdown().await;
    cluster.wait_clean();
}

/// Watches the server ends early are resumed: the run goes on, and a Job deleted mid-step is
/// still seen from the watch.
#[tokio::test]
async fn watches_the_server_ends_early_are_resumed() {
    let cluster = Cluster::with(FAST);
    let host = cluster.host(&Cluster::runner_id()).await;
    let session = host.open(start_params("ended"), &CancellationToken::new()).await.expect("start");
    for _ in 0..3 {
        cluster.end_watches();
        assert_eq!(step(&session, "true", 30_000, &[]).await.result.expect("step").exit_code, 0);
    }
    cluster.inject(&["job-deleted-mid-step"]);
    let at_fault = Instant::now();
    let error = step(&session, "echo started; sleep 300", 60_000, &[]).await.result.expect_err("lost");
    println!("from the Job's delete to the step's error: {:.1?}: {error}", at_fault.elapsed());
    assert!(error.to_string().contains("is gone") || error.to_string().contains("being deleted"), "{error}");
    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
}

/// On a server that refuses streaming lists (no WatchList feature) the watches list, then
/// watch: a run works, its pod's deletion is seen, and a watch gap is seen through.
#[tokio::test]
async fn watches_list_then_watch_where_the_server_refuses_streaming_lists() {
    let cluster = Cluster::with(&[FAST, &["--watch-list", "false"]].concat());
    let host = cluster.host(&Cluster::runner_id()).await;
    let session = host.open(start_params("listed"), &CancellationToken::new()).await.expect("start");
    assert_eq!(step(&session, "true", 30_000, &[]).await.result.expect("step").exit_code, 0);
    cluster.watch_gap("knotless-runs");
    let at_fault = Instant::now();
    stop(session).await.expect("stop");
    let took = at_fault.elapsed();
    let requests = cluster.requests();
    println!("from the watch gap to the end of stop: {took:.1?} (bound {REFUSED_BOUND:?}); {requests}");
    assert!(took <= REFUSED_BOUND, "stop took {took:?}, over {REFUSED_BOUND:?}");
    assert!(requests["by"]["list pods"].as_u64().unwrap_or(0) >= 2, "listed, then listed again after the gap");
    host.shutdown().await;
    cluster.wait_clean();
}

/// A node lost mid-step: the step fails once the node controller marks the pod not Ready
/// (the node's grace), the outputs download is refused at once naming the pod's state (no exec
/// to a node that cannot answer, which a real API server accepts and fails only after its
/// 30 s dial timeout), and `stop` ends: all within the grace, plus the toleration, plus 10 s.
#[tokio::test]
async fn a_lost_node_ends_the_run_within_its_grace_plus_the_toleration_plus_10_s() {
    let (grace, toleration) = (2, 3);
    let timings = ["--node-monitor-grace", "2s", "--eviction-toleration", "3s"];
    let cluster = Cluster::with(&[FAST, &timings].concat());
    let bound = Duration::from_secs(grace + toleration + 10);
    cluster.inject(&["node-lost-mid-step"]);
    let host = cluster.host(&Cluster::runner_id()).await;
    let session = host.open(start_params("lost"), &CancellationToken::new()).await.expect("start");
    let at_fault = Instant::now();
    let error = step(&session, "echo started; sleep 300", 120_000, &[]).await.result.expect_err("lost");
    println!("the step's error after {:.1?}: {error}", at_fault.elapsed());
    assert_eq!(error.kind(), Some(ErrorKind::Infrastructure), "{error}");
    let outputs = tempfile::tempdir().expect("tempdir");
    let asked = Instant::now();
    let downloaded = session
        .download("/outputs", outputs.path(), 1 << 20, Duration::from_secs(120), &CancellationToken::new())
        .await;
    let download_took = asked.elapsed();
    println!("the outputs download answered after {download_took:.1?}: {downloaded:?}");
    let refused = downloaded.expect_err("no download from a pod on a lost node");
    let message = refused.to_string();
    assert!(!message.contains("exit code None"), "the cause is named: {message}");
    assert!(message.contains("not Ready") || message.contains("node was lost"), "{message}");
    assert!(download_took < Duration::from_secs(2), "the refusal came after {download_took:?}");
    stop(session).await.expect("stop");
    let took = at_fault.elapsed();
    println!("from the lost node to the run's end: {took:.1?} (bound {bound:?})");
    assert!(took <= bound, "the run ended {took:?} after its node was lost, over {bound:?}");
    host.shutdown().await;
    cluster.wait_clean();
}

/// The taint manager's eviction of a pod on a lost node (`DisruptionTarget`, reason
/// `DeletionByTaintManager`) is named as a lost node.
#[tokio::test]
async fn a_pod_the_taint_manager_evicts_is_named_as_on_a_lost_node() {
    let timings = ["--node-monitor-grace", "1s", "--eviction-toleration", "1s"];
    let cluster = Cluster::with(&[FAST, &timings].concat());
    let host = cluster.host(&Cluster::runner_id()).await;
    let session = host.open(start_params("evicted"), &CancellationToken::new()).await.expect("start");
    let node = cluster.control("GET", "/fake/nodes", None)[0]["name"].as_str().expect("a node").to_string();
    cluster.control("POST", &format!("/fake/nodes/{node}/lose"), None);
    // Wait until the taint manager has marked the pod for deletion.
    let until = Instant::now() + Duration::from_secs(60);
    while !cluster.objects().iter().any(|object| {
        object["kind"] == "Pod"
            && object["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["reason"] == "DeletionByTaintManager"))
    }) {
        assert!(Instant::now() < until, "the taint manager never evicted the pod");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let error = step(&session, "true", 30_000, &[]).await.result.expect_err("evicted");
    println!("{error}");
    assert!(
        error.to_string().contains("node was lost") && error.to_string().contains("DeletionByTaintManager"),
        "{error}"
    );
    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
}

/// A run sends only the NetworkPolicy deletes it needs, and none the API answers 404: a run
/// whose pod existed leaves its policy to the garbage collector (the pod owns it), and a start
/// whose Job never made a pod deletes its policy once.
#[tokio::test]
async fn a_run_sends_only_the_network_policy_delete_it_needs() {
    let cluster = Cluster::with(FAST);
    let host = cluster.host(&Cluster::runner_id()).await;
    host.cleanup(Duration::from_secs(60)).await.expect("cleanup");
    let deletes = |cluster: &Cluster| {
        let stats = cluster.requests();
        let sent = stats["by"]["delete networkpolicies"].as_u64().unwrap_or(0);
        let missing = stats["refused"]["delete networkpolicies 404"].as_u64().unwrap_or(0);
        (sent, missing)
    };
    // A run that ran, one whose image does not exist, one whose Job cannot make its pod.
    let session = host.open(start_params("policy-ran"), &CancellationToken::new()).await.expect("start");
    assert_eq!(step(&session, "true", 30_000, &[]).await.result.expect("step").exit_code, 0);
    stop(session).await.expect("stop");
    cluster.wait_clean();
    let ran = deletes(&cluster);
    let mut missing_image = start_params("policy-no-image");
    missing_image.image = Some("registry.invalid/nope:1".into());
    host.open(missing_image, &CancellationToken::new()).await.err().expect("the image does not exist");
    cluster.wait_clean();
    let no_image = deletes(&cluster);
    cluster.inject(&["failed-create"]);
    host.open(start_params("policy-no-pod"), &CancellationToken::new()).await.err().expect("no pod is made");
    cluster.inject(&[]);
    cluster.wait_clean();
    let no_pod = deletes(&cluster);
    host.shutdown().await;
    println!(
        "NetworkPolicy deletes (sent, answered 404), after each run: ran {ran:?}, no image {no_image:?}, no pod \
         {no_pod:?}; {}",
        cluster.requests()
    );
    assert_eq!(ran, (0, 0), "a run whose pod owned its policy deletes none");
    assert_eq!(no_image, (0, 0), "a start whose pod owned its policy deletes none");
    assert_eq!(no_pod, (1, 0), "a start whose Job made no pod deletes its policy once");
}
