//! The step loop of executors that run steps through a remote shell (`docker exec`, an exec
//! into a pod, ssh, ...): one [`run_step`] for all of them, so a step's payload, its
//! sentinel, the sweep of its processes, and the errors of a timeout, a cancellation or a
//! lost stream are the same whatever the transport.
//!
//! An executor implements [`Shell`] (start a command in the environment; say why a stream
//! was lost; end the environment when a step's processes cannot be killed) and calls
//! [`run_step`] from its `command`. The loop:
//!
//! 1. runs `sh -s` with the payload ([`payload::build`]) on its stdin: a snapshot of the
//!    environment's processes, then the step;
//! 2. streams stdout and stderr, the payload's messages taken out of stderr
//!    ([`SentinelFilter`]); the step has ended when the sentinel says so, never because the
//!    stream ended: a stream that ends without it is a lost stream (an infrastructure error
//!    naming what [`Shell::lost`] says), never a result;
//! 3. at the step's timeout, on cancellation, after a lost stream, and after a
//!    secret-bearing step, runs [`payload::SWEEP`]: every process of the environment that was
//!    not there before the step (and is not init, nor a worker of what was there) is killed,
//!    however it hid. When that cannot be done, the environment is ended
//!    ([`Shell::end_environment`]): no process of the step outlives it unknown;
//! 4. ends the step at once, as an infrastructure error, when the executor learns the
//!    environment is lost while the step runs ([`Shell::failed`]: a pod deleted or its node
//!    gone), however its stream behaves (it may hang), and ends the environment;
//! 5. names the step's own faults as the step's, never the environment's: a step whose
//!    processes exhausted a limit of the environment (its pids: a fork bomb) has the
//!    environment ended at once, without a sweep that could not run there
//!    ([`Shell::usage`]), and one the kernel killed for memory is "out of memory
//!    (OOMKilled)" (the payload reads the environment's count of OOM kills before and after).
//!
//! Every sweep is bounded ([`SWEEP_WITHIN`]), and so is the end of an environment, so that a
//! step's answer comes within a runner's grace after its deadline, whatever the step did.
//!
//! Killing the local end of an exec kills nothing in the environment: only the sweep does.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{ErrorKind, ExecutorError};
use crate::messages::{CommandParams, CommandResult, LogLevel, Stream};
use crate::sdk::Context;
use crate::sdk::output::OutputPipes;
use crate::sdk::payload::{self, SentinelFilter, Snapshot};

mod transfer;

pub(crate) use transfer::unframe_function;
pub use transfer::{
    MERGE, PIPE_SIZE, UNPACK_CUT, UNPACK_SEALED, UNPACK_SEALED_FRAMED, UNPACK_UNMERGED, discard_argv, feed_vetted,
    feed_vetted_pipe, feed_vetted_sealed, feed_vetted_sealed_framed, feed_vetted_sealed_pipe, merge_argv,
    pass_download, seal_name, staging_path, unpack_sealed_argv,
};

/// How long output is read after the sentinel while the stream stays open (a process the
/// step left running holds it).
pub const SETTLE: Duration = Duration::from_millis(200);

/// How long the sweep of a step's processes may take: past it, the environment is ended. Well
/// within the runner's default grace (10 s), so that with the end of the environment a step's
/// answer still comes in time.
pub const SWEEP_WITHIN: Duration = Duration::from_secs(5);

/// How much of a limit of an environment its processes use ([`Shell::usage`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The limit, as a sentence names it: `pids`.
    pub limit_name: &'static str,
    /// How much is in use: 1003 tasks.
    pub used: u64,
    /// The limit: 1024.
    pub limit: u64,
    /// How many times the limit refused a new process since the step started, when the
    /// environment can tell (a cgroup's `pids.events`): then this alone says whether the
    /// step's processes exhausted it, and `used` only how far. `None` when it cannot tell:
    /// then how close `used` is to `limit` decides.
    pub refused: Option<u64>,
}

