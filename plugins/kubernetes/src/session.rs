//! `start`, `stop` and `shutdown`: the run's NetworkPolicy (`policy.rs`), then its Job, the
//! wait for its pod to be Ready (`ready.rs`: ending fast, with the cause, when it never will),
//! and the Job's delete, after which the garbage collector deletes the policy.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use knotless_protocol::sdk::Context;
use knotless_protocol::*;
use kube::api::{Api, DeleteParams, ListParams, PropagationPolicy};
use kube::core::Status;

use crate::KubernetesExecutor;
use crate::api::Client;
use crate::config::Config;
use crate::ending;
use crate::manifest::{self, JobSpecInput};
use crate::names::{self, RUN_LABEL, RUNNER_LABEL};
use crate::pod;
use crate::policy::RunPolicy;
use crate::ready::{self, Limits};
use crate::services;
use crate::watch::PodWatch;

/// A started session: its Job and Ready pod.
pub struct Session {
    /// The runner's session id.
    pub id: String,
    /// The Job's name.
    pub job: String,
    /// The pod's name.
    pub pod: String,
    /// The name of its NetworkPolicy, which its pod owns.
    pub policy: String,
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

/// A session whose start is in flight, in the executor's `starting` set for as long as it
/// lives (a start cancelled or timed out drops it), so the orphan sweep never takes it.
struct Starting<'a> {
    starting: &'a std::sync::Mutex<BTreeSet<String>>,
    session: String,
}

impl<'a> Starting<'a> {
    /// Marks `session` starting; an error if it is started or starting already.
    fn begin(executor: &'a KubernetesExecutor, session: &str) -> Result<Starting<'a>, ExecutorError> {
        let started = executor.sessions.lock().contains_key(session);
        if started || !knotless_protocol::sdk::lock(&executor.starting).insert(session.to_string()) {
            return Err(ExecutorError::configuration(format!("session {session} is already started")));
        }
        Ok(Starting { starting: &executor.starting, session: session.to_string() })
    }
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        knotless_protocol::sdk::lock(self.starting).remove(&self.session);
    }
}

/// `start`.
pub async fn start(
    executor: &KubernetesExecutor,
    params: StartParams,
    context: Context,
) -> Result<StartResult, ExecutorError> {
    let config = executor.config.get()?;
    let owner = executor.owner.get()?;
    Service::check_all(&params.services)?;
    let _starting = Starting::begin(executor, &params.session)?;
    if params.keep {
        // Before the Job: no sweep ever finds it unmarked. A mark of a start that fails goes
        // at the next sweep.
        mark_kept(executor, &params.session)?;
    }
    let client = executor.cluster.get()?.client().await?;
    let image = params.image.clone().filter(|image| !image.is_empty()).unwrap_or_else(|| config.image.clone());
    let input = job_input(&config, &params, &image, owner.token())?;
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

    // The run's policy before its Job: the pod never runs a moment without it.
    let mut policy = RunPolicy::create(&client, &input).await?;
    // Watching before the Job exists: its pod's every state is seen.
    let pods = PodWatch::start(&client, &config.namespace, &selector);
    let result = start_job(
        &client,
        &job,
        &job_name,
        &image,
        &params.services,
        &pods,
        &mut policy,
        &limits,
        &context,
        &params.session,
    )
    .await;
    let pod = match result {
        Ok(pod) => pod,
        Err(error) => {
            context.log(&params.session, LogLevel::Error, error.message.clone()).await;
            let deleted = delete_job(&client, &config.namespace, &job_name, &selector, &image, Some(&pods)).await;
            // The pod is gone (or never was): a policy no pod owns is this start's to delete.
            if deleted.is_ok()
                && let Err(left) = policy.delete_unowned(&client).await
            {
                tracing::warn!(policy = %policy.name, error = %left.message, "network policy left for the orphan sweep");
            }
            return Err(error);
        }
    };
    tracing::info!(job = %job_name, namespace = %config.namespace, image = %image, pod = %pod,
        ms = started.elapsed().as_millis() as u64, "pod ready");
    let description = format!("job {job_name} (pod {pod}) in {}", config.namespace);
    let session = Session {
        id: params.session.clone(),
        job: job_name,
        pod,
        policy: policy.name.clone(),
        namespace: config.namespace.clone(),
        image,
        selector,
        keep: params.keep,
        pods,
    };
    if !params.keep {
        // A mark left of an earlier session of this id, which the operator removed by hand.
        knotless_protocol::kept::unmark(&config.runner_id, &params.session);
    }
    executor.sessions.lock().insert(params.session.clone(), std::sync::Arc::new(session));
    let paths = SessionPaths { work: "/work".into(), steps: "/steps".into(), outputs: "/outputs".into() };
    Ok(StartResult { paths, description: Some(description) })
}

