//! The daemon's bench rows: the same daemon (`--poll 10`, the shell executor) watching 500
//! repositories and watching 50: its CPU time a minute while idle, the time from a `notify`
//! to the run's start, and from SIGTERM to its exit.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::{Row, median, millis, release_bin};

/// How long the idle CPU time is measured.
const IDLE: Duration = Duration::from_secs(30);
/// How many notifications are timed.
const NOTIFIES: usize = 7;

/// One daemon's figures.
struct Figures {
    /// CPU seconds a minute, the daemon and the processes it waited for.
    idle_cpu: f64,
    /// The median time from a `notify` to the run's start.
    notify: Duration,
    /// The time from SIGTERM to the daemon's exit.
    stop: Duration,
}

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new("git")
        .args(["-c", "user.name=bench", "-c", "user.email=bench@localhost"])
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !status.success() {
        bail!("git {args:?} failed in {}", dir.display());
    }
    Ok(())
}

/// `count` bare repositories under `dir` holding one commit and no workflow (copies of one),
/// and a work clone of the first, to push to.
fn repositories(dir: &Path, count: usize) -> anyhow::Result<(Vec<String>, PathBuf)> {
    let seed = dir.join("seed");
    std::fs::create_dir_all(&seed)?;
    git(&seed, &["init", "-q", "-b", "main"])?;
    std::fs::write(seed.join("README"), "bench\n")?;
    git(&seed, &["add", "README"])?;
    git(&seed, &["commit", "-q", "-m", "seed"])?;
    let mut paths = Vec::new();
    for index in 0..count {
        let bare = dir.join(format!("repo-{index:04}.git"));
        git(dir, &["clone", "-q", "--bare", &seed.display().to_string(), &bare.display().to_string()])?;
        paths.push(bare.display().to_string());
    }
    let work = dir.join("work");
    git(dir, &["clone", "-q", &paths[0], &work.display().to_string()])?;
    std::fs::create_dir_all(work.join(".knotless/workflows"))?;
    std::fs::write(work.join(".knotless/workflows/ping.yml"), "steps:\n  - name: ping\n    run: 'true'\n")?;
    Ok((paths, work))
}

/// The CPU seconds of process `pid`, to the nanosecond (the time each of its threads ran,
/// `/proc/PID/task/*/schedstat`), and of the children it waited for (`/proc/PID/stat`, in
/// clock ticks).
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let mut nanos = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let Ok(schedstat) = std::fs::read_to_string(task.path().join("schedstat")) else { continue };
        nanos += schedstat.split(' ').next().and_then(|ran| ran.parse::<u64>().ok()).unwrap_or(0);
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(") ").context("a /proc stat line")?.1;
    let fields: Vec<&str> = after.split(' ').collect();
    // cutime and cstime: fields 16 and 17, here 13 and 14 from the state field.
    let ticks: u64 = fields[13..15].iter().map(|field| field.parse::<u64>().unwrap_or(0)).sum();
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
    Ok(nanos as f64 / 1e9 + ticks as f64 / per_second)
}

