//! The merge queue's runs: a queued pull's pre-flights (its `queue: first` workflows on its head
//! merged with the base, as pull runs) and a batch's checks (its `on: queue` workflows on the
//! squashed commit). Both are untrusted runs through the daemon's slots; a check of the same
//! commit and workflow that already exists is waited for or reused, never run twice.
//!
//! The gating workflows and their list come from the base branch's tip, never from the pull or
//! the merge: a pull that deletes or edits its pre-flight still meets the base's copy, and a
//! check of its own edited copy is never reused as the gate.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use super::Daemon;
use super::schedule::{Job, new_run_id, selected};
use super::state::InFlight;
use crate::checks::{CheckRecord, CheckStore, CheckTarget};
use crate::engine::RunStatus;
use crate::forge::{Forge, ForgeEvent, Prepared, PullRef, Repository};
use crate::workflow::{Event, QueuePhase, Workflow};

/// What a set of queue runs gave: whether all passed, their run ids, and the first failure.
pub(super) struct Outcome {
    /// Whether every check succeeded.
    pub passed: bool,
    /// The checks' run ids.
    pub runs: Vec<String>,
    /// The first workflow that did not succeed.
    pub failed: Option<String>,
}

fn record(repository: &Repository, workflow: &str, target: &CheckTarget, runner_id: &str) -> CheckRecord {
    let repository = (repository.url.as_str(), repository.key.as_str());
    // Queue runs (pre-flights and batches) are never trusted.
    CheckRecord::queued(new_run_id(workflow), repository, workflow, target, false, runner_id)
}

impl<F: Forge> Daemon<F> {
    /// A queued pull's pre-flights on its head merged with `branch`'s head: `Ok` with their
    /// run ids when all pass, else the ejection reason (and the run ids).
    pub(super) async fn preflights(
        self: &Arc<Self>,
        repository: &Repository,
        branch: &str,
        base: &str,
        number: u64,
        head: &str,
        retry: bool,
    ) -> Result<Vec<String>, (String, Vec<String>)> {
        let event = ForgeEvent::Pull { number, pull: PullRef { head: head.to_string(), base: branch.to_string() } };
        let prepared = match self.forge.prepare(repository, &event).await {
            Ok(prepared) => prepared,
            Err(error) => {
                let text = format!("{error:#}");
                let reason = match text.split_once("conflict in ") {
                    Some((_, files)) => format!("conflicts with {branch} at {files}"),
                    None => format!("cannot merge with {branch}: {text}"),
                };
                return Err((reason, Vec::new()));
            }
        };
        let target = CheckTarget {
            event: "pull".into(),
            commit: prepared.commit.clone(),
            git_ref: format!("refs/pulls/{number}/head"),
            pull: Some(number),
            head: Some(head.to_string()),
            base: Some(branch.to_string()),
        };
        let gating = |workflow: &Workflow| workflow.queue == Some(QueuePhase::First);
        let workflows = match self.gating(repository, branch, base, &prepared, gating).await {
            // A retry runs every pre-flight anew.
            Ok(workflows) => workflows.into_iter().map(|(workflow, reuse)| (workflow, reuse && !retry)).collect(),
            Err(reason) => return Err((reason, Vec::new())),
        };
        let outcome = self.run_all(repository, &prepared, &target, workflows).await;
        match outcome.failed {
            None if outcome.passed => Ok(outcome.runs),
            failed => Err((format!("pre-flight {} failed", failed.unwrap_or_default()), outcome.runs)),
        }
    }

    /// A batch's checks: its `on: queue` workflows on `commit`.
    pub(super) async fn batch_checks(
        self: &Arc<Self>,
        repository: &Repository,
        branch: &str,
        base: &str,
        commit: &str,
    ) -> anyhow::Result<Result<Outcome, String>> {
        let event = ForgeEvent::Push { branch: branch.to_string(), commit: commit.to_string() };
        let mut prepared = self.forge.prepare(repository, &event).await?;
        prepared.git_ref = format!("refs/queue/{branch}");
        let target = CheckTarget {
            event: "queue".into(),
            commit: commit.to_string(),
            git_ref: prepared.git_ref.clone(),
            pull: None,
            head: None,
            base: Some(branch.to_string()),
        };
        let wanted = |workflow: &Workflow| workflow.on.matches(Event::Queue, Some(branch));
        match self.gating(repository, branch, base, &prepared, wanted).await {
            Ok(workflows) => Ok(Ok(self.run_all(repository, &prepared, &target, workflows).await)),
            Err(reason) => Ok(Err(reason)),
        }
    }