impl Usage {
    /// At its limit: it refused a process during the step; without that count, within 5%, or
    /// 2, of it (processes that exhaust a limit keep close to it as some fail and end, and a
    /// busy host slows their refill).
    pub fn at_the_limit(&self) -> bool {
        match self.refused {
            Some(refused) => refused > 0,
            None => self.used.saturating_add((self.limit / 20).max(2)) >= self.limit,
        }
    }

    /// Near its limit: it refused a process during the step; without that count, three
    /// quarters of it or more. With a sweep that could not run, the processes' own doing.
    pub fn near_the_limit(&self) -> bool {
        match self.refused {
            Some(refused) => refused > 0,
            None => self.used.saturating_mul(4) >= self.limit.saturating_mul(3),
        }
    }

    /// The end of a sentence whose subject is a step or its processes.
    pub fn exhausted(&self) -> String {
        format!("exhausted its {} limit of {} ({} in use)", self.limit_name, self.limit, self.used)
    }
}

/// How much of a step's last stderr is kept for the error of a lost stream.
const TAIL: usize = 4096;

/// A stream from the environment.
pub type Reader = Box<dyn AsyncRead + Unpin + Send>;

/// A stream into the environment.
pub type Writer = Box<dyn AsyncWrite + Unpin + Send>;

/// One command running in the environment. Dropping it ends its local end (a client
/// process, a websocket) and nothing in the environment.
pub struct Exec {
    /// Its stdin.
    pub stdin: Writer,
    /// Its stdout.
    pub stdout: Reader,
    /// Its stderr.
    pub stderr: Reader,
    /// Ends when the exec has ended, with its exit code when known.
    pub ended: Pin<Box<dyn Future<Output = Option<i32>> + Send>>,
}

impl Exec {
    /// The exec of a local client process (`docker exec -i`, `ssh`) spawned with
    /// its three streams piped and `kill_on_drop`: dropping the exec ends the client. `what`
    /// names the client in the error when a pipe is missing.
    pub fn from_child(mut child: tokio::process::Child, what: &str) -> Result<Exec, ExecutorError> {
        let missing = || ExecutorError::infrastructure(format!("{what} was started without its pipes"));
        let stdin = child.stdin.take().ok_or_else(missing)?;
        let stdout = child.stdout.take().ok_or_else(missing)?;
        let stderr = child.stderr.take().ok_or_else(missing)?;
        Ok(Exec {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            ended: Box::pin(async move { child.wait().await.ok().and_then(|status| status.code()) }),
        })
    }
}

/// How an executor reaches its environment.
pub trait Shell: Send + Sync {
    /// Starts `argv` in the environment, its stdin, stdout and stderr piped.
    fn exec(&self, argv: Vec<String>) -> impl Future<Output = Result<Exec, ExecutorError>> + Send;

    /// The error of a step whose exec ended (with `exited`, if known) before the sentinel:
    /// what the environment says (gone, failed, its node lost), or a lost stream. `said` is
    /// the last of what came on the exec's stderr.
    fn lost(&self, step: &str, exited: Option<i32>, said: &[u8]) -> impl Future<Output = ExecutorError> + Send;

    /// Ends the whole environment: a step's processes could not be killed one by one. Bounded:
    /// it returns within a few seconds, ended or not.
    fn end_environment(&self, why: &str) -> impl Future<Output = ()> + Send;

    /// How much of a limit of the environment its processes use (its pids, which a fork bomb
    /// exhausts: no process can then be started there, a sweep included), read without
    /// starting anything there. Asked beside the sweep after a timeout, a cancellation or a lost
    /// stream, and after a failed sweep otherwise; it should answer within a few seconds of
    /// [`SWEEP_WITHIN`]. An answer with [`Usage::refused`] is taken as one read at once (a
    /// file), and asked again after a failed sweep.
    /// `None` by default, and when it cannot be read.
    fn usage(&self) -> impl Future<Output = Option<Usage>> + Send {
        std::future::ready(None)
    }

    /// Ends, with the error, when the environment is known to be lost while a step runs
    /// (a pod deleted, its node lost): the step ends at once, whatever its stream does (it
    /// may hang), and the environment is ended. Never ends by default.
    fn failed(&self) -> impl Future<Output = ExecutorError> + Send {
        std::future::pending()
    }

