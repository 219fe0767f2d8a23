//! The isolation checker: a test's witness that no pod ever runs a moment without a
//! default-deny ingress NetworkPolicy, as a network plugin would enforce policies
//! (`networkpolicy.rs`). It is no upstream component: it watches the fake's own store.
//!
//! After every write to the store that touches a pod or a NetworkPolicy, and when the kubelet
//! is about to start a container (`controllers/kubelet.rs`, before its process exists), every
//! running pod is checked: a pod that has a container running (phase `Running`, or being
//! deleted while its containers still run), or whose container the kubelet started, until it is
//! terminal or gone.
//! A running pod that does not deny all ingress is a violation: recorded once per episode
//! (its pod, when it began, what was missing, which write showed it, and when it ended), at
//! most [`KEPT`] of them, the later ones counted. `GET /fake/violations` returns them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::networkpolicy;
use crate::util::{self, text};

/// How many violations are kept; later ones are only counted.
pub const KEPT: usize = 256;

/// One episode of a running pod without a default-deny ingress policy.
#[derive(Debug, Clone)]
struct Violation {
    sequence: u64,
    namespace: String,
    pod: String,
    uid: String,
    /// When it began (RFC 3339, and milliseconds since the epoch).
    at: String,
    at_ms: u64,
    /// The store's revision when it was seen.
    revision: u64,
    /// What was missing.
    missing: String,
    /// What the checker saw happen: the write, or the container starting.
    during: String,
    /// When the pod was protected again or stopped running.
    ended_ms: Option<u64>,
}

/// The checker's record.
#[derive(Debug, Default)]
pub struct Isolation {
    /// Pods (by uid) in a violation that has not ended: its sequence number.
    open: BTreeMap<String, u64>,
    violations: VecDeque<Violation>,
    next: u64,
    dropped: u64,
    checks: u64,
    /// Running pods seen protected, for the record.
    protected_seen: u64,
    /// Pods (by uid) whose container the kubelet started: running from then on, until the
    /// pod is terminal or gone, though its status may not say so yet.
    started: BTreeSet<String>,
}

fn millis() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Whether a pod is terminal: all its containers ended.
fn terminal(pod: &Value) -> bool {
    matches!(text(pod, "/status/phase"), "Succeeded" | "Failed")
}

/// Whether a pod has a container running (the kubelet's status says so) and is not terminal.
pub fn running(pod: &Value) -> bool {
    !terminal(pod)
        && pod
            .pointer("/status/containerStatuses")
            .and_then(Value::as_array)
            .is_some_and(|statuses| statuses.iter().any(|status| status.pointer("/state/running").is_some()))
}

