//! `state.json`: what the daemon must remember across restarts, written atomically at every
//! change: the last-seen heads of each repository, and the runs in flight (queued or running),
//! so a restart can finish what a dead runner left.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::checks::write_atomic;
use crate::forge::Seen;

/// The state file's name in the state folder.
pub const STATE_FILE: &str = "state.json";

/// A repository's remembered state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepositoryState {
    /// Where it is fetched from.
    pub url: String,
    /// Its heads when last looked at.
    pub seen: Seen,
}

/// A run that is queued or running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    /// The repository's key (its checks' folder).
    pub repository_key: String,
    /// Whether it waits for its turn or runs.
    pub status: InFlightStatus,
}

/// Where a run in flight is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InFlightStatus {
    Queued,
    Running,
}

impl InFlightStatus {
    /// `queued` or `running`, as `state.json` says it.
    pub fn as_str(self) -> &'static str {
        match self {
            InFlightStatus::Queued => "queued",
            InFlightStatus::Running => "running",
        }
    }
}

/// The contents of `state.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// By repository key.
    #[serde(default)]
    pub repositories: BTreeMap<String, RepositoryState>,
    /// By run id.
    #[serde(default)]
    pub in_flight: BTreeMap<String, InFlight>,
    /// The orphan sweep of the last start, for the status page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sweep: Option<Sweep>,
    /// The keys of the repositories watched now, as the last round listed them (absent in a
    /// state written before it was kept): the status page lists these, and keeps the others'
    /// checks reachable by their addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watched: Option<Vec<String>>,
    /// The runs that never started because the runner stopped (a handover, or a runner that
    /// died with runs waiting), each queued again at the next start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requeue: Vec<Dropped>,
}

/// A run the runner stopped before it started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dropped {
    /// The repository's key.
    pub repository_key: String,
    /// The run's id.
    pub run_id: String,
}

/// What an orphan sweep did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sweep {
    /// When it ended (Unix milliseconds).
    pub at: u64,
    /// The resources it removed, as the executor named them (`kind name`).
    pub removed: Vec<String>,
    /// What it could not remove, or why the sweep failed.
    pub failures: Vec<String>,
}

impl Sweep {
    /// The note of a sweep's answer.
    pub fn of<E: std::fmt::Display>(swept: &Result<knotless_protocol::messages::CleanupResult, E>) -> Sweep {
        let at = crate::checks::now_ms();
        match swept {
            Ok(result) => Sweep {
                at,
                removed: result.removed.iter().map(|resource| format!("{} {}", resource.kind, resource.name)).collect(),
                failures: result.failures.clone(),
            },
            Err(error) => Sweep { at, removed: Vec::new(), failures: vec![format!("the sweep failed: {error}")] },
        }
    }
}

/// The lock file a daemon holds in its state folder for its whole life.
pub const LOCK_FILE: &str = "daemon.lock";

/// A daemon's hold on its state folder: an exclusive `flock` on `<state>/daemon.lock`, which
/// the kernel releases when the daemon ends, however it ends. While one daemon holds it no
/// other starts on the folder, so what a daemon finds in flight at its start (checks `queued`
/// or `running`, cache layers, temporary files) was left by one that is gone.
#[derive(Debug)]
pub struct StateLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl StateLock {
    /// Takes the lock of `dir`, or says which daemon holds it.
    pub fn take(dir: &Path) -> anyhow::Result<StateLock> {
        let path = dir.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(StateLock { _lock: lock }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => anyhow::bail!(
                "another knotless-run daemon uses the state folder {} (it holds {}): stop it, or give this one \
                 a --state of its own",
                dir.display(),
                path.display()
            ),
            Err((_, errno)) => {
                Err(std::io::Error::from(errno)).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
    }
}

/// `state.json` and its in-memory copy.
pub struct StateFile {
    path: PathBuf,
    state: Mutex<State>,
    /// Told the state after each change (see [`StateFile::on_change`]).
    changed: std::sync::OnceLock<Box<OnChange>>,
}

/// What is told the state after each change.
type OnChange = dyn Fn(&State) + Send + Sync;

impl StateFile {
    /// Reads `<state>/state.json`, or starts empty when there is none.
    pub fn load(dir: &Path) -> anyhow::Result<StateFile> {
        let path = dir.join(STATE_FILE);
        let state = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| {
                format!("{} is not a runner state file: move it away to start afresh", path.display())
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(error) => return Err(error).with_context(|| format!("cannot read {}", path.display())),
        };
        Ok(StateFile { path, state: Mutex::new(state), changed: std::sync::OnceLock::new() })
    }

    /// Has `hook` told the state after each change, under the state's lock (so in the order of
    /// the changes); it must be quick. Only the first hook given is kept.
    pub fn on_change(&self, hook: impl Fn(&State) + Send + Sync + 'static) {
        let _ = self.changed.set(Box::new(hook));
    }

    /// Changes the state and writes it out.
    pub fn update<T>(&self, change: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|poison| poison.into_inner());
        let result = change(&mut state);
        if let Some(hook) = self.changed.get() {
            hook(&state);
        }
        let written = serde_json::to_vec_pretty(&*state)
            .context("cannot encode the state")
            .and_then(|bytes| write_atomic(&self.path, &bytes));
        if let Err(error) = written {
            tracing::error!("cannot write {}: {error:#}", self.path.display());
        }
        result
    }

    /// What `look` reads of the state, without a copy of the whole.
    pub fn read<T>(&self, look: impl FnOnce(&State) -> T) -> T {
        look(&self.state.lock().unwrap_or_else(|poison| poison.into_inner()))
    }

    /// A copy of the state.
    pub fn snapshot(&self) -> State {
        self.state.lock().unwrap_or_else(|poison| poison.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_daemon_holds_a_state_folder() {
        let dir = tempfile::tempdir().expect("tempdir");
        let held = StateLock::take(dir.path()).expect("the first daemon");
        let refused = StateLock::take(dir.path()).expect_err("a second daemon").to_string();
        assert!(refused.contains("another knotless-run daemon") && refused.contains("--state"), "{refused}");
        drop(held);
        StateLock::take(dir.path()).expect("once the first is gone");
    }

    #[test]
    fn the_state_survives_a_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = StateFile::load(dir.path()).expect("empty");
        file.update(|state| {
            state
                .in_flight
                .insert("run".into(), InFlight { repository_key: "k".into(), status: InFlightStatus::Running })
        });
        let again = StateFile::load(dir.path()).expect("reload");
        assert_eq!(again.snapshot().in_flight["run"].status, InFlightStatus::Running);
        std::fs::write(dir.path().join(STATE_FILE), "nonsense").expect("write");
        let error = StateFile::load(dir.path()).err().expect("refused").to_string();
        assert!(error.contains("state.json"), "{error}");
    }
}
