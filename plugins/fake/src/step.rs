//! `command`: one step as `sh -ec` in its own process group, its output streamed as `output`
//! notifications, killed at its timeout or on cancellation; and the modes that break it.

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use knotless_protocol::error::code;
use knotless_protocol::messages::{CommandParams, CommandResult, Stream};
use knotless_protocol::version::MAX_OUTPUT_CHUNK;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::mode::Mode;
use crate::server::{Setup, Shared};
use crate::wire::{Fault, Out};

/// The PATH a step gets when the fake itself has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// How long the output of a killed step may take to drain, should a process have left its
/// group holding a pipe.
const DRAIN: Duration = Duration::from_secs(2);

/// Runs one step according to the mode.
pub async fn command(
    shared: &Shared,
    setup: &Setup,
    params: CommandParams,
    token: CancellationToken,
) -> Result<CommandResult, Fault> {
    let mut output = Some(shared.out.clone());
    let mut timeout = Some(Duration::from_millis(params.timeout_ms));
    match setup.mode {
        Mode::LoseSession => return Err(Fault::unknown_session(&params.session)),
        Mode::CrashMidStep => crash(&shared.out, &params).await,
        Mode::DropOutput => output = None,
        Mode::IgnoreTimeout | Mode::CancelAnswersOk => timeout = None,
        Mode::Garbage if !shared.garbage_written.swap(true, Ordering::SeqCst) => {
            eprintln!("fake: about to write garbage");
            eprintln!("fake: the next stdout line is not json (simulated)");
            if let Err(error) = shared.out.line(b"this is not json {{{").await {
                eprintln!("fake: cannot write garbage: {error}");
            }
            output = None;
        }
        _ => {}
    }
    let dir = setup.sessions.dir(&params.session)?;
    let workdir = match &params.workdir {
        Some(workdir) => dir.join("work").join(workdir),
        None => dir.join("work"),
    };
    let result = run(&params, &workdir, output, timeout, &token).await;
    match result {
        Err(fault) if setup.mode == Mode::CancelAnswersOk && token.is_cancelled() => {
            eprintln!(
                "fake: answering the cancel of step {} with exit code 0 (simulated): {}",
                params.step, fault.message
            );
            Ok(CommandResult { exit_code: 0, duration_ms: 1, killed_processes: 0 })
        }
        other => other,
    }
}

/// Sends one output notification, says so on stderr and exits 101 at once.
async fn crash(out: &Out, params: &CommandParams) -> ! {
    if let Err(error) = out.output(&params.session, params.step, Stream::Stdout, b"partial output\n").await {
        eprintln!("fake: cannot write the partial output: {error}");
    }
    eprintln!("fake: crashing mid-step (simulated)");
    std::process::exit(101)
}

/// Kills the step's process group when dropped, unless disarmed: an aborted request leaves
/// nothing running.
struct Group {
    pgid: Pid,
    armed: bool,
}

impl Group {
    fn kill(&self) {
        let _ = killpg(self.pgid, Signal::SIGKILL);
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.armed {
            self.kill();
        }
    }
}

async fn run(
    params: &CommandParams,
    workdir: &Path,
    output: Option<Out>,
    timeout: Option<Duration>,
    token: &CancellationToken,
) -> Result<CommandResult, Fault> {
    let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_string());
    let mut command = tokio::process::Command::new("sh");
    command
        .arg("-ec")
        .arg(&params.script)
        .current_dir(workdir)
        .env_clear()
        .env("PATH", path)
        .envs(&params.env)
        .envs(&params.secrets)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|error| Fault::infrastructure(format!("cannot start sh in {}: {error}", workdir.display())))?;
    let pid = child.id().ok_or_else(|| Fault::infrastructure("the step ended before it started"))?;
    let mut group = Group { pgid: Pid::from_raw(pid as i32), armed: true };
    let pumps = [
        child.stdout.take().map(|stdout| pump(stdout, output.clone(), params, Stream::Stdout)),
        child.stderr.take().map(|stderr| pump(stderr, output.clone(), params, Stream::Stderr)),
    ];
    let deadline = async {
        match timeout {
            Some(timeout) => tokio::time::sleep(timeout).await,
            None => std::future::pending().await,
        }
    };
    let ended = tokio::select! {
        status = child.wait() => Ok(status),
        () = deadline => Err(Fault::new(code::TIMEOUT, format!("the step ran past its timeout of {} ms", params.timeout_ms))),
        () = token.cancelled() => Err(Fault::cancelled()),
    };
    let status = match ended {
        Ok(status) => status.map_err(|error| Fault::infrastructure(format!("cannot wait for the step: {error}")))?,
        Err(fault) => {
            group.kill();
            let _ = child.wait().await;
            drain(pumps).await;
            return Err(fault);
        }
    };
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let killed_processes = leftovers(pid);
    if killed_processes > 0 {
        group.kill();
    }
    group.armed = false;
    drain(pumps).await;
    Ok(CommandResult { exit_code: exit_code(status), duration_ms, killed_processes })
}

/// The exit code, or 128 + the signal that ended the step.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status.code().or_else(|| status.signal().map(|signal| 128 + signal)).unwrap_or(-1)
}

/// Reads one stream to its end, sending each chunk as an `output` notification (or dropping
/// it when `out` is `None`).
fn pump(
    mut reader: impl AsyncRead + Unpin + Send + 'static,
    out: Option<Out>,
    params: &CommandParams,
    stream: Stream,
) -> JoinHandle<()> {
    let session = params.session.clone();
    let step = params.step;
    tokio::spawn(async move {
        let mut buffer = vec![0; MAX_OUTPUT_CHUNK];
        loop {
            let read = match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            if let Some(out) = &out
                && let Err(error) = out.output(&session, step, stream, &buffer[..read]).await
            {
                eprintln!("fake: cannot send output: {error}");
            }
        }
    })
}

/// Waits for the output to be sent, all of it before the answer.
async fn drain(pumps: [Option<JoinHandle<()>>; 2]) {
    for pump in pumps.into_iter().flatten() {
        let abort = pump.abort_handle();
        if tokio::time::timeout(DRAIN, pump).await.is_err() {
            eprintln!("fake: a process outside the step's group holds its output open");
            abort.abort();
        }
    }
}

/// How many live processes are left in the group `pgid` (read from `/proc`).
fn leftovers(pgid: u32) -> u32 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut count = 0;
    for entry in entries.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the command's closing parenthesis: state, ppid, pgrp.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[2] == pgid.to_string() {
            count += 1;
        }
    }
    count
}