impl Isolation {
    /// Checks every running pod among `pods` (and `starting`, the uid of a pod whose container
    /// is about to start) against `policies`; `during` says what happened.
    pub fn check<'a>(
        &mut self,
        pods: impl Iterator<Item = &'a Value>,
        policies: &[&Value],
        starting: Option<&str>,
        revision: u64,
        during: &str,
    ) {
        self.checks += 1;
        if let Some(uid) = starting {
            self.started.insert(uid.to_string());
        }
        let mut still_open = BTreeMap::new();
        let mut still_started = BTreeSet::new();
        for pod in pods {
            let uid = text(pod, "/metadata/uid");
            if self.started.contains(uid) && !terminal(pod) {
                still_started.insert(uid.to_string());
            }
            if !(running(pod) || still_started.contains(uid)) {
                continue;
            }
            match networkpolicy::denies_all_ingress(pod, policies.iter().copied()) {
                Ok(()) => self.protected_seen += 1,
                Err(missing) => {
                    let sequence = match self.open.get(uid) {
                        Some(sequence) => *sequence,
                        None => self.record(pod, missing, revision, during),
                    };
                    still_open.insert(uid.to_string(), sequence);
                }
            }
        }
        self.started = still_started;
        let now = millis();
        for (uid, sequence) in std::mem::replace(&mut self.open, still_open.clone()) {
            if !still_open.contains_key(&uid)
                && let Some(ended) = self.violations.iter_mut().find(|v| v.sequence == sequence)
            {
                ended.ended_ms = Some(now);
            }
        }
    }

    fn record(&mut self, pod: &Value, missing: String, revision: u64, during: &str) -> u64 {
        let sequence = self.next;
        self.next += 1;
        let violation = Violation {
            sequence,
            namespace: text(pod, "/metadata/namespace").to_string(),
            pod: text(pod, "/metadata/name").to_string(),
            uid: text(pod, "/metadata/uid").to_string(),
            at: util::now(),
            at_ms: millis(),
            revision,
            missing,
            during: during.to_string(),
            ended_ms: None,
        };
        tracing::warn!(pod = %violation.pod, missing = %violation.missing, "a running pod is not isolated");
        if self.violations.len() >= KEPT {
            self.dropped += 1;
        } else {
            self.violations.push_back(violation);
        }
        sequence
    }

    /// The record as `GET /fake/violations` answers it.
    pub fn report(&self) -> Value {
        let violations: Vec<Value> = self
            .violations
            .iter()
            .map(|v| {
                json!({"namespace": v.namespace, "pod": v.pod, "uid": v.uid, "at": v.at, "at_ms": v.at_ms,
                       "revision": v.revision, "missing": v.missing, "during": v.during,
                       "ended_ms": v.ended_ms})
            })
            .collect();
        json!({"violations": violations, "dropped": self.dropped, "checks": self.checks,
               "protected_seen": self.protected_seen})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, phase: &str, running: bool) -> Value {
        let state = if running { json!({"running": {}}) } else { json!({"terminated": {"exitCode": 0}}) };
        json!({"metadata": {"name": format!("pod-{uid}"), "namespace": "runs", "uid": uid, "labels": {"run": uid}},
               "status": {"phase": phase, "containerStatuses": [{"name": "run", "state": state}]}})
    }

    fn deny(run: &str) -> Value {
        json!({"metadata": {"name": format!("deny-{run}"), "namespace": "runs"},
               "spec": {"podSelector": {"matchLabels": {"run": run}}, "policyTypes": ["Ingress"]}})
    }

    #[test]
    fn an_episode_is_recorded_once_and_ends_when_the_pod_is_protected_again() {
        let mut isolation = Isolation::default();
        let (a, b) = (pod("a", "Running", true), pod("b", "Running", true));
        let policy = deny("a");
        isolation.check([&a, &b].into_iter(), &[&policy], None, 1, "write of pods/b");
        isolation.check([&a, &b].into_iter(), &[&policy], None, 2, "write of pods/b");
        let report = isolation.report();
        assert_eq!(report["violations"].as_array().map(Vec::len), Some(1), "{report:#}");
        assert_eq!(report["violations"][0]["pod"], "pod-b");
        assert!(report["violations"][0]["ended_ms"].is_null());
        let other = deny("b");
        isolation.check([&a, &b].into_iter(), &[&policy, &other], None, 3, "write of networkpolicies/deny-b");
        assert!(isolation.report()["violations"][0]["ended_ms"].is_u64());
    }

    #[test]
    fn pods_not_running_are_not_checked_but_a_starting_one_is() {
        let mut isolation = Isolation::default();
        let (pending, done) = (pod("p", "Pending", false), pod("d", "Succeeded", false));
        isolation.check([&pending, &done].into_iter(), &[], None, 1, "write");
        assert_eq!(isolation.report()["violations"], json!([]));
        isolation.check([&pending].into_iter(), &[], Some("p"), 2, "container run of pod-p starting");
        let report = isolation.report();
        assert_eq!(report["violations"][0]["during"], "container run of pod-p starting", "{report:#}");
        // Running from its start on, though its status does not say so yet; until it ends.
        isolation.check([&pending].into_iter(), &[], None, 3, "write of pods/other");
        let report = isolation.report();
        assert_eq!(report["violations"].as_array().map(Vec::len), Some(1), "{report:#}");
        assert!(report["violations"][0]["ended_ms"].is_null(), "{report:#}");
        let ended = pod("p", "Failed", false);
        isolation.check([&ended].into_iter(), &[], None, 4, "write of pods/pod-p");
        assert!(isolation.report()["violations"][0]["ended_ms"].is_u64());
    }
}
