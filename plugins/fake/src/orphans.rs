//! What a step leaves behind after its shell exited. The fake is a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`), so every orphan of a step comes back to it, `setsid` or a double
//! fork notwithstanding, instead of to init. After a step given secrets, every such orphan that
//! started after the step's shell, and every descendant of one, is killed; orphans that ended are
//! reaped after every step.
//!
//! A test double's simplification: orphans are told apart by their start time, so a step of
//! another session that runs at the same time may lose its leftovers too.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// The shells of the steps running now: children of the fake that are not orphans.
static SHELLS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn shells() -> MutexGuard<'static, BTreeSet<i32>> {
    SHELLS.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// Makes the fake the subreaper of everything its steps start.
pub fn become_subreaper() {
    if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("fake: cannot become a child subreaper: {error}");
    }
}

/// A step's shell, known as such while this lives.
pub struct Shell {
    pid: i32,
    /// When it started, in clock ticks since boot.
    pub started: u64,
}

impl Drop for Shell {
    fn drop(&mut self) {
        shells().remove(&self.pid);
    }
}

/// Spawns a step's shell with `spawn` and registers it before any sweep can see it.
pub fn spawn_shell<T>(
    spawn: impl FnOnce() -> std::io::Result<(T, Option<u32>)>,
) -> std::io::Result<(T, Option<Shell>)> {
    let mut shells = shells();
    let (child, pid) = spawn()?;
    let shell = pid.and_then(|pid| i32::try_from(pid).ok()).map(|pid| {
        shells.insert(pid);
        let started = process(pid).map_or(0, |process| process.started);
        Shell { pid, started }
    });
    Ok((child, shell))
}

/// A process as `/proc/PID/stat` says.
struct Process {
    pid: i32,
    parent: i32,
    zombie: bool,
    started: u64,
}

fn process(pid: i32) -> Option<Process> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis: state (3), ppid (4), ..., starttime (22).
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Process {
        pid,
        parent: fields.get(1)?.parse().ok()?,
        zombie: *fields.first()? == "Z",
        started: fields.get(19)?.parse().ok()?,
    })
}

fn processes() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries.flatten().filter_map(|entry| entry.file_name().to_string_lossy().parse().ok()).filter_map(process).collect()
}

/// Reaps the orphans that ended, so none stays a zombie of the fake.
pub fn reap() {
    let me = std::process::id() as i32;
    let shells = shells();
    for orphan in processes() {
        if orphan.parent == me && orphan.zombie && !shells.contains(&orphan.pid) {
            let _ = waitpid(Pid::from_raw(orphan.pid), Some(WaitPidFlag::WNOHANG));
        }
    }
}

/// Kills every orphan that started at or after `since` and every descendant of one, again until
/// none is left (a step's processes may fork while they are killed); says how many it killed.
pub fn kill_after(since: u64) -> u32 {
    let me = std::process::id() as i32;
    let mut killed = 0;
    for _ in 0..50 {
        reap();
        let all = processes();
        let shells = shells();
        let mut doomed: Vec<i32> = all
            .iter()
            .filter(|process| {
                process.parent == me && !process.zombie && !shells.contains(&process.pid) && process.started >= since
            })
            .map(|process| process.pid)
            .collect();
        drop(shells);
        let mut next = 0;
        while next < doomed.len() {
            let parent = doomed[next];
            doomed.extend(all.iter().filter(|process| process.parent == parent && !process.zombie).map(|p| p.pid));
            next += 1;
        }
        if doomed.is_empty() {
            return killed;
        }
        for pid in &doomed {
            if kill(Pid::from_raw(*pid), Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    reap();
    killed
}
