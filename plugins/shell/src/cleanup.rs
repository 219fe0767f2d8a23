//! `cleanup`: the orphan sweep. A session folder of this runner id is removed when it belongs
//! to no session in `keep` and its owner is provably gone: the process that made it
//! (`<runner dir>/.owners/<session>` holds its [`knotless_protocol::owner`] token) no longer
//! holds its lock, or it is this process (whose live sessions `keep` names); a folder from
//! before owners were written has no owner file and is swept. A folder of another live process
//! (another `knotless-run`, whatever its cache folder) or of an owner this process cannot
//! check is left, and so is a kept session ([`knotless_protocol::kept`]) unless the sweep
//! has `remove_kept`. Other runner ids are never touched. The processes of a session an earlier
//! executor started need no sweep: their reaper killed them when that executor ended.

use std::collections::BTreeSet;

use knotless_protocol::sdk::Context;
use knotless_protocol::*;

use crate::ShellExecutor;
use crate::config::is_safe_component;
use crate::session::{OWNERS, forget_owner, read_owner, remove_folder, remove_session};
use knotless_protocol::owner::{self, Liveness};

/// `cleanup`.
pub async fn cleanup(
    executor: &ShellExecutor,
    params: CleanupParams,
    _context: Context,
) -> Result<CleanupResult, ExecutorError> {
    let config = executor.config.get()?;
    let kept = knotless_protocol::kept::sessions(&config.runner_id);
    let mut keep: BTreeSet<&str> = params.keep.iter().map(String::as_str).collect();
    if !params.remove_kept {
        keep.extend(kept.iter().map(String::as_str));
    }
    let runner_dir = config.runner_dir();
    let mut result = CleanupResult::default();

    // The sessions to sweep: folders under this runner's folder, and the sessions this
    // process started (a step may have removed its own folder).
    let mut sessions: BTreeSet<String> = executor.sessions.lock().keys().cloned().collect();
    match std::fs::read_dir(&runner_dir) {
        Ok(entries) => {
            for entry in entries {
                match entry {
                    Ok(entry) => match entry.file_name().into_string() {
                        Ok(name) if name == OWNERS => {}
                        Ok(name) if is_safe_component(&name) => {
                            sessions.insert(name);
                        }
                        Ok(name) => result
                            .failures
                            .push(format!("left {name:?} in {}: not a session folder", runner_dir.display())),
                        Err(name) => result
                            .failures
                            .push(format!("left {name:?} in {}: not a session folder", runner_dir.display())),
                    },
                    Err(error) => result.failures.push(format!("cannot list {}: {error}", runner_dir.display())),
                }
            }
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => result.failures.push(format!("cannot list {}: {error}", runner_dir.display())),
    }

    for session in sessions {
        if keep.contains(session.as_str()) {
            continue;
        }
        let started = executor.sessions.lock().remove(&session);
        let removal = match started {
            Some(started) => remove_session(&started).await,
            None => {
                if let Some(left) = still_owned(&runner_dir, &session) {
                    tracing::info!(%session, "left the session folder: {left}");
                    continue;
                }
                remove_folder(&session, &runner_dir.join(&session)).await
            }
        };
        match removal {
            Ok(removed) => {
                if kept.contains(&session) {
                    knotless_protocol::kept::unmark(&config.runner_id, &session);
                }
                result.removed.extend(removed)
            }
            Err(error) => result.failures.push(error.message),
        }
    }
    sweep_owner_files(&runner_dir);
    tracing::info!(removed = result.removed.len(), failures = result.failures.len(), "orphan sweep done");
    Ok(result)
}

/// Why the folder of `session`, which this process did not start, is not to be swept: its owner
/// lives, or cannot be checked from here. `None` when it is provably gone.
fn still_owned(runner_dir: &std::path::Path, session: &str) -> Option<String> {
    let token = read_owner(runner_dir, session)?;
    match owner::liveness(&token) {
        Liveness::Dead => None,
        // This process's own: `keep` says which of its sessions live.
        Liveness::Alive if owner::this_process().is_ok_and(|own| own.is(&token)) => None,
        Liveness::Alive => Some("its owner, another process, is alive".to_string()),
        Liveness::Unknown => Some(format!("its owner {token:?} cannot be checked from here")),
    }
}

/// Removes the owner files whose session folder is gone (a start that died between the two)
/// and whose owner is gone too.
fn sweep_owner_files(runner_dir: &std::path::Path) {
    for entry in std::fs::read_dir(runner_dir.join(OWNERS)).into_iter().flatten().flatten() {
        let Ok(session) = entry.file_name().into_string() else { continue };
        if !is_safe_component(&session) || runner_dir.join(&session).exists() {
            continue;
        }
        if read_owner(runner_dir, &session).is_some_and(|token| owner::liveness(&token) == Liveness::Dead) {
            forget_owner(runner_dir, &session);
        }
    }
}
