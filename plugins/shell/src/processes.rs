//! A process's descendants, found through `/proc/<pid>/task/<tid>/children`, and killed
//! (SIGTERM, a grace period, SIGKILL) until none is left.
//!
//! A step's processes are the descendants of its reaper ([`crate::reaper`]), a child
//! subreaper: a process that leaves the step's process group (`setsid`), double-forks, or
//! clears its environment is still a descendant, because its orphans come back to the reaper
//! instead of to init. Only the reaper's own subtree is read, never the whole host's `/proc`.

use std::collections::BTreeSet;
use std::fs;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long processes get between SIGTERM and SIGKILL.
pub const GRACE: Duration = Duration::from_secs(2);

/// How long to go on looking for processes after SIGKILL before giving up.
pub const AFTER_KILL: Duration = Duration::from_secs(2);

/// How often the tree is read again while waiting for processes to end.
const POLL: Duration = Duration::from_millis(20);

/// A bound on how many processes one walk reads: a fork bomb is killed in rounds.
const MAX_WALK: usize = 65_536;

/// One process, named by its pid and its start time (clock ticks after boot), which tell it
/// apart from a later process given the same pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Process {
    /// Its id.
    pub pid: i32,
    /// Its start time, `/proc/<pid>/stat` field 22.
    pub start: u64,
}

/// What `/proc/<pid>/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Whether it has exited and waits to be reaped (states `Z` and `X`).
    pub zombie: bool,
    /// Its start time.
    pub start: u64,
}

/// Reads `/proc/<pid>/stat`; `None` once the process is gone.
pub fn stat(pid: i32) -> Option<Stat> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

fn parse_stat(stat: &str) -> Option<Stat> {
    // The command name may hold spaces and parentheses: the fields start after the last `)`.
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = fields.next()?;
    // Fields 4 to 21 come between the state (3) and the start time (22).
    let start = fields.nth(18)?.parse().ok()?;
    Some(Stat { zombie: state == "Z" || state == "X", start })
}

/// The children of `pid`, over all its threads, zombies included.
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut children = Vec::new();
    for task in tasks.flatten() {
        let Ok(list) = fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        children.extend(list.split_whitespace().filter_map(|pid| pid.parse::<i32>().ok()));
    }
    children
}

/// Every live (not zombie) process among `roots` and their descendants, parents first.
pub fn tree(roots: impl IntoIterator<Item = i32>) -> Vec<Process> {
    let mut found = Vec::new();
    let mut seen = BTreeSet::new();
    let mut queue: std::collections::VecDeque<i32> = roots.into_iter().collect();
    while let Some(pid) = queue.pop_front() {
        if found.len() >= MAX_WALK || !seen.insert(pid) {
            continue;
        }
        let Some(stat) = stat(pid) else {
            continue;
        };
        if !stat.zombie {
            found.push(Process { pid, start: stat.start });
        }
        queue.extend(children(pid));
    }
    found
}

/// What [`kill_all`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Killed {
    /// Every process it signalled.
    pub killed: BTreeSet<Process>,
    /// Those still there when it gave up (a process in uninterruptible sleep).
    pub stuck: BTreeSet<Process>,
}

/// Kills every process `find` returns, reading it again every [`POLL`] until it returns
/// none: SIGTERM once to each process when first seen, SIGKILL to every one still there
/// after `grace`. `reap` runs before each read, to collect children that exited. Processes
/// forked while it works are found by the next read. Gives up [`AFTER_KILL`] after the
/// grace period.
pub fn kill_all(mut find: impl FnMut() -> Vec<Process>, mut reap: impl FnMut(), grace: Duration) -> Killed {
    let started = Instant::now();
    let mut killed = BTreeSet::new();
    loop {
        reap();
        let found = find();
        if found.is_empty() {
            return Killed { killed, stuck: BTreeSet::new() };
        }
        let elapsed = started.elapsed();
        if elapsed >= grace + AFTER_KILL {
            return Killed { killed, stuck: found.into_iter().collect() };
        }
        for process in found {
            // The pid may have been reaped and given to another process since it was read.
            if stat(process.pid).map(|stat| stat.start) != Some(process.start) {
                continue;
            }
            let fresh = killed.insert(process);
            if elapsed >= grace {
                let _ = kill(Pid::from_raw(process.pid), Signal::SIGKILL);
            } else if fresh {
                let _ = kill(Pid::from_raw(process.pid), Signal::SIGTERM);
            }
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_follows_a_name_with_spaces_and_parentheses() {
        let line = "42 (a b) (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some(Stat { zombie: false, start: 987654 }));
        let zombie = "7 (sh) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0";
        assert_eq!(parse_stat(zombie), Some(Stat { zombie: true, start: 55 }));
        assert_eq!(parse_stat("7 (sh) S 1"), None);
    }

    #[test]
    fn a_tree_holds_its_root_and_its_descendants() {
        let mut child =
            std::process::Command::new("/bin/sh").args(["-c", "sleep 30 & sleep 30 & wait"]).spawn().expect("spawn sh");
        let root = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        while tree([root]).len() < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let found = tree([root]);
        assert_eq!(found.len(), 3, "{found:?}");
        assert_eq!(found[0].pid, root);
        let result = kill_all(|| tree([root]), || {}, GRACE);
        let _ = child.wait();
        assert_eq!(result.killed.len(), 3, "{result:?}");
        assert!(result.stuck.is_empty());
    }

    #[test]
    fn this_process_has_no_stat_of_a_zombie() {
        let own = std::process::id() as i32;
        assert!(!stat(own).expect("own stat").zombie);
    }
}
