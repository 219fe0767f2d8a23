//! `cleanup`, the orphan sweep: deletes the Jobs (foreground, their pods first; not those
//! already being deleted) and any pods labelled with this runner whose session is not in `keep`, and the runner's NetworkPolicy
//! when nothing is kept and this process has no session. Logs a sweep count and a failure count.

use std::collections::BTreeSet;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use knotless_protocol::sdk::Context;
use knotless_protocol::*;
use kube::api::{Api, DeleteParams, ListParams, PropagationPolicy};
use kube::core::Status;

use crate::KubernetesExecutor;
use crate::names::{self, RUN_LABEL, RUNNER_LABEL, SESSION_ANNOTATION};
use crate::session;

/// A Job of this runner: its name, run label and raw session id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The Job's name.
    pub name: String,
    /// Its run label.
    pub run: String,
    /// The raw session id, from its annotation.
    pub session: Option<String>,
}

/// The Jobs of a list, with their run label (those without one are not the runner's). A Job
/// whose deletion has begun is left out: the garbage collector ends it once its pods are
/// gone (a foreground delete keeps it until then), and deleting it again removes nothing.
pub fn jobs(list: &[Job]) -> Vec<Found> {
    list.iter()
        .filter_map(|job| {
            let meta = &job.metadata;
            if meta.deletion_timestamp.is_some() {
                return None;
            }
            Some(Found {
                name: meta.name.clone()?,
                run: meta.labels.as_ref()?.get(RUN_LABEL)?.clone(),
                session: meta.annotations.as_ref().and_then(|a| a.get(SESSION_ANNOTATION)).cloned(),
            })
        })
        .collect()
}

/// The Jobs to delete: those whose run label is not the label of a kept session.
pub fn orphans(found: &[Found], keep: &[String]) -> Vec<Found> {
    let kept: BTreeSet<String> = keep.iter().map(|session| names::label_value(session)).collect();
    found.iter().filter(|job| !kept.contains(&job.run)).cloned().collect()
}

/// `cleanup`.
pub async fn cleanup(
    executor: &KubernetesExecutor,
    params: CleanupParams,
    _context: Context,
) -> Result<CleanupResult, ExecutorError> {
    let config = executor.config.get()?;
    let client = executor.cluster.get()?.client().await?;
    let runner = format!("{RUNNER_LABEL}={}", names::label_value(&config.runner_id));
    let api: Api<Job> = client.api(&config.namespace);
    let listed = client.limited("list the runner's Jobs", api.list(&ListParams::default().labels(&runner))).await?;
    let orphans = orphans(&jobs(&listed.items), &params.keep);
    let mut result = CleanupResult::default();
    let foreground =
        DeleteParams { propagation_policy: Some(PropagationPolicy::Foreground), ..DeleteParams::default() };
    for job in &orphans {
        let what = format!("delete the Job {}", job.name);
        match client.unless(&what, api.delete(&job.name, &foreground), Status::is_not_found).await {
            Ok(_) => {
                tracing::info!(job = %job.name, namespace = %config.namespace, session = ?job.session, "orphan job deleted");
                result.removed.push(Resource {
                    kind: "job".into(),
                    name: job.name.clone(),
                    session: job.session.clone(),
                });
            }
            Err(error) => result.failures.push(error.message),
        }
    }
    // Pods a Job left (deleted with an orphaning cascade, or its delete interrupted).
    let mut pods = runner.clone();
    let kept: Vec<String> = params.keep.iter().map(|session| names::label_value(session)).collect();
    if !kept.is_empty() {
        pods.push_str(&format!(",{RUN_LABEL} notin ({})", kept.join(",")));
    }
    let api: Api<Pod> = client.api(&config.namespace);
    let list = ListParams::default().labels(&pods);
    if let Err(error) =
        client.limited("delete the runner's pods", api.delete_collection(&DeleteParams::default(), &list)).await
    {
        result.failures.push(error.message);
    }
    // Sessions of this process not kept are gone now: forget them.
    executor.sessions.lock().retain(|session, _| params.keep.contains(session));
    if params.keep.is_empty() {
        match session::retire_policy(executor, &client).await {
            Ok(true) => result.removed.push(Resource {
                kind: "networkpolicy".into(),
                name: names::policy_name(&config.runner_id),
                session: None,
            }),
            Ok(false) => {}
            Err(error) => result.failures.push(format!("cannot delete the NetworkPolicy: {}", error.message)),
        }
    }
    tracing::info!(namespace = %config.namespace, swept = result.removed.len(), failures = result.failures.len(), "orphan cleanup");
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_jobs_of_sessions_not_kept_are_orphans() {
        let list: Vec<Job> = serde_json::from_value(json!([
            {"metadata": {"name": "j1", "labels": {"dev.knotless.run": "a"}, "annotations": {"dev.knotless.session": "a"}}},
            {"metadata": {"name": "j2", "labels": {"dev.knotless.run": "b"}}},
            {"metadata": {"name": "j3"}},
            {"metadata": {"name": "j4", "labels": {"dev.knotless.run": "d"}, "deletionTimestamp": "2026-12-04T00:00:00Z",
                "finalizers": ["foregroundDeletion"]}},
        ]))
        .expect("jobs");
        let found = jobs(&list);
        assert_eq!(found.len(), 2);
        let orphans = orphans(&found, &["a".to_string()]);
        assert_eq!(orphans, vec![Found { name: "j2".into(), run: "b".into(), session: None }]);
    }
}
