//! Reading a pod and the events about it and its Job: Ready, still pending (and why), or
//! failed for a cause worth quoting. Pure functions over the typed objects the watches give.
//!
//! The shapes are those of a real cluster: the kubelet alternates `ErrImagePull` and
//! `ImagePullBackOff` and says why only in the first and in its `Failed` events (the
//! back-off's own message is only "Back-off pulling image"); a Job whose pod cannot be
//! created has no pod, only `FailedCreate` events; the scheduler marks a pod
//! `PodScheduled=False/Unschedulable` and a cluster autoscaler answers with
//! `TriggeredScaleUp` or `NotTriggerScaleUp` events some seconds later; a pod whose node is
//! lost first turns `Ready=False`, then is deleted (terminating, phase still `Running`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, Event, Pod, PodStatus};

use crate::manifest::CONTAINER;
use crate::names::SERVICE_PREFIX;

/// What a pod is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// No pod (yet, or any more).
    Missing,
    /// Not Ready yet; the detail says what it waits for.
    Pending { name: String, detail: String },
    /// The scheduler found no node for it: its message.
    Unschedulable { name: String, message: String },
    /// Running and Ready.
    Ready { name: String },
    /// It will never become Ready (or is Ready no more): the cause.
    Failed { name: String, cause: String },
}

/// The state of one pod.
pub fn from_pod(pod: &Pod) -> PodState {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let phase = status.phase.clone().unwrap_or_default();
    let reason = status.reason.clone().unwrap_or_default();
    let message = status.message.clone().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        let evicted = status.conditions.iter().flatten().find(|condition| {
            condition.type_ == "DisruptionTarget"
                && condition.status == "True"
                && condition.reason.as_deref() == Some("DeletionByTaintManager")
        });
        if let Some(evicted) = evicted {
            let said = evicted.message.clone().unwrap_or_default();
            return PodState::Failed { name, cause: format!("its node was lost (DeletionByTaintManager): {said}") };
        }
        let cause = match reason.as_str() {
            "NodeLost" => format!("its node was lost: {message}"),
            "" if node_lost(pod) => {
                "its node was lost: the pod is being deleted, and its node does not answer".to_string()
            }
            "" => "the pod is being deleted (its Job was deleted, or its node lost)".to_string(),
            _ => format!("the pod is being deleted ({reason}): {message}"),
        };
        return PodState::Failed { name, cause };
    }
    if phase == "Failed" || phase == "Succeeded" {
        let cause = match reason.as_str() {
            "DeadlineExceeded" => format!("the Job passed its activeDeadlineSeconds: {message}"),
            "" => match ended_container(&status) {
                Some(cause) => format!("the pod ended ({phase}): {cause}"),
                None => format!("the pod ended ({phase})"),
            },
            _ => format!("the pod ended ({phase}, {reason}): {message}"),
        };
        return PodState::Failed { name, cause };
    }
    for container in status.container_statuses.iter().flatten() {
        let state = container.state.clone().unwrap_or_default();
        let who = Container::of(&container.name);
        if let Some(waiting) = state.waiting {
            let reason = waiting.reason.unwrap_or_default();
            let message = waiting.message.unwrap_or_default();
            if reason == "ErrImagePull" && temporary_pull_error(&message) {
                let detail = who.cause(format!(
                    "pulling the image {} failed for now and backs off: the kubelet pulls again: {message}",
                    container.image
                ));
                return PodState::Pending { name, detail };
            }
            if let Some(cause) = image_failure(&reason, &message, &container.image) {
                return PodState::Failed { name, cause: who.cause(cause) };
            }
            if matches!(reason.as_str(), "CreateContainerConfigError" | "CreateContainerError" | "CrashLoopBackOff") {
                let cause = format!("{} cannot start ({reason}): {message}", who.subject());
                return PodState::Failed { name, cause };
            }
            if reason == "ImagePullBackOff" {
                let detail = who.cause(format!("pulling the image {} backs off (the events say why)", container.image));
                return PodState::Pending { name, detail };
            }
        }
        if let Some(terminated) = &state.terminated {
            return PodState::Failed { name, cause: termination(&who, terminated) };
        }
    }
    let conditions = status.conditions.clone().unwrap_or_default();
    let condition = |kind: &str| conditions.iter().find(|condition| condition.type_ == kind);
    if let Some(scheduled) = condition("PodScheduled")
        && scheduled.status == "False"
        && scheduled.reason.as_deref() == Some("Unschedulable")
    {
        return PodState::Unschedulable { name, message: scheduled.message.clone().unwrap_or_default() };
    }
    if phase == "Running" && condition("Ready").is_some_and(|ready| ready.status == "True") {
        return PodState::Ready { name };
    }
    PodState::Pending { name, detail: format!("phase {}", if phase.is_empty() { "unknown" } else { &phase }) }
}

