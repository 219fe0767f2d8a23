//! `command`: one step as an exec of `sh -s` in the pod over the API's websocket, the payload
//! on its stdin, through the SDK's remote-shell step loop ([`knotless_protocol::sdk::remote`]):
//! its output streamed as it comes with the payload's messages stripped, its exit code taken
//! from the sentinel and checked against the exec's status channel, and the processes of a
//! timed-out, cancelled, lost or secret-bearing step swept out of the pod (every process
//! there is not init, not there before the step and not a worker of what was). When that
//! sweep cannot be done, the Job is deleted.
//!
//! While a step runs, the session's pod watch is its other witness: a pod that is deleted
//! (its Job deleted, its node lost) or stops being Ready (its node stopped answering) ends the
//! step at once as an infrastructure error naming that, even when the exec stream hangs. A
//! stream that ends without the sentinel is an infrastructure error naming what the pod says
//! (gone, node lost) or "lost the exec stream", never a result.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod as PodObject;
use knotless_protocol::sdk::Context;
use knotless_protocol::sdk::remote::{self, Exec, Shell};
use knotless_protocol::*;
use kube::api::Api;
use tokio_util::task::AbortOnDropHandle;

use crate::KubernetesExecutor;
use crate::api::Client;
use crate::manifest::CONTAINER;
use crate::pod::{self, PodState};
use crate::session::{self, Session};

/// How long a lost stream's explanation waits for the watch to show the pod's state.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// `command`.
pub async fn run(
    executor: &KubernetesExecutor,
    params: CommandParams,
    context: Context,
) -> Result<CommandResult, ExecutorError> {
    let session = executor.sessions.get(&params.session)?;
    let client = executor.cluster.get()?.client().await?;
    let workdir = match &params.workdir {
        Some(dir) if dir.starts_with('/') => dir.clone(),
        Some(dir) => format!("/work/{dir}"),
        None => "/work".to_string(),
    };
    tracing::info!(job = %session.job, namespace = %session.namespace, image = %session.image, step = params.step, name = %params.name, "step started");
    let ended = Arc::new(Mutex::new(None));
    let _follow = follow_endings(&session, Arc::clone(&ended));
    let pod = Pod { client: &client, session: &session, said: Arc::new(Mutex::new(None)), ended };
    remote::run_step(&pod, &params, &workdir, &context).await
}

/// Follows the session's pod watch while a step runs, keeping the last word on a container
/// that ended (`OOMKilled`, `Error`, ...): the pod may be gone by the time a lost stream is
/// explained, and its status with it.
fn follow_endings(session: &Session, ended: Arc<Mutex<Option<String>>>) -> AbortOnDropHandle<()> {
    let mut seen = session.pods.seen.clone();
    AbortOnDropHandle::new(tokio::spawn(async move {
        loop {
            let cause = seen.borrow_and_update().pod.as_ref().and_then(pod::ended_container_of);
            if cause.is_some() {
                *knotless_protocol::sdk::lock(&ended) = cause;
            }
            if seen.changed().await.is_err() {
                return;
            }
        }
    }))
}

/// A session's pod, reached through the API's exec.
pub struct Pod<'a> {
    /// The client.
    pub client: &'a Client,
    /// The session.
    pub session: &'a Session,
    /// What the last exec's status said when it was no exit code.
    pub said: Arc<Mutex<Option<String>>>,
    /// Why a container of the pod ended, as the watch last showed it while the step ran.
    pub ended: Arc<Mutex<Option<String>>>,
}

impl Shell for Pod<'_> {
    async fn exec(&self, argv: Vec<String>) -> Result<Exec, ExecutorError> {
        let session = self.session;
        self.client.exec(&session.namespace, &session.pod, CONTAINER, argv, Some(Arc::clone(&self.said))).await
    }

    async fn lost(&self, step: &str, exited: Option<i32>, _said: &[u8]) -> ExecutorError {
        let session = self.session;
        let status = knotless_protocol::sdk::lock(&self.said).take();
        let status = match (exited, status) {
            (Some(code), _) => format!("the exec ended with {code} but the step never said it ended"),
            (None, Some(status)) => format!("the exec ended: {status}"),
            (None, None) => "the exec stream ended without a status".to_string(),
        };
        // A container that ended (killed for its memory, say) is the cause, whatever became of
        // the pod since; the kubelet's word may come just after the stream's end.
        let mut seen = session.pods.seen.clone();
        let settled = seen.wait_for(|seen| {
            seen.deleted || seen.pod.as_ref().is_none_or(|pod| pod::ended_container_of(pod).is_some())
        });
        let _ = tokio::time::timeout(SETTLE, settled).await;
        let seen_ended = seen.borrow().pod.as_ref().and_then(pod::ended_container_of);
        if let Some(ended) = seen_ended.or_else(|| knotless_protocol::sdk::lock(&self.ended).clone()) {
            return ExecutorError::infrastructure(format!(
                "step {step} has no result: the pod {} failed: {ended}",
                session.pod
            ));
        }
        let pods: Api<PodObject> = self.client.api(&session.namespace);
        let found = self.client.limited(&format!("get the pod {}", session.pod), pods.get_opt(&session.pod)).await;
        let cause = match found {
            Ok(Some(object)) => match pod::from_pod(&object) {
                PodState::Failed { cause, .. } => format!("the pod {} failed: {cause}", session.pod),
                _ => format!("lost the exec stream of pod {} ({status})", session.pod),
            },
            Ok(None) => {
                format!("the pod {} is gone (its job {} was deleted, or its node lost)", session.pod, session.job)
            }
            Err(error) => format!("lost the exec stream ({status}); {}", error.message),
        };
        ExecutorError::infrastructure(format!("step {step} has no result: {cause}"))
    }

    async fn end_environment(&self, why: &str) {
        let session = self.session;
        tracing::warn!(job = %session.job, "{why}: deleting the job");
        // Asked to go, not waited for: the session stays known, and `stop` waits for it.
        let _ =
            session::delete_job(self.client, &session.namespace, &session.job, &session.selector, &session.image, None)
                .await;
    }

    async fn failed(&self) -> ExecutorError {
        let session = self.session;
        let mut seen = session.pods.seen.clone();
        let broken = seen
            .wait_for(|seen| seen.deleted || seen.pod.as_ref().is_some_and(|pod| pod::broken(pod).is_some()))
            .await
            .map(|seen| seen.pod.as_ref().and_then(pod::broken));
        let cause = match broken {
            Ok(Some(cause)) => cause,
            _ => "the pod is gone (its job was deleted, or its node lost)".to_string(),
        };
        ExecutorError::infrastructure(format!("the pod {} of job {} cannot go on: {cause}", session.pod, session.job))
    }

    fn describe(&self) -> String {
        format!("pod {}", self.session.pod)
    }
}
