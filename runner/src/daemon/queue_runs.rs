//! The merge queue's runs: a queued pull's pre-flights (its `queue: first` workflows on its head
//! merged with the base, as pull runs) and a batch's checks (its `on: queue` workflows on the
//! squashed commit). Both are untrusted runs through the daemon's slots; a check of the same
//! commit and workflow that already exists is waited for or reused, never run twice: one this
//! runner holds, or one another named runner published (a pinned pre-flight, or the pull run
//! of the same merge by the runner that runs the pull runs).
//!
//! The gating workflows and their list come from the base branch's tip, never from the pull or
//! the merge: a pull that deletes or edits its pre-flight still meets the base's copy, and a
//! check of its own edited copy is never reused as the gate.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use super::Daemon;
use super::schedule::{Job, new_run_id, runs_here, selected};
use crate::checks::{CheckRecord, CheckStore, CheckTarget};
use crate::forge::{Forge, ForgeEvent, Prepared, PullRef, RECORD_FILE, Repository, RepositoryRecord, Snapshot};
use crate::report::RunStatus;
use crate::state::InFlight;
use crate::state::InFlightStatus;
use crate::workflow::{Event, QueuePhase, Workflow};

/// What a pre-flight pinned to another runner is waited for on.
struct Waited<'a> {
    branch: &'a str,
    base: &'a str,
    number: u64,
    head: &'a str,
    commit: &'a str,
    owner: &'a str,
}

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

/// How a queued pull's pre-flights ended.
pub(super) enum Gate {
    /// All passed: their run ids.
    Passed(Vec<String>),
    /// It is ejected: the reason, and the run ids.
    Failed(String, Vec<String>),
    /// Its queue ref or its base moved, or the runner stopped, while it waited for a pre-flight
    /// on another runner: it stays waiting and the next round takes it again.
    Moved,
}

/// How long the lander waits for the first named runner to publish its pull run of a
/// pre-flight before running it itself: its `--poll` (that runner sees a new pull at its own
/// next look, or at once when a hook notifies both), within these bounds.
const PULL_RUN_GRACE: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(60));

/// The runner a gating workflow runs on: the first it pins, else the lander (`None`).
fn owner(workflow: &Workflow) -> Option<&str> {
    workflow.runners.first().map(String::as_str)
}

/// A pull run's target on `commit`, the pull's head merged with `branch`.
fn pull_target(number: u64, head: &str, branch: &str, commit: &str) -> CheckTarget {
    CheckTarget {
        event: Event::Pull,
        commit: commit.to_string(),
        git_ref: format!("refs/pulls/{number}/head"),
        pull: Some(number),
        head: Some(head.to_string()),
        base: Some(branch.to_string()),
    }
}

