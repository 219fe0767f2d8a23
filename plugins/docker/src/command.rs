//! `command`: one step as `docker exec -i <container> sh -s` with its payload on stdin, its
//! output streamed as it comes, its exit code read from the payload's sentinel, killed inside
//! the container at its timeout or on cancellation, and the processes a secret-bearing step
//! left behind killed after it.
//!
//! Killing the local `docker exec` kills nothing in the container, so every kill is the sweep
//! ([`sweep::SWEEP`]) of the processes carrying the step's marker. An exec that ends without
//! the sentinel is an infrastructure error when the container is gone.

use std::time::{Duration, Instant};

use knotless_protocol::sdk::Context;
use knotless_protocol::sdk::output::OutputPipes;
use knotless_protocol::sdk::payload::{self, SentinelFilter};
use knotless_protocol::*;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStderr, ChildStdout};

use crate::DockerExecutor;
use crate::argv;
use crate::config::Config;
use crate::docker::tail;
use crate::session::Session;
use crate::sweep;

/// How long output is read after the step reported its exit while `docker exec` stays open
/// (a service the step left running holds its output).
const SETTLE: Duration = Duration::from_millis(200);

/// How long the sweep of a step's processes may take.
const SWEEP_WITHIN: Duration = Duration::from_secs(30);

/// How the step's first phase ended.
enum Ending {
    Reported(i32),
    ExecEnded(Option<i32>),
    TimedOut,
    Cancelled,
}

/// `command`.
pub async fn run(
    executor: &DockerExecutor,
    params: CommandParams,
    context: Context,
) -> Result<CommandResult, ExecutorError> {
    let config = executor.config()?;
    let session = executor.session(&params.session)?;
    let step_name = if params.name.is_empty() { params.step.to_string() } else { params.name.clone() };
    payload::check_names(&params.env, &params.secrets, sweep::MARKER)?;
    let workdir = session.resolve(params.workdir.as_deref().unwrap_or("/work"))?;
    let marker = format!("{}.{}.{}", session.id, params.step, payload::random_hex(8)?);
    let nonce = payload::nonce()?;
    let script = payload::build(&payload::Step {
        env: &params.env,
        secrets: &params.secrets,
        marker_variable: sweep::MARKER,
        marker: &marker,
        workdir: &workdir,
        script: &params.script,
        nonce: &nonce,
    })?;
    let deadline = tokio::time::Instant::from_std(context.deadline(params.timeout_ms));
    let mut child = config
        .docker
        .command(&argv::exec_step(&session.container))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .map_err(|error| {
            ExecutorError::infrastructure(format!("cannot run the docker CLI for step {step_name}: {error}"))
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        // The payload holds the secrets: it goes to the pipe and nowhere else.
        tokio::spawn(async move {
            let _ = stdin.write_all(script.as_bytes()).await;
            let _ = stdin.shutdown().await;
        });
    }
    let started = Instant::now();
    tracing::info!(session = %session.id, container = %session.container, image = %session.image,
        step = params.step, name = %params.name, "step started");
    let mut pipes = Pipes::new(child.stdout.take(), child.stderr.take(), SentinelFilter::new(&nonce));
    let mut exited = None;
    let ending = loop {
        if let Some(code) = pipes.filter.code() {
            break Ending::Reported(code);
        }
        tokio::select! {
            chunk = pipes.read(), if pipes.open() => pipes.send(chunk, &context, &session.id, params.step).await,
            status = child.wait(), if exited.is_none() => {
                exited = Some(status.ok().and_then(|status| status.code()));
            }
            () = tokio::time::sleep_until(deadline) => break Ending::TimedOut,
            () = context.cancelled() => break Ending::Cancelled,
        }
        if exited.is_some() && !pipes.open() {
            break match pipes.filter.code() {
                Some(code) => Ending::Reported(code),
                None => Ending::ExecEnded(exited.flatten()),
            };
        }
    };
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);

    match ending {
        Ending::Reported(exit_code) => {
            let mut killed_processes = 0;
            if !params.secrets.is_empty() {
                killed_processes = sweep(&config, &session, &marker).await?;
                if killed_processes > 0 {
                    let message = format!(
                        "step {step_name} was given secrets and left {killed_processes} processes running: killed them"
                    );
                    tracing::info!(session = %session.id, step = params.step, "{message}");
                    context.log(&session.id, LogLevel::Warn, message).await;
                }
            }
            pipes.drain(&mut child, &context, &session.id, params.step).await;
            tracing::info!(session = %session.id, step = params.step, exit_code, duration_ms, "step ended");
            Ok(CommandResult { exit_code, duration_ms, killed_processes })
        }
        Ending::TimedOut | Ending::Cancelled => {
            let _ = child.start_kill();
            let killed = sweep(&config, &session, &marker).await;
            pipes.drain(&mut child, &context, &session.id, params.step).await;
            tracing::info!(session = %session.id, step = params.step, killed = ?killed, "step killed");
            killed?;
            Err(match ending {
                Ending::TimedOut => {
                    let message = format!("step {step_name} passed its timeout of {} ms", params.timeout_ms);
                    context.log(&session.id, LogLevel::Error, message.clone()).await;
                    ExecutorError::timeout(message)
                }
                _ => ExecutorError::cancelled(),
            })
        }
        Ending::ExecEnded(code) => {
            let said = tail(&pipes.stderr_tail);
            let state = config.docker.state(&session.container).await;
            let daemon_refused = said.contains("Error response from daemon") || said.contains("OCI runtime");
            let error = match state {
                Ok(Some(state)) if state == "running" && daemon_refused => ExecutorError::infrastructure(format!(
                    "docker exec of step {step_name} failed in container {}: {said}",
                    session.container
                )),
                // The step's completion is proven by the sentinel only: an exec that ended
                // without it lost the stream, whatever its own exit code says.
                Ok(Some(state)) if state == "running" => ExecutorError::infrastructure(format!(
                    "lost the exec stream of step {step_name} in container {}: docker exec ended with {} before \
                     the step reported its exit code: {said}",
                    session.container,
                    code.map_or("a signal".to_string(), |code| format!("exit code {code}"))
                )),
                Ok(state) => ExecutorError::infrastructure(format!(
                    "container {} of session {} is {} during step {step_name}: {said}",
                    session.container,
                    session.id,
                    state.map_or("gone".to_string(), |state| format!("{state}, no longer running"))
                )),
                Err(failure) => ExecutorError::infrastructure(format!(
                    "step {step_name} lost its docker exec and container {} cannot be inspected ({failure}): {said}",
                    session.container
                )),
            };
            tracing::error!(session = %session.id, step = params.step, "{}", error.message);
            Err(error)
        }
    }
}

