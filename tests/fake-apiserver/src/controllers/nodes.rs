//! Nodes and the node lifecycle controller (pkg/controller/nodelifecycle/node_lifecycle_controller.go)
//! with taint-based eviction (pkg/controller/tainteviction/taint_eviction.go):
//! a node whose kubelet stopped posting status for `--node-monitor-grace` gets its conditions
//! `Unknown` (`NodeStatusUnknown`, "Kubelet stopped posting node status."), the
//! `node.kubernetes.io/unreachable` NoSchedule and NoExecute taints, its pods `Ready=False`
//! (`MarkPodsNotReady`, Warning `NodeNotReady` "Node is not ready"). The taint eviction
//! controller then takes each pod on the node once its toleration of the NoExecute taint runs
//! out (at once without one; the DefaultTolerationSeconds admission plugin gives every pod 300 s,
//! `--eviction-toleration`, in `registry.rs`): it adds the pod condition `DisruptionTarget`
//! (reason `DeletionByTaintManager`, "Taint manager: deleting due to NoExecute taint",
//! `addConditionAndDeletePod`), records `TaintManagerEviction`, and deletes the pod, which
//! stays terminating: no kubelet confirms.
//! A new node is NotReady (`node.kubernetes.io/not-ready:NoSchedule`) until provisioned.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::app::{Config, NodeRuntime, State};
use crate::events;
use crate::registry::{self, DeleteOptions};
use crate::resources;
use crate::util::{self, text};

/// The node group's name (cluster-autoscaler's node group).
pub const GROUP: &str = "fake-pool";

fn conditions(ready: &str, reason: &str, message: &str) -> Value {
    let now = util::now();
    let pressure = |kind: &str, reason: &str, message: &str, status: &str| json!({"type": kind, "status": status, "lastHeartbeatTime": now, "lastTransitionTime": now, "reason": reason, "message": message});
    let other = if ready == "Unknown" { "Unknown" } else { "False" };
    let lost = ready == "Unknown";
    json!([
        if lost {
            pressure("MemoryPressure", "NodeStatusUnknown", "Kubelet stopped posting node status.", other)
        } else {
            pressure("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available", other)
        },
        if lost {
            pressure("DiskPressure", "NodeStatusUnknown", "Kubelet stopped posting node status.", other)
        } else {
            pressure("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure", other)
        },
        if lost {
            pressure("PIDPressure", "NodeStatusUnknown", "Kubelet stopped posting node status.", other)
        } else {
            pressure("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available", other)
        },
        pressure("Ready", reason, message, ready),
    ])
}

/// Adds a node (NotReady until `ready_in` passed).
pub fn add(state: &mut State, config: &Config, ready_in: Duration) -> String {
    state.rt.node_seq += 1;
    let name = format!("{GROUP}-node-{}", state.rt.node_seq);
    let ready = ready_in.is_zero();
    let resources =
        json!({"cpu": config.node_cpu, "memory": config.node_memory, "pods": "110", "ephemeral-storage": "100Gi"});
    let (status, reason, message) = if ready {
        ("True", "KubeletReady", "kubelet is posting ready status")
    } else {
        (
            "False",
            "KubeletNotReady",
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized",
        )
    };
    let taints = if ready {
        json!([])
    } else {
        json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule", "timeAdded": util::now()}])
    };
    let node = json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "fake-standard",
            "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64", "fake.knotless.dev/node-group": GROUP}},
        "spec": {"providerID": format!("fake://{name}"), "podCIDR": format!("10.244.{}.0/24", state.rt.node_seq), "taints": taints},
        "status": {"capacity": resources, "allocatable": resources, "conditions": conditions(status, reason, message),
            "addresses": [{"type": "InternalIP", "address": format!("10.0.0.{}", state.rt.node_seq + 1)}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": "v1.35.0", "kubeProxyVersion": "v1.35.0", "containerRuntimeVersion": "containerd://2.1.0",
                "operatingSystem": "linux", "architecture": "amd64", "osImage": "Fake Linux", "kernelVersion": "6.1.0",
                "machineID": util::uid(), "systemUUID": util::uid(), "bootID": util::uid()}},
    });
    if let Some(nodes) = resources::by_key("nodes")
        && let Ok(node) = state.store.create(nodes, node)
        && let Some(spec) = node.get("spec").cloned()
        && spec.get("taints").and_then(Value::as_array).is_some_and(|t| t.is_empty())
    {
        state.store.modify("nodes", "", &name, |n| {
            if let Some(s) = n["spec"].as_object_mut() {
                s.remove("taints");
            }
        });
    }
    state.rt.nodes.insert(
        name.clone(),
        NodeRuntime {
            lost_at: None,
            ready_at: Instant::now() + ready_in,
            empty_since: Some(Instant::now()),
            images: Default::default(),
        },
    );
    name
}