impl<F: Forge> Daemon<F> {
    /// A queued pull's pre-flights on its head merged with `branch`'s head `base`: the lander
    /// runs its own (and those pinned to no runner), and waits for the check each other one's
    /// runner publishes; `waiting` is told what it waits for.
    pub(super) async fn preflights(
        self: &Arc<Self>,
        repository: &Repository,
        branch: &str,
        base: &str,
        (number, head): (u64, &str),
        retry: bool,
        waiting: &mut (dyn FnMut(&str) + Send),
    ) -> Gate {
        let event = ForgeEvent::Pull { number, pull: PullRef { head: head.to_string(), base: branch.to_string() } };
        let prepared = match self.forge.prepare(repository, &event).await {
            Ok(prepared) => prepared,
            Err(error) => {
                let text = format!("{error:#}");
                let reason = match text.split_once("conflict in ") {
                    Some((_, files)) => format!("conflicts with {branch} at {files}"),
                    None => format!("cannot merge with {branch}: {text}"),
                };
                return Gate::Failed(reason, Vec::new());
            }
        };
        let target = pull_target(number, head, branch, &prepared.commit);
        let gating = |workflow: &Workflow| workflow.queue == Some(QueuePhase::First);
        let workflows = match self.gating(repository, branch, base, &prepared, gating).await {
            Ok(workflows) => workflows,
            Err(reason) => return Gate::Failed(reason, Vec::new()),
        };
        let me = self.config.runner_id.as_str();
        let (own, elsewhere): (Vec<_>, Vec<_>) =
            workflows.into_iter().partition(|(workflow, _)| owner(workflow).is_none_or(|owner| owner == me));
        // A retry runs every pre-flight anew.
        let own: Vec<(Workflow, bool)> = own.into_iter().map(|(workflow, reuse)| (workflow, reuse && !retry)).collect();
        // A pre-flight another named runner has run or runs on this merge (its pull run) and
        // published is taken from the forge, not run again.
        let (taken, own) = self.taken_elsewhere(repository, branch, &prepared.commit, own, waiting).await;
        let outcome = self.run_all(repository, &prepared, &target, own).await;
        let mut runs = outcome.runs;
        if let Some(failed) = outcome.failed {
            return Gate::Failed(format!("pre-flight {failed} failed"), runs);
        }
        if !outcome.passed {
            return Gate::Moved;
        }
        let elsewhere = taken.into_iter().chain(
            elsewhere.into_iter().map(|(workflow, _)| (owner(&workflow).unwrap_or_default().to_string(), workflow)),
        );
        for (owner, workflow) in elsewhere {
            let wait = Waited { branch, base, number, head, commit: &prepared.commit, owner: &owner };
            let Some(check) = self.published(repository, &workflow, &wait, retry, waiting).await else {
                return Gate::Moved;
            };
            runs.push(check.run_id.clone());
            if check.status != RunStatus::Success {
                return Gate::Failed(format!("pre-flight {} failed on runner {owner}", workflow.name), runs);
            }
        }
        Gate::Passed(runs)
    }

