//! `start`, `stop` and `shutdown`: the runner's NetworkPolicy, the session's Job, the wait for
//! its pod to be Ready (ending fast, with the cause, when it never will), and the Job's delete.
//!
//! The wait is driven by watches (the run's pod, the events about the Job and about the pod):
//! an image that cannot be pulled, a Job that cannot create its pod (`FailedCreate`), a pod
//! deleted, or an autoscaler that will not add a node (`NotTriggerScaleUp`) end it at once,
//! naming the cause. An Unschedulable pod waits while the cluster may still scale (a
//! `TriggeredScaleUp` came, or no `NotTriggerScaleUp` yet), up to `scale-up-timeout` from
//! when it was first Unschedulable.

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use knotless_protocol::sdk::Context;
use knotless_protocol::*;
use kube::api::{Api, DeleteParams, ListParams, PropagationPolicy};
use kube::core::Status;

use crate::KubernetesExecutor;
use crate::api::Client;
use crate::manifest::{self, JobSpecInput};
use crate::names::{self, RUN_LABEL, RUNNER_LABEL};
use crate::pod::{self, PodState, Said, Scale};
use crate::services;
use crate::watch::{EventWatch, PodWatch};

/// How long `stop` waits for the pod to be gone once deleted with no grace.
const GONE_WITHIN: Duration = Duration::from_secs(30);

/// A started session: its Job and Ready pod.
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
    /// The watch of its pod, for the session's life.
    pub pods: PodWatch,
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
    let config = executor.config.get()?;
    if executor.sessions.lock().contains_key(&params.session) {
        return Err(ExecutorError::configuration(format!("session {} is already started", params.session)));
    }
    Service::check_all(&params.services)?;
    let client = executor.cluster.get()?.client().await?;
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
        services: params.services.clone(),
    };
    let job = manifest::job(&input);
    let job_name = names::job_name(&config.runner_id, &params.session);
    let selector = run_selector(&config.runner_id, &params.session);
    let started = Instant::now();
    // Leave time to delete the Job and answer before the SDK's own timeout.
    let deadline = context.deadline(params.timeout_ms).checked_sub(Duration::from_secs(3)).unwrap_or_else(Instant::now);
    let limits = Limits {
        ready: Instant::now() + Duration::from_secs(config.ready_timeout_secs),
        scale_up: Duration::from_secs(config.scale_up_timeout_secs),
        hard: deadline,
    };

    {
        let mut policy = executor.policy.lock().await;
        if !policy.applied {
            let object = manifest::network_policy(&config.runner_id, &config.namespace);
            let what = format!("create the NetworkPolicy {}", names::policy_name(&config.runner_id));
            // An existing policy (another process of this runner made it) is success.
            client.create::<NetworkPolicy>(&config.namespace, &object, &what).await?;
            policy.applied = true;
        }
        policy.starting += 1;
    }
    // Watching before the Job exists: its pod's every state is seen.
    let pods = PodWatch::start(&client, &config.namespace, &selector);
    let result =
        start_job(&client, &job, &job_name, &image, &params.services, &pods, &limits, &context, &params.session).await;
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
                pods,
            };
            executor.sessions.lock().insert(params.session.clone(), std::sync::Arc::new(session));
            Ok(description)
        }
        Err(error) => {
            context.log(&params.session, LogLevel::Error, error.message.clone()).await;
            let _ = delete_job(&client, &config.namespace, &job_name, &selector, &image, Some(&pods)).await;
            Err(error)
        }
    };
    // Counted as starting until it is a session, so the policy is never retired under it.
    executor.policy.lock().await.starting -= 1;
    if outcome.is_err() {
        let _ = retire_policy(executor, &client).await;
    }
    let description = outcome?;
    let paths = SessionPaths { work: "/work".into(), steps: "/steps".into(), outputs: "/outputs".into() };
    Ok(StartResult { paths, description: Some(description) })
}

