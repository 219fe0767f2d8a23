//! The step reaper: a small process between the executor and each step's `/bin/sh`, which
//! finds every process the step starts, however it hides, and kills them on request.
//!
//! It is a fork of the executor that never execs (see [`Reaper::spawn`]): starting a second
//! program for every step cost more than the step's own shell. It makes itself a child
//! subreaper (`PR_SET_CHILD_SUBREAPER`), so that every orphan of a step (a `setsid` daemon,
//! a double fork) becomes its child instead of init's: while a step runs, its processes are
//! exactly the reaper's descendants. It runs one step at a time, `/bin/sh -ec SCRIPT` with the
//! step's environment (its variables and secrets, which never reach an argv), its stdout and
//! stderr (the step's pipes, which the reaper closes once the shell's process has them), its
//! working folder and stdin from `/dev/null`. Between steps it has no descendant, and a session keeps
//! it for its next step (forking one costs more than the step's own shell); a step that
//! leaves processes running keeps its reaper to itself, and one given secrets ends it. It
//! keeps only `/dev/null` on its three standard descriptors, its socket and its signalfd, and
//! it names itself `knotless-reaper` (its `comm`, as `ps -o comm` and `top` show; its command
//! line stays the executor's).
//!
//! It holds one end of a Unix socket pair; the executor holds the other ([`Reaper`]). On it,
//! one line per message:
//!
//! - executor to reaper: `run LENGTH`, with the step's two pipes passed along
//!   (`SCM_RIGHTS`), then, in the same write, `LENGTH` bytes: its working folder, its
//!   script, then each variable's name and value, each ended by a NUL byte; `kill
//!   GRACE_MS`: SIGTERM to every descendant, SIGKILL after the grace period, until none is
//!   left; `end`: the same, then exit;
//! - reaper to executor: `exit CODE` when the step's shell ended (128 + N for signal N),
//!   `failed MESSAGE` when it could not be started, `killed PID...` after a kill, `stuck
//!   PID...` before it for processes that outlived SIGKILL, `idle` once the step's shell has
//!   ended and no descendant is left, and `gone` just before it exits.
//!
//! When the socket ends (the executor died or dropped the reaper) the reaper kills every
//! descendant and exits. When the reaper itself dies (a step may `kill -9 $PPID`), its
//! orphans come back to the executor, also a subreaper, which kills them
//! ([`kill_strays`]).

// The one module of the workspace with unsafe code: the reaper is a fork of the executor.
#![allow(unsafe_code)]

use std::collections::BTreeSet;
use std::io::{IoSlice, IoSliceMut, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::errno::Errno;
use nix::libc;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, pthread_sigmask, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader, Interest, ReadBuf};

use crate::processes::{self, GRACE, Killed, Process};

mod handle;

pub use handle::{Ended, Event, StepSpec, kill_orphans};

/// The longest line either side sends; a longer one is a broken peer.
const MAX_LINE: usize = 1 << 20;

/// The longest step (its folder, script and environment) the executor sends a reaper.
const MAX_STEP: usize = 1 << 28;

/// The highest signal number on Linux (`SIGRTMAX`).
const SIGNALS: libc::c_int = 64;

/// The reaper's name in `/proc/PID/comm` (15 bytes at most).
const NAME: &std::ffi::CStr = c"knotless-reaper";

/// The reaper's whole life: it never returns into the executor's code. Only this thread
/// exists here, and every lock another thread of the executor held at the fork stays held:
/// the reaper touches nothing of the executor's (no runtime, no log, no shared state).
/// Allocation is safe: glibc's `fork` resets its allocator's locks in the child.
fn reaper_main(control: UnixStream) -> ! {
    let code = match become_reaper(control).and_then(Supervisor::start) {
        Ok(mut supervisor) => match supervisor.run() {
            Ok(()) => 0,
            Err(_) => {
                // The socket broke (the executor died): nobody may be left with the secrets.
                supervisor.kill(GRACE);
                1
            }
        },
        Err(_) => 1,
    };
    // SAFETY: `_exit` ends this process at once, running none of the exit handlers or
    // destructors, which are the executor's.
    unsafe { libc::_exit(code) }
}

