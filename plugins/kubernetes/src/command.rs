//! `command`: one step as `kubectl exec -i <pod> -- sh -s` with the payload on stdin, its
//! output streamed as it comes with the sentinel stripped, killed in the pod (by its marker)
//! at its timeout or on cancellation, and its leftovers killed after a secret-bearing step.
//!
//! Timeout and cancellation kill the step's processes in the pod, not only the local
//! kubectl; when that kill cannot be done, the Job is deleted. The Job itself is deleted by
//! `stop`, which the runner always sends, so outputs can still be downloaded first.
//! A stream that closes without the sentinel is an infrastructure error naming what the pod
//! says (gone, node lost) or "lost the exec stream".

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use knotless_protocol::sdk::Context;
use knotless_protocol::sdk::output::OutputPipes;
use knotless_protocol::sdk::payload::{self, SentinelFilter};
use knotless_protocol::*;
use tokio::io::AsyncWriteExt;

use crate::KubernetesExecutor;
use crate::kubectl::{self, Kubectl};
use crate::pod::{self, PodState};
use crate::procs;
use crate::session::{self, CALL_LIMIT, Session};

/// How long output is read after the sentinel while the stream stays open (a process the
/// step left running holds it).
const SETTLE: Duration = Duration::from_millis(300);

/// How the exec ended.
enum Ending {
    Closed,
    TimedOut,
    Cancelled,
}

