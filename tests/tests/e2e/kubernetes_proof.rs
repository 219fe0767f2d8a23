//! The seeds' live proof, against the fake API server instead of a tenant cluster: the daemon
//! with the Kubernetes executor runs two pushes of a workflow with a cache (cold, then warm
//! from the first's promoted layer), on a cluster of no nodes whose autoscaler adds one for
//! each run and removes it when idle (its `TriggeredScaleUp` and `ScaleDown` events); the
//! NetworkPolicy is applied, both Jobs are deleted, and nothing runs `kubectl`.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use knotless_tests::Runner;
use knotless_tests::cluster::FakeCluster;

use crate::repo_with;

const WARM: &str = r#"cache: [c]
steps:
  - name: cache
    run: |
      if [ -f c/warm ]; then echo "cache is warm"; else echo "cache is cold"; mkdir -p c; touch c/warm; fi
"#;

/// The nodes the fake cluster has.
/// The flags that run on the fake cluster with `kubeconfig`.
fn on_the_cluster(kubeconfig: &str) -> [&str; 8] {
    ["--executor", "kubernetes", "--kubeconfig", kubeconfig, "--namespace", "knotless-runs", "--image", "busybox"]
}

fn nodes(cluster: &FakeCluster) -> usize {
    cluster.control("GET", "/fake/nodes", None).as_array().map_or(0, Vec::len)
}

#[test]
fn two_runs_cold_then_warm_on_nodes_the_autoscaler_adds_and_removes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = FakeCluster::start(&[
        "--grace",
        "2s",
        "--nodes",
        "0",
        "--autoscale-max",
        "2",
        "--scale-up-delay",
        "1s",
        "--node-provision",
        "1s",
        "--scale-down-after",
        "2s",
    ]);
    let before = nodes(&cluster);
    // Nothing may run kubectl: the one on PATH leaves a mark.
    let trap = dir.path().join("trap");
    std::fs::create_dir(&trap).expect("mkdir");
    let mark = dir.path().join("kubectl-was-run");
    std::fs::write(trap.join("kubectl"), format!("#!/bin/sh\necho \"$@\" >> '{}'\nexit 1\n", mark.display()))
        .expect("the kubectl trap");
    std::fs::set_permissions(trap.join("kubectl"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = format!("{}:{}", trap.display(), std::env::var("PATH").unwrap_or_default());

    let (repo, first) = repo_with(dir.path(), &[("warm", WARM)]);
    let url = repo.url();
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let mut args = on_the_cluster(&kubeconfig).to_vec();
    args.extend(["--runner-id", "e2e-k8s-proof", "--poll", "3600", "--disk-floor", "0", url.as_str()]);
    let runner = Runner::start_with_env(&dir.path().join("state"), &args, &[("PATH", &path)]);

    let cold = runner.final_checks(&url, &first, 1).remove(0);
    assert_eq!(cold["status"], "success", "{cold:#}\n{}", runner.stderr());
    assert_eq!(cold["caches"][0]["warm"], false, "{cold:#}");
    assert!(runner.run_log(cold["run_id"].as_str().expect("id")).contains("cache is cold"));

    repo.write("more.txt", "more");
    let second = repo.commit("more");
    runner.notify(&url);
    let warm = runner.final_checks(&url, &second, 1).remove(0);
    assert_eq!(warm["status"], "success", "{warm:#}\n{}", runner.stderr());
    assert_eq!(warm["caches"][0]["warm"], true, "{warm:#}");
    assert!(runner.run_log(warm["run_id"].as_str().expect("id")).contains("cache is warm"));

    // Both Jobs deleted, the policy applied; then the idle nodes go.
    cluster.wait_clean();
    let requests = cluster.requests();
    let count = |what: &str| requests["by"][what].as_u64().unwrap_or(0);
    assert_eq!(count("create jobs"), 2, "{requests:#}");
    assert!(count("delete jobs") >= 2, "{requests:#}");
    assert!(count("create networkpolicies") >= 1, "{requests:#}");
    let until = Instant::now() + Duration::from_secs(60);
    while nodes(&cluster) > 0 {
        assert!(Instant::now() < until, "the autoscaler kept {} node(s)", nodes(&cluster));
        std::thread::sleep(Duration::from_millis(200));
    }
    // What the autoscaler did, from its events (they outlive the pods and nodes they are about).
    let events = |reason: &str| {
        cluster.objects().iter().filter(|object| object["kind"] == "Event" && object["reason"] == reason).count()
    };
    let (added, removed) = (events("TriggeredScaleUp"), events("ScaleDown"));
    println!("nodes: {before} before, {added} scale-up(s) and {removed} scale-down(s), 0 after idle");
    assert_eq!(before, 0);
    assert!(added >= 1 && removed >= 1, "the autoscaler added {added} and removed {removed} node(s)");
    assert!(!mark.exists(), "kubectl was run: {}", std::fs::read_to_string(&mark).unwrap_or_default());
}

/// `knotless-run run` with the Kubernetes executor and a workflow with a service: a busybox
/// web server in the run's pod, reached from the step by its name, healthy before it; the Job
/// and its pod (the service with it) are gone after the run.
#[test]
fn a_service_runs_in_the_run_pod_and_its_step_reaches_it_by_name() {
    let cluster = FakeCluster::start(&["--grace", "2s"]);
    // The fake's pods share the host's network: a port of this test's own.
    let port = 30_000 + std::process::id() % 20_000;
    let repo = knotless_tests::Repo::new();
    repo.workflow(
        "ci",
        &format!(
            "services:\n  web:\n    image: busybox\n    command: [sh, -c, \"mkdir -p /www && echo hello from $WHO > /www/index.html && exec httpd -f -p {port} -h /www\"]\n    env: {{ WHO: web }}\n    health: wget -q -O /dev/null http://127.0.0.1:{port}/\n    health-timeout: 30s\nsteps:\n  - name: fetch\n    run: wget -q -O - http://web:{port}/\n"
        ),
    );
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let path = repo.path().display().to_string();
    let mut args = vec!["run", path.as_str()];
    args.extend(on_the_cluster(&kubeconfig));
    let ran = knotless_tests::ran(knotless_tests::knotless_run(&args));
    assert_eq!(ran.code, Some(0), "{}", ran.both());
    assert!(ran.stdout.contains("ci/fetch | hello from web"), "{}", ran.both());
    assert!(ran.stdout.contains("and services web"), "{}", ran.both());
    cluster.wait_clean();
}
