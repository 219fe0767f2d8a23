//! Nothing a `kill -9`ed runner leaves outlives it for long: its executor sees stdin end and
//! stops the sessions (their steps and folders), and the next start removes its side-channel
//! folder from the temporary folder once its owner is gone, keeping a live runner's, and the
//! cache layer it was bringing back, keeping a live run's.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use std::time::Duration;

use knotless_tests::{Repo, eventually, fake_executor, knotless_run, process_running, ran, wait_until};

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

/// A child process killed (`kill -9`) and reaped when dropped, whatever the test did.
struct Killed(Child);

impl Killed {
    fn now(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.now();
    }
}

/// The store `run` keeps under the cache folder `home` (its `XDG_CACHE_HOME`).
fn store_of(home: &Path) -> PathBuf {
    home.join("knotless").join("caches")
}

/// The names of the entries of `<store>/.upper` that are folders (one a run bringing a layer
/// back) or, with `owner_files`, the owner files.
fn layers(home: &Path, owner_files: bool) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(store_of(home).join(".upper"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.path().is_dir() != owner_files)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `knotless-run run` of `repo` with `XDG_CACHE_HOME` at `home`: through the fake executor in
/// `mode` when given (its work folder under `work`), else through the shell executor.
fn run_command(repo: &Repo, home: &Path, work: &Path, fake: Option<&Path>) -> std::process::Command {
    let mut args = vec!["run".to_string(), repo.path().display().to_string()];
    match fake {
        Some(fake) => args.extend(["--executor-plugin".to_string(), fake.display().to_string()]),
        None => args.extend(["--executor".to_string(), "shell".to_string()]),
    }
    args.extend(["--executor-option".to_string(), format!("work-dir={}", work.display())]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut command = knotless_run(&args);
    command.env("XDG_CACHE_HOME", home).stdin(Stdio::null());
    command
}

/// Starts a run whose cache save stalls halfway and waits until its layer's folder is there
/// beside `before`; returns the process and the folder's name (its run id).
fn stalled_save(repo: &Repo, home: &Path, work: &Path, fake: &Path, before: &[String]) -> (Killed, String) {
    let child = run_command(repo, home, work, Some(fake)).stdout(Stdio::null()).stderr(Stdio::null()).spawn();
    let child = Killed(child.expect("spawn knotless-run run"));
    let layer =
        eventually("the run's save to start", || layers(home, false).into_iter().find(|layer| !before.contains(layer)));
    (child, layer)
}

#[test]
fn a_killed_runs_cache_layer_is_swept_at_the_next_start_and_a_live_runs_is_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (home, other_home) = (dir.path().join("cache"), dir.path().join("other-cache"));
    let saving = Repo::new();
    saving.workflow(
        "save",
        "cache: [c]\nsteps:\n  - name: fill\n    run: mkdir -p c && head -c 100000 /dev/zero > c/layer\n",
    );
    let quick = Repo::new();
    quick.workflow("quick", "steps:\n  - name: pass\n    run: 'true'\n");
    let stall = fake_executor(dir.path(), "stall-download");
    let (mut live, live_layer) = stalled_save(&saving, &home, &dir.path().join("work-live"), &stall, &[]);
    let before = [live_layer.clone()];
    let (mut killed, killed_layer) = stalled_save(&saving, &home, &dir.path().join("work-killed"), &stall, &before);
    killed.now();
    let mut both = vec![killed_layer.clone(), live_layer.clone()];
    both.sort();
    assert_eq!(layers(&home, false), both, "the killed run left its layer");
    // What a promotion of a runner from before owner files left beside a base.
    let beside_base = store_of(&home).join("repo-0123/save/trusted");
    std::fs::create_dir_all(&beside_base).expect("mkdir");
    std::fs::write(beside_base.join(".tmpAb12Cd"), "half an archive").expect("write");

    // A run with a cache folder of its own sweeps its own store only.
    let other = ran(run_command(&quick, &other_home, &dir.path().join("work-other"), None));
    assert_eq!(other.code, Some(0), "{}", other.both());
    assert!(store_of(&home).join(".upper").join(&killed_layer).is_dir(), "another store was swept\n{}", other.both());

    // A run sharing the store, beside the live run: the killed run's layer goes, the live one's stays.
    let next = ran(run_command(&quick, &home, &dir.path().join("work-next"), None));
    assert_eq!(next.code, Some(0), "{}", next.both());
    assert_eq!(layers(&home, false), vec![live_layer.clone()], "{}", next.both());
    assert_eq!(layers(&home, true), [format!("{live_layer}.owner")], "{}", next.both());
    assert!(!beside_base.join(".tmpAb12Cd").exists(), "{}", next.both());
    assert!(
        next.stderr.contains("removed what dead runs left in the cache store") && next.stderr.contains(&killed_layer),
        "{}",
        next.both()
    );
    assert!(live.0.try_wait().expect("wait").is_none(), "the live run is still saving");

    // Once the live run is killed too, the next start takes its layer.
    live.now();
    let last = ran(run_command(&quick, &home, &dir.path().join("work-last"), None));
    assert_eq!(last.code, Some(0), "{}", last.both());
    assert!(layers(&home, false).is_empty() && layers(&home, true).is_empty(), "{}", last.both());
}