/// How long a start may wait.
struct Limits {
    /// For the pod to be Ready (`ready-timeout`), unless it waits for a node.
    ready: Instant,
    /// For a node, from when the pod was first Unschedulable (`scale-up-timeout`).
    scale_up: Duration,
    /// Whatever it waits for: the start's own deadline.
    hard: Instant,
}

/// Creates the Job and waits for its pod to be Ready; the pod's name.
#[allow(clippy::too_many_arguments)]
async fn start_job(
    client: &Client,
    job: &Job,
    job_name: &str,
    image: &str,
    services: &[Service],
    pods: &PodWatch,
    limits: &Limits,
    context: &Context,
    session: &str,
) -> Result<String, ExecutorError> {
    let namespace = job.metadata.namespace.clone().unwrap_or_default();
    let what = format!("create the Job {job_name}");
    if client.create::<Job>(&namespace, job, &what).await?.is_none() {
        return Err(ExecutorError::configuration(format!("{what}: a Job of that name exists already")));
    }
    tracing::info!(job = %job_name, namespace = %namespace, image = %image, "job started");
    let beside = match services.iter().map(|service| service.name.as_str()).collect::<Vec<_>>() {
        names if names.is_empty() => String::new(),
        names => format!(" and services {}", names.join(", ")),
    };
    context.log(session, LogLevel::Info, format!("job {job_name} started in {namespace} with {image}{beside}")).await;
    let pod = wait_ready(client, &namespace, job_name, pods, limits).await?;
    services::wait_healthy(client, &namespace, &pod, services, pods, limits.hard).await?;
    Ok(pod)
}