/// Why a container ended, from its `state.terminated` (or `lastState.terminated`): the
/// reason the runtime gave (`OOMKilled`, `Error`, `ContainerStatusUnknown`, ...) and the exit
/// code, named in words where the reason says more than the code.
fn termination(who: &Container, terminated: &ContainerStateTerminated) -> String {
    let subject = who.subject();
    let code = terminated.exit_code;
    let message = terminated.message.as_deref().map(str::trim).filter(|message| !message.is_empty());
    let said = message.map(|message| format!(": {message}")).unwrap_or_default();
    match terminated.reason.as_deref().unwrap_or_default() {
        "OOMKilled" => format!(
            "{subject} was killed for using more memory than its limit (OOMKilled, exit code {code}); \
             give the workflow more memory or use less{said}"
        ),
        "" => format!("{subject} ended (exit code {code}){said}"),
        reason => format!("{subject} ended ({reason}, exit code {code}){said}"),
    }
}

/// The first container of a pod that ended, as [`termination`] names it; the run's own
/// container before a service's.
fn ended_container(status: &PodStatus) -> Option<String> {
    let statuses = status.container_statuses.as_ref()?;
    let ended = |status: &ContainerStatus| {
        let state = status.state.as_ref().and_then(|state| state.terminated.as_ref());
        let last = status.last_state.as_ref().and_then(|state| state.terminated.as_ref());
        state.or(last).map(|terminated| termination(&Container::of(&status.name), terminated))
    };
    let run = statuses.iter().filter(|status| Container::of(&status.name) == Container::Run);
    let services = statuses.iter().filter(|status| Container::of(&status.name) != Container::Run);
    run.chain(services).find_map(ended)
}

/// Why a container of `pod` ended, if one has ([`termination`]'s words), and its ending is a
/// cause rather than the pod's deletion at work: the pod is not being deleted, or the container
/// was killed for its memory.
pub fn ended_container_of(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let oom_killed = status.container_statuses.iter().flatten().any(|container| {
        [container.state.as_ref(), container.last_state.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|state| state.terminated.as_ref())
            .any(|terminated| terminated.reason.as_deref() == Some("OOMKilled"))
    });
    if pod.metadata.deletion_timestamp.is_some() && !oom_killed {
        return None;
    }
    ended_container(status)
}

/// Whether a pull error is one the registry marks as temporary: too many requests (429,
/// `toomanyrequests`) or a server error (5xx). The kubelet pulls again after its back-off,
/// and such a pull may succeed.
pub fn temporary_pull_error(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    if lower.contains("toomanyrequests") || lower.contains("429 too many requests") {
        return true;
    }
    let statuses = ["500 internal server error", "502 bad gateway", "503 service unavailable", "504 gateway timeout"];
    statuses.iter().any(|status| lower.contains(status))
}

/// A container of the run's pod: the run's own, or a service's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Container {
    /// The run's container, where steps run.
    Run,
    /// A service's container; the service's name.
    Service(String),
}

impl Container {
    /// The container named `name` in the run's pod.
    pub fn of(name: &str) -> Container {
        match name.strip_prefix(SERVICE_PREFIX) {
            Some(service) if name != CONTAINER => Container::Service(service.to_string()),
            _ => Container::Run,
        }
    }

    /// How a message names it.
    fn subject(&self) -> String {
        match self {
            Container::Run => "the container".to_string(),
            Container::Service(service) => format!("service {service}"),
        }
    }

    /// A cause about this container: a service's is prefixed with its name.
    fn cause(&self, cause: String) -> String {
        match self {
            Container::Run => cause,
            Container::Service(service) => format!("service {service}: {cause}"),
        }
    }
}

/// The container of the pod's first service that has ended, if one has: its log says why.
pub fn ended_service(pod: &Pod) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses
        .iter()
        .find(|status| {
            matches!(Container::of(&status.name), Container::Service(_))
                && status.state.as_ref().is_some_and(|state| state.terminated.is_some())
        })
        .map(|status| status.name.clone())
}

