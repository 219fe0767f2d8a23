//! Runs side by side: two `knotless-run run`s of one user, each with its own cache folder (as
//! two CI jobs with their own HOME on one host have), never sweep each other's live session,
//! under the shell executor and under Docker; and what a killed one left is still swept.

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStdout, Stdio};
use std::time::Duration;

use knotless_tests::{Repo, knotless_run, ran, wait_until};

/// The executor of a test: its flags, and how the test lets the waiting step go on.
enum Executor {
    /// The shell executor in `work`; the step waits for a file on the host.
    Shell { work: tempfile::TempDir },
    /// Docker on the test image; the step waits for a file the test makes in its container.
    Docker,
}

impl Executor {
    fn args(&self) -> Vec<String> {
        match self {
            Executor::Shell { work } => {
                vec![
                    "--executor".into(),
                    "shell".into(),
                    "--executor-option".into(),
                    format!("work-dir={}", work.path().display()),
                ]
            }
            Executor::Docker => {
                vec!["--executor".into(), "docker".into(), "--image".into(), "knotless-test/busybox:1".into()]
            }
        }
    }
}

/// `knotless-run run` of `workflow` in `repo` with its own cache folder `cache`.
fn run_command(repo: &Repo, executor: &Executor, workflow: &str, cache: &std::path::Path) -> std::process::Command {
    let mut args = vec!["run".to_string(), repo.path().display().to_string(), "--workflow".into(), workflow.into()];
    args.extend(executor.args());
    let mut command = knotless_run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    command.env("XDG_CACHE_HOME", cache);
    command
}

/// Starts `workflow` and reads its output until its step says `started`.
fn start_waiting(
    repo: &Repo,
    executor: &Executor,
    workflow: &str,
    cache: &std::path::Path,
) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = run_command(repo, executor, workflow, cache)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let started = lines.by_ref().map_while(Result::ok).any(|line| line.contains("| started"));
    assert!(started, "the waiting step never started");
    (child, lines)
}

/// A workflow name no other test's container carries: the Docker engine is shared.
fn unique(name: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{name}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst))
}

/// The containers, running or not, that carry `label` (`KEY=VALUE`).
fn docker_containers_with_label(label: &str) -> Vec<String> {
    let listed = std::process::Command::new("docker")
        .args(["ps", "--all", "--filter", &format!("label={label}"), "--format", "{{.Names}}"])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&listed.stdout).lines().map(str::to_string).collect()
}

/// Two runs of one user with their own cache folders, the second started while the first
/// runs: the second's sweep at start leaves the first's session, and both succeed.
fn two_runs_with_their_own_cache_folders_both_succeed(executor: &Executor) {
    let repo = Repo::new();
    let scratch = tempfile::tempdir().expect("tempdir");
    let proceed = scratch.path().join("proceed");
    let wait = match executor {
        Executor::Shell { .. } => format!("while [ ! -e '{}' ]; do sleep 0.05; done", proceed.display()),
        Executor::Docker => "while [ ! -e /tmp/proceed ]; do sleep 0.05; done".to_string(),
    };
    let long = unique("long");
    repo.workflow(
        &long,
        &format!("steps:\n  - name: wait\n    timeout: 120s\n    run: echo started; {wait}; echo went on\n"),
    );
    repo.workflow("quick", "steps:\n  - name: hi\n    run: echo hi\n");
    let (first_cache, second_cache) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let (mut first, lines) = start_waiting(&repo, executor, &long, first_cache.path());
    let second = ran(run_command(&repo, executor, "quick", second_cache.path()));
    assert_eq!(second.code, Some(0), "{}", second.both());
    assert!(!second.stderr.contains("swept"), "the second run swept something: {}", second.both());
    match executor {
        Executor::Shell { .. } => std::fs::write(&proceed, "").expect("proceed"),
        Executor::Docker => {
            let containers = docker_containers_with_label(&format!("dev.knotless.workflow={long}"));
            let [container] = containers.as_slice() else {
                panic!("the first run's container is not there alone: {containers:?}")
            };
            let touched = std::process::Command::new("docker")
                .args(["exec", container, "touch", "/tmp/proceed"])
                .status()
                .expect("docker exec");
            assert!(touched.success(), "cannot reach the first run's container {container}");
        }
    }
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = first.wait().expect("wait");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut first.stderr.take().expect("stderr"), &mut stderr).expect("stderr");
    assert!(status.success(), "the first run failed beside the second:\n{}\n{stderr}", rest.join("\n"));
    let went_on = format!("{long}/wait | went on");
    assert!(rest.iter().any(|line| line.contains(&went_on)), "{}\n{stderr}", rest.join("\n"));
}

#[test]
fn two_shell_runs_with_their_own_cache_folders_never_sweep_each_others_live_session() {
    let work = tempfile::tempdir().expect("tempdir");
    let executor = Executor::Shell { work };
    two_runs_with_their_own_cache_folders_both_succeed(&executor);
    let Executor::Shell { work } = &executor else { unreachable!() };
    // Nothing is left by either: only the owners' folder of the runner id may stay.
    let left: Vec<_> = crate::sessions_in(work.path());
    assert!(left.is_empty(), "left: {left:?}");
}

