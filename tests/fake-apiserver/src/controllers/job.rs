//! The Job controller (pkg/controller/job/job_controller.go) and the TTL-after-finished
//! controller (pkg/controller/ttlafterfinished/ttlafterfinished_controller.go).
//!
//! One pod per Job (`parallelism`/`completions` 1) named `<job>-<5 random>` from the template,
//! with the controller labels, a controller ownerReference and the
//! `batch.kubernetes.io/job-tracking` finalizer, created through admission: a refusal is a
//! Warning `FailedCreate` `Error creating: <error>` and a retry on the back-off. Pods are
//! counted as they finish (the finalizer removed): a failed pod, or one being deleted that did
//! not succeed (`isPodFailed` with podReplacementPolicy TerminatingOrFailed), past
//! `backoffLimit` fails the Job (`BackoffLimitExceeded`); `activeDeadlineSeconds` fails it
//! (`DeadlineExceeded`) and deletes its pods; success is `SuccessCriteriaMet` then `Complete`
//! (the terminal condition once no pod terminates, as since 1.31). The TTL controller deletes a
//! finished Job `ttlSecondsAfterFinished` after its finish, with Foreground propagation.

use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::app::{Config, State};
use crate::events;
use crate::registry::{self, DeleteOptions, Propagation};
use crate::resources;
use crate::util::{self, text};

const TRACKING: &str = "batch.kubernetes.io/job-tracking";
const MAX_BACKOFF: Duration = Duration::from_secs(360);

fn owned_by(pod: &Value, uid: &str) -> bool {
    pod.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| refs.iter().any(|r| text(r, "/uid") == uid && r.get("controller") == Some(&json!(true))))
}

fn has_finalizer(object: &Value, finalizer: &str) -> bool {
    object.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| f.iter().any(|x| x == finalizer))
}

fn remove_finalizer(object: &mut Value, finalizer: &str) {
    if let Some(list) = object.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
        list.retain(|f| f != finalizer);
    }
}

fn condition(job: &Value, kind: &str) -> bool {
    job.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| c.iter().any(|c| text(c, "/type") == kind && text(c, "/status") == "True"))
}

