//! The scheduler (pkg/scheduler): a pending pod is filtered against every node in the default
//! plugin order (TaintToleration, NodeAffinity for `nodeSelector`, NodeResourcesFit on the
//! sum of requests against allocatable, InterPodAffinity for required `podAntiAffinity` with
//! `topologyKey: kubernetes.io/hostname`), bound to the fitting node with the most free CPU
//! (event `Scheduled` `Successfully assigned NS/POD to NODE`), or marked
//! `PodScheduled=False`/`Unschedulable` with `FitError`'s message
//! (pkg/scheduler/framework/types.go: `0/N nodes are available: <histogram>.` and the
//! preemption post-filter's `preemption: 0/N nodes are available: ...`; `no nodes available to
//! schedule pods` without nodes) and a Warning `FailedScheduling`. Unschedulable pods are
//! retried every second and on every change.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::app::State;
use crate::events;
use crate::quantity;
use crate::selectors::LabelSelector;
use crate::util::{self, text};

/// Requests of a pod: (cpu cores, memory bytes).
pub fn requests(pod: &Value) -> (f64, f64) {
    let mut total = (0.0, 0.0);
    for c in pod.pointer("/spec/containers").and_then(Value::as_array).into_iter().flatten() {
        let get = |r: &str| {
            c.pointer(&format!("/resources/requests/{r}"))
                .or_else(|| c.pointer(&format!("/resources/limits/{r}")))
                .map(|q| q.as_str().map(str::to_string).unwrap_or_else(|| q.to_string()))
                .and_then(|q| quantity::parse(&q))
                .unwrap_or(0.0)
        };
        total.0 += get("cpu");
        total.1 += get("memory");
    }
    total
}

/// Allocatable of a node: (cpu, memory).
pub fn allocatable(node: &Value) -> (f64, f64) {
    let get = |r: &str| quantity::parse(text(node, &format!("/status/allocatable/{r}"))).unwrap_or(0.0);
    (get("cpu"), get("memory"))
}

fn terminal(pod: &Value) -> bool {
    matches!(text(pod, "/status/phase"), "Succeeded" | "Failed")
}

/// Why `pod` does not fit `node` given the pods already on it; `(reasons, resolvable by preemption)`.
pub fn filter(
    pod: &Value,
    node: &Value,
    labels: &Value,
    on_node: &[&Value],
    check_taints: bool,
) -> (Vec<String>, bool) {
    // TaintToleration.
    if check_taints {
        for taint in node.pointer("/spec/taints").and_then(Value::as_array).into_iter().flatten() {
            let effect = text(taint, "/effect");
            if effect != "NoSchedule" && effect != "NoExecute" {
                continue;
            }
            let tolerated = pod.pointer("/spec/tolerations").and_then(Value::as_array).is_some_and(|ts| {
                ts.iter().any(|t| {
                    let key_ok = text(t, "/key") == text(taint, "/key")
                        || (text(t, "/key").is_empty() && text(t, "/operator") == "Exists");
                    let effect_ok = text(t, "/effect").is_empty() || text(t, "/effect") == effect;
                    let value_ok = text(t, "/operator") == "Exists" || text(t, "/value") == text(taint, "/value");
                    key_ok && effect_ok && value_ok
                })
            });
            if !tolerated {
                return (
                    vec![format!(
                        "node(s) had untolerated taint {{{}: {}}}",
                        text(taint, "/key"),
                        text(taint, "/value")
                    )],
                    false,
                );
            }
        }
    }
    // NodeAffinity (nodeSelector).
    if let Some(selector) = pod.pointer("/spec/nodeSelector").and_then(Value::as_object)
        && !selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return (vec!["node(s) didn't match Pod's node affinity/selector".into()], false);
    }
    // NodeResourcesFit.
    let (cpu, memory) = requests(pod);
    let (mut used_cpu, mut used_memory) = (0.0, 0.0);
    for other in on_node {
        let (c, m) = requests(other);
        used_cpu += c;
        used_memory += m;
    }
    let (alloc_cpu, alloc_memory) = allocatable(node);
    let mut insufficient = Vec::new();
    if cpu > 0.0 && used_cpu + cpu > alloc_cpu + 1e-9 {
        insufficient.push("Insufficient cpu".to_string());
    }
    if memory > 0.0 && used_memory + memory > alloc_memory + 0.5 {
        insufficient.push("Insufficient memory".to_string());
    }
    if !insufficient.is_empty() {
        return (insufficient, true);
    }
    // InterPodAffinity: the pod's required anti-affinity on hostname.
    let namespace = text(pod, "/metadata/namespace");
    for term in pod
        .pointer("/spec/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if text(term, "/topologyKey") != "kubernetes.io/hostname" {
            continue;
        }
        let selector = LabelSelector::from_object(term.get("labelSelector").unwrap_or(&Value::Null));
        let namespaces: Vec<String> = term
            .get("namespaces")
            .and_then(Value::as_array)
            .map(|n| n.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .filter(|n: &Vec<String>| !n.is_empty())
            .unwrap_or_else(|| vec![namespace.to_string()]);
        if term.get("labelSelector").is_some()
            && on_node.iter().any(|o| {
                namespaces.iter().any(|n| n == text(o, "/metadata/namespace"))
                    && selector.matches(o.pointer("/metadata/labels"))
            })
        {
            return (vec!["node(s) didn't match pod anti-affinity rules".into()], true);
        }
    }
    (Vec::new(), true)
}

