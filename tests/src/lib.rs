//! Shared support for the end-to-end tests: the built binaries, throwaway git repositories,
//! the runner's command line, and polling with a deadline instead of sleeping.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The folder of the workspace's built binaries (`target/debug`), found from the running test.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/debug/deps/e2e-HASH -> target/debug
    let deps = exe.parent().expect("deps folder");
    let dir = if deps.ends_with("deps") { deps.parent().expect("profile folder") } else { deps };
    dir.to_path_buf()
}

/// A built binary of the workspace; `make test` builds them before the tests run.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(path.exists(), "{} is not built: run `cargo build --workspace --bins` first", path.display());
    path
}

/// A throwaway folder with a git repository in it.
pub struct Repo {
    dir: tempfile::TempDir,
}

impl Repo {
    /// An empty repository on branch `main`.
    pub fn new() -> Repo {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Repo { dir };
        repo.git(&["init", "-q", "-b", "main"]);
        repo.git(&["config", "user.email", "test@knotless.invalid"]);
        repo.git(&["config", "user.name", "knotless test"]);
        repo
    }

    /// Its folder.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file (creating folders), with mode 0755 when `executable`.
    pub fn write(&self, relative: &str, text: &str) -> &Repo {
        let path = self.path().join(relative);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, text).expect("write");
        self
    }

    /// Writes `.knotless/workflows/NAME.yml`.
    pub fn workflow(&self, name: &str, yaml: &str) -> &Repo {
        self.write(&format!(".knotless/workflows/{name}.yml"), yaml)
    }

    /// Commits everything.
    pub fn commit(&self, message: &str) -> String {
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "-m", message]);
        String::from_utf8(self.git(&["rev-parse", "HEAD"]).stdout).expect("utf-8").trim().to_string()
    }

    /// Runs git in the repository and asserts it succeeded.
    pub fn git(&self, args: &[&str]) -> Output {
        let output = Command::new("git").arg("-C").arg(self.path()).args(args).output().expect("git runs");
        assert!(output.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        output
    }
}

impl Default for Repo {
    fn default() -> Self {
        Repo::new()
    }
}

/// `knotless-run` with arguments, ready to run.
pub fn knotless_run(args: &[&str]) -> Command {
    let mut command = Command::new(bin("knotless-run"));
    command.args(args).env("KNOTLESS_LOG", "info");
    command
}

/// What a finished command printed.
pub struct Ran {
    /// Its exit code (None when killed by a signal).
    pub code: Option<i32>,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl Ran {
    /// Both streams, for assertion messages.
    pub fn both(&self) -> String {
        format!("--- stdout\n{}\n--- stderr\n{}", self.stdout, self.stderr)
    }
}

/// Runs a command to its end.
pub fn ran(mut command: Command) -> Ran {
    let output = command.output().expect("the command runs");
    Ran {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// A wrapper script that runs the fake executor in `mode` the first time it is started and in
/// `ok` mode after that, so a test sees both a misbehaving executor and the fresh one that
/// replaces it.
pub fn fake_executor_once(dir: &Path, mode: &str) -> PathBuf {
    let fake = bin("knotless-executor-fake");
    let marker = dir.join(format!("{mode}.started"));
    let script = dir.join(format!("fake-{mode}"));
    let text = format!(
        "#!/bin/sh\nif [ -e '{marker}' ]; then exec '{fake}'; fi\ntouch '{marker}'\nexec '{fake}' --mode {mode}\n",
        marker = marker.display(),
        fake = fake.display()
    );
    std::fs::write(&script, text).expect("write wrapper");
    make_executable(&script);
    script
}

/// A wrapper script that always runs the fake executor in `mode`.
pub fn fake_executor(dir: &Path, mode: &str) -> PathBuf {
    let script = dir.join(format!("fake-always-{mode}"));
    let text = format!("#!/bin/sh\nexec '{}' --mode {mode}\n", bin("knotless-executor-fake").display());
    std::fs::write(&script, text).expect("write wrapper");
    make_executable(&script);
    script
}

fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Polls `condition` until it holds or `within` passes; returns whether it held.
pub fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The command lines of every process on this host, as text.
pub fn command_lines() -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return found };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        if let Ok(bytes) = std::fs::read(entry.path().join("cmdline")) {
            // A zombie has an empty command line; it holds nothing.
            if !bytes.is_empty() {
                found.push((pid, String::from_utf8_lossy(&bytes).replace('\0', " ")));
            }
        }
    }
    found
}

/// Whether any live process's command line contains `needle`.
pub fn process_running(needle: &str) -> bool {
    command_lines().iter().any(|(_, line)| line.contains(needle))
}