fn add_condition(job: &mut Value, kind: &str, reason: &str, message: &str) {
    let now = util::now();
    let conditions = &mut job["status"]["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    if let Some(list) = conditions.as_array_mut()
        && !list.iter().any(|c| text(c, "/type") == kind)
    {
        list.push(json!({"type": kind, "status": "True", "lastProbeTime": now, "lastTransitionTime": now,
                         "reason": reason, "message": message}));
    }
}

fn seconds_since(timestamp: &str) -> Option<u64> {
    // Our own timestamps: compare by formatting candidates is costly; parse instead.
    let t = parse_time(timestamp)?;
    SystemTime::now().duration_since(t).ok().map(|d| d.as_secs())
}

/// Parses a time as `metav1.Time` marshals it (`YYYY-MM-DDTHH:MM:SSZ`).
pub fn parse_time(text: &str) -> Option<SystemTime> {
    let at: jiff::Timestamp = text.parse().ok()?;
    Some(SystemTime::from(at))
}

fn job_event(state: &mut State, job: &Value, kind: &str, reason: &str, message: &str) {
    events::record(&mut state.store, job, kind, reason, message, "job-controller", "", "");
}

/// One pass over every Job.
pub fn sync(state: &mut State, config: &Config) {
    let jobs = state.store.list("jobs", None);
    let pods = state.store.list("pods", None);
    // Orphaned tracking finalizers: the Job is gone.
    for pod in &pods {
        if !has_finalizer(pod, TRACKING) {
            continue;
        }
        let owner = pod
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .and_then(|refs| refs.iter().find(|r| r.get("controller") == Some(&json!(true))))
            .map(|r| text(r, "/uid").to_string());
        let exists = owner.as_ref().is_some_and(|uid| jobs.iter().any(|j| text(j, "/metadata/uid") == uid));
        if !exists {
            let (ns, name) = util::ns_name(pod);
            state.store.modify("pods", &ns, &name, |p| remove_finalizer(p, TRACKING));
        }
    }
    for job in jobs {
        sync_job(state, config, job, &pods);
    }
}

fn sync_job(state: &mut State, config: &Config, job: Value, all_pods: &[Value]) {
    let namespace = text(&job, "/metadata/namespace").to_string();
    let uid = text(&job, "/metadata/uid").to_string();
    let pods: Vec<&Value> =
        all_pods.iter().filter(|p| text(p, "/metadata/namespace") == namespace && owned_by(p, &uid)).collect();
    let finished = condition(&job, "Complete") || condition(&job, "Failed");
    let mut updated = job.clone();
    if !updated.get("status").is_some_and(Value::is_object) {
        updated["status"] = json!({});
    }
    let mut succeeded = job.pointer("/status/succeeded").and_then(Value::as_i64).unwrap_or(0);
    let mut failed = job.pointer("/status/failed").and_then(Value::as_i64).unwrap_or(0);
    // Count finished pods and release their finalizer.
    for pod in &pods {
        let phase = text(pod, "/status/phase");
        let deleting = pod.pointer("/metadata/deletionTimestamp").is_some();
        let done_ok = phase == "Succeeded";
        let done_bad = phase == "Failed" || (deleting && phase != "Succeeded");
        if has_finalizer(pod, TRACKING) && (done_ok || done_bad) {
            if done_ok {
                succeeded += 1;
            } else {
                failed += 1;
            }
            let (ns, pod_name) = util::ns_name(pod);
            state.store.modify("pods", &ns, &pod_name, |p| remove_finalizer(p, TRACKING));
        }
    }
    let active: Vec<&&Value> = pods
        .iter()
        .filter(|p| {
            p.pointer("/metadata/deletionTimestamp").is_none()
                && !matches!(text(p, "/status/phase"), "Succeeded" | "Failed")
        })
        .collect();
    let terminating = pods
        .iter()
        .filter(|p| {
            p.pointer("/metadata/deletionTimestamp").is_some()
                && !matches!(text(p, "/status/phase"), "Succeeded" | "Failed")
        })
        .count();
    let ready = active
        .iter()
        .filter(|p| {
            p.pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|c| c.iter().any(|c| text(c, "/type") == "Ready" && text(c, "/status") == "True"))
        })
        .count();
    let status = &mut updated["status"];
    if succeeded > 0 {
        status["succeeded"] = json!(succeeded);
    }
    if failed > 0 {
        status["failed"] = json!(failed);
    }
    if active.is_empty() {
        if let Some(s) = status.as_object_mut() {
            s.remove("active");
        }
    } else {
        status["active"] = json!(active.len());
    }
    status["ready"] = json!(ready);
    status["terminating"] = json!(terminating);
    status["uncountedTerminatedPods"] = json!({});
    let deleting_job = job.pointer("/metadata/deletionTimestamp").is_some();
    if !finished && !deleting_job {
        if status.get("startTime").is_none() && !job.pointer("/spec/suspend").and_then(Value::as_bool).unwrap_or(false)
        {
            status["startTime"] = json!(util::now());
        }
        let backoff_limit = job.pointer("/spec/backoffLimit").and_then(Value::as_i64).unwrap_or(6);
        let completions = job.pointer("/spec/completions").and_then(Value::as_i64).unwrap_or(1);
        let deadline = job.pointer("/spec/activeDeadlineSeconds").and_then(Value::as_u64);
        let started = text(&updated, "/status/startTime").to_string();
        let sticky = updated
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| c.iter().find(|c| text(c, "/type") == "FailureTarget"))
            .map(|c| (text(c, "/reason").to_string(), text(c, "/message").to_string()));
        let failure = if let Some((reason, message)) = &sticky {
            Some((reason.as_str(), message.as_str()))
        } else if failed > backoff_limit {
            Some(("BackoffLimitExceeded", "Job has reached the specified backoff limit"))
        } else if deadline.is_some_and(|d| seconds_since(&started).is_some_and(|s| s >= d)) {
            Some(("DeadlineExceeded", "Job was active longer than specified deadline"))
        } else {
            None
        };
        if let Some((reason, message)) = failure {
            if !condition(&updated, "FailureTarget") {
                add_condition(&mut updated, "FailureTarget", reason, message);
                job_event(state, &job, "Warning", reason, message);
            }
            for pod in &active {
                let pod_name = text(pod, "/metadata/name").to_string();
                if let Some(pods) = resources::by_key("pods")
                    && registry::delete(state, pods, &namespace, &pod_name, DeleteOptions::default()).is_ok()
                {
                    job_event(state, &job, "Normal", "SuccessfulDelete", &format!("Deleted pod: {pod_name}"));
                }
            }
            if terminating == 0 && active.is_empty() {
                add_condition(&mut updated, "Failed", reason, message);
            }
        } else if succeeded >= completions {
            add_condition(
                &mut updated,
                "SuccessCriteriaMet",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            );
            if terminating == 0 && active.is_empty() {
                add_condition(
                    &mut updated,
                    "Complete",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                );
                updated["status"]["completionTime"] = json!(util::now());
                job_event(state, &job, "Normal", "Completed", "Job completed");
            }
        } else if active.is_empty() && terminating == 0 && succeeded + (active.len() as i64) < completions {
            create_pod(state, config, &job, failed);
        }
    }
    if condition(&updated, "FailureTarget") && !condition(&updated, "Failed") && terminating == 0 && active.is_empty() {
        let reason = updated
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| c.iter().find(|c| text(c, "/type") == "FailureTarget"))
            .map(|c| (text(c, "/reason").to_string(), text(c, "/message").to_string()));
        if let Some((reason, message)) = reason {
            add_condition(&mut updated, "Failed", &reason, &message);
        }
    }
    if condition(&updated, "SuccessCriteriaMet")
        && !condition(&updated, "Complete")
        && terminating == 0
        && active.is_empty()
    {
        add_condition(&mut updated, "Complete", "CompletionsReached", "Reached expected number of succeeded pods");
        updated["status"]["completionTime"] = json!(util::now());
        job_event(state, &job, "Normal", "Completed", "Job completed");
    }
    if updated != job {
        state.store.update("jobs", updated.clone());
    }
    ttl(state, &updated);
}

