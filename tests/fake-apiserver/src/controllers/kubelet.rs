//! The kubelet of each node (pkg/kubelet): a pod worker per pod bound to the node
//! (pkg/kubelet/pod_workers.go) that pulls the image (pkg/kubelet/images/image_manager.go:
//! `Pulling`, `Pulled`, `Failed`, `BackOff` with the image back-off doubling up to 300 s,
//! `InspectFailed`/`InvalidImageName` for a reference that does not parse, "already present
//! on machine" for IfNotPresent), starts the container (pkg/kubelet/kuberuntime/kuberuntime_container.go:
//! `Created container: NAME`, `Started container NAME`, `Error: ErrImagePull`), reports status
//! (pkg/kubelet/status/status_manager.go and kubelet_pods.go `generateAPIPodStatus`: phase,
//! conditions, containerStatuses), and on deletion sends TERM to the container, KILL after the
//! grace period (`Killing`, `Stopping container NAME`), puts the pod in a terminal phase and
//! deletes it with grace 0. A lost node's kubelet does nothing until it is restored.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::app::{PodRuntime, Shared};
use crate::events;
use crate::registry;
use crate::sandbox::{self, ContainerSpec};
use crate::util::{self, text};

/// The kubelet's image back-off ceiling (`MaxContainerBackOff`... images use 300 s).
const MAX_PULL_BACKOFF: Duration = Duration::from_secs(300);

/// The pod's node is up (its kubelet runs).
fn kubelet_up(app: &Shared, node: &str) -> bool {
    app.lock().rt.nodes.get(node).is_some_and(|n| n.lost_at.is_none() && Instant::now() >= n.ready_at)
}

/// Waits for a store change or `timeout`.
async fn settle(app: &Shared, timeout: Duration) {
    let mut changed = app.changed.clone();
    let _ = tokio::time::timeout(timeout, changed.changed()).await;
}

/// The pod if it is still the one this worker runs.
fn current(app: &Shared, namespace: &str, name: &str, uid: &str) -> Option<Value> {
    app.lock().store.get("pods", namespace, name).filter(|p| text(p, "/metadata/uid") == uid).cloned()
}

fn event(app: &Shared, pod: &Value, kind: &str, reason: &str, message: &str) {
    let node = text(pod, "/spec/nodeName").to_string();
    let container = text(pod, "/spec/containers/0/name").to_string();
    let mut state = app.lock();
    if let Some(fresh) = state.store.get("pods", text(pod, "/metadata/namespace"), text(pod, "/metadata/name")).cloned()
    {
        events::record(
            &mut state.store,
            &fresh,
            kind,
            reason,
            message,
            "kubelet",
            &node,
            &format!("spec.containers{{{container}}}"),
        );
    }
}

fn set_condition(status: &mut Value, kind: &str, value: &str, reason: Option<&str>, message: Option<&str>) {
    let now = util::now();
    let conditions = &mut status["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let Some(list) = conditions.as_array_mut() else { return };
    let mut condition = json!({"type": kind, "status": value, "lastProbeTime": null, "lastTransitionTime": now});
    if let Some(reason) = reason {
        condition["reason"] = json!(reason);
    }
    if let Some(message) = message {
        condition["message"] = json!(message);
    }
    match list.iter_mut().find(|c| text(c, "/type") == kind) {
        Some(existing) => {
            if text(existing, "/status") == value {
                condition["lastTransitionTime"] = existing["lastTransitionTime"].clone();
            }
            *existing = condition;
        }
        None => list.push(condition),
    }
}

/// Updates the pod's status (if it is still ours).
fn update_status(app: &Shared, namespace: &str, name: &str, uid: &str, change: impl FnOnce(&mut Value)) {
    let mut state = app.lock();
    let ours = state.store.get("pods", namespace, name).is_some_and(|p| text(p, "/metadata/uid") == uid);
    if ours {
        state.store.modify("pods", namespace, name, |pod| change(&mut pod["status"]));
    }
}

/// The fully qualified reference containerd resolves (`docker.io/library/busybox:latest`).
fn full_reference(image: &str) -> String {
    let (path, digest) = match image.split_once('@') {
        Some((p, d)) => (p, Some(d)),
        None => (image, None),
    };
    let first = path.split('/').next().unwrap_or("");
    let has_domain = path.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut name = if has_domain {
        path.to_string()
    } else if path.contains('/') {
        format!("docker.io/{path}")
    } else {
        format!("docker.io/library/{path}")
    };
    let last = name.rsplit('/').next().unwrap_or("");
    if !last.contains(':') && digest.is_none() {
        name.push_str(":latest");
    }
    match digest {
        Some(d) => format!("{name}@{d}"),
        None => name,
    }
}

/// Whether a reference parses (distribution/reference's grammar, simplified).
pub fn valid_reference(image: &str) -> bool {
    let (path, digest) = match image.split_once('@') {
        Some((p, d)) => (p, Some(d)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let Some((algorithm, hex)) = digest.split_once(':') else { return false };
        if algorithm.is_empty() || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return false;
        }
    }
    let (name, tag) = match path.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t)),
        _ => (path, None),
    };
    if let Some(tag) = tag {
        let ok = !tag.is_empty()
            && tag.len() <= 128
            && tag.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            && tag.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !ok {
            return false;
        }
    }
    let components: Vec<&str> = name.split('/').collect();
    let domain = components.len() > 1
        && (components[0].contains('.') || components[0].contains(':') || components[0] == "localhost");
    components.iter().enumerate().all(|(i, c)| {
        if i == 0 && domain {
            return !c.is_empty() && c.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'));
        }
        let bytes = c.as_bytes();
        !bytes.is_empty()
            && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
    })
}

