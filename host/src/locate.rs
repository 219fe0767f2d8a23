//! Finding an executor's program: `--executor-plugin PATH`, or `knotless-executor-NAME` next to
//! the runner's own binary, `NAME` in `../libexec/knotless` of the binary's folder (a user's
//! install: `~/.local/bin/knotless-run` finds `~/.local/libexec/knotless/NAME`), in
//! `--plugin-dir` (as `NAME` or `knotless-executor-NAME`), then on `PATH`.

use std::path::{Path, PathBuf};

use anyhow::bail;

use crate::printable;

/// The executors `make install` puts in `/usr/libexec/knotless`.
const INSTALLED: &[&str] = &["kubernetes", "docker", "shell"];

/// Where a prefix's executors are, beside its `bin`: `PREFIX/libexec/knotless`.
const LIBEXEC: &str = "libexec/knotless";

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
            if let Some(prefix) = beside.parent() {
                candidates.push(prefix.join(LIBEXEC).join(name));
            }
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
        let shown = |path: &Path| printable::name(&path.display().to_string()).into_owned();
        let program = format!("knotless-executor-{}", printable::name(name));
        let mut places = Vec::new();
        if let Some(beside) = &self.beside {
            places.push(format!("beside knotless-run in {}", shown(beside)));
            if let Some(prefix) = beside.parent() {
                places.push(format!("in {}", shown(&prefix.join(LIBEXEC))));
            }
        }
        places.push(format!("in --plugin-dir {} (as {} or {program})", shown(&self.plugin_dir), printable::name(name)));
        let path: Vec<String> = self
            .path_variable
            .iter()
            .flat_map(std::env::split_paths)
            // An empty entry is the current folder, as `candidates` reads it.
            .map(|folder| if folder.as_os_str().is_empty() { ".".to_string() } else { shown(&folder) })
            .collect();
        places.push(if path.is_empty() {
            "on PATH (empty)".to_string()
        } else {
            format!("on PATH ({})", path.join(":"))
        });
        let install = if INSTALLED.contains(&name) {
            format!(
                "`make install` (from the source) puts it in /usr/libexec/knotless, the default --plugin-dir, \
                 and `make install-user` in ~/.local/libexec/knotless; or copy {program} beside knotless-run, \
                 pass --plugin-dir DIR, or give its path with --executor-plugin PATH"
            )
        } else {
            format!(
                "install {program} in one of those folders, pass --plugin-dir DIR, or give its path with \
                 --executor-plugin PATH"
            )
        };
        bail!("no executor {:?}: looked for {program} {}; {install}", name, places.join(", "))
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
                "/opt/knotless/libexec/knotless/docker",
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
        assert!(!error.contains("make install"), "make install has no nomad executor: {error}");
    }

    #[test]
    fn a_missing_shell_executor_names_every_folder_searched_and_make_install() {
        let search = PluginSearch {
            beside: Some("/opt/alone".into()),
            plugin_dir: "/usr/libexec/knotless".into(),
            path_variable: Some("/usr/local/bin::/bin\nfake".into()),
        };
        let error = search.find("shell").expect_err("not found").to_string();
        assert_eq!(
            error,
            "no executor \"shell\": looked for knotless-executor-shell beside knotless-run in /opt/alone, \
             in /opt/libexec/knotless, \
             in --plugin-dir /usr/libexec/knotless (as shell or knotless-executor-shell), \
             on PATH (/usr/local/bin:.:/bin\\nfake); `make install` (from the source) puts it in \
             /usr/libexec/knotless, the default --plugin-dir, and `make install-user` in \
             ~/.local/libexec/knotless; or copy knotless-executor-shell beside \
             knotless-run, pass --plugin-dir DIR, or give its path with --executor-plugin PATH"
        );
        let search = PluginSearch { beside: None, plugin_dir: "/x\u{1b}[2J".into(), path_variable: None };
        let error = search.find("docker").expect_err("not found").to_string();
        assert!(error.contains("--plugin-dir /x\\x1b[2J") && error.contains("on PATH (empty)"), "{error}");
    }
}
