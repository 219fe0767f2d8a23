//! The step reaper: a small process between the executor and each step's `/bin/sh`, which
//! finds every process the step starts, however it hides, and kills them on request.
//!
//! It is this executor's own binary started again as `knotless-executor-shell --step-reaper
//! SCRIPT` (see [`serve`]). It makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so
//! that every orphan of the step (a `setsid` daemon, a double fork) becomes its child instead
//! of init's: the step's processes are exactly the reaper's descendants. It runs
//! `/bin/sh -ec SCRIPT` with its own environment (the step's variables and secrets, which
//! never reach an argv), its stdout and stderr (the step's pipes) and stdin from
//! `/dev/null`.
//!
//! Its stdin is one end of a Unix socket pair; the executor holds the other ([`Reaper`]). On
//! it, one line per message:
//!
//! - reaper to executor: `exit CODE` when the step's shell ended (128 + N for signal N),
//!   `killed PID...` after a kill, `stuck PID...` before it for processes that outlived
//!   SIGKILL, and `gone` just before it exits, once the shell has ended and no descendant is
//!   left;
//! - executor to reaper: `kill GRACE_MS`: SIGTERM to every descendant, SIGKILL after the
//!   grace period, until none is left.
//!
//! When the socket ends (the executor died or dropped the step) the reaper kills every
//! descendant and exits. When the reaper itself dies (a step may `kill -9 $PPID`), its
//! orphans come back to the executor, also a subreaper, which kills them
//! ([`kill_strays`]).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, ChildStderr, ChildStdout, Command};

use crate::processes::{self, AFTER_KILL, GRACE, Killed, Process};

/// The argument that starts the executor's binary as a step reaper.
pub const FLAG: &str = "--step-reaper";

/// The longest line either side sends; a longer one is a broken peer.
const MAX_LINE: usize = 1 << 20;

/// Runs as the step reaper of one step: `args` are the binary's arguments after [`FLAG`],
/// the step's script alone. Returns once the step's shell has ended and no descendant is
/// left, or after killing them all when the executor is gone.
pub fn serve(args: &[OsString]) -> ExitCode {
    let [script] = args else {
        eprintln!("usage: knotless-executor-shell {FLAG} SCRIPT (started by the shell executor, not by hand)");
        return ExitCode::from(2);
    };
    let failed = match Supervisor::start(script) {
        Ok(mut supervisor) => match supervisor.run() {
            Ok(()) => return ExitCode::SUCCESS,
            Err(error) => {
                // The socket broke (the executor died): nobody may be left with the secrets.
                supervisor.kill(GRACE);
                error
            }
        },
        Err(error) => error,
    };
    // Stderr is the step's: the message lands in the step's log.
    eprintln!("knotless step reaper: {failed}");
    ExitCode::FAILURE
}

/// The reaper's state.
struct Supervisor {
    control: UnixStream,
    signals: SignalFd,
    shell: Pid,
    shell_done: bool,
    pending: Vec<u8>,
}

impl Supervisor {
    fn start(script: &OsString) -> std::io::Result<Supervisor> {
        nix::sys::prctl::set_child_subreaper(true)?;
        // SIGCHLD is read from a signalfd; the shell gets an empty mask back from std.
        let mut mask = SigSet::empty();
        mask.add(Signal::SIGCHLD);
        mask.thread_block()?;
        let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
        let control = UnixStream::from(std::io::stdin().as_fd().try_clone_to_owned()?);
        let shell = std::process::Command::new("/bin/sh")
            .arg("-ec")
            .arg(script)
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()?;
        Ok(Supervisor {
            control,
            signals,
            shell: Pid::from_raw(shell.id() as i32),
            shell_done: false,
            pending: Vec::new(),
        })
    }

