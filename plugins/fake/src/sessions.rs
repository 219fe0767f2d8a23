//! Sessions: their folders under the work dir, `start`, `stop`, `cleanup`, the paths
//! transfers may touch, and the ledger file of live sessions that tests read.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use knotless_protocol::error::code;
use knotless_protocol::messages::*;

use crate::wire::Fault;

/// The live sessions of one runner.
pub struct Sessions {
    /// `<work-dir>/<runner id>`: every folder under it belongs to this runner.
    root: PathBuf,
    /// The ledger file, when the `ledger` config key names one.
    ledger: Option<PathBuf>,
    live: Mutex<BTreeMap<String, PathBuf>>,
}

impl Sessions {
    /// Sessions under `work_dir` for the runner `runner_id`.
    pub fn new(work_dir: &Path, runner_id: &str, ledger: Option<PathBuf>) -> Result<Sessions, Fault> {
        if !is_plain_name(runner_id) {
            return Err(Fault::configuration(format!("runner id {runner_id:?} cannot name a folder")));
        }
        let work_dir = std::path::absolute(work_dir)
            .map_err(|error| Fault::configuration(format!("work-dir {}: {error}", work_dir.display())))?;
        let sessions = Sessions { root: work_dir.join(runner_id), ledger, live: Mutex::new(BTreeMap::new()) };
        sessions.write_ledger(&BTreeMap::new());
        Ok(sessions)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PathBuf>> {
        self.live.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Creates a session's folders. With `again`, a session already started is started again
    /// (`duplicate-start`) instead of refused.
    pub fn start(&self, params: &StartParams, again: bool) -> Result<StartResult, Fault> {
        if !is_plain_name(&params.session) {
            return Err(Fault::configuration(format!("session id {:?} cannot name a folder", params.session)));
        }
        let mut live = self.lock();
        if live.contains_key(&params.session) && again {
            eprintln!("fake: starting session {} again (simulated)", params.session);
        } else if live.contains_key(&params.session) {
            return Err(Fault::configuration(format!("session {} is already started", params.session)));
        }
        let dir = self.root.join(&params.session);
        if !live.contains_key(&params.session) && dir.exists() {
            return Err(Fault::configuration(format!(
                "session {}'s folder {} is still there (a kept session)",
                params.session,
                dir.display()
            )));
        }
        let paths = SessionPaths {
            work: dir.join("work").to_string_lossy().into_owned(),
            steps: dir.join("steps").to_string_lossy().into_owned(),
            outputs: dir.join("outputs").to_string_lossy().into_owned(),
        };
        for folder in [&paths.work, &paths.steps, &paths.outputs] {
            fs::create_dir_all(folder)
                .map_err(|error| Fault::infrastructure(format!("cannot create {folder}: {error}")))?;
        }
        // The image it was given, which it ignores, is named so that tests see what it was sent.
        let image = params.image.as_ref().map(|image| format!(", image {image}")).unwrap_or_default();
        let description = Some(format!("folder {}{image}", dir.display()));
        if params.keep {
            mark_kept(&dir)?;
        }
        live.insert(params.session.clone(), dir);
        self.write_ledger(&live);
        Ok(StartResult { paths, description })
    }

    /// Ends a session, removing its folder unless it is kept (by this `keep` or its start's);
    /// with `ignore_keep` (`ignore-keep`), removing it whatever.
    pub fn stop(&self, params: &StopParams, ignore_keep: bool) -> Result<StopResult, Fault> {
        let mut live = self.lock();
        let Some(dir) = live.remove(&params.session) else {
            return Err(Fault::unknown_session(&params.session));
        };
        let kept = params.keep || dir.join(KEPT).exists();
        if kept && ignore_keep {
            eprintln!("fake: removing the kept session {} (simulated)", params.session);
        }
        let mut removed = Vec::new();
        let outcome = if kept && !ignore_keep {
            mark_kept(&dir)
        } else {
            remove(&dir).map(|()| removed.push(folder(&dir, &params.session)))
        };
        self.write_ledger(&live);
        outcome.map(|()| StopResult { removed })
    }

    /// Removes every session folder of this runner not named in `keep` and not kept (unless
    /// `remove_kept`, or `sweep_kept` (`sweep-kept`)).
    pub fn cleanup(&self, params: &CleanupParams, sweep_kept: bool) -> Result<CleanupResult, Fault> {
        let keep: BTreeSet<&str> = params.keep.iter().map(String::as_str).collect();
        let mut live = self.lock();
        live.retain(|session, _| keep.contains(session.as_str()));
        let mut result = CleanupResult::default();
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                self.write_ledger(&live);
                return Ok(result);
            }
            Err(error) => {
                self.write_ledger(&live);
                return Err(Fault::infrastructure(format!("cannot list {}: {error}", self.root.display())));
            }
        };
        let mut names: Vec<String> =
            entries.flatten().map(|entry| entry.file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        for name in names.into_iter().filter(|name| !keep.contains(name.as_str())) {
            let dir = self.root.join(&name);
            if !params.remove_kept && dir.join(KEPT).exists() {
                if !sweep_kept {
                    continue;
                }
                eprintln!("fake: removing the kept session {name} (simulated)");
            }
            match remove(&dir) {
                Ok(()) => result.removed.push(folder(&dir, &name)),
                Err(fault) => result.failures.push(fault.message),
            }
        }
        self.write_ledger(&live);
        Ok(result)
    }

    /// Stops every session, removing its folder (at shutdown and at the end of stdin).
    pub fn stop_all(&self) {
        let mut live = self.lock();
        for (session, dir) in std::mem::take(&mut *live) {
            if dir.join(KEPT).exists() {
                continue;
            }
            if let Err(fault) = remove(&dir) {
                eprintln!("fake: cannot stop session {session}: {}", fault.message);
            }
        }
        self.write_ledger(&live);
    }

    /// A live session's folder.
    pub fn dir(&self, session: &str) -> Result<PathBuf, Fault> {
        self.lock().get(session).cloned().ok_or_else(|| Fault::unknown_session(session))
    }

    /// Where a transfer's path is on the host. An absolute path inside the session is used as
    /// is, a relative one is inside the work folder, and any other absolute path (a cache such
    /// as `/cache`) is mapped under the session's `extra` folder, so nothing leaves the session.
    pub fn resolve(&self, session: &str, path: &str) -> Result<PathBuf, Fault> {
        let dir = self.dir(session)?;
        let path = Path::new(path);
        if path.components().any(|component| component == Component::ParentDir) {
            return Err(Fault::new(code::NOT_FOUND, format!("path {} may not contain `..`", path.display())));
        }
        if path.starts_with(&dir) {
            Ok(path.to_path_buf())
        } else if path.is_absolute() {
            Ok(dir.join("extra").join(path.strip_prefix("/").unwrap_or(path)))
        } else {
            Ok(dir.join("work").join(path))
        }
    }

    /// Rewrites the ledger with the live session ids, through a temporary file so that a
    /// reader never sees half of it.
    fn write_ledger(&self, live: &BTreeMap<String, PathBuf>) {
        let Some(ledger) = &self.ledger else { return };
        let ids: Vec<&String> = live.keys().collect();
        let text = serde_json::to_string(&ids).unwrap_or_else(|_| "[]".to_string());
        let temporary = ledger.with_extension("tmp");
        let written = fs::write(&temporary, text).and_then(|()| fs::rename(&temporary, ledger));
        if let Err(error) = written {
            eprintln!("fake: cannot write the ledger {}: {error}", ledger.display());
        }
    }
}

fn folder(dir: &Path, session: &str) -> Resource {
    Resource {
        kind: "folder".to_string(),
        name: dir.to_string_lossy().into_owned(),
        session: Some(session.to_string()),
    }
}

fn remove(dir: &Path) -> Result<(), Fault> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(Fault::infrastructure(format!("cannot remove {}: {error}", dir.display()))),
    }
}

/// Whether a name is safe as one folder name.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.chars().all(|char| char.is_ascii_alphanumeric() || matches!(char, '-' | '_' | '.'))
}

/// The file that marks a session's folder kept.
const KEPT: &str = "kept";

fn mark_kept(dir: &Path) -> Result<(), Fault> {
    fs::write(dir.join(KEPT), b"")
        .map_err(|error| Fault::infrastructure(format!("cannot mark {} kept: {error}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_leave_the_folder_are_refused() {
        assert!(is_plain_name("run-4_a.b"));
        assert!(!is_plain_name(""));
        assert!(!is_plain_name(".."));
        assert!(!is_plain_name("a/b"));
    }
}
