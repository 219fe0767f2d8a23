//! `command`: one step as `/bin/sh -ec <script>` under a reaper ([`crate::reaper`]), its
//! output streamed as it comes, killed at its timeout or on cancellation, and the processes
//! a secret-bearing step left behind killed after it.
//!
//! When the step's shell exits, output is read on until both pipes close or [`SETTLE`]
//! passes with them still open: a process the step left running (`sleep 100 &`) holds the
//! pipes, and the step must not wait for it. A non-secret step's leftovers may go on running
//! (a step may start a service for later steps) under their reaper, which the session keeps
//! until `stop`; their later output is not attributed to any step. A step that left nothing
//! gives its reaper back to the session for the next step. A secret-bearing step's leftovers
//! are killed, and its reaper has exited, before the result is sent: no process holding the
//! step's secrets outlives it.

use std::time::{Duration, Instant};

use knotless_protocol::sdk::Context;
use knotless_protocol::sdk::output::OutputPipes;
use knotless_protocol::*;
use tokio::net::unix::pipe::Receiver;

use crate::ShellExecutor;
use crate::config::Config;
use crate::processes::GRACE;
use crate::reaper::{self, Event, Reaper, StepSpec};
use crate::session::Session;

/// How long output is read after the step's main process exited while the pipes stay open.
const SETTLE: Duration = Duration::from_millis(200);

/// How the step's shell ended.
enum Ending {
    Exited(i32),
    TimedOut,
    Cancelled,
    /// Its reaper ended before the shell did: the step killed or stopped it.
    Lost,
    /// Its shell could not be started.
    Failed(String),
}

/// `command`.
pub async fn run(
    executor: &ShellExecutor,
    params: CommandParams,
    context: Context,
) -> Result<CommandResult, ExecutorError> {
    let config = executor.config.get()?;
    let session = executor.sessions.get(&params.session)?;
    let step_name = if params.name.is_empty() { params.step.to_string() } else { params.name.clone() };
    let workdir = match &params.workdir {
        Some(workdir) => session.folder("work").join(workdir),
        None => session.folder("work"),
    };
    // Whether the folder is there is asked only when the step could not start in it: a
    // system call less on every step's way.
    let no_folder = || {
        (!workdir.is_dir()).then(|| {
            ExecutorError::configuration(format!(
                "cannot run step {step_name} in session {}: no folder {}",
                session.id,
                workdir.display()
            ))
        })
    };
    let deadline = tokio::time::Instant::from_std(context.deadline(params.timeout_ms));
    let spec = StepSpec { script: &params.script, env: step_env(&params, &session, &config), workdir: &workdir };
    let started = Instant::now();
    let cannot_start = |error: &dyn std::fmt::Display| {
        ExecutorError::infrastructure(format!("cannot start the step {step_name} in session {}: {error}", session.id))
    };
    let (mut reaper, stdout, stderr) = start(&session, spec).await.map_err(|error| cannot_start(&error))?;
    tracing::debug!(session = %session.id, step = params.step, name = %params.name, reaper = reaper.pid(), "step started");
    let mut pipes = Pipes::new(Some(stdout), Some(stderr));

    let ending = watch(&mut reaper, &mut pipes, &context, &session, params.step, deadline).await;
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);

    let exit_code = match ending {
        Ending::Exited(code) => code,
        Ending::TimedOut | Ending::Cancelled => {
            let killed = kill(reaper, &context, &session, &step_name).await;
            drain(&mut pipes, &context, &session.id, params.step).await;
            tracing::info!(session = %session.id, step = params.step, killed, "step killed");
            return Err(match ending {
                Ending::TimedOut => {
                    let message = format!(
                        "step {step_name} passed its timeout of {}",
                        knotless_protocol::sdk::timeout_text(params.timeout_ms)
                    );
                    context.log(&session.id, LogLevel::Error, message.clone()).await;
                    ExecutorError::timeout(message)
                }
                _ => ExecutorError::cancelled(),
            });
        }
        Ending::Failed(error) => {
            drain(&mut pipes, &context, &session.id, params.step).await;
            session.keep_idle(reaper);
            return Err(no_folder().unwrap_or_else(|| cannot_start(&error)));
        }
        Ending::Lost => {
            // Once the reaper is collected, its orphans are this process's children.
            reaper.abandon().await;
            let killed = reaper::kill_orphans().await;
            drain(&mut pipes, &context, &session.id, params.step).await;
            return Err(ExecutorError::infrastructure(format!(
                "step {step_name} in session {} killed or stopped the process that watches it; killed the {killed} processes it left",
                session.id
            )));
        }
    };

    let killed_processes = after_exit(reaper, &mut pipes, &context, &session, &params, &step_name).await;
    tracing::debug!(session = %session.id, step = params.step, exit_code, duration_ms, "step ended");
    Ok(CommandResult { exit_code, duration_ms, killed_processes })
}