/// Why a pod that was Ready cannot run a step any more, if it cannot: it is being deleted
/// (its Job deleted, its node lost), it ended, or it is not Ready (its node stopped
/// answering: the node controller marks its pods so).
pub fn broken(pod: &Pod) -> Option<String> {
    match from_pod(pod) {
        PodState::Ready { .. } => None,
        PodState::Failed { cause, .. } => Some(cause),
        _ => {
            let conditions = pod.status.as_ref().and_then(|status| status.conditions.clone()).unwrap_or_default();
            let ready = conditions.iter().find(|condition| condition.type_ == "Ready");
            let said = ready
                .map(|ready| {
                    let reason = ready.reason.clone().unwrap_or_default();
                    let message = ready.message.clone().unwrap_or_default();
                    format!("{reason} {message}").trim().to_string()
                })
                .filter(|said| !said.is_empty())
                .map(|said| format!(" ({said})"))
                .unwrap_or_default();
            if node_lost(pod) {
                return Some(format!(
                    "its node was lost: the node controller marked the pod not Ready{said}, its kubelet silent"
                ));
            }
            Some(format!("the pod is not Ready any more{said}: its node stopped answering, or its container ended"))
        }
    }
}

/// Whether the pod's node no longer answers: the taint manager evicts it (`DisruptionTarget`,
/// `DeletionByTaintManager`), it shows `NodeLost`, or it is not Ready while every container
/// status still says ready (the node controller marked it, `MarkPodsNotReady`: its kubelet
/// said nothing). Its kubelet will never finish its deletion.
pub fn node_lost(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else { return false };
    let conditions = status.conditions.iter().flatten();
    let evicted = conditions.clone().any(|condition| {
        condition.type_ == "DisruptionTarget" && condition.reason.as_deref() == Some("DeletionByTaintManager")
    });
    let unready = conditions.clone().any(|condition| condition.type_ == "Ready" && condition.status == "False");
    let containers = status.container_statuses.iter().flatten();
    let kubelet_silent = containers.clone().next().is_some() && containers.clone().all(|container| container.ready);
    evicted || status.reason.as_deref() == Some("NodeLost") || (unready && kubelet_silent)
}

/// The cause of an image that cannot be pulled, from a waiting reason (or an event) and its
/// message; `None` when the reason is not about the image or says nothing yet. A missing
/// image and a denied pull are told apart only where the registry's words allow.
pub fn image_failure(reason: &str, message: &str, image: &str) -> Option<String> {
    if !matches!(reason, "ErrImagePull" | "InvalidImageName" | "ErrImageNeverPull") {
        return None;
    }
    let lower = message.to_ascii_lowercase();
    if reason == "InvalidImageName" {
        return Some(format!("the image reference {image:?} is not valid ({reason}): {message}"));
    }
    if lower.contains("repository does not exist or may require authorization") {
        return Some(format!(
            "the image {image} cannot be pulled ({reason}): the registry does not say whether it is \
             missing or the pull was denied: {message}"
        ));
    }
    if ["not found", "manifest unknown", "name unknown", "no such host"].iter().any(|word| lower.contains(word)) {
        return Some(format!("the image {image} does not exist ({reason}): {message}"));
    }
    if ["unauthorized", "authentication required", "denied", "forbidden", "401", "403"]
        .iter()
        .any(|word| lower.contains(word))
    {
        return Some(format!("pulling the image {image} was denied ({reason}): {message}"));
    }
    Some(format!("the image {image} cannot be pulled ({reason}): {message}"))
}

/// What the events about a run's Job and pod say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Said {
    /// The Job could not create its pod: the message of its `FailedCreate` event.
    pub failed_create: Option<String>,
    /// The image cannot be pulled: the cause, from the kubelet's `Failed` or `InspectFailed`.
    pub image: Option<String>,
    /// What the cluster autoscaler said last about adding a node for the pod.
    pub scale: Option<Scale>,
    /// Pulls the registry refused for now (429, 5xx): the cause, from the last such event.
    pub temporary_pull: Option<String>,
    /// How many such pulls failed, by event (a repeated event counts each time).
    temporary_pulls: BTreeMap<String, i32>,
}

/// What a cluster autoscaler said about a pod it found unschedulable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scale {
    /// It is adding a node for it (`TriggeredScaleUp`): its message.
    Adding(String),
    /// No node group can take it (`NotTriggerScaleUp`): its message.
    Refused(String),
}

