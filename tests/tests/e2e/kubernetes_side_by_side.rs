//! Kubernetes runs side by side on one cluster: ten `knotless-run run`s of one user (one
//! runner id; each with a cache folder of its own, so each sweeps what earlier runs left as it
//! starts), each a step that waits until all ten are in their step and then ends a second
//! after the one before, on the fake API server, whose isolation checker sees every moment: no pod ever runs without a default-deny
//! ingress policy selecting it, no run sweeps another's live Job, and nothing is left after.
//! Then the same on a node group smaller than the runs, as ten `run`s and under the daemon
//! (`--concurrency 10`), every run waiting for a node its runner's other runs free; and two
//! runs of two processes, the second started while the first is in its step.

use std::time::{Duration, Instant};

use knotless_tests::cluster::FakeCluster;
use knotless_tests::{Ran, Repo};

/// The flags that run on the fake cluster with `kubeconfig`.
fn on_the_cluster(kubeconfig: &str) -> Vec<String> {
    ["--executor", "kubernetes", "--kubeconfig", kubeconfig, "--namespace", "knotless-runs", "--image", "busybox"]
        .map(str::to_string)
        .to_vec()
}

/// A repository whose one workflow sleeps `seconds` in its step, saying when it began and
/// ended (seconds since the epoch).
fn sleeper(seconds: u64) -> Repo {
    let repo = Repo::new();
    repo.workflow(
        "ci",
        &format!(
            "steps:\n  - name: wait\n    run: echo \"began $(date +%s)\"; sleep {seconds}; echo \"ended $(date +%s)\"\n"
        ),
    );
    repo.commit("sleep");
    repo
}

/// `knotless-run run` of `repo` on `cluster`, with a cache folder of its own.
fn run_on(cluster: &FakeCluster, repo: &Repo, cache: &std::path::Path) -> std::process::Command {
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let mut args = vec!["run".to_string(), repo.url()];
    args.extend(on_the_cluster(&kubeconfig));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut command = knotless_tests::knotless_run(&args);
    command.env("XDG_CACHE_HOME", cache);
    command
}

/// A repository whose one workflow's step waits for an answer from `barrier` (the fake
/// cluster's pods share the host's network), saying when it began and ended.
fn waiter(barrier: u16) -> Repo {
    let repo = Repo::new();
    repo.workflow(
        "ci",
        &format!(
            "steps:\n  - name: wait\n    run: echo \"began $(date +%s)\"; wget -q -O /dev/null http://127.0.0.1:{barrier}/; echo \"ended $(date +%s)\"\n"
        ),
    );
    repo.commit("wait");
    repo
}

