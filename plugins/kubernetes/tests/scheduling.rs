//! The Kubernetes executor's waits against the fake API server: a pod waiting for a node that
//! another run of its runner holds, in a node group at its maximum, waits and runs; a pod no
//! node takes waits `scale-up-timeout` whether that is shorter or longer than `ready-timeout`;
//! a pull the registry refuses for now is pulled again after the kubelet's back-off, and a
//! second refusal is named; a container killed for its memory is named `OOMKilled`. Each test
//! prints the time from the fault to the end it gives.

#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use knotless_protocol::ErrorKind;
use support::*;
use tokio_util::sync::CancellationToken;

/// The fake's controllers at short timings, but for the image back-off (`--pull-backoff`).
const QUICK: &[&str] =
    &["--job-backoff", "200ms", "--grace", "2s", "--scale-up-delay", "500ms", "--node-provision", "500ms"];

/// A start that must fail, with `options` changed: its error kind, message and how long it took.
async fn failed_start_with(cluster: &Cluster, options: &[(&str, &str)]) -> (Option<ErrorKind>, String, Duration) {
    let mut all = cluster.options();
    for (key, value) in options {
        all.insert(key.to_string(), value.to_string());
    }
    let host = cluster.host_with(&Cluster::runner_id(), all).await;
    let started = Instant::now();
    let opened = host.open(start_params("doomed"), &CancellationToken::new()).await;
    let took = started.elapsed();
    let error = opened.err().expect("the start fails");
    host.shutdown().await;
    eprintln!("time to the error: {} ms: {error}", took.as_millis());
    (error.kind(), error.to_string(), took)
}

/// Whether the fake recorded an event with `reason` whose message holds `words`.
fn event_seen(cluster: &Cluster, reason: &str, words: &str) -> bool {
    cluster.objects().iter().any(|object| {
        object["kind"] == "Event"
            && object["reason"] == reason
            && object["message"].as_str().is_some_and(|message| message.contains(words))
    })
}

