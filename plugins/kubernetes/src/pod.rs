//! Reading a pod's state from `kubectl get -o json`: Ready, still pending, or failed for a
//! cause worth quoting (image missing, pull denied, unschedulable, node lost). Pure functions.
//!
//! An unschedulable pod is fatal at once, unless the cluster autoscaler said it is adding a
//! node for it (a `TriggeredScaleUp` event, or no nodes at all): the Pending pod of a tenant
//! that scales from zero is its scale signal, not a failure.

use serde_json::Value;

/// What a pod is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// No pod (yet, or any more).
    Missing,
    /// Not Ready yet; the detail says what it waits for.
    Pending { name: String, detail: String },
    /// Running and Ready.
    Ready { name: String },
    /// It will never become Ready: the cause.
    Failed { name: String, cause: String },
}

fn text<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    path.iter().try_fold(value, |value, key| value.get(*key)).and_then(Value::as_str).unwrap_or("")
}

/// The state of the first pod of a `get pods -o json` list.
pub fn from_list(list: &Value) -> PodState {
    match list.get("items").and_then(Value::as_array).and_then(|items| items.first()) {
        Some(pod) => from_pod(pod),
        None => PodState::Missing,
    }
}

/// The state of one pod.
pub fn from_pod(pod: &Value) -> PodState {
    let name = text(pod, &["metadata", "name"]).to_string();
    if !text(pod, &["metadata", "deletionTimestamp"]).is_empty() {
        return PodState::Failed {
            name,
            cause: "the pod is being deleted (its Job was deleted or its node lost)".into(),
        };
    }
    let phase = text(pod, &["status", "phase"]);
    if phase == "Failed" || phase == "Succeeded" {
        let reason = text(pod, &["status", "reason"]);
        let message = text(pod, &["status", "message"]);
        let cause = match reason {
            "NodeLost" => format!("the node was lost: {message}"),
            "DeadlineExceeded" => format!("the Job passed its activeDeadlineSeconds: {message}"),
            "" => format!("the pod ended ({phase})"),
            _ => format!("the pod ended ({phase}, {reason}): {message}"),
        };
        return PodState::Failed { name, cause };
    }
    let statuses = pod.pointer("/status/containerStatuses").and_then(Value::as_array).cloned().unwrap_or_default();
    for status in &statuses {
        let image = text(status, &["image"]);
        if let Some(waiting) = status.pointer("/state/waiting") {
            let reason = text(waiting, &["reason"]);
            let message = text(waiting, &["message"]);
            if let Some(cause) = image_failure(reason, message, image) {
                return PodState::Failed { name, cause };
            }
            if matches!(reason, "CreateContainerConfigError" | "CreateContainerError" | "CrashLoopBackOff") {
                return PodState::Failed { name, cause: format!("the container cannot start ({reason}): {message}") };
            }
        }
        if let Some(terminated) = status.pointer("/state/terminated") {
            let reason = text(terminated, &["reason"]);
            return PodState::Failed { name, cause: format!("the container ended ({reason})") };
        }
    }
    let conditions = pod.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let condition = |kind: &str| conditions.iter().find(|condition| text(condition, &["type"]) == kind);
    if let Some(scheduled) = condition("PodScheduled")
        && text(scheduled, &["status"]) == "False"
        && text(scheduled, &["reason"]) == "Unschedulable"
    {
        let message = text(scheduled, &["message"]);
        return PodState::Pending { name, detail: format!("unschedulable: {message}") };
    }
    if phase == "Running" && condition("Ready").is_some_and(|ready| text(ready, &["status"]) == "True") {
        return PodState::Ready { name };
    }
    PodState::Pending { name, detail: format!("phase {}", if phase.is_empty() { "unknown" } else { phase }) }
}

/// The cause of an image that cannot be pulled, from a waiting reason and message; `None`
/// when the reason is not about the image or says nothing yet.
pub fn image_failure(reason: &str, message: &str, image: &str) -> Option<String> {
    if !matches!(reason, "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull") {
        return None;
    }
    let lower = message.to_ascii_lowercase();
    if reason == "InvalidImageName"
        || ["not found", "manifest unknown", "does not exist", "no such host"].iter().any(|word| lower.contains(word))
    {
        Some(format!("the image {image} does not exist ({reason}): {message}"))
    } else if ["unauthorized", "denied", "authentication required", "forbidden", "401", "403"]
        .iter()
        .any(|word| lower.contains(word))
    {
        Some(format!("pulling the image {image} was denied ({reason}): {message}"))
    } else if reason == "ErrImagePull" || reason == "ErrImageNeverPull" {
        Some(format!("the image {image} cannot be pulled ({reason}): {message}"))
    } else {
        // ImagePullBackOff says only "Back-off pulling image": the events say why.
        None
    }
}

