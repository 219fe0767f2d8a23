//! A session's services: containers beside its own on a network of the session's, where steps
//! reach each by its name. The network is `--internal`: it reaches nothing outside, so a
//! workflow without `network: true` still has no network but its services. A service is
//! healthy once its health command exits 0 in it (or once it runs, without one), before
//! `start` answers; everything is labelled as the session's container is, and removed with
//! it, by `stop` or by the orphan sweep.

use std::time::{Duration, Instant};

use knotless_protocol::*;

use crate::argv::{self, ServiceSpec};
use crate::docker::{Docker, SHORT_CALL, Said};

/// How often a health command is run again while it fails.
const HEALTH_EVERY: Duration = Duration::from_millis(200);

/// Starts each service on `network` and waits until each is healthy. Returns the containers
/// it made, even on an error: the caller removes them.
pub async fn start(
    docker: &Docker,
    container: &str,
    network: &str,
    labels: &[(String, String)],
    pids_limit: u32,
    services: &[Service],
    made: &mut Vec<String>,
) -> Result<(), ExecutorError> {
    for service in services {
        let spec = ServiceSpec {
            container: argv::service_container(container, &service.name),
            alias: service.name.clone(),
            network: network.to_string(),
            image: service.image.clone(),
            command: service.command.clone(),
            env_names: service.env.keys().cloned().collect(),
            labels: labels.to_vec(),
            pids_limit,
        };
        let ran = docker.output_with(&argv::run_service(&spec), &service.env, SHORT_CALL).await;
        if let Err(failure) = ran {
            // `docker run` may have created the container before it failed.
            made.push(spec.container.clone());
            let why = if failure.said() == Said::NoImage {
                format!("image {} is not on the docker engine (the docker executor never pulls)", service.image)
            } else {
                "it did not start".to_string()
            };
            return Err(ExecutorError::infrastructure(format!("service {}: {why}: {failure}", service.name)));
        }
        made.push(spec.container.clone());
    }
    for service in services {
        healthy(docker, &argv::service_container(container, &service.name), service).await?;
    }
    Ok(())
}

/// Waits until `service` (in `container`) is healthy: its health command exits 0, or, without
/// one, it runs. A service that stopped fails at once, with the end of its log.
async fn healthy(docker: &Docker, container: &str, service: &Service) -> Result<(), ExecutorError> {
    let timeout = Duration::from_millis(service.health_timeout_ms);
    let deadline = Instant::now() + timeout;
    loop {
        let state = docker.state(container).await.map_err(|failure| {
            ExecutorError::infrastructure(format!("cannot inspect service {}: {failure}", service.name))
        })?;
        if state.as_deref() != Some("running") {
            let state = state.unwrap_or_else(|| "gone".to_string());
            return Err(ExecutorError::infrastructure(format!(
                "service {} stopped before it was healthy ({state}); its log ends: {}",
                service.name,
                log_tail(docker, container).await
            )));
        }
        let Some(command) = &service.health else {
            return Ok(());
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let failure = match docker.output(&argv::health(container, command), left.min(SHORT_CALL)).await {
            Ok(_) => {
                tracing::info!(service = %service.name, %container, "service healthy");
                return Ok(());
            }
            Err(failure) => failure,
        };
        if Instant::now() + HEALTH_EVERY >= deadline {
            return Err(ExecutorError::infrastructure(format!(
                "service {} did not become healthy within {} ms: its health command {command:?} last ended with: \
                 {failure}; its log ends: {}",
                service.name,
                timeout.as_millis(),
                log_tail(docker, container).await
            )));
        }
        tokio::time::sleep(HEALTH_EVERY).await;
    }
}

/// The last lines of a container's output, on one line.
async fn log_tail(docker: &Docker, container: &str) -> String {
    let mut command = docker.command(&argv::logs(container));
    command.stderr(std::process::Stdio::piped());
    match tokio::time::timeout(SHORT_CALL, command.output()).await {
        Ok(Ok(output)) => {
            let mut both = output.stdout;
            both.extend_from_slice(&output.stderr);
            let text = crate::docker::tail(&both);
            if text.is_empty() { "(nothing)".to_string() } else { text }
        }
        _ => "(unavailable)".to_string(),
    }
}

/// Removes a session's network; `None` when it was already gone.
pub async fn remove_network(
    docker: &Docker,
    network: &str,
    session: Option<&str>,
) -> Result<Option<Resource>, ExecutorError> {
    match docker.output(&argv::remove_network(network), SHORT_CALL).await {
        Ok(_) => Ok(Some(Resource {
            kind: "network".into(),
            name: network.to_string(),
            session: session.map(str::to_string),
        })),
        Err(failure) if failure.said() == Said::NoNetwork => Ok(None),
        Err(failure) => Err(ExecutorError::infrastructure(format!("cannot remove network {network}: {failure}"))),
    }
}