impl Said {
    /// Takes in one event.
    pub fn add(&mut self, event: &Event) {
        let reason = event.reason.clone().unwrap_or_default();
        let message = event.message.clone().unwrap_or_default();
        // The kubelet's events name their container: `spec.containers{NAME}`.
        let field = event.involved_object.field_path.as_deref().unwrap_or_default();
        let about = field
            .strip_prefix("spec.containers{")
            .and_then(|rest| rest.strip_suffix('}'))
            .map_or(Container::Run, Container::of);
        match reason.as_str() {
            "FailedCreate" => self.failed_create = Some(message),
            // The last word counts: a later scan may change its mind.
            "TriggeredScaleUp" => self.scale = Some(Scale::Adding(message)),
            "NotTriggerScaleUp" => self.scale = Some(Scale::Refused(message)),
            "InspectFailed" => {
                let image = quoted(&message).unwrap_or_default();
                self.image = image_failure("InvalidImageName", &message, &image).map(|cause| about.cause(cause));
            }
            "Failed" if message.starts_with("Failed to pull image") => {
                // `Error: ErrImagePull` and `Error: ImagePullBackOff` say nothing more.
                let image = quoted(&message).unwrap_or_default();
                if temporary_pull_error(&message) {
                    let name = event.metadata.name.clone().unwrap_or_default();
                    self.temporary_pulls.insert(name, event.count.unwrap_or(1).max(1));
                    let cause = format!("the registry refused the pull of the image {image} for now: {message}");
                    self.temporary_pull = Some(about.cause(cause));
                    return;
                }
                self.image = image_failure("ErrImagePull", &message, &image).map(|cause| about.cause(cause));
            }
            _ => {}
        }
    }
}

impl Said {
    /// How many pulls the registry refused for now, as the events count them.
    pub fn temporary_pulls(&self) -> i32 {
        self.temporary_pulls.values().sum()
    }
}

/// Whether a `NotTriggerScaleUp` message says a node group that might take the pod is only full
/// or busy for now (cluster-autoscaler's skipped reasons: `max node group size reached`, `max
/// cluster cpu, memory limit reached`, `in backoff after failed scale-up`, `not ready for
/// scale-up`): a node may free, or be added, later.
pub fn scale_up_blocked_for_now(message: &str) -> bool {
    let reasons = message.split_once("scale-up:").map_or(message, |(_, reasons)| reasons);
    ["max node group size reached", "in backoff after failed scale-up", "not ready for scale-up"]
        .iter()
        .any(|reason| reasons.contains(reason))
        || (reasons.contains("max cluster ") && reasons.contains(" limit reached"))
}

/// Whether the scheduler's message names nodes that turned the pod away only for the required
/// anti-affinity, which selects this runner's pods alone: each such node holds a run of this
/// runner, and takes the pod once that run ends (the scheduler's filters stop at a node's
/// first failure, and InterPodAffinity comes after the resource fit).
pub fn held_by_own_runs(message: &str) -> bool {
    message.contains("didn't match pod anti-affinity rules")
        || message.contains("didn't satisfy existing pods anti-affinity rules")
}

