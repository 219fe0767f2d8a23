//! The kubelet of each node (pkg/kubelet): a pod worker per pod bound to the node
//! (pkg/kubelet/pod_workers.go) that syncs the pod as pkg/kubelet/kuberuntime/kuberuntime_manager.go
//! `SyncPod` does: every container of `spec.containers` in spec order, each started on its own
//! (a container whose image cannot be pulled stays waiting while the others start and run, and
//! is tried again on its own back-off). For each container it pulls the image
//! (pkg/kubelet/images/image_manager.go: `Pulling`, `Pulled`, `Failed`, `BackOff` with the image
//! back-off doubling up to 300 s, `InspectFailed`/`InvalidImageName` for a reference that does
//! not parse, "already present on machine" for IfNotPresent), starts it in a sandbox of its own
//! (pkg/kubelet/kuberuntime/kuberuntime_container.go `startContainer`: `Created container: NAME`,
//! `Started container NAME`, `Error: ErrImagePull`; every event names its container in
//! `fieldPath` `spec.containers{NAME}`), and writes the managed `/etc/hosts` into it
//! (pkg/kubelet/kubelet_pods.go `makeHostsMount`, `managedHostsFileContent`,
//! `hostsEntriesFromHostAliases`: the pod IP is chosen first, as upstream takes it from the pod
//! sandbox before any container starts). It reports status (pkg/kubelet/status/status_manager.go
//! and kubelet_pods.go `generateAPIPodStatus`: a containerStatus per container in spec order,
//! the phase as `getPhase` computes it, `Ready`/`ContainersReady` as
//! pkg/kubelet/status/generate.go `GenerateContainersReadyCondition` does); a container that
//! exits is terminated while the others run, and the pod is terminal once all have ended. On
//! deletion it sends TERM to every running container, KILL to those left after the grace period
//! (`Killing`, `Stopping container NAME`), marks a container that never started as
//! status_manager.go `TerminatePod` does (`ContainerStatusUnknown`, exit code 137), puts the pod
//! in a terminal phase and deletes it with grace 0. A lost node's kubelet does nothing until it
//! is restored, its containers frozen.
//!
//! The fake's pods share the host's network namespace rather than one each (src/sandbox.rs): a
//! name that `hostAliases` maps to 127.0.0.1 reaches a server another container of the pod
//! listens on, as in a real pod whose containers share one network namespace.

mod images;

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use crate::app::{PodRuntime, Shared};
use crate::events;
use crate::registry;
use crate::sandbox::{self, ContainerSpec};
use crate::util::{self, text};
use images::{Pull, ensure_image, full_reference};

/// The kubelet's image back-off ceiling (`MaxContainerBackOff`... images use 300 s).
const MAX_PULL_BACKOFF: Duration = Duration::from_secs(300);

/// The pod's node is up (its kubelet runs).
fn kubelet_up(app: &Shared, node: &str) -> bool {
    app.lock().rt.nodes.get(node).is_some_and(|n| n.lost_at.is_none() && Instant::now() >= n.ready_at)
}

/// A worker's view of the store's changes.
fn changes(app: &Shared) -> watch::Receiver<u64> {
    let mut changed = app.changed.clone();
    // A clone has the version the original saw (none, for the server's): mark the current
    // one seen, or every wait would return at once.
    changed.borrow_and_update();
    changed
}

/// Waits for a store change since the last wait, or `timeout`.
async fn settle(changed: &mut watch::Receiver<u64>, timeout: Duration) {
    let _ = tokio::time::timeout(timeout, changed.changed()).await;
}

/// The pod if it is still the one this worker runs.
fn current(app: &Shared, namespace: &str, name: &str, uid: &str) -> Option<Value> {
    app.lock().store.get("pods", namespace, name).filter(|p| text(p, "/metadata/uid") == uid).cloned()
}