/// Whether the registry has the image (`busybox`, `alpine` and the `--image` names).
fn known(app: &Shared, image: &str) -> bool {
    let normal = |i: &str| full_reference(i);
    let wanted = normal(image);
    ["busybox", "busybox:1.36", "alpine", "alpine:3"]
        .iter()
        .map(|s| s.to_string())
        .chain(app.config.images.iter().cloned())
        .any(|i| normal(&i) == wanted)
}

/// Go's `time.Duration` text for short durations.
fn go_duration(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        return if d.is_zero() { "0s".into() } else { format!("{}µs", d.as_micros()) };
    }
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    format!("{}s", (d.as_secs_f64() * 1000.0).round() / 1000.0)
}

enum Pull {
    Done,
    Retry(Duration),
    Deleted,
}

/// The image manager's `EnsureImageExists`, once.
async fn ensure_image(app: &Shared, pod: &Value, failures: &mut u32, backoff_until: &mut Option<Instant>) -> Pull {
    let (namespace, name) = util::ns_name(pod);
    let uid = text(pod, "/metadata/uid").to_string();
    let image = text(pod, "/spec/containers/0/image").to_string();
    let container = text(pod, "/spec/containers/0/name").to_string();
    let node = text(pod, "/spec/nodeName").to_string();
    let policy = text(pod, "/spec/containers/0/imagePullPolicy").to_string();
    let waiting = |reason: &str, message: &str| {
        let (reason, message) = (reason.to_string(), message.to_string());
        let container = container.clone();
        let image = image.clone();
        move |status: &mut Value| {
            status["containerStatuses"] = json!([{"name": container, "state": {"waiting": {"reason": reason, "message": message}},
                "lastState": {}, "ready": false, "restartCount": 0, "image": image, "imageID": "", "started": false}]);
        }
    };
    if !valid_reference(&image) {
        let message = format!(
            "Failed to apply default image tag \"{image}\": couldn't parse image name \"{image}\": invalid reference format"
        );
        event(app, pod, "Warning", "InspectFailed", &message);
        event(app, pod, "Warning", "Failed", "Error: InvalidImageName");
        update_status(app, &namespace, &name, &uid, waiting("InvalidImageName", &message));
        return Pull::Retry(app.config.pull_backoff.max(Duration::from_millis(500)));
    }
    let present = app.lock().rt.nodes.get(&node).is_some_and(|n| n.images.contains(&full_reference(&image)));
    if policy == "Never" && !present {
        let message = format!("Container image \"{image}\" is not present with pull policy of Never");
        event(app, pod, "Warning", "ErrImageNeverPull", &message);
        update_status(app, &namespace, &name, &uid, waiting("ErrImageNeverPull", &message));
        return Pull::Retry(app.config.pull_backoff.max(Duration::from_millis(500)));
    }
    if present && policy != "Always" {
        event(app, pod, "Normal", "Pulled", &format!("Container image \"{image}\" already present on machine"));
        return Pull::Done;
    }
    if let Some(until) = *backoff_until
        && Instant::now() < until
    {
        let message = format!("Back-off pulling image \"{image}\"");
        event(app, pod, "Normal", "BackOff", &message);
        event(app, pod, "Warning", "Failed", "Error: ImagePullBackOff");
        update_status(app, &namespace, &name, &uid, waiting("ImagePullBackOff", &message));
        return Pull::Retry(until - Instant::now());
    }
    event(app, pod, "Normal", "Pulling", &format!("Pulling image \"{image}\""));
    let started = Instant::now();
    tokio::time::sleep(app.config.image_pull).await;
    if current(app, &namespace, &name, &uid).is_none_or(|p| p.pointer("/metadata/deletionTimestamp").is_some()) {
        return Pull::Deleted;
    }
    let reference = full_reference(&image);
    let denied = app.fault("pull-denied");
    if denied || !known(app, &image) {
        let error = if denied {
            format!(
                "rpc error: code = Unknown desc = failed to pull and unpack image \"{reference}\": failed to resolve reference \"{reference}\": pull access denied, repository does not exist or may require authorization: server message: insufficient_scope: authorization failed"
            )
        } else {
            format!(
                "rpc error: code = NotFound desc = failed to pull and unpack image \"{reference}\": failed to resolve reference \"{reference}\": {reference}: not found"
            )
        };
        event(app, pod, "Warning", "Failed", &format!("Failed to pull image \"{image}\": {error}"));
        event(app, pod, "Warning", "Failed", "Error: ErrImagePull");
        update_status(app, &namespace, &name, &uid, waiting("ErrImagePull", &error));
        *failures += 1;
        let backoff = app.config.pull_backoff.saturating_mul(1 << (*failures - 1).min(16)).min(MAX_PULL_BACKOFF);
        *backoff_until = Some(Instant::now() + backoff);
        // The next sync comes soon and finds the pull backing off.
        return Pull::Retry((backoff / 4).min(Duration::from_secs(1)).max(Duration::from_millis(50)));
    }
    let took = go_duration(started.elapsed());
    let size = std::fs::metadata(&app.config.rootfs).map(|m| m.len()).unwrap_or(0);
    event(
        app,
        pod,
        "Normal",
        "Pulled",
        &format!(
            "Successfully pulled image \"{image}\" in {took} ({took} including waiting). Image size: {size} bytes."
        ),
    );
    if let Some(node) = app.lock().rt.nodes.get_mut(&node) {
        node.images.insert(reference);
    }
    *failures = 0;
    *backoff_until = None;
    Pull::Done
}