fn set_taints(node: &mut Value, keys: &[(&str, &str)]) {
    let now = util::now();
    let taints: Vec<Value> = keys.iter().map(|(k, e)| json!({"key": k, "effect": e, "timeAdded": now})).collect();
    let existing = node.pointer("/spec/taints").and_then(Value::as_array).cloned().unwrap_or_default();
    let same = existing.len() == taints.len()
        && existing
            .iter()
            .zip(&taints)
            .all(|(a, b)| text(a, "/key") == text(b, "/key") && text(a, "/effect") == text(b, "/effect"));
    if same {
        return;
    }
    if taints.is_empty() {
        if let Some(spec) = node["spec"].as_object_mut() {
            spec.remove("taints");
        }
    } else {
        node["spec"]["taints"] = json!(taints);
    }
}

fn ready_status(node: &Value) -> String {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| text(c, "/type") == "Ready"))
        .map(|c| text(c, "/status").to_string())
        .unwrap_or_default()
}

/// Whether a node is Ready.
pub fn is_ready(node: &Value) -> bool {
    ready_status(node) == "True"
}

/// One pass of the node lifecycle controller (and the kubelets' node status).
pub fn sync(state: &mut State, config: &Config) {
    let now = Instant::now();
    for node in state.store.list("nodes", None) {
        let name = text(&node, "/metadata/name").to_string();
        let Some(rt) = state.rt.nodes.get(&name).cloned() else { continue };
        let current = ready_status(&node);
        let (want, taints): (&str, Vec<(&str, &str)>) = match rt.lost_at {
            Some(at) if now >= at + config.node_monitor_grace => (
                "Unknown",
                vec![("node.kubernetes.io/unreachable", "NoSchedule"), ("node.kubernetes.io/unreachable", "NoExecute")],
            ),
            Some(_) => (
                current.as_str(),
                node.pointer("/spec/taints").and_then(Value::as_array).map(|_| Vec::new()).unwrap_or_default(),
            ),
            None if now >= rt.ready_at => ("True", vec![]),
            None => ("False", vec![("node.kubernetes.io/not-ready", "NoSchedule")]),
        };
        if rt.lost_at.is_some() && want != "Unknown" {
            continue;
        }
        if want != current {
            let (reason, message) = match want {
                "True" => ("KubeletReady", "kubelet is posting ready status"),
                "Unknown" => ("NodeStatusUnknown", "Kubelet stopped posting node status."),
                _ => ("KubeletNotReady", "container runtime network not ready"),
            };
            let updated = state.store.modify("nodes", "", &name, |n| {
                n["status"]["conditions"] = conditions(want, reason, message);
                set_taints(n, &taints);
            });
            if let Some(updated) = updated {
                let status = if want == "True" { "NodeReady" } else { "NodeNotReady" };
                events::record(
                    &mut state.store,
                    &updated,
                    "Normal",
                    status,
                    &format!("Node {name} status is now: {status}"),
                    "node-controller",
                    "",
                    "",
                );
            }
            if want == "Unknown" {
                mark_pods_not_ready(state, &name);
            }
        } else if want != "Unknown" {
            state.store.modify("nodes", "", &name, |n| set_taints(n, &taints));
        }
    }
    evict(state);
}

fn pods_on(state: &State, node: &str) -> Vec<Value> {
    state.store.list("pods", None).into_iter().filter(|p| text(p, "/spec/nodeName") == node).collect()
}