    /// The gating workflows `wanted` picks, read from `branch`'s tip `base` (never from the
    /// checkout run), each with whether an existing check of it may be reused: only when the
    /// checkout's own copy is the same. Every one is evaluated whatever it is pinned to: one
    /// pinned away from this runner (the lander) is an error naming the fix, never skipped.
    async fn gating(
        &self,
        repository: &Repository,
        branch: &str,
        base: &str,
        prepared: &Prepared,
        wanted: impl Fn(&Workflow) -> bool,
    ) -> Result<Vec<(Workflow, bool)>, String> {
        let event = ForgeEvent::Push { branch: branch.to_string(), commit: base.to_string() };
        let tip =
            self.forge.prepare(repository, &event).await.map_err(|error| {
                format!("cannot read the gating workflows of {branch} at {}: {error:#}", short(base))
            })?;
        let (workflows, errors) =
            tip.checkout.workflows().await.map_err(|error| {
                format!("cannot read the gating workflows of {branch} at {}: {error:#}", short(base))
            })?;
        for error in errors {
            tracing::warn!("merge queue: {branch} at {}: {error}", short(base));
        }
        let own = match prepared.checkout.workflows().await {
            Ok((own, _)) => own,
            Err(error) => {
                tracing::warn!("merge queue: cannot read the workflows of {}: {error:#}", prepared.commit);
                Vec::new()
            }
        };
        let mut picked = Vec::new();
        for workflow in workflows.into_iter().filter(|workflow| wanted(workflow)) {
            if !selected(&workflow, &self.config.runner_id) {
                return Err(format!(
                    "{} is pinned to runners [{}] but runner {} lands the queue of {branch}: \
                     add {} to its runners: or remove the pin",
                    workflow.file,
                    workflow.runners.join(", "),
                    self.config.runner_id,
                    self.config.runner_id
                ));
            }
            let same = own.iter().any(|copy| copy == &workflow);
            picked.push((workflow, same));
        }
        Ok(picked)
    }

    /// Runs (or reuses) one check of each workflow on `target`, all at once, to their ends.
    async fn run_all(
        self: &Arc<Self>,
        repository: &Repository,
        prepared: &Prepared,
        target: &CheckTarget,
        workflows: Vec<(Workflow, bool)>,
    ) -> Outcome {
        let mut set = JoinSet::new();
        for (index, (workflow, reuse)) in workflows.into_iter().enumerate() {
            let daemon = Arc::clone(self);
            let job = Job {
                repository: repository.clone(),
                check: record(repository, &workflow.name, target, &self.config.runner_id),
                workflow,
                prepared: prepared.clone(),
            };
            set.spawn(async move { (index, daemon.reuse_or_run(job, reuse).await) });
        }
        let mut ended: Vec<(usize, CheckRecord)> = Vec::new();
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok(done) => ended.push(done),
                Err(error) => tracing::error!("merge queue: a run task failed: {error}"),
            }
        }
        ended.sort_by_key(|(index, _)| *index);
        let failed =
            ended.iter().find(|(_, check)| check.status != RunStatus::Success).map(|(_, c)| c.workflow.clone());
        Outcome {
            passed: failed.is_none() && !self.handover.is_cancelled(),
            runs: ended.into_iter().map(|(_, check)| check.run_id).collect(),
            failed,
        }
    }

    /// The check of `job`'s workflow on its commit: one that passed or failed already, one in
    /// flight (waited for), or a new run (always a new run unless `reuse`).
    async fn reuse_or_run(self: Arc<Self>, job: Job, reuse: bool) -> CheckRecord {
        let store = CheckStore::new(&self.config.state);
        let same = |check: &CheckRecord| {
            check.workflow == job.check.workflow
                && check.target.commit == job.check.target.commit
                && check.target.event == job.check.target.event
        };
        loop {
            if !reuse {
                break;
            }
            let existing: Vec<CheckRecord> =
                store.list(&job.repository.key).unwrap_or_default().into_iter().filter(same).collect();
            let settled = existing
                .iter()
                .rev()
                .find(|check| check.status == RunStatus::Success)
                .or_else(|| existing.iter().rev().find(|check| check.status == RunStatus::Failure));
            if let Some(check) = settled {
                return check.clone();
            }
            if !existing.iter().any(|check| !check.status.is_final()) || self.handover.is_cancelled() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let key = job.repository.key.clone();
        let run_id = job.check.run_id.clone();
        let fallback = job.check.clone();
        self.state.update(|state| {
            state.in_flight.insert(run_id.clone(), InFlight { repository_key: key.clone(), status: "queued".into() })
        });
        self.put_check(&job.check);
        Arc::clone(&self).queue(job).await;
        store.get(&key, &run_id).unwrap_or(fallback)
    }
}

/// The first ten characters of a commit id.
fn short(commit: &str) -> &str {
    commit.get(..10).unwrap_or(commit)
}
