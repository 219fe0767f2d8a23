//! `command`: one step as `/bin/sh -ec <script>` in its own process group, its output
//! streamed as it comes, killed at its timeout or on cancellation, and the processes a
//! secret-bearing step left behind killed after it.
//!
//! When the step's main process exits, output is read on until both pipes close or
//! [`SETTLE`] passes with them still open: a process the step left running (`sleep 100 &`)
//! holds the pipes, and the step must not wait for it. A non-secret step's leftovers may go
//! on running (a step may start a service for later steps) but their later output is not
//! attributed to any step; a secret-bearing step's leftovers are killed before the pipes
//! are drained.

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use knotless_protocol::sdk::Context;
use knotless_protocol::sdk::output::OutputPipes;
use knotless_protocol::*;
use tokio::process::{ChildStderr, ChildStdout, Command};

use crate::ShellExecutor;
use crate::processes::{self, MARKER, ProcessInfo, Table};
use crate::session::Session;

/// How long output is read after the step's main process exited while the pipes stay open.
const SETTLE: Duration = Duration::from_millis(200);

/// How the step's main process ended.
enum Ending {
    Exited(ExitStatus),
    TimedOut,
    Cancelled,
}

/// `command`.
pub async fn run(
    executor: &ShellExecutor,
    params: CommandParams,
    context: Context,
) -> Result<CommandResult, ExecutorError> {
    let config = executor.config()?;
    let session = executor.session(&params.session)?;
    let step_name = if params.name.is_empty() { params.step.to_string() } else { params.name.clone() };
    let workdir = match &params.workdir {
        Some(workdir) => session.folder("work").join(workdir),
        None => session.folder("work"),
    };
    if !workdir.is_dir() {
        return Err(ExecutorError::configuration(format!(
            "cannot run step {step_name} in session {}: no folder {}",
            session.id,
            workdir.display()
        )));
    }
    let deadline = tokio::time::Instant::from_std(context.deadline(params.timeout_ms));
    // What the session already runs (a service an earlier step started) is not this step's.
    let before = processes::marked(&session.marker);

    let mut command = step_command(&params, &session, &config.path);
    command.current_dir(&workdir);
    let started = Instant::now();
    let mut child = command.spawn().map_err(|error| {
        ExecutorError::infrastructure(format!(
            "cannot start /bin/sh for step {step_name} in session {}: {error}",
            session.id
        ))
    })?;
    let group = child.id().map(|pid| pid as i32);
    tracing::debug!(session = %session.id, step = params.step, name = %params.name, pid = ?group, "step started");
    let mut pipes = Pipes::new(child.stdout.take(), child.stderr.take());
    // The step's processes: the session's, but what ran before the step and what that forks
    // since (a service's workers) are spared.
    let belongs = |process: &ProcessInfo, table: &Table| {
        process.marker.as_deref() == Some(session.marker.as_str()) && !processes::descends_from(process, table, &before)
    };

    let ending = loop {
        tokio::select! {
            chunk = pipes.read(), if pipes.is_open() => {
                if let Some((stream, bytes)) = chunk {
                    context.output(&session.id, params.step, stream, &bytes).await;
                }
            }
            status = child.wait() => {
                let status = status.map_err(|error| {
                    ExecutorError::infrastructure(format!("cannot wait for step {step_name} in session {}: {error}", session.id))
                })?;
                break Ending::Exited(status);
            }
            () = tokio::time::sleep_until(deadline) => break Ending::TimedOut,
            () = context.cancelled() => break Ending::Cancelled,
        }
    };
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);

    let status = match ending {
        Ending::Exited(status) => status,
        Ending::TimedOut | Ending::Cancelled => {
            let killed = processes::terminate(belongs, group, processes::GRACE).await;
            // The main process is dead (or a zombie): reap it.
            let _ = child.start_kill();
            let _ = child.wait().await;
            drain(&mut pipes, &context, &session.id, params.step).await;
            tracing::info!(session = %session.id, step = params.step, killed = killed.len(), "step killed");
            return Err(match ending {
                Ending::TimedOut => {
                    let message = format!("step {step_name} passed its timeout of {} ms", params.timeout_ms);
                    context.log(&session.id, LogLevel::Error, message.clone()).await;
                    ExecutorError::timeout(message)
                }
                _ => ExecutorError::cancelled(),
            });
        }
    };

    let mut killed_processes = 0;
    if !params.secrets.is_empty() {
        let killed: BTreeSet<i32> = processes::terminate(belongs, group, processes::GRACE).await;
        killed_processes = u32::try_from(killed.len()).unwrap_or(u32::MAX);
        if killed_processes > 0 {
            let message = format!(
                "step {step_name} was given secrets and left {killed_processes} processes running: killed them"
            );
            tracing::info!(session = %session.id, step = params.step, processes = ?killed, "{message}");
            context.log(&session.id, LogLevel::Warn, message).await;
        }
    }
    drain(&mut pipes, &context, &session.id, params.step).await;
    let exit_code = status.code().or_else(|| status.signal().map(|signal| 128 + signal)).unwrap_or(-1);
    tracing::debug!(session = %session.id, step = params.step, exit_code, duration_ms, "step ended");
    Ok(CommandResult { exit_code, duration_ms, killed_processes })
}

/// The step's `sh -ec <script>`: a cleared environment with only what the step is given,
/// stdin from `/dev/null`, its own process group. Nothing but the script reaches argv.
fn step_command(params: &CommandParams, session: &Session, path: &str) -> Command {
    let mut command = Command::new("/bin/sh");
    command
        .arg("-ec")
        .arg(&params.script)
        .env_clear()
        .env("PATH", path)
        .env("HOME", session.folder("home"))
        .env("TMPDIR", session.folder("tmp"))
        .env("LANG", "C.UTF-8")
        .envs(&params.env)
        .envs(&params.secrets)
        .env(MARKER, &session.marker)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    command
}

/// The step's output pipes.
type Pipes = OutputPipes<ChildStdout, ChildStderr>;

/// Sends what is left in the pipes until both close or [`SETTLE`] passes, then closes them:
/// what a leftover process writes later is not the step's.
async fn drain(pipes: &mut Pipes, context: &Context, session: &str, step: u32) {
    let settle = tokio::time::sleep(SETTLE);
    tokio::pin!(settle);
    while pipes.is_open() {
        tokio::select! {
            chunk = pipes.read() => {
                if let Some((stream, bytes)) = chunk {
                    context.output(session, step, stream, &bytes).await;
                }
            }
            () = &mut settle => break,
        }
    }
    pipes.close();
}
