//! `start`, `stop` and `shutdown`: the runner's NetworkPolicy, the session's Job, the wait for
//! its pod to be Ready (ending fast, with the cause, when it never will), and the Job's delete.

use std::time::{Duration, Instant};

use knotless_protocol::sdk::Context;
use knotless_protocol::*;

use crate::kubectl::{self, Kubectl};
use crate::manifest::{self, JobSpecInput};
use crate::names::{self, RUN_LABEL, RUNNER_LABEL};
use crate::pod::{self, PodState};
use crate::{KubernetesExecutor, lock};

/// How long one kubectl call for the Job's lifecycle may take.
pub const CALL_LIMIT: Duration = Duration::from_secs(120);

/// A started session: its Job and Ready pod.
#[derive(Debug)]
pub struct Session {
    /// The runner's session id.
    pub id: String,
    /// The Job's name.
    pub job: String,
    /// The pod's name.
    pub pod: String,
    /// The namespace.
    pub namespace: String,
    /// The image.
    pub image: String,
    /// The label selector of this session's objects.
    pub selector: String,
    /// Started with `keep`: `stop` and `shutdown` leave its Job in place.
    pub keep: bool,
}

/// The selector of one session's objects.
pub fn run_selector(runner_id: &str, session: &str) -> String {
    format!("{RUNNER_LABEL}={},{RUN_LABEL}={}", names::label_value(runner_id), names::label_value(session))
}

/// `start`.
pub async fn start(
    executor: &KubernetesExecutor,
    params: StartParams,
    context: Context,
) -> Result<StartResult, ExecutorError> {
    let config = executor.config()?;
    let kubectl = Kubectl::new(&config);
    if executor.sessions().contains_key(&params.session) {
        return Err(ExecutorError::configuration(format!("session {} is already started", params.session)));
    }
    let image = params.image.clone().filter(|image| !image.is_empty()).unwrap_or_else(|| config.image.clone());
    let input = JobSpecInput {
        runner_id: config.runner_id.clone(),
        session: params.session.clone(),
        check_key: params.run.check_key.clone(),
        namespace: config.namespace.clone(),
        image: image.clone(),
        cpu: params.resources.cpu.clone().or_else(|| config.cpu_request.clone()),
        memory: params.resources.memory.clone().or_else(|| config.memory_request.clone()),
        service_account: config.service_account.clone(),
        node_selector: config.node_selector.clone(),
        deadline_secs: manifest::deadline_secs(params.run_timeout_ms),
        ttl_secs: (!params.keep).then_some(config.ttl_seconds),
    };
    let job = manifest::job(&input);
    let job_name = names::job_name(&config.runner_id, &params.session);
    let selector = run_selector(&config.runner_id, &params.session);
    let started = Instant::now();
    // Leave time to delete the Job and answer before the SDK's own timeout.
    let deadline = context
        .deadline(params.timeout_ms)
        .checked_sub(Duration::from_secs(3))
        .unwrap_or_else(Instant::now)
        .min(Instant::now() + Duration::from_secs(config.ready_timeout_secs));

    {
        let mut starting = executor.policy.lock().await;
        let policy = manifest::network_policy(&config.runner_id, &config.namespace);
        let policy = manifest::to_json(&policy).map_err(|error| ExecutorError::infrastructure(error.to_string()))?;
        let applied = kubectl.run(&kubectl::apply_args(), Some(&policy), CALL_LIMIT).await?;
        if !applied.status.success() && !applied.stderr_text().contains("AlreadyExists") {
            let error = kubectl::failed(&kubectl::apply_args(), &applied);
            let message =
                format!("cannot apply the NetworkPolicy {}: {}", names::policy_name(&config.runner_id), error);
            return Err(ExecutorError::infrastructure(message));
        }
        *starting += 1;
    }
    let result = start_job(&kubectl, &job, &job_name, &selector, &image, deadline, &context, &params.session).await;
    let outcome = match result {
        Ok(pod) => {
            tracing::info!(job = %job_name, namespace = %config.namespace, image = %image, pod = %pod,
                ms = started.elapsed().as_millis() as u64, "pod ready");
            let description = format!("job {job_name} (pod {pod}) in {}", config.namespace);
            let session = Session {
                id: params.session.clone(),
                job: job_name,
                pod,
                namespace: config.namespace.clone(),
                image,
                selector,
                keep: params.keep,
            };
            executor.sessions().insert(params.session.clone(), std::sync::Arc::new(session));
            Ok(description)
        }
        Err(error) => {
            context.log(&params.session, LogLevel::Error, error.message.clone()).await;
            let _ = delete_job(&kubectl, &job_name, &selector, &image).await;
            Err(error)
        }
    };
    // Counted as starting until it is a session, so the policy is never retired under it.
    *executor.policy.lock().await -= 1;
    if outcome.is_err() {
        let _ = retire_policy(executor, &kubectl).await;
    }
    let description = outcome?;
    let paths = SessionPaths { work: "/work".into(), steps: "/steps".into(), outputs: "/outputs".into() };
    Ok(StartResult { paths, description: Some(description) })
}

