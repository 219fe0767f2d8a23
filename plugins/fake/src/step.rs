//! `command`: one step as `sh -ec` in its own process group, its output streamed as `output`
//! notifications, killed with its descendants at its timeout or on cancellation; and the modes
//! that break it.

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use knotless_protocol::error::code;
use knotless_protocol::messages::{CommandParams, CommandResult, Stream};
use knotless_protocol::version::MAX_OUTPUT_CHUNK;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::mode::Mode;
use crate::server::{Setup, Shared};
use crate::wire::{Fault, Out, output_frame};

/// The PATH a step gets when the fake itself has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// How long the output of a killed step may take to drain, should a process have left its
/// group holding a pipe.
const DRAIN: Duration = Duration::from_secs(2);

/// Output of a step, chunk by chunk, with the stream of each.
type Chunks = Vec<(Stream, Vec<u8>)>;

/// Where a step's output goes.
#[derive(Clone)]
enum Sink {
    /// To the runner, as it comes.
    Send(Out),
    /// Nowhere (`drop-output`, `garbage`).
    Drop,
    /// To the runner through a queue of one chunk, a chunk that finds the queue and stdout
    /// full dropped (`drop-output-when-slow`); the step's writer is made in [`run`].
    DropWhenFull(Out),
    /// The queue of [`Sink::DropWhenFull`].
    Queue(mpsc::Sender<(Stream, Vec<u8>)>, Out),
    /// Kept, to send after the answer (`late-output`).
    Keep(Arc<Mutex<Chunks>>),
}

/// How a step is run.
struct Behaviour {
    sink: Sink,
    timeout: Option<Duration>,
    /// Kill what left the step's process group at its timeout.
    sweep_at_timeout: bool,
    /// Kill what left the step's process group on a cancel.
    sweep_at_cancel: bool,
    /// Decode output as UTF-8 and encode it again (`lossy-output`).
    lossy: bool,
    /// Answer a death by signal with exit code 0 (`signal-as-zero`).
    signal_as_zero: bool,
    /// Put the secrets on the shell's command line (`secret-on-command-line`).
    secrets_on_command_line: bool,
    /// Kill what a step given secrets left (all but `leave-processes-after-secrets`).
    sweep_after_secrets: bool,
}