    fn run(&mut self) -> std::io::Result<()> {
        loop {
            let (signalled, commanded) = {
                let mut fds = [
                    PollFd::new(self.signals.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.control.as_fd(), PollFlags::POLLIN),
                ];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) => {}
                    Err(Errno::EINTR) => continue,
                    Err(error) => return Err(error.into()),
                }
                let ready = |fd: &PollFd| fd.revents().is_some_and(|events| !events.is_empty());
                (ready(&fds[0]), ready(&fds[1]))
            };
            if signalled {
                while let Ok(Some(_)) = self.signals.read_signal() {}
            }
            if commanded && !self.command()? {
                // The executor is gone: nobody may read the step's processes' secrets any more.
                self.kill(GRACE);
                return Ok(());
            }
            if !self.reap()? {
                self.send("gone")?;
                return Ok(());
            }
        }
    }

    /// Reads and obeys what the executor sent; `false` once the socket has ended.
    fn command(&mut self) -> std::io::Result<bool> {
        let mut buffer = [0u8; 256];
        let read = match self.control.read(&mut buffer) {
            Ok(0) => return Ok(false),
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => return Ok(true),
            Err(_) => return Ok(false),
        };
        self.pending.extend_from_slice(&buffer[..read]);
        while let Some(end) = self.pending.iter().position(|&byte| byte == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line[..end]).into_owned();
            match line.strip_prefix("kill ").and_then(|grace| grace.parse::<u64>().ok()) {
                Some(grace) => {
                    let killed = self.kill(Duration::from_millis(grace));
                    if !killed.stuck.is_empty() {
                        self.send(&format!("stuck{}", pids(&killed.stuck)))?;
                    }
                    self.send(&format!("killed{}", pids(&killed.killed)))?;
                }
                None => return Ok(false),
            }
        }
        if self.pending.len() > MAX_LINE {
            return Ok(false);
        }
        Ok(true)
    }

    /// Kills every descendant; reports the shell's end on the way if it ends then.
    fn kill(&mut self, grace: Duration) -> Killed {
        let own = std::process::id() as i32;
        let mut ended = None;
        let shell = self.shell;
        let shell_done = self.shell_done;
        let killed = processes::kill_all(
            || processes::tree(processes::children(own)),
            || {
                // Collect every exited child, the shell's status kept for its `exit` line.
                while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                    match status {
                        WaitStatus::StillAlive => break,
                        status if !shell_done && status.pid() == Some(shell) => ended = exit_code(status),
                        _ => {}
                    }
                }
            },
            grace,
        );
        if let Some(code) = ended {
            self.shell_done = true;
            let _ = self.send(&format!("exit {code}"));
        }
        killed
    }

    /// Collects every exited child, sending `exit` when the shell ends; `false` once the
    /// shell has ended and no child is left.
    fn reap(&mut self) -> std::io::Result<bool> {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => return Ok(true),
                Ok(status) => {
                    if !self.shell_done
                        && status.pid() == Some(self.shell)
                        && let Some(code) = exit_code(status)
                    {
                        self.shell_done = true;
                        self.send(&format!("exit {code}"))?;
                    }
                }
                Err(Errno::ECHILD) => return Ok(!self.shell_done),
                Err(Errno::EINTR) => {}
                Err(error) => return Err(error.into()),
            }
        }
    }

    fn send(&mut self, line: &str) -> std::io::Result<()> {
        self.control.write_all(format!("{line}\n").as_bytes())
    }
}

/// The exit code the protocol reports for a status: the code, or 128 + N for signal N.
fn exit_code(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, signal, _) => Some(128 + signal as i32),
        _ => None,
    }
}

fn pids(processes: &BTreeSet<Process>) -> String {
    processes.iter().map(|process| format!(" {}", process.pid)).collect()
}

/// The reapers this process runs, by pid: every other child of the executor is an orphan of
/// a step whose reaper died. One set for the whole process, however many executors it
/// serves (the tests serve several).
static REAPERS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn reapers() -> MutexGuard<'static, BTreeSet<i32>> {
    REAPERS.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// Makes this process a child subreaper, so that what a step leaves when its reaper dies