/// A barrier the steps of `count` runs reach by an HTTP request: once all `count` requests
/// are held at once (every run in its step), they are answered a second apart, so the runs
/// end at different times; after `within`, whatever came is answered. The port, and a handle
/// that gives how many were held at once.
fn barrier(count: usize, within: Duration) -> (u16, std::thread::JoinHandle<usize>) {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the barrier");
    let port = listener.local_addr().expect("its address").port();
    listener.set_nonblocking(true).expect("nonblocking");
    let handle = std::thread::spawn(move || {
        let until = Instant::now() + within;
        let mut held = Vec::new();
        while held.len() < count && Instant::now() < until {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    stream.set_nonblocking(false).expect("blocking");
                    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
                    let mut request = [0u8; 1024];
                    let _ = stream.read(&mut request);
                    held.push(stream);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        let reached = held.len();
        for mut stream in held {
            let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok");
            drop(stream);
            std::thread::sleep(Duration::from_millis(if reached == count { 1000 } else { 0 }));
        }
        reached
    });
    (port, handle)
}

/// Runs `count` runs at once, run `i` sleeping 3 + i % 4 seconds; each one's output.
fn at_once(cluster: &FakeCluster, count: u64) -> Vec<Ran> {
    let repos: Vec<Repo> = (0..count).map(|i| sleeper(3 + i % 4)).collect();
    all_of(cluster, &repos)
}

/// Runs each of `repos` at once, each with a cache folder of its own; each one's output.
fn all_of(cluster: &FakeCluster, repos: &[Repo]) -> Vec<Ran> {
    let caches = tempfile::tempdir().expect("tempdir");
    std::thread::scope(|scope| {
        let running: Vec<_> = repos
            .iter()
            .enumerate()
            .map(|(i, repo)| {
                let command = run_on(cluster, repo, &caches.path().join(i.to_string()));
                scope.spawn(move || knotless_tests::ran(command))
            })
            .collect();
        running.into_iter().map(|run| run.join().expect("a run's thread")).collect()
    })
}

/// When a run's step began and ended, from its output.
fn step_times(ran: &Ran) -> Option<(u64, u64)> {
    let when = |word: &str| {
        ran.stdout.lines().find_map(|line| line.split_once(&format!("| {word} "))?.1.trim().parse::<u64>().ok())
    };
    Some((when("began")?, when("ended")?))
}

/// Waits (a minute at most) until the garbage collector has taken every policy and nothing of
/// a run is left; then asserts that the isolation checker saw running pods and no violation.
fn isolated_and_clean(cluster: &FakeCluster, runs: &[Ran]) {
    cluster.wait_clean();
    let report = cluster.isolation();
    let violations = cluster.violations();
    let outputs: Vec<String> = runs.iter().map(Ran::both).collect();
    assert!(violations.is_empty(), "pods ran unprotected:\n{}\n{}", violations.join("\n"), outputs.join("\n"));
    assert!(report["protected_seen"].as_u64().unwrap_or(0) > 0, "the checker never saw a pod run: {report:#}");
}

#[test]
fn ten_runs_of_one_user_at_once_never_run_a_pod_unprotected_nor_sweep_each_other() {
    let cluster = FakeCluster::start(&["--grace", "2s", "--nodes", "10"]);
    let (port, held) = barrier(10, Duration::from_secs(240));
    let repos: Vec<Repo> = (0..10).map(|_| waiter(port)).collect();
    let started = Instant::now();
    let runs = all_of(&cluster, &repos);
    let took = started.elapsed();
    let held = held.join().expect("the barrier");
    let outputs = || runs.iter().map(Ran::both).collect::<Vec<_>>().join("\n");
    // The runs were side by side: all ten were in their step at once, then ended a second apart.
    assert_eq!(held, 10, "not every run was in its step at once:\n{}", outputs());
    for ran in &runs {
        assert_eq!(ran.code, Some(0), "{}", ran.both());
        assert!(!ran.stderr.contains("swept what an earlier run left"), "a run swept another: {}", ran.both());
        assert!(step_times(ran).is_some(), "the step says when it began and ended: {}", ran.both());
    }
    isolated_and_clean(&cluster, &runs);
    println!("10 runs side by side in {took:?}");
}

#[test]
fn runs_beyond_a_full_node_group_never_run_a_pod_unprotected_and_leave_nothing() {
    let cluster = FakeCluster::start(&[
        "--grace",
        "2s",
        "--nodes",
        "0",
        "--autoscale-max",
        "4",
        "--scale-up-delay",
        "500ms",
        "--node-provision",
        "500ms",
        "--scale-down-after",
        "1s",
    ]);
    let runs = at_once(&cluster, 10);
    let succeeded = runs.iter().filter(|ran| ran.code == Some(0)).count();
    // A run that finds the group full, while other runs of its runner hold its nodes, waits for
    // one of them to free.
    let failed: Vec<String> = runs.iter().filter(|ran| ran.code != Some(0)).map(Ran::both).collect();
    assert!(failed.is_empty(), "runs did not wait for a node to free:\n{}", failed.join("\n"));
    isolated_and_clean(&cluster, &runs);
    println!("{succeeded} of {} runs on a group of at most 4 nodes", runs.len());
}

#[test]
fn a_second_run_of_the_user_leaves_the_first_ones_live_job() {
    let cluster = FakeCluster::start(&["--grace", "2s", "--nodes", "2"]);
    let caches = tempfile::tempdir().expect("tempdir");
    let (first, second) = (sleeper(8), sleeper(1));
    let running = run_on(&cluster, &first, &caches.path().join("first"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the first run");
    // The second starts once the first is in its step: its pod runs.
    let until = Instant::now() + Duration::from_secs(60);
    while !cluster.objects().iter().any(|object| object["kind"] == "Pod" && object["status"]["phase"] == "Running") {
        assert!(Instant::now() < until, "the first run's pod never ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    let second = knotless_tests::ran(run_on(&cluster, &second, &caches.path().join("second")));
    assert_eq!(second.code, Some(0), "{}", second.both());
    assert!(
        !second.stderr.contains("swept what an earlier run left"),
        "the second run swept the first's: {}",
        second.both()
    );
    let output = running.wait_with_output().expect("the first run ends");
    let first = Ran {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    assert_eq!(first.code, Some(0), "the first run did not survive the second's start:\n{}", first.both());
    isolated_and_clean(&cluster, &[first, second]);
}

/// The daemon with `--concurrency 10` and ten workflows on a node group of at most five nodes:
/// the runs that find the group full wait for a node another run of the runner holds, and all
/// ten succeed (the required anti-affinity gives each run a node of its own).
#[test]
fn ten_runs_under_the_daemon_on_a_node_group_of_five_all_succeed() {
    let cluster = FakeCluster::start(&[
        "--grace",
        "2s",
        "--nodes",
        "0",
        "--autoscale-max",
        "5",
        "--scale-up-delay",
        "500ms",
        "--node-provision",
        "500ms",
        "--scale-down-after",
        "1s",
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::init(&dir.path().join("repo"));
    for i in 0..10u64 {
        repo.write(
            &format!(".knotless/workflows/w{i}.yml"),
            &format!("steps:\n  - name: wait\n    run: sleep {}; echo done {i}\n", 3 + i % 4),
        );
    }
    let commit = repo.commit("ten workflows");
    let url = repo.url();
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let mut args = on_the_cluster(&kubeconfig);
    args.extend(
        ["--runner-id", "e2e-k8s-ten", "--poll", "3600", "--disk-floor", "0", "--concurrency", "10", url.as_str()]
            .map(str::to_string),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let runner = knotless_tests::Runner::start(&dir.path().join("state"), &args);
    // Ten runs of 3 to 6 s on five nodes take two rounds; under load, some minutes at most.
    let until = Instant::now() + Duration::from_secs(300);
    let checks = loop {
        let checks = runner.checks(&url, Some(&commit));
        if checks.len() == 10 && checks.iter().all(knotless_tests::is_final) {
            break checks;
        }
        assert!(Instant::now() < until, "the ten runs did not end: {checks:#?}\n{}", runner.stderr());
        std::thread::sleep(Duration::from_millis(200));
    };
    let took = started.elapsed();
    let failed: Vec<String> = checks
        .iter()
        .filter(|check| check["status"] != "success")
        .map(|check| format!("{}: {} {}", check["workflow"], check["status"], check["cause"]))
        .collect();
    assert!(failed.is_empty(), "{} of 10 runs did not succeed:\n{}", failed.len(), failed.join("\n"));
    let waited = cluster.objects().iter().any(|object| {
        object["kind"] == "Event"
            && object["reason"] == "NotTriggerScaleUp"
            && object["message"].as_str().is_some_and(|message| message.contains("max node group size reached"))
    });
    assert!(waited, "no run found the node group full: the test did not test the wait");
    cluster.wait_clean();
    println!("10 of 10 runs succeeded on a group of at most 5 nodes in {} ms", took.as_millis());
}
