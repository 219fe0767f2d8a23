//! `cleanup`: the orphan sweep. A container labelled with this runner's id (a session's or its
//! services') is removed when its session is not in `keep` and its owner is provably gone: the
//! process named by its owner label ([`knotless_protocol::owner`]) no longer holds its lock,
//! or it is this process (whose live sessions `keep` names); a container from before owners
//! were labelled is swept too. Then every such network, by the same rule. What another live
//! process owns (another `knotless-run`, whatever its cache folder), or an owner this process
//! cannot check (another host's engine client), is left, and so is a kept session's
//! ([`knotless_protocol::kept`]) unless the sweep has `remove_kept`; containers and networks
//! of other runners are never touched.

use std::collections::BTreeSet;

use knotless_protocol::kept;

use knotless_protocol::sdk::Context;
use knotless_protocol::*;

use knotless_protocol::owner::{self, Liveness};

use crate::DockerExecutor;
use crate::argv;
use crate::docker::SHORT_CALL;
use crate::services::remove_network;
use crate::session::remove_container;

/// One container or network of this runner, as `docker ps` or `docker network ls` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub session: Option<String>,
    pub owner: Option<String>,
}

/// Reads `docker ps --format '{{.Names}}\t{{.Label "dev.knotless.session"}}\t{{.Label
/// "dev.knotless.owner"}}'` (a missing label is an empty column).
pub fn parse_list(stdout: &str) -> Vec<Listed> {
    let column = |text: Option<&str>| text.map(str::trim).filter(|text| !text.is_empty()).map(str::to_string);
    stdout
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let mut columns = line.split('\t');
            Listed {
                name: columns.next().unwrap_or_default().trim().to_string(),
                session: column(columns.next()),
                owner: column(columns.next()),
            }
        })
        .collect()
}

/// Why `listed` is not to be swept, or `None` when it is: its session is kept, or its owner is
/// another process that lives or one that cannot be checked.
fn left_because(listed: &Listed, keep: &BTreeSet<&str>) -> Option<String> {
    if let Some(session) = listed.session.as_deref()
        && keep.contains(session)
    {
        return Some(format!("session {session} is in flight"));
    }
    let owner = listed.owner.as_deref()?;
    match owner::liveness(owner) {
        Liveness::Dead => None,
        // This process's own: `keep` says which of its sessions live.
        Liveness::Alive if owner::this_process().is_ok_and(|own| own.is(owner)) => None,
        Liveness::Alive => Some("its owner, another process, is alive".to_string()),
        Liveness::Unknown => Some(format!("its owner {owner:?} cannot be checked from here")),
    }
}

/// `cleanup`.
pub async fn cleanup(
    executor: &DockerExecutor,
    params: CleanupParams,
    _context: Context,
) -> Result<CleanupResult, ExecutorError> {
    let config = executor.config.get()?;
    let keep: BTreeSet<&str> = params.keep.iter().map(String::as_str).collect();
    let marked = kept::sessions(&config.runner_id);
    let kept: BTreeSet<&str> =
        if params.remove_kept { BTreeSet::new() } else { marked.iter().map(String::as_str).collect() };
    let stdout = config.docker.output(&argv::list(&config.runner_id), SHORT_CALL).await.map_err(|failure| {
        ExecutorError::infrastructure(format!(
            "cannot list the containers of runner {} on the docker engine at {}: {failure}",
            config.runner_id,
            config.docker.host_shown()
        ))
    })?;
    let mut result = CleanupResult::default();
    // The sessions whose container stays: their networks stay too.
    let mut staying = BTreeSet::new();
    for listed in parse_list(&String::from_utf8_lossy(&stdout)) {
        if let Some(session) = listed.session.as_deref()
            && kept.contains(session)
        {
            tracing::debug!(container = %listed.name, "left the container: session {session} is kept");
            staying.insert(session.to_string());
            continue;
        }
        if let Some(why) = left_because(&listed, &keep) {
            staying.extend(listed.session.clone());
            tracing::debug!(container = %listed.name, "left the container: {why}");
            continue;
        }
        if let Some(session) = &listed.session {
            executor.sessions.lock().remove(session);
        }
        match remove_container(&config.docker, &listed.name, listed.session.as_deref()).await {
            Ok(Some(resource)) => {
                if let Some(session) =
                    listed.session.as_deref().filter(|session| marked.iter().any(|kept| kept == session))
                {
                    kept::unmark(&config.runner_id, session);
                }
                result.removed.push(resource)
            }
            Ok(None) => {}
            Err(error) => result.failures.push(error.message),
        }
    }
    // The networks of services, once their containers are gone.
    match config.docker.output(&argv::list_networks(&config.runner_id), SHORT_CALL).await {
        Ok(stdout) => {
            for listed in parse_list(&String::from_utf8_lossy(&stdout)) {
                if listed.session.as_deref().is_some_and(|session| staying.contains(session)) {
                    tracing::debug!(network = %listed.name, "left the network: its session's container stays");
                    continue;
                }
                if let Some(why) = left_because(&listed, &keep) {
                    tracing::debug!(network = %listed.name, "left the network: {why}");
                    continue;
                }
                match remove_network(&config.docker, &listed.name, listed.session.as_deref()).await {
                    Ok(Some(resource)) => result.removed.push(resource),
                    Ok(None) => {}
                    Err(error) => result.failures.push(error.message),
                }
            }
        }
        Err(failure) => {
            result.failures.push(format!("cannot list the networks of runner {}: {failure}", config.runner_id))
        }
    }
    tracing::info!(runner = %config.runner_id, removed = result.removed.len(), failures = result.failures.len(),
        "orphan sweep done");
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_read_line_by_line() {
        assert_eq!(
            parse_list(
                "knotless-r-a\ta\tff:/run/user/0/knotless-owners/00.lock\nknotless-r-b\t\t\nknotless-r-c\tc\n\n"
            ),
            [
                Listed {
                    name: "knotless-r-a".into(),
                    session: Some("a".into()),
                    owner: Some("ff:/run/user/0/knotless-owners/00.lock".into())
                },
                Listed { name: "knotless-r-b".into(), session: None, owner: None },
                Listed { name: "knotless-r-c".into(), session: Some("c".into()), owner: None }
            ]
        );
    }
}
