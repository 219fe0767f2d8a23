//! The garbage collector (pkg/controller/garbagecollector/garbagecollector.go): dependents of
//! an owner deleted with Background go once their owner is gone; an owner with the
//! `foregroundDeletion` finalizer has its dependents deleted and goes when none with
//! `blockOwnerDeletion` is left; one with the `orphan` finalizer has its dependents'
//! ownerReferences removed. Plus the pod garbage collector (pkg/controller/podgc: pods bound to
//! a node that no longer exists are force-deleted) and the namespace controller
//! (pkg/controller/namespace/deletion: a terminating namespace's content is deleted, then it goes).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::app::State;
use crate::registry::{self, DeleteOptions, Propagation};
use crate::resources::{self, RESOURCES};
use crate::util::{self, text};

fn refs(object: &Value) -> Vec<Value> {
    object.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default()
}

fn delete(state: &mut State, plural: &str, namespace: &str, name: &str, options: DeleteOptions) {
    if let Some(resource) = resources::by_key(plural) {
        let _ = registry::delete(state, resource, namespace, name, options);
    }
}

pub fn sync(state: &mut State) {
    let mut everything: Vec<(&'static str, Value)> = Vec::new();
    for r in RESOURCES {
        for object in state.store.list(r.key(), None) {
            everything.push((r.key(), object));
        }
    }
    let uids: BTreeSet<String> = everything.iter().map(|(_, o)| text(o, "/metadata/uid").to_string()).collect();
    // Owners being deleted.
    for (key, owner) in &everything {
        if owner.pointer("/metadata/deletionTimestamp").is_none() {
            continue;
        }
        let finalizers: Vec<String> = owner
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .map(|f| f.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default();
        let uid = text(owner, "/metadata/uid").to_string();
        let dependents: Vec<&(&'static str, Value)> =
            everything.iter().filter(|(_, d)| refs(d).iter().any(|r| text(r, "/uid") == uid)).collect();
        let (ns, name) = util::ns_name(owner);
        if finalizers.iter().any(|f| f == "orphan") {
            for (dkey, dependent) in &dependents {
                let (dns, dname) = util::ns_name(dependent);
                state.store.modify(dkey, &dns, &dname, |d| {
                    if let Some(list) = d.pointer_mut("/metadata/ownerReferences").and_then(Value::as_array_mut) {
                        list.retain(|r| text(r, "/uid") != uid);
                    }
                    if d.pointer("/metadata/ownerReferences").and_then(Value::as_array).is_some_and(|l| l.is_empty())
                        && let Some(meta) = d["metadata"].as_object_mut()
                    {
                        meta.remove("ownerReferences");
                    }
                });
            }
            state.store.modify(key, &ns, &name, |o| {
                if let Some(list) = o.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
                    list.retain(|f| f != "orphan");
                }
            });
        } else if finalizers.iter().any(|f| f == "foregroundDeletion") {
            let mut blocking = false;
            for (dkey, dependent) in &dependents {
                let blocks = refs(dependent).iter().any(|r| {
                    text(r, "/uid") == uid && r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true)
                });
                blocking |= blocks;
                if dependent.pointer("/metadata/deletionTimestamp").is_none() {
                    let (dns, dname) = util::ns_name(dependent);
                    delete(
                        state,
                        dkey,
                        &dns,
                        &dname,
                        DeleteOptions { grace: None, propagation: Some(Propagation::Background) },
                    );
                }
            }
            if !blocking {
                state.store.modify(key, &ns, &name, |o| {
                    if let Some(list) = o.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
                        list.retain(|f| f != "foregroundDeletion");
                    }
                });
            }
        }
    }
    // Dependents whose owners are all gone.
    for (key, dependent) in &everything {
        let owners = refs(dependent);
        if owners.is_empty() || dependent.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        if owners.iter().all(|r| !uids.contains(text(r, "/uid"))) {
            let (ns, name) = util::ns_name(dependent);
            delete(state, key, &ns, &name, DeleteOptions { grace: None, propagation: Some(Propagation::Background) });
        }
    }
    // PodGC: pods on nodes that no longer exist.
    let nodes: BTreeSet<String> =
        state.store.list("nodes", None).iter().map(|n| text(n, "/metadata/name").to_string()).collect();
    for (key, pod) in &everything {
        let node = text(pod, "/spec/nodeName");
        if *key == "pods"
            && !node.is_empty()
            && !nodes.contains(node)
            && pod.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64) != Some(0)
        {
            let (ns, name) = util::ns_name(pod);
            delete(state, "pods", &ns, &name, DeleteOptions { grace: Some(0), propagation: None });
        }
    }
    // Namespace deletion.
    for (_, namespace) in
        everything.iter().filter(|(k, o)| *k == "namespaces" && o.pointer("/metadata/deletionTimestamp").is_some())
    {
        let ns = text(namespace, "/metadata/name").to_string();
        let content: Vec<&(&'static str, Value)> =
            everything.iter().filter(|(_, o)| text(o, "/metadata/namespace") == ns).collect();
        for (key, object) in &content {
            if object.pointer("/metadata/deletionTimestamp").is_none() {
                let name = text(object, "/metadata/name").to_string();
                delete(
                    state,
                    key,
                    &ns,
                    &name,
                    DeleteOptions { grace: None, propagation: Some(Propagation::Background) },
                );
            }
        }
        if content.is_empty() {
            state.store.modify("namespaces", "", &ns, |o| {
                if let Some(list) = o.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
                    list.retain(|f| f != "kubernetes");
                }
            });
        }
    }
}