/// Runs one step according to the mode. `request` is the id of its request: output a mode
/// sends after the answer is kept under it in `shared`.
pub async fn command(
    shared: &Shared,
    setup: &Setup,
    params: CommandParams,
    token: CancellationToken,
    request: &str,
) -> Result<CommandResult, Fault> {
    let mut behaviour = Behaviour {
        sink: Sink::Send(shared.out.clone()),
        timeout: Some(Duration::from_millis(params.timeout_ms)),
        sweep_at_timeout: setup.mode != Mode::LeaveProcessesAtTimeout,
        sweep_at_cancel: setup.mode != Mode::LeaveProcessesAtCancel,
        lossy: setup.mode == Mode::LossyOutput,
        signal_as_zero: setup.mode == Mode::SignalAsZero,
        secrets_on_command_line: setup.mode == Mode::SecretOnCommandLine,
        sweep_after_secrets: setup.mode != Mode::LeaveProcessesAfterSecrets,
    };
    match setup.mode {
        Mode::LoseSession => return Err(Fault::unknown_session(&params.session)),
        Mode::CrashMidStep => crash(&shared.out, &params).await,
        Mode::DropOutput => behaviour.sink = Sink::Drop,
        Mode::DropOutputWhenSlow => behaviour.sink = Sink::DropWhenFull(shared.out.clone()),
        Mode::LateOutput => behaviour.sink = Sink::Keep(Arc::default()),
        Mode::IgnoreTimeout | Mode::CancelAnswersOk => behaviour.timeout = None,
        Mode::Garbage if !shared.garbage_written.swap(true, Ordering::SeqCst) => {
            eprintln!("fake: about to write garbage");
            eprintln!("fake: the next stdout line is not json (simulated)");
            if let Err(error) = shared.out.line(b"this is not json {{{").await {
                eprintln!("fake: cannot write garbage: {error}");
            }
            behaviour.sink = Sink::Drop;
        }
        _ => {}
    }
    let dir = setup.sessions.dir(&params.session)?;
    leak_secrets(shared, setup, &params, &dir).await;
    let work = if setup.mode == Mode::WrongWorkdir { dir.clone() } else { dir.join("work") };
    let workdir = match &params.workdir {
        Some(workdir) => work.join(workdir),
        None => work,
    };
    let result = run(&params, &workdir, &behaviour, &token).await;
    if let Sink::Keep(kept) = &behaviour.sink {
        let kept = std::mem::take(&mut *kept.lock().unwrap_or_else(|poison| poison.into_inner()));
        let frames = kept
            .iter()
            .filter_map(|(stream, bytes)| output_frame(&params.session, params.step, *stream, bytes).ok())
            .collect();
        eprintln!("fake: sending the output of step {} after its answer (simulated)", params.step);
        shared.keep_until_answered(request, frames);
    }
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

/// Puts the step's secrets where the modes that leak them put them: stderr, a file in the
/// session's folder, a `log` line.
async fn leak_secrets(shared: &Shared, setup: &Setup, params: &CommandParams, dir: &Path) {
    if params.secrets.is_empty() {
        return;
    }
    let pairs: Vec<String> = params.secrets.iter().map(|(name, value)| format!("{name}={value}")).collect();
    match setup.mode {
        Mode::SecretOnStderr => eprintln!("fake: step {} runs with {} (simulated)", params.step, pairs.join(" ")),
        Mode::SecretInFile => {
            let file = dir.join("step.env");
            if let Err(error) = std::fs::write(&file, pairs.join("\n")) {
                eprintln!("fake: cannot write {}: {error}", file.display());
            }
        }
        Mode::SecretInLog => {
            let message = format!("step {} runs with {}", params.step, pairs.join(" "));
            if let Err(error) = shared.out.log(&params.session, &message).await {
                eprintln!("fake: cannot send a log line: {error}");
            }
        }
        _ => {}
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
    behaviour: &Behaviour,
    token: &CancellationToken,
) -> Result<CommandResult, Fault> {
    let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_string());
    let mut command = tokio::process::Command::new("sh");
    command.arg("-ec").arg(&params.script);
    if behaviour.secrets_on_command_line {
        eprintln!("fake: putting the step's secrets on its command line (simulated)");
        command.arg("fake-step").args(params.secrets.iter().map(|(name, value)| format!("{name}={value}")));
    }
    command
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
    let (mut child, shell) = crate::orphans::spawn_shell(|| {
        let child = command.spawn()?;
        let pid = child.id();
        Ok((child, pid))
    })
    .map_err(|error| Fault::infrastructure(format!("cannot start sh in {}: {error}", workdir.display())))?;
    let pid = child.id().ok_or_else(|| Fault::infrastructure("the step ended before it started"))?;
    let shell_started = shell.as_ref().map_or(0, |shell| shell.started);
    let mut group = Group { pgid: Pid::from_raw(pid as i32), armed: true };
    let (sink, writer) = match &behaviour.sink {
        Sink::DropWhenFull(out) => {
            let (queue, mut chunks) = mpsc::channel::<(Stream, Vec<u8>)>(1);
            let (writer_out, session, step) = (out.clone(), params.session.clone(), params.step);
            let writer = tokio::spawn(async move {
                while let Some((stream, bytes)) = chunks.recv().await {
                    if let Err(error) = writer_out.output(&session, step, stream, &bytes).await {
                        eprintln!("fake: cannot send output: {error}");
                    }
                }
            });
            (Sink::Queue(queue, out.clone()), Some(writer))
        }
        other => (other.clone(), None),
    };
    let pumps = [
        child.stdout.take().map(|stdout| pump(stdout, sink.clone(), params, Stream::Stdout, behaviour.lossy)),
        child.stderr.take().map(|stderr| pump(stderr, sink.clone(), params, Stream::Stderr, behaviour.lossy)),
    ];
    drop(sink);
    // Every chunk queued is written before the answer.
    let pumps = Pumps { pumps, writer };
    let deadline = async {
        match behaviour.timeout {
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
            let sweep =
                if fault.code == code::TIMEOUT { behaviour.sweep_at_timeout } else { behaviour.sweep_at_cancel };
            if sweep {
                // What left the group (`setsid`) is still a descendant of the step's shell.
                for descendant in descendants(pid) {
                    let _ = nix::sys::signal::kill(descendant, Signal::SIGKILL);
                }
            } else {
                eprintln!("fake: killing the step's process group only (simulated)");
            }
            group.kill();
            let _ = child.wait().await;
            drain(pumps).await;
            return Err(fault);
        }
    };
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut killed_processes = leftovers(pid);
    if killed_processes > 0 {
        group.kill();
    }
    group.armed = false;
    if !params.secrets.is_empty() {
        if behaviour.sweep_after_secrets {
            killed_processes += crate::orphans::kill_after(shell_started);
        } else {
            eprintln!("fake: leaving what the step given secrets left running (simulated)");
        }
    }
    drop(shell);
    crate::orphans::reap();
    drain(pumps).await;
    Ok(CommandResult { exit_code: exit_code(status, behaviour.signal_as_zero), duration_ms, killed_processes })
}

/// The exit code, or 128 + the signal that ended the step (0 with `signal_as_zero`).
fn exit_code(status: std::process::ExitStatus, signal_as_zero: bool) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    if signal_as_zero && status.signal().is_some() {
        eprintln!("fake: answering a step ended by a signal with exit code 0 (simulated)");
        return status.code().unwrap_or(0);
    }
    status.code().or_else(|| status.signal().map(|signal| 128 + signal)).unwrap_or(-1)
}