/// Gives the reaper the default signal dispositions of a fresh program (the executor's
/// handlers would write to descriptors it no longer has), puts `/dev/null` on fds 0 to 2,
/// closes every other descriptor of the executor but the control socket (its protocol
/// pipes, steps' pipes: a reaper holding them would keep them from ever closing), and takes
/// its own process group (a Ctrl-C at the runner's terminal reaches the runner, which stops
/// the step through the executor). Returns the control socket.
fn become_reaper(control: UnixStream) -> std::io::Result<UnixStream> {
    // Every signal to its default, the real-time ones too: one its parent ignored would stay
    // ignored in every step (a disposition of SIG_IGN outlives `execve`), and glibc's
    // `sigaction` refuses to touch the two it keeps for itself, so the system call is made
    // directly. The kernel's `struct sigaction` for SIG_DFL, no flags and an empty mask is
    // all zeros.
    let default = [0u64; 4];
    for signal in 1..=SIGNALS {
        if signal != libc::SIGKILL && signal != libc::SIGSTOP {
            // SAFETY: `default` is a whole kernel `struct sigaction`, read and not kept; the
            // last argument is the size of the kernel's signal set.
            let _ =
                unsafe { libc::syscall(libc::SYS_rt_sigaction, signal, default.as_ptr(), std::ptr::null::<u8>(), 8) };
        }
    }
    // A write to a socket whose reader died is an error, not a death, as in the executor.
    // SAFETY: no handler is installed, only SIG_IGN.
    unsafe { nix::sys::signal::signal(Signal::SIGPIPE, SigHandler::SigIgn) }?;
    // Every signal was blocked across the fork ([`Reaper::spawn`]).
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
    let kept = control.as_raw_fd();
    if kept <= 2 {
        return Err(std::io::Error::other("the executor's standard descriptors are closed"));
    }
    // Its stdin, read-only as `std::process::Stdio::null` opens it, is each step's.
    nix::unistd::dup2_stdin(std::fs::File::open("/dev/null")?)?;
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    nix::unistd::dup2_stdout(&null)?;
    nix::unistd::dup2_stderr(&null)?;
    drop(null);
    // SAFETY: closes every descriptor above 2 but the control socket; this process uses
    // none of them again (`_exit` drops nothing).
    let closed = unsafe {
        let below = if kept > 3 { libc::close_range(3, kept as libc::c_uint - 1, 0) } else { 0 };
        below | libc::close_range(kept as libc::c_uint + 1, libc::c_uint::MAX, 0)
    };
    if closed != 0 {
        return Err(std::io::Error::last_os_error());
    }
    nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
    let _ = nix::sys::prctl::set_name(NAME);
    Ok(control)
}

/// The reaper's state.
struct Supervisor {
    control: UnixStream,
    signals: SignalFd,
    /// What starts each step's shell.
    shell: Launcher,
    /// The step's shell while a step runs.
    step: Option<Step>,
    /// What the executor sent that was not read yet.
    pending: Vec<u8>,
    /// The descriptors passed along with `run`, in the order they came.
    passed: Vec<OwnedFd>,
    /// Lines for the executor, sent together before the reaper waits again (a step's `exit`
    /// and `idle` in one wake-up of the executor).
    outbox: Vec<u8>,
}

/// The step that runs.
struct Step {
    shell: Pid,
    shell_done: bool,
}

/// What the executor asked.
enum Command {
    Run { spec: Vec<u8> },
    Kill(Duration),
    End,
}

impl Supervisor {
    fn start(control: UnixStream) -> std::io::Result<Supervisor> {
        nix::sys::prctl::set_child_subreaper(true)?;
        // SIGCHLD is read from a signalfd; the launcher gives a step's shell an empty mask.
        let mut mask = SigSet::empty();
        mask.add(Signal::SIGCHLD);
        mask.thread_block()?;
        let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
        Ok(Supervisor {
            control,
            signals,
            shell: Launcher::new(),
            step: None,
            pending: Vec::new(),
            passed: Vec::new(),
            outbox: Vec::new(),
        })
    }

