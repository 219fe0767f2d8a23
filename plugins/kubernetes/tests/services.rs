//! A run's services under the Kubernetes executor, against the fake API server: containers of
//! the run's pod reached from the steps by name (the kubelet-managed `/etc/hosts` the fake
//! writes from `hostAliases`), healthy before the first step, and every way one fails named:
//! a service that ends before it is healthy (with its log), one never healthy within its
//! timeout, an image that does not exist, a service that ends while a step runs. Nothing is
//! left behind by any of them.

#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use knotless_protocol::{ErrorKind, Service};
use support::*;
use tokio_util::sync::CancellationToken;

const FAST: &[&str] = &["--pull-backoff", "200ms", "--grace", "2s"];

/// A port of its own for each test: the fake's pods share the host's network.
fn port(offset: u32) -> u32 {
    20_000 + (std::process::id() % 2_000) * 10 + offset
}

fn service(name: &str, command: &str, health: Option<&str>, timeout_ms: u64) -> Service {
    Service {
        name: name.to_string(),
        image: "busybox".to_string(),
        command: Some(vec!["sh".into(), "-c".into(), command.to_string()]),
        env: BTreeMap::new(),
        health: health.map(str::to_string),
        health_timeout_ms: timeout_ms,
    }
}

/// Starts a session with `services`: the session, or the start's error and how long it took.
async fn start_with(
    cluster: &Cluster,
    services: Vec<Service>,
) -> (
    std::sync::Arc<knotless_testkit::host::ExecutorHost>,
    Result<knotless_testkit::host::Session, (knotless_testkit::host::HostError, Duration)>,
) {
    let host = cluster.host(&Cluster::runner_id()).await;
    let mut params = start_params("with-services");
    params.services = services;
    let started = Instant::now();
    let opened = host.open(params, &CancellationToken::new()).await.map_err(|error| (error, started.elapsed()));
    (host, opened)
}

/// Starts a session with `services`, which must fail, and shuts the host down: the start's
/// error, its message and how long it took.
async fn start_fails(
    cluster: &Cluster,
    services: Vec<Service>,
) -> (knotless_testkit::host::HostError, String, Duration) {
    let (host, opened) = start_with(cluster, services).await;
    let (error, took) = opened.err().expect("the start fails");
    let message = error.to_string();
    eprintln!("{took:?}: {message}");
    host.shutdown().await;
    (error, message, took)
}

#[tokio::test]
async fn a_service_is_reached_by_its_name_and_is_healthy_before_the_first_step() {
    let cluster = Cluster::with(FAST);
    let port = port(1);
    let mut web = service(
        "web",
        &format!(
            "mkdir -p /www && echo hello from $WHO > /www/index.html && sleep 1 && exec httpd -f -p {port} -h /www"
        ),
        Some(&format!("wget -q -O /dev/null http://127.0.0.1:{port}/")),
        30_000,
    );
    web.env.insert("WHO".into(), "web".into());
    let (host, opened) = start_with(&cluster, vec![web]).await;
    let session = opened.map_err(|(error, _)| error).expect("start");
    // The first step finds it serving: no retry, no wait.
    let ran = step(&session, &format!("wget -q -O - http://web:{port}/ && ls /www 2>&1 | head -1"), 30_000, &[]).await;
    assert_eq!(ran.result.expect("a result").exit_code, 0, "{}", ran.stderr);
    assert!(ran.stdout.starts_with("hello from web\n"), "{}", ran.stdout);
    // The service's files are its own: the run's container has no /www.
    assert!(ran.stdout.contains("No such file or directory"), "{}", ran.stdout);
    let objects = serde_json::to_string(&cluster.objects()).expect("json");
    assert!(objects.contains("\"service-web\""), "the pod has no service container");
    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
}

#[tokio::test]
async fn a_service_that_ends_before_it_is_healthy_is_named_with_the_end_of_its_log() {
    let cluster = Cluster::with(FAST);
    let db = service("db", "echo starting; echo \"db: cannot open its data\" >&2; exit 3", Some("false"), 30_000);
    let (error, message, took) = start_fails(&cluster, vec![db]).await;
    assert_eq!(error.kind(), Some(ErrorKind::Infrastructure), "{message}");
    assert!(message.contains("service db ended (Error, exit code 3)"), "{message}");
    assert!(message.contains("its log ends: starting / db: cannot open its data"), "{message}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    cluster.wait_clean();
}

#[tokio::test]
async fn a_service_never_healthy_is_named_with_its_health_command_once_its_timeout_passes() {
    let cluster = Cluster::with(FAST);
    let slow = service("slow", "echo waiting for ever; exec sleep 3600", Some("echo not yet >&2; exit 7"), 1_500);
    let (_, message, took) = start_fails(&cluster, vec![slow]).await;
    assert!(message.contains("service slow did not become healthy within 1500 ms"), "{message}");
    assert!(message.contains("last ended with exit code 7: not yet"), "{message}");
    assert!(message.contains("its log ends: waiting for ever"), "{message}");
    assert!(took >= Duration::from_millis(1_500) && took < Duration::from_secs(30), "{took:?}");
    cluster.wait_clean();
}

#[tokio::test]
async fn a_service_whose_image_does_not_exist_is_named() {
    let cluster = Cluster::with(FAST);
    let mut missing = service("cache", "true", None, 30_000);
    missing.image = "knotless-test/no-such-service:1".into();
    let (_, message, took) = start_fails(&cluster, vec![missing]).await;
    assert!(message.contains("service cache: the image knotless-test/no-such-service:1 does not exist"), "{message}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    cluster.wait_clean();
}

#[tokio::test]
async fn a_service_that_ends_while_a_step_runs_ends_the_step_naming_it() {
    let cluster = Cluster::with(FAST);
    let (host, opened) = start_with(&cluster, vec![service("flaky", "sleep 2; exit 4", None, 30_000)]).await;
    let session = opened.map_err(|(error, _)| error).expect("start");
    let started = Instant::now();
    let ran = step(&session, "sleep 60", 120_000, &[]).await;
    let took = started.elapsed();
    let error = ran.result.expect_err("the step has no result");
    eprintln!("{took:?}: {error}");
    assert_eq!(error.kind(), Some(ErrorKind::Infrastructure), "{error}");
    assert!(error.to_string().contains("service flaky ended (Error, exit code 4)"), "{error}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    let _ = stop(session).await;
    host.shutdown().await;
    cluster.wait_clean();
}

#[tokio::test]
async fn services_with_names_no_container_can_take_are_refused_before_anything_is_made() {
    let cluster = Cluster::with(FAST);
    let mut bad = service("web", "true", None, 30_000);
    bad.env.insert("NOT-A-NAME".into(), "x".into());
    for services in [
        vec![service("Web", "true", None, 30_000)],
        vec![service("web", "true", None, 30_000), service("web", "true", None, 30_000)],
        vec![bad],
    ] {
        let (error, message, _) = start_fails(&cluster, services).await;
        assert_eq!(error.kind(), Some(ErrorKind::Configuration), "{message}");
    }
    let by = cluster.requests()["by"].to_string();
    assert!(!by.contains("jobs"), "a Job was asked for: {by}");
}
