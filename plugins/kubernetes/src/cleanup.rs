//! `cleanup`, the orphan sweep: takes the Jobs, pods and NetworkPolicies of this runner that
//! are provably dead, and only those.
//!
//! An object of this runner is swept when its session is not in `keep` (nor starting in this
//! process, nor kept ([`knotless_protocol::kept`]) unless the sweep has `remove_kept`) and its owner annotation (`dev.knotless.owner`, the token of the executor process
//! that made it, [`knotless_protocol::owner`]) says its maker is gone: the token's lock is
//! free or missing ([`Liveness::Dead`]), or it is this very process's token (a session this
//! process started and no longer holds), or there is no token at all (an older executor made
//! it). A token whose owner lives is left alone, and so is one this process cannot check
//! ([`Liveness::Unknown`]: another machine, another container's `/tmp`): the Job's own
//! `activeDeadlineSeconds` and `ttlSecondsAfterFinished` end it; the sweep logs what it left
//! and why. So two runners of one runner id (two `knotless-run run`s of one user) never take
//! each other's live runs.
//!
//! Jobs go in the foreground (their pods first; those already being deleted are left to the
//! garbage collector); pods a Job left (orphaned) are deleted; a policy that never got its pod
//! as owner (its executor was killed in between) is given the run's pods as owners when there
//! are any, so the garbage collector deletes it after them, and is deleted when there are none.
//! Logs a sweep count and a failure count.

use std::collections::BTreeSet;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use knotless_protocol::kept;
use knotless_protocol::owner::{self, Liveness};
use knotless_protocol::sdk::Context;
use knotless_protocol::*;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PropagationPolicy};
use kube::core::Status;

use crate::KubernetesExecutor;
use crate::api::Client;
use crate::manifest::{self, PodOwner};
use crate::names::{self, OWNER_ANNOTATION, RUN_LABEL, RUNNER_LABEL, SESSION_ANNOTATION};

/// An object of this runner, as the sweep judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its name.
    pub name: String,
    /// Its run label.
    pub run: String,
    /// The raw session id, from its annotation.
    pub session: Option<String>,
    /// The token of the process that made it, from its annotation.
    pub owner: Option<String>,
}

impl Found {
    /// The object's, if it carries a run label and is not being deleted (the garbage
    /// collector ends such an object once its dependents are gone; deleting it again removes
    /// nothing).
    pub fn of(meta: &ObjectMeta) -> Option<Found> {
        if meta.deletion_timestamp.is_some() {
            return None;
        }
        let annotation = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key)).cloned();
        Some(Found {
            name: meta.name.clone()?,
            run: meta.labels.as_ref()?.get(RUN_LABEL)?.clone(),
            session: annotation(SESSION_ANNOTATION),
            owner: annotation(OWNER_ANNOTATION),
        })
    }
}

/// What the sweep does with an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Provably dead: swept, for this reason.
    Sweep(&'static str),
    /// Left alone, for this reason.
    Leave(&'static str),
}

/// The rule (see the module's documentation): `held` are the run labels of the sessions in
/// `keep` or starting, `own` this process's token, `liveness` asks a token's owner.
pub fn verdict(found: &Found, held: &BTreeSet<String>, own: &str, liveness: impl Fn(&str) -> Liveness) -> Verdict {
    if held.contains(&found.run) {
        return Verdict::Leave("its session is in flight, or kept");
    }
    let Some(token) = found.owner.as_deref() else {
        return Verdict::Sweep("it carries no owner (an older executor made it)");
    };
    if token == own {
        return Verdict::Sweep("this process made it for a session it no longer holds");
    }
    match liveness(token) {
        Liveness::Dead => Verdict::Sweep("the process that made it is gone"),
        Liveness::Alive => Verdict::Leave("the process that made it lives"),
        Liveness::Unknown => Verdict::Leave(
            "its owner cannot be checked from here (another machine or container): its Job's \
             activeDeadlineSeconds and ttlSecondsAfterFinished end it",
        ),
    }
}

/// The objects of `metas` the sweep takes, the others logged with why they are left.
fn dead<'a>(
    kind: &str,
    metas: impl IntoIterator<Item = &'a ObjectMeta>,
    held: &BTreeSet<String>,
    own: &str,
) -> Vec<Found> {
    let mut taken = Vec::new();
    for found in metas.into_iter().filter_map(Found::of) {
        match verdict(&found, held, own, owner::liveness) {
            Verdict::Sweep(why) => {
                tracing::debug!(kind, name = %found.name, session = ?found.session, why, "swept");
                taken.push(found);
            }
            Verdict::Leave(why) => {
                tracing::info!(kind, name = %found.name, session = ?found.session, owner = ?found.owner, why, "left by the orphan sweep");
            }
        }
    }
    taken
}