/// Streams the step's output until its shell ends, its reaper is lost, its deadline passes,
/// or it is cancelled (the request, or the session's stop); says which.
async fn watch(
    reaper: &mut Reaper,
    pipes: &mut Pipes,
    context: &Context,
    session: &Session,
    step: u32,
    deadline: tokio::time::Instant,
) -> Ending {
    loop {
        tokio::select! {
            chunk = pipes.read(), if pipes.is_open() => {
                if let Some((stream, bytes)) = chunk {
                    context.output(&session.id, step, stream, &bytes).await;
                }
            }
            event = reaper.next() => match event {
                Event::Exit(code) => break Ending::Exited(code),
                Event::Failed(error) => break Ending::Failed(error),
                Event::Killed { .. } | Event::Idle | Event::Gone | Event::Lost => break Ending::Lost,
            },
            () = tokio::time::sleep_until(deadline) => break Ending::TimedOut,
            () = context.cancelled() => break Ending::Cancelled,
            () = session.stopped.cancelled() => break Ending::Cancelled,
        }
    }
}

/// Once the step's shell has exited: a secret-bearing step's processes are killed with its
/// reaper, and what is left in the pipes is sent; another step's last output is read, and its
/// reaper goes back to the session, idle or with the processes the step left running. Returns
/// how many processes were killed.
async fn after_exit(
    mut reaper: Reaper,
    pipes: &mut Pipes,
    context: &Context,
    session: &Session,
    params: &CommandParams,
    step_name: &str,
) -> u32 {
    let mut killed_processes = 0;
    if !params.secrets.is_empty() {
        killed_processes = kill(reaper, context, session, step_name).await;
        if killed_processes > 0 {
            let message = format!(
                "step {step_name} was given secrets and left {killed_processes} processes running: killed them"
            );
            tracing::info!(session = %session.id, step = params.step, "{message}");
            context.log(&session.id, LogLevel::Warn, message).await;
        }
        drain(pipes, context, &session.id, params.step).await;
    } else {
        match settle(&mut reaper, pipes, context, &session.id, params.step).await {
            Settled::Idle => session.keep_idle(reaper),
            // Leftovers live on (a service for later steps): their reaper stays with the session.
            Settled::Running => session.linger(reaper),
            Settled::Lost => {
                reaper.abandon().await;
                reaper::kill_orphans().await;
            }
        }
    }
    killed_processes
}

/// Runs the step under the session's idle reaper, or a new one when there is none or it is
/// gone (killed while it waited); returns the reaper and the step's pipes.
async fn start(session: &Session, spec: StepSpec<'_>) -> std::io::Result<(Reaper, Receiver, Receiver)> {
    if let Some(mut idle) = session.take_idle() {
        match idle.run(spec.clone()).await {
            Ok((stdout, stderr)) => return Ok((idle, stdout, stderr)),
            Err(error) if error.kind() == std::io::ErrorKind::InvalidInput => {
                // Refused before anything was sent: the reaper still waits.
                session.keep_idle(idle);
                return Err(error);
            }
            Err(error) => {
                tracing::debug!(session = %session.id, reaper = idle.pid(), "an idle reaper is gone: {error}");
                idle.abandon().await;
            }
        }
    }
    let mut reaper = Reaper::spawn()?;
    match reaper.run(spec).await {
        Ok((stdout, stderr)) => Ok((reaper, stdout, stderr)),
        Err(error) => {
            reaper.abandon().await;
            Err(error)
        }
    }
}

