//! A run's services: containers of its pod beside the run's own (`service-NAME`, see
//! [`crate::manifest`]), sharing its network namespace, each reached from the steps by its name
//! through the `hostAliases` entry the kubelet writes into every container's `/etc/hosts`.
//!
//! The pod is Ready once every container runs, which is when a service without a health
//! command is ready. A service with one is ready once that command, exec'd into the service's
//! container as `sh -c`, exits 0; it runs again every 200 ms while it fails, up to the
//! service's `health-timeout` (and the start's own deadline). A service that ends, or whose
//! image cannot be pulled, makes the pod fail ([`crate::pod::from_pod`] names the service); its
//! log's last lines go into the error. Services go with the pod: the Job's delete and the
//! orphan sweep remove them with it.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use knotless_protocol::sdk::remote::Reader;
use knotless_protocol::*;
use kube::api::{Api, LogParams};
use tokio::io::AsyncReadExt;

use crate::api::Client;
use crate::names;
use crate::pod;
use crate::watch::PodWatch;

/// How often a health command is run again while it fails.
const HEALTH_EVERY: Duration = Duration::from_millis(200);

/// The longest one run of a health command may take.
const HEALTH_CALL: Duration = Duration::from_secs(10);

/// How much of a health command's output is kept for the error: its end.
const SAID_LIMIT: usize = 4096;

/// The lines of a service's log read for an error.
const LOG_LINES: i64 = 20;

/// Waits until every service with a health command is healthy in the run's Ready pod `pod`,
/// ending with an error naming the service when one ends, its pod fails, or it is not
/// healthy within its `health-timeout` or by `hard`.
pub async fn wait_healthy(
    client: &Client,
    namespace: &str,
    pod: &str,
    services: &[Service],
    pods: &PodWatch,
    hard: Instant,
) -> Result<(), ExecutorError> {
    let mut seen = pods.seen.clone();
    for service in services {
        let Some(command) = &service.health else { continue };
        let container = names::service_container(&service.name);
        let timeout = Duration::from_millis(service.health_timeout_ms);
        let deadline = (Instant::now() + timeout).min(hard);
        // The last run of the health command that ended of itself, for the error: a run the
        // deadline cut short says less.
        let mut ended_last: Option<(Option<i32>, String)> = None;
        loop {
            let now = seen.borrow_and_update().clone();
            if let Some(error) = failed(client, pod, &now).await {
                return Err(error);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let health = health(client, namespace, pod, &container, command);
            let (code, said) = match tokio::time::timeout(left.min(HEALTH_CALL), health).await {
                Ok(Ok(ran)) => {
                    ended_last = Some(ran.clone());
                    ran
                }
                Ok(Err(error)) => (None, error.message),
                Err(_) if left < HEALTH_CALL && ended_last.is_some() => ended_last.clone().unwrap_or_default(),
                Err(_) => (None, format!("it did not end within {} ms", left.min(HEALTH_CALL).as_millis())),
            };
            if code == Some(0) {
                tracing::info!(service = %service.name, %pod, "service healthy");
                break;
            }
            if Instant::now() + HEALTH_EVERY >= deadline {
                let ended = match code {
                    Some(code) => format!("exit code {code}"),
                    None => "no exit code".to_string(),
                };
                let said = if said.is_empty() { String::new() } else { format!(": {said}") };
                return Err(ExecutorError::infrastructure(format!(
                    "service {} did not become healthy within {} ms: its health command {command:?} last ended \
                     with {ended}{said}; its log ends: {}",
                    service.name,
                    timeout.as_millis(),
                    log_tail(client, namespace, pod, &container).await
                )));
            }
            // A pod that fails meanwhile ends the wait at once.
            let _ = tokio::time::timeout(HEALTH_EVERY, seen.changed()).await;
        }
    }
    Ok(())
}

/// The error of a pod that cannot go on (with the log's end of a service that ended), if it
/// cannot.
async fn failed(client: &Client, pod: &str, seen: &crate::watch::Seen) -> Option<ExecutorError> {
    if let Some(error) = &seen.error {
        return Some(ExecutorError::infrastructure(error.clone()));
    }
    let Some(object) = &seen.pod else {
        return Some(ExecutorError::infrastructure(format!(
            "the pod {pod} is gone while its services got healthy (its job was deleted, or its node lost)"
        )));
    };
    let cause = pod::broken(object)?;
    Some(ExecutorError::infrastructure(format!("the pod {pod} cannot run: {}", with_log(client, object, cause).await)))
}

/// `cause`, followed by the end of the log of the pod's service that ended, if one did.
pub async fn with_log(client: &Client, object: &Pod, cause: String) -> String {
    let Some(container) = pod::ended_service(object) else { return cause };
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let name = object.metadata.name.clone().unwrap_or_default();
    format!("{cause}; its log ends: {}", log_tail(client, &namespace, &name, &container).await)
}

/// Runs a health command once: its exit code (`None` when the exec gave none) and the end of
/// what it wrote.
async fn health(
    client: &Client,
    namespace: &str,
    pod: &str,
    container: &str,
    command: &str,
) -> Result<(Option<i32>, String), ExecutorError> {
    let argv = vec!["sh".to_string(), "-c".to_string(), command.to_string()];
    // No stdin: a command that reads it sees its end.
    let exec = client.exec_without_stdin(namespace, pod, container, argv, None).await?;
    let (stdout, stderr) = tokio::join!(kept(exec.stdout), kept(exec.stderr));
    let code = exec.ended.await;
    let mut said = stdout;
    said.extend_from_slice(&stderr);
    Ok((code, sdk::tail(&said)))
}

/// Reads a stream to its end, keeping its last [`SAID_LIMIT`] bytes.
async fn kept(mut reader: Reader) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buffer = vec![0u8; 8192];
    while let Ok(read @ 1..) = reader.read(&mut buffer).await {
        kept.extend_from_slice(&buffer[..read]);
        if kept.len() > SAID_LIMIT {
            kept.drain(..kept.len() - SAID_LIMIT);
        }
    }
    kept
}

/// The last lines of a container's log, on one line.
pub async fn log_tail(client: &Client, namespace: &str, pod: &str, container: &str) -> String {
    let api: Api<Pod> = client.api(namespace);
    let params = LogParams {
        container: Some(container.to_string()),
        tail_lines: Some(LOG_LINES),
        limit_bytes: Some(64 * 1024),
        ..LogParams::default()
    };
    let what = format!("read the log of container {container} of pod {pod}");
    match client.limited(&what, api.logs(pod, &params)).await {
        Ok(text) => {
            let tail = sdk::tail(text.as_bytes());
            if tail.is_empty() { "(nothing)".to_string() } else { tail }
        }
        Err(error) => format!("(unavailable: {})", error.message),
    }
}
