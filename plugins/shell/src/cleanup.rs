//! `cleanup`: the orphan sweep. Every session folder and every marked process of this runner
//! id that belongs to no session in `keep` is killed and removed; other runner ids are never
//! touched.

use std::collections::BTreeSet;

use knotless_protocol::sdk::Context;
use knotless_protocol::*;

use crate::ShellExecutor;
use crate::config::is_safe_component;
use crate::processes;
use crate::session::remove_session;

/// `cleanup`.
pub async fn cleanup(
    executor: &ShellExecutor,
    params: CleanupParams,
    _context: Context,
) -> Result<CleanupResult, ExecutorError> {
    let config = executor.config()?;
    let keep: BTreeSet<&str> = params.keep.iter().map(String::as_str).collect();
    let runner_dir = config.runner_dir();
    let prefix = format!("{}/", config.runner_id);
    let mut result = CleanupResult::default();

    // The sessions to sweep: folders under this runner's folder, and sessions named by the
    // markers of live processes (a folder may be gone while its processes live on).
    let mut sessions = BTreeSet::new();
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
    for process in processes::scan() {
        if let Some(session) = process.marker.as_deref().and_then(|marker| marker.strip_prefix(&prefix)) {
            if is_safe_component(session) {
                sessions.insert(session.to_string());
            }
        }
    }

    for session in sessions {
        if keep.contains(session.as_str()) {
            continue;
        }
        executor.sessions().remove(&session);
        let root = runner_dir.join(&session);
        match remove_session(&session, &root, &config.marker(&session)).await {
            Ok(removed) => result.removed.extend(removed),
            Err(error) => result.failures.push(error.message),
        }
    }
    tracing::info!(removed = result.removed.len(), failures = result.failures.len(), "orphan sweep done");
    Ok(result)
}