    /// Serves the executor until it says `end` (`Ok`) or its socket ends or breaks (`Err`).
    fn run(&mut self) -> std::io::Result<()> {
        loop {
            self.flush()?;
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
                // SIGCHLD does not queue: one read empties the signalfd, one that comes later
                // makes `poll` return again, and `reap` collects every child that ended.
                let _ = self.signals.read_signal();
            }
            if commanded {
                self.receive()?;
                while let Some(command) = self.next_command()? {
                    match command {
                        Command::Run { spec } => self.run_step(&spec)?,
                        Command::Kill(grace) => {
                            let killed = self.kill(grace);
                            if !killed.stuck.is_empty() {
                                self.send(&format!("stuck{}", pids(&killed.stuck)))?;
                            }
                            self.send(&format!("killed{}", pids(&killed.killed)))?;
                        }
                        Command::End => {
                            self.kill(GRACE);
                            self.send("gone")?;
                            return self.flush();
                        }
                    }
                }
            }
            if self.step.is_some() && !self.reap()? {
                self.step = None;
                self.send("idle")?;
            }
        }
    }

    /// Reads what the executor sent, with the descriptors passed along; an error once the
    /// socket has ended.
    fn receive(&mut self) -> std::io::Result<()> {
        let mut buffer = [0u8; 64 << 10];
        let mut space = nix::cmsg_space!([RawFd; 2]);
        let (read, fds) = {
            let mut iov = [IoSliceMut::new(&mut buffer)];
            let message =
                match recvmsg::<()>(self.control.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
                    Ok(message) => message,
                    Err(Errno::EINTR | Errno::EAGAIN) => return Ok(()),
                    Err(error) => return Err(error.into()),
                };
            let mut fds = Vec::new();
            for control in message.cmsgs()? {
                if let ControlMessageOwned::ScmRights(received) = control {
                    fds.extend(received);
                }
            }
            (message.bytes, fds)
        };
        for fd in fds {
            // SAFETY: the kernel just made this descriptor for this process; nothing else owns it.
            self.passed.push(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        if read == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.pending.extend_from_slice(&buffer[..read]);
        Ok(())
    }

    /// The next whole command in what was read, if there is one.
    fn next_command(&mut self) -> std::io::Result<Option<Command>> {
        let broken = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let Some(end) = self.pending.iter().position(|&byte| byte == b'\n') else {
            return match self.pending.len() > MAX_LINE {
                true => Err(broken("a line too long")),
                false => Ok(None),
            };
        };
        let line = String::from_utf8_lossy(&self.pending[..end]).into_owned();
        let command = if line == "end" {
            Command::End
        } else if let Some(grace) = line.strip_prefix("kill ").and_then(|grace| grace.parse::<u64>().ok()) {
            Command::Kill(Duration::from_millis(grace))
        } else if let Some(length) = line.strip_prefix("run ").and_then(|length| length.parse::<usize>().ok()) {
            if length > MAX_STEP {
                return Err(broken("a step too long"));
            }
            if self.pending.len() < end + 1 + length {
                return Ok(None);
            }
            let spec = self.pending[end + 1..end + 1 + length].to_vec();
            self.pending.drain(..end + 1 + length);
            return Ok(Some(Command::Run { spec }));
        } else {
            return Err(broken("an unknown command"));
        };
        self.pending.drain(..=end);
        Ok(Some(command))
    }

    /// Starts a step's shell; says `failed` when it cannot.
    fn run_step(&mut self, spec: &[u8]) -> std::io::Result<()> {
        if self.passed.len() < 2 || self.step.is_some() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a step without its pipes, or two at once",
            ));
        }
        let stderr = self.passed.remove(1);
        let stdout = self.passed.remove(0);
        let mut fields = spec.split(|&byte| byte == 0);
        let (Some(workdir), Some(script)) = (fields.next(), fields.next()) else {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a step without its script"));
        };
        let mut env = std::collections::BTreeMap::new();
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            // As in an environment built by `std::process::Command`: the last value of a name wins.
            env.insert(name, value);
        }
        let started = self.shell.start(Shell { workdir, script, env: &env, stdout, stderr });
        match started {
            Ok(shell) => {
                self.step = Some(Step { shell, shell_done: false });
                Ok(())
            }
            Err(error) => {
                let message = format!("failed {error}").replace(['\n', '\r'], " ");
                self.send(&message)
            }
        }
    }

    /// Kills every descendant; reports the step's shell's end on the way if it ends then.
    fn kill(&mut self, grace: Duration) -> Killed {
        let own = std::process::id() as i32;
        let mut ended = None;
        let shell = self.step.as_ref().filter(|step| !step.shell_done).map(|step| step.shell);
        let killed = processes::kill_all(
            || processes::tree(processes::children(own)),
            || {
                // Collect every exited child, the shell's status kept for its `exit` line.
                while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                    match status {
                        WaitStatus::StillAlive => break,
                        status if shell.is_some() && status.pid() == shell => ended = exit_code(status),
                        _ => {}
                    }
                }
            },
            grace,
        );
        if let Some(code) = ended {
            if let Some(step) = &mut self.step {
                step.shell_done = true;
            }
            let _ = self.send(&format!("exit {code}"));
        }
        killed
    }

    /// Collects every exited child, sending `exit` when the step's shell ends; `false` once
    /// the shell has ended and no child is left.
    fn reap(&mut self) -> std::io::Result<bool> {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => return Ok(true),
                Ok(status) => {
                    if let Some(step) = &mut self.step
                        && !step.shell_done
                        && status.pid() == Some(step.shell)
                        && let Some(code) = exit_code(status)
                    {
                        step.shell_done = true;
                        self.send(&format!("exit {code}"))?;
                    }
                }
                Err(Errno::ECHILD) => return Ok(self.step.as_ref().is_some_and(|step| !step.shell_done)),
                Err(Errno::EINTR) => {}
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Queues a line for the executor ([`Supervisor::flush`]).
    fn send(&mut self, line: &str) -> std::io::Result<()> {
        if self.outbox.len() > MAX_LINE {
            return Err(std::io::Error::other("the executor reads nothing"));
        }
        self.outbox.extend_from_slice(line.as_bytes());
        self.outbox.push(b'\n');
        Ok(())
    }

    /// Sends the queued lines.
    fn flush(&mut self) -> std::io::Result<()> {
        let result = self.control.write_all(&self.outbox);
        self.outbox.clear();
        result
    }
}

