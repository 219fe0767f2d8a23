//! Sessions: `start` creates and starts a session's container, `stop` removes it, `shutdown`
//! removes every container this process started that is not kept, and session paths are
//! resolved here.

use std::path::{Component, Path};
use std::sync::Arc;

use knotless_protocol::sdk::Context;
use knotless_protocol::*;

use crate::DockerExecutor;
use crate::argv::{self, ContainerSpec};
use crate::config::{Config, check_name, flag};
use crate::docker::{Docker, SHORT_CALL, Said};
use crate::pids::PidsCgroup;
use knotless_protocol::sdk::quantity as resources;

/// A session this process started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The session id.
    pub id: String,
    /// Its container's name.
    pub container: String,
    /// Its image.
    pub image: String,
    /// Started with `keep`: `stop` and `shutdown` leave the container in place.
    pub keep: bool,
    /// The image has a `tar`: an upload unpacks and merges in one `docker exec`, not through
    /// `docker cp` and two more.
    pub tar: bool,
    /// The containers of its services.
    pub services: Vec<String>,
    /// Its own network, when it has services.
    pub network: Option<String>,
    /// Its container's pids cgroup, when the engine runs on this host.
    pub pids: Option<PidsCgroup>,
}

impl Session {
    /// A path the runner gave, as an absolute path in the container: relative paths are
    /// taken from `/work`; `..` is refused.
    pub fn resolve(&self, path: &str) -> Result<String, ExecutorError> {
        let given = Path::new(path);
        if path.is_empty() || given.components().any(|component| component == Component::ParentDir) {
            return Err(ExecutorError::configuration(format!("path {path:?} in session {} is not allowed", self.id)));
        }
        let joined = if given.is_absolute() { given.to_path_buf() } else { Path::new("/work").join(given) };
        Ok(joined.to_string_lossy().into_owned())
    }
}

/// The container of a new session, from its parameters and the configuration.
pub fn container_spec(config: &Config, params: &StartParams) -> Result<ContainerSpec, ExecutorError> {
    let image = match (&params.image, &config.image) {
        (Some(image), _) if !image.trim().is_empty() => image.clone(),
        (_, Some(image)) => image.clone(),
        _ => {
            return Err(ExecutorError::configuration(format!(
                "no image for session {}: the workflow names none and the runner was given no {}",
                params.session,
                flag("image")
            )));
        }
    };
    let labels = vec![
        (argv::RUNNER_LABEL.to_string(), config.runner_id.clone()),
        (argv::SESSION_LABEL.to_string(), params.session.clone()),
        (argv::RUN_LABEL.to_string(), argv::label_value(&params.run.id)),
        (argv::WORKFLOW_LABEL.to_string(), argv::label_value(&params.run.workflow)),
        (argv::REPOSITORY_LABEL.to_string(), argv::label_value(&params.run.repository)),
    ];
    let name = config.container_name(&params.session);
    Ok(ContainerSpec {
        services_network: (!params.services.is_empty()).then(|| argv::services_network(&name)),
        name,
        image,
        labels,
        pids_limit: config.pids_limit,
        cpus: params.resources.cpu.as_deref().map(resources::cpus).transpose()?,
        memory: Some(memory(config, params)?),
        network: params.network,
        lifetime_secs: match (params.keep, params.run_timeout_ms) {
            (false, Some(timeout_ms)) => Some(timeout_ms.div_ceil(1000) + config.lifetime_margin),
            _ => None,
        },
    })
}

/// The memory of a session's container: what its workflow's `resources` ask for, within the
/// `memory-max` option, or the `memory-limit` option.
fn memory(config: &Config, params: &StartParams) -> Result<u64, ExecutorError> {
    let Some(asked) = params.resources.memory.as_deref() else { return Ok(config.memory_limit) };
    let bytes = resources::memory_bytes(asked)?;
    if bytes > config.memory_max {
        return Err(ExecutorError::configuration(format!(
            "the workflow's resources ask for memory {asked:?} ({bytes} bytes), over the docker executor's most, {} \
             bytes: ask for less, or raise {}",
            config.memory_max,
            crate::config::flag("memory-max")
        )));
    }
    Ok(bytes)
}

