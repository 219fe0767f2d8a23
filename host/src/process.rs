//! The executor's process: spawned in its own process group with a minimal environment, its
//! stderr forwarded into the runner's log and kept as a tail for error messages, and stopped
//! with an escalation (SIGTERM to the group, a grace period, SIGKILL).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Variables an executor inherits from the runner, with every `LC_*`; everything else is
/// withheld.
pub const INHERITED_VARIABLES: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "LANG",
    "TZ",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "KUBECONFIG",
    "KNOTLESS_LOG",
];

const TAIL_LINES: usize = 20;
const TAIL_LINE_CHARS: usize = 400;

/// How to start an executor.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// The executor's short name, for log prefixes.
    pub name: String,
    /// The program.
    pub path: PathBuf,
    /// More variables to pass through by name (`--executor-env`).
    pub pass_env: Vec<String>,
}

/// Sees each line an executor writes to stderr (the conformance suite looks for secrets there).
pub type StderrWatch = Arc<dyn Fn(&str) + Send + Sync>;

/// The last lines an executor wrote to stderr.
#[derive(Clone, Default)]
pub struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(|poison| poison.into_inner());
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The tail as one string, lines joined with ` | `, or a note that stderr was empty.
    pub fn render(&self) -> String {
        let lines = self.0.lock().unwrap_or_else(|poison| poison.into_inner());
        if lines.is_empty() {
            "nothing on stderr".to_string()
        } else {
            format!("stderr tail: {}", lines.iter().cloned().collect::<Vec<_>>().join(" | "))
        }
    }
}

/// A running executor process.
pub struct ExecutorProcess {
    name: String,
    child: tokio::sync::Mutex<Child>,
    pgid: Option<Pid>,
    tail: StderrTail,
    stderr_done: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl ExecutorProcess {
    /// Spawns the executor with piped stdin and stdout.
    pub fn spawn(spec: &ProcessSpec) -> anyhow::Result<(ExecutorProcess, ChildStdin, ChildStdout)> {
        ExecutorProcess::spawn_watched(spec, None)
    }

    /// Spawns the executor as [`ExecutorProcess::spawn`] does, and shows `watch` every line it
    /// writes to stderr, whole (up to [`MAX_STDERR_LINE`] bytes), not only those of the tail.
    pub fn spawn_watched(
        spec: &ProcessSpec,
        watch: Option<StderrWatch>,
    ) -> anyhow::Result<(ExecutorProcess, ChildStdin, ChildStdout)> {
        let mut command = Command::new(&spec.path);
        command.env_clear();
        for name in INHERITED_VARIABLES.iter().copied().chain(spec.pass_env.iter().map(String::as_str)) {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        for (name, value) in std::env::vars_os() {
            if name.to_str().is_some_and(|name| name.starts_with("LC_")) {
                command.env(name, value);
            }
        }
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        command.process_group(0).kill_on_drop(true);
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start executor {} at {}", spec.name, spec.path.display()))?;
        let pgid = child.id().and_then(|pid| i32::try_from(pid).ok()).map(Pid::from_raw);
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            anyhow::bail!("executor {} started without its pipes", spec.name);
        };
        let tail = StderrTail::default();
        let forward_tail = tail.clone();
        let name = spec.name.clone();
        let stderr_done = tokio::spawn(async move {
            read_lines(stderr, MAX_STDERR_LINE, |line| {
                tracing::info!(target: "knotless_run::executor", executor = %name, "[{name}] {line}");
                if let Some(watch) = &watch {
                    watch(&line);
                }
                forward_tail.push(line.chars().take(TAIL_LINE_CHARS).collect());
            })
            .await;
        });
        let process = ExecutorProcess {
            name: spec.name.clone(),
            child: tokio::sync::Mutex::new(child),
            pgid,
            tail,
            stderr_done: tokio::sync::Mutex::new(Some(stderr_done)),
        };
        Ok((process, stdin, stdout))
    }

    /// Its process id (it leads its own process group).
    pub fn pid(&self) -> Option<u32> {
        self.pgid.and_then(|pgid| u32::try_from(pgid.as_raw()).ok())
    }

    /// The last lines of its stderr.
    pub fn tail(&self) -> &StderrTail {
        &self.tail
    }

    /// Waits up to `within` for the process to exit on its own, then for its stderr to drain,
    /// so the tail is complete.
    pub async fn wait_exit(&self, within: Duration) -> Option<ExitStatus> {
        let status = {
            let mut child = self.child.lock().await;
            tokio::time::timeout(within, child.wait()).await.ok().and_then(Result::ok)
        };
        if status.is_some() {
            self.drain_stderr(Duration::from_secs(1)).await;
        }
        status
    }

    async fn drain_stderr(&self, within: Duration) {
        if let Some(handle) = self.stderr_done.lock().await.take() {
            let _ = tokio::time::timeout(within, handle).await;
        }
    }

    /// SIGTERM to the process group, `grace` to exit, then SIGKILL. Returns how it ended.
    pub async fn terminate(&self, grace: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.try_status().await {
            self.kill_group(Signal::SIGKILL);
            return Some(status);
        }
        tracing::warn!(executor = %self.name, "stopping executor {}: SIGTERM to its process group", self.name);
        self.kill_group(Signal::SIGTERM);
        if let Some(status) = self.wait_exit(grace).await {
            // Whatever else of the group is left goes too.
            self.kill_group(Signal::SIGKILL);
            return Some(status);
        }
        tracing::warn!(executor = %self.name, "executor {} ignored SIGTERM for {:?}: SIGKILL", self.name, grace);
        self.kill_group(Signal::SIGKILL);
        self.wait_exit(Duration::from_secs(5)).await
    }

    async fn try_status(&self) -> Option<ExitStatus> {
        self.child.lock().await.try_wait().ok().flatten()
    }

    fn kill_group(&self, signal: Signal) {
        if let Some(pgid) = self.pgid {
            let _ = killpg(pgid, signal);
        }
    }
}

/// Describes an exit status for a message: `exit status 3`, `signal 9 (SIGKILL)`.
pub fn describe_status(status: Option<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        None => "still running".to_string(),
        Some(status) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(signal)) => match Signal::try_from(signal) {
                Ok(name) => format!("signal {signal} ({name})"),
                Err(_) => format!("signal {signal}"),
            },
            (None, None) => "an unknown status".to_string(),
        },
    }
}