/// A step's shell to start: `/bin/sh -ec SCRIPT` in `workdir`, with exactly `env`, the
/// reaper's stdin (`/dev/null`) and the step's two pipes on fds 1 and 2, in a process group
/// of its own.
struct Shell<'a> {
    workdir: &'a [u8],
    script: &'a [u8],
    env: &'a std::collections::BTreeMap<&'a [u8], &'a [u8]>,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

/// Starts a step's shell as `posix_spawn` would (a child sharing the reaper's memory, which
/// waits until it has called `execve`), doing only what a reaper's child needs: the reaper
/// has every signal but SIGPIPE at its default and `/dev/null` on its stdin, so none of the
/// 64 `sigaction` calls or the descriptor checks of glibc's `posix_spawn` are needed, nor
/// `/dev/null` opened, nor a stack mapped and unmapped for each step.
struct Launcher {
    stack: Vec<u8>,
}

/// What the child reads (everything prepared before the clone: it allocates nothing) and
/// where it writes why it failed.
struct Launch {
    workdir: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    stdout: RawFd,
    stderr: RawFd,
    /// The child's `errno` when it could not exec; 0 when it did.
    error: libc::c_int,
}

/// The child's stack: the child runs a few system calls on it.
const LAUNCH_STACK: usize = 64 << 10;

impl Launcher {
    fn new() -> Launcher {
        Launcher { stack: vec![0; LAUNCH_STACK] }
    }

