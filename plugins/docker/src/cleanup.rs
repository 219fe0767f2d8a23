//! `cleanup`: the orphan sweep. Every container labelled with this runner's id whose session
//! is not in `keep` is removed (a session's and its services'), then every such network;
//! containers and networks of other runners are never touched.

use std::collections::BTreeSet;

use knotless_protocol::sdk::Context;
use knotless_protocol::*;

use crate::DockerExecutor;
use crate::argv;
use crate::docker::SHORT_CALL;
use crate::services::remove_network;
use crate::session::remove_container;

/// One container of this runner, as `docker ps` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub session: Option<String>,
}

/// Reads `docker ps --format '{{.Names}}\t{{.Label "dev.knotless.session"}}'`.
pub fn parse_list(stdout: &str) -> Vec<Listed> {
    stdout
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let (name, session) = line.split_once('\t').unwrap_or((line, ""));
            let session = session.trim();
            Listed {
                name: name.trim().to_string(),
                session: if session.is_empty() { None } else { Some(session.to_string()) },
            }
        })
        .collect()
}

/// `cleanup`.
pub async fn cleanup(
    executor: &DockerExecutor,
    params: CleanupParams,
    _context: Context,
) -> Result<CleanupResult, ExecutorError> {
    let config = executor.config.get()?;
    let keep: BTreeSet<&str> = params.keep.iter().map(String::as_str).collect();
    let stdout = config.docker.output(&argv::list(&config.runner_id), SHORT_CALL).await.map_err(|failure| {
        ExecutorError::infrastructure(format!(
            "cannot list the containers of runner {} on the docker engine at {}: {failure}",
            config.runner_id,
            config.docker.host_shown()
        ))
    })?;
    let mut result = CleanupResult::default();
    for listed in parse_list(&String::from_utf8_lossy(&stdout)) {
        if listed.session.as_deref().is_some_and(|session| keep.contains(session)) {
            continue;
        }
        if let Some(session) = &listed.session {
            executor.sessions.lock().remove(session);
        }
        match remove_container(&config.docker, &listed.name, listed.session.as_deref()).await {
            Ok(Some(resource)) => result.removed.push(resource),
            Ok(None) => {}
            Err(error) => result.failures.push(error.message),
        }
    }
    // The networks of services, once their containers are gone.
    match config.docker.output(&argv::list_networks(&config.runner_id), SHORT_CALL).await {
        Ok(stdout) => {
            for listed in parse_list(&String::from_utf8_lossy(&stdout)) {
                if listed.session.as_deref().is_some_and(|session| keep.contains(session)) {
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
            parse_list("knotless-r-a\ta\nknotless-r-b\t\n\n"),
            [
                Listed { name: "knotless-r-a".into(), session: Some("a".into()) },
                Listed { name: "knotless-r-b".into(), session: None }
            ]
        );
    }
}
