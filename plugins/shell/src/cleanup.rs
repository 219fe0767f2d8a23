//! `cleanup`: the orphan sweep. Every session folder of this runner id that belongs to no
//! session in `keep` is removed, with the processes its steps left running if this process
//! started it; other runner ids are never touched. The processes of a session an earlier
//! executor started need no sweep: their reaper killed them when that executor ended.

use std::collections::BTreeSet;

use knotless_protocol::sdk::Context;
use knotless_protocol::*;

use crate::ShellExecutor;
use crate::config::is_safe_component;
use crate::session::{remove_folder, remove_session};

/// `cleanup`.
pub async fn cleanup(
    executor: &ShellExecutor,
    params: CleanupParams,
    _context: Context,
) -> Result<CleanupResult, ExecutorError> {
    let config = executor.config.get()?;
    let keep: BTreeSet<&str> = params.keep.iter().map(String::as_str).collect();
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
            None => remove_folder(&session, &runner_dir.join(&session)).await,
        };
        match removal {
            Ok(removed) => result.removed.extend(removed),
            Err(error) => result.failures.push(error.message),
        }
    }
    tracing::info!(removed = result.removed.len(), failures = result.failures.len(), "orphan sweep done");
    Ok(result)
}
