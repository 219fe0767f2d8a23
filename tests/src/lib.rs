//! Shared support of the end-to-end tests: the built binaries, [`Repo`] makes git repositories
//! with the real git CLI, [`Runner`] spawns the built `knotless-run` daemon and reads its checks,
//! [`knotless_run`] runs its other commands, [`cluster::FakeCluster`] is a fake Kubernetes
//! cluster, and waits poll with a deadline instead of sleeping.

pub mod browser;
pub mod compat;

/// The fake Kubernetes cluster, from the fake API server's crate.
pub use knotless_fake_apiserver as cluster;
pub use knotless_testkit::processes::command_lines;
pub use knotless_testkit::{bin, bin_dir, wait_until};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a test waits for something the runner does.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Polls `probe` until it gives a value or the deadline passes.
pub fn eventually<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(started.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A git repository with a work tree, on branch `main`.
pub struct Repo {
    /// Its folder.
    pub dir: PathBuf,
    _temporary: Option<tempfile::TempDir>,
}

impl Repo {
    /// A new repository at `dir`.
    pub fn init(dir: &Path) -> Repo {
        std::fs::create_dir_all(dir).expect("create the repository folder");
        let repo = Repo { dir: dir.to_path_buf(), _temporary: None };
        repo.git(&["init", "-q", "-b", "main"]);
        repo
    }

    /// A new repository in a temporary folder, removed with it.
    pub fn new() -> Repo {
        let temporary = tempfile::tempdir().expect("tempdir");
        let mut repo = Repo::init(temporary.path());
        repo._temporary = Some(temporary);
        repo
    }

    /// Its folder.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes `.knotless/workflows/NAME.yml`.
    pub fn workflow(&self, name: &str, yaml: &str) -> &Repo {
        self.write(&format!(".knotless/workflows/{name}.yml"), yaml)
    }

    /// Runs git in the repository and returns its trimmed stdout.
    pub fn git(&self, args: &[&str]) -> String {
        let output = Command::new("git")
            .arg("-C")
            .arg(&self.dir)
            .args(args)
            .env("GIT_AUTHOR_NAME", "test")
            .env("GIT_AUTHOR_EMAIL", "test@example.com")
            .env("GIT_COMMITTER_NAME", "test")
            .env("GIT_COMMITTER_EMAIL", "test@example.com")
            .output()
            .expect("run git");
        assert!(output.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// Writes a file (creating its folders).
    pub fn write(&self, path: &str, text: &str) -> &Repo {
        let path = self.dir.join(path);
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("create folders");
        std::fs::write(path, text).expect("write a file");
        self
    }

    /// Removes a file.
    pub fn remove(&self, path: &str) -> &Repo {
        std::fs::remove_file(self.dir.join(path)).expect("remove a file");
        self
    }

    /// Commits everything and returns the commit id.
    pub fn commit(&self, message: &str) -> String {
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "--allow-empty", "-m", message]);
        self.git(&["rev-parse", "HEAD"])
    }

    /// The repository's path as a string.
    pub fn url(&self) -> String {
        self.dir.to_string_lossy().into_owned()
    }
}

/// A running `knotless-run` daemon.
pub struct Runner {
    child: Option<Child>,
    /// Its state folder.
    pub state: PathBuf,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl Runner {
    /// Starts the daemon with `args` (the state folder is added).
    pub fn start(state: &Path, args: &[&str]) -> Runner {
        Runner::start_with_env(state, args, &[])
    }

    /// Starts the daemon with `args` and the variables `env` set in its environment.
    pub fn start_with_env(state: &Path, args: &[&str], env: &[(&str, &str)]) -> Runner {
        std::fs::create_dir_all(state).expect("create the state folder");
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let number = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = state.with_file_name(format!("runner-{number}.log"));
        let stderr = std::fs::File::create(&log).expect("create the runner's log");
        let child = Command::new(bin("knotless-run"))
            .args(args)
            .arg("--state")
            .arg(state)
            .env("KNOTLESS_LOG_FORMAT", "json")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn knotless-run");
        Runner { child: Some(child), state: state.to_path_buf(), log }
    }

    /// Runs a `knotless-run` subcommand against this state folder.
    pub fn command(&self, args: &[&str]) -> std::process::Output {
        Command::new(bin("knotless-run")).args(args).arg("--state").arg(&self.state).output().expect("run knotless-run")
    }

    /// The checks of `repo`, optionally of one revision, as JSON records.
    pub fn checks(&self, repo: &str, rev: Option<&str>) -> Vec<Value> {
        let mut args = vec!["checks", repo, "--json"];
        args.extend(rev);
        let output = self.command(&args);
        if !output.status.success() {
            return Vec::new();
        }
        serde_json::from_slice::<Vec<Value>>(&output.stdout).expect("checks --json prints JSON")
    }

    /// Waits until `repo` at `rev` has `count` checks, all final, and returns them.
    pub fn final_checks(&self, repo: &str, rev: &str, count: usize) -> Vec<Value> {
        eventually(&format!("{count} final check(s) of {rev}"), || {
            let checks = self.checks(repo, Some(rev));
            let done = checks.len() == count && checks.iter().all(is_final);
            done.then_some(checks)
        })
    }

    /// A run's log.
    pub fn run_log(&self, run_id: &str) -> String {
        String::from_utf8_lossy(&self.command(&["logs", run_id]).stdout).into_owned()
    }

    /// Tells the daemon to look at `repo` now.
    pub fn notify(&self, repo: &str) {
        let output = self.command(&["notify", repo]);
        assert!(output.status.success(), "notify: {}", String::from_utf8_lossy(&output.stderr));
    }

    /// The status page's base address (`http://127.0.0.1:PORT/`), as the daemon logged it.
    pub fn http_base(&self) -> String {
        eventually("the status page's address in the runner's log", || {
            let stderr = self.stderr();
            let at = stderr.find("status page at http://")? + "status page at ".len();
            let address: String = stderr[at..].chars().take_while(|c| !c.is_whitespace() && *c != '"').collect();
            address.ends_with('/').then_some(address)
        })
    }

    /// The daemon's stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends a signal.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let child = self.child.as_ref().expect("a running child");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal the runner");
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| child.try_wait().expect("wait").is_none())
    }

    /// Waits for it to exit.
    pub fn wait(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("a running child");
        let status = eventually("the runner to exit", || child.try_wait().expect("wait"));
        self.child = None;
        status
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether a check record is final.
pub fn is_final(check: &Value) -> bool {
    !matches!(check["status"].as_str(), Some("queued" | "running"))
}

/// The check of `workflow` among `checks`.
pub fn by_workflow<'a>(checks: &'a [Value], workflow: &str) -> &'a Value {
    checks
        .iter()
        .find(|check| check["workflow"] == workflow)
        .unwrap_or_else(|| panic!("no check of {workflow} in {checks:#?}"))
}

/// The exit codes of a check's steps (`None` for a step that did not exit).
pub fn exit_codes(check: &Value) -> Vec<Option<i64>> {
    check["steps"]
        .as_array()
        .map(|steps| steps.iter().map(|step| step["exit_code"].as_i64()).collect())
        .unwrap_or_default()
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
    // No defaults file of the machine's user changes what a test runs; a test that wants one
    // sets its own.
    command.env("XDG_CONFIG_HOME", std::env::temp_dir().join("knotless-tests-no-config"));
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

/// Whether any live process's command line contains `needle`.
pub fn process_running(needle: &str) -> bool {
    command_lines().iter().any(|(_, line)| line.contains(needle))
}
