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
use k8s_openapi::api::core::v1::Pod;
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
    let mut wait = Waiting::new(client, namespace, job, limits);
    loop {
        let now = Instant::now();
        if let Some(message) = &wait.said.failed_create {
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
        let look = match &current.pod {
            Some(pod) => wait.pod(pod, now).await?,
            None if current.deleted => {
                return Err(ExecutorError::infrastructure(format!(
                    "the pod of job {job} was deleted before it was Ready"
                )));
            }
            None => {
                wait.no_pod(now).await?;
                Look::Starting
            }
        };
        let (deadline, waiting_for_node) = match look {
            Look::Ready(name) => return Ok(name),
            Look::ForNode(deadline) => (deadline, true),
            Look::Starting => (limits.ready + wait.waited_for_node, false),
        };
        let start_timeout = deadline >= limits.hard;
        let deadline = deadline.min(limits.hard);
        if now >= deadline {
            let last = &wait.last;
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
            Some(event) = next(&mut wait.job_events) => wait.said.add(&event),
            Some(event) = next(wait.pod_events.as_mut().map(|(_, watch)| watch)) => wait.said.add(&event),
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Where a start stands after a look at its Job and pod, when the look did not end it.
enum Look {
    /// The pod is Ready, with this name.
    Ready(String),
    /// The pod is Unschedulable: it waits for a node until this deadline.
    ForNode(Instant),
    /// It waits for the rest of its start, within the ready timeout.
    Starting,
}

/// What the wait for one Job's pod has learned so far, and what it watches.
struct Waiting<'a> {
    client: &'a Client,
    namespace: &'a str,
    job: &'a str,
    limits: &'a Limits,
    /// The events about the Job, watched once it is late without a pod.
    job_events: Option<EventWatch>,
    /// The events about the pod (its name, and their watch), watched once it is late.
    pod_events: Option<(String, EventWatch)>,
    said: Said,
    unschedulable_since: Option<Instant>,
    /// Time spent waiting for a node before the pod was placed: the ready timeout leaves it out.
    waited_for_node: Duration,
    /// Where the start was last seen, for the error of a timeout.
    last: String,
    began: Instant,
    pod_since: Option<Instant>,
    job_checked: Instant,
}

impl<'a> Waiting<'a> {
    fn new(client: &'a Client, namespace: &'a str, job: &'a str, limits: &'a Limits) -> Waiting<'a> {
        Waiting {
            client,
            namespace,
            job,
            limits,
            // The event watches start only when the pod is late: a pod Ready at once costs none.
            job_events: None,
            pod_events: None,
            said: Said::default(),
            unschedulable_since: None,
            waited_for_node: Duration::ZERO,
            last: String::from("no pod yet"),
            began: Instant::now(),
            pod_since: None,
            job_checked: Instant::now(),
        }
    }

    /// The error of a pod that cannot run, for `cause`.
    fn cannot(&self, name: &str, cause: &str) -> ExecutorError {
        let job = self.job;
        ExecutorError::infrastructure(format!("the pod {name} of job {job} cannot run: {cause}"))
    }

    /// Looks at the run's pod: watches the events about it once it is late, ends the start when
    /// it failed or will never run, and otherwise says whether it is Ready or what it waits for.
    async fn pod(&mut self, pod: &Pod, now: Instant) -> Result<Look, ExecutorError> {
        let state = pod::from_pod(pod);
        let name = pod.metadata.name.clone().unwrap_or_default();
        let since = *self.pod_since.get_or_insert(now);
        let late = now.duration_since(since) >= LATE
            || matches!(&state, PodState::Unschedulable { .. })
            || matches!(&state, PodState::Pending { detail, .. } if detail.contains("backs off"))
            || self.said.temporary_pull.is_some();
        if late && self.pod_events.as_ref().is_none_or(|(known, _)| *known != name) {
            self.pod_events = Some((name.clone(), EventWatch::start(self.client, self.namespace, &name)));
        }
        match state {
            PodState::Ready { name } => Ok(Look::Ready(name)),
            PodState::Failed { name, cause } => {
                Err(self.cannot(&name, &services::with_log(self.client, pod, cause).await))
            }
            PodState::Pending { name, detail } => self.pending(&name, &detail, now).map(|()| Look::Starting),
            PodState::Unschedulable { name, message } => self.unschedulable(&name, &message, now).map(Look::ForNode),
            PodState::Missing => Ok(Look::Starting),
        }
    }

    /// A Pending pod: ends the start when its image cannot be pulled, or the registry refused it
    /// again after the kubelet's back-off; a pod placed ends its wait for a node, which the ready
    /// timeout leaves out.
    fn pending(&mut self, name: &str, detail: &str, now: Instant) -> Result<(), ExecutorError> {
        if let Some(cause) = &self.said.image {
            return Err(self.cannot(name, cause));
        }
        // One pull after the back-off for a refusal the registry marks temporary.
        if self.said.temporary_pulls() >= 2
            && let Some(cause) = &self.said.temporary_pull
        {
            return Err(self.cannot(name, &format!("{cause} (refused again after the back-off)")));
        }
        if let Some(since) = self.unschedulable_since.take() {
            self.waited_for_node += now.duration_since(since);
        }
        self.last = format!("pod {name}: {detail}");
        Ok(())
    }

    /// An Unschedulable pod: ends the start when an autoscaler says no node will be added and no
    /// node holds a run of this runner; otherwise returns the deadline of its wait for a node.
    fn unschedulable(&mut self, name: &str, message: &str, now: Instant) -> Result<Instant, ExecutorError> {
        let held = pod::held_by_own_runs(message);
        if let Some(Scale::Refused(refused)) = &self.said.scale
            && !pod::scale_up_blocked_for_now(refused)
            && !held
        {
            return Err(
                self.cannot(name, &format!("it is unschedulable ({message}) and no node will be added: {refused}"))
            );
        }
        // The wait for a node is its own, from when the pod was first Unschedulable
        // (a pod once placed is never Unschedulable again).
        let since = *self.unschedulable_since.get_or_insert(now);
        let deadline = since + self.limits.scale_up;
        self.last = match &self.said.scale {
            Some(Scale::Adding(scaling)) => {
                format!("pod {name}: unschedulable ({message}); a node is being added: {scaling}")
            }
            Some(Scale::Refused(refused)) => {
                format!("pod {name}: unschedulable ({message}); waiting for a node to free: {refused}")
            }
            None if held => {
                format!("pod {name}: unschedulable ({message}); waiting for a node another run of this runner holds")
            }
            None => format!("pod {name}: unschedulable ({message}); no autoscaler said it adds a node"),
        };
        Ok(deadline)
    }

    /// No pod yet: watches the events about the Job once it is late, and ends the start when
    /// the Job is gone.
    async fn no_pod(&mut self, now: Instant) -> Result<(), ExecutorError> {
        let (client, namespace, job) = (self.client, self.namespace, self.job);
        if self.job_events.is_none() && now.duration_since(self.began) >= LATE {
            self.job_events = Some(EventWatch::start(client, namespace, job));
        }
        // The Job controller may lag; a Job that is gone is not worth waiting for.
        if now.duration_since(self.job_checked) >= Duration::from_secs(5) {
            self.job_checked = now;
            let jobs: Api<Job> = client.api(namespace);
            let found = client.limited(&format!("get the Job {job}"), jobs.get_opt(job)).await?;
            if found.is_none() {
                return Err(ExecutorError::infrastructure(format!("the job {job} was deleted before its pod ran")));
            }
        }
        Ok(())
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