/// The container's command: `command` replaces the image entrypoint (busybox has none),
/// `args` its `Cmd` (`sh`).
fn container_spec(pod: &Value) -> ContainerSpec {
    let strings = |p: &str| -> Vec<String> {
        pod.pointer(p)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default()
    };
    let (command, args) = (strings("/spec/containers/0/command"), strings("/spec/containers/0/args"));
    let command = match (command.is_empty(), args.is_empty()) {
        (false, _) => command.into_iter().chain(args).collect(),
        (true, false) => args,
        (true, true) => vec!["sh".to_string()],
    };
    let env = pod
        .pointer("/spec/containers/0/env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| (text(e, "/name").to_string(), text(e, "/value").to_string()))
        .collect();
    let mounts = pod
        .pointer("/spec/containers/0/volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|m| text(m, "/mountPath").to_string())
        .collect();
    ContainerSpec { command, env, working_dir: text(pod, "/spec/containers/0/workingDir").to_string(), mounts }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(9))
}

/// The last step of a pod: terminal phase, then the kubelet's delete with grace 0.
fn finish_deletion(app: &Shared, namespace: &str, name: &str, uid: &str) {
    let mut state = app.lock();
    let ours = state.store.get("pods", namespace, name).is_some_and(|p| text(p, "/metadata/uid") == uid);
    if ours && let Some(pods) = crate::resources::by_key("pods") {
        let _ = registry::delete(
            &mut state,
            pods,
            namespace,
            name,
            registry::DeleteOptions { grace: Some(0), propagation: None },
        );
    }
}

/// Runs one pod on its node until it is gone.
pub async fn run(app: Shared, namespace: String, name: String, uid: String) {
    let mut failures = 0u32;
    let mut backoff_until = None;
    let node =
        current(&app, &namespace, &name, &uid).map(|p| text(&p, "/spec/nodeName").to_string()).unwrap_or_default();
    // Image and start.
    let (mut child, init) = loop {
        let Some(pod) = current(&app, &namespace, &name, &uid) else {
            return cleanup(&app, &namespace, &name, &uid).await;
        };
        if !kubelet_up(&app, &node) {
            settle(&app, Duration::from_millis(200)).await;
            continue;
        }
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            finish_deletion(&app, &namespace, &name, &uid);
            settle(&app, Duration::from_millis(200)).await;
            continue;
        }
        if text(&pod, "/status/phase") == "Pending" && pod.pointer("/status/containerStatuses").is_none() {
            let image = text(&pod, "/spec/containers/0/image").to_string();
            let container = text(&pod, "/spec/containers/0/name").to_string();
            update_status(&app, &namespace, &name, &uid, |status| {
                status["startTime"] = json!(util::now());
                status["hostIP"] = json!("10.0.0.1");
                status["hostIPs"] = json!([{"ip": "10.0.0.1"}]);
                set_condition(status, "PodReadyToStartContainers", "True", None, None);
                set_condition(status, "Initialized", "True", None, None);
                let unready = format!("containers with unready status: [{container}]");
                set_condition(status, "Ready", "False", Some("ContainersNotReady"), Some(&unready));
                set_condition(status, "ContainersReady", "False", Some("ContainersNotReady"), Some(&unready));
                status["containerStatuses"] = json!([{"name": container, "state": {"waiting": {"reason": "ContainerCreating"}},
                    "lastState": {}, "ready": false, "restartCount": 0, "image": image, "imageID": "", "started": false}]);
            });
        }
        match ensure_image(&app, &pod, &mut failures, &mut backoff_until).await {
            Pull::Done => {}
            Pull::Deleted => continue,
            Pull::Retry(after) => {
                let until = Instant::now() + after;
                while Instant::now() < until {
                    if current(&app, &namespace, &name, &uid)
                        .is_none_or(|p| p.pointer("/metadata/deletionTimestamp").is_some())
                    {
                        break;
                    }
                    settle(&app, until.saturating_duration_since(Instant::now()).min(Duration::from_millis(200))).await;
                }
                continue;
            }
        }
        let spec = container_spec(&pod);
        match sandbox::start(&app.config.dir, &app.config.rootfs, &namespace, &name, &spec).await {
            Ok(started) => {
                let container = text(&pod, "/spec/containers/0/name").to_string();
                event(&app, &pod, "Normal", "Created", &format!("Created container: {container}"));
                event(&app, &pod, "Normal", "Started", &format!("Started container {container}"));
                break started;
            }
            Err(error) => {
                tracing::warn!(%error, "sandbox start failed");
                event(&app, &pod, "Warning", "Failed", &format!("Error: failed to create containerd task: {error}"));
                settle(&app, Duration::from_secs(1)).await;
            }
        }
    };
    app.lock().rt.pods.insert((namespace.clone(), name.clone()), PodRuntime { uid: uid.clone(), init_pid: init });
    let init = init.unwrap_or(0);
    let container_id = format!(
        "containerd://{:016x}{:016x}{:016x}{:016x}",
        util::random(),
        util::random(),
        util::random(),
        util::random()
    );
    let started_at = util::now();
    if let Some(pod) = current(&app, &namespace, &name, &uid) {
        let image = text(&pod, "/spec/containers/0/image").to_string();
        let container = text(&pod, "/spec/containers/0/name").to_string();
        let reference = full_reference(&image);
        let ip = format!("10.244.0.{}", 2 + util::random() % 250);
        update_status(&app, &namespace, &name, &uid, |status| {
            status["phase"] = json!("Running");
            status["podIP"] = json!(ip);
            status["podIPs"] = json!([{"ip": ip}]);
            set_condition(status, "Ready", "True", None, None);
            set_condition(status, "ContainersReady", "True", None, None);
            status["containerStatuses"] = json!([{"name": container, "state": {"running": {"startedAt": started_at}},
                "lastState": {}, "ready": true, "restartCount": 0, "image": reference,
                "imageID": format!("{}@sha256:{:016x}{:016x}{:016x}{:016x}", reference.split(':').next().unwrap_or(""), util::random(), util::random(), util::random(), util::random()),
                "containerID": container_id, "started": true}]);
        });
    }
    // Running: wait for the exit or a deletion.
    let mut frozen = false;
    let mut kill_at: Option<Instant> = None;
    let mut termed = false;
    let exit = loop {
        let up = kubelet_up(&app, &node);
        if !up && !frozen && app.lock().rt.nodes.get(&node).is_some_and(|n| n.lost_at.is_some()) {
            sandbox::freeze(init, true);
            frozen = true;
        }
        if up && frozen {
            sandbox::freeze(init, false);
            frozen = false;
        }
        let pod = current(&app, &namespace, &name, &uid);
        if up {
            match &pod {
                None => {
                    sandbox::signal(init, Signal::SIGKILL);
                }
                Some(pod) if pod.pointer("/metadata/deletionTimestamp").is_some() && !termed => {
                    let container = text(pod, "/spec/containers/0/name").to_string();
                    event(&app, pod, "Normal", "Killing", &format!("Stopping container {container}"));
                    sandbox::signal(init, Signal::SIGTERM);
                    let grace =
                        pod.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_u64).unwrap_or(0);
                    kill_at = Some(Instant::now() + Duration::from_secs(grace));
                    termed = true;
                }
                _ => {}
            }
            if kill_at.is_some_and(|at| Instant::now() >= at) {
                sandbox::signal(init, Signal::SIGKILL);
            }
        }
        if !frozen {
            tokio::select! {
                status = child.wait() => break status.map(exit_code).unwrap_or(137),
                _ = settle(&app, Duration::from_millis(100)) => {}
            }
        } else {
            settle(&app, Duration::from_millis(200)).await;
        }
    };
    app.lock().rt.pods.remove(&(namespace.clone(), name.clone()));
    let _ = std::fs::remove_file(sandbox::pod_dir(&app.config.dir, &namespace, &name).join("init.pid"));
    // Report the termination once the kubelet is up.
    while !kubelet_up(&app, &node) && current(&app, &namespace, &name, &uid).is_some() {
        settle(&app, Duration::from_millis(200)).await;
    }
    let finished_at = util::now();
    let reason = if exit == 0 { "Completed" } else { "Error" };
    let phase = if exit == 0 { "Succeeded" } else { "Failed" };
    update_status(&app, &namespace, &name, &uid, |status| {
        status["phase"] = json!(phase);
        set_condition(status, "PodReadyToStartContainers", "False", None, None);
        set_condition(status, "Ready", "False", Some("PodCompleted"), None);
        set_condition(status, "ContainersReady", "False", Some("PodCompleted"), None);
        if let Some(cs) = status.pointer_mut("/containerStatuses/0") {
            cs["state"] = json!({"terminated": {"exitCode": exit, "reason": reason, "startedAt": started_at,
                                                "finishedAt": finished_at, "containerID": container_id}});
            cs["ready"] = json!(false);
            cs["started"] = json!(false);
        }
    });
    cleanup(&app, &namespace, &name, &uid).await;
}

/// After the container: wait for the deletion (if any) and confirm it.
async fn cleanup(app: &Shared, namespace: &str, name: &str, uid: &str) {
    sandbox::remove_root(&app.config.dir, namespace, name).await;
    while let Some(pod) = current(app, namespace, name, uid) {
        if pod.pointer("/metadata/deletionTimestamp").is_some() && kubelet_up(app, text(&pod, "/spec/nodeName")) {
            finish_deletion(app, namespace, name, uid);
        }
        settle(app, Duration::from_millis(200)).await;
    }
    app.lock().rt.workers.remove(uid);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        assert!(valid_reference("busybox"));
        assert!(valid_reference("busybox:1.36"));
        assert!(valid_reference("registry.example.com:5000/team/app:v1"));
        assert!(!valid_reference("Bad Image!!"));
        assert!(!valid_reference("UPPER/case"));
        assert_eq!(full_reference("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(full_reference("team/app:v1"), "docker.io/team/app:v1");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
    }
}
