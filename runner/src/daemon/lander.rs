//! The lander: the one runner of a repository that drives its merge queue (started with
//! `--queue`, and the repository record's lander). Per branch, in rounds: take in the queue
//! refs, run the new pulls' pre-flights side by side, batch the ready pulls, check the batch,
//! land it, and when a batch of several fails, retry the pulls one by one on top of those that
//! passed so the culprit alone is ejected.

use std::sync::Arc;

use super::Daemon;
use super::queue_runs::Gate;
use crate::forge::{Forge, RECORD_FILE, Repository, RepositoryRecord, Snapshot};
use crate::queue::{BatchRecord, BatchStatus, EntryState, QueueState, QueueStore};

impl<F: Forge> Daemon<F> {
    /// Whether this runner lands `repository`: it runs `--queue` and is the record's lander
    /// (the first named runner that may push, else the first named runner; any `--queue`
    /// runner when the record names none).
    async fn is_lander(&self, repository: &Repository) -> bool {
        if !self.config.queue {
            tracing::info!(repository = %repository.url, "not landing the merge queue of {}: this runner runs without --queue", repository.url);
            return false;
        }
        match self.forge.read_default(repository, RECORD_FILE).await {
            Ok(Some(text)) => match RepositoryRecord::parse(&text) {
                Ok(record) => match record.lander() {
                    Some(lander) if lander != self.config.runner_id => {
                        if first_time(&format!("{} {lander}", repository.key)) {
                            tracing::info!(repository = %repository.url, "runner {lander} lands {}, not this one", repository.url);
                        } else {
                            tracing::debug!(repository = %repository.url, "runner {lander} lands {}, not this one", repository.url);
                        }
                        false
                    }
                    _ => true,
                },
                Err(error) => {
                    tracing::warn!(repository = %repository.url, "not landing: {error:#}");
                    false
                }
            },
            Ok(None) => true,
            Err(error) => {
                tracing::warn!(repository = %repository.url, "not landing: {error:#}");
                false
            }
        }
    }

    /// Starts driving `repository`'s queue when something is queued, this runner lands it, and
    /// no driver runs for it yet.
    pub(super) async fn consider_queue(self: &Arc<Self>, repository: &Repository, snapshot: &Snapshot) {
        if snapshot.queued.is_empty() {
            return;
        }
        if !self.is_lander(repository).await {
            if self.config.queue {
                self.serve_pinned(repository, snapshot);
            }
            return;
        }
        if !self.driving_insert(&repository.key) {
            return;
        }
        let daemon = Arc::clone(self);
        let repository = repository.clone();
        self.tasks.spawn(async move { daemon.drive(repository).await });
    }

    fn driving_insert(&self, key: &str) -> bool {
        self.driving.lock().unwrap_or_else(|poison| poison.into_inner()).insert(key.to_string())
    }

    /// Rounds until no branch's queue holds a live entry.
    async fn drive(self: Arc<Self>, repository: Repository) {
        tracing::info!(repository = %repository.url, "driving the merge queue of {}", repository.url);
        loop {
            let busy = self.round(&repository).await;
            if self.handover.is_cancelled() {
                break;
            }
            if !busy {
                // Let go first, then look once more: a look that saw a new ref after this
                // point starts a driver itself.
                self.driving.lock().unwrap_or_else(|poison| poison.into_inner()).remove(&repository.key);
                if !self.has_new(&repository).await || !self.driving_insert(&repository.key) {
                    tracing::info!(repository = %repository.url, "the merge queue of {} is idle", repository.url);
                    return;
                }
            }
        }
        self.driving.lock().unwrap_or_else(|poison| poison.into_inner()).remove(&repository.key);
    }

    /// Whether a queue ref is there that no kept entry has settled.
    async fn has_new(&self, repository: &Repository) -> bool {
        let Ok(snapshot) = self.forge.refresh(repository).await else { return false };
        let store = QueueStore::new(&self.config.state);
        snapshot.queued.iter().any(|(branch, queued)| {
            let kept = store.load(&repository.key, branch).ok().flatten().unwrap_or_default();
            queued.iter().any(|(number, head)| {
                !kept.entries.iter().any(|entry| entry.settles(*number, head) && entry.state.is_final())
            })
        })
    }