/// The pod's state with its events weighed in: an image back-off is named by its last
/// `Failed` event, and an unschedulable pod is fatal unless a scale-up was triggered.
pub fn with_events(state: PodState, events: &Value) -> PodState {
    let items = events.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
    let has = |reason: &str| items.iter().any(|event| text(event, &["reason"]) == reason);
    let last_warning = items
        .iter()
        .rev()
        .find(|event| text(event, &["type"]) == "Warning")
        .map(|event| (text(event, &["reason"]).to_string(), text(event, &["message"]).to_string()));
    match state {
        PodState::Pending { name, detail } if detail.starts_with("unschedulable") => {
            let scaling = has("TriggeredScaleUp") && !has("NotTriggerScaleUp");
            let no_nodes = detail.contains("0/0 nodes") || detail.contains("no nodes available");
            if scaling || no_nodes {
                PodState::Pending { name, detail: format!("{detail} (waiting for a node)") }
            } else {
                PodState::Failed { name, cause: format!("the pod is {detail}") }
            }
        }
        PodState::Pending { name, detail } => match last_warning {
            Some((reason, message)) if reason == "Failed" && message.contains("image") => {
                let cause = image_failure("ErrImagePull", &message, "")
                    .unwrap_or_else(|| format!("the image cannot be pulled: {message}"));
                PodState::Failed { name, cause }
            }
            _ => PodState::Pending { name, detail },
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn waiting(reason: &str, message: &str) -> Value {
        json!({"metadata": {"name": "p"}, "status": {"phase": "Pending", "containerStatuses": [
            {"name": "run", "image": "nope:1", "ready": false, "state": {"waiting": {"reason": reason, "message": message}}}
        ]}})
    }

    #[test]
    fn image_failures_are_named() {
        let missing = from_pod(&waiting("ErrImagePull", "rpc error: nope:1: not found"));
        assert!(
            matches!(missing, PodState::Failed { ref cause, .. } if cause.starts_with("the image nope:1 does not exist"))
        );
        let denied = from_pod(&waiting("ErrImagePull", "pull access denied, 401 Unauthorized"));
        assert!(matches!(denied, PodState::Failed { ref cause, .. } if cause.contains("was denied")));
        let back_off = from_pod(&waiting("ImagePullBackOff", "Back-off pulling image"));
        assert!(matches!(back_off, PodState::Pending { .. }));
        let events = json!({"items": [{"type": "Warning", "reason": "Failed", "message": "Failed to pull image \"nope:1\": not found"}]});
        assert!(matches!(with_events(back_off, &events), PodState::Failed { .. }));
    }

    #[test]
    fn unschedulable_is_fatal_unless_scaling_up() {
        let pod = json!({"metadata": {"name": "p"}, "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available: 1 Insufficient cpu."}
        ]}});
        let state = from_pod(&pod);
        let failed = with_events(state.clone(), &json!({"items": []}));
        assert!(matches!(failed, PodState::Failed { ref cause, .. } if cause.contains("Insufficient cpu")));
        let scaling = json!({"items": [{"type": "Normal", "reason": "TriggeredScaleUp", "message": "scale up"}]});
        assert!(matches!(with_events(state, &scaling), PodState::Pending { .. }));
    }

    #[test]
    fn ready_lost_and_missing() {
        let ready = json!({"metadata": {"name": "p"}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(from_pod(&ready), PodState::Ready { name: "p".into() });
        let lost = json!({"metadata": {"name": "p"}, "status": {"phase": "Failed", "reason": "NodeLost", "message": "node n1 is unresponsive"}});
        assert!(matches!(from_pod(&lost), PodState::Failed { ref cause, .. } if cause.contains("node was lost")));
        assert_eq!(from_list(&json!({"items": []})), PodState::Missing);
    }
}