    /// Starts the shell; its pid, or why it could not be started.
    fn start(&mut self, shell: Shell<'_>) -> std::io::Result<Pid> {
        let text =
            |bytes: &[u8]| std::ffi::CString::new(bytes).map_err(|_| std::io::Error::other("a field holds a NUL byte"));
        let workdir = text(shell.workdir)?;
        let args = [text(b"/bin/sh")?, text(b"-ec")?, text(shell.script)?];
        let env = shell.env.iter().map(|(name, value)| text(&[name, &b"="[..], value].concat()));
        let env = env.collect::<std::io::Result<Vec<_>>>()?;
        let argv: Vec<*const libc::c_char> =
            args.iter().map(|arg| arg.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
        let envp: Vec<*const libc::c_char> =
            env.iter().map(|pair| pair.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
        let mut launch = Launch {
            workdir: workdir.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            stdout: shell.stdout.as_raw_fd(),
            stderr: shell.stderr.as_raw_fd(),
            error: 0,
        };
        // The stack grows down from its 16-byte aligned top.
        let top = self.stack.as_mut_ptr_range().end as usize & !15;
        // Zeroed by the kernel, and the futex woken, when the child calls `execve` or exits
        // (`CLONE_CHILD_CLEARTID`: the child's memory is released then).
        let running = AtomicI32::new(-1);
        // SAFETY: the child shares this memory and runs `launch_child` alone on its own stack
        // while this thread waits below until it has called `execve` or `_exit`: it reads
        // `launch`, its strings and arrays, which all outlive the wait, and writes only
        // `launch.error` (and its `errno`, this thread's, which this thread reads nowhere
        // before the wait ends). It allocates nothing and takes no lock; no signal handler
        // of this process can run in it (this process installs none).
        let pid = unsafe {
            libc::clone(
                launch_child,
                top as *mut libc::c_void,
                libc::CLONE_VM | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD,
                std::ptr::from_mut(&mut launch).cast(),
                std::ptr::null_mut::<libc::pid_t>(),
                std::ptr::null_mut::<libc::c_void>(),
                running.as_ptr(),
            )
        };
        // The pipes are the child's alone from here (it has its own copy of the descriptor
        // table): closing this copy now rather than once the child has exec'd means the
        // step's end closes them with the shell's own exit, and never a wake-up of the
        // executor by the reaper for each of them (the reaper, woken by the `execve`, often
        // waits for a CPU until the shell has ended).
        drop((shell.stdout, shell.stderr));
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        loop {
            let now = running.load(Ordering::Acquire);
            if now == 0 {
                break;
            }
            // SAFETY: waits on the word above while it still holds `now`; a shared futex,
            // as the kernel wakes one with `CLONE_CHILD_CLEARTID`.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    running.as_ptr(),
                    libc::FUTEX_WAIT,
                    now,
                    std::ptr::null::<libc::timespec>(),
                )
            };
        }
        let pid = Pid::from_raw(pid);
        match launch.error {
            0 => Ok(pid),
            error => {
                // It has exited: collect it here, where its status is not taken for a step's.
                let _ = waitpid(pid, None);
                Err(std::io::Error::from_raw_os_error(error))
            }
        }
    }
}

/// The shell's side of [`Launcher::start`]: the step's pipes on fds 1 and 2 (every other
/// descriptor of the reaper is close-on-exec), SIGPIPE back to its default, no signal
/// blocked, its working folder and process group, then `execve`.
extern "C" fn launch_child(launch: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `launch` is the `Launch` of [`Launcher::start`], alive while this runs; only
    // async-signal-safe calls are made.
    unsafe {
        let launch = &mut *launch.cast::<Launch>();
        let mut none = std::mem::zeroed::<libc::sigset_t>();
        let ready = libc::signal(libc::SIGPIPE, libc::SIG_DFL) != libc::SIG_ERR
            && libc::sigemptyset(&mut none) == 0
            && libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) == 0
            && libc::dup2(launch.stdout, 1) == 1
            && libc::dup2(launch.stderr, 2) == 2
            && libc::chdir(launch.workdir) == 0
            && libc::setpgid(0, 0) == 0;
        if ready {
            libc::execve(*launch.argv, launch.argv, launch.envp);
        }
        launch.error = Errno::last_raw().max(1);
        libc::_exit(127)
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

/// The executor's handle on a reaper.
pub struct Reaper {
    pid: Pid,
    /// A pidfd, readable once the reaper has exited; `None` on a kernel without them.
    exited: Option<AsyncFd<OwnedFd>>,
    collected: bool,
    lines: tokio::io::Lines<BufReader<Control>>,
    control: Control,
    stuck: Vec<i32>,
    ended: bool,
    gone: bool,
}

impl Reaper {
    /// Forks a reaper, which waits for a step ([`Reaper::run`]).
    pub fn spawn() -> std::io::Result<Reaper> {
        // Everything that can fail on this side is done before the fork: once the child runs,
        // it must be collected.
        let (ours, theirs) = UnixStream::pair()?;
        ours.set_nonblocking(true)?;
        let control = Control::new(ours)?;
        let forked = {
            // Registered before any stray sweep can see it as a child.
            let mut reapers = reapers();
            // No signal reaches the child before it drops the executor's handlers.
            let mut mask = SigSet::empty();
            pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::all()), Some(&mut mask))?;
            // SAFETY: the child runs `reaper_main` alone, which never returns, and holds to
            // what may be done between a fork of a threaded process and its exit (see there).
            let forked = match unsafe { nix::unistd::fork() } {
                Ok(ForkResult::Child) => reaper_main(theirs),
                Ok(ForkResult::Parent { child }) => {
                    reapers.insert(child.as_raw());
                    drop(theirs);
                    Ok(child)
                }
                Err(error) => Err(error),
            };
            pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&mask), None)?;
            forked
        };
        let pid = forked?;
        let exited = pidfd(pid);
        Ok(Reaper {
            pid,
            exited,
            collected: false,
            lines: BufReader::new(control.clone()).lines(),
            control,
            stuck: Vec::new(),
            ended: false,
            gone: false,
        })
    }
}