/// What the session's Job is made of: the runner's configuration, with what the start asks
/// (its image, resources, timeout, `keep` and services) in place of its defaults; an error
/// when the memory it asks is over `memory-max` ([`Config::memory_of`]).
fn job_input(config: &Config, params: &StartParams, image: &str, owner: &str) -> Result<JobSpecInput, ExecutorError> {
    let (memory_request, memory_limit) = config.memory_of(params.resources.memory.as_deref())?;
    Ok(JobSpecInput {
        runner_id: config.runner_id.clone(),
        session: params.session.clone(),
        check_key: params.run.check_key.clone(),
        namespace: config.namespace.clone(),
        image: image.to_string(),
        cpu: Some(params.resources.cpu.clone().unwrap_or_else(|| config.cpu_request.clone())),
        memory: Some(memory_request),
        memory_limit: Some(memory_limit),
        service_account: config.service_account.clone(),
        node_selector: config.node_selector.clone(),
        deadline_secs: manifest::deadline_secs(params.run_timeout_ms),
        ttl_secs: (!params.keep).then_some(config.ttl_seconds),
        services: params.services.clone(),
        owner: owner.to_string(),
    })
}

/// Creates the Job and waits for its pod to be Ready (and its services healthy); the pod's
/// name.
#[allow(clippy::too_many_arguments)]
async fn start_job(
    client: &Client,
    job: &Job,
    job_name: &str,
    image: &str,
    services: &[Service],
    pods: &PodWatch,
    policy: &mut RunPolicy,
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
    let pod = ready::wait_ready(client, &namespace, job_name, pods, policy, limits).await?;
    services::wait_healthy(client, &namespace, &pod, services, pods, limits.hard).await?;
    Ok(pod)
}

