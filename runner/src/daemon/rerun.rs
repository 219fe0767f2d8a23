//! Runs again: `knotless-run rerun REPO RUN` runs a check's workflow again on its commit with
//! a new check that names the one it repeats, and the runs a stopping runner dropped before
//! they started are queued again at the next start.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::notify::Rerun;
use super::schedule::{self, Job};
use super::{Daemon, STOPPED_BEFORE};
use crate::checks::{CheckRecord, CheckStore, CheckTarget};
use crate::forge::{Forge, ForgeEvent, PullRef, Repository};
use crate::printable;
use crate::report::RunStatus;
use crate::state::Dropped;
use crate::workflow::Event;

/// The variable that tells a rerun's steps the run it repeats.
pub const RERUN_OF: &str = "KNOTLESS_RERUN_OF";

/// How a need of a run queued again stands, from the records of its commit.
enum Need {
    /// Every run of it ended `success`.
    Met,
    /// It has no run on the commit, or one that did not pass: why, in words.
    Unmet(String),
}

impl<F: Forge> Daemon<F> {
    /// Ends a waiting run `cancelled` at a handover, and remembers it to queue it again at the
    /// next start (a merge queue's run is not: the queue drives its own runs again).
    pub(super) fn drop_at_handover(&self, mut check: CheckRecord) {
        check.end(RunStatus::Cancelled, STOPPED_BEFORE);
        tracing::info!(run_id = %check.run_id, "run {} of {} cancelled: {STOPPED_BEFORE}", check.run_id, check.workflow);
        self.finish(&check, &format!("==> cancelled: {STOPPED_BEFORE}\n"));
        self.remember_dropped(&check);
    }

    /// Remembers a run the runner stopped before it started, to queue it again at the next start.
    pub(super) fn remember_dropped(&self, check: &CheckRecord) {
        if check.target.event == Event::Queue {
            return;
        }
        let dropped = Dropped { repository_key: check.repository_key.clone(), run_id: check.run_id.clone() };
        self.state.update(|state| {
            if !state.requeue.contains(&dropped) {
                state.requeue.push(dropped);
            }
        });
    }

    /// Queues again the runs the last runner stopped before they started, each with a new
    /// check that names the one it repeats; the runs of one commit that need each other wait
    /// for each other again.
    pub(super) async fn requeue(self: &Arc<Self>) {
        let dropped = self.state.snapshot().requeue;
        if dropped.is_empty() {
            return;
        }
        let repositories = match self.forge.repositories().await {
            Ok(repositories) => repositories,
            Err(error) => {
                tracing::error!("cannot list the repositories, so the runs dropped at the last stop wait: {error:#}");
                return;
            }
        };
        let store = CheckStore::new(&self.config.state);
        // By repository and target, in the order they were dropped.
        let mut groups: Vec<(Repository, CheckTarget, Vec<Job>)> = Vec::new();
        for Dropped { repository_key, run_id } in &dropped {
            let Some(repository) = repositories.iter().find(|repository| &repository.key == repository_key) else {
                tracing::warn!("run {run_id} is not queued again: this runner no longer watches its repository");
                continue;
            };
            let old = match store.get(repository_key, run_id) {
                Ok(old) => old,
                Err(error) => {
                    tracing::warn!("run {run_id} is not queued again: {error:#}");
                    continue;
                }
            };
            match self.again(repository, &old, BTreeMap::new()).await {
                Ok(job) => {
                    tracing::info!(repository = %repository.url, run_id = %job.check.run_id, "run {run_id} of {} dropped at the last stop runs again as {}", old.workflow, job.check.run_id);
                    let target = old.target.clone();
                    self.link(old, &job.check.run_id);
                    match groups
                        .iter_mut()
                        .find(|(known, known_target, _)| known.key == repository.key && *known_target == target)
                    {
                        Some((_, _, jobs)) => jobs.push(job),
                        None => groups.push((repository.clone(), target, vec![job])),
                    }
                }
                Err(why) => tracing::warn!(repository = %repository.url, "run {run_id} is not queued again: {why}"),
            }
        }
        for (repository, _, jobs) in groups {
            let records = crate::checks::recovery::readable_records(&store, &repository.key);
            self.spawn_jobs(&repository, jobs, |job, need| match need_on(&records, &job.check.target, need) {
                Need::Met => Ok(()),
                Need::Unmet(why) => Err(format!("it needs {need}, and {why}")),
            });
        }
        self.state.update(|state| state.requeue.retain(|entry| !dropped.contains(entry)));
    }

