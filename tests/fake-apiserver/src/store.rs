//! The object store and its watch fan-out, modelled on etcd behind the API server's storage
//! layer: one global revision (`metadata.resourceVersion`, etcd's revision), `uid` and
//! `creationTimestamp` set on create (staging/src/k8s.io/apiserver/pkg/registry/rest/create.go
//! `FillObjectMetaSystemFields`), a history of the last 1000 changes for watches from a
//! resourceVersion (older: 410 `Expired`, as the watch cache answers,
//! staging/src/k8s.io/apiserver/pkg/storage/cacher/watch_cache.go), and the finalizer rule of
//! staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go: an object being deleted
//! goes once its finalizers are empty (a pod once its kubelet confirmed with grace 0).
//! Watchers get bounded queues; one that falls behind is cut off (as the cacher's
//! `terminateAllWatchers`/blocked-watcher timeout does) rather than buffered.

use std::collections::{BTreeMap, VecDeque};

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use crate::isolation::Isolation;
use crate::resources::Resource;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::util;

/// How many changes watches can resume from.
pub const HISTORY: usize = 1000;
/// How many events a watcher may have queued before it is cut off.
pub const WATCH_QUEUE: usize = 1024;

pub type Key = (&'static str, String, String);

/// What a watcher asked for.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    pub resource: &'static str,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl WatchSpec {
    pub fn matches(&self, object: &Value) -> bool {
        self.namespace.as_deref().is_none_or(|ns| util::text(object, "/metadata/namespace") == ns)
            && self.labels.matches(object.pointer("/metadata/labels"))
            && self.fields.matches(self.resource, object)
    }
}