/// comes back here.
pub fn adopt_orphans() -> std::io::Result<()> {
    Ok(nix::sys::prctl::set_child_subreaper(true)?)
}

/// Kills every child of this process that is not a reaper, with its descendants, and
/// collects them: the processes of steps whose reaper died. Blocking.
pub fn kill_strays(grace: Duration) -> Killed {
    let own = std::process::id() as i32;
    let strays = || -> Vec<i32> {
        let reapers = reapers();
        processes::children(own).into_iter().filter(|pid| !reapers.contains(pid)).collect()
    };
    processes::kill_all(
        || processes::tree(strays()),
        || {
            for pid in strays() {
                if processes::stat(pid).is_some_and(|stat| stat.zombie) {
                    let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
                }
            }
        },
        grace,
    )
}

/// What ending a step's reaper did ([`Reaper::end`]).
#[derive(Debug, Default)]
pub struct Ended {
    /// The processes it killed.
    pub killed: Vec<i32>,
    /// Those that outlived SIGKILL.
    pub stuck: Vec<i32>,
    /// It died or did not answer: its orphans are this process's ([`kill_orphans`]).
    pub lost: bool,
}

/// Kills the orphans of reapers that died ([`kill_strays`], off the async threads); returns
/// how many.
pub async fn kill_orphans() -> u32 {
    let killed = tokio::task::spawn_blocking(|| kill_strays(GRACE)).await.unwrap_or_default();
    if !killed.stuck.is_empty() {
        tracing::warn!(stuck = ?killed.stuck, "processes outlived SIGKILL");
    }
    if !killed.killed.is_empty() {
        tracing::info!(processes = ?killed.killed, "killed the processes of a step whose reaper died");
    }
    u32::try_from(killed.killed.len()).unwrap_or(u32::MAX)
}

/// What the reaper said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The step's shell ended with this exit code.
    Exit(i32),
    /// It killed these processes; before it, these outlived SIGKILL.
    Killed { killed: Vec<i32>, stuck: Vec<i32> },
    /// The shell ended and no descendant is left: it exits.
    Gone,
    /// It ended without saying `gone`, or said something else: it was killed or stopped,
    /// and its orphans are this process's to kill.
    Lost,
}

/// The executor's handle on one step's reaper.
pub struct Reaper {
    child: Child,
    pid: i32,
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    writer: OwnedWriteHalf,
    stuck: Vec<i32>,
    ended: bool,
    gone: bool,
}

/// The environment and folder of a step.
pub struct StepSpec<'a> {
    /// The reaper's binary: this executor's.
    pub program: &'a Path,
    /// The step's script.
    pub script: &'a str,
    /// Its whole environment.
    pub env: Vec<(String, String)>,
    /// Its working folder.
    pub workdir: &'a Path,
}

impl Reaper {
    /// Starts a reaper running the step; returns it and the step's output pipes.
    pub fn spawn(spec: StepSpec<'_>) -> std::io::Result<(Reaper, ChildStdout, ChildStderr)> {
        let (ours, theirs) = UnixStream::pair()?;
        ours.set_nonblocking(true)?;
        let ours = tokio::net::UnixStream::from_std(ours)?;
        let mut command = Command::new(spec.program);
        command
            .arg(FLAG)
            .arg(spec.script)
            .env_clear()
            .envs(spec.env)
            .current_dir(spec.workdir)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group: a Ctrl-C at the runner's terminal reaches the runner, which
            // stops the step through the executor.
            .process_group(0);
        let mut child = {
            // Registered before any stray sweep can see it as a child.
            let mut reapers = reapers();
            let child = command.spawn()?;
            if let Some(pid) = child.id() {
                reapers.insert(pid as i32);
            }
            child
        };
        drop(command);
        let pid = child.id().map(|pid| pid as i32).unwrap_or_default();
        let stdout = child.stdout.take().ok_or_else(|| std::io::Error::other("the reaper has no stdout"))?;
        let stderr = child.stderr.take().ok_or_else(|| std::io::Error::other("the reaper has no stderr"))?;
        let (reader, writer) = ours.into_split();
        let reaper = Reaper {
            child,
            pid,
            lines: BufReader::new(reader).lines(),
            writer,
            stuck: Vec::new(),
            ended: false,
            gone: false,
        };
        Ok((reaper, stdout, stderr))
    }