/// Deletes a session's Job (foreground: its pod first) and, with `pods` (the session's
/// watch), waits for the pod to be gone. A pod whose node no longer answers (the watch saw the
/// node controller mark it, or the taint manager evict it) is deleted with no grace at once,
/// and one whose kubelet does not finish it within [`FORCE_AFTER`] likewise, as the pod garbage
/// collector does for pods of a node taken out of service, so nothing is left. Without a watch
/// the run's pods are only asked to go, and nothing is waited for.
///
/// Bounded when the API refuses: a refused or unanswered delete is the answer within
/// [`ending::BOUND`], with no forced delete after it and no wait for the pod; the Job is left,
/// labelled, for the next orphan sweep, and the cause logged.
pub async fn delete_job(
    client: &Client,
    namespace: &str,
    job: &str,
    selector: &str,
    image: &str,
    pods: Option<&PodWatch>,
) -> Result<(), ExecutorError> {
    let deadline = Instant::now() + ending::BOUND;
    let jobs: Api<Job> = ending::api(client, namespace);
    let params = DeleteParams { propagation_policy: Some(PropagationPolicy::Foreground), ..DeleteParams::default() };
    let what = format!("delete the Job {job}");
    let deleted =
        ending::request(client, &what, deadline, Status::is_not_found, || jobs.delete(job, &params)).await.map(|_| ());
    if let Err(error) = deleted {
        tracing::warn!(job = %job, namespace = %namespace, image = %image, error = %error.message,
            "job delete refused: the job is left, labelled, for the next orphan sweep");
        return Err(error);
    }
    let api: Api<Pod> = ending::api(client, namespace);
    let list = ListParams::default().labels(selector);
    let what = format!("delete the pods of {selector}");
    let graceful = DeleteParams::default();
    let pods_deleted = match pods {
        Some(pods) => {
            // Gone, or the watch cannot say any more (the API refuses it): waiting is no use.
            let settled = |seen: &crate::watch::Seen| seen.error.is_some() || seen.pod.is_none();
            let mut seen = pods.seen.clone();
            let unreachable = seen.borrow().pod.as_ref().is_some_and(pod::node_lost);
            let finished = !unreachable
                && tokio::time::timeout(FORCE_AFTER, seen.wait_for(settled)).await.is_ok_and(|w| w.is_ok());
            if finished {
                Ok(())
            } else {
                if unreachable {
                    tracing::warn!(job = %job, namespace = %namespace, "the pod's node does not answer: deleting it with no grace");
                } else {
                    tracing::warn!(job = %job, namespace = %namespace, "the pod is not gone after {} s: deleting it with no grace", FORCE_AFTER.as_secs());
                }
                let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
                let deadline = Instant::now() + ending::BOUND;
                let forced = ending::request(client, &what, deadline, Status::is_not_found, || {
                    api.delete_collection(&now, &list)
                })
                .await
                .map(|_| ());
                if forced.is_ok() {
                    let _ = tokio::time::timeout_at(deadline.into(), seen.wait_for(settled)).await;
                }
                forced
            }
        }
        None => {
            ending::request(client, &what, deadline, Status::is_not_found, || api.delete_collection(&graceful, &list))
                .await
                .map(|_| ())
        }
    };
    let watch_error = pods.and_then(|pods| pods.seen.borrow().error.clone());
    match pods_deleted {
        Ok(()) if watch_error.is_none() => {
            tracing::info!(job = %job, namespace = %namespace, image = %image, "job deleted");
            Ok(())
        }
        Ok(()) => {
            let error = watch_error.unwrap_or_default();
            tracing::warn!(job = %job, namespace = %namespace, image = %image, error = %error, "job deleted, its pod not seen gone");
            Err(ExecutorError::infrastructure(error))
        }
        Err(error) => {
            tracing::warn!(job = %job, namespace = %namespace, image = %image, error = %error.message, "job delete failed");
            Err(error)
        }
    }
}

/// How long a deleted pod's kubelet may take to finish it before it is deleted with no grace.
const FORCE_AFTER: Duration = Duration::from_secs(15);

/// Marks a session kept, so that a `cleanup` leaves its Job unless asked to remove kept ones.
fn mark_kept(executor: &KubernetesExecutor, session: &str) -> Result<(), ExecutorError> {
    let config = executor.config.get()?;
    knotless_protocol::kept::mark(&config.runner_id, session)
        .map_err(|error| ExecutorError::infrastructure(format!("cannot mark session {session} kept: {error}")))
}

/// `stop`.
pub async fn stop(
    executor: &KubernetesExecutor,
    params: StopParams,
    _context: Context,
) -> Result<StopResult, ExecutorError> {
    let session = executor.sessions.get(&params.session)?;
    if params.keep || session.keep {
        mark_kept(executor, &session.id)?;
    }
    executor.sessions.lock().remove(&params.session);
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
    // The policy goes with the pod: the garbage collector deletes it, no request of ours.
    let removed = [("job", &session.job), ("pod", &session.pod), ("networkpolicy", &session.policy)]
        .into_iter()
        .map(|(kind, name)| Resource { kind: kind.into(), name: name.clone(), session: Some(session.id.clone()) })
        .collect();
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
    tracing::info!(sessions = sessions.len(), "shut down");
}