/// An event about one container of the pod (`fieldPath` `spec.containers{NAME}`).
fn event(app: &Shared, pod: &Value, container: &str, kind: &str, reason: &str, message: &str) {
    let node = text(pod, "/spec/nodeName").to_string();
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

/// One container of the pod as its worker keeps it.
struct Container {
    name: String,
    /// The image as the spec names it.
    image: String,
    policy: String,
    spec: ContainerSpec,
    /// The image manager's back-off for this container's image: failed pulls so far, and
    /// until when it backs off.
    failures: u32,
    backoff_until: Option<Instant>,
    /// When the worker may try to start it again.
    next_try: Instant,
    state: Run,
    /// Its entry of `status.containerStatuses`.
    status: Value,
    /// It was killed for its memory: it ends `OOMKilled`.
    oom_killed: bool,
}

enum Run {
    /// Not started (yet): pulling, backing off, or not tried.
    Waiting,
    /// Started; its PID 1 (`None` if it ended before it was seen).
    Running {
        init: Option<i32>,
    },
    Ended,
}

impl Container {
    fn running(&self) -> Option<i32> {
        match self.state {
            Run::Running { init } => Some(init.unwrap_or(0)),
            _ => None,
        }
    }

    fn waiting(&mut self, reason: &str, message: Option<&str>) {
        let mut waiting = json!({"reason": reason});
        if let Some(message) = message {
            waiting["message"] = json!(message);
        }
        self.status = json!({"name": self.name, "state": {"waiting": waiting}, "lastState": {}, "ready": false,
            "restartCount": 0, "image": self.image, "imageID": "", "started": false});
    }
}

/// The pod's hostname and domain (kubelet_pods.go `GeneratePodHostNameAndDomain`:
/// `spec.hostname` or the pod's name, at most 63 characters; `spec.subdomain` gives
/// `SUBDOMAIN.NAMESPACE.svc.cluster.local`).
fn host_name_and_domain(pod: &Value) -> (String, String) {
    let mut hostname = match text(pod, "/spec/hostname") {
        "" => text(pod, "/metadata/name").to_string(),
        hostname => hostname.to_string(),
    };
    if hostname.len() > 63 {
        hostname.truncate(63);
        hostname = hostname.trim_end_matches(['-', '.']).to_string();
    }
    let domain = match text(pod, "/spec/subdomain") {
        "" => String::new(),
        subdomain => format!("{subdomain}.{}.svc.cluster.local", text(pod, "/metadata/namespace")),
    };
    (hostname, domain)
}

/// The pod's `/etc/hosts` (kubelet_pods.go `ensureHostsFile`): for a pod on the pod network,
/// `managedHostsFileContent` (the header, localhost and the IPv6 lines, the pod's IPs with its
/// hostname); for one with `hostNetwork`, the node's own file under its header
/// (`nodeHostsFileContent`); then `hostsEntriesFromHostAliases`: a line per alias, its IP and
/// every hostname tab-separated.
fn hosts_file(pod: &Value, pod_ips: &[String]) -> String {
    let mut hosts = String::new();
    if pod.pointer("/spec/hostNetwork").and_then(Value::as_bool) == Some(true) {
        hosts.push_str("# Kubernetes-managed hosts file (host network).\n");
        hosts.push_str(&std::fs::read_to_string("/etc/hosts").unwrap_or_default());
    } else {
        let (hostname, domain) = host_name_and_domain(pod);
        hosts.push_str("# Kubernetes-managed hosts file.\n");
        hosts.push_str("127.0.0.1\tlocalhost\n");
        hosts.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
        hosts.push_str("fe00::0\tip6-localnet\n");
        hosts.push_str("fe00::0\tip6-mcastprefix\n");
        hosts.push_str("fe00::1\tip6-allnodes\n");
        hosts.push_str("fe00::2\tip6-allrouters\n");
        for ip in pod_ips {
            if domain.is_empty() {
                hosts.push_str(&format!("{ip}\t{hostname}\n"));
            } else {
                hosts.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n"));
            }
        }
    }
    let aliases = pod.pointer("/spec/hostAliases").and_then(Value::as_array).cloned().unwrap_or_default();
    if !aliases.is_empty() {
        hosts.push_str("\n# Entries added by HostAliases.\n");
        for alias in &aliases {
            let names: Vec<&str> = alias
                .get("hostnames")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            hosts.push_str(&format!("{}\t{}\n", text(alias, "/ip"), names.join("\t")));
        }
    }
    hosts
}

/// A container's command: `command` replaces the image entrypoint (busybox has none), `args`
/// its `Cmd` (`sh`).
fn container_spec(container: &Value) -> ContainerSpec {
    let strings = |p: &str| -> Vec<String> {
        container
            .pointer(p)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default()
    };
    let (command, args) = (strings("/command"), strings("/args"));
    let command = match (command.is_empty(), args.is_empty()) {
        (false, _) => command.into_iter().chain(args).collect(),
        (true, false) => args,
        (true, true) => vec!["sh".to_string()],
    };
    let env = container
        .pointer("/env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| (text(e, "/name").to_string(), text(e, "/value").to_string()))
        .collect();
    let mounts = container
        .pointer("/volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|m| text(m, "/mountPath").to_string())
        .collect();
    ContainerSpec {
        command,
        env,
        working_dir: text(container, "/workingDir").to_string(),
        mounts,
        hostname: String::new(),
        hosts: None,
    }
}

/// The worker's containers, from the pod's spec, in spec order.
fn containers_of(pod: &Value) -> Vec<Container> {
    let (hostname, _) = host_name_and_domain(pod);
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|spec| {
            let mut container = Container {
                name: text(spec, "/name").to_string(),
                image: text(spec, "/image").to_string(),
                policy: text(spec, "/imagePullPolicy").to_string(),
                spec: ContainerSpec { hostname: hostname.clone(), ..container_spec(spec) },
                failures: 0,
                backoff_until: None,
                next_try: Instant::now(),
                state: Run::Waiting,
                status: Value::Null,
                oom_killed: false,
            };
            container.waiting("ContainerCreating", None);
            container
        })
        .collect()
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(9))
}

/// `getPhase` (pkg/kubelet/kubelet_pods.go) for the pod's containers: one waiting, Pending;
/// none waiting and one running, Running; all terminated, Succeeded if every exit code is 0,
/// else Failed (restartPolicy Never and OnFailure alike once the worker stops: the fake
/// restarts no container).
fn phase(containers: &[Container]) -> &'static str {
    let state = |c: &Container| c.status.pointer("/state").and_then(Value::as_object).cloned().unwrap_or_default();
    let waiting = containers.iter().filter(|c| state(c).contains_key("waiting")).count();
    let running = containers.iter().filter(|c| state(c).contains_key("running")).count();
    let stopped: Vec<i64> = containers
        .iter()
        .filter_map(|c| c.status.pointer("/state/terminated/exitCode").and_then(Value::as_i64))
        .collect();
    if waiting > 0 {
        "Pending"
    } else if running > 0 {
        "Running"
    } else if !stopped.is_empty() && stopped.len() == containers.len() {
        if stopped.iter().all(|code| *code == 0) { "Succeeded" } else { "Failed" }
    } else {
        "Pending"
    }
}