/// Kills every process of the step inside the container; returns how many.
async fn sweep(config: &Config, session: &Session, marker: &str) -> Result<u32, ExecutorError> {
    let stdout =
        config.docker.output(&argv::sweep(&session.container, marker), SWEEP_WITHIN).await.map_err(|failure| {
            ExecutorError::infrastructure(format!(
                "cannot kill the processes of a step in container {} of session {}: {failure}",
                session.container, session.id
            ))
        })?;
    Ok(String::from_utf8_lossy(&stdout).trim().parse().unwrap_or(0))
}

/// The step's stdout and stderr, the filter taking the sentinel out of stderr, and the
/// tail of what came on stderr, for errors.
struct Pipes {
    output: OutputPipes<ChildStdout, ChildStderr>,
    filter: SentinelFilter,
    stderr_tail: Vec<u8>,
}

impl Pipes {
    fn new(stdout: Option<ChildStdout>, stderr: Option<ChildStderr>, filter: SentinelFilter) -> Pipes {
        Pipes { output: OutputPipes::new(stdout, stderr), filter, stderr_tail: Vec::new() }
    }

    fn open(&self) -> bool {
        self.output.is_open()
    }

    /// The next chunk from either pipe; `None` when a pipe just closed. Cancel-safe.
    async fn read(&mut self) -> Option<(Stream, Vec<u8>)> {
        self.output.read().await
    }

    /// Sends a chunk on, stderr through the filter; at the end of stderr, what it held.
    async fn send(&mut self, chunk: Option<(Stream, Vec<u8>)>, context: &Context, session: &str, step: u32) {
        let (stream, bytes) = match chunk {
            Some((Stream::Stderr, bytes)) => (Stream::Stderr, self.filter.push(&bytes)),
            Some(other) => other,
            None if !self.output.stderr_open() => (Stream::Stderr, self.filter.finish()),
            None => return,
        };
        if stream == Stream::Stderr {
            self.stderr_tail.extend_from_slice(&bytes);
            let excess = self.stderr_tail.len().saturating_sub(4096);
            self.stderr_tail.drain(..excess);
        }
        if !bytes.is_empty() {
            context.output(session, step, stream, &bytes).await;
        }
    }

    /// Sends what is left until both pipes close or [`SETTLE`] passes, then lets the local
    /// `docker exec` go (killing it kills nothing in the container) and reaps it.
    async fn drain(&mut self, child: &mut Child, context: &Context, session: &str, step: u32) {
        let settle = tokio::time::sleep(SETTLE);
        tokio::pin!(settle);
        while self.open() {
            tokio::select! {
                chunk = self.read() => self.send(chunk, context, session, step).await,
                () = &mut settle => break,
            }
        }
        self.output.close();
        let _ = child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
    }
}