/// A watch event: type and object.
pub type WatchEvent = (&'static str, Value);

struct Change {
    rv: u64,
    resource: &'static str,
    old: Option<Value>,
    new: Option<Value>,
    /// The object as last stored (the deleted state for deletions).
    object: Value,
}

struct Watcher {
    spec: WatchSpec,
    tx: mpsc::Sender<WatchEvent>,
}

/// The event a watcher sees for a change, under upstream's selector rules: an object that stops
/// matching is DELETED for the watcher, one that starts matching is ADDED.
fn event_for(spec: &WatchSpec, change: &Change) -> Option<WatchEvent> {
    if spec.resource != change.resource {
        return None;
    }
    let was = change.old.as_ref().is_some_and(|o| spec.matches(o));
    let is = change.new.as_ref().is_some_and(|o| spec.matches(o));
    let kind = match (was, is) {
        (false, true) => "ADDED",
        (true, true) => "MODIFIED",
        (true, false) => "DELETED",
        (false, false) => return None,
    };
    Some((kind, change.object.clone()))
}

pub struct Store {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    history: VecDeque<Change>,
    /// Changes up to this revision were compacted away: a watch from before it is 410.
    compacted: u64,
    watchers: Vec<Watcher>,
    changed: watch::Sender<u64>,
    /// The isolation checker, run after every write of a pod or a NetworkPolicy.
    pub isolation: Isolation,
}

impl Store {
    pub fn new(changed: watch::Sender<u64>) -> Self {
        Self {
            objects: BTreeMap::new(),
            rv: 100,
            history: VecDeque::new(),
            compacted: 0,
            watchers: Vec::new(),
            changed,
            isolation: Isolation::default(),
        }
    }

    pub fn revision(&self) -> u64 {
        self.rv
    }

    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.objects.iter().find(|((r, ns, n), _)| *r == resource && ns == namespace && n == name).map(|(_, v)| v)
    }

    fn key_of(resource: &'static str, object: &Value) -> Key {
        let (ns, name) = util::ns_name(object);
        (resource, ns, name)
    }

    /// Every object of a resource (in a namespace, if given), in name order.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((r, ns, _), _)| *r == resource && namespace.is_none_or(|n| n == ns))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Every object of every resource.
    pub fn all(&self) -> Vec<Value> {
        self.objects.values().cloned().collect()
    }

    fn record(&mut self, resource: &'static str, old: Option<Value>, new: Option<Value>, object: Value) {
        let change = Change { rv: self.rv, resource, old, new, object };
        self.watchers.retain(|w| match event_for(&w.spec, &change) {
            Some(event) => w.tx.try_send(event).is_ok(),
            None => !w.tx.is_closed(),
        });
        if matches!(resource, "pods" | "networkpolicies") {
            let verb = match (&change.old, &change.new) {
                (None, _) => "create",
                (_, None) => "delete",
                _ => "update",
            };
            let (_, name) = util::ns_name(&change.object);
            self.check_isolation(None, &format!("{verb} of {resource}/{name}"));
        }
        self.history.push_back(change);
        while self.history.len() > HISTORY {
            self.history.pop_front();
        }
        self.changed.send_replace(self.rv);
    }

    /// Runs the isolation checker over the stored pods and policies, with the pod of uid
    /// `starting` counted as running.
    pub fn check_isolation(&mut self, starting: Option<&str>, during: &str) {
        let of = |resource: &'static str| {
            self.objects
                .range((resource, String::new(), String::new())..)
                .take_while(move |((r, ..), _)| *r == resource)
        };
        let policies: Vec<&Value> = of("networkpolicies").map(|(_, policy)| policy).collect();
        self.isolation.check(of("pods").map(|(_, pod)| pod), &policies, starting, self.rv, during);
    }

    /// Stores a new object, filling the system fields.
    pub fn create(&mut self, resource: &Resource, mut object: Value) -> Result<Value, ApiError> {
        let key = Self::key_of(resource.key(), &object);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(resource.plural, resource.group, &key.2));
        }
        self.rv += 1;
        object["apiVersion"] = json!(resource.api_version());
        object["kind"] = json!(resource.kind);
        let meta = &mut object["metadata"];
        if meta.get("uid").and_then(Value::as_str).is_none_or(str::is_empty) {
            meta["uid"] = json!(util::uid());
        }
        meta["resourceVersion"] = json!(self.rv.to_string());
        meta["creationTimestamp"] = json!(util::now());
        if resource.kind == "Job" {
            meta["generation"] = json!(1);
        }
        if let Some(m) = meta.as_object_mut() {
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.retain(|_, v| !v.is_null());
        }
        self.objects.insert(key, object.clone());
        self.record(resource.key(), None, Some(object.clone()), object.clone());
        Ok(object)
    }

    /// Replaces an object (bumping its resourceVersion); removes it when it is being deleted
    /// and has nothing left to wait for. The stored object, or `None` if it went.
    pub fn update(&mut self, resource: &'static str, mut object: Value) -> Option<Value> {
        let key = Self::key_of(resource, &object);
        let old = self.objects.get(&key)?.clone();
        if old == object {
            return Some(old);
        }
        if resource == "jobs" && old.get("spec") != object.get("spec") {
            let generation = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(1);
            object["metadata"]["generation"] = json!(generation + 1);
        }
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let deleting = object.pointer("/metadata/deletionTimestamp").is_some();
        let no_finalizers =
            object.pointer("/metadata/finalizers").and_then(Value::as_array).is_none_or(|f| f.is_empty());
        let grace = object.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0);
        if let Some(finalizers) = object.pointer("/metadata/finalizers").and_then(Value::as_array)
            && finalizers.is_empty()
            && let Some(meta) = object["metadata"].as_object_mut()
        {
            meta.remove("finalizers");
        }
        if deleting && no_finalizers && grace == 0 {
            self.objects.remove(&key);
            self.record(resource, Some(old), None, object);
            return None;
        }
        self.objects.insert(key, object.clone());
        self.record(resource, Some(old), Some(object.clone()), object.clone());
        Some(object)
    }

    /// Applies `change` to a stored object and stores it if it changed.
    pub fn modify(
        &mut self,
        resource: &'static str,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        let mut object = self.get(resource, namespace, name)?.clone();
        change(&mut object);
        self.update(resource, object)
    }

    /// Removes an object at once (a DELETED event).
    pub fn remove(&mut self, resource: &'static str, namespace: &str, name: &str) -> Option<Value> {
        let key = (resource, namespace.to_string(), name.to_string());
        let mut object = self.objects.remove(&key)?;
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.record(resource, Some(object.clone()), None, object.clone());
        Some(object)
    }

    /// Ends every open watch, as an API server ends them when it restarts or sheds load
    /// (staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go `terminateAllWatchers`): each
    /// stream sends what was queued, then closes; its client resumes from the last version.
    pub fn end_watches(&mut self) {
        self.watchers.clear();
    }

    /// Forgets the history up to now, as etcd's compaction does: a watch resumed from an older
    /// resourceVersion gets 410 Gone ("too old resource version") and must list again.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// Starts a watch: the events to send first, and the queue of later ones.
    pub fn watch(
        &mut self,
        spec: WatchSpec,
        from: Option<u64>,
    ) -> Result<(Vec<WatchEvent>, mpsc::Receiver<WatchEvent>), ApiError> {
        let mut first = Vec::new();
        match from {
            None | Some(0) => {
                for object in self.list(spec.resource, spec.namespace.as_deref()) {
                    if spec.matches(&object) {
                        first.push(("ADDED", object));
                    }
                }
            }
            Some(rv) if rv < self.rv => {
                let oldest = self.history.front().map(|c| c.rv).unwrap_or(self.rv);
                if rv + 1 < oldest || rv < self.compacted {
                    return Err(ApiError::expired(rv, oldest));
                }
                for change in self.history.iter().filter(|c| c.rv > rv) {
                    if let Some(event) = event_for(&spec, change) {
                        first.push(event);
                    }
                }
            }
            Some(_) => {}
        }
        let (tx, rx) = mpsc::channel(WATCH_QUEUE);
        self.watchers.push(Watcher { spec, tx });
        Ok((first, rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, app: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": app}}})
    }

    #[tokio::test]
    async fn watch_semantics() {
        let (tx, _rx) = watch::channel(0);
        let mut store = Store::new(tx);
        let pods = crate::resources::by_key("pods").copied();
        let Some(pods) = pods else { panic!("no pods") };
        let created = store.create(&pods, pod("a", "x"));
        assert!(created.is_ok());
        assert!(store.create(&pods, pod("a", "x")).is_err_and(|e| e.code == 409));
        let spec = WatchSpec {
            resource: "pods",
            namespace: Some("default".into()),
            labels: LabelSelector::parse("app=x").unwrap_or_default(),
            fields: FieldSelector::default(),
        };
        let (first, mut rx) = store.watch(spec.clone(), Some(0)).unwrap_or_else(|_| panic!("watch"));
        assert_eq!(first.len(), 1);
        store.modify("pods", "default", "a", |p| p["metadata"]["labels"]["app"] = json!("y"));
        assert_eq!(rx.recv().await.map(|e| e.0), Some("DELETED"));
        let (replay, _rx2) = store.watch(spec.clone(), Some(101)).unwrap_or_else(|_| panic!("watch"));
        assert_eq!(replay.iter().map(|e| e.0).collect::<Vec<_>>(), vec!["DELETED"]);
        for i in 0..HISTORY + 5 {
            store.modify("pods", "default", "a", |p| p["metadata"]["annotations"] = json!({"n": i.to_string()}));
        }
        assert!(store.watch(spec, Some(101)).is_err_and(|e| e.code == 410));
    }
}