/// Waits on the watches until the run's pod is Ready, will never be, or time is up.
async fn wait_ready(
    client: &Client,
    namespace: &str,
    job: &str,
    pods: &PodWatch,
    limits: &Limits,
) -> Result<String, ExecutorError> {
    let mut seen = pods.seen.clone();
    // The event watches start only when the pod is late: a pod Ready at once costs none.
    let mut job_events: Option<EventWatch> = None;
    let mut pod_events: Option<(String, EventWatch)> = None;
    let mut said = Said::default();
    let mut unschedulable_since: Option<Instant> = None;
    let mut last = String::from("no pod yet");
    let began = Instant::now();
    let mut pod_since: Option<Instant> = None;
    let mut job_checked = Instant::now();
    let cannot = |name: &str, cause: &str| {
        ExecutorError::infrastructure(format!("the pod {name} of job {job} cannot run: {cause}"))
    };
    loop {
        let now = Instant::now();
        if let Some(message) = &said.failed_create {
            return Err(ExecutorError::infrastructure(format!(
                "the job {job} cannot create its pod (FailedCreate): {message}"
            )));
        }
        let current = seen.borrow_and_update().clone();
        if let Some(error) = current.error {
            return Err(ExecutorError::infrastructure(error));
        }
        let mut deadline = limits.ready;
        match current.pod.as_ref().map(|pod| (pod, pod::from_pod(pod))) {
            Some((pod, state)) => {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let since = *pod_since.get_or_insert(now);
                let late = now.duration_since(since) >= LATE
                    || matches!(&state, PodState::Unschedulable { .. })
                    || matches!(&state, PodState::Pending { detail, .. } if detail.contains("backs off"));
                if late && pod_events.as_ref().is_none_or(|(known, _)| *known != name) {
                    pod_events = Some((name.clone(), EventWatch::start(client, namespace, &name)));
                }
                match state {
                    PodState::Ready { name } => return Ok(name),
                    PodState::Failed { name, cause } => {
                        return Err(cannot(&name, &services::with_log(client, pod, cause).await));
                    }
                    PodState::Pending { name, detail } => {
                        if let Some(cause) = &said.image {
                            return Err(cannot(&name, cause));
                        }
                        unschedulable_since = None;
                        last = format!("pod {name}: {detail}");
                    }
                    PodState::Unschedulable { name, message } => {
                        if let Some(Scale::Refused(refused)) = &said.scale {
                            return Err(cannot(
                                &name,
                                &format!("it is unschedulable ({message}) and no node will be added: {refused}"),
                            ));
                        }
                        let since = *unschedulable_since.get_or_insert(now);
                        deadline = deadline.max(since + limits.scale_up);
                        last = match &said.scale {
                            Some(Scale::Adding(scaling)) => {
                                format!("pod {name}: unschedulable ({message}); a node is being added: {scaling}")
                            }
                            _ => format!("pod {name}: unschedulable ({message}); no autoscaler said it adds a node"),
                        };
                    }
                    PodState::Missing => {}
                }
            }
            None if current.deleted => {
                return Err(ExecutorError::infrastructure(format!(
                    "the pod of job {job} was deleted before it was Ready"
                )));
            }
            None => {
                if job_events.is_none() && now.duration_since(began) >= LATE {
                    job_events = Some(EventWatch::start(client, namespace, job));
                }
                // The Job controller may lag; a Job that is gone is not worth waiting for.
                if now.duration_since(job_checked) >= Duration::from_secs(5) {
                    job_checked = now;
                    let jobs: Api<Job> = client.api(namespace);
                    let found = client.limited(&format!("get the Job {job}"), jobs.get_opt(job)).await?;
                    if found.is_none() {
                        return Err(ExecutorError::infrastructure(format!(
                            "the job {job} was deleted before its pod ran"
                        )));
                    }
                }
            }
        }
        let deadline = deadline.min(limits.hard);
        if now >= deadline {
            return Err(ExecutorError::infrastructure(format!(
                "the pod of job {job} did not become Ready in time: {last}"
            )));
        }
        let wake = tokio::time::Instant::from_std(deadline.min(now + Duration::from_millis(500)));
        tokio::select! {
            changed = seen.changed() => if changed.is_err() {
                return Err(ExecutorError::infrastructure(format!("the watch of job {job}'s pod ended")));
            },
            Some(event) = next(&mut job_events) => said.add(&event),
            Some(event) = next(pod_events.as_mut().map(|(_, watch)| watch)) => said.add(&event),
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// How long a pod (or a Job without one) may take before the events about it are watched.
const LATE: Duration = Duration::from_secs(1);

/// The next event of a watch, if there is one; never, if not.
async fn next(watch: impl Into<Option<&mut EventWatch>>) -> Option<k8s_openapi::api::core::v1::Event> {
    match watch.into() {
        Some(watch) => watch.events.recv().await,
        None => std::future::pending().await,
    }
}

/// Deletes a session's Job (foreground: its pod first) and, with `pods` (the session's
/// watch), waits for the pod to be gone. A pod whose kubelet does not finish it within
/// [`FORCE_AFTER`] (its node is lost: nothing will) is deleted with no grace, as the pod
/// garbage collector does for pods of a node taken out of service, so nothing is left. Without
/// a watch the run's pods are only asked to go, and nothing is waited for.
pub async fn delete_job(
    client: &Client,
    namespace: &str,
    job: &str,
    selector: &str,
    image: &str,
    pods: Option<&PodWatch>,
) -> Result<(), ExecutorError> {
    let jobs: Api<Job> = client.api(namespace);
    let params = DeleteParams { propagation_policy: Some(PropagationPolicy::Foreground), ..DeleteParams::default() };
    let what = format!("delete the Job {job}");
    let deleted = client.unless(&what, jobs.delete(job, &params), Status::is_not_found).await.map(|_| ());
    let api: Api<Pod> = client.api(namespace);
    let list = ListParams::default().labels(selector);
    let what = format!("delete the pods of {selector}");
    let pods_deleted = match pods {
        Some(pods) => {
            let gone = |seen: &crate::watch::Seen| seen.pod.is_none() && seen.error.is_none();
            let mut seen = pods.seen.clone();
            let finished = tokio::time::timeout(FORCE_AFTER, seen.wait_for(gone)).await.is_ok_and(|w| w.is_ok());
            if finished {
                Ok(())
            } else {
                tracing::warn!(job = %job, namespace = %namespace, "the pod is not gone after {} s: deleting it with no grace", FORCE_AFTER.as_secs());
                let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
                let forced = client.limited(&what, api.delete_collection(&now, &list)).await.map(|_| ());
                let _ = tokio::time::timeout(GONE_WITHIN, seen.wait_for(gone)).await;
                forced
            }
        }
        None => client.limited(&what, api.delete_collection(&DeleteParams::default(), &list)).await.map(|_| ()),
    };
    match deleted.and(pods_deleted) {
        Ok(()) => {
            tracing::info!(job = %job, namespace = %namespace, image = %image, "job deleted");
            Ok(())
        }
        Err(error) => {
            tracing::warn!(job = %job, namespace = %namespace, image = %image, error = %error.message, "job delete failed");
            Err(error)
        }
    }
}

/// How long a deleted pod's kubelet may take to finish it before it is deleted with no grace.
const FORCE_AFTER: Duration = Duration::from_secs(15);

/// Deletes the runner's NetworkPolicy when no session is live or starting.
pub async fn retire_policy(executor: &KubernetesExecutor, client: &Client) -> Result<bool, ExecutorError> {
    let config = executor.config.get()?;
    let mut policy = executor.policy.lock().await;
    if policy.starting > 0 || !executor.sessions.lock().is_empty() {
        return Ok(false);
    }
    let name = names::policy_name(&config.runner_id);
    let api: Api<NetworkPolicy> = client.api(&config.namespace);
    let what = format!("delete the NetworkPolicy {name}");
    client.unless(&what, api.delete(&name, &DeleteParams::default()), Status::is_not_found).await?;
    policy.applied = false;
    drop(policy);
    tracing::info!(policy = %name, namespace = %config.namespace, "network policy deleted");
    Ok(true)
}

/// `stop`.
pub async fn stop(
    executor: &KubernetesExecutor,
    params: StopParams,
    _context: Context,
) -> Result<StopResult, ExecutorError> {
    let session = executor
        .sessions
        .lock()
        .remove(&params.session)
        .ok_or_else(|| ExecutorError::unknown_session(&params.session))?;
    if params.keep || session.keep {
        tracing::info!(job = %session.job, namespace = %session.namespace, image = %session.image, "job kept");
        return Ok(StopResult::default());
    }
    let client = executor.cluster.get()?.client().await?;
    let deleted =
        delete_job(&client, &session.namespace, &session.job, &session.selector, &session.image, Some(&session.pods))
            .await;
    if let Err(error) = deleted {
        // Forgotten here, so the orphan sweep takes the Job when the cluster answers again.
        return Err(ExecutorError::infrastructure(format!("cannot delete job {}: {}", session.job, error.message)));
    }
    let mut removed = vec![
        Resource { kind: "job".into(), name: session.job.clone(), session: Some(session.id.clone()) },
        Resource { kind: "pod".into(), name: session.pod.clone(), session: Some(session.id.clone()) },
    ];
    if let Ok(true) = retire_policy(executor, &client).await {
        let config = executor.config.get()?;
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
    let Ok(cluster) = executor.cluster.get() else { return };
    let Ok(client) = cluster.client().await else { return };
    let sessions: Vec<_> = executor.sessions.lock().drain().map(|(_, session)| session).collect();
    for session in &sessions {
        if session.keep {
            tracing::info!(job = %session.job, namespace = %session.namespace, "keeping the job at shutdown");
            continue;
        }
        let _ = delete_job(
            &client,
            &session.namespace,
            &session.job,
            &session.selector,
            &session.image,
            Some(&session.pods),
        )
        .await;
    }
    let _ = retire_policy(executor, &client).await;
    tracing::info!(sessions = sessions.len(), "shut down");
}