/// The executor's end of a reaper's socket, registered with the runtime for reading alone:
/// a Unix socket registered for writing too (as tokio's `UnixStream` is) wakes its side each
/// time the other reads from it (each read frees room), so the reaper's reading of each step
/// would wake the executor for nothing. A write waits for room only when the socket is full.
#[derive(Clone)]
struct Control(std::sync::Arc<AsyncFd<UnixStream>>);

impl Control {
    fn new(socket: UnixStream) -> std::io::Result<Control> {
        Ok(Control(std::sync::Arc::new(registered(socket, Interest::READABLE)?)))
    }

    /// Sends what of `bytes` the socket takes at once (at least one byte), with `fds`
    /// (`SCM_RIGHTS`) when there are any.
    async fn send(&self, bytes: &[u8], fds: &[RawFd]) -> std::io::Result<usize> {
        let rights = [ControlMessage::ScmRights(fds)];
        let control = if fds.is_empty() { &[][..] } else { &rights[..] };
        loop {
            let socket = self.0.get_ref().as_raw_fd();
            match sendmsg::<()>(socket, &[IoSlice::new(bytes)], control, MsgFlags::MSG_NOSIGNAL, None) {
                Ok(sent) => return Ok(sent),
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => self.room().await?,
                Err(error) => return Err(error.into()),
            }
        }
    }

    async fn write_all(&self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            match self.send(bytes, &[]).await? {
                0 => return Err(std::io::ErrorKind::WriteZero.into()),
                sent => bytes = &bytes[sent..],
            }
        }
        Ok(())
    }

    /// Waits until the socket has room, through a copy of it registered for writing alone
    /// while it waits (epoll reports a copy registered where there is room already).
    async fn room(&self) -> std::io::Result<()> {
        let copy = registered(self.0.get_ref().try_clone()?, Interest::WRITABLE)?;
        copy.writable().await?.retain_ready();
        Ok(())
    }
}

/// `socket` registered with the runtime for `interest` alone.
fn registered(socket: UnixStream, interest: Interest) -> std::io::Result<AsyncFd<UnixStream>> {
    // SAFETY: the `UnixStream` owns its descriptor, which stays open and the same for as
    // long as the `AsyncFd` holds it.
    unsafe { AsyncFd::register_with_interest(socket, interest) }.map_err(|error| error.into_parts().1)
}

impl AsyncRead for Control {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        loop {
            let mut ready = std::task::ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match ready.try_io(|socket| std::io::Read::read(&mut socket.get_ref(), unfilled)) {
                Ok(Ok(read)) => {
                    buf.advance(read);
                    return std::task::Poll::Ready(Ok(()));
                }
                Ok(Err(error)) => return std::task::Poll::Ready(Err(error)),
                Err(_would_block) => {}
            }
        }
    }
}

/// A pidfd of `pid`, a child not yet collected (so its pid is not reused), for waiting on
/// its exit without a thread.
fn pidfd(pid: Pid) -> Option<AsyncFd<OwnedFd>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    let fd = RawFd::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the descriptor was just made, nothing else owns it, and the `OwnedFd` keeps it
    // open and the same for as long as the `AsyncFd` holds it.
    unsafe { AsyncFd::register_with_interest(OwnedFd::from_raw_fd(fd), tokio::io::Interest::READABLE) }.ok()
}
