//! The one way this crate runs the docker CLI: the program from the configuration, `DOCKER_HOST`
//! from the `host` option, stdin closed unless asked, and failures that carry docker's stderr.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// The default engine address, shown in errors when no host is configured.
pub const DEFAULT_HOST: &str = "unix:///var/run/docker.sock";

/// How long a short docker call (inspect, mkdir, rm, ps) may take before it is a failure.
pub const SHORT_CALL: Duration = Duration::from_secs(60);

/// The docker CLI, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Docker {
    /// The program (`docker`, looked up on `PATH`, or a path).
    pub program: PathBuf,
    /// `DOCKER_HOST` for the CLI, when the `host` option was given.
    pub host: Option<String>,
}

/// Why a docker call failed.
#[derive(Debug)]
pub enum Failure {
    /// The program could not be started.
    Spawn(std::io::Error),
    /// It ran and failed.
    Exited {
        /// Its exit code, if it exited.
        code: Option<i32>,
        /// The tail of its stderr, on one line.
        stderr: String,
    },
    /// It did not end within its time.
    TimedOut(Duration),
}

impl Failure {
    /// The tail of docker's stderr, or empty.
    pub fn stderr(&self) -> &str {
        match self {
            Failure::Exited { stderr, .. } => stderr,
            _ => "",
        }
    }

    /// Whether docker said the container (not a path in it) does not exist.
    pub fn no_such_container(&self) -> bool {
        let stderr = self.stderr();
        (stderr.contains("No such container") && !stderr.contains("No such container:path"))
            || stderr.contains("is not running")
            || stderr.contains("is restarting")
            || stderr.contains("is paused")
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Spawn(error) => write!(formatter, "cannot run the docker CLI: {error}"),
            Failure::Exited { code: Some(code), stderr } => write!(formatter, "docker exited with {code}: {stderr}"),
            Failure::Exited { code: None, stderr } => write!(formatter, "docker was killed: {stderr}"),
            Failure::TimedOut(after) => write!(formatter, "docker did not answer within {} s", after.as_secs()),
        }
    }
}

impl Docker {
    /// The engine's address, for messages.
    pub fn host_shown(&self) -> String {
        self.host
            .clone()
            .or_else(|| std::env::var("DOCKER_HOST").ok().filter(|host| !host.is_empty()))
            .unwrap_or_else(|| DEFAULT_HOST.to_string())
    }

    /// A docker command with these arguments: stdin closed, stdout and stderr piped, killed
    /// when dropped.
    pub fn command(&self, args: &[String]) -> Command {
        let mut command = Command::new(&self.program);
        command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        if let Some(host) = &self.host {
            command.env("DOCKER_HOST", host);
        }
        command
    }

    /// Runs docker to its end within `within`; returns its stdout.
    pub async fn output(&self, args: &[String], within: Duration) -> Result<Vec<u8>, Failure> {
        self.output_with(args, &std::collections::BTreeMap::new(), within).await
    }

    /// Runs docker as [`Docker::output`] does, with `env` in the CLI's own environment (the
    /// values of `--env NAME` arguments, which never hold a value themselves).
    pub async fn output_with(
        &self,
        args: &[String],
        env: &std::collections::BTreeMap<String, String>,
        within: Duration,
    ) -> Result<Vec<u8>, Failure> {
        let child = self.command(args).envs(env).spawn().map_err(Failure::Spawn)?;
        let output = match tokio::time::timeout(within, child.wait_with_output()).await {
            Ok(output) => output.map_err(Failure::Spawn)?,
            Err(_) => return Err(Failure::TimedOut(within)),
        };
        if output.status.success() {
            Ok(output.stdout)
        } else {
            Err(Failure::Exited { code: output.status.code(), stderr: tail(&output.stderr) })
        }
    }

    /// A container's state (`running`, `exited`, ...), or `None` when it does not exist.
    pub async fn state(&self, container: &str) -> Result<Option<String>, Failure> {
        match self.output(&crate::argv::state(container), SHORT_CALL).await {
            Ok(stdout) => Ok(Some(String::from_utf8_lossy(&stdout).trim().to_string())),
            Err(failure) if failure.stderr().contains("No such") => Ok(None),
            Err(failure) => Err(failure),
        }
    }
}

pub use knotless_protocol::sdk::tail;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_container_is_told_from_a_missing_path() {
        let failure = |stderr: &str| Failure::Exited { code: Some(1), stderr: stderr.into() };
        assert!(failure("Error response from daemon: No such container: c").no_such_container());
        assert!(!failure("Error: No such container:path: c:/x").no_such_container());
        assert!(failure("Error response from daemon: Container abc is not running").no_such_container());
    }
}
