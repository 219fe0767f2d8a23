//! The cluster-autoscaler (kubernetes/autoscaler cluster-autoscaler/core/scaleup/orchestrator
//! and core/scaledown) with one node group `fake-pool` (min 0, max `--autoscale-max`) whose
//! template is the node shape: an unschedulable pod that no Ready node can take (the scheduler
//! will, at its next retry: core/podlistprocessor/filter_out_schedulable.go), seen for `--scale-up-delay` that a new
//! node would fit (and no upcoming node will take) triggers a scale-up (Normal
//! `TriggeredScaleUp` `pod triggered scale-up: [{fake-pool 1->2 (max: N)}]`); one that no new
//! node fits gets Normal `NotTriggerScaleUp` `pod didn't trigger scale-up: 1 Insufficient cpu`,
//! and at the maximum (checked first, as upstream skips a full group before trying its
//! template) `pod didn't trigger scale-up: 1 max node group size reached`
//! (cluster-autoscaler/processors/status/eventing_scale_up_processor.go), again at every scan
//! while the pod waits, so a group smaller than the pods waiting for it is modelled whole. A node without
//! running pods for `--scale-down-after` (scale-down-unneeded-time) is removed, down to 0,
//! except in a loop that added a node or saw a pending pod some node will take.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::{Value, json};

use crate::app::{Config, State};
use crate::controllers::nodes::{self, GROUP};
use crate::controllers::scheduler;
use crate::events;
use crate::util::text;

fn unschedulable(pod: &Value) -> bool {
    text(pod, "/spec/nodeName").is_empty()
        && pod.pointer("/metadata/deletionTimestamp").is_none()
        && pod.pointer("/status/conditions").and_then(Value::as_array).is_some_and(|c| {
            c.iter().any(|c| text(c, "/type") == "PodScheduled" && text(c, "/reason") == "Unschedulable")
        })
}