/// The first double-quoted word of a message: the image of a kubelet's event.
fn quoted(message: &str) -> Option<String> {
    let start = message.find('"')? + 1;
    let end = message[start..].find('"')? + start;
    Some(message[start..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).expect("a pod")
    }

    fn waiting(reason: &str, message: &str) -> Pod {
        pod(json!({"metadata": {"name": "p"}, "status": {"phase": "Pending", "containerStatuses": [
            {"name": "run", "image": "nope:1", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": reason, "message": message}}}
        ]}}))
    }

    fn event(reason: &str, message: &str) -> Event {
        serde_json::from_value(
            json!({"metadata": {"name": "e"}, "involvedObject": {}, "reason": reason, "message": message}),
        )
        .expect("an event")
    }

    #[test]
    fn image_failures_are_named_as_far_as_the_registry_says() {
        let missing = from_pod(&waiting("ErrImagePull", "rpc error: code = NotFound desc = nope:1: not found"));
        assert!(
            matches!(missing, PodState::Failed { ref cause, .. } if cause.starts_with("the image nope:1 does not exist")),
            "{missing:?}"
        );
        let denied = from_pod(&waiting("ErrImagePull", "pulling nope:1: 401 Unauthorized"));
        assert!(matches!(denied, PodState::Failed { ref cause, .. } if cause.contains("was denied")), "{denied:?}");
        let alike = "pull access denied, repository does not exist or may require authorization: server message: insufficient_scope";
        let either = from_pod(&waiting("ErrImagePull", alike));
        assert!(
            matches!(either, PodState::Failed { ref cause, .. } if cause.contains("does not say whether") && cause.contains(alike)),
            "{either:?}"
        );
        let back_off = from_pod(&waiting("ImagePullBackOff", "Back-off pulling image \"nope:1\""));
        assert!(matches!(back_off, PodState::Pending { .. }), "{back_off:?}");
        let mut said = Said::default();
        said.add(&event("Failed", "Error: ImagePullBackOff"));
        assert_eq!(said.image, None, "the back-off's own event says nothing");
        said.add(&event("Failed", "Failed to pull image \"nope:1\": rpc error: code = NotFound desc = not found"));
        assert!(said.image.as_deref().is_some_and(|cause| cause.starts_with("the image nope:1 does not exist")));
        let invalid = from_pod(&waiting("InvalidImageName", "couldn't parse image name \"Bad Image!!\""));
        assert!(matches!(invalid, PodState::Failed { ref cause, .. } if cause.contains("is not valid")), "{invalid:?}");
    }

    #[test]
    fn a_service_container_is_named_by_its_service() {
        let running = json!({"running": {}});
        let two = |service: serde_json::Value| {
            pod(json!({"metadata": {"name": "p"}, "status": {"phase": "Running", "containerStatuses": [
                {"name": "run", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0, "state": running},
                {"name": "service-db", "image": "nope:1", "imageID": "", "ready": false, "restartCount": 0, "state": service}
            ]}}))
        };
        let missing = two(json!({"waiting": {"reason": "ErrImagePull", "message": "nope:1: not found"}}));
        assert!(
            matches!(from_pod(&missing), PodState::Failed { ref cause, .. } if cause.starts_with("service db: the image nope:1 does not exist")),
            "{:?}",
            from_pod(&missing)
        );
        assert_eq!(ended_service(&missing), None);
        let ended = two(json!({"terminated": {"exitCode": 3, "reason": "Error"}}));
        assert_eq!(
            from_pod(&ended),
            PodState::Failed { name: "p".into(), cause: "service db ended (Error, exit code 3)".into() }
        );
        assert_eq!(ended_service(&ended).as_deref(), Some("service-db"));
        assert!(broken(&ended).is_some_and(|cause| cause.contains("service db ended")));
        let mut said = Said::default();
        let mut failed =
            event("Failed", "Failed to pull image \"nope:1\": rpc error: code = NotFound desc = not found");
        failed.involved_object.field_path = Some("spec.containers{service-db}".into());
        said.add(&failed);
        assert!(said.image.as_deref().is_some_and(|cause| cause.starts_with("service db: the image nope:1")));
        assert_eq!(Container::of("run"), Container::Run);
        assert_eq!(Container::of("service-run"), Container::Service("run".into()));
    }

    #[test]
    fn unschedulable_and_scale_up_events() {
        let pending = pod(json!({"metadata": {"name": "p"}, "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available: 1 Insufficient cpu."}
        ]}}));
        assert_eq!(
            from_pod(&pending),
            PodState::Unschedulable {
                name: "p".into(),
                message: "0/1 nodes are available: 1 Insufficient cpu.".into()
            }
        );
        let mut said = Said::default();
        said.add(&event("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 Insufficient cpu"));
        said.add(&event("TriggeredScaleUp", "pod triggered scale-up: [{pool 1->2 (max: 3)}]"));
        assert_eq!(said.scale, Some(Scale::Adding("pod triggered scale-up: [{pool 1->2 (max: 3)}]".into())));
        said.add(&event("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 Insufficient cpu"));
        assert!(matches!(said.scale, Some(Scale::Refused(_))), "the last word counts");
        said.add(&event("FailedCreate", "Error creating: pods \"j-1\" is forbidden: violates PodSecurity"));
        assert!(said.failed_create.as_deref().is_some_and(|m| m.contains("PodSecurity")));
    }

    #[test]
    fn a_full_node_group_and_nodes_the_runner_holds_are_waited_for() {
        assert!(scale_up_blocked_for_now("pod didn't trigger scale-up: 1 max node group size reached"));
        assert!(scale_up_blocked_for_now(
            "pod didn't trigger scale-up: 2 node(s) didn't match Pod's node affinity/selector, 1 max node group size reached"
        ));
        assert!(scale_up_blocked_for_now("pod didn't trigger scale-up: 1 max cluster cpu, memory limit reached"));
        assert!(scale_up_blocked_for_now("pod didn't trigger scale-up: 1 in backoff after failed scale-up"));
        assert!(!scale_up_blocked_for_now("pod didn't trigger scale-up: 1 Insufficient cpu"));
        let held = "0/5 nodes are available: 5 node(s) didn't match pod anti-affinity rules. preemption: 0/5 nodes are available: 5 No preemption victims found for incoming pod.";
        assert!(held_by_own_runs(held));
        assert!(held_by_own_runs(
            "0/2 nodes are available: 2 node(s) didn't satisfy existing pods anti-affinity rules."
        ));
        assert!(!held_by_own_runs("0/1 nodes are available: 1 Insufficient cpu."));
    }

    #[test]
    fn a_pull_refused_for_now_waits_and_a_second_refusal_is_counted() {
        let limited = "rpc error: code = Unknown desc = failed to pull and unpack image \"docker.io/library/busybox:latest\": failed to copy: httpReadSeeker: failed open: unexpected status code https://registry-1.docker.io/v2/library/busybox/manifests/sha256:abc: 429 Too Many Requests - Server message: toomanyrequests: You have reached your pull rate limit.";
        assert!(temporary_pull_error(limited));
        assert!(temporary_pull_error(
            "unexpected status from HEAD request to https://r/v2/x/manifests/1: 503 Service Unavailable"
        ));
        assert!(!temporary_pull_error("rpc error: code = NotFound desc = nope:1: not found"));
        assert!(matches!(from_pod(&waiting("ErrImagePull", limited)), PodState::Pending { .. }));
        let mut said = Said::default();
        let mut failed = event("Failed", &format!("Failed to pull image \"busybox\": {limited}"));
        said.add(&failed);
        assert_eq!((said.temporary_pulls(), said.image.clone()), (1, None));
        failed.count = Some(2);
        said.add(&failed);
        assert_eq!(said.temporary_pulls(), 2, "the repeated event counts twice");
        assert!(said.temporary_pull.as_deref().is_some_and(|cause| cause.contains("toomanyrequests")));
    }

    #[test]
    fn a_container_killed_for_its_memory_is_named() {
        let ended = |state: serde_json::Value| {
            pod(json!({"metadata": {"name": "p"}, "status": {"phase": "Failed", "containerStatuses": [
                {"name": "run", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0, "state": state}
            ]}}))
        };
        let oom = ended(json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}}));
        assert!(
            matches!(from_pod(&oom), PodState::Failed { ref cause, .. } if cause.contains("more memory than its limit (OOMKilled, exit code 137)")),
            "{:?}",
            from_pod(&oom)
        );
        assert!(ended_container_of(&oom).is_some_and(|cause| cause.contains("OOMKilled")));
        let error = ended(json!({"terminated": {"exitCode": 2, "reason": "Error"}}));
        assert!(
            matches!(from_pod(&error), PodState::Failed { ref cause, .. } if cause.contains("the container ended (Error, exit code 2)"))
        );
    }

    #[test]
    fn ready_lost_and_terminating() {
        let ready = pod(
            json!({"metadata": {"name": "p"}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
        );
        assert_eq!(from_pod(&ready), PodState::Ready { name: "p".into() });
        assert_eq!(broken(&ready), None);
        let unready = pod(json!({"metadata": {"name": "p"}, "status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "False", "reason": "NodeNotReady"}]}}));
        assert!(broken(&unready).is_some_and(|cause| cause.contains("NodeNotReady")));
        let lost = pod(json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Running", "reason": "NodeLost", "message": "Node n1 which was running pod p is unresponsive"}}));
        assert!(
            matches!(from_pod(&lost), PodState::Failed { ref cause, .. } if cause.starts_with("its node was lost"))
        );
        assert!(node_lost(&lost));
        let evicted = pod(json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                 "message": "Taint manager: deleting due to NoExecute taint"}]}}));
        assert_eq!(
            from_pod(&evicted),
            PodState::Failed {
                name: "p".into(),
                cause: "its node was lost (DeletionByTaintManager): Taint manager: deleting due to NoExecute taint"
                    .into()
            }
        );
        assert!(node_lost(&evicted));
        let marked = pod(json!({"metadata": {"name": "p"}, "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "run", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {}}}]}}));
        assert!(node_lost(&marked), "marked not Ready by the node controller, its kubelet silent");
        assert!(!node_lost(&unready), "not Ready, and no container says otherwise");
    }
}