/// How many repositories `state.json` remembers.
fn remembered(state: &Path) -> usize {
    std::fs::read(state.join("state.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .and_then(|state| state["repositories"].as_object().map(|repositories| repositories.len()))
        .unwrap_or(0)
}

/// The newest `started_at` of the runs of `commit` under `state`, if one started.
fn started(state: &Path, commit: &str) -> Option<u64> {
    let checks = std::fs::read_dir(state.join("checks")).ok()?;
    for folder in checks.flatten() {
        for entry in std::fs::read_dir(folder.path()).ok()?.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|extension| extension != "json") {
                continue;
            }
            let Ok(record) = serde_json::from_slice::<serde_json::Value>(&std::fs::read(&path).ok()?) else { continue };
            if record["commit"] == commit
                && let Some(at) = record["started_at"].as_u64()
            {
                return Some(at);
            }
        }
    }
    None
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

fn wait_for<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    let started = Instant::now();
    loop {
        if let Some(value) = probe() {
            return Ok(value);
        }
        if started.elapsed() > limit {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One daemon over `count` repositories.
fn measure(dir: &Path, count: usize) -> anyhow::Result<Figures> {
    let (paths, work) = repositories(dir, count)?;
    let state = dir.join("state");
    let runner = release_bin("knotless-run")?;
    let mut command = Command::new(&runner);
    command
        .args(["--executor", "shell", "--poll", "10", "--disk-floor", "0", "--runner-id", "bench-daemon", "--state"])
        .arg(&state)
        .args(&paths)
        .env("KNOTLESS_LOG", "warn")
        .env("XDG_CONFIG_HOME", dir.join("no-config"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut daemon = Daemon(command.spawn().context("start the daemon")?);
    wait_for("the first round", Duration::from_secs(600), || (remembered(&state) == count).then_some(()))?;
    // A few rounds, so that what is measured is the daemon as it idles.
    std::thread::sleep(Duration::from_secs(12));
    let pid = daemon.0.id();
    let before = cpu_seconds(pid)?;
    std::thread::sleep(IDLE);
    let idle_cpu = (cpu_seconds(pid)? - before) * 60.0 / IDLE.as_secs_f64();
    let mut latencies = Vec::new();
    for round in 0..NOTIFIES {
        std::fs::write(work.join("round"), round.to_string())?;
        git(&work, &["add", "-A"])?;
        git(&work, &["commit", "-q", "-m", &format!("round {round}")])?;
        git(&work, &["push", "-q", "origin", "main"])?;
        let commit =
            String::from_utf8(Command::new("git").args(["rev-parse", "HEAD"]).current_dir(&work).output()?.stdout)?;
        let commit = commit.trim().to_string();
        let sent = now_ms();
        let notified = Command::new(&runner).args(["notify", &paths[0], "--state"]).arg(&state).status()?;
        if !notified.success() {
            bail!("notify failed");
        }
        let at = wait_for("the run to start", Duration::from_secs(60), || started(&state, &commit))?;
        latencies.push(Duration::from_millis(at.saturating_sub(sent)));
        // Spread over the round's time, so that some land while a round runs.
        std::thread::sleep(Duration::from_millis(1500));
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM)?;
    let signalled = Instant::now();
    wait_for("the daemon to exit", Duration::from_secs(120), || daemon.0.try_wait().ok().flatten())?;
    let stop = signalled.elapsed();
    Ok(Figures { idle_cpu, notify: median(&mut latencies), stop })
}

/// The rows: 500 repositories against 50.
pub fn daemon(work: &Path) -> anyhow::Result<Vec<Row>> {
    let small = tempfile::tempdir_in(work)?;
    let large = tempfile::tempdir_in(work)?;
    let fifty = measure(small.path(), 50)?;
    let five_hundred = measure(large.path(), 500)?;
    Ok(vec![
        Row {
            what: "daemon idle, `--poll 10`, 500 repositories: CPU seconds a minute, the daemon and its git processes (reference: the same at 50 repositories)".into(),
            ours: format!("{:.3} s", five_hundred.idle_cpu),
            reference: format!("{:.3} s", fifty.idle_cpu),
            ratio: five_hundred.idle_cpu / fifty.idle_cpu.max(0.000_001),
        },
        Row {
            what: format!("daemon, 500 repositories: from `notify` to the run's start, median of {NOTIFIES}, rounds running (reference: the same at 50 repositories)"),
            ours: millis(five_hundred.notify),
            reference: millis(fifty.notify),
            ratio: five_hundred.notify.as_secs_f64() / fifty.notify.as_secs_f64().max(0.001),
        },
        Row {
            what: "daemon, 500 repositories: from SIGTERM to exit, nothing running (bound: 2 s)".into(),
            ours: millis(five_hundred.stop),
            reference: "2000 ms".into(),
            ratio: five_hundred.stop.as_secs_f64() / 2.0,
        },
    ])
}
