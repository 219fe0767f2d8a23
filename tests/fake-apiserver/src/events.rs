//! The event recorder of staging/src/k8s.io/client-go/tools/record (event.go, events_cache.go):
//! `v1.Event`s named `<object>.<hex nanoseconds>`, with `source.component` (`job-controller`,
//! `default-scheduler`, `kubelet`, `cluster-autoscaler`, `node-controller`), and a repeated
//! event (same source, object, type, reason and message) counted on the existing object
//! (`count` incremented, `lastTimestamp` moved) as `EventCorrelator`'s aggregation does.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::resources;
use crate::store::Store;
use crate::util::{self, text};

/// Records an event about `object`. `field_path` is the container reference
/// (`spec.containers{run}`) for kubelet events.
#[allow(clippy::too_many_arguments)]
pub fn record(
    store: &mut Store,
    object: &Value,
    kind: &str,
    reason: &str,
    message: &str,
    component: &str,
    host: &str,
    field_path: &str,
) {
    let name = text(object, "/metadata/name").to_string();
    let namespace = match text(object, "/metadata/namespace") {
        "" => "default".to_string(),
        ns => ns.to_string(),
    };
    let uid = text(object, "/metadata/uid").to_string();
    let now = util::now();
    let existing = store.list("events", Some(&namespace)).into_iter().find(|e| {
        text(e, "/involvedObject/uid") == uid
            && text(e, "/involvedObject/fieldPath") == field_path
            && text(e, "/reason") == reason
            && text(e, "/message") == message
            && text(e, "/type") == kind
            && text(e, "/source/component") == component
    });
    if let Some(event) = existing {
        let (ns, event_name) = util::ns_name(&event);
        store.modify("events", &ns, &event_name, |e| {
            let count = e.get("count").and_then(Value::as_i64).unwrap_or(1);
            e["count"] = json!(count + 1);
            e["lastTimestamp"] = json!(now);
        });
        return;
    }
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let mut involved = json!({"kind": text(object, "/kind"), "namespace": text(object, "/metadata/namespace"),
        "name": name, "uid": uid, "apiVersion": text(object, "/apiVersion"),
        "resourceVersion": text(object, "/metadata/resourceVersion")});
    if !field_path.is_empty() {
        involved["fieldPath"] = json!(field_path);
    }
    if text(object, "/metadata/namespace").is_empty()
        && let Some(m) = involved.as_object_mut()
    {
        m.remove("namespace");
    }
    let mut source = json!({"component": component});
    if !host.is_empty() {
        source["host"] = json!(host);
    }
    let event = json!({
        "metadata": {"name": format!("{name}.{nanos:x}"), "namespace": namespace},
        "involvedObject": involved, "reason": reason, "message": message, "source": source,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1, "type": kind, "eventTime": null,
        "reportingComponent": component, "reportingInstance": host,
    });
    if let Some(events) = resources::by_key("events") {
        let _ = store.create(events, event);
    }
}