    /// One round over every branch with a queue; whether some entry is still live.
    async fn round(self: &Arc<Self>, repository: &Repository) -> bool {
        let snapshot = match self.forge.refresh(repository).await {
            Ok(snapshot) => snapshot,
            Err(error) => {
                tracing::error!(repository = %repository.url, "merge queue: {error:#}");
                return false;
            }
        };
        let store = QueueStore::new(&self.config.state);
        let mut busy = false;
        let mut branches: Vec<String> = snapshot.queued.keys().cloned().collect();
        for known in self.busy_branches(repository, &store) {
            if !branches.contains(&known) {
                branches.push(known);
            }
        }
        for branch in branches {
            let mut queue = match store.load(&repository.key, &branch) {
                Ok(queue) => queue.unwrap_or_else(|| QueueState {
                    repository: repository.url.clone(),
                    branch: branch.clone(),
                    ..QueueState::default()
                }),
                Err(error) => {
                    tracing::error!("merge queue: {error:#}");
                    continue;
                }
            };
            queue.sync(&snapshot.queued.get(&branch).cloned().unwrap_or_default());
            self.save_queue(repository, &queue);
            if !queue.is_busy() {
                continue;
            }
            let Some(base) = snapshot.branches.get(&branch).cloned() else {
                for number in live(&queue, &[EntryState::Waiting, EntryState::Ready, EntryState::InBatch]) {
                    self.eject(repository, &mut queue, number, format!("its base branch {branch} does not exist"))
                        .await;
                }
                continue;
            };
            self.branch_round(repository, &mut queue, &base).await;
            busy |= queue.is_busy();
        }
        busy
    }

    /// The branches whose kept queue still has live entries (their refs may be gone).
    fn busy_branches(&self, repository: &Repository, store: &QueueStore) -> Vec<String> {
        let branches = store.branches(&repository.key);
        branches
            .into_iter()
            .filter(|branch| store.load(&repository.key, branch).ok().flatten().is_some_and(|q| q.is_busy()))
            .collect()
    }

    /// Pre-flights of the waiting pulls, all side by side (each run still takes one of the
    /// runner's `--concurrency` slots), then one batch of the ready ones.
    async fn branch_round(self: &Arc<Self>, repository: &Repository, queue: &mut QueueState, base: &str) {
        let branch = queue.branch.clone();
        if self.handover.is_cancelled() {
            return;
        }
        let waiting: Vec<(u64, String, bool)> = live(queue, &[EntryState::Waiting])
            .into_iter()
            .filter_map(|number| queue.active_mut(number).map(|entry| (number, entry.head.clone(), entry.retry)))
            .collect();
        let gates = {
            // Each pull's pre-flights say what they wait for, and mark the pull ready once they
            // pass, as they go; ejections (a push each) come after.
            let shared = std::sync::Mutex::new(&mut *queue);
            let update = |change: &dyn Fn(&mut QueueState)| {
                let mut queue = shared.lock().unwrap_or_else(|poison| poison.into_inner());
                change(&mut queue);
                self.save_queue(repository, &queue);
            };
            let each = waiting.iter().map(|(number, head, retry)| {
                let (branch, update, number) = (&branch, &update, *number);
                async move {
                    let mut said = |what: &str| {
                        update(&|queue| {
                            if let Some(entry) = queue.active_mut(number) {
                                entry.reason = Some(what.to_string());
                            }
                        })
                    };
                    let gate = self.preflights(repository, branch, base, (number, head), *retry, &mut said).await;
                    if let Gate::Passed(runs) = &gate {
                        update(&|queue| {
                            if let Some(entry) = queue.active_mut(number) {
                                entry.state = EntryState::Ready;
                                entry.reason = None;
                                entry.preflights = runs.clone();
                            }
                        });
                    }
                    (number, gate)
                }
            });
            futures::future::join_all(each).await
        };
        for (number, gate) in gates {
            if let Gate::Failed(reason, runs) = gate {
                if self.handover.is_cancelled() {
                    return;
                }
                if let Some(entry) = queue.active_mut(number) {
                    entry.preflights = runs;
                }
                self.eject(repository, queue, number, reason).await;
            }
        }
        let ready: Vec<(u64, String)> = queue
            .entries
            .iter()
            .filter(|entry| matches!(entry.state, EntryState::Ready | EntryState::InBatch))
            .map(|entry| (entry.number, entry.head.clone()))
            .collect();
        if ready.is_empty() || self.handover.is_cancelled() {
            return;
        }
        match self.try_batch(repository, queue, base, &ready).await {
            Ok(Some((commit, pulls, _))) => self.land(repository, queue, base, &commit, &pulls).await,
            Ok(None) => {}
            Err((cause, pulls)) if pulls.len() > 1 && !self.handover.is_cancelled() => {
                tracing::info!(repository = %repository.url, "batch failed ({cause}): retrying its pulls one by one");
                let failed: Vec<(u64, String)> =
                    ready.iter().filter(|(number, _)| pulls.contains(number)).cloned().collect();
                self.one_by_one(repository, queue, base, &failed).await;
            }
            Err((cause, pulls)) => {
                if !self.handover.is_cancelled() {
                    for number in pulls {
                        self.eject(repository, queue, number, cause.clone()).await;
                    }
                }
            }
        }
    }