/// `start`: `docker run --detach` of the session's container, then its folders. (It sends no
/// `log`: the result's description names the container.)
pub async fn start(
    executor: &DockerExecutor,
    params: StartParams,
    _context: Context,
) -> Result<StartResult, ExecutorError> {
    let config = executor.config.get()?;
    check_name("session id", &params.session)?;
    if executor.sessions.lock().contains_key(&params.session) {
        return Err(ExecutorError::configuration(format!("session {} is already started", params.session)));
    }
    Service::check_all(&params.services)?;
    let mut spec = container_spec(&config, &params)?;
    let owner = knotless_protocol::owner::this_process().map_err(|error| {
        ExecutorError::infrastructure(format!(
            "cannot take a lock in {} to label the containers of this process: {error}",
            knotless_protocol::owner::owners_dir().display()
        ))
    })?;
    spec.labels.push((argv::OWNER_LABEL.to_string(), owner.token().to_string()));
    if params.keep {
        // Before the container: no sweep ever finds it unmarked. A mark of a start that fails
        // goes at the next sweep.
        mark_kept(&config.runner_id, &params.session)?;
    }
    let docker = &config.docker;
    let mut unwind = Unwind {
        docker: docker.clone(),
        made: Made { container: spec.name.clone(), ..Made::default() },
        session: params.session.clone(),
        armed: true,
    };
    let created = create(&config, &params, &spec, &mut unwind.made).await;
    let made = std::mem::take(&mut unwind.made);
    unwind.armed = false;
    match created {
        Ok((tar, pids)) => {
            let session = Session {
                id: params.session.clone(),
                container: spec.name.clone(),
                image: spec.image.clone(),
                keep: params.keep,
                tar,
                services: made.services,
                network: made.network,
                pids,
            };
            if !params.keep {
                // A mark left of an earlier session of this id, which the operator removed by hand.
                knotless_protocol::kept::unmark(&config.runner_id, &params.session);
            }
            finish_start(executor, session, &spec)
        }
        Err(error) => {
            // Whatever was made before the failure goes with it.
            let _ = remove_made(docker, &made, Some(&params.session)).await;
            tracing::error!(session = %params.session, container = %spec.name, image = %spec.image, "{error}");
            Err(error)
        }
    }
}

/// What `start` made so far, to remove on a failure.
#[derive(Debug, Default)]
struct Made {
    container: String,
    network: Option<String>,
    services: Vec<String>,
}

/// Removes what a `start` made when the start is dropped before it ended (at its deadline, or
/// on a cancel), as a failed start does. A container the engine makes after its CLI was killed
/// is left to the orphan sweep.
struct Unwind {
    docker: Docker,
    made: Made,
    session: String,
    armed: bool,
}

impl Drop for Unwind {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self.armed {
            return;
        }
        let (docker, made, session) = (self.docker.clone(), std::mem::take(&mut self.made), self.session.clone());
        tracing::warn!(%session, "start ended before it answered: removing what it made");
        runtime.spawn(async move {
            if let Err(error) = remove_made(&docker, &made, Some(&session)).await {
                tracing::error!(%session, "cannot remove what an unfinished start made: {error}");
            }
        });
    }
}

/// Creates the session's network (with services), its container, its folders and its services;
/// returns whether the image has a `tar`, and the container's pids cgroup when it is on this
/// host.
async fn create(
    config: &Config,
    params: &StartParams,
    spec: &ContainerSpec,
    made: &mut Made,
) -> Result<(bool, Option<PidsCgroup>), ExecutorError> {
    let docker = &config.docker;
    if let Some(network) = &spec.services_network {
        if let Err(failure) = docker.output(&argv::create_network(network, &spec.labels), SHORT_CALL).await {
            return Err(ExecutorError::infrastructure(format!(
                "cannot create network {network} for the services of session {}: {failure}",
                params.session
            )));
        }
        made.network = Some(network.clone());
    }
    if let Err(failure) = docker.output(&argv::run_container(spec), SHORT_CALL).await {
        return Err(if failure.said() == Said::NoImage {
            ExecutorError::infrastructure(format!(
                "image {} is not on the docker engine at {} (the docker executor never pulls: load it with docker \
                 load or docker import): {failure}",
                spec.image,
                docker.host_shown()
            ))
        } else if failure.said() == Said::NameInUse {
            // Not ours to remove: another session's container of that name.
            made.container.clear();
            ExecutorError::configuration(format!(
                "a container {} already exists for session {}: {failure}",
                spec.name, params.session
            ))
        } else {
            ExecutorError::infrastructure(format!(
                "cannot start container {} from image {}: {failure}",
                spec.name, spec.image
            ))
        });
    }
    if let (true, Some(_)) = (spec.network, &spec.services_network)
        && let Err(failure) = docker.output(&argv::connect("bridge", &spec.name), SHORT_CALL).await
    {
        return Err(ExecutorError::infrastructure(format!(
            "cannot connect container {} to the engine's network: {failure}",
            spec.name
        )));
    }
    let make_folders = argv::make_folders_finding_tar(&spec.name, &argv::SESSION_FOLDERS);
    let (folders, pids) = tokio::join!(docker.output(&make_folders, SHORT_CALL), PidsCgroup::find(docker, &spec.name));
    let tar = match folders {
        Ok(stdout) => !stdout.trim_ascii().is_empty(),
        Err(failure) => {
            return Err(ExecutorError::infrastructure(format!(
                "cannot create /work, /steps and /outputs in container {} (image {}): {failure}",
                spec.name, spec.image
            )));
        }
    };
    if let Some(network) = &spec.services_network {
        let labels = &spec.labels;
        let limit = spec.pids_limit;
        crate::services::start(docker, &spec.name, network, labels, limit, &params.services, &mut made.services)
            .await?;
    }
    Ok((tar, pids))
}