/// `cleanup`.
pub async fn cleanup(
    executor: &KubernetesExecutor,
    params: CleanupParams,
    _context: Context,
) -> Result<CleanupResult, ExecutorError> {
    let config = executor.config.get()?;
    let own = executor.owner.get()?;
    let client = executor.cluster.get()?.client().await?;
    let mut held: BTreeSet<String> = params.keep.iter().map(|session| names::label_value(session)).collect();
    let marked = kept::sessions(&config.runner_id);
    if !params.remove_kept {
        held.extend(marked.iter().map(|session| names::label_value(session)));
    }
    held.extend(knotless_protocol::sdk::lock(&executor.starting).iter().map(|session| names::label_value(session)));
    let runner = ListParams::default().labels(&format!("{RUNNER_LABEL}={}", names::label_value(&config.runner_id)));
    let namespace = config.namespace.as_str();
    let mut result = CleanupResult::default();
    let mut removed = |kind: &str, found: &Found| {
        tracing::info!(kind, name = %found.name, namespace, session = ?found.session, "orphan deleted");
        result.removed.push(Resource { kind: kind.into(), name: found.name.clone(), session: found.session.clone() });
    };

    let jobs: Api<Job> = client.api(namespace);
    let listed = client.limited("list the runner's Jobs", jobs.list(&runner)).await?;
    let foreground =
        DeleteParams { propagation_policy: Some(PropagationPolicy::Foreground), ..DeleteParams::default() };
    let mut failures = Vec::new();
    for job in dead("job", listed.items.iter().map(|job| &job.metadata), &held, own.token()) {
        let what = format!("delete the Job {}", job.name);
        match client.unless(&what, jobs.delete(&job.name, &foreground), Status::is_not_found).await {
            Ok(_) => {
                if let Some(session) =
                    job.session.as_deref().filter(|session| marked.iter().any(|kept| kept == session))
                {
                    kept::unmark(&config.runner_id, session);
                }
                removed("job", &job)
            }
            Err(error) => failures.push(error.message),
        }
    }
    // Listed after the Jobs' deletes: a Job being deleted makes no new pod.
    let pods: Api<Pod> = client.api(namespace);
    let pods_listed = client.limited("list the runner's pods", pods.list(&runner)).await?.items;
    // Pods no Job of the list controls (a Job deleted with an orphaning cascade, or whose
    // delete was cut short): the garbage collector takes the others with their Job.
    let jobs_known: BTreeSet<&str> = listed.items.iter().filter_map(|job| job.metadata.uid.as_deref()).collect();
    let orphaned = pods_listed.iter().filter(|pod| {
        let owners = pod.metadata.owner_references.iter().flatten();
        !owners.filter(|reference| reference.kind == "Job").any(|reference| jobs_known.contains(reference.uid.as_str()))
    });
    for pod in dead("pod", orphaned.map(|pod| &pod.metadata), &held, own.token()) {
        let what = format!("delete the pod {}", pod.name);
        match client.unless(&what, pods.delete(&pod.name, &DeleteParams::default()), Status::is_not_found).await {
            Ok(_) => removed("pod", &pod),
            Err(error) => failures.push(error.message),
        }
    }
    let policies: Api<NetworkPolicy> = client.api(namespace);
    let policies_listed = client.limited("list the runner's NetworkPolicies", policies.list(&runner)).await?.items;
    // A policy a pod owns is the garbage collector's.
    let unowned =
        policies_listed.iter().filter(|policy| policy.metadata.owner_references.iter().flatten().next().is_none());
    for policy in dead("networkpolicy", unowned.map(|policy| &policy.metadata), &held, own.token()) {
        match retire(&client, &policies, &policy, &pods_listed).await {
            Ok(true) => removed("networkpolicy", &policy),
            Ok(false) => {}
            Err(error) => failures.push(error.message),
        }
    }
    result.failures = failures;
    // Sessions of this process not kept are gone now: forget them.
    executor.sessions.lock().retain(|session, _| params.keep.contains(session));
    tracing::info!(namespace, swept = result.removed.len(), failures = result.failures.len(), "orphan cleanup");
    Ok(result)
}