#[test]
fn two_docker_runs_with_their_own_cache_folders_never_sweep_each_others_live_container() {
    two_runs_with_their_own_cache_folders_both_succeed(&Executor::Docker);
}

/// A run killed outright (runner and executor, `kill -9`) leaves its container; the next run,
/// whatever its cache folder, sweeps it, since its owner is gone.
#[test]
fn what_a_killed_docker_run_left_is_swept_by_the_next_run_whatever_its_cache_folder() {
    let repo = Repo::new();
    let long = unique("long");
    repo.workflow(&long, "steps:\n  - name: wait\n    run: echo started; sleep 918274\n");
    repo.workflow("quick", "steps:\n  - name: hi\n    run: echo hi\n");
    let (first_cache, second_cache) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let (mut first, _lines) = start_waiting(&repo, &Executor::Docker, &long, first_cache.path());
    let label = format!("dev.knotless.workflow={long}");
    // The children of each of its threads: the executor is started by whichever runs the run.
    let children: Vec<i32> = std::fs::read_dir(format!("/proc/{}/task", first.id()))
        .expect("the runner's threads")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("children")).ok())
        .flat_map(|children| children.split_whitespace().filter_map(|pid| pid.parse::<i32>().ok()).collect::<Vec<_>>())
        .collect();
    assert!(!children.is_empty(), "the runner has no executor child");
    for pid in children.iter().copied().chain([first.id() as i32]) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    first.wait().expect("wait");
    assert_eq!(docker_containers_with_label(&label).len(), 1, "a killed run leaves its container");
    let next = ran(run_command(&repo, &Executor::Docker, "quick", second_cache.path()));
    assert_eq!(next.code, Some(0), "{}", next.both());
    assert!(next.stderr.contains("swept what an earlier run left: container "), "{}", next.both());
    let gone = wait_until(Duration::from_secs(30), || docker_containers_with_label(&label).is_empty());
    assert!(gone, "the killed run's container is still there: {:?}", docker_containers_with_label(&label));
}

/// A fork bomb beside an innocent run under the daemon with `--concurrency 2` (Docker): the
/// bomb's run ends `failure`, its cause its own fault, and the innocent run, which runs all
/// along, succeeds.
#[test]
fn a_fork_bomb_beside_an_innocent_run_under_the_daemon_ends_only_its_own_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bomb, innocent) = (unique("bomb"), unique("innocent"));
    let bomb_yaml = "steps:\n  - name: bomb\n    timeout: 8s\n    run: |\n      b() { while :; do b & done; }; b 2>/dev/null & exec sleep 600\n";
    let innocent_yaml =
        "steps:\n  - name: wait\n    run: |\n      while [ ! -e /tmp/proceed ]; do sleep 0.1; done; echo went on\n";
    let (repo, commit) = crate::repo_with(dir.path(), &[(&bomb, bomb_yaml), (&innocent, innocent_yaml)]);
    let runner_id = unique("e2e-bomb");
    let url = repo.url();
    let args = [
        "--executor",
        "docker",
        "--image",
        "knotless-test/busybox:1",
        "--runner-id",
        &runner_id,
        "--poll",
        "3600",
        "--disk-floor",
        "0",
        "--concurrency",
        "2",
        &url,
    ];
    let runner = knotless_tests::Runner::start(&dir.path().join("state"), &args);
    let bombed = knotless_tests::eventually("the bomb's check to end", || {
        let checks = runner.checks(&url, Some(&commit));
        let bombed = checks.iter().find(|check| check["workflow"] == bomb.as_str())?.clone();
        knotless_tests::is_final(&bombed).then_some(bombed)
    });
    // The innocent run went on all along: its step is still waiting.
    let checks = runner.checks(&url, Some(&commit));
    let waiting = knotless_tests::by_workflow(&checks, &innocent);
    assert_eq!(waiting["status"], "running", "{waiting:#}\n{bombed:#}");
    let containers = docker_containers_with_label(&format!("dev.knotless.workflow={innocent}"));
    let [container] = containers.as_slice() else { panic!("the innocent run's container: {containers:?}") };
    let touched = std::process::Command::new("docker").args(["exec", container, "touch", "/tmp/proceed"]).status();
    assert!(touched.is_ok_and(|status| status.success()), "cannot reach the innocent run's container");
    let checks = runner.final_checks(&url, &commit, 2);
    let innocent_check = knotless_tests::by_workflow(&checks, &innocent);
    assert_eq!(innocent_check["status"], "success", "{innocent_check:#}\n{}", runner.stderr());
    assert_eq!(bombed["status"], "failure", "{bombed:#}");
    let cause = bombed["cause"].as_str().unwrap_or_default();
    assert!(cause.contains("exhausted its pids limit of 1024") && cause.contains("was killed"), "{cause}");
    assert!(!runner.stderr().contains("did not answer"), "{}", runner.stderr());
}