fn histogram(reasons: &BTreeMap<String, usize>) -> String {
    let mut parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    parts.join(", ")
}

fn set_scheduled(pod: &mut Value, status: &str, reason: Option<&str>, message: Option<&str>) {
    let now = util::now();
    let conditions = &mut pod["status"]["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let mut condition =
        json!({"type": "PodScheduled", "status": status, "lastProbeTime": null, "lastTransitionTime": now});
    if let Some(r) = reason {
        condition["reason"] = json!(r);
    }
    if let Some(m) = message {
        condition["message"] = json!(m);
    }
    if let Some(list) = conditions.as_array_mut() {
        match list.iter_mut().find(|c| text(c, "/type") == "PodScheduled") {
            Some(existing) => {
                if text(existing, "/status") == status {
                    condition["lastTransitionTime"] = existing["lastTransitionTime"].clone();
                }
                *existing = condition;
            }
            None => list.insert(0, condition),
        }
    }
}

/// Per pod uid: (last message, when its event was recorded, last attempt).
pub type Attempts = BTreeMap<String, (String, Instant, Instant)>;

pub fn sync(state: &mut State, attempts: &mut Attempts) {
    let nodes = state.store.list("nodes", None);
    let mut pods = state.store.list("pods", None);
    pods.sort_by(|a, b| text(a, "/metadata/creationTimestamp").cmp(text(b, "/metadata/creationTimestamp")));
    let mut bound: Vec<Value> =
        pods.iter().filter(|p| !text(p, "/spec/nodeName").is_empty() && !terminal(p)).cloned().collect();
    for pod in pods
        .iter()
        .filter(|p| text(p, "/spec/nodeName").is_empty() && p.pointer("/metadata/deletionTimestamp").is_none())
    {
        if text(pod, "/spec/schedulerName") != "default-scheduler" {
            continue;
        }
        let uid = text(pod, "/metadata/uid").to_string();
        if let Some((_, _, tried)) = attempts.get(&uid)
            && tried.elapsed() < Duration::from_secs(1)
        {
            continue;
        }
        let (ns, name) = util::ns_name(pod);
        let mut best: Option<(f64, String)> = None;
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        let mut preemption: BTreeMap<String, usize> = BTreeMap::new();
        for node in &nodes {
            let node_name = text(node, "/metadata/name").to_string();
            let on_node: Vec<&Value> = bound.iter().filter(|p| text(p, "/spec/nodeName") == node_name).collect();
            let (failures, resolvable) =
                filter(pod, node, node.pointer("/metadata/labels").unwrap_or(&Value::Null), &on_node, true);
            if failures.is_empty() {
                let used: f64 = on_node.iter().map(|p| requests(p).0).sum();
                let free = allocatable(node).0 - used;
                if best.as_ref().is_none_or(|(f, _)| free > *f) {
                    best = Some((free, node_name));
                }
            } else {
                for f in failures {
                    *reasons.entry(f).or_default() += 1;
                }
                let p = if resolvable {
                    "No preemption victims found for incoming pod"
                } else {
                    "Preemption is not helpful for scheduling"
                };
                *preemption.entry(p.to_string()).or_default() += 1;
            }
        }
        if let Some((_, node_name)) = best {
            let updated = state.store.modify("pods", &ns, &name, |p| {
                p["spec"]["nodeName"] = json!(node_name);
                set_scheduled(p, "True", None, None);
            });
            if let Some(updated) = updated {
                events::record(
                    &mut state.store,
                    &updated,
                    "Normal",
                    "Scheduled",
                    &format!("Successfully assigned {ns}/{name} to {node_name}"),
                    "default-scheduler",
                    "",
                    "",
                );
                bound.push(updated);
            }
            attempts.remove(&uid);
            continue;
        }
        let message = if nodes.is_empty() {
            "no nodes available to schedule pods".to_string()
        } else {
            format!(
                "0/{n} nodes are available: {}. preemption: 0/{n} nodes are available: {}.",
                histogram(&reasons),
                histogram(&preemption),
                n = nodes.len()
            )
        };
        let repeat =
            attempts.get(&uid).is_none_or(|(m, at, _)| *m != message || at.elapsed() >= Duration::from_secs(10));
        let changed = pod
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| c.iter().find(|c| text(c, "/type") == "PodScheduled"))
            .is_none_or(|c| text(c, "/message") != message);
        if changed {
            state
                .store
                .modify("pods", &ns, &name, |p| set_scheduled(p, "False", Some("Unschedulable"), Some(&message)));
        }
        if repeat || changed {
            if let Some(fresh) = state.store.get("pods", &ns, &name).cloned() {
                events::record(
                    &mut state.store,
                    &fresh,
                    "Warning",
                    "FailedScheduling",
                    &message,
                    "default-scheduler",
                    "",
                    "",
                );
            }
            attempts.insert(uid, (message, Instant::now(), Instant::now()));
        } else if let Some(entry) = attempts.get_mut(&uid) {
            entry.2 = Instant::now();
        }
    }
}