/// `MarkPodsNotReady`.
fn mark_pods_not_ready(state: &mut State, node: &str) {
    for pod in pods_on(state, node) {
        let (ns, name) = util::ns_name(&pod);
        let updated = state.store.modify("pods", &ns, &name, |p| {
            if let Some(conditions) = p.pointer_mut("/status/conditions").and_then(Value::as_array_mut) {
                for c in conditions.iter_mut().filter(|c| text(c, "/type") == "Ready") {
                    if text(c, "/status") != "False" {
                        c["status"] = json!("False");
                        c["lastTransitionTime"] = json!(util::now());
                    }
                }
            }
        });
        if let Some(pod) = updated {
            events::record(
                &mut state.store,
                &pod,
                "Warning",
                "NodeNotReady",
                "Node is not ready",
                "node-controller",
                "",
                "",
            );
        }
    }
}

/// Taint-based eviction (`processPodOnNode`, `addConditionAndDeletePod`): a pod whose
/// toleration of the NoExecute taint ran out (from when the controller first saw it on the
/// tainted node) gets `DisruptionTarget`, then is deleted with its grace period.
fn evict(state: &mut State) {
    let now = Instant::now();
    for node in state.store.list("nodes", None) {
        let name = text(&node, "/metadata/name").to_string();
        let unreachable = node.pointer("/spec/taints").and_then(Value::as_array).is_some_and(|t| {
            t.iter().any(|t| text(t, "/key") == "node.kubernetes.io/unreachable" && text(t, "/effect") == "NoExecute")
        });
        if !unreachable {
            for pod in pods_on(state, &name) {
                state.rt.evictions.remove(text(&pod, "/metadata/uid"));
            }
            continue;
        }
        for pod in pods_on(state, &name) {
            if pod.pointer("/metadata/deletionTimestamp").is_some() {
                continue;
            }
            let uid = text(&pod, "/metadata/uid").to_string();
            let (ns, pod_name) = util::ns_name(&pod);
            let toleration = pod.pointer("/spec/tolerations").and_then(Value::as_array).and_then(|ts| {
                ts.iter()
                    .find(|t| {
                        (text(t, "/key") == "node.kubernetes.io/unreachable"
                            || (text(t, "/key").is_empty() && text(t, "/operator") == "Exists"))
                            && matches!(text(t, "/effect"), "NoExecute" | "")
                    })
                    .map(|t| t.get("tolerationSeconds").and_then(Value::as_u64))
            });
            let started = *state.rt.evictions.entry(uid.clone()).or_insert(now);
            let due = match toleration {
                None => true,
                Some(None) => false,
                Some(Some(seconds)) => now >= started + Duration::from_secs(seconds),
            };
            if !due {
                continue;
            }
            state.store.modify("pods", &ns, &pod_name, |p| {
                let condition = json!({"type": "DisruptionTarget", "status": "True",
                    "reason": "DeletionByTaintManager", "message": "Taint manager: deleting due to NoExecute taint",
                    "lastProbeTime": null, "lastTransitionTime": util::now()});
                match p.pointer_mut("/status/conditions").and_then(Value::as_array_mut) {
                    Some(conditions) => {
                        conditions.retain(|c| text(c, "/type") != "DisruptionTarget");
                        conditions.push(condition);
                    }
                    None => p["status"]["conditions"] = json!([condition]),
                }
            });
            events::record(
                &mut state.store,
                &pod,
                "Normal",
                "TaintManagerEviction",
                &format!("Marking for deletion Pod {ns}/{pod_name}"),
                "taint-eviction-controller",
                "",
                "",
            );
            if let Some(pods) = resources::by_key("pods") {
                let _ = registry::delete(state, pods, &ns, &pod_name, DeleteOptions::default());
            }
        }
    }
}

/// `POST /fake/nodes/{name}/lose` and `/restore`: the kubelet stops (the processes of every
/// container of its pods frozen: the node answers nothing) or comes back.
pub fn set_lost(state: &mut State, name: &str, lost: bool) -> bool {
    let Some(rt) = state.rt.nodes.get_mut(name) else { return false };
    if lost {
        if rt.lost_at.is_none() {
            rt.lost_at = Some(Instant::now());
        }
    } else {
        rt.lost_at = None;
        rt.ready_at = Instant::now();
    }
    for pod in pods_on(state, name) {
        let key = util::ns_name(&pod);
        for init in state.rt.pods.get(&key).into_iter().flat_map(|p| p.init_pids.values()) {
            crate::sandbox::freeze(*init, lost);
        }
    }
    true
}
