//! The executor's side of a reaper once it runs: the steps it is sent, what it says, and its
//! end, with the orphans of one that died.

// Safe code only: the reaper's unsafe code stays in reaper.rs.
#![deny(unsafe_code)]

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::net::unix::pipe::Receiver;

use super::{MAX_LINE, Reaper, kill_strays, reapers};
use crate::processes::{AFTER_KILL, GRACE};

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
    /// The step's shell could not be started, for this reason; the reaper is idle again.
    Failed(String),
    /// It killed these processes; before it, these outlived SIGKILL.
    Killed { killed: Vec<i32>, stuck: Vec<i32> },
    /// The step's shell ended and no descendant is left: it waits for another step.
    Idle,
    /// It exits, as it was asked.
    Gone,
    /// It ended without saying `gone`, or said something else: it was killed or stopped,
    /// and its orphans are this process's to kill.
    Lost,
}

/// The environment and folder of a step.
#[derive(Clone)]
pub struct StepSpec<'a> {
    /// The step's script.
    pub script: &'a str,
    /// Its whole environment.
    pub env: Vec<(String, String)>,
    /// Its working folder.
    pub workdir: &'a Path,
}

impl StepSpec<'_> {
    /// The step as the reaper reads it: its folder, its script, then each variable's name and
    /// value, each ended by a NUL byte. `None` when one of them holds a NUL byte, which no
    /// argv, path or environment can.
    fn encode(&self) -> Option<Vec<u8>> {
        let env = self.env.iter().flat_map(|(name, value)| [name.as_bytes(), value.as_bytes()]);
        let fields = [self.workdir.as_os_str().as_bytes(), self.script.as_bytes()].into_iter().chain(env);
        let mut encoded = Vec::new();
        for field in fields {
            if field.contains(&0) {
                return None;
            }
            encoded.extend_from_slice(field);
            encoded.push(0);
        }
        Some(encoded)
    }
}

/// This side's end of one of a step's output pipes, once the step has the other: made
/// non-blocking and registered with the runtime only after the reaper was sent the step, so
/// that the reaper starts it sooner. Made here, it needs none of the checks
/// `Receiver::from_owned_fd` makes of a descriptor of unknown origin.
fn step_pipe_reader(ours: OwnedFd) -> std::io::Result<Receiver> {
    nix::fcntl::fcntl(&ours, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Receiver::from_owned_fd_unchecked(ours)
}

impl Reaper {
    /// Has the reaper, idle, run a step; returns the step's output pipes.
    pub async fn run(&mut self, spec: StepSpec<'_>) -> std::io::Result<(Receiver, Receiver)> {
        let encoded = spec.encode().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "its script, folder or a variable holds a NUL byte")
        })?;
        // Both ends blocking, as a program expects its stdout to be; this side's end is made
        // non-blocking once the reaper has the step.
        let (stdout, stdout_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let (stderr, stderr_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let mut message = format!("run {}\n", encoded.len()).into_bytes();
        message.extend_from_slice(&encoded);
        let pipes = [stdout_end.as_raw_fd(), stderr_end.as_raw_fd()];
        // One message carries the pipes with the step (one wake-up of the reaper); what of it
        // the socket did not take is written below.
        let sent = self.control.send(&message, &pipes).await?;
        // This end's copies of the write ends go: the step's end closes its output.
        drop((stdout_end, stderr_end));
        let pipes = (step_pipe_reader(stdout)?, step_pipe_reader(stderr)?);
        self.control.write_all(&message[sent..]).await?;
        Ok(pipes)
    }

    /// The reaper's pid.
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
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
            let (word, rest) = line.split_once(' ').unwrap_or((&line, ""));
            let numbers = || rest.split(' ').filter_map(|word| word.parse().ok()).collect();
            match word {
                "exit" => {
                    if let Ok(code) = rest.parse() {
                        return Event::Exit(code);
                    }
                }
                "failed" => return Event::Failed(rest.to_string()),
                "stuck" => {
                    self.stuck = numbers();
                    continue;
                }
                "killed" => return Event::Killed { killed: numbers(), stuck: std::mem::take(&mut self.stuck) },
                "idle" => return Event::Idle,
                "gone" => {
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

    /// Has the reaper kill every process of the step and exit, and waits for it to exit;
    /// SIGKILLs the reaper itself when it does not answer within the grace period,
    /// [`AFTER_KILL`] and a second.
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
        if self.ended || self.control.write_all(format!("kill {}\n", grace.as_millis()).as_bytes()).await.is_err() {
            return None;
        }
        let answer = async {
            loop {
                match self.next().await {
                    Event::Exit(_) | Event::Failed(_) | Event::Idle => {}
                    Event::Killed { killed, stuck } => return Some((killed, stuck)),
                    Event::Gone | Event::Lost => return None,
                }
            }
        };
        tokio::time::timeout(grace + AFTER_KILL + Duration::from_secs(1), answer).await.ok().flatten()
    }

    /// Has the reaper exit (killing what is left of its step) and collects it; `false` if it
    /// was lost instead, or did not answer within [`GRACE`], [`AFTER_KILL`] and a second
    /// (then it is killed).
    pub async fn finish(mut self) -> bool {
        let asked = !self.ended && self.control.write_all(b"end\n").await.is_ok();
        let gone = match asked || self.gone {
            true => {
                let gone = async {
                    loop {
                        match self.next().await {
                            Event::Gone => break true,
                            Event::Lost => break false,
                            Event::Exit(_) | Event::Failed(_) | Event::Killed { .. } | Event::Idle => {}
                        }
                    }
                };
                tokio::time::timeout(GRACE + AFTER_KILL + Duration::from_secs(1), gone).await.ok()
            }
            false => None,
        };
        match gone {
            Some(gone) => {
                self.collect().await;
                gone
            }
            None => {
                self.abandon().await;
                false
            }
        }
    }

    /// Kills the reaper itself (it does not answer) and collects it.
    pub async fn abandon(mut self) {
        let _ = nix::sys::signal::kill(self.pid, Signal::SIGKILL);
        self.collect().await;
    }

    /// Waits for the reaper to exit and collects it.
    async fn collect(&mut self) {
        if self.collected {
            return;
        }
        let pid = self.pid;
        let status = match &self.exited {
            Some(exited) => match exited.readable().await {
                Ok(_) => waitpid(pid, None),
                Err(_) => wait_off_thread(pid).await,
            },
            None => wait_off_thread(pid).await,
        };
        self.collected = true;
        reapers().remove(&pid.as_raw());
        match status {
            Ok(WaitStatus::Exited(_, 0)) => {}
            status => tracing::debug!(pid = pid.as_raw(), ?status, "the step reaper ended badly"),
        }
    }
}

impl Drop for Reaper {
    /// A reaper dropped uncollected sees its socket end, kills its step's processes and
    /// exits: a thread collects it.
    fn drop(&mut self) {
        if self.collected {
            return;
        }
        let pid = self.pid;
        let collect = move || {
            let _ = waitpid(pid, None);
            reapers().remove(&pid.as_raw());
        };
        if std::thread::Builder::new().name("reaper-wait".into()).spawn(collect).is_err() {
            tracing::warn!(pid = pid.as_raw(), "cannot start a thread to collect a step reaper");
        }
    }
}

/// Waits for `pid` on the blocking pool.
async fn wait_off_thread(pid: Pid) -> nix::Result<WaitStatus> {
    tokio::task::spawn_blocking(move || waitpid(pid, None)).await.unwrap_or(Err(Errno::ECHILD))
}
