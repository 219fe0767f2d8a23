//! The executor's configuration: the options `initialize` accepts, and the capabilities it reports.

use std::path::{Path, PathBuf};

use knotless_protocol::{Capabilities, ExecutorError, InitializeParams, Isolation};

/// The options this executor takes, as the runner spells them (`--work-dir`).
const OPTIONS: &[&str] = &["work-dir"];

/// `PATH` for steps when the executor itself has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What `initialize` accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The base folder for sessions (`--work-dir`).
    pub work_dir: PathBuf,
    /// The runner's id: every session folder lives under `<work_dir>/<runner_id>/`.
    pub runner_id: String,
    /// `PATH` given to steps: the executor's own, or [`DEFAULT_PATH`].
    pub path: String,
    /// The variables of the executor's own environment that steps get ([`HOST_VARIABLES`]
    /// and every `LC_*`), so that a developer's tools find their homes and settings.
    pub host_env: Vec<(String, String)>,
}

/// The variables of the user's environment a step gets, besides `PATH` and every `LC_*`:
/// what tools look for their configuration and caches by (`rustup` and `cargo` under `HOME`,
/// a shell's settings). Never `TERM`: the step's output is a pipe, not the user's terminal, and
/// a tool told it has one (`tput`, `cargo fmt`) writes that terminal's sequences into the log.
pub const HOST_VARIABLES: &[&str] = &["HOME", "USER", "LOGNAME", "SHELL", "LANG", "TZ"];

/// The executor's own values of [`HOST_VARIABLES`] and `LC_*`, the empty ones left out.
fn host_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, value)| {
            !value.is_empty() && (HOST_VARIABLES.contains(&name.as_str()) || name.starts_with("LC_"))
        })
        .collect()
}

impl Config {
    /// Validates `initialize`'s options and the runner id, and creates the runner's folder.
    pub fn from_params(params: &InitializeParams) -> Result<Config, ExecutorError> {
        if let Some(unknown) = params.config.keys().find(|key| !OPTIONS.contains(&key.as_str())) {
            return Err(ExecutorError::configuration(format!("unknown option --{unknown} for the shell executor")));
        }
        check_component("runner id", &params.runner.id)?;
        let work_dir = match params.config.get("work-dir") {
            Some(dir) if dir.is_empty() => {
                return Err(ExecutorError::configuration("option --work-dir of the shell executor is empty"));
            }
            Some(dir) => PathBuf::from(dir),
            None => default_work_dir(),
        };
        if !work_dir.is_absolute() {
            return Err(ExecutorError::configuration(format!(
                "option --work-dir of the shell executor must be an absolute path, not {}",
                work_dir.display()
            )));
        }
        let runner_dir = work_dir.join(&params.runner.id);
        create_private_dir_all(&runner_dir).map_err(|error| {
            ExecutorError::configuration(format!(
                "cannot create the shell executor's folder {}: {error}",
                runner_dir.display()
            ))
        })?;
        // Canonical, so that the paths handed to the runner and the checks on upload paths agree.
        let work_dir = work_dir.canonicalize().map_err(|error| {
            ExecutorError::configuration(format!("cannot resolve the work folder {}: {error}", work_dir.display()))
        })?;
        let path =
            std::env::var("PATH").ok().filter(|path| !path.is_empty()).unwrap_or_else(|| DEFAULT_PATH.to_string());
        Ok(Config { work_dir, runner_id: params.runner.id.clone(), path, host_env: host_env() })
    }

    /// `<work_dir>/<runner_id>`: this runner's sessions, and nothing else.
    pub fn runner_dir(&self) -> PathBuf {
        self.work_dir.join(&self.runner_id)
    }
}

/// What the shell executor can do.
pub fn capabilities() -> Capabilities {
    Capabilities {
        isolation: Isolation::None,
        caches: true,
        secrets: true,
        outputs: true,
        images: false,
        network_policy: false,
        services: false,
        max_sessions: None,
    }
}

/// `$TMPDIR/knotless-shell`, or `/tmp/knotless-shell`.
fn default_work_dir() -> PathBuf {
    let tmp = std::env::var_os("TMPDIR").filter(|tmp| !tmp.is_empty()).map(PathBuf::from);
    tmp.filter(|tmp| tmp.is_absolute()).unwrap_or_else(|| PathBuf::from("/tmp")).join("knotless-shell")
}

/// Whether a name is one safe path component: letters, digits, `-`, `_`, `.`, not starting
/// with `.`.
pub fn is_safe_component(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.chars().all(|char| char.is_ascii_alphanumeric() || matches!(char, '-' | '_' | '.'))
}

/// Refuses a name that is not [`is_safe_component`] with a configuration error.
pub fn check_component(what: &str, name: &str) -> Result<(), ExecutorError> {
    if is_safe_component(name) {
        Ok(())
    } else {
        Err(ExecutorError::configuration(format!(
            "{what} {name:?} is not a safe folder name: use letters, digits, '-', '_' and '.', not starting with '.'"
        )))
    }
}

/// Creates a folder and its parents, the new ones private to this user (mode 0700).
pub fn create_private_dir_all(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_components() {
        for good in ["run-1", "a_b.c", "X9"] {
            assert!(is_safe_component(good), "{good}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", "é", "a\0"] {
            assert!(!is_safe_component(bad), "{bad:?}");
        }
    }

    fn params(config: &[(&str, &str)], runner: &str) -> InitializeParams {
        InitializeParams {
            protocol_versions: vec![1],
            runner: knotless_protocol::RunnerInfo {
                name: "knotless-run".to_string(),
                version: "0".to_string(),
                id: runner.to_string(),
            },
            config: config.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect(),
        }
    }

    #[test]
    fn an_unknown_option_is_named() {
        let error = Config::from_params(&params(&[("foo", "1")], "r")).expect_err("refused");
        assert_eq!(error.message, "unknown option --foo for the shell executor");
        assert_eq!(error.kind, knotless_protocol::ErrorKind::Configuration);
    }

    #[test]
    fn a_bad_runner_id_or_a_relative_work_dir_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let work = dir.path().to_string_lossy().into_owned();
        assert!(Config::from_params(&params(&[("work-dir", &work)], "../up")).is_err());
        assert!(Config::from_params(&params(&[("work-dir", "relative")], "r")).is_err());
        let config = Config::from_params(&params(&[("work-dir", &work)], "r")).expect("accepted");
        assert!(config.runner_dir().is_dir());
    }
}