/// Waits (up to `within`) for `probe` to hold.
async fn until(what: &str, within: Duration, mut probe: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !probe() {
        assert!(Instant::now() < deadline, "{what} did not happen within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A node group of one at its maximum, its node held by a live run of the runner: a second run
/// waits (the autoscaler says `max node group size reached`, the scheduler that the one node
/// fails the anti-affinity) and runs once the first has stopped.
#[tokio::test]
async fn a_run_waiting_for_a_node_its_runner_holds_in_a_full_node_group_runs_when_it_frees() {
    let flags = [QUICK, &["--pull-backoff", "200ms", "--nodes", "0", "--autoscale-max", "1"]].concat();
    let cluster = Cluster::with(&flags);
    let host = cluster.host(&Cluster::runner_id()).await;
    let never = CancellationToken::new();
    let first = host.open(start_params("holder"), &never).await.expect("the first run starts");
    let second = {
        let (host, never) = (host.clone(), never.clone());
        tokio::spawn(async move { host.open(start_params("waiter"), &never).await })
    };
    until("the autoscaler's refusal for the full group", Duration::from_secs(30), || {
        event_seen(&cluster, "NotTriggerScaleUp", "max node group size reached")
    })
    .await;
    if second.is_finished() {
        let ended = second.await.expect("the second start's task").err().map(|error| error.to_string());
        panic!("the second start ended while the group was full: {ended:?}");
    }
    assert_eq!(step(&first, "echo first", 30_000, &[]).await.stdout, "first\n");
    let freed = Instant::now();
    stop(first).await.expect("stop");
    let second = second.await.expect("the second start's task").expect("the second run starts once the node frees");
    let took = freed.elapsed();
    assert_eq!(step(&second, "echo second", 30_000, &[]).await.stdout, "second\n");
    stop(second).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
    println!("from the first run's stop to the second's start: {} ms", took.as_millis());
}

/// No autoscaler, and a pod no node takes: the start ends after `scale-up-timeout`, though the
/// ready timeout is far longer, naming the wait for a node and the scheduler's words.
#[tokio::test]
async fn scale_up_timeout_is_the_wait_for_a_node_even_below_the_ready_timeout() {
    let cluster = Cluster::with(&[QUICK, &["--pull-backoff", "200ms"]].concat());
    let options = [("cpu-request", "16"), ("scale-up-timeout", "3"), ("ready-timeout", "60")];
    let (kind, message, took) = failed_start_with(&cluster, &options).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("found no node within scale-up-timeout (3 s)"), "{message}");
    assert!(message.contains("Insufficient cpu"), "{message}");
    assert!(took >= Duration::from_secs(3) && took < Duration::from_secs(15), "took {took:?}");
    cluster.wait_clean();
    println!("from the pod's first Unschedulable to the error: about {} ms", took.as_millis());
}

/// The registry answers the first pull 429 `toomanyrequests`: the kubelet backs off (2 s here)
/// and pulls again, and the run starts.
#[tokio::test]
async fn a_pull_the_registry_refuses_for_now_is_pulled_again_after_the_back_off() {
    let cluster = Cluster::with(&[QUICK, &["--pull-backoff", "2s"]].concat());
    cluster.inject(&["pull-rate-limited"]);
    let host = cluster.host(&Cluster::runner_id()).await;
    let started = Instant::now();
    let session = host.open(start_params("limited"), &CancellationToken::new()).await.expect("the run starts");
    let took = started.elapsed();
    assert!(event_seen(&cluster, "Failed", "toomanyrequests"), "the first pull was not refused");
    assert!(took >= Duration::from_secs(2), "the start did not wait for the back-off: {took:?}");
    assert_eq!(step(&session, "echo pulled", 30_000, &[]).await.stdout, "pulled\n");
    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
    println!("from the refused pull to the Ready pod: about {} ms", took.as_millis());
}

/// The registry answers every pull 503: the pull after the back-off is refused too, and the
/// start ends then, naming the registry's words.
#[tokio::test]
async fn a_pull_the_registry_refuses_again_after_the_back_off_is_named() {
    let cluster = Cluster::with(&[QUICK, &["--pull-backoff", "2s"]].concat());
    cluster.inject(&["pull-unavailable"]);
    let (kind, message, took) = failed_start_with(&cluster, &[]).await;
    assert_eq!(kind, Some(ErrorKind::Infrastructure));
    assert!(message.contains("503 Service Unavailable") && message.contains("refused again"), "{message}");
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(15), "took {took:?}");
    cluster.wait_clean();
    println!("from the first refused pull to the error: about {} ms", took.as_millis());
}

/// The step passes its container's memory limit (the fake's OOM killer, set off from the step
/// itself): the step has no result, and the error names `OOMKilled` and exit code 137.
#[tokio::test]
async fn a_container_killed_for_its_memory_is_named_oom_killed() {
    let cluster = Cluster::with(&[QUICK, &["--pull-backoff", "200ms"]].concat());
    let host = cluster.host(&Cluster::runner_id()).await;
    let session = host.open(start_params("hungry"), &CancellationToken::new()).await.expect("the run starts");
    let fault = format!(
        "wget -q -O /dev/null --header 'Content-Type: application/json' --post-data '{{\"faults\": [\"oom-kill\"]}}' http://{}/fake/faults; sleep 60",
        cluster.address
    );
    let started = Instant::now();
    let ran = step(&session, &fault, 120_000, &[]).await;
    let took = started.elapsed();
    let error = ran.result.expect_err("the step has no result");
    let message = error.to_string();
    assert!(message.contains("OOMKilled") && message.contains("exit code 137"), "{message}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    let _ = stop(session).await;
    host.shutdown().await;
    cluster.wait_clean();
    println!("from the OOM kill to the step's error: under {} ms: {message}", took.as_millis());
}
