//! Finding an executor's program: `--executor-plugin PATH`, or `knotless-executor-NAME` next to
//! the runner's own binary, in `--plugin-dir` (as `NAME` or `knotless-executor-NAME`), then on
//! `PATH`.

use std::path::{Path, PathBuf};

use anyhow::bail;

/// Where to look for executors.
#[derive(Debug, Clone)]
pub struct PluginSearch {
    /// The folder of the running `knotless-run` binary.
    pub beside: Option<PathBuf>,
    /// `--plugin-dir`.
    pub plugin_dir: PathBuf,
    /// The `PATH` variable.
    pub path_variable: Option<std::ffi::OsString>,
}

impl PluginSearch {
    /// The search of this process.
    pub fn from_environment(plugin_dir: PathBuf) -> PluginSearch {
        let beside = std::env::current_exe().ok().and_then(|exe| exe.parent().map(Path::to_path_buf));
        PluginSearch { beside, plugin_dir, path_variable: std::env::var_os("PATH") }
    }

    /// The candidates for executor `name`, in the order they are tried.
    pub fn candidates(&self, name: &str) -> Vec<PathBuf> {
        let program = format!("knotless-executor-{name}");
        let mut candidates = Vec::new();
        if let Some(beside) = &self.beside {
            candidates.push(beside.join(&program));
        }
        candidates.push(self.plugin_dir.join(name));
        candidates.push(self.plugin_dir.join(&program));
        if let Some(path) = &self.path_variable {
            candidates.extend(std::env::split_paths(path).map(|folder| folder.join(&program)));
        }
        candidates
    }

    /// The first candidate that is an executable file.
    pub fn find(&self, name: &str) -> anyhow::Result<PathBuf> {
        if name.is_empty() || name.contains('/') {
            bail!("--executor {name:?} is not an executor name; give a path with --executor-plugin");
        }
        let candidates = self.candidates(name);
        if let Some(found) = candidates.iter().find(|candidate| is_executable(candidate)) {
            return Ok(found.clone());
        }
        let tried = candidates.iter().take(3).map(|path| path.display().to_string()).collect::<Vec<_>>().join(", ");
        bail!(
            "no executor {name:?}: looked for knotless-executor-{name} at {tried} and on PATH; \
             install it, pass --plugin-dir, or give its path with --executor-plugin"
        )
    }
}

/// Whether `path` is a file someone may execute.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|metadata| metadata.is_file() && metadata.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_folder_comes_before_the_plugin_dir_and_path() {
        let search = PluginSearch {
            beside: Some("/opt/knotless/bin".into()),
            plugin_dir: "/usr/libexec/knotless".into(),
            path_variable: Some("/usr/local/bin:/usr/bin".into()),
        };
        let shown: Vec<_> = search.candidates("docker").iter().map(|path| path.display().to_string()).collect();
        assert_eq!(
            shown,
            [
                "/opt/knotless/bin/knotless-executor-docker",
                "/usr/libexec/knotless/docker",
                "/usr/libexec/knotless/knotless-executor-docker",
                "/usr/local/bin/knotless-executor-docker",
                "/usr/bin/knotless-executor-docker",
            ]
        );
    }

    #[test]
    fn a_missing_executor_names_the_flags_to_fix_it() {
        let search = PluginSearch { beside: None, plugin_dir: "/nonexistent".into(), path_variable: None };
        let error = search.find("nomad").expect_err("not found").to_string();
        assert!(error.contains("--executor-plugin") && error.contains("knotless-executor-nomad"), "{error}");
    }
}
