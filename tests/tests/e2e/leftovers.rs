//! Nothing a `kill -9`ed runner leaves outlives it for long: its executor sees stdin end and
//! stops the sessions (their steps and folders), and the next start removes its side-channel
//! folder from the temporary folder once its owner is gone, keeping a live runner's.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use std::time::Duration;

use knotless_tests::{Repo, knotless_run, process_running, wait_until};

fn channel_folders(tmp: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(tmp)
        .expect("tmp")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("knotless-run-"))
        .collect();
    names.sort();
    names
}

#[test]
fn the_next_start_removes_the_side_channel_folder_of_a_killed_runner() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let work = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new();
    repo.workflow("long", "steps:\n  - name: wait\n    run: echo started; sleep 927361\n");
    let args = [
        "run".to_string(),
        repo.path().display().to_string(),
        "--executor".into(),
        "shell".into(),
        "--executor-option".into(),
        format!("work-dir={}", work.path().display()),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut killed = knotless_run(&args)
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let lines = BufReader::new(killed.stdout.take().expect("stdout")).lines();
    let started = lines.map_while(Result::ok).any(|line| line.contains("long/wait | started"));
    assert!(started, "the step never started");
    killed.kill().expect("kill -9");
    killed.wait().expect("wait");
    // The shell executor, left behind, sees its stdin end: it kills the step and removes the
    // session's folder, without its runner.
    let sessions = || {
        std::fs::read_dir(work.path())
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|runner| std::fs::read_dir(runner.path()).into_iter().flatten().flatten())
            .filter(|entry| entry.file_name() != ".owners")
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(20), || !process_running("sleep 927361") && sessions() == 0),
        "the step or its session folder outlived the killed runner"
    );
    let left = channel_folders(tmp.path());
    assert_eq!(left.len(), 1, "the killed runner left its channel folder: {left:?}");
    // A folder of a live process stays: this test's own pid, and no owner file (as an older
    // runner made them).
    let live = tmp.path().join(format!("knotless-run-{}-live0", std::process::id()));
    std::fs::create_dir(&live).expect("mkdir");
    // A folder whose owner is gone goes, though its pid now names a live process (this test's:
    // the system gave the dead runner's pid to another).
    let reused = tmp.path().join(format!("knotless-run-{}-reused0", std::process::id()));
    std::fs::create_dir(&reused).expect("mkdir");
    let owners = tempfile::tempdir().expect("tempdir");
    let dead = knotless_protocol::owner::Owner::acquire_in(&owners.path().join("owners")).expect("owner");
    std::fs::write(reused.join("owner"), dead.token()).expect("owner file");
    drop(dead);
    repo.workflow("long", "steps:\n  - name: quick\n    run: 'true'\n");
    let next = knotless_run(&args).env("TMPDIR", tmp.path()).stdout(Stdio::null()).stderr(Stdio::null()).status();
    assert_eq!(next.expect("run").code(), Some(0));
    assert_eq!(channel_folders(tmp.path()), [format!("knotless-run-{}-live0", std::process::id())]);
}
