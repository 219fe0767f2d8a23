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

/// What docker said went wrong, by class: the one place this crate reads the CLI's and the
/// engine's words (the CLI exits 1 for them all, and the engine's API errors reach it as text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Said {
    /// A path in a container does not exist (`No such container:path`, `Could not find the
    /// file`).
    NoPath,
    /// The container does not exist, or runs no process an exec could join (`No such
    /// container`, `is not running`, `is restarting`, `is paused`).
    NoContainer,
    /// `docker inspect` found no object of that name (`No such object`).
    NoObject,
    /// The image is not on the engine (`No such image`, `Unable to find image`).
    NoImage,
    /// The name is another container's (`is already in use`).
    NameInUse,
    /// The network does not exist (`No such network`, `not found`).
    NoNetwork,
    /// The path is no folder (`not a directory`).
    NotAFolder,
    /// Something else.
    Other,
}

impl Said {
    /// The class of `stderr`, the most specific first (a missing path is not a missing
    /// container).
    pub fn of(stderr: &str) -> Said {
        let says = |words: &[&str]| words.iter().any(|word| stderr.contains(word));
        if says(&["No such container:path", "Could not find the file"]) {
            Said::NoPath
        } else if says(&["No such container", "is not running", "is restarting", "is paused"]) {
            Said::NoContainer
        } else if says(&["No such object"]) {
            Said::NoObject
        } else if says(&["No such image", "Unable to find image"]) {
            Said::NoImage
        } else if says(&["is already in use"]) {
            Said::NameInUse
        } else if says(&["No such network", "not found"]) {
            Said::NoNetwork
        } else if says(&["not a directory"]) {
            Said::NotAFolder
        } else {
            Said::Other
        }
    }

    /// Whether the engine itself refused (`Error response from daemon`, `OCI runtime`), rather
    /// than a program in the container failing: read in an exec's stderr, where the step's own
    /// lines are too.
    pub fn by_the_engine(stderr: &str) -> bool {
        stderr.contains("Error response from daemon") || stderr.contains("OCI runtime")
    }
}

impl Failure {
    /// The tail of docker's stderr, or empty.
    pub fn stderr(&self) -> &str {
        match self {
            Failure::Exited { stderr, .. } => stderr,
            _ => "",
        }
    }

    /// What docker said went wrong.
    pub fn said(&self) -> Said {
        Said::of(self.stderr())
    }

    /// Whether docker said the container (not a path in it) does not exist.
    pub fn no_such_container(&self) -> bool {
        self.said() == Said::NoContainer
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
            Err(failure) if matches!(failure.said(), Said::NoContainer | Said::NoObject) => Ok(None),
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

    /// Each class as docker 20.10 to 27 writes it.
    #[test]
    fn what_docker_said_is_read_into_its_class() {
        for (stderr, class) in [
            ("Error: No such container:path: c:/work/x", Said::NoPath),
            ("Error response from daemon: Could not find the file /x in container c", Said::NoPath),
            ("Error response from daemon: No such container: c", Said::NoContainer),
            ("Error response from daemon: Container c is paused, unpause the container before exec", Said::NoContainer),
            ("Error: No such object: c", Said::NoObject),
            ("Unable to find image 'x:1' locally", Said::NoImage),
            ("Error response from daemon: No such image: x:1", Said::NoImage),
            ("Error response from daemon: Conflict. The container name \"/c\" is already in use", Said::NameInUse),
            ("Error response from daemon: network n not found", Said::NoNetwork),
            ("Error response from daemon: No such network: n", Said::NoNetwork),
            ("tar: /x: not a directory", Said::NotAFolder),
            ("Error response from daemon: OCI runtime exec failed", Said::Other),
        ] {
            assert_eq!(Said::of(stderr), class, "{stderr}");
        }
        assert!(Said::by_the_engine("OCI runtime exec failed: exec failed: unable to start container process"));
        assert!(!Said::by_the_engine("sh: 1: no: not found"));
    }
}