/// The template node of the group.
fn template(config: &Config) -> Value {
    json!({"metadata": {"labels": {"kubernetes.io/hostname": format!("template-node-for-{GROUP}"), "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "fake-standard", "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64", "fake.knotless.dev/node-group": GROUP}},
           "status": {"allocatable": {"cpu": config.node_cpu, "memory": config.node_memory, "pods": "110"}}})
}

fn event(state: &mut State, pod: &Value, reason: &str, message: &str) {
    events::record(&mut state.store, pod, "Normal", reason, message, "cluster-autoscaler", "", "");
}

/// A node, real or simulated, and the pods it holds or will take.
type Room = (Value, Vec<Value>);

/// Puts `pod` on the first room that takes it, as the scheduler's filters say.
fn place(pod: &Value, rooms: &mut [Room], check_taints: bool) -> bool {
    for (node, on_node) in rooms.iter_mut() {
        let labels = node.pointer("/metadata/labels").cloned().unwrap_or_default();
        let refs: Vec<&Value> = on_node.iter().collect();
        if scheduler::filter(pod, node, &labels, &refs, check_taints).0.is_empty() {
            on_node.push(pod.clone());
            return true;
        }
    }
    false
}

pub fn sync(state: &mut State, config: &Config) {
    if config.autoscale_max == 0 {
        return;
    }
    let now = Instant::now();
    let pods = state.store.list("pods", None);
    let nodes = state.store.list("nodes", None);
    let template = template(config);
    let labels = template.pointer("/metadata/labels").cloned().unwrap_or_default();
    // Pods the scheduler will place on a Ready node once it retries them are left to it
    // (core/podlistprocessor/filter_out_schedulable.go): a node that has just become Ready
    // takes the pod it was added for, however late the scheduler's retry comes.
    let mut ready: Vec<Room> = nodes
        .iter()
        .filter(|n| nodes::is_ready(n))
        .map(|node| {
            let on_node = pods
                .iter()
                .filter(|p| text(p, "/spec/nodeName") == text(node, "/metadata/name"))
                .filter(|p| !matches!(text(p, "/status/phase"), "Succeeded" | "Failed"))
                .cloned()
                .collect();
            (node.clone(), on_node)
        })
        .collect();
    // Pods the upcoming (not yet Ready) nodes will take, simulated on the group's template.
    let mut upcoming: Vec<Room> =
        nodes.iter().filter(|n| !nodes::is_ready(n)).map(|_| (template.clone(), Vec::new())).collect();
    let pending: Vec<Value> = pods.iter().filter(|p| unschedulable(p)).cloned().collect();
    state.rt.pending.retain(|uid, _| pending.iter().any(|p| text(p, "/metadata/uid") == uid));
    let mut new_nodes: Vec<Room> = Vec::new();
    let mut triggered: Vec<Value> = Vec::new();
    // No node is removed in a loop that saw a pending pod a node (Ready or upcoming) will take,
    // or one too new to act on: upstream's filter_out_schedulable.go ("Schedulable pods
    // present") and the "pods are very new" cooldown call DisableScaleDownForLoop. Without it
    // a node that became Ready is removed as empty before the scheduler's retry places the pod
    // it was added for, and the pod waits for a new node again.
    let mut scale_down_disabled = false;
    for pod in &pending {
        let uid = text(pod, "/metadata/uid").to_string();
        let (seen, _) = *state.rt.pending.entry(uid.clone()).or_insert((now, false));
        if now < seen + config.scale_up_delay || place(pod, &mut ready, true) || place(pod, &mut upcoming, false) {
            scale_down_disabled = true;
            continue;
        }
        // A group at its maximum is skipped before its template is tried
        // (core/scaleup/orchestrator/orchestrator.go `filterValidScaleUpNodeGroups`:
        // `currentTargetSize >= nodeGroup.MaxSize()` gives `MaxLimitReachedReason`), so a full
        // group says so whether or not a new node would fit the pod.
        if nodes.len() + new_nodes.len() >= config.autoscale_max && !place(pod, &mut new_nodes, false) {
            event(state, pod, "NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size reached");
            state.rt.pending.insert(uid, (now, true));
            continue;
        }
        let (reasons, _) = scheduler::filter(pod, &template, &labels, &[], false);
        if !reasons.is_empty() {
            let message = format!(
                "pod didn't trigger scale-up: {}",
                reasons.iter().map(|r| format!("1 {r}")).collect::<Vec<_>>().join(", ")
            );
            event(state, pod, "NotTriggerScaleUp", &message);
            state.rt.pending.insert(uid, (now, true));
            continue;
        }
        if !place(pod, &mut new_nodes, false) {
            new_nodes.push((template.clone(), vec![pod.clone()]));
        }
        triggered.push(pod.clone());
        state.rt.pending.insert(uid, (now, true));
    }
    if !new_nodes.is_empty() {
        let from = nodes.len();
        let to = from + new_nodes.len();
        let message = format!("pod triggered scale-up: [{{{GROUP} {from}->{to} (max: {})}}]", config.autoscale_max);
        for pod in &triggered {
            event(state, pod, "TriggeredScaleUp", &message);
        }
        for _ in &new_nodes {
            nodes::add(state, config, config.node_provision);
        }
    }
    // Nor in the loop of a scale-up (upstream's cooldown after an add, static_autoscaler.go,
    // with --scale-down-delay-after-add at 0).
    if !scale_down_disabled && new_nodes.is_empty() {
        scale_down(state, config, &pods);
    }
}

fn scale_down(state: &mut State, config: &Config, pods: &[Value]) {
    let now = Instant::now();
    let mut busy: BTreeMap<String, bool> = BTreeMap::new();
    for pod in pods {
        let node = text(pod, "/spec/nodeName");
        if !node.is_empty() && !matches!(text(pod, "/status/phase"), "Succeeded" | "Failed") {
            busy.insert(node.to_string(), true);
        }
    }
    let names: Vec<String> = state.rt.nodes.keys().cloned().collect();
    for name in names {
        let Some(rt) = state.rt.nodes.get_mut(&name) else { continue };
        if busy.contains_key(&name) || rt.lost_at.is_some() {
            rt.empty_since = None;
            continue;
        }
        let since = *rt.empty_since.get_or_insert(now);
        if now >= since + config.scale_down_after {
            if let Some(node) = state.store.get("nodes", "", &name).cloned() {
                events::record(
                    &mut state.store,
                    &node,
                    "Normal",
                    "ScaleDown",
                    "marking the node as toBeDeleted/unschedulable",
                    "cluster-autoscaler",
                    "",
                    "",
                );
            }
            state.store.remove("nodes", "", &name);
            state.rt.nodes.remove(&name);
        }
    }
}
