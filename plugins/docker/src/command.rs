//! `command`: one step as `docker exec -i <container> sh -s` with its payload on stdin,
//! through the SDK's remote-shell step loop ([`knotless_protocol::sdk::remote`]): its output
//! streamed as it comes, its exit code read from the payload's sentinel, and the processes of
//! a timed-out, cancelled, lost or secret-bearing step swept out of the container (every
//! process there is not init, not there before the step and not a worker of what was).
//!
//! Killing the local `docker exec` kills nothing in the container. An exec that ends without
//! the sentinel is an infrastructure error naming what Docker says of the container.

use std::process::Stdio;
use std::time::Duration;

use knotless_protocol::sdk::Context;
use knotless_protocol::sdk::remote::{self, Exec, Shell, Usage};
use knotless_protocol::*;

use crate::DockerExecutor;
use crate::argv;
use crate::config::Config;
use crate::docker::tail;
use crate::session::Session;

/// How long `docker kill` of a container whose step cannot be swept may take: with the sweep's
/// bound, a step's answer still comes within the runner's grace after its deadline.
const KILL_WITHIN: Duration = Duration::from_secs(4);

/// How long `docker stats` of a container may take: it answers in about 1.5 s, and in 2 to 4 s
/// on a host a fork bomb and other work keep busy. Asked beside the sweep (bound to 5 s) and
/// awaited after it fails: with a `docker kill` (about half a second), a step's answer still
/// comes within the runner's grace (10 s) after its deadline.
const STATS_WITHIN: Duration = Duration::from_secs(7);

/// `command`.
pub async fn run(
    executor: &DockerExecutor,
    params: CommandParams,
    context: Context,
) -> Result<CommandResult, ExecutorError> {
    let config = executor.config.get()?;
    let session = executor.sessions.get(&params.session)?;
    let workdir = session.resolve(params.workdir.as_deref().unwrap_or("/work"))?;
    tracing::info!(session = %session.id, container = %session.container, image = %session.image,
        step = params.step, name = %params.name, "step started");
    // The pids its limit refused before the step: those it refuses during the step are the
    // step's doing.
    let refused_before = match &session.pids {
        Some(cgroup) => cgroup.read().await.map(|pids| pids.refused),
        None => None,
    };
    let container = Container { config: &config, session: &session, refused_before };
    remote::run_step(&container, &params, &workdir, &context).await
}

/// A session's container, reached through the docker CLI.
struct Container<'a> {
    config: &'a Config,
    session: &'a Session,
    /// How many times the container's pids limit refused a process before the step, when its
    /// cgroup can be read.
    refused_before: Option<u64>,
}

impl Shell for Container<'_> {
    async fn exec(&self, argv: Vec<String>) -> Result<Exec, ExecutorError> {
        let args = argv::exec(&self.session.container, &argv);
        let child = self.config.docker.command(&args).stdin(Stdio::piped()).spawn().map_err(|error| {
            ExecutorError::infrastructure(format!(
                "cannot run the docker CLI in container {}: {error}",
                self.session.container
            ))
        })?;
        Exec::from_child(child, "docker exec")
    }

    async fn lost(&self, step: &str, exited: Option<i32>, said: &[u8]) -> ExecutorError {
        let said = tail(said);
        let container = &self.session.container;
        let daemon_refused = crate::docker::Said::by_the_engine(&said);
        match self.config.docker.state(container).await {
            Ok(Some(state)) if state == "running" && daemon_refused => ExecutorError::infrastructure(format!(
                "docker exec of step {step} failed in container {container}: {said}"
            )),
            // The step's completion is proven by the sentinel only: an exec that ended
            // without it lost the stream, whatever its own exit code says.
            Ok(Some(state)) if state == "running" => ExecutorError::infrastructure(format!(
                "lost the exec stream of step {step} in container {container}: docker exec ended with {} before \
                 the step reported its exit code: {said}",
                exited.map_or("a signal".to_string(), |code| format!("exit code {code}"))
            )),
            Ok(state) => ExecutorError::infrastructure(format!(
                "container {container} of session {} is {} during step {step}: {said}",
                self.session.id,
                state.map_or("gone".to_string(), |state| format!("{state}, no longer running"))
            )),
            Err(failure) => ExecutorError::infrastructure(format!(
                "step {step} lost its docker exec and container {container} cannot be inspected ({failure}): {said}"
            )),
        }
    }

    async fn end_environment(&self, why: &str) {
        let container = &self.session.container;
        tracing::warn!(session = %self.session.id, %container, "{why}: killing the container");
        if let Err(failure) = self.config.docker.output(&argv::kill(container), KILL_WITHIN).await {
            tracing::error!(session = %self.session.id, %container, "cannot kill the container: {failure}");
        }
    }

    /// From the container's pids cgroup on this host, which also says whether the limit
    /// refused a process during the step; else from `docker stats`, which says only how many
    /// are in use (and takes seconds on a busy host).
    async fn usage(&self) -> Option<Usage> {
        let limit = u64::from(self.config.pids_limit);
        if let (Some(cgroup), Some(before)) = (&self.session.pids, self.refused_before)
            && let Some(pids) = cgroup.read().await
        {
            let refused = Some(pids.refused.saturating_sub(before));
            return Some(Usage { limit_name: "pids", used: pids.current, limit, refused });
        }
        let container = &self.session.container;
        let stats = self.config.docker.output(&argv::tasks(container), STATS_WITHIN).await.ok()?;
        let used = String::from_utf8_lossy(&stats).trim().parse().ok()?;
        Some(Usage { limit_name: "pids", used, limit, refused: None })
    }

    fn describe(&self) -> String {
        format!("container {}", self.session.container)
    }
}