    /// Runs a check's workflow again (`knotless-run rerun`): the new run's id, or why not.
    pub(super) async fn rerun(self: &Arc<Self>, request: &Rerun) -> Result<Vec<String>, String> {
        let repository = self.watched(&request.repository).await?;
        let run = printable::name(&request.rerun);
        let safe = |c: char| c.is_ascii_alphanumeric() || c == '-';
        if request.rerun.is_empty() || !request.rerun.chars().all(safe) {
            return Err(format!("{run} is not a run id (the ids `knotless-run checks` prints)"));
        }
        for name in request.env.keys() {
            if let Err(why) = crate::workflow::check_variable_name(name) {
                return Err(format!("--env {}: {why}", printable::name(name)));
            }
        }
        let store = CheckStore::new(&self.config.state);
        let old = store.get(&repository.key, &request.rerun).map_err(|_| {
            format!("{} has no run {run} (`knotless-run checks {}` lists its runs)", repository.url, repository.url)
        })?;
        if !old.status.is_final() {
            return Err(format!(
                "run {run} of {} is {}: a run is run again once it has ended",
                old.workflow,
                old.status.as_str()
            ));
        }
        let job = self.again(&repository, &old, request.env.clone()).await?;
        let records = crate::checks::recovery::readable_records(&store, &repository.key);
        for need in &job.workflow.needs {
            if let Need::Unmet(why) = need_on(&records, &old.target, need) {
                return Err(format!("{} needs {need}, and {why}: run that again first", old.workflow));
            }
        }
        let run_id = job.check.run_id.clone();
        tracing::info!(repository = %repository.url, run_id = %run_id, "run {} of {} runs again as {run_id}", old.run_id, old.workflow);
        self.link(old, &run_id);
        self.spawn_jobs(&repository, vec![job], |_, _| Ok(()));
        Ok(vec![run_id])
    }

    /// Names `again` on the record of the run it repeats.
    fn link(&self, mut old: CheckRecord, again: &str) {
        old.run_again_as.push(again.to_string());
        self.put_check(&old);
    }

    /// A new job that repeats `old`: its workflow as its commit holds it, with the same event,
    /// ref and trust, the variables `old` was given and `env` over them.
    async fn again(
        &self,
        repository: &Repository,
        old: &CheckRecord,
        env: BTreeMap<String, String>,
    ) -> Result<Job, String> {
        let name = printable::name(&old.workflow);
        if old.target.event == Event::Queue {
            return Err(format!(
                "run {} of {name} belongs to a merge queue, which runs its pre-flights and batches again itself",
                old.run_id
            ));
        }
        let target = &old.target;
        let same = ForgeEvent::Push { branch: String::new(), commit: target.commit.clone(), before: None };
        let mut prepared = self.forge.prepare(repository, &same).await.map_err(|error| format!("{error:#}"))?;
        prepared.git_ref = target.git_ref.clone();
        let mut found = prepared.checkout.workflows().await;
        let mut target = target.clone();
        // A pull's merge commit can be gone from the mirror (it has no ref): the pull's head is
        // merged into its base again.
        if let (Err(_), Some(number), Some(head), Some(base)) = (&found, target.pull, &target.head, &target.base) {
            let pull = ForgeEvent::Pull { number, pull: PullRef { head: head.clone(), base: base.clone() } };
            prepared = self.forge.prepare(repository, &pull).await.map_err(|error| format!("{error:#}"))?;
            target.commit = prepared.commit.clone();
            found = prepared.checkout.workflows().await;
        }
        let (workflows, _) =
            found.map_err(|error| format!("cannot read the workflows of {}: {error:#}", old.target.commit))?;
        let Some(mut workflow) = workflows.into_iter().find(|workflow| workflow.name == old.workflow) else {
            return Err(format!("commit {} has no workflow {name} that loads", target.commit));
        };
        if !schedule::selected(&workflow, &self.config.runner_id) {
            return Err(format!("workflow {name} runs on runners {}, not this one", workflow.runners.join(", ")));
        }
        let mut variables = old.variables.clone();
        variables.extend(env);
        if let Some(manual) = &workflow.on.manual {
            workflow.env.extend(manual.inputs.clone());
        }
        workflow.env.extend(variables.clone());
        let place = (repository.url.as_str(), repository.key.as_str());
        let mut check = CheckRecord::queued(
            schedule::new_run_id(&workflow.name),
            place,
            &workflow.name,
            &target,
            old.trusted,
            &self.config.runner_id,
        );
        check.reruns = Some(old.run_id.clone());
        check.variables = variables;
        let event = match (target.event, target.pull) {
            (Event::Pull, Some(number)) => Some(ForgeEvent::Pull {
                number,
                pull: PullRef {
                    head: target.head.clone().unwrap_or_default(),
                    base: target.base.clone().unwrap_or_default(),
                },
            }),
            _ => None,
        };
        let changed = match (&event, workflow.reads_changes()) {
            (Some(event), true) => self.forge.changed_paths(repository, event).await.ok().flatten(),
            _ => None,
        };
        Ok(Job { repository: repository.clone(), workflow, prepared, check, changed })
    }
}

