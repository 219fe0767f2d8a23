//! `cleanup`, the orphan sweep: deletes the Jobs (and their pods) labelled with this runner
//! whose session is not in `keep`, and the runner's NetworkPolicy when nothing is kept and
//! this process has no session. Logs a sweep count and a failure count.

use std::collections::BTreeSet;

use knotless_protocol::sdk::Context;
use knotless_protocol::*;
use serde_json::Value;

use crate::KubernetesExecutor;
use crate::kubectl;
use crate::names::{self, RUN_LABEL, RUNNER_LABEL, SESSION_ANNOTATION};
use crate::session::{self, CALL_LIMIT};

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

/// The Jobs of a `get jobs -o json` list.
pub fn jobs(list: &Value) -> Vec<Found> {
    let items = list.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
    items
        .iter()
        .filter_map(|job| {
            let meta = job.get("metadata")?;
            Some(Found {
                name: meta.get("name")?.as_str()?.to_string(),
                run: meta.pointer(&format!("/labels/{}", RUN_LABEL.replace('/', "~1")))?.as_str()?.to_string(),
                session: meta
                    .get("annotations")
                    .and_then(|a| a.get(SESSION_ANNOTATION))
                    .and_then(Value::as_str)
                    .map(str::to_string),
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
    let config = executor.config()?;
    let kubectl = executor.kubectl()?;
    let runner = format!("{RUNNER_LABEL}={}", names::label_value(&config.runner_id));
    let listed = kubectl.ok(&kubectl::get_jobs_args(&runner), None, CALL_LIMIT).await?;
    let list: Value = serde_json::from_slice(&listed.stdout)
        .map_err(|error| ExecutorError::infrastructure(format!("kubectl get jobs gave no JSON: {error}")))?;
    let orphans = orphans(&jobs(&list), &params.keep);
    let mut result = CleanupResult::default();
    if !orphans.is_empty() {
        let names: Vec<String> = orphans.iter().map(|job| job.name.clone()).collect();
        match kubectl.ok(&kubectl::delete_jobs_args(&names), None, CALL_LIMIT).await {
            Ok(_) => {
                for job in &orphans {
                    tracing::info!(job = %job.name, namespace = %config.namespace, session = ?job.session, "orphan job deleted");
                    result.removed.push(Resource {
                        kind: "job".into(),
                        name: job.name.clone(),
                        session: job.session.clone(),
                    });
                }
            }
            Err(error) => result.failures.push(format!("cannot delete jobs {}: {}", names.join(", "), error.message)),
        }
    }
    // Pods a Job left (deleted with an orphaning cascade, or its delete interrupted).
    let mut pods = runner.clone();
    let kept: Vec<String> = params.keep.iter().map(|session| names::label_value(session)).collect();
    if !kept.is_empty() {
        pods.push_str(&format!(",{RUN_LABEL} notin ({})", kept.join(",")));
    }
    if let Err(error) = kubectl.ok(&kubectl::delete_pods_args(&pods), None, CALL_LIMIT).await {
        result.failures.push(format!("cannot delete the runner's pods: {}", error.message));
    }
    // Sessions of this process not kept are gone now: forget them.
    executor.sessions().retain(|session, _| params.keep.contains(session));
    if params.keep.is_empty() {
        match session::retire_policy(executor, &kubectl).await {
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
        let list = json!({"items": [
            {"metadata": {"name": "j1", "labels": {"dev.knotless.run": "a"}, "annotations": {"dev.knotless.session": "a"}}},
            {"metadata": {"name": "j2", "labels": {"dev.knotless.run": "b"}}},
        ]});
        let found = jobs(&list);
        assert_eq!(found.len(), 2);
        let orphans = orphans(&found, &["a".to_string()]);
        assert_eq!(orphans, vec![Found { name: "j2".into(), run: "b".into(), session: None }]);
    }
}