/// Applies the Job and waits for its pod to be Ready; the pod's name.
#[allow(clippy::too_many_arguments)]
async fn start_job(
    kubectl: &Kubectl,
    job: &k8s_openapi::api::batch::v1::Job,
    job_name: &str,
    selector: &str,
    image: &str,
    deadline: Instant,
    context: &Context,
    session: &str,
) -> Result<String, ExecutorError> {
    let manifest = manifest::to_json(job).map_err(|error| ExecutorError::infrastructure(error.to_string()))?;
    let applied = kubectl.run(&kubectl::apply_args(), Some(&manifest), CALL_LIMIT).await?;
    if !applied.status.success() {
        let error = kubectl::failed(&kubectl::apply_args(), &applied);
        return Err(ExecutorError::infrastructure(format!("cannot create the Job {job_name}: {}", error.message)));
    }
    tracing::info!(job = %job_name, namespace = %kubectl.namespace, image = %image, "job started");
    context.log(session, LogLevel::Info, format!("job {job_name} started in {} with {image}", kubectl.namespace)).await;
    wait_ready(kubectl, job_name, selector, deadline).await
}

/// Polls the run's pod until it is Ready, failed, or the deadline passed.
async fn wait_ready(kubectl: &Kubectl, job: &str, selector: &str, deadline: Instant) -> Result<String, ExecutorError> {
    let mut pause = Duration::from_millis(100);
    let mut polls = 0u32;
    let mut last = String::from("no pod yet");
    loop {
        polls += 1;
        let listed = kubectl.ok(&kubectl::get_pods_args(selector), None, CALL_LIMIT).await?;
        let list: serde_json::Value = serde_json::from_slice(&listed.stdout).map_err(|error| {
            ExecutorError::infrastructure(format!("kubectl get pods for job {job} gave no JSON: {error}"))
        })?;
        let mut state = pod::from_list(&list);
        let consult_events = match &state {
            PodState::Pending { detail, .. } => detail.starts_with("unschedulable") || polls % 3 == 0,
            _ => false,
        };
        if consult_events && let PodState::Pending { name, .. } = &state {
            let events = kubectl.ok(&kubectl::get_events_args(name), None, CALL_LIMIT).await?;
            let events: serde_json::Value = serde_json::from_slice(&events.stdout).unwrap_or_default();
            state = pod::with_events(state, &events);
        }
        match state {
            PodState::Ready { name } => return Ok(name),
            PodState::Failed { name, cause } => {
                return Err(ExecutorError::infrastructure(format!("the pod {name} of job {job} cannot run: {cause}")));
            }
            PodState::Pending { name, detail } => last = format!("pod {name}: {detail}"),
            PodState::Missing if polls > 1 => {
                // The Job controller may lag; a Job that is gone is not worth waiting for.
                let jobs = kubectl.ok(&kubectl::get_jobs_args(selector), None, CALL_LIMIT).await?;
                let jobs: serde_json::Value = serde_json::from_slice(&jobs.stdout).unwrap_or_default();
                if jobs.get("items").and_then(serde_json::Value::as_array).is_some_and(Vec::is_empty) {
                    return Err(ExecutorError::infrastructure(format!("the job {job} was deleted before its pod ran")));
                }
            }
            PodState::Missing => {}
        }
        if Instant::now() + pause >= deadline {
            return Err(ExecutorError::infrastructure(format!(
                "the pod of job {job} did not become Ready in time: {last}"
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// Deletes a session's Job (foreground: its pod first) and any pod it left.
pub async fn delete_job(kubectl: &Kubectl, job: &str, selector: &str, image: &str) -> Result<(), ExecutorError> {
    let deleted = kubectl.ok(&kubectl::delete_jobs_args(&[job.to_string()]), None, CALL_LIMIT).await;
    let pods = kubectl.ok(&kubectl::delete_pods_args(selector), None, CALL_LIMIT).await;
    match deleted.and(pods) {
        Ok(_) => {
            tracing::info!(job = %job, namespace = %kubectl.namespace, image = %image, "job deleted");
            Ok(())
        }
        Err(error) => {
            tracing::warn!(job = %job, namespace = %kubectl.namespace, image = %image, error = %error.message, "job delete failed");
            Err(error)
        }
    }
}

/// Deletes the runner's NetworkPolicy when no session is live or starting.
pub async fn retire_policy(executor: &KubernetesExecutor, kubectl: &Kubectl) -> Result<bool, ExecutorError> {
    let config = executor.config()?;
    let starting = executor.policy.lock().await;
    if *starting > 0 || !executor.sessions().is_empty() {
        return Ok(false);
    }
    let name = names::policy_name(&config.runner_id);
    kubectl.ok(&kubectl::delete_policy_args(&name), None, CALL_LIMIT).await?;
    drop(starting);
    tracing::info!(policy = %name, namespace = %kubectl.namespace, "network policy deleted");
    Ok(true)
}

/// `stop`.
pub async fn stop(
    executor: &KubernetesExecutor,
    params: StopParams,
    _context: Context,
) -> Result<StopResult, ExecutorError> {
    let kubectl = executor.kubectl()?;
    let session =
        executor.sessions().remove(&params.session).ok_or_else(|| ExecutorError::unknown_session(&params.session))?;
    if params.keep || session.keep {
        tracing::info!(job = %session.job, namespace = %session.namespace, image = %session.image, "job kept");
        return Ok(StopResult::default());
    }
    let deleted = delete_job(&kubectl, &session.job, &session.selector, &session.image).await;
    if let Err(error) = deleted {
        // Forgotten here, so the orphan sweep takes the Job when the cluster answers again.
        return Err(ExecutorError::infrastructure(format!("cannot delete job {}: {}", session.job, error.message)));
    }
    let mut removed = vec![
        Resource { kind: "job".into(), name: session.job.clone(), session: Some(session.id.clone()) },
        Resource { kind: "pod".into(), name: session.pod.clone(), session: Some(session.id.clone()) },
    ];
    if let Ok(true) = retire_policy(executor, &kubectl).await {
        let config = executor.config()?;
        removed.push(Resource {
            kind: "networkpolicy".into(),
            name: names::policy_name(&config.runner_id),
            session: None,
        });
    }
    Ok(StopResult { removed })
}

/// `shutdown`: deletes the Job of every session still here but those started with `keep`
/// (and those kept at `stop`, which were forgotten then).
pub async fn shutdown(executor: &KubernetesExecutor) {
    let Ok(kubectl) = executor.kubectl() else { return };
    let sessions: Vec<_> = lock(&executor.sessions).drain().map(|(_, session)| session).collect();
    for session in &sessions {
        if session.keep {
            tracing::info!(job = %session.job, namespace = %session.namespace, "keeping the job at shutdown");
            continue;
        }
        let _ = delete_job(&kubectl, &session.job, &session.selector, &session.image).await;
    }
    let _ = retire_policy(executor, &kubectl).await;
    tracing::info!(sessions = sessions.len(), "shut down");
}
