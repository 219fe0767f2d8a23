//! A container's pids cgroup, read on the engine's host: how many tasks the container holds
//! (`pids.current`) and how many times its limit refused a new one (the `max` count of
//! `pids.events`). The second is what tells a step that exhausted its pids from one that only
//! ran many processes; neither needs anything started in the container, where no process can
//! start once the limit is reached.
//!
//! Found once a session, from the container's init process (`docker inspect`) and its
//! `/proc/PID/cgroup`: the `pids` controller's path under `/sys/fs/cgroup/pids` (cgroup v1),
//! or the unified path under `/sys/fs/cgroup` (cgroup v2). Only a path that names the
//! container's id is taken: an engine on another host has other processes of that pid, and
//! such a session falls back on `docker stats`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::docker::Docker;

/// How long the `docker inspect` that finds the cgroup may take.
const INSPECT_WITHIN: Duration = Duration::from_secs(5);

/// What a container's pids cgroup says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pids {
    /// The tasks the container holds.
    pub current: u64,
    /// How many times its limit refused a new task since the container started.
    pub refused: u64,
}

/// A container's pids cgroup folder on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidsCgroup {
    dir: PathBuf,
}

impl PidsCgroup {
    /// The pids cgroup of `container`, when the engine runs on this host and its files can be
    /// read; `None` otherwise.
    pub async fn find(docker: &Docker, container: &str) -> Option<PidsCgroup> {
        let args: Vec<String> = ["inspect", "--type", "container", "--format", "{{.Id}} {{.State.Pid}}", container]
            .iter()
            .map(|arg| arg.to_string())
            .collect();
        let stdout = docker.output(&args, INSPECT_WITHIN).await.ok()?;
        let text = String::from_utf8_lossy(&stdout);
        let (id, pid) = text.trim().split_once(' ')?;
        let pid: u32 = pid.parse().ok().filter(|pid| *pid > 0)?;
        let listing = tokio::fs::read_to_string(format!("/proc/{pid}/cgroup")).await.ok()?;
        let cgroup = PidsCgroup { dir: dir_of(&listing, id, Path::new("/sys/fs/cgroup"))? };
        cgroup.read().await.map(|_| cgroup)
    }

    /// Reads the cgroup; `None` when it is gone or unreadable.
    pub async fn read(&self) -> Option<Pids> {
        let current = tokio::fs::read_to_string(self.dir.join("pids.current")).await.ok()?;
        let events = tokio::fs::read_to_string(self.dir.join("pids.events")).await.ok()?;
        Some(Pids { current: current.trim().parse().ok()?, refused: refused(&events)? })
    }
}

/// The folder of the pids cgroup a `/proc/PID/cgroup` listing names, under `root`: the `pids`
/// controller's line of cgroup v1, else the unified line (`0::`) of cgroup v2. `None` unless
/// the path holds the container's `id`.
fn dir_of(listing: &str, id: &str, root: &Path) -> Option<PathBuf> {
    // Each line is `hierarchy:controllers:path`.
    let lines = || listing.lines().filter_map(|line| line.split_once(':').and_then(|(_, rest)| rest.split_once(':')));
    let (v1, path) = match lines().find(|(controllers, _)| controllers.split(',').any(|name| name == "pids")) {
        Some((_, path)) => (true, path),
        None => (false, lines().find(|(controllers, _)| controllers.is_empty())?.1),
    };
    if id.len() < 12 || !path.contains(id) || path.split('/').any(|part| part == "..") {
        return None;
    }
    let base = if v1 { root.join("pids") } else { root.to_path_buf() };
    Some(base.join(path.trim_start_matches('/')))
}

/// The `max` count of a `pids.events` file.
fn refused(events: &str) -> Option<u64> {
    events.lines().find_map(|line| line.strip_prefix("max ")).and_then(|count| count.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "ae13c06609b300b1d5978af9b7f761c5a34894a2d02e35a07a77ab7997559170";

    #[test]
    fn the_cgroup_is_the_pids_controllers_of_v1_or_the_unified_one_of_v2() {
        let root = Path::new("/sys/fs/cgroup");
        let v1 = format!("9:name=systemd:/docker/{ID}\n8:pids:/docker/{ID}\n0::/docker/{ID}\n");
        assert_eq!(dir_of(&v1, ID, root), Some(PathBuf::from(format!("/sys/fs/cgroup/pids/docker/{ID}"))));
        let v2 = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(
            dir_of(&v2, ID, root),
            Some(PathBuf::from(format!("/sys/fs/cgroup/system.slice/docker-{ID}.scope")))
        );
    }

    #[test]
    fn a_cgroup_that_is_not_the_containers_is_never_taken() {
        let root = Path::new("/sys/fs/cgroup");
        // Another process of that pid on this host (the engine runs elsewhere).
        assert_eq!(dir_of("0::/user.slice/user-1000.slice/session-3.scope\n", ID, root), None);
        assert_eq!(dir_of(&format!("0::/x/../{ID}\n"), ID, root), None);
        assert_eq!(dir_of("0::/docker/\n", "", root), None);
        assert_eq!(dir_of("", ID, root), None);
    }

    #[test]
    fn the_refused_count_is_the_max_line() {
        assert_eq!(refused("max 0\n"), Some(0));
        assert_eq!(refused("max 17\n"), Some(17));
        assert_eq!(refused("other 3\nmax 2\n"), Some(2));
        assert_eq!(refused(""), None);
    }
}
