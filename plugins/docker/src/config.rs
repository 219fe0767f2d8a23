//! The executor's configuration: the options `initialize` accepts, the engine probe that must
//! answer before any run, and the capabilities it reports.

use std::path::PathBuf;

use knotless_protocol::{Capabilities, ExecutorError, InitializeParams, Isolation};

use crate::argv;
use crate::docker::{Docker, Failure};

/// The options this executor takes, as the runner spells them.
const OPTIONS: &[&str] = &["docker", "image", "host", "pids-limit", "memory-limit", "memory-max", "lifetime-margin"];

/// `--pids-limit` of a container when the `pids-limit` option is not given.
pub const DEFAULT_PIDS_LIMIT: u32 = 1024;

/// A container's memory when its workflow asks for none and the `memory-limit` option is not
/// given.
pub const DEFAULT_MEMORY_LIMIT: &str = "8Gi";

/// The most memory a workflow's `resources` may ask for when the `memory-max` option is not
/// given.
pub const DEFAULT_MEMORY_MAX: &str = "16Gi";

/// Seconds a container outlives its run's timeout (for the outputs and the stop) when the
/// `lifetime-margin` option is not given.
pub const DEFAULT_LIFETIME_MARGIN: u64 = 300;

/// How long the engine may take to answer `docker version` in `initialize`.
const PROBE_WITHIN: std::time::Duration = std::time::Duration::from_secs(15);

/// What `initialize` accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The docker CLI.
    pub docker: Docker,
    /// The image of sessions whose workflow names none (`--image`).
    pub image: Option<String>,
    /// Each container's `--pids-limit`.
    pub pids_limit: u32,
    /// A container's memory, in bytes, when its workflow asks for none.
    pub memory_limit: u64,
    /// The most memory, in bytes, a workflow may ask for.
    pub memory_max: u64,
    /// Seconds a container lives past its run's timeout before it stops itself.
    pub lifetime_margin: u64,
    /// The runner's id: every container carries it as a label.
    pub runner_id: String,
}

/// How the runner spells an option on its command line.
pub fn flag(option: &str) -> String {
    match option {
        "image" => "--image".to_string(),
        other => format!("--executor-option {other}=..."),
    }
}

impl Config {
    /// Validates `initialize`'s options and the runner id (nothing is run).
    pub fn from_params(params: &InitializeParams) -> Result<Config, ExecutorError> {
        if let Some(unknown) = params.config.keys().find(|key| !OPTIONS.contains(&key.as_str())) {
            return Err(ExecutorError::configuration(format!(
                "unknown option --{unknown} for the docker executor: it takes {}",
                OPTIONS.iter().map(|option| flag(option)).collect::<Vec<_>>().join(", ")
            )));
        }
        check_name("runner id", &params.runner.id)?;
        let non_empty = |option: &str| -> Result<Option<String>, ExecutorError> {
            match params.config.get(option) {
                Some(value) if value.trim().is_empty() => Err(ExecutorError::configuration(format!(
                    "option {} of the docker executor is empty",
                    flag(option)
                ))),
                other => Ok(other.cloned()),
            }
        };
        let program = non_empty("docker")?.unwrap_or_else(|| "docker".to_string());
        let host = non_empty("host")?;
        let image = non_empty("image")?;
        let pids_limit = match non_empty("pids-limit")? {
            None => DEFAULT_PIDS_LIMIT,
            Some(text) => text.trim().parse::<u32>().ok().filter(|limit| *limit > 0).ok_or_else(|| {
                ExecutorError::configuration(format!(
                    "option {} of the docker executor must be a positive number, not {text:?}",
                    flag("pids-limit")
                ))
            })?,
        };
        let memory = |option: &str, default: &str| -> Result<u64, ExecutorError> {
            let text = non_empty(option)?.unwrap_or_else(|| default.to_string());
            knotless_protocol::sdk::quantity::memory_bytes(&text).map_err(|error| {
                ExecutorError::configuration(format!(
                    "option {} of the docker executor: {}",
                    flag(option),
                    error.message
                ))
            })
        };
        let (memory_limit, memory_max) =
            (memory("memory-limit", DEFAULT_MEMORY_LIMIT)?, memory("memory-max", DEFAULT_MEMORY_MAX)?);
        if memory_limit > memory_max {
            return Err(ExecutorError::configuration(format!(
                "option {} of the docker executor is over {} ({memory_limit} > {memory_max} bytes)",
                flag("memory-limit"),
                flag("memory-max")
            )));
        }
        let lifetime_margin = match non_empty("lifetime-margin")? {
            None => DEFAULT_LIFETIME_MARGIN,
            Some(text) => text.trim().parse::<u64>().map_err(|_| {
                ExecutorError::configuration(format!(
                    "option {} of the docker executor must be a number of seconds, not {text:?}",
                    flag("lifetime-margin")
                ))
            })?,
        };
        Ok(Config {
            docker: Docker { program: PathBuf::from(program), host },
            image,
            pids_limit,
            memory_limit,
            memory_max,
            lifetime_margin,
            runner_id: params.runner.id.clone(),
        })
    }