/// The longest stderr line of an executor the runner keeps: the rest of a longer line is
/// dropped, with a marker, so an executor cannot make the runner hold its whole stderr.
pub const MAX_STDERR_LINE: usize = 8 << 10;

/// Reads `reader` to its end, giving `each` line (invalid UTF-8 replaced), each cut at `max`
/// bytes with a marker saying how much was dropped. Memory stays within `max` and the reader's
/// buffer, however long a line is.
pub async fn read_lines(reader: impl AsyncRead + Unpin, max: usize, mut each: impl FnMut(String)) {
    let mut reader = BufReader::new(reader);
    let mut line = Vec::new();
    let mut dropped = 0usize;
    loop {
        let buffer = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(buffer) => buffer,
        };
        let (chunk, ended) = match buffer.iter().position(|&byte| byte == b'\n') {
            Some(end) => (&buffer[..end], true),
            None => (buffer, false),
        };
        let room = max.saturating_sub(line.len()).min(chunk.len());
        line.extend_from_slice(&chunk[..room]);
        dropped += chunk.len() - room;
        let used = chunk.len() + usize::from(ended);
        reader.consume(used);
        if ended {
            each(finish_line(&mut line, &mut dropped));
        }
    }
    if !line.is_empty() || dropped > 0 {
        each(finish_line(&mut line, &mut dropped));
    }
}

fn finish_line(line: &mut Vec<u8>, dropped: &mut usize) -> String {
    let mut text = String::from_utf8_lossy(line).into_owned();
    if *dropped > 0 {
        text.push_str(&format!(" [line cut: {} more bytes dropped]", *dropped));
    }
    line.clear();
    *dropped = 0;
    text
}

#[cfg(test)]
mod line_tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_cut_at_the_bound_and_invalid_utf8_does_not_stop_reading() {
        let mut input = b"short\n\xffbad\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 100_000));
        input.extend_from_slice(b"\nlast");
        let mut lines = Vec::new();
        read_lines(&input[..], 1000, |line| lines.push(line)).await;
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert_eq!(lines[0], "short");
        assert_eq!(lines[1], "\u{fffd}bad");
        assert_eq!(lines[2], format!("{} [line cut: 99000 more bytes dropped]", "x".repeat(1000)));
        assert_eq!(lines[3], "last");
    }
}