/// How `need` stands for a run of `target`, from a repository's `records`: met when the newest
/// run of each workflow it names (a matrix's every combination) on the same commit, event and
/// ref ended `success`.
fn need_on(records: &[CheckRecord], target: &CheckTarget, need: &str) -> Need {
    let combination = format!("{need} (");
    let mut newest: BTreeMap<&str, &CheckRecord> = BTreeMap::new();
    // Oldest first: each later run of a workflow replaces the one before.
    for record in records.iter().filter(|record| {
        (record.workflow == need || record.workflow.starts_with(&combination)) && record.target.same_as(target)
    }) {
        newest.insert(&record.workflow, record);
    }
    if newest.is_empty() {
        return Need::Unmet(format!("{need} has no run on {}", target.named_commit()));
    }
    match newest.values().find(|record| record.status != RunStatus::Success) {
        Some(record) => {
            Need::Unmet(format!("run {} of {} {}", record.run_id, record.workflow, record.status.outcome()))
        }
        None => Need::Met,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(run_id: &str, workflow: &str, commit: &str, status: RunStatus, queued_at: u64) -> CheckRecord {
        let target = CheckTarget {
            event: Event::Push,
            commit: commit.into(),
            git_ref: "refs/heads/main".into(),
            pull: None,
            head: None,
            base: None,
        };
        let mut record = CheckRecord::queued(run_id.into(), ("repo", "key"), workflow, &target, true, "r");
        record.status = status;
        record.queued_at = queued_at;
        record
    }

    #[test]
    fn a_need_is_met_by_the_newest_run_of_each_workflow_it_names_on_the_same_commit() {
        let target = record("x", "test", "c1", RunStatus::Queued, 0).target;
        let met = |records: &[CheckRecord], need: &str| matches!(need_on(records, &target, need), Need::Met);
        let failed_then_passed =
            [record("a", "lint", "c1", RunStatus::Failure, 1), record("b", "lint", "c1", RunStatus::Success, 2)];
        assert!(met(&failed_then_passed, "lint"));
        let passed_then_failed =
            [record("a", "lint", "c1", RunStatus::Success, 1), record("b", "lint", "c1", RunStatus::Failure, 2)];
        assert!(!met(&passed_then_failed, "lint"));
        // Another commit's run, or another workflow whose name starts alike, is not the need.
        assert!(!met(&[record("a", "lint", "c2", RunStatus::Success, 1)], "lint"));
        assert!(!met(&[record("a", "lint-more", "c1", RunStatus::Success, 1)], "lint"));
        // A matrix: every combination must pass.
        let matrix =
            [record("a", "m (1)", "c1", RunStatus::Success, 1), record("b", "m (2)", "c1", RunStatus::Error, 2)];
        assert!(!met(&matrix, "m"));
        assert!(met(&matrix[..1], "m"));
        match need_on(&matrix, &target, "m") {
            Need::Unmet(why) => assert_eq!(why, "run b of m (2) ended in error"),
            Need::Met => panic!("a failed combination"),
        }
    }
}