    /// The environment, for messages: `container X`, `pod Y`.
    fn describe(&self) -> String;
}

/// How the step's first phase ended.
enum Ending {
    Reported(i32),
    Lost(Option<i32>),
    TimedOut,
    Cancelled,
    Failed(ExecutorError),
}

/// Runs one step (see the module's documentation) in `workdir` of the environment.
pub async fn run_step<S: Shell>(
    shell: &S,
    params: &CommandParams,
    workdir: &str,
    context: &Context,
) -> Result<CommandResult, ExecutorError> {
    let name = if params.name.is_empty() { params.step.to_string() } else { params.name.clone() };
    let nonce = payload::nonce()?;
    let script = payload::build(&payload::Step {
        env: &params.env,
        secrets: &params.secrets,
        workdir,
        script: &params.script,
        nonce: &nonce,
    })?;
    let deadline = tokio::time::Instant::from_std(context.deadline(params.timeout_ms));
    let started = Instant::now();
    let Exec { mut stdin, stdout, stderr, ended } = shell.exec(vec!["sh".to_string(), "-s".to_string()]).await?;
    let mut step = StepStreams {
        pipes: OutputPipes::new(Some(stdout), Some(stderr)),
        filter: SentinelFilter::new(&nonce),
        out_filter: SentinelFilter::for_stdout(&nonce),
        tail: Vec::new(),
        stderr_done: false,
        stdout_done: false,
    };
    // The payload holds the secrets: it goes into the exec's stdin and nowhere else.
    let write = async move {
        let _ = stdin.write_all(script.as_bytes()).await;
        let _ = stdin.shutdown().await;
    };
    tokio::pin!(write);
    let mut written = false;
    let mut ended = ended;
    let mut exited: Option<Option<i32>> = None;
    let failed = shell.failed();
    tokio::pin!(failed);
    let ending = loop {
        // The exit code comes on stderr: it is the step's once its stdout is whole too (the
        // mark the payload prints there after the step came), whatever the two streams' delays.
        if let Some(code) = step.filter.code() {
            if step.out_filter.output_ended() {
                break Ending::Reported(code);
            }
            if !step.pipes.stdout_open() {
                break Ending::Lost(exited.flatten());
            }
        }
        if let Some(code) = exited.filter(|_| !step.pipes.is_open()) {
            break Ending::Lost(code);
        }
        tokio::select! {
            chunk = step.pipes.read(), if step.pipes.is_open() => step.send(chunk, context, &params.session, params.step).await,
            code = &mut ended, if exited.is_none() => exited = Some(code),
            () = &mut write, if !written => written = true,
            () = tokio::time::sleep_until(deadline) => break Ending::TimedOut,
            () = context.cancelled() => break Ending::Cancelled,
            error = &mut failed => break Ending::Failed(error),
        }
    };
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);

    let describe = shell.describe();
    let end = StepEnd { shell, params, context, name: &name, describe: &describe };
    match ending {
        Ending::Reported(exit_code) => end.reported(&mut step, exit_code, duration_ms).await,
        Ending::TimedOut => end.interrupted(&mut step, true).await,
        Ending::Cancelled => end.interrupted(&mut step, false).await,
        Ending::Failed(error) => end.failed(error).await,
        Ending::Lost(code) => end.lost(&mut step, code).await,
    }
}

/// What the end of a step needs, whichever way it ended: the environment, the step's
/// parameters, its name and the environment's description for messages, and the context it
/// answers through.
struct StepEnd<'a, S> {
    shell: &'a S,
    params: &'a CommandParams,
    context: &'a Context,
    name: &'a str,
    describe: &'a str,
}