/// Removes what `start` made: the services, the container, then the network.
async fn remove_made(docker: &Docker, made: &Made, session: Option<&str>) -> Result<Vec<Resource>, ExecutorError> {
    let mut removed = Vec::new();
    let mut failed = None;
    let containers = made.services.iter().chain(std::iter::once(&made.container).filter(|name| !name.is_empty()));
    for container in containers {
        match remove_container(docker, container, session).await {
            Ok(resource) => removed.extend(resource),
            Err(error) => failed = Some(error),
        }
    }
    if let Some(network) = &made.network {
        match crate::services::remove_network(docker, network, session).await {
            Ok(resource) => removed.extend(resource),
            Err(error) => failed = Some(error),
        }
    }
    match failed {
        Some(error) => Err(error),
        None => Ok(removed),
    }
}

/// Records a started session and answers `start`.
fn finish_start(
    executor: &DockerExecutor,
    session: Session,
    spec: &ContainerSpec,
) -> Result<StartResult, ExecutorError> {
    let mut description = format!("container {} from {}", session.container, session.image);
    if let Some(network) = &session.network {
        let prefix = argv::service_container(&session.container, "");
        let names: Vec<&str> = session.services.iter().map(|name| name.strip_prefix(&prefix).unwrap_or(name)).collect();
        description.push_str(&format!(", with services on network {network}: {}", names.join(", ")));
    }
    tracing::info!(session = %session.id, container = %session.container, image = %session.image,
        network = spec.network, services = session.services.len(), "container started");
    // The description is the run's note of it (`environment: container ...`): no log says it
    // twice.
    executor.sessions.lock().insert(session.id.clone(), Arc::new(session));
    let paths = SessionPaths { work: "/work".into(), steps: "/steps".into(), outputs: "/outputs".into() };
    Ok(StartResult { paths, description: Some(description) })
}

/// `stop`: removes the session's container, unless keeping (then the session is marked kept
/// and forgotten).
pub async fn stop(
    executor: &DockerExecutor,
    params: StopParams,
    context: Context,
) -> Result<StopResult, ExecutorError> {
    let config = executor.config.get()?;
    let session = executor.sessions.get(&params.session)?;
    if params.keep || session.keep {
        mark_kept(&config.runner_id, &session.id)?;
    }
    executor.sessions.lock().remove(&params.session);
    if params.keep || session.keep {
        context.log(&session.id, LogLevel::Info, format!("kept the container {}", session.container)).await;
        return Ok(StopResult { removed: Vec::new() });
    }
    let removed = remove_session(&config.docker, &session).await?;
    Ok(StopResult { removed })
}

/// Marks a session kept, so that a `cleanup` leaves its container unless asked to remove kept
/// ones.
fn mark_kept(runner_id: &str, session: &str) -> Result<(), ExecutorError> {
    knotless_protocol::kept::mark(runner_id, session)
        .map_err(|error| ExecutorError::infrastructure(format!("cannot mark session {session} kept: {error}")))
}

/// `shutdown`: removes the container of every session this process started that is not kept.
pub async fn shutdown(executor: &DockerExecutor) {
    let Ok(config) = executor.config.get() else {
        return;
    };
    let sessions: Vec<Arc<Session>> = executor.sessions.lock().drain().map(|(_, session)| session).collect();
    for session in sessions {
        if session.keep {
            tracing::info!(session = %session.id, container = %session.container, "keeping the container at shutdown");
            continue;
        }
        match remove_session(&config.docker, &session).await {
            Ok(_) => tracing::info!(session = %session.id, container = %session.container, "removed at shutdown"),
            Err(error) => tracing::error!(session = %session.id, "cannot remove the container at shutdown: {error}"),
        }
    }
}

/// Removes a session's services, its container and its network.
async fn remove_session(docker: &Docker, session: &Session) -> Result<Vec<Resource>, ExecutorError> {
    let made = Made {
        container: session.container.clone(),
        network: session.network.clone(),
        services: session.services.clone(),
    };
    remove_made(docker, &made, Some(&session.id)).await
}