    /// The reaper's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The next thing the reaper says. Cancel-safe.
    pub async fn next(&mut self) -> Event {
        if self.ended {
            return if self.gone { Event::Gone } else { Event::Lost };
        }
        loop {
            let line = match self.lines.next_line().await {
                Ok(Some(line)) if line.len() <= MAX_LINE => line,
                _ => {
                    self.ended = true;
                    return Event::Lost;
                }
            };
            let mut words = line.split(' ');
            let numbers = |words: std::str::Split<'_, char>| words.filter_map(|word| word.parse().ok()).collect();
            match words.next() {
                Some("exit") => {
                    if let Some(code) = words.next().and_then(|code| code.parse().ok()) {
                        return Event::Exit(code);
                    }
                }
                Some("stuck") => {
                    self.stuck = numbers(words);
                    continue;
                }
                Some("killed") => {
                    return Event::Killed { killed: numbers(words), stuck: std::mem::take(&mut self.stuck) };
                }
                Some("gone") => {
                    (self.ended, self.gone) = (true, true);
                    return Event::Gone;
                }
                _ => {}
            }
            // Anything else: the reaper is not what this executor started.
            self.ended = true;
            return Event::Lost;
        }
    }

    /// Has the reaper kill every process of the step and waits for it to exit; SIGKILLs the
    /// reaper itself when it does not answer within the grace period, [`AFTER_KILL`] and a
    /// second.
    pub async fn end(mut self, grace: Duration) -> Ended {
        match self.kill(grace).await {
            Some((killed, stuck)) => {
                let gone = self.finish().await;
                Ended { killed, stuck, lost: !gone }
            }
            None => {
                self.abandon().await;
                Ended { killed: Vec::new(), stuck: Vec::new(), lost: true }
            }
        }
    }

    /// Asks the reaper to kill every process of the step and waits for its answer; `None`
    /// when it does not answer: it is lost.
    async fn kill(&mut self, grace: Duration) -> Option<(Vec<i32>, Vec<i32>)> {
        if self.ended || self.writer.write_all(format!("kill {}\n", grace.as_millis()).as_bytes()).await.is_err() {
            return None;
        }
        let answer = async {
            loop {
                match self.next().await {
                    Event::Exit(_) => {}
                    Event::Killed { killed, stuck } => return Some((killed, stuck)),
                    Event::Gone | Event::Lost => return None,
                }
            }
        };
        tokio::time::timeout(grace + AFTER_KILL + Duration::from_secs(1), answer).await.ok().flatten()
    }

    /// Waits for the reaper to say `gone` and collects it; `false` if it was lost instead.
    pub async fn finish(mut self) -> bool {
        let gone = loop {
            match self.next().await {
                Event::Gone => break true,
                Event::Lost => break false,
                Event::Exit(_) | Event::Killed { .. } => {}
            }
        };
        self.collect().await;
        gone
    }

    /// Kills the reaper itself (it does not answer) and collects it.
    pub async fn abandon(mut self) {
        let _ = self.child.start_kill();
        self.collect().await;
    }

    async fn collect(&mut self) {
        let status = self.child.wait().await;
        reapers().remove(&self.pid);
        if let Ok(status) = status
            && (status.signal().is_some() || !status.success())
        {
            tracing::debug!(pid = self.pid, ?status, "the step reaper ended badly");
        }
    }
}
