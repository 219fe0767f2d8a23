//! The wait for a starting run's pod to be Ready, driven by watches (the run's pod, the events
//! about the Job and about the pod): an image that cannot be pulled, a Job that cannot create
//! its pod (`FailedCreate`), a pod deleted, or a pod no node will ever take end it at once,
//! naming the cause. A pull the registry refuses for now (429, 5xx) gets the kubelet's one
//! pull after its back-off; a second such refusal ends the start.
//!
//! Waiting for a node is the cluster's scale signal: an Unschedulable pod waits up to
//! `scale-up-timeout` from when it was first Unschedulable (longer or shorter than
//! `ready-timeout`, which counts the rest of the start), while an autoscaler adds a node, its
//! node group is full (the nodes free as the runs on them end), or the scheduler says nodes
//! turned it away only for the required anti-affinity (each holds a run of this runner, which
//! will end). It fails at once only when an autoscaler says no new node could take it and no
//! node holds a run of ours. The run's pod is made the owner of the run's NetworkPolicy as
//! soon as the watch shows it.

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use knotless_protocol::ExecutorError;
use kube::api::Api;

use crate::api::Client;
use crate::pod::{self, PodState, Said, Scale};
use crate::policy::RunPolicy;
use crate::services;
use crate::watch::{EventWatch, PodWatch};

/// How long a start may wait.
pub struct Limits {
    /// For the pod to be Ready (`ready-timeout`), moved on by the time it waited for a node.
    pub ready: Instant,
    /// For a node, from when the pod was first Unschedulable (`scale-up-timeout`): the wait
    /// while Unschedulable, whatever `ready` says.
    pub scale_up: Duration,
    /// Whatever it waits for: the start's own deadline.
    pub hard: Instant,
}

/// Waits on the watches until the run's pod is Ready, will never be, or time is up.
pub async fn wait_ready(
    client: &Client,
    namespace: &str,
    job: &str,
    pods: &PodWatch,
    policy: &mut RunPolicy,
    limits: &Limits,
) -> Result<String, ExecutorError> {
    let mut seen = pods.seen.clone();
    // The event watches start only when the pod is late: a pod Ready at once costs none.
    let mut job_events: Option<EventWatch> = None;
    let mut pod_events: Option<(String, EventWatch)> = None;
    let mut said = Said::default();
    let mut unschedulable_since: Option<Instant> = None;
    // Time spent waiting for a node before the pod was placed: the ready timeout leaves it out.
    let mut waited_for_node = Duration::ZERO;
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
        if let Some(pod) = &current.pod {
            // The policy goes with the pod from now on, whatever happens to this start.
            policy.owned_by(client, pod).await?;
        }
        let mut deadline = limits.ready + waited_for_node;
        let mut waiting_for_node = false;
        match current.pod.as_ref().map(|pod| (pod, pod::from_pod(pod))) {
            Some((pod, state)) => {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let since = *pod_since.get_or_insert(now);
                let late = now.duration_since(since) >= LATE
                    || matches!(&state, PodState::Unschedulable { .. })
                    || matches!(&state, PodState::Pending { detail, .. } if detail.contains("backs off"))
                    || said.temporary_pull.is_some();
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
                        // One pull after the back-off for a refusal the registry marks temporary.
                        if said.temporary_pulls() >= 2
                            && let Some(cause) = &said.temporary_pull
                        {
                            return Err(cannot(&name, &format!("{cause} (refused again after the back-off)")));
                        }
                        if let Some(since) = unschedulable_since.take() {
                            waited_for_node += now.duration_since(since);
                            deadline = limits.ready + waited_for_node;
                        }
                        last = format!("pod {name}: {detail}");
                    }
                    PodState::Unschedulable { name, message } => {
                        let held = pod::held_by_own_runs(&message);
                        if let Some(Scale::Refused(refused)) = &said.scale
                            && !pod::scale_up_blocked_for_now(refused)
                            && !held
                        {
                            return Err(cannot(
                                &name,
                                &format!("it is unschedulable ({message}) and no node will be added: {refused}"),
                            ));
                        }
                        // The wait for a node is its own, from when the pod was first Unschedulable
                        // (a pod once placed is never Unschedulable again).
                        let since = *unschedulable_since.get_or_insert(now);
                        deadline = since + limits.scale_up;
                        waiting_for_node = true;
                        last = match &said.scale {
                            Some(Scale::Adding(scaling)) => {
                                format!("pod {name}: unschedulable ({message}); a node is being added: {scaling}")
                            }
                            Some(Scale::Refused(refused)) => {
                                format!("pod {name}: unschedulable ({message}); waiting for a node to free: {refused}")
                            }
                            None if held => format!(
                                "pod {name}: unschedulable ({message}); waiting for a node another run of this runner holds"
                            ),
                            None => format!("pod {name}: unschedulable ({message}); no autoscaler said it adds a node"),
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
        let start_timeout = deadline >= limits.hard;
        let deadline = deadline.min(limits.hard);
        if now >= deadline {
            if waiting_for_node && !start_timeout {
                return Err(ExecutorError::infrastructure(format!(
                    "the pod of job {job} found no node within scale-up-timeout ({} s): {last}",
                    limits.scale_up.as_secs()
                )));
            }
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