    /// The runners the repository record names (none when it names none or cannot be read).
    async fn named_runners(&self, repository: &Repository) -> Vec<String> {
        match self.forge.read_default(repository, RECORD_FILE).await {
            Ok(Some(text)) => RepositoryRecord::parse(&text).map(|record| record.runners).unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Splits the lander's own pre-flights (each with whether a check of it may be reused) on
    /// the merge `commit` into `branch`: those another runner named by the repository record
    /// published a check of (finished or still running: its pull run of the same merge), each
    /// with that runner, and those to run here. When the first named runner is another one, it
    /// owns pull runs: the pre-flights that are also its pull checks are waited for, for
    /// `--poll` within [`PULL_RUN_GRACE`], before the lander runs them itself.
    async fn taken_elsewhere(
        &self,
        repository: &Repository,
        branch: &str,
        commit: &str,
        own: Vec<(Workflow, bool)>,
        waiting: &mut (dyn FnMut(&str) + Send),
    ) -> (Vec<(String, Workflow)>, Vec<(Workflow, bool)>) {
        if !own.iter().any(|(_, reuse)| *reuse) {
            return (Vec::new(), own);
        }
        let named = self.named_runners(repository).await;
        let me = self.config.runner_id.as_str();
        if !named.iter().any(|runner| runner != me) {
            return (Vec::new(), own);
        }
        let theirs = |published: &[CheckRecord], workflow: &Workflow| {
            published
                .iter()
                .find(|check| {
                    check.workflow == workflow.name
                        && check.runner_id != me
                        && named.contains(&check.runner_id)
                        && check.target.event == Event::Pull
                        && check.target.commit == commit
                })
                .map(|check| check.runner_id.clone())
        };
        // The pull runner's pull checks among the reusable pre-flights.
        let pull_runner = named.first().filter(|first| first.as_str() != me);
        let expected: Vec<&Workflow> = match pull_runner {
            Some(_) => own
                .iter()
                .filter(|(workflow, reuse)| *reuse && workflow.on.matches(Event::Pull, Some(branch)))
                .map(|(workflow, _)| workflow)
                .collect(),
            None => Vec::new(),
        };
        let grace = tokio::time::Instant::now() + self.config.poll.clamp(PULL_RUN_GRACE.0, PULL_RUN_GRACE.1);
        let mut said = false;
        let published = loop {
            if said && let Err(error) = self.forge.refresh(repository).await {
                tracing::warn!(repository = %repository.url, "merge queue: {error:#}");
            }
            let published = match self.forge.published_checks(repository, commit).await {
                Ok(published) => published,
                Err(error) => {
                    tracing::warn!(repository = %repository.url, "merge queue: {error:#}");
                    Vec::new()
                }
            };
            let missing: Vec<&str> = expected
                .iter()
                .filter(|workflow| theirs(&published, workflow).is_none())
                .map(|workflow| workflow.name.as_str())
                .collect();
            if missing.is_empty() || tokio::time::Instant::now() >= grace || self.handover.is_cancelled() {
                if !missing.is_empty() && said {
                    tracing::info!(repository = %repository.url, "merge queue: runner {} published no pull run of {} on {commit}: the lander runs it", pull_runner.map_or("", String::as_str), missing.join(", "));
                }
                break published;
            }
            if !said {
                let what = format!(
                    "waiting for runner {}'s pull run of pre-flight {}",
                    pull_runner.map_or("", String::as_str),
                    missing.join(", ")
                );
                waiting(&what);
                said = true;
            }
            tokio::select! {
                () = self.handover.cancelled() => {}
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        };
        let mut taken = Vec::new();
        let mut here = Vec::new();
        for (workflow, reuse) in own {
            match theirs(&published, &workflow) {
                Some(runner) if reuse => taken.push((runner, workflow)),
                _ => here.push((workflow, reuse)),
            }
        }
        (taken, here)
    }

    /// Waits for the check of `workflow` that its runner publishes on the merge, kept here
    /// too; `None` when the pull's queue ref or the base moved or the runner stopped first.
    /// A retry first takes away the ones published before, so that runner runs it anew.
    async fn published(
        &self,
        repository: &Repository,
        workflow: &Workflow,
        wait: &Waited<'_>,
        retry: bool,
        waiting: &mut (dyn FnMut(&str) + Send),
    ) -> Option<CheckRecord> {
        let ours = |check: &CheckRecord| {
            check.workflow == workflow.name
                && check.runner_id == wait.owner
                && check.target.event == Event::Pull
                && check.target.commit == wait.commit
                && check.status.is_final()
        };
        let mut taken_away = !retry;
        let mut said = false;
        loop {
            if self.handover.is_cancelled() {
                return None;
            }
            match self.forge.refresh(repository).await {
                Ok(snapshot) => {
                    let queued = snapshot.queued.get(wait.branch).and_then(|queued| queued.get(&wait.number));
                    if queued.map(String::as_str) != Some(wait.head)
                        || snapshot.branches.get(wait.branch).map(String::as_str) != Some(wait.base)
                    {
                        return None;
                    }
                    let published = match self.forge.published_checks(repository, wait.commit).await {
                        Ok(published) => published,
                        Err(error) => {
                            tracing::warn!(repository = %repository.url, "merge queue: {error:#}");
                            Vec::new()
                        }
                    };
                    let mut found: Vec<CheckRecord> = published.into_iter().filter(ours).collect();
                    if !taken_away {
                        for check in &found {
                            if let Err(error) = self.forge.unpublish_check(repository, check).await {
                                tracing::warn!(repository = %repository.url, "merge queue: {error:#}");
                            }
                        }
                        taken_away = true;
                        found.clear();
                    }
                    if let Some(check) = found.into_iter().max_by_key(|check| check.finished_at) {
                        let mut copy = check;
                        copy.repository = repository.url.clone();
                        copy.repository_key = repository.key.clone();
                        copy.published = false;
                        self.put_check(&copy);
                        return Some(copy);
                    }
                }
                Err(error) => tracing::warn!(repository = %repository.url, "merge queue: {error:#}"),
            }
            if !said {
                let what = format!("waiting for pre-flight {} on runner {}", workflow.name, wait.owner);
                tracing::info!(repository = %repository.url, "pull {}: {what}", wait.number);
                waiting(&what);
                said = true;
            }
            tokio::select! {
                () = self.handover.cancelled() => return None,
                () = tokio::time::sleep(self.config.poll.min(Duration::from_secs(2))) => {}
            }
        }
    }

    /// On a runner that does not land: runs, for each queued pull, the pre-flights pinned to
    /// this runner (first in their `runners:`) on the pull merged with its base, and publishes
    /// each finished check for the lander. One task per queued pull and base at a time.
    pub(super) fn serve_pinned(self: &Arc<Self>, repository: &Repository, snapshot: &Snapshot) {
        for (branch, queued) in &snapshot.queued {
            let Some(base) = snapshot.branches.get(branch) else { continue };
            for (number, head) in queued {
                let key = format!("{} {branch} {number} {head} {base}", repository.key);
                if !self.serving.lock().unwrap_or_else(|poison| poison.into_inner()).insert(key.clone()) {
                    continue;
                }
                let daemon = Arc::clone(self);
                let (repository, branch, base, number, head) =
                    (repository.clone(), branch.clone(), base.clone(), *number, head.clone());
                self.tasks.spawn(async move {
                    daemon.serve_one(&repository, &branch, &base, number, &head).await;
                    daemon.serving.lock().unwrap_or_else(|poison| poison.into_inner()).remove(&key);
                });
            }
        }
    }

    /// The pinned pre-flights of one queued pull (see [`Daemon::serve_pinned`]).
    async fn serve_one(self: &Arc<Self>, repository: &Repository, branch: &str, base: &str, number: u64, head: &str) {
        let event = ForgeEvent::Pull { number, pull: PullRef { head: head.to_string(), base: branch.to_string() } };
        // A pull that does not merge is the lander's to eject.
        let Ok(prepared) = self.forge.prepare(repository, &event).await else { return };
        let me = self.config.runner_id.clone();
        let named = self.named_runners(repository).await;
        // Pinned here; or pinned nowhere while this runner runs the pull runs (the first one
        // the record names): a pull run of it on this merge is published for the lander.
        let pull_run_here = |workflow: &Workflow| {
            workflow.runners.is_empty()
                && !named.is_empty()
                && runs_here(workflow, &me, &named)
                && workflow.on.matches(Event::Pull, Some(branch))
        };
        let wanted = |workflow: &Workflow| {
            workflow.queue == Some(QueuePhase::First) && (owner(workflow) == Some(&me) || pull_run_here(workflow))
        };
        let workflows = match self.gating(repository, branch, base, &prepared, wanted).await {
            Ok(workflows) => workflows,
            Err(reason) => {
                tracing::warn!(repository = %repository.url, "merge queue: pull {number}: {reason}");
                return;
            }
        };
        if workflows.is_empty() {
            return;
        }
        let published = self.forge.published_checks(repository, &prepared.commit).await.unwrap_or_default();
        let target = pull_target(number, head, branch, &prepared.commit);
        let store = CheckStore::new(&self.config.state);
        let (pinned, pull_runs): (Vec<_>, Vec<_>) =
            workflows.into_iter().partition(|(workflow, _)| owner(workflow) == Some(&me));
        for (workflow, same) in pull_runs {
            if !same {
                // The pull edits it: its pull run is not the gate, the lander runs the base's.
                continue;
            }
            self.publish_pull_run(repository, number, &workflow, &target, &published).await;
        }
        for (workflow, same) in pinned {
            let done = |check: &CheckRecord| {
                check.workflow == workflow.name
                    && check.runner_id == me
                    && check.target.commit == target.commit
                    && check.target.event == target.event
            };
            if published.iter().any(|check| done(check) && check.status.is_final()) {
                continue;
            }
            // Published once and taken away since: the lander asks for a retry.
            let asked_again = store.list(&repository.key).unwrap_or_default().iter().any(|c| done(c) && c.published);
            let job = Job {
                repository: repository.clone(),
                check: record(repository, &workflow.name, &target, &me),
                workflow,
                prepared: prepared.clone(),
                changed: None,
            };
            let mut check = Arc::clone(self).reuse_or_run(job, same && !asked_again).await;
            if !check.status.is_final() || self.handover.is_cancelled() {
                // Stopped before it ended: the next start runs it again.
                return;
            }
            match self.forge.publish_check(repository, &check).await {
                Ok(()) => {
                    tracing::info!(repository = %repository.url, "pull {number}: published pre-flight {} ({})", check.workflow, check.status.as_str());
                    check.published = true;
                    self.put_check(&check);
                }
                Err(error) => tracing::error!(repository = %repository.url, "merge queue: {error:#}"),
            }
        }
    }

    /// Publishes this runner's pull run of `workflow` on `target`'s merge, if it ran or runs
    /// one: at once while it runs (the lander waits for it instead of running it again), and
    /// when it ends.
    async fn publish_pull_run(
        &self,
        repository: &Repository,
        number: u64,
        workflow: &Workflow,
        target: &CheckTarget,
        published: &[CheckRecord],
    ) {
        let me = self.config.runner_id.as_str();
        let store = CheckStore::new(&self.config.state);
        let ours = |check: &CheckRecord| {
            check.workflow == workflow.name
                && check.runner_id == me
                && check.target.event == Event::Pull
                && check.target.commit == target.commit
        };
        let latest = |store: &CheckStore| {
            store.list(&repository.key).unwrap_or_default().into_iter().filter(ours).max_by_key(|check| check.queued_at)
        };
        let Some(mut check) = latest(&store) else { return };
        if published.iter().any(|done| done.run_id == check.run_id && done.status.is_final()) {
            return;
        }
        let mut said = false;
        loop {
            let ended = check.status.is_final();
            if ended || !said {
                match self.forge.publish_check(repository, &check).await {
                    Ok(()) => {
                        tracing::info!(repository = %repository.url, "pull {number}: published its pull run of pre-flight {} ({})", check.workflow, check.status.as_str())
                    }
                    Err(error) => {
                        tracing::error!(repository = %repository.url, "merge queue: {error:#}");
                        return;
                    }
                }
                said = true;
            }
            if ended || self.handover.is_cancelled() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            match store.get(&repository.key, &check.run_id) {
                Ok(now) => check = now,
                Err(_) => return,
            }
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
        let event = ForgeEvent::Push { branch: branch.to_string(), commit: commit.to_string(), before: None };
        let mut prepared = self.forge.prepare(repository, &event).await?;
        prepared.git_ref = format!("refs/queue/{branch}");
        let target = CheckTarget {
            event: Event::Queue,
            commit: commit.to_string(),
            git_ref: prepared.git_ref.clone(),
            pull: None,
            head: None,
            base: Some(branch.to_string()),
        };
        let wanted = |workflow: &Workflow| workflow.on.matches(Event::Queue, Some(branch));
        let workflows = match self.gating(repository, branch, base, &prepared, wanted).await {
            Ok(workflows) => workflows,
            Err(reason) => return Ok(Err(reason)),
        };
        // Only the lander makes a batch, so only it can check one: a batch workflow pinned
        // away from it is an error naming the fix, never skipped.
        let me = &self.config.runner_id;
        if let Some((workflow, _)) = workflows.iter().find(|(workflow, _)| !selected(workflow, me)) {
            return Ok(Err(format!(
                "{} is pinned to runners [{}] but runner {me} lands the queue of {branch} and checks \
                 its batches: add {me} to its runners: or remove the pin",
                workflow.file,
                workflow.runners.join(", "),
            )));
        }
        Ok(Ok(self.run_all(repository, &prepared, &target, workflows).await))
    }

    /// The gating workflows `wanted` picks, read from `branch`'s tip `base` (never from the
    /// checkout run), each with whether an existing check of it may be reused: only when the
    /// checkout's own copy is the same.
    async fn gating(
        &self,
        repository: &Repository,
        branch: &str,
        base: &str,
        prepared: &Prepared,
        wanted: impl Fn(&Workflow) -> bool,
    ) -> Result<Vec<(Workflow, bool)>, String> {
        let event = ForgeEvent::Push { branch: branch.to_string(), commit: base.to_string(), before: None };
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
                changed: None,
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
            state
                .in_flight
                .insert(run_id.clone(), InFlight { repository_key: key.clone(), status: InFlightStatus::Queued })
        });
        self.put_check(&job.check);
        Arc::clone(&self).queue(job, Vec::new()).await;
        store.get(&key, &run_id).unwrap_or(fallback)
    }
}

/// The first ten characters of a commit id.
fn short(commit: &str) -> &str {
    commit.get(..10).unwrap_or(commit)
}