/// Posts the pod's status from its containers' (generateAPIPodStatus): the statuses in spec
/// order, the phase, and `Ready`/`ContainersReady` (`GenerateContainersReadyCondition`: False
/// with `ContainersNotReady` naming the unready containers; `PodCompleted` once terminal).
fn publish(app: &Shared, namespace: &str, name: &str, uid: &str, containers: &[Container]) {
    let statuses: Vec<Value> = containers.iter().map(|c| c.status.clone()).collect();
    let phase = phase(containers);
    let unready: Vec<&str> =
        containers.iter().filter(|c| c.status["ready"] != json!(true)).map(|c| c.name.as_str()).collect();
    update_status(app, namespace, name, uid, |status| {
        status["phase"] = json!(phase);
        if phase == "Succeeded" || phase == "Failed" {
            set_condition(status, "PodReadyToStartContainers", "False", None, None);
            set_condition(status, "Ready", "False", Some("PodCompleted"), None);
            set_condition(status, "ContainersReady", "False", Some("PodCompleted"), None);
        } else if unready.is_empty() {
            set_condition(status, "Ready", "True", None, None);
            set_condition(status, "ContainersReady", "True", None, None);
        } else {
            let message = format!("containers with unready status: [{}]", unready.join(" "));
            set_condition(status, "Ready", "False", Some("ContainersNotReady"), Some(&message));
            set_condition(status, "ContainersReady", "False", Some("ContainersNotReady"), Some(&message));
        }
        status["containerStatuses"] = json!(statuses);
    });
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

/// Whether the node of the pod is lost (its kubelet stopped).
fn node_lost(app: &Shared, node: &str) -> bool {
    app.lock().rt.nodes.get(node).is_some_and(|n| n.lost_at.is_some())
}

/// A container's start (`startContainer`, after the image): its sandbox, `Created` and
/// `Started`, its PID 1 on record for exec, and a task that reports its exit.
async fn start_container(
    app: &Shared,
    pod: &Value,
    containers: &mut [Container],
    index: usize,
    exits: &mpsc::UnboundedSender<(usize, i32)>,
) -> bool {
    let (namespace, name) = util::ns_name(pod);
    let uid = text(pod, "/metadata/uid").to_string();
    let c = &mut containers[index];
    // The isolation checker sees the pod as running from before its process exists.
    app.lock().store.check_isolation(Some(&uid), &format!("container {} of pod {name} starting", c.name));
    match sandbox::start(&app.config.dir, &app.config.rootfs, &namespace, &name, &c.name, &c.spec).await {
        Ok((mut child, init)) => {
            event(app, pod, &c.name, "Normal", "Created", &format!("Created container: {}", c.name));
            event(app, pod, &c.name, "Normal", "Started", &format!("Started container {}", c.name));
            {
                let mut state = app.lock();
                let runtime = state
                    .rt
                    .pods
                    .entry((namespace.clone(), name.clone()))
                    .or_insert_with(|| PodRuntime { uid: uid.clone(), init_pids: Default::default() });
                if let Some(init) = init {
                    runtime.init_pids.insert(c.name.clone(), init);
                }
            }
            let exits = exits.clone();
            tokio::spawn(async move {
                let code = child.wait().await.map(exit_code).unwrap_or(137);
                let _ = exits.send((index, code));
            });
            let reference = full_reference(&c.image);
            let image_id = format!(
                "{}@sha256:{:016x}{:016x}{:016x}{:016x}",
                reference.split(':').next().unwrap_or(""),
                util::random(),
                util::random(),
                util::random(),
                util::random()
            );
            let container_id = format!(
                "containerd://{:016x}{:016x}{:016x}{:016x}",
                util::random(),
                util::random(),
                util::random(),
                util::random()
            );
            c.state = Run::Running { init };
            c.status = json!({"name": c.name, "state": {"running": {"startedAt": util::now()}},
                "lastState": {}, "ready": true, "restartCount": 0, "image": reference, "imageID": image_id,
                "containerID": container_id, "started": true});
            true
        }
        Err(error) => {
            tracing::warn!(%error, container = %c.name, "sandbox start failed");
            let message = format!("Error: failed to create containerd task: {error}");
            event(app, pod, &c.name, "Warning", "Failed", &message);
            c.next_try = Instant::now() + Duration::from_secs(1);
            false
        }
    }
}

/// A container's exit: terminated with its code, its PID 1 off the record.
fn ended(app: &Shared, namespace: &str, name: &str, c: &mut Container, exit: i32) {
    if let Some(runtime) = app.lock().rt.pods.get_mut(&(namespace.to_string(), name.to_string())) {
        runtime.init_pids.remove(&c.name);
    }
    let _ = std::fs::remove_file(sandbox::container_dir(&app.config.dir, namespace, name, &c.name).join("init.pid"));
    c.state = Run::Ended;
    let (reason, exit) = match (c.oom_killed, exit) {
        (true, _) => ("OOMKilled", 137),
        (false, 0) => ("Completed", 0),
        (false, exit) => ("Error", exit),
    };
    let started_at = c.status.pointer("/state/running/startedAt").cloned().unwrap_or_else(|| json!(util::now()));
    let container_id = c.status.get("containerID").cloned().unwrap_or(Value::Null);
    c.status["state"] = json!({"terminated": {"exitCode": exit, "reason": reason, "startedAt": started_at,
                                              "finishedAt": util::now(), "containerID": container_id}});
    c.status["ready"] = json!(false);
    c.status["started"] = json!(false);
}

/// The kernel's OOM killer, when the `oom-kill` fault is set (once): the first running
/// container of the pod passed its memory limit, and every process of its cgroup is killed
/// (cgroup v2 `memory.oom.group`, which the kubelet sets for containers); the runtime reports
/// it terminated with reason `OOMKilled` and exit code 137 (containerd
/// internal/cri/server/events.go, `oomExitReason`; pkg/kubelet/kuberuntime/kuberuntime_container.go
/// takes the reason as the runtime gives it), and the kubelet's OOM watcher records a Warning
/// `SystemOOM` on the node (pkg/kubelet/oom/oom_watcher_linux.go).
fn oom_kill(app: &Shared, pod: &Value, containers: &mut [Container]) {
    let Some(c) = containers.iter_mut().find(|c| c.running().is_some()) else { return };
    let node = {
        let mut state = app.lock();
        let fault = "oom-kill";
        if !state.rt.faults.contains(fault) || state.rt.fired.contains(fault) {
            return;
        }
        state.rt.fired.insert(fault.to_string());
        state.store.get("nodes", "", text(pod, "/spec/nodeName")).cloned()
    };
    let init = c.running().unwrap_or(0);
    c.oom_killed = true;
    for pid in sandbox::processes(init) {
        sandbox::signal(pid, Signal::SIGKILL);
    }
    sandbox::signal(init, Signal::SIGKILL);
    if let Some(node) = node {
        let message = format!("System OOM encountered, victim process: sh, pid: {init}");
        let host = text(&node, "/metadata/name").to_string();
        events::record(&mut app.lock().store, &node, "Warning", "SystemOOM", &message, "kubelet", &host, "");
    }
}

/// Runs one pod on its node until it is gone.
pub async fn run(app: Shared, namespace: String, name: String, uid: String) {
    let mut changed = changes(&app);
    let node =
        current(&app, &namespace, &name, &uid).map(|p| text(&p, "/spec/nodeName").to_string()).unwrap_or_default();
    let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<(usize, i32)>();
    let mut exits: Vec<(usize, i32)> = Vec::new();
    let mut containers: Vec<Container> = Vec::new();
    let mut frozen = false;
    let mut kill_at: Option<Instant> = None;
    let mut termed = false;
    loop {
        let up = kubelet_up(&app, &node);
        let running: Vec<i32> = containers.iter().filter_map(Container::running).collect();
        if !up && !frozen && node_lost(&app, &node) {
            for init in &running {
                sandbox::freeze(*init, true);
            }
            frozen = true;
        }
        if up && frozen {
            for init in &running {
                sandbox::freeze(*init, false);
            }
            frozen = false;
        }
        let pod = current(&app, &namespace, &name, &uid);
        if up {
            // The exits seen while the kubelet was away are reported now.
            while let Ok(exit) = exit_rx.try_recv() {
                exits.push(exit);
            }
            let mut any = false;
            for (index, code) in exits.drain(..) {
                if let Some(c) = containers.get_mut(index) {
                    ended(&app, &namespace, &name, c, code);
                    any = true;
                }
            }
            if any {
                publish(&app, &namespace, &name, &uid, &containers);
            }
        }
        let started = containers.iter().any(|c| !matches!(c.state, Run::Waiting));
        let running = containers.iter().filter_map(Container::running).collect::<Vec<_>>();
        let Some(pod) = pod else {
            // Gone without the kubelet's confirmation: kill what runs, then stop.
            if up {
                for init in &running {
                    sandbox::signal(*init, Signal::SIGKILL);
                }
            }
            if running.is_empty() {
                break;
            }
            tokio::select! {
                Some(exit) = exit_rx.recv() => exits.push(exit),
                _ = settle(&mut changed, Duration::from_millis(100)) => {}
            }
            continue;
        };
        if !up {
            settle(&mut changed, Duration::from_millis(200)).await;
            continue;
        }
        if containers.is_empty() {
            containers = containers_of(&pod);
        }
        let deleting = pod.pointer("/metadata/deletionTimestamp").is_some();
        if deleting && !started {
            // Nothing ran: the pod goes at once.
            finish_deletion(&app, &namespace, &name, &uid);
            settle(&mut changed, Duration::from_millis(200)).await;
            continue;
        }
        if deleting {
            if !termed {
                for c in containers.iter().filter(|c| c.running().is_some()) {
                    event(&app, &pod, &c.name, "Normal", "Killing", &format!("Stopping container {}", c.name));
                    sandbox::signal(c.running().unwrap_or(0), Signal::SIGTERM);
                }
                let grace = pod.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_u64).unwrap_or(0);
                kill_at = Some(Instant::now() + Duration::from_secs(grace));
                termed = true;
            }
            if kill_at.is_some_and(|at| Instant::now() >= at) {
                for init in &running {
                    sandbox::signal(*init, Signal::SIGKILL);
                }
            }
            if running.is_empty() {
                break;
            }
        } else {
            oom_kill(&app, &pod, &mut containers);
            if text(&pod, "/status/phase") == "Pending" && pod.pointer("/status/containerStatuses").is_none() {
                // The pod sandbox: its IP (the node's for hostNetwork), then the containers.
                let host_network = pod.pointer("/spec/hostNetwork").and_then(Value::as_bool) == Some(true);
                let ip = if host_network {
                    "10.0.0.1".to_string()
                } else {
                    format!("10.244.0.{}", 2 + util::random() % 250)
                };
                let hosts = hosts_file(&pod, std::slice::from_ref(&ip));
                for c in &mut containers {
                    c.spec.hosts = Some(hosts.clone());
                }
                let statuses: Vec<Value> = containers.iter().map(|c| c.status.clone()).collect();
                let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
                update_status(&app, &namespace, &name, &uid, |status| {
                    status["startTime"] = json!(util::now());
                    status["hostIP"] = json!("10.0.0.1");
                    status["hostIPs"] = json!([{"ip": "10.0.0.1"}]);
                    status["podIP"] = json!(ip);
                    status["podIPs"] = json!([{"ip": ip}]);
                    set_condition(status, "PodReadyToStartContainers", "True", None, None);
                    set_condition(status, "Initialized", "True", None, None);
                    let unready = format!("containers with unready status: [{}]", names.join(" "));
                    set_condition(status, "Ready", "False", Some("ContainersNotReady"), Some(&unready));
                    set_condition(status, "ContainersReady", "False", Some("ContainersNotReady"), Some(&unready));
                    status["containerStatuses"] = json!(statuses);
                });
            }
            // SyncPod: every container due, in spec order, each on its own.
            for index in 0..containers.len() {
                if !matches!(containers[index].state, Run::Waiting) || containers[index].next_try > Instant::now() {
                    continue;
                }
                let Some(pod) = current(&app, &namespace, &name, &uid) else { break };
                if pod.pointer("/metadata/deletionTimestamp").is_some() || !kubelet_up(&app, &node) {
                    break;
                }
                match ensure_image(&app, &pod, &mut containers[index]).await {
                    Pull::Done => {}
                    Pull::Deleted => break,
                    Pull::Retry(after, reason, message) => {
                        let c = &mut containers[index];
                        c.next_try = Instant::now() + after;
                        c.waiting(reason, Some(&message));
                        publish(&app, &namespace, &name, &uid, &containers);
                        continue;
                    }
                }
                if start_container(&app, &pod, &mut containers, index, &exit_tx).await {
                    publish(&app, &namespace, &name, &uid, &containers);
                }
            }
            if !containers.is_empty() && containers.iter().all(|c| matches!(c.state, Run::Ended)) {
                break;
            }
        }
        // Until the next exit, store change, container due, or the kill check (100 ms).
        let now = Instant::now();
        let due = containers.iter().filter(|c| !deleting && matches!(c.state, Run::Waiting)).map(|c| c.next_try);
        let wait = due
            .map(|at| at.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_millis(100))
            .clamp(Duration::from_millis(10), Duration::from_millis(100));
        tokio::select! {
            Some(exit) = exit_rx.recv() => exits.push(exit),
            _ = settle(&mut changed, wait) => {}
        }
    }
    // The containers that never started, once the pod ends (status_manager.go `TerminatePod`).
    if containers.iter().any(|c| matches!(c.state, Run::Waiting)) && current(&app, &namespace, &name, &uid).is_some() {
        for c in containers.iter_mut().filter(|c| matches!(c.state, Run::Waiting)) {
            c.state = Run::Ended;
            c.status["state"] = json!({"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                "message": "The container could not be located when the pod was terminated"}});
        }
        publish(&app, &namespace, &name, &uid, &containers);
    }
    app.lock().rt.pods.remove(&(namespace.clone(), name.clone()));
    let names: Vec<String> = containers.iter().map(|c| c.name.clone()).collect();
    cleanup(&app, &mut changed, &namespace, &name, &uid, &names).await;
}

/// After the containers: remove their roots, wait for the deletion (if any) and confirm it.
async fn cleanup(
    app: &Shared,
    changed: &mut watch::Receiver<u64>,
    namespace: &str,
    name: &str,
    uid: &str,
    containers: &[String],
) {
    for container in containers {
        sandbox::remove_root(&app.config.dir, namespace, name, container).await;
    }
    while let Some(pod) = current(app, namespace, name, uid) {
        if pod.pointer("/metadata/deletionTimestamp").is_some() && kubelet_up(app, text(&pod, "/spec/nodeName")) {
            finish_deletion(app, namespace, name, uid);
        }
        settle(changed, Duration::from_millis(200)).await;
    }
    app.lock().rt.workers.remove(uid);
}

#[cfg(test)]
mod tests {
    use super::images::valid_reference;
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

    #[test]
    fn hosts() {
        let pod = json!({"metadata": {"name": "p1", "namespace": "ns"},
            "spec": {"hostAliases": [{"ip": "127.0.0.1", "hostnames": ["web", "db"]}, {"ip": "10.1.2.3", "hostnames": ["x"]}]}});
        assert_eq!(
            hosts_file(&pod, &["10.244.0.7".to_string()]),
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
             fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
             10.244.0.7\tp1\n\n# Entries added by HostAliases.\n127.0.0.1\tweb\tdb\n10.1.2.3\tx\n"
        );
        let pod = json!({"metadata": {"name": "p1", "namespace": "ns"}, "spec": {"hostname": "h", "subdomain": "s"}});
        assert!(
            hosts_file(&pod, &["10.244.0.7".to_string()])
                .ends_with("fe00::2\tip6-allrouters\n10.244.0.7\th.s.ns.svc.cluster.local\th\n")
        );
    }
}
