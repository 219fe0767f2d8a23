//! Finding a session's processes in `/proc` by their marker variable, and killing them
//! (SIGTERM, a grace period, SIGKILL).
//!
//! Every step runs with [`MARKER`]`=<runner-id>/<session>` in its environment; children
//! inherit it, so a process that left the step's process group (with `setsid`) is still
//! found. `/proc/<pid>/environ` is readable for this user's own processes only, which are
//! the only ones a step can start.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// The variable that marks a session's processes.
pub const MARKER: &str = "KNOTLESS_SHELL_SESSION";

/// How long processes get between SIGTERM and SIGKILL.
pub const GRACE: Duration = Duration::from_secs(2);

/// How long to go on looking for processes after SIGKILL before giving up.
const AFTER_KILL: Duration = Duration::from_secs(2);

/// How often `/proc` is read again while waiting for processes to end.
const POLL: Duration = Duration::from_millis(20);

/// One live (not zombie) process, as `/proc` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Its id.
    pub pid: i32,
    /// Its parent.
    pub ppid: i32,
    /// Its process group.
    pub pgid: i32,
    /// The value of [`MARKER`] in its environment, if any.
    pub marker: Option<String>,
}

/// Every live process but this one. Processes that end while being read are skipped.
pub fn scan() -> Vec<ProcessInfo> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let own = std::process::id() as i32;
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != own)
        .filter_map(read_process)
        .collect()
}

fn read_process(pid: i32) -> Option<ProcessInfo> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields start after the last `)`.
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    let ppid = fields.next()?.parse().ok()?;
    let pgid = fields.next()?.parse().ok()?;
    let marker = fs::read(format!("/proc/{pid}/environ")).ok().and_then(|environ| marker_of(&environ));
    Some(ProcessInfo { pid, ppid, pgid, marker })
}

/// The value of [`MARKER`] in the bytes of a `/proc/<pid>/environ`.
fn marker_of(environ: &[u8]) -> Option<String> {
    let prefix = format!("{MARKER}=");
    environ
        .split(|&byte| byte == 0)
        .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .map(|value| String::from_utf8_lossy(value).into_owned())
}

/// The live processes carrying exactly this marker value.
pub fn marked(marker: &str) -> BTreeSet<i32> {
    scan().into_iter().filter(|process| process.marker.as_deref() == Some(marker)).map(|process| process.pid).collect()
}

/// Live processes by pid, as one [`scan`] saw them.
pub type Table = HashMap<i32, ProcessInfo>;

/// Whether a process is one of `ancestors` or a descendant of one, in `table`.
pub fn descends_from(process: &ProcessInfo, table: &Table, ancestors: &BTreeSet<i32>) -> bool {
    let mut current = process;
    // Bounded: a pid table read while processes come and go could hold a cycle.
    for _ in 0..256 {
        if ancestors.contains(&current.pid) {
            return true;
        }
        match table.get(&current.ppid) {
            Some(parent) if parent.pid != current.pid => current = parent,
            _ => return false,
        }
    }
    false
}

/// Kills every process `select` picks (given the whole table), and the process group
/// `group` if given: SIGTERM, then SIGKILL to what is left after `grace`. Processes picked
/// while it waits (children forked in the meantime) are killed too. Returns every process it
/// signalled.
pub async fn terminate(
    select: impl Fn(&ProcessInfo, &Table) -> bool,
    group: Option<i32>,
    grace: Duration,
) -> BTreeSet<i32> {
    let mut signalled = BTreeSet::new();
    let started = Instant::now();
    let mut escalated = false;
    let mut group_signalled = false;
    loop {
        let table: Table = scan().into_iter().map(|process| (process.pid, process)).collect();
        let picked: Vec<i32> = table
            .values()
            .filter(|process| select(process, &table) || Some(process.pgid) == group)
            .map(|process| process.pid)
            .collect();
        if picked.is_empty() {
            break;
        }
        let elapsed = started.elapsed();
        // Scanned before signalling, so that every process killed is counted.
        if let Some(group) = group.filter(|_| !group_signalled) {
            group_signalled = true;
            let _ = killpg(Pid::from_raw(group), Signal::SIGTERM);
        }
        if elapsed >= grace && !escalated {
            escalated = true;
            if let Some(group) = group {
                let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
            }
        }
        for pid in picked {
            let fresh = signalled.insert(pid);
            if escalated {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            } else if fresh {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
        }
        if elapsed >= grace + AFTER_KILL {
            tracing::warn!(processes = ?signalled, "processes survived SIGKILL; giving up on them");
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    signalled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_is_read_from_environ_bytes() {
        let environ = b"PATH=/bin\0KNOTLESS_SHELL_SESSION=r/s\0HOME=/h\0";
        assert_eq!(marker_of(environ), Some("r/s".to_string()));
        assert_eq!(marker_of(b"KNOTLESS_SHELL_SESSIONX=1\0"), None);
        assert_eq!(marker_of(b""), None);
    }

    #[test]
    fn descendants_are_found_through_parents() {
        let process = |pid, ppid| ProcessInfo { pid, ppid, pgid: pid, marker: None };
        let table: Table = [process(10, 1), process(11, 10), process(12, 11), process(20, 1)]
            .into_iter()
            .map(|process| (process.pid, process))
            .collect();
        let ancestors = BTreeSet::from([10]);
        assert!(descends_from(&table[&12], &table, &ancestors));
        assert!(descends_from(&table[&10], &table, &ancestors));
        assert!(!descends_from(&table[&20], &table, &ancestors));
    }

    #[test]
    fn this_process_is_never_listed() {
        let own = std::process::id() as i32;
        assert!(scan().iter().all(|process| process.pid != own));
    }
}