/// The step's whole environment: of the executor's own, only `PATH` and the user's
/// ([`crate::config::HOST_VARIABLES`], `LC_*`), then what the step is given. `HOME` is the
/// session's own folder when the user has none, `LANG` is `C.UTF-8` when unset, and `TMPDIR`
/// is always the session's.
fn step_env(params: &CommandParams, session: &Session, config: &Config) -> Vec<(String, String)> {
    let mut env = vec![
        ("PATH".to_string(), config.path.clone()),
        ("HOME".to_string(), session.folder("home").to_string_lossy().into_owned()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ];
    env.extend(config.host_env.iter().cloned());
    env.push(("TMPDIR".to_string(), session.folder("tmp").to_string_lossy().into_owned()));
    env.extend(params.env.iter().map(|(name, value)| (name.clone(), value.clone())));
    env.extend(params.secrets.iter().map(|(name, value)| (name.clone(), value.clone())));
    env
}

/// Has the reaper kill every process of the step and waits for it to exit; kills the
/// step's orphans itself when the reaper is lost. Returns how many it killed.
async fn kill(reaper: Reaper, context: &Context, session: &Session, step_name: &str) -> u32 {
    let ended = reaper.end(GRACE).await;
    if !ended.stuck.is_empty() {
        let message = format!(
            "step {step_name} left processes that outlived SIGKILL: {}",
            ended.stuck.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")
        );
        tracing::warn!(session = %session.id, "{message}");
        context.log(&session.id, LogLevel::Warn, message).await;
    }
    let orphans = if ended.lost { reaper::kill_orphans().await } else { 0 };
    u32::try_from(ended.killed.len()).unwrap_or(u32::MAX).saturating_add(orphans)
}

/// What a step left when its shell ended.
enum Settled {
    /// Nothing: its reaper waits for another step.
    Idle,
    /// Processes that go on running.
    Running,
    /// Its reaper died: what it left is this process's.
    Lost,
}

/// Reads the step's last output until both pipes close and the reaper says it is idle, or
/// [`SETTLE`] passes; then closes the pipes.
async fn settle(reaper: &mut Reaper, pipes: &mut Pipes, context: &Context, session: &str, step: u32) -> Settled {
    let until = tokio::time::Instant::now() + SETTLE;
    let settle = tokio::time::sleep_until(until);
    tokio::pin!(settle);
    let mut idle = false;
    // The pipes and the reaper come first, and the timer is polled only when neither has
    // anything: a step whose end is all there already (the usual case) never registers it
    // with the runtime, which costs a wake-up of the runtime's own. The clock, read on every
    // turn, ends the wait even when a leftover process floods the pipes.
    while (pipes.is_open() || !idle) && tokio::time::Instant::now() < until {
        tokio::select! {
            biased;
            chunk = pipes.read(), if pipes.is_open() => {
                if let Some((stream, bytes)) = chunk {
                    context.output(session, step, stream, &bytes).await;
                }
            }
            event = reaper.next(), if !idle => match event {
                Event::Idle => idle = true,
                Event::Exit(_) | Event::Failed(_) | Event::Killed { .. } | Event::Gone | Event::Lost => {
                    pipes.close();
                    return Settled::Lost;
                }
            },
            () = &mut settle => break,
        }
    }
    pipes.close();
    if idle { Settled::Idle } else { Settled::Running }
}

/// The step's output pipes.
type Pipes = OutputPipes<Receiver, Receiver>;

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