fn create_pod(state: &mut State, config: &Config, job: &Value, failed: i64) {
    let uid = text(job, "/metadata/uid").to_string();
    let (namespace, name) = util::ns_name(job);
    if let Some((_, next)) = state.rt.job_backoff.get(&uid)
        && Instant::now() < *next
    {
        return;
    }
    // Pod failures delay replacements too (DefaultJobPodFailureBackOff, doubling).
    let template = job.pointer("/spec/template").cloned().unwrap_or_default();
    let mut metadata = template.get("metadata").cloned().unwrap_or_else(|| json!({}));
    metadata["generateName"] = json!(format!("{name}-"));
    metadata["namespace"] = json!(namespace);
    metadata["finalizers"] = json!([TRACKING]);
    metadata["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                                          "controller": true, "blockOwnerDeletion": true}]);
    let pod = json!({"metadata": metadata, "spec": template.get("spec").cloned().unwrap_or_default()});
    match registry::create_pod(state, config, pod) {
        Ok(pod) => {
            let pod_name = text(&pod, "/metadata/name").to_string();
            state.rt.job_backoff.remove(&uid);
            job_event(state, job, "Normal", "SuccessfulCreate", &format!("Created pod: {pod_name}"));
        }
        Err(error) => {
            job_event(state, job, "Warning", "FailedCreate", &format!("Error creating: {}", error.message()));
            let tries = state.rt.job_backoff.get(&uid).map(|(n, _)| n + 1).unwrap_or(1);
            let delay = config.job_backoff.saturating_mul(1 << (tries - 1).min(16)).min(MAX_BACKOFF);
            state.rt.job_backoff.insert(uid, (tries, Instant::now() + delay));
        }
    }
    let _ = failed;
}

/// The TTL-after-finished controller.
fn ttl(state: &mut State, job: &Value) {
    let Some(ttl) = job.pointer("/spec/ttlSecondsAfterFinished").and_then(Value::as_u64) else { return };
    if job.pointer("/metadata/deletionTimestamp").is_some() {
        return;
    }
    let finished_at = job
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| {
            c.iter().find(|c| matches!(text(c, "/type"), "Complete" | "Failed") && text(c, "/status") == "True")
        })
        .map(|c| text(c, "/lastTransitionTime").to_string());
    let Some(finished_at) = finished_at else { return };
    let due = parse_time(&finished_at).is_some_and(|t| SystemTime::now() >= t + Duration::from_secs(ttl));
    if due && let Some(jobs) = resources::by_key("jobs") {
        let (ns, name) = util::ns_name(job);
        let _ = registry::delete(
            state,
            jobs,
            &ns,
            &name,
            DeleteOptions { grace: None, propagation: Some(Propagation::Foreground) },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_roundtrip() {
        let now = util::now();
        assert_eq!(parse_time(&now).map(util::rfc3339), Some(now));
    }
}
