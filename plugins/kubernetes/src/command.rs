//! `command`: one step as `kubectl exec -i <pod> -- sh -s` with the payload on stdin,
//! through the SDK's remote-shell step loop ([`knotless_protocol::sdk::remote`]): its output
//! streamed as it comes with the payload's messages stripped, and the processes of a
//! timed-out, cancelled, lost or secret-bearing step swept out of the pod (every process
//! there is not init, not there before the step and not a worker of what was). When that
//! sweep cannot be done, the Job is deleted.
//!
//! The Job itself is deleted by `stop`, which the runner always sends, so outputs can still
//! be downloaded first. A stream that closes without the sentinel is an infrastructure error
//! naming what the pod says (gone, node lost) or "lost the exec stream".

use std::process::Stdio;

use knotless_protocol::sdk::Context;
use knotless_protocol::sdk::remote::{self, Exec, Shell};
use knotless_protocol::*;

use crate::KubernetesExecutor;
use crate::kubectl::{self, Kubectl};
use crate::pod::{self, PodState};
use crate::session::{self, CALL_LIMIT, Session};

/// `command`.
pub async fn run(
    executor: &KubernetesExecutor,
    params: CommandParams,
    context: Context,
) -> Result<CommandResult, ExecutorError> {
    let kubectl = executor.kubectl()?;
    let session = executor.session(&params.session)?;
    let workdir = match &params.workdir {
        Some(dir) if dir.starts_with('/') => dir.clone(),
        Some(dir) => format!("/work/{dir}"),
        None => "/work".to_string(),
    };
    tracing::info!(job = %session.job, namespace = %session.namespace, image = %session.image, step = params.step, name = %params.name, "step started");
    let pod = Pod { kubectl: &kubectl, session: &session };
    remote::run_step(&pod, &params, &workdir, &context).await
}

/// A session's pod, reached through `kubectl exec`.
struct Pod<'a> {
    kubectl: &'a Kubectl,
    session: &'a Session,
}

impl Shell for Pod<'_> {
    async fn exec(&self, argv: Vec<String>) -> Result<Exec, ExecutorError> {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut command = self.kubectl.command(&kubectl::exec_args(&self.session.pod, &argv));
        command.stdin(Stdio::piped());
        let child = command.spawn().map_err(|error| {
            ExecutorError::infrastructure(format!("cannot run kubectl exec in pod {}: {error}", self.session.pod))
        })?;
        Exec::from_child(child, "kubectl exec")
    }

    async fn lost(&self, step: &str, exited: Option<i32>, said: &[u8]) -> ExecutorError {
        lost_stream(self.kubectl, self.session, step, exited, said).await
    }

    async fn end_environment(&self, why: &str) {
        let session = self.session;
        tracing::warn!(job = %session.job, "{why}: deleting the job");
        // The session stays known: `stop` deletes the Job again, or finds it gone.
        let _ = session::delete_job(self.kubectl, &session.job, &session.selector, &session.image).await;
    }

    fn describe(&self) -> String {
        format!("pod {}", self.session.pod)
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