/// Reads one stream to its end, each chunk to the sink; with `lossy`, each chunk decoded as
/// UTF-8 and encoded again, as a careless executor would.
fn pump(
    mut reader: impl AsyncRead + Unpin + Send + 'static,
    sink: Sink,
    params: &CommandParams,
    stream: Stream,
    lossy: bool,
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
            let out = match &sink {
                Sink::Send(out) => out,
                Sink::Drop => continue,
                Sink::DropWhenFull(out) => out,
                Sink::Queue(queue, out) => {
                    match queue.try_send((stream, buffer[..read].to_vec())) {
                        Err(mpsc::error::TrySendError::Full(_)) if out.is_full() => {
                            eprintln!("fake: dropping {read} bytes of output: stdout is full (simulated)");
                        }
                        Err(mpsc::error::TrySendError::Full(chunk)) => {
                            let _ = queue.send(chunk).await;
                        }
                        _ => {}
                    }
                    continue;
                }
                Sink::Keep(kept) => {
                    kept.lock().unwrap_or_else(|poison| poison.into_inner()).push((stream, buffer[..read].to_vec()));
                    continue;
                }
            };
            let bytes = match lossy {
                true => String::from_utf8_lossy(&buffer[..read]).into_owned().into_bytes(),
                false => buffer[..read].to_vec(),
            };
            if let Err(error) = out.output(&session, step, stream, &bytes).await {
                eprintln!("fake: cannot send output: {error}");
            }
        }
    })
}

/// The tasks that read a step's output, and the one that writes what they queued.
struct Pumps {
    pumps: [Option<JoinHandle<()>>; 2],
    writer: Option<JoinHandle<()>>,
}

/// Waits for the output to be sent, all of it before the answer.
async fn drain(pumps: Pumps) {
    for pump in pumps.pumps.into_iter().flatten() {
        let abort = pump.abort_handle();
        if tokio::time::timeout(DRAIN, pump).await.is_err() {
            eprintln!("fake: a process outside the step's group holds its output open");
            abort.abort();
        }
    }
    if let Some(writer) = pumps.writer {
        let _ = writer.await;
    }
}

/// Every live descendant of `root`, by their parents in `/proc`.
fn descendants(root: u32) -> Vec<Pid> {
    let parents: Vec<(i32, i32)> = processes().into_iter().map(|(pid, ppid, _)| (pid, ppid)).collect();
    let mut found = vec![root as i32];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        found.extend(parents.iter().filter(|(_, ppid)| *ppid == parent).map(|(pid, _)| *pid));
        next += 1;
    }
    found.into_iter().skip(1).map(Pid::from_raw).collect()
}

/// Every live process as (pid, parent, process group), read from `/proc`.
fn processes() -> Vec<(i32, i32, i32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the command's closing parenthesis: state, ppid, pgrp.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if let [state, ppid, pgrp, ..] = fields[..]
            && state != "Z"
            && let (Ok(ppid), Ok(pgrp)) = (ppid.parse(), pgrp.parse())
        {
            found.push((pid, ppid, pgrp));
        }
    }
    found
}

/// How many live processes are left in the group `pgid` (read from `/proc`).
fn leftovers(pgid: u32) -> u32 {
    processes().iter().filter(|(_, _, group)| *group as u32 == pgid).count() as u32
}