/// `docker rm --force` of a container; `None` when it was already gone.
pub async fn remove_container(
    docker: &Docker,
    container: &str,
    session: Option<&str>,
) -> Result<Option<Resource>, ExecutorError> {
    match docker.output(&argv::remove(container), SHORT_CALL).await {
        Ok(_) => {
            tracing::info!(%container, session = session.unwrap_or(""), "container removed");
            Ok(Some(Resource {
                kind: "container".into(),
                name: container.to_string(),
                session: session.map(str::to_string),
            }))
        }
        Err(failure) if failure.said() == Said::NoContainer => Ok(None),
        Err(failure) => Err(ExecutorError::infrastructure(format!("cannot remove container {container}: {failure}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(image: Option<&str>) -> Config {
        Config {
            docker: Docker { program: "docker".into(), host: None },
            image: image.map(str::to_string),
            pids_limit: 1024,
            memory_limit: 1 << 30,
            memory_max: 2 << 30,
            lifetime_margin: 300,
            runner_id: "r1".into(),
        }
    }

    fn params(image: Option<&str>) -> StartParams {
        StartParams {
            session: "s1".into(),
            run: RunInfo { id: "run-9".into(), workflow: "ci".into(), repository: "a/b".into(), ..RunInfo::default() },
            image: image.map(str::to_string),
            resources: Resources { cpu: Some("500m".into()), memory: Some("512Mi".into()) },
            network: false,
            run_timeout_ms: None,
            timeout_ms: 1000,
            keep: false,
            services: Vec::new(),
        }
    }

    #[test]
    fn the_workflow_image_wins_over_the_default_and_one_is_needed() {
        assert_eq!(container_spec(&config(Some("d:1")), &params(Some("w:1"))).expect("spec").image, "w:1");
        assert_eq!(container_spec(&config(Some("d:1")), &params(None)).expect("spec").image, "d:1");
        let error = container_spec(&config(None), &params(None)).expect_err("no image");
        assert!(error.message.contains("--image"), "{}", error.message);
    }

    #[test]
    fn the_spec_carries_labels_and_limits() {
        let spec = container_spec(&config(None), &params(Some("w:1"))).expect("spec");
        assert_eq!(spec.name, "knotless-r1-s1");
        assert_eq!(spec.labels[0], ("dev.knotless.runner".to_string(), "r1".to_string()));
        assert_eq!(spec.labels[1], ("dev.knotless.session".to_string(), "s1".to_string()));
        assert_eq!((spec.cpus.as_deref(), spec.memory), (Some("0.5"), Some(536_870_912)));
    }

    #[test]
    fn a_container_has_the_default_memory_unless_its_workflow_asks_within_the_most() {
        let none = StartParams { resources: Resources::default(), ..params(Some("w:1")) };
        assert_eq!(container_spec(&config(None), &none).expect("spec").memory, Some(1 << 30));
        let most =
            StartParams { resources: Resources { memory: Some("2Gi".into()), cpu: None }, ..params(Some("w:1")) };
        assert_eq!(container_spec(&config(None), &most).expect("spec").memory, Some(2 << 30));
        let over =
            StartParams { resources: Resources { memory: Some("3Gi".into()), cpu: None }, ..params(Some("w:1")) };
        let error = container_spec(&config(None), &over).expect_err("over the most");
        assert!(error.message.contains("\"3Gi\"") && error.message.contains("memory-max"), "{}", error.message);
    }

    #[test]
    fn a_container_lives_its_run_timeout_plus_the_margin_unless_kept() {
        let timed = StartParams { run_timeout_ms: Some(3_600_001), ..params(Some("w:1")) };
        assert_eq!(container_spec(&config(None), &timed).expect("spec").lifetime_secs, Some(3601 + 300));
        let kept = StartParams { keep: true, ..timed };
        assert_eq!(container_spec(&config(None), &kept).expect("spec").lifetime_secs, None);
        assert_eq!(container_spec(&config(None), &params(Some("w:1"))).expect("spec").lifetime_secs, None);
    }

    #[test]
    fn paths_resolve_inside_the_container() {
        let session = Session {
            id: "s".into(),
            container: "c".into(),
            image: "i".into(),
            keep: false,
            tar: true,
            services: Vec::new(),
            network: None,
            pids: None,
        };
        assert_eq!(session.resolve("/outputs").expect("ok"), "/outputs");
        assert_eq!(session.resolve("src/x").expect("ok"), "/work/src/x");
        assert!(session.resolve("/work/../etc").is_err());
        assert!(session.resolve("").is_err());
    }
}