/// `command`.
pub async fn run(
    executor: &KubernetesExecutor,
    params: CommandParams,
    context: Context,
) -> Result<CommandResult, ExecutorError> {
    let kubectl = executor.kubectl()?;
    let session = executor.session(&params.session)?;
    let name = if params.name.is_empty() { params.step.to_string() } else { params.name.clone() };
    let deadline = tokio::time::Instant::from_std(context.deadline(params.timeout_ms));
    let number = session.steps.fetch_add(1, Ordering::SeqCst);
    let marker = format!("{}.{number}", session.nonce);
    let nonce = payload::nonce()?;
    let workdir = match &params.workdir {
        Some(dir) if dir.starts_with('/') => dir.clone(),
        Some(dir) => format!("/work/{dir}"),
        None => "/work".to_string(),
    };
    let step = payload::Step {
        env: &params.env,
        secrets: &params.secrets,
        marker_variable: procs::MARKER,
        marker: &marker,
        workdir: &workdir,
        script: &params.script,
        nonce: &nonce,
    };
    let payload = payload::build(&step)?;
    let secret_bearing = !params.secrets.is_empty();
    let before = if secret_bearing { procs::list(&kubectl, &session.pod).await? } else { BTreeSet::new() };

    tracing::info!(job = %session.job, namespace = %session.namespace, image = %session.image, step = params.step, name = %name, "step started");
    let args = kubectl::exec_args(&session.pod, &["sh", "-s"]);
    let mut command = kubectl.command(&args);
    command.stdin(Stdio::piped());
    let started = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|error| ExecutorError::infrastructure(format!("cannot run kubectl exec for step {name}: {error}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        // Written whole, then closed: `sh -s` reads to the end of the block before running it.
        let written = stdin.write_all(payload.as_bytes()).await;
        drop(stdin);
        if let Err(error) = written {
            tracing::warn!(step = params.step, error = %error, "the payload was not written whole");
        }
    }
    let mut pipes = OutputPipes::new(child.stdout.take(), child.stderr.take());
    let mut filter = SentinelFilter::new(&nonce);
    let mut tail: Vec<u8> = Vec::new();
    let mut stderr_done = false;
    let mut settle: Option<tokio::time::Instant> = None;
    let ending = loop {
        if !pipes.is_open() {
            break Ending::Closed;
        }
        if filter.code().is_some() && settle.is_none() {
            settle = Some(tokio::time::Instant::now() + SETTLE);
        }
        tokio::select! {
            chunk = pipes.read() => match chunk {
                Some((Stream::Stdout, bytes)) => context.output(&session.id, params.step, Stream::Stdout, &bytes).await,
                Some((Stream::Stderr, bytes)) => {
                    let bytes = filter.push(&bytes);
                    keep_tail(&mut tail, &bytes);
                    context.output(&session.id, params.step, Stream::Stderr, &bytes).await;
                }
                // Once stderr has closed, the filter gives up what it held back, once.
                None if !pipes.stderr_open() && !stderr_done => {
                    stderr_done = true;
                    let rest = filter.finish();
                    keep_tail(&mut tail, &rest);
                    context.output(&session.id, params.step, Stream::Stderr, &rest).await;
                }
                None => {}
            },
            () = sleep_until(settle) => break Ending::Closed,
            () = tokio::time::sleep_until(deadline) => break Ending::TimedOut,
            () = context.cancelled() => break Ending::Cancelled,
        }
    };
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let _ = child.start_kill();
    let status = child.wait().await.ok();

    if let Ending::TimedOut | Ending::Cancelled = ending {
        kill_or_delete(executor, &kubectl, &session, &marker, &before).await;
        tracing::info!(job = %session.job, namespace = %session.namespace, image = %session.image, step = params.step, "step killed");
        return Err(match ending {
            Ending::TimedOut => {
                let message = format!("step {name} passed its timeout of {} ms: killed", params.timeout_ms);
                context.log(&session.id, LogLevel::Error, message.clone()).await;
                ExecutorError::timeout(message)
            }
            _ => ExecutorError::cancelled(),
        });
    }
    let Some(exit_code) = filter.code() else {
        let code = status.and_then(|status| status.code());
        let error = lost_stream(&kubectl, &session, &name, code, &tail).await;
        // The step may still run in the pod: end it.
        let _ = procs::kill(&kubectl, &session.pod, &marker, &before).await;
        tracing::warn!(job = %session.job, namespace = %session.namespace, image = %session.image, step = params.step, error = %error.message, "step lost");
        context.log(&session.id, LogLevel::Error, error.message.clone()).await;
        return Err(error);
    };
    let mut killed_processes = 0;
    if secret_bearing {
        killed_processes = procs::kill(&kubectl, &session.pod, &marker, &before).await.map_err(|error| {
            ExecutorError::infrastructure(format!("cannot sweep the processes step {name} left: {}", error.message))
        })?;
        if killed_processes > 0 {
            let message =
                format!("step {name} was given secrets and left {killed_processes} processes running: killed them");
            context.log(&session.id, LogLevel::Warn, message).await;
        }
    }
    tracing::info!(job = %session.job, namespace = %session.namespace, image = %session.image, step = params.step, exit_code, duration_ms, killed_processes, "step ended");
    Ok(CommandResult { exit_code, duration_ms, killed_processes })
}

/// Kills a timed-out or cancelled step in the pod; when that fails, deletes the Job so
/// nothing of the step runs on.
async fn kill_or_delete(
    executor: &KubernetesExecutor,
    kubectl: &Kubectl,
    session: &Session,
    marker: &str,
    before: &BTreeSet<u32>,
) {
    if let Err(error) = procs::kill(kubectl, &session.pod, marker, before).await {
        tracing::warn!(job = %session.job, error = %error.message, "cannot kill the step in its pod: deleting the job");
        let _ = session::delete_job(kubectl, &session.job, &session.selector, &session.image).await;
        executor.sessions().remove(&session.id);
    }
}

/// The error of a stream that closed without the sentinel, with what the pod says.
async fn lost_stream(
    kubectl: &Kubectl,
    session: &Session,
    name: &str,
    code: Option<i32>,
    tail: &[u8],
) -> ExecutorError {
    // Only kubectl's own error lines: the step's output may hold what the log masks.
    let text = String::from_utf8_lossy(tail);
    let said = text
        .lines()
        .filter(|line| line.starts_with("error:") || line.starts_with("Error from server"))
        .collect::<Vec<_>>()
        .join(" | ");
    let said = if said.is_empty() { String::new() } else { format!(": {said}") };
    let exited = code.map(|code| format!("kubectl exited with {code}")).unwrap_or_else(|| "kubectl was killed".into());
    let pod = kubectl.run(&kubectl::get_pod_args(&session.pod), None, CALL_LIMIT).await;
    let cause = match pod {
        Ok(output) if output.status.success() => {
            let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
            match pod::from_pod(&value) {
                PodState::Failed { cause, .. } => format!("the pod {} failed: {cause}", session.pod),
                _ => format!("lost the exec stream of pod {} ({exited}){said}", session.pod),
            }
        }
        Ok(output) if output.stderr_text().contains("NotFound") => {
            format!("the pod {} is gone (its job {} was deleted, or its node lost)", session.pod, session.job)
        }
        Ok(output) => format!("lost the exec stream ({exited}){said}; kubectl get pod: {}", output.stderr_text()),
        Err(error) => format!("lost the exec stream ({exited}){said}; {}", error.message),
    };
    ExecutorError::infrastructure(format!("step {name} has no result: {cause}"))
}

/// Keeps the last 512 bytes of what the stream said, for the error message.
fn keep_tail(tail: &mut Vec<u8>, bytes: &[u8]) {
    tail.extend_from_slice(bytes);
    if tail.len() > 512 {
        tail.drain(..tail.len() - 512);
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
