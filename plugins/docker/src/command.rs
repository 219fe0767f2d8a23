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
use knotless_protocol::sdk::remote::{self, Exec, Shell};
use knotless_protocol::*;

use crate::DockerExecutor;
use crate::argv;
use crate::config::Config;
use crate::docker::tail;
use crate::session::Session;

/// How long `docker kill` of a container whose step cannot be swept may take: with the sweep's
/// bound, a step's answer still comes within the runner's grace after its deadline.
const KILL_WITHIN: Duration = Duration::from_secs(4);

/// How long `docker stats` of a container may take (it answers in about 1.5 s).
const STATS_WITHIN: Duration = Duration::from_secs(3);

/// Whether `tasks` of a container with pids `limit` is at its limit: a fork bomb keeps it
/// within a task or two of it, as forks fail and processes end; within 2%, or 2 tasks.
pub fn at_the_limit(tasks: u32, limit: u32) -> bool {
    tasks.saturating_add((limit / 50).max(2)) >= limit
}

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
    remote::run_step(&Container { config: &config, session: &session }, &params, &workdir, &context).await
}

/// A session's container, reached through the docker CLI.
struct Container<'a> {
    config: &'a Config,
    session: &'a Session,
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
        let daemon_refused = said.contains("Error response from daemon") || said.contains("OCI runtime");
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

    async fn exhausted(&self) -> Option<String> {
        let container = &self.session.container;
        let stats = self.config.docker.output(&argv::tasks(container), STATS_WITHIN).await.ok()?;
        let tasks: u32 = String::from_utf8_lossy(&stats).trim().parse().ok()?;
        let limit = self.config.pids_limit;
        at_the_limit(tasks, limit)
            .then(|| format!("exhausted its pids limit of {limit} ({tasks} tasks in the container)"))
    }

    fn describe(&self) -> String {
        format!("container {}", self.session.container)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_container_within_two_percent_or_two_tasks_of_its_pids_limit_is_at_it() {
        assert!(super::at_the_limit(1024, 1024) && super::at_the_limit(1004, 1024));
        assert!(!super::at_the_limit(1003, 1024) && !super::at_the_limit(3, 1024));
        assert!(super::at_the_limit(62, 64) && !super::at_the_limit(61, 64));
    }
}