impl<S: Shell> StepEnd<'_, S> {
    /// A step that reported its exit code: the processes a secret-bearing step left running
    /// are swept, the output still on its way is sent, and a kill for memory is logged, and is
    /// the step's error when its exit code is not 0.
    async fn reported(
        &self,
        step: &mut StepStreams,
        exit_code: i32,
        duration_ms: u64,
    ) -> Result<CommandResult, ExecutorError> {
        let &StepEnd { shell, params, context, name, describe } = self;
        let mut killed_processes = 0;
        if !params.secrets.is_empty() {
            killed_processes = match sweep_or_end(shell, step.filter.snapshot(), name, false).await {
                Ok(killed) => killed,
                Err(Unswept::Exhausted(limit)) => {
                    let message = format!("step {name} {limit}: {describe} was killed");
                    context.log(&params.session, LogLevel::Error, message.clone()).await;
                    return Err(ExecutorError::new(ErrorKind::StepFailed, message));
                }
                Err(Unswept::Failed(error)) => return Err(error),
            };
            if killed_processes > 0 {
                let message =
                    format!("step {name} was given secrets and left {killed_processes} processes running: killed them");
                tracing::info!(session = %params.session, step = params.step, "{message}");
                context.log(&params.session, LogLevel::Warn, message).await;
            }
        }
        step.settle(SETTLE, context, &params.session, params.step).await;
        tracing::info!(session = %params.session, step = params.step, exit_code, duration_ms, killed_processes, "step ended");
        if let Some(kills) = step.filter.oom_kills().filter(|kills| *kills > 0) {
            let message =
                format!("step {name} ran out of memory (OOMKilled): the kernel killed {kills} of its processes");
            context.log(&params.session, LogLevel::Error, message.clone()).await;
            if exit_code != 0 {
                return Err(ExecutorError::new(
                    ErrorKind::StepFailed,
                    format!("step {name} ran out of memory (OOMKilled), exit code {exit_code}"),
                ));
            }
        }
        Ok(CommandResult { exit_code, duration_ms, killed_processes })
    }

    /// A step that passed its timeout (`timed_out`) or was cancelled: its processes are swept.
    /// Its error is a cancellation, a timeout, or, at a timeout where its processes exhausted a
    /// limit of the environment, the step's own.
    async fn interrupted(&self, step: &mut StepStreams, timed_out: bool) -> Result<CommandResult, ExecutorError> {
        let &StepEnd { shell, params, context, name, describe } = self;
        // The snapshot may still be on its way.
        if step.filter.snapshot().is_none() {
            step.settle(SETTLE, context, &params.session, params.step).await;
        }
        let killed = sweep_or_end(shell, step.filter.snapshot(), name, true).await;
        step.settle(SETTLE, context, &params.session, params.step).await;
        tracing::info!(session = %params.session, step = params.step, killed = ?killed.as_ref().ok(), "step killed");
        let exhausted = match killed {
            Ok(_) => None,
            Err(Unswept::Exhausted(limit)) => Some(limit),
            Err(Unswept::Failed(error)) => return Err(error),
        };
        Err(match (timed_out, exhausted) {
            // The step's own fault, which its timeout only revealed.
            (true, Some(limit)) => {
                let message = format!(
                    "step {name} {limit}: {describe} was killed at the step's timeout of {} ms",
                    params.timeout_ms
                );
                context.log(&params.session, LogLevel::Error, message.clone()).await;
                ExecutorError::new(ErrorKind::StepFailed, message)
            }
            (true, None) => {
                let message = format!("step {name} passed its timeout of {}", super::timeout_text(params.timeout_ms));
                context.log(&params.session, LogLevel::Error, message.clone()).await;
                ExecutorError::timeout(message)
            }
            _ => ExecutorError::cancelled(),
        })
    }

    /// A step whose environment was lost while it ran ([`Shell::failed`]): the environment is
    /// ended, and the step's error is `error`.
    async fn failed(&self, error: ExecutorError) -> Result<CommandResult, ExecutorError> {
        let &StepEnd { shell, params, context, .. } = self;
        // Its processes die with the environment; a sweep would hang on it.
        shell.end_environment(&error.message).await;
        tracing::error!(session = %params.session, step = params.step, "{}", error.message);
        context.log(&params.session, LogLevel::Error, error.message.clone()).await;
        Err(error)
    }

    /// A step whose stream ended before its exit code (`code`, the exec's, when known): its
    /// processes are swept, and its error is what [`Shell::lost`] says, or the step's own
    /// fault when its processes exhausted a limit of the environment.
    async fn lost(&self, step: &mut StepStreams, code: Option<i32>) -> Result<CommandResult, ExecutorError> {
        let &StepEnd { shell, params, context, name, describe } = self;
        // The step may still run in the environment: end it.
        let error = match sweep_or_end(shell, step.filter.snapshot(), name, true).await {
            Err(Unswept::Exhausted(limit)) => ExecutorError::new(
                ErrorKind::StepFailed,
                format!("the processes of step {name} {limit}: {describe} was killed"),
            ),
            other => {
                if let Err(Unswept::Failed(failure)) = other {
                    tracing::warn!(session = %params.session, step = params.step, "{}", failure.message);
                }
                shell.lost(name, code, &step.tail).await
            }
        };
        tracing::error!(session = %params.session, step = params.step, "{}", error.message);
        context.log(&params.session, LogLevel::Error, error.message.clone()).await;
        Err(error)
    }
}