    /// After a failed batch, its pulls one at a time, each tried with those accepted before it:
    /// one that fails is ejected, and the last batch that passed lands.
    async fn one_by_one(
        self: &Arc<Self>,
        repository: &Repository,
        queue: &mut QueueState,
        base: &str,
        pulls: &[(u64, String)],
    ) {
        let mut accepted: Vec<(u64, String)> = Vec::new();
        let mut passed: Option<String> = None;
        for pull in pulls {
            let trial: Vec<(u64, String)> = accepted.iter().cloned().chain([pull.clone()]).collect();
            match self.try_batch(repository, queue, base, &trial).await {
                Ok(Some((commit, _, _))) => {
                    accepted.push(pull.clone());
                    passed = Some(commit);
                }
                Ok(None) => {}
                Err((cause, _)) if self.handover.is_cancelled() => {
                    tracing::info!("merge queue stopped: {cause}");
                    return;
                }
                Err((cause, _)) => {
                    let reason =
                        if accepted.is_empty() { cause } else { format!("fails together with the batch ({cause})") };
                    self.eject(repository, queue, pull.0, reason).await;
                }
            }
        }
        if let Some(commit) = passed {
            let numbers: Vec<u64> = accepted.iter().map(|(number, _)| *number).collect();
            self.land(repository, queue, base, &commit, &numbers).await;
        }
    }

    /// Makes and checks the batch of `pulls` on `base`: conflicting pulls are ejected; `Ok`
    /// with its commit and pulls when it passed (`None` when nothing was left to batch), `Err`
    /// with the cause and its pulls when it failed.
    #[allow(clippy::type_complexity)]
    async fn try_batch(
        self: &Arc<Self>,
        repository: &Repository,
        queue: &mut QueueState,
        base: &str,
        pulls: &[(u64, String)],
    ) -> Result<Option<(String, Vec<u64>, Vec<String>)>, (String, Vec<u64>)> {
        let branch = queue.branch.clone();
        let all: Vec<u64> = pulls.iter().map(|(number, _)| *number).collect();
        let batch = match self.forge.batch(repository, &branch, base, pulls).await {
            Ok(batch) => batch,
            Err(error) => return Err((format!("cannot make the batch: {error:#}"), all)),
        };
        for (number, files) in &batch.conflicts {
            let reason = format!("conflicts with {branch} at {} (with the pulls before it)", files.join(", "));
            self.eject(repository, queue, *number, reason).await;
        }
        let Some(commit) = batch.commit else { return Ok(None) };
        for entry in queue.entries.iter_mut().filter(|entry| batch.pulls.contains(&entry.number)) {
            if !entry.state.is_final() {
                entry.state = EntryState::InBatch;
                entry.batch = Some(commit.clone());
            }
        }
        let index = queue.start_batch(BatchRecord {
            commit: commit.clone(),
            base: base.to_string(),
            pulls: batch.pulls.clone(),
            status: BatchStatus::Running,
            runs: Vec::new(),
            cause: None,
        });
        self.save_queue(repository, queue);
        let outcome = self.batch_checks(repository, &branch, base, &commit).await;
        let result = match outcome {
            Ok(Err(reason)) => Err((reason, batch.pulls.clone())),
            Ok(Ok(outcome)) => match outcome {
                outcome if outcome.passed => Ok(Some((commit.clone(), batch.pulls.clone(), outcome.runs))),
                outcome => {
                    let cause = match &outcome.failed {
                        Some(workflow) => format!("batch {workflow} failed"),
                        None => STOPPED.to_string(),
                    };
                    if let Some(record) = queue.batches.get_mut(index) {
                        record.runs = outcome.runs;
                    }
                    Err((cause, batch.pulls.clone()))
                }
            },
            Err(error) => Err((format!("cannot check out the batch: {error:#}"), batch.pulls.clone())),
        };
        if let Some(record) = queue.batches.get_mut(index) {
            match &result {
                Ok(Some((_, _, runs))) => {
                    record.status = BatchStatus::Passed;
                    record.runs = runs.clone();
                }
                Ok(None) => {}
                // Stopped before its checks ended (SIGTERM): not a failure; the next start
                // batches its pulls again and reuses the checks that passed.
                Err((cause, _)) if cause == STOPPED => {
                    record.status = BatchStatus::Stopped;
                    record.cause = Some(format!("{STOPPED} before it landed"));
                }
                Err((cause, _)) => {
                    record.status = BatchStatus::Failed;
                    record.cause = Some(cause.clone());
                }
            }
        }
        self.save_queue(repository, queue);
        result
    }