/// A dead run's policy that no pod owns: given the run's pods (those the list saw) as owners,
/// so that it outlives them; deleted when there are none. Whether it was deleted.
async fn retire(
    client: &Client,
    policies: &Api<NetworkPolicy>,
    policy: &Found,
    pods: &[Pod],
) -> Result<bool, ExecutorError> {
    let owners: Vec<PodOwner> = pods
        .iter()
        .filter(|pod| pod.metadata.labels.as_ref().and_then(|labels| labels.get(RUN_LABEL)) == Some(&policy.run))
        .filter_map(|pod| Some(PodOwner { name: pod.metadata.name.clone()?, uid: pod.metadata.uid.clone()? }))
        .collect();
    if owners.is_empty() {
        let what = format!("delete the NetworkPolicy {}", policy.name);
        client.unless(&what, policies.delete(&policy.name, &DeleteParams::default()), Status::is_not_found).await?;
        return Ok(true);
    }
    let what = format!("give the NetworkPolicy {} its pods as owners", policy.name);
    let patch = manifest::owned_by(&owners);
    client.limited(&what, policies.patch(&policy.name, &PatchParams::default(), &Patch::Merge(&patch))).await?;
    tracing::info!(policy = %policy.name, pods = owners.len(), "network policy left to go with its pods");
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const OWN: &str = "aa:/run/user/0/knotless-owners/00.lock";

    fn found(run: &str, owner: Option<&str>) -> Found {
        Found {
            name: format!("knotless-{run}"),
            run: run.into(),
            session: Some(run.into()),
            owner: owner.map(str::to_string),
        }
    }

    /// The verdict on an object of run `run` made by `owner`, whose liveness is `liveness`,
    /// with `kept` in flight.
    fn check(run: &str, owner: Option<&str>, liveness: Liveness, expected: Verdict) {
        let held = BTreeSet::from(["kept".to_string()]);
        assert_eq!(verdict(&found(run, owner), &held, OWN, |_| liveness), expected, "{run} {owner:?} {liveness:?}");
    }

    #[test]
    fn only_what_is_provably_dead_is_swept() {
        let other = Some("bb:/tmp/knotless-owners-0/11.lock");
        check("kept", Some(OWN), Liveness::Dead, Verdict::Leave("its session is in flight, or kept"));
        check("kept", None, Liveness::Dead, Verdict::Leave("its session is in flight, or kept"));
        check("old", None, Liveness::Unknown, Verdict::Sweep("it carries no owner (an older executor made it)"));
        check(
            "mine",
            Some(OWN),
            Liveness::Alive,
            Verdict::Sweep("this process made it for a session it no longer holds"),
        );
        check("dead", other, Liveness::Dead, Verdict::Sweep("the process that made it is gone"));
        check("live", other, Liveness::Alive, Verdict::Leave("the process that made it lives"));
        let Verdict::Leave(why) = verdict(&found("far", other), &BTreeSet::new(), OWN, |_| Liveness::Unknown) else {
            panic!("an owner that cannot be checked is never swept");
        };
        assert!(why.contains("activeDeadlineSeconds and ttlSecondsAfterFinished"), "{why}");
    }

    #[test]
    fn objects_being_deleted_or_without_a_run_label_are_not_judged() {
        let list: Vec<Job> = serde_json::from_value(json!([
            {"metadata": {"name": "j1", "labels": {"dev.knotless.run": "a"},
                "annotations": {"dev.knotless.session": "a", "dev.knotless.owner": OWN}}},
            {"metadata": {"name": "j2", "labels": {"dev.knotless.run": "b"}}},
            {"metadata": {"name": "j3"}},
            {"metadata": {"name": "j4", "labels": {"dev.knotless.run": "d"}, "deletionTimestamp": "2026-12-04T00:00:00Z",
                "finalizers": ["foregroundDeletion"]}},
        ]))
        .expect("jobs");
        let found: Vec<Found> = list.iter().filter_map(|job| Found::of(&job.metadata)).collect();
        assert_eq!(
            found,
            vec![
                Found { name: "j1".into(), run: "a".into(), session: Some("a".into()), owner: Some(OWN.into()) },
                Found { name: "j2".into(), run: "b".into(), session: None, owner: None },
            ]
        );
        let taken = dead("job", list.iter().map(|job| &job.metadata), &BTreeSet::from(["a".to_string()]), OWN);
        assert_eq!(taken.iter().map(|found| found.name.as_str()).collect::<Vec<_>>(), ["j2"]);
    }
}