/// Why a step's processes were not swept; the environment was ended either way.
#[derive(Debug)]
enum Unswept {
    /// The environment's processes exhausted a limit of it (see [`Shell::usage`]).
    Exhausted(String),
    /// The sweep failed, or could not know what to sweep: an infrastructure error.
    Failed(ExecutorError),
}

/// Kills the step's processes; when that cannot be done, ends the environment and says why.
/// The environment is asked how much of its limits its processes use (see [`Shell::usage`]; a
/// sweep cannot run where one is exhausted) when the sweep fails, and with `check_first`
/// beside it, its answer awaited whatever the sweep did: near a limit, the step's processes
/// exhausted it, and the environment is ended.
async fn sweep_or_end<S: Shell>(
    shell: &S,
    snapshot: Option<&Snapshot>,
    name: &str,
    check_first: bool,
) -> Result<u32, Unswept> {
    let exhausted = |limit: String| async move {
        shell.end_environment(&format!("the processes of step {name} {limit}")).await;
        Unswept::Exhausted(limit)
    };
    // With `check_first`, the environment's usage is asked beside the sweep, not before it:
    // a limit at its end ends the sweep (which cannot start there), and a failed sweep has the
    // answer at hand, within the sweep's own bound. A failed sweep with a limit near its end
    // is the processes' doing too.
    let probe = async { if check_first { shell.usage().await } else { None } };
    let sweeping = async {
        match snapshot {
            Some(snapshot) => sweep(shell, snapshot).await,
            None => Err(ExecutorError::infrastructure(format!(
                "step {name} in {} never said which processes were there before it",
                shell.describe()
            ))),
        }
    };
    tokio::pin!(probe, sweeping);
    let mut probed = None;
    let swept = loop {
        tokio::select! {
            usage = &mut probe, if probed.is_none() => match usage {
                Some(usage) if usage.at_the_limit() => return Err(exhausted(usage.exhausted()).await),
                usage => probed = Some(usage),
            },
            swept = &mut sweeping => break swept,
        }
    };
    let usage = match (&swept, probed) {
        // A count of refusals is read at once: after a failed sweep it is read again, as the
        // limit may have been reached while the sweep ran (and refused it).
        (Err(_), Some(Some(usage))) if usage.refused.is_some() => shell.usage().await.or(Some(usage)),
        (_, Some(usage)) => usage,
        (_, None) if check_first => probe.await,
        (Ok(_), None) => None,
        (Err(_), None) => shell.usage().await,
    };
    // A sweep that could still start may come just before the limit's end: the usage says
    // whether the step's processes had all but exhausted it.
    if swept.is_ok()
        && let Some(usage) = usage.as_ref().filter(|usage| usage.near_the_limit())
    {
        return Err(exhausted(usage.exhausted()).await);
    }
    let error = match swept {
        Ok(killed) => return Ok(killed),
        Err(error) => error,
    };
    let in_use = match &usage {
        Some(usage) if usage.near_the_limit() => return Err(exhausted(usage.exhausted()).await),
        Some(usage) => format!(" ({} of its {} limit of {} in use)", usage.used, usage.limit_name, usage.limit),
        None => String::new(),
    };
    let why = format!("cannot kill the processes of step {name}: {}{in_use}", error.message);
    shell.end_environment(&why).await;
    Err(Unswept::Failed(ExecutorError::infrastructure(format!("{why}; ended {}", shell.describe()))))
}