    /// Moves the branch to a passed batch and marks its pulls merged; when the branch moved
    /// under it, its pulls wait for their pre-flights again on the new base.
    async fn land(
        self: &Arc<Self>,
        repository: &Repository,
        queue: &mut QueueState,
        base: &str,
        commit: &str,
        pulls: &[u64],
    ) {
        let branch = queue.branch.clone();
        let landed = self.forge.land(repository, &branch, commit, pulls).await;
        let record = queue.batches.iter_mut().rev().find(|record| record.commit == commit);
        match landed {
            Ok(()) => {
                if let Some(record) = record {
                    record.status = BatchStatus::Landed;
                }
                for number in pulls {
                    if let Some(entry) = queue.active_mut(*number) {
                        entry.state = EntryState::Merged;
                        entry.reason = None;
                        entry.batch = Some(commit.to_string());
                    }
                }
                tracing::info!(repository = %repository.url, "landed {commit} on {branch} (pulls {pulls:?})");
                self.save_queue(repository, queue);
            }
            Err(error) => {
                let cause = one_line(&format!("{error:#}"));
                if let Some(record) = record {
                    record.status = BatchStatus::Stale;
                    record.cause = Some(cause.clone());
                }
                let moved =
                    self.forge.refresh(repository).await.ok().and_then(|now| now.branches.get(&branch).cloned());
                for number in pulls {
                    if moved.as_deref() == Some(base) {
                        self.eject(repository, queue, *number, format!("cannot land: {cause}")).await;
                    } else if let Some(entry) = queue.active_mut(*number) {
                        entry.state = EntryState::Waiting;
                        entry.reason = Some(format!("{branch} moved before the batch landed"));
                    }
                }
                self.save_queue(repository, queue);
            }
        }
    }

    /// Ejects a pull with its reason and takes its ref out of the queue.
    async fn eject(&self, repository: &Repository, queue: &mut QueueState, number: u64, reason: String) {
        tracing::info!(repository = %repository.url, "pull {number} ejected from the queue of {}: {reason}", queue.branch);
        if let Some(entry) = queue.active_mut(number) {
            entry.state = EntryState::Ejected;
            entry.reason = Some(reason);
        }
        match self.forge.dequeue(repository, &queue.branch, number).await {
            Ok(()) => {
                if let Some(entry) = queue.entries.iter_mut().rev().find(|entry| entry.number == number) {
                    entry.dequeued = entry.state == EntryState::Ejected;
                }
            }
            Err(error) => tracing::warn!(repository = %repository.url, "{error:#}"),
        }
        self.save_queue(repository, queue);
    }

    fn save_queue(&self, repository: &Repository, queue: &QueueState) {
        if let Err(error) = QueueStore::new(&self.config.state).save(&repository.key, queue) {
            tracing::error!("merge queue: {error:#}");
        }
        self.config.metrics.queue_saved(&repository.key, queue);
    }
}

/// The cause of a batch whose checks the runner stopped during.
const STOPPED: &str = "the runner stopped";

/// Whether `what` is said for the first time in this process (a log line said once, not
/// every poll); the set is bounded by the repositories watched and their landers.
fn first_time(what: &str) -> bool {
    static SAID: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    SAID.lock().unwrap_or_else(|poison| poison.into_inner()).insert(what.to_string())
}

/// The numbers of the live entries in one of `states`, in queue order.
fn live(queue: &QueueState, states: &[EntryState]) -> Vec<u64> {
    queue.entries.iter().filter(|entry| states.contains(&entry.state)).map(|entry| entry.number).collect()
}

/// The line of a git error that says why (`! [rejected] ...` when there is one), not git's
/// whole multi-line stderr.
fn one_line(text: &str) -> String {
    let mut lines = text.lines().map(str::trim).filter(|line| !line.is_empty());
    let first = lines.clone().next().unwrap_or("").to_string();
    match lines.find(|line| line.contains("[rejected]") || line.contains("[remote rejected]")) {
        Some(reason) if reason != first => format!("{} ({})", first.trim_end_matches(':'), reason),
        _ => first,
    }
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn a_git_error_becomes_one_line() {
        let text = "cannot push: git push failed: To /r\n ! [rejected]        abc -> main (fetch first)\nerror: failed to push some refs\nhint: Updates were rejected\nhint: more\n";
        let line = one_line(text);
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("[rejected]") && line.contains("cannot push"), "{line}");
        assert!(!line.contains("hint"), "{line}");
    }
}