    /// Asks the engine for its version: a missing CLI or an engine that does not answer is a
    /// configuration error naming the option to fix.
    pub async fn probe(&self) -> Result<String, ExecutorError> {
        match self.docker.output(&argv::version(), PROBE_WITHIN).await {
            Ok(stdout) => Ok(String::from_utf8_lossy(&stdout).trim().to_string()),
            Err(Failure::Spawn(error)) => Err(ExecutorError::configuration(format!(
                "cannot run the docker CLI {}: {error}: install it (Debian's docker.io) or pass {}",
                self.docker.program.display(),
                flag("docker").replace("...", "PATH")
            ))),
            Err(failure) => Err(ExecutorError::configuration(format!(
                "no Docker engine answers at {}: start dockerd or pass {} ({failure})",
                self.docker.host_shown(),
                flag("host")
            ))),
        }
    }

    /// The name of a session's container: `knotless-<runner-id>-<session>`.
    pub fn container_name(&self, session: &str) -> String {
        format!("knotless-{}-{session}", self.runner_id)
    }
}

/// What the docker executor can do.
pub fn capabilities() -> Capabilities {
    Capabilities {
        isolation: Isolation::Container,
        caches: true,
        secrets: true,
        outputs: true,
        images: true,
        network_policy: true,
        services: true,
        max_sessions: None,
    }
}

/// Refuses an id that cannot be part of a container name: letters, digits, `-`, `_`, `.`,
/// starting with a letter or digit, at most 100 characters.
pub fn check_name(what: &str, name: &str) -> Result<(), ExecutorError> {
    let good = !name.is_empty()
        && name.len() <= 100
        && name.starts_with(|char: char| char.is_ascii_alphanumeric())
        && name.chars().all(|char| char.is_ascii_alphanumeric() || matches!(char, '-' | '_' | '.'));
    if good {
        Ok(())
    } else {
        Err(ExecutorError::configuration(format!(
            "{what} {name:?} cannot name a container: use letters, digits, '-', '_' and '.', starting with a \
             letter or digit"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(config: &[(&str, &str)]) -> InitializeParams {
        InitializeParams {
            protocol_versions: vec![1],
            runner: knotless_protocol::RunnerInfo { name: "knotless-run".into(), version: "0".into(), id: "r1".into() },
            config: config.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect(),
        }
    }

    #[test]
    fn defaults() {
        let config = Config::from_params(&params(&[])).expect("accepted");
        assert_eq!(config.docker, Docker { program: "docker".into(), host: None });
        assert_eq!((config.image.as_deref(), config.pids_limit), (None, 1024));
        assert_eq!((config.memory_limit, config.memory_max), (8 << 30, 16 << 30));
        assert_eq!(config.container_name("s1"), "knotless-r1-s1");
    }

    #[test]
    fn every_option_is_read() {
        let config = Config::from_params(&params(&[
            ("docker", "/usr/bin/docker"),
            ("image", "busybox:1"),
            ("host", "tcp://h:2375"),
            ("pids-limit", "64"),
            ("memory-limit", "512Mi"),
            ("memory-max", "1G"),
        ]))
        .expect("accepted");
        assert_eq!((config.memory_limit, config.memory_max), (512 << 20, 1_000_000_000));
        assert_eq!(config.docker, Docker { program: "/usr/bin/docker".into(), host: Some("tcp://h:2375".into()) });
        assert_eq!((config.image.as_deref(), config.pids_limit), (Some("busybox:1"), 64));
    }

    #[test]
    fn bad_options_are_named() {
        let error = Config::from_params(&params(&[("namespace", "x")])).expect_err("refused");
        // Named as a flag: the runner names it as the operator gave it (`--namespace`, or
        // `--executor-option namespace=...`).
        assert!(error.message.starts_with("unknown option --namespace for the docker executor"), "{}", error.message);
        let error = Config::from_params(&params(&[("pids-limit", "lots")])).expect_err("refused");
        assert!(error.message.contains("--executor-option pids-limit="), "{}", error.message);
        let error = Config::from_params(&params(&[("image", " ")])).expect_err("refused");
        assert!(error.message.contains("--image"), "{}", error.message);
        let error = Config::from_params(&params(&[("memory-limit", "lots")])).expect_err("refused");
        assert!(
            error.message.contains("--executor-option memory-limit=") && error.message.contains("\"lots\""),
            "{}",
            error.message
        );
        let error =
            Config::from_params(&params(&[("memory-limit", "2Gi"), ("memory-max", "1Gi")])).expect_err("refused");
        assert!(error.message.contains("memory-max"), "{}", error.message);
    }

    #[test]
    fn names() {
        for good in ["r1", "run-1.a_b"] {
            assert!(check_name("session", good).is_ok());
        }
        for bad in ["", "-x", ".x", "a/b", "a b", "é"] {
            assert!(check_name("session", bad).is_err(), "{bad:?}");
        }
    }
}