/// Runs [`payload::SWEEP`] in the environment; returns how many processes it killed.
pub async fn sweep<S: Shell>(shell: &S, snapshot: &Snapshot) -> Result<u32, ExecutorError> {
    let run = async {
        let Exec { mut stdin, mut stdout, mut stderr, ended } = shell.exec(payload::sweep_argv(snapshot)).await?;
        let line = snapshot.line();
        let feed = async move {
            let _ = stdin.write_all(line.as_bytes()).await;
            let _ = stdin.shutdown().await;
        };
        let mut said = Vec::new();
        let mut errors = Vec::new();
        let (mut out, mut err) = ((&mut stdout).take(4096), (&mut stderr).take(4096));
        let read_out = out.read_to_end(&mut said);
        let read_err = err.read_to_end(&mut errors);
        let ((), _, _, code) = tokio::join!(feed, read_out, read_err, ended);
        let text = String::from_utf8_lossy(&said);
        text.trim().parse::<u32>().map_err(|_| {
            ExecutorError::infrastructure(format!(
                "the process sweep in {} ended with {} and answered {:?}: {}",
                shell.describe(),
                code.map_or("no exit code".to_string(), |code| format!("exit code {code}")),
                text.trim(),
                String::from_utf8_lossy(&errors).trim()
            ))
        })
    };
    match tokio::time::timeout(SWEEP_WITHIN, run).await {
        Ok(result) => result,
        Err(_) => Err(ExecutorError::infrastructure(format!(
            "the process sweep in {} did not end within {} s",
            shell.describe(),
            SWEEP_WITHIN.as_secs()
        ))),
    }
}

/// A step's output streams, the filter taking the payload's messages out of stderr, and the
/// tail of what came on stderr.
struct StepStreams {
    pipes: OutputPipes<Reader, Reader>,
    filter: SentinelFilter,
    /// The filter taking the payload's mark of the end of the step's output out of stdout.
    out_filter: SentinelFilter,
    tail: Vec<u8>,
    stderr_done: bool,
    stdout_done: bool,
}

impl StepStreams {
    /// Sends a chunk on, stderr through the filter; at the end of stderr, what it held.
    async fn send(&mut self, chunk: Option<(Stream, Vec<u8>)>, context: &Context, session: &str, step: u32) {
        let (stream, bytes) = match chunk {
            Some((Stream::Stderr, bytes)) => (Stream::Stderr, self.filter.push(&bytes)),
            Some((Stream::Stdout, bytes)) => (Stream::Stdout, self.out_filter.push(&bytes)),
            None if !self.pipes.stderr_open() && !self.stderr_done => {
                self.stderr_done = true;
                (Stream::Stderr, self.filter.finish())
            }
            None if !self.pipes.stdout_open() && !self.stdout_done => {
                self.stdout_done = true;
                (Stream::Stdout, self.out_filter.finish())
            }
            None => return,
        };
        if stream == Stream::Stderr {
            self.tail.extend_from_slice(&bytes);
            let excess = self.tail.len().saturating_sub(TAIL);
            self.tail.drain(..excess);
        }
        if !bytes.is_empty() {
            context.output(session, step, stream, &bytes).await;
        }
    }

    /// Sends what comes until both streams close or `within` passes, then stops reading.
    async fn settle(&mut self, within: Duration, context: &Context, session: &str, step: u32) {
        let settle = tokio::time::sleep(within);
        tokio::pin!(settle);
        while self.pipes.is_open() {
            tokio::select! {
                chunk = self.pipes.read() => self.send(chunk, context, session, step).await,
                () = &mut settle => break,
            }
        }
    }
}

#[cfg(test)]
mod tests;
