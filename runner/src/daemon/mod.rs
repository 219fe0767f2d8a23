//! The daemon: watches the forge's repositories (a poll, or a wake-up on the notify socket),
//! turns new heads and pulls into queued checks, runs them a bounded number at a time, and
//! keeps `state.json` so that a restart finishes what a dead runner left and SIGTERM hands
//! over without losing a check.

mod lander;
mod leftovers;
pub mod notify;
mod prune;
mod queue_runs;
mod rerun;
mod run;
mod schedule;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::state::{self, InFlight, InFlightStatus, RepositoryState, StateFile, StateLock};
pub use rerun::RERUN_OF;
pub use schedule::{new_run_id, selected};

use crate::cache::CacheStore;
use crate::checks::recovery::{self, Unwritten};
use crate::checks::{CheckRecord, CheckStore, CheckTarget};
use crate::forge::{Forge, Repository, Seen, events};
use crate::host::ExecutorHost;
use crate::report::RunStatus;
use crate::secrets::RunnerKey;

/// The cause of a run the runner was in when it stopped.
pub const STOPPED_DURING: &str = "the runner stopped during this run";
/// The cause of a run still waiting when the runner stopped or handed over.
pub const STOPPED_BEFORE: &str = "the runner stopped before this run started";

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The state folder.
    pub state: PathBuf,
    /// This runner's id.
    pub runner_id: String,
    /// Whether pulls start runs (`--pulls`).
    pub pulls: bool,
    /// Whether this runner may land merge queues (`--queue`).
    pub queue: bool,
    /// How often repositories are fetched (`--poll`).
    pub poll: Duration,
    /// How many runs at once (`--concurrency`).
    pub concurrency: usize,
    /// How many repositories are fetched at once (`--fetches`).
    pub fetches: usize,
    /// The operator's secrets file (`--secrets-file`).
    pub secrets_file: Option<PathBuf>,
    /// Below this many free bytes under the state folder a run fails (`--disk-floor`).
    pub disk_floor: u64,
    /// What is kept of ended checks, caches and mirrors (`--retention`, `--retention-max-bytes`).
    pub retention: crate::retention::Retention,
    /// Keep environments (`--keep`).
    pub keep: bool,
    /// Variables for every step of every run (`--env`, `--env-file`).
    pub step_env: std::collections::BTreeMap<String, String>,
    /// The metrics the daemon keeps up to date (served at `/metrics`).
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// The running daemon.
pub struct Daemon<F: Forge> {
    config: DaemonConfig,
    forge: Arc<F>,
    host: Arc<ExecutorHost>,
    key: RunnerKey,
    caches: CacheStore,
    state: StateFile,
    /// The state folder's lock, held for the daemon's life: what is in flight at a start was
    /// left by a daemon that is gone.
    _lock: StateLock,
    /// The check records that could not be written (a full disk), written at each look.
    unwritten: Unwritten,
    slots: Arc<Semaphore>,
    /// The slots of each matrix with a `max-parallel`, by repository, commit, event and
    /// workflow file, while one of its combinations waits or runs.
    matrix_slots: std::sync::Mutex<std::collections::HashMap<String, Arc<Semaphore>>>,
    handover: CancellationToken,
    /// The repositories whose merge queue a task drives now.
    driving: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// The queued pulls whose pre-flights pinned to this runner a task runs now (a runner
    /// that does not land).
    serving: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Every task the daemon starts (rounds, wake-ups, runs, queues): the handover waits for
    /// them all.
    tasks: TaskTracker,
    /// A lock per repository, held from its fetch until what it showed is queued and
    /// remembered, so that a round and a wake-up never both queue the same push.
    looking: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl<F: Forge> Daemon<F> {
    /// A daemon over `forge` and `host`, holding the state folder's `lock`; reads `state.json`
    /// and the secrets key.
    pub fn new(
        config: DaemonConfig,
        forge: F,
        host: Arc<ExecutorHost>,
        caches: CacheStore,
        lock: StateLock,
    ) -> anyhow::Result<Self> {
        let key = RunnerKey::load_or_create(&config.state)?;
        let state = StateFile::load(&config.state)?;
        let metrics = Arc::clone(&config.metrics);
        state.on_change(move |state| metrics.in_flight(state.in_flight.values().map(|run| run.status)));
        let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
        Ok(Daemon {
            config,
            forge: Arc::new(forge),
            host,
            key,
            caches,
            state,
            _lock: lock,
            unwritten: Unwritten::default(),
            slots,
            matrix_slots: std::sync::Mutex::default(),
            handover: CancellationToken::new(),
            driving: std::sync::Mutex::new(std::collections::BTreeSet::new()),
            serving: std::sync::Mutex::new(std::collections::BTreeSet::new()),
            tasks: TaskTracker::new(),
            looking: std::sync::Mutex::default(),
        })
    }

    /// Finishes the checks a dead runner left in flight, found from the records themselves
    /// (whatever `state.json` says, or if it was moved away): under the state folder's lock
    /// every check still `queued` or `running` at a start is a dead runner's. Then sweeps what
    /// dead runs left in the cache store and what the executor left.
    async fn recover(&self) {
        let store = CheckStore::new(&self.config.state);
        for mut check in recovery::unfinished(&store) {
            let (status, cause) = match check.status {
                RunStatus::Running => (RunStatus::Error, STOPPED_DURING),
                _ => (RunStatus::Cancelled, STOPPED_BEFORE),
            };
            check.end(status, cause);
            let (key, run_id) = (&check.repository_key, &check.run_id);
            let log = store.log_path(key, run_id);
            let mut text = std::fs::read_to_string(&log).unwrap_or_default();
            text.push_str(&format!("==> {}: {cause}\n", status.as_str()));
            if let Err(error) = store.put_log(key, run_id, &text) {
                tracing::error!("cannot end the log of {run_id}: {error:#}");
            }
            self.put_check(&check);
            self.config.metrics.run_ended(&check);
            if status == RunStatus::Cancelled {
                self.remember_dropped(&check);
            }
            tracing::warn!(run_id = %run_id, "run {run_id} of {} ended {}: {cause}", check.workflow, status.as_str());
        }
        self.state.update(|state| state.in_flight.clear());
        let swept = crate::cache::leftovers::sweep(&self.config.state);
        if let Some(summary) = swept.summary() {
            tracing::info!("removed what dead runs left in the cache store: {summary}");
        }
        let temporary = leftovers::sweep(&self.config.state);
        if let Some(summary) = temporary.summary() {
            tracing::info!("removed the temporary files a dead runner left in the state folder: {summary}");
        }
        for failure in swept.failures.iter().chain(&temporary.failures) {
            tracing::warn!("{failure}");
        }
        self.config.metrics.swept(swept.removed.len(), swept.failures.len());
        self.config.metrics.swept(temporary.removed.len(), temporary.failures.len());
        let swept = self.host.cleanup(Duration::from_secs(300)).await;
        match &swept {
            Ok(result) => tracing::info!(
                removed = result.removed.len(),
                "startup sweep deleted {} resource(s) left by earlier runs",
                result.removed.len()
            ),
            Err(error) => tracing::error!("the startup sweep failed: {error}"),
        }
        self.state.update(|state| state.last_sweep = Some(state::Sweep::of(&swept)));
    }

    /// Serves until SIGTERM or SIGINT, then hands over: stops taking work, cancels waiting
    /// runs, finishes started ones.
    pub async fn serve(self) -> anyhow::Result<()> {
        let daemon = Arc::new(self);
        daemon.recover().await;
        let (wake_sender, mut wake) = mpsc::channel::<notify::Wake>(notify::WAITING);
        notify::listen(&daemon.config.state, wake_sender)?;
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        daemon.requeue().await;
        daemon.keep_pruning();
        tracing::info!(
            runner_id = %daemon.config.runner_id,
            "knotless-run serving as runner {} with executor {}, {} run(s) at once, state in {}",
            daemon.config.runner_id,
            daemon.host.name(),
            daemon.config.concurrency,
            daemon.config.state.display()
        );
        // A round of every repository runs as a task of its own, the next due `--poll` after
        // it ends; the loop only dispatches, so a wake-up and a signal are served at once, a
        // round running or not.
        let (round_over, mut round_ended) = mpsc::channel::<()>(1);
        let mut round_due = tokio::time::Instant::now();
        let mut round_running = false;
        loop {
            if !daemon.unwritten.is_empty() {
                daemon.unwritten.retry(|check| daemon.forge.put_check(check));
            }
            if !round_running && tokio::time::Instant::now() >= round_due {
                round_running = true;
                let (daemon, round_over) = (Arc::clone(&daemon), round_over.clone());
                daemon.tasks.clone().spawn(async move {
                    let started = std::time::Instant::now();
                    daemon.look(None).await;
                    daemon.config.metrics.poll_took(started.elapsed());
                    let _ = round_over.send(()).await;
                });
            }
            tokio::select! {
                () = tokio::time::sleep_until(round_due), if !round_running => {}
                Some(()) = round_ended.recv() => {
                    round_running = false;
                    round_due = tokio::time::Instant::now() + daemon.config.poll;
                }
                Some(request) = wake.recv() => {
                    let served = Arc::clone(&daemon);
                    daemon.tasks.spawn(async move { served.wake_up(request).await });
                }
                _ = terminate.recv() => break,
                _ = interrupt.recv() => break,
            }
        }
        tracing::info!("stopping: no new work; waiting runs are cancelled, started runs finish");
        daemon.handover.cancel();
        daemon.tasks.close();
        daemon.tasks.wait().await;
        daemon.host.shutdown().await;
        tracing::info!("handed over");
        Ok(())
    }

    /// Serves one request of the notify socket: a look at one repository, a manual run or a
    /// rerun; each answers the one who asked, and a look or a manual run then fetches that
    /// repository alone.
    async fn wake_up(self: Arc<Self>, request: notify::Wake) {
        let look = match request {
            notify::Wake::Look(repository, reply) => match self.watched(&repository).await {
                Ok(found) => {
                    let _ = reply.send(Ok(()));
                    found.url
                }
                Err(why) => {
                    tracing::warn!("refused a notification: {why}");
                    let _ = reply.send(Err(why));
                    return;
                }
            },
            notify::Wake::Trigger(trigger, reply) => {
                let _ = reply.send(self.trigger(&trigger).await);
                trigger.repository
            }
            notify::Wake::Rerun(rerun, reply) => {
                let _ = reply.send(self.rerun(&rerun).await);
                return;
            }
        };
        if !self.handover.is_cancelled() {
            self.look(Some(&look)).await;
        }
    }

    /// The watched repository `name` spells (its URL or path as given to the daemon, that path
    /// by another route or as a `file://` URL, or its key), or why there is none, naming how the
    /// daemon spells the repositories it watches.
    async fn watched(&self, name: &str) -> Result<Repository, String> {
        let repositories =
            self.forge.repositories().await.map_err(|error| format!("cannot list the repositories: {error:#}"))?;
        if let Some(found) = find_watched(&repositories, name) {
            return Ok(found.clone());
        }
        const SHOWN: usize = 5;
        let mut watched: Vec<String> = repositories
            .iter()
            .take(SHOWN)
            .map(|repository| crate::printable::name(&repository.url).into_owned())
            .collect();
        if repositories.len() > SHOWN {
            watched.push(format!("and {} more", repositories.len() - SHOWN));
        }
        Err(format!(
            "this runner does not watch {}; it watches {}",
            crate::printable::name(name),
            if watched.is_empty() { "nothing".to_string() } else { watched.join(", ") }
        ))
    }

    /// Queues a manual run of `trigger.workflow` (every combination of a matrix) on the head
    /// of its branch; the run ids, or why it cannot run, in words for the one who asked.
    async fn trigger(self: &Arc<Self>, trigger: &notify::Trigger) -> Result<Vec<String>, String> {
        use crate::printable;
        let repository = &self.watched(&trigger.repository).await?;
        let snapshot = self.forge.refresh(repository).await.map_err(|error| format!("{error:#}"))?;
        let branch = match (&trigger.branch, &snapshot.default_branch) {
            (Some(branch), _) => branch.trim_start_matches("refs/heads/").to_string(),
            (None, Some(default)) => default.trim_start_matches("refs/heads/").to_string(),
            (None, None) => return Err(format!("{} has no default branch: name one with --ref", repository.url)),
        };
        let Some(commit) = snapshot.branches.get(&branch).cloned() else {
            return Err(format!("{} has no branch {}", repository.url, printable::name(&branch)));
        };
        let event = crate::forge::ForgeEvent::Push { branch: branch.clone(), commit: commit.clone(), before: None };
        let prepared = self
            .forge
            .prepare(repository, &event)
            .await
            .map_err(|error| format!("cannot check out {commit}: {error:#}"))?;
        let (workflows, errors) =
            prepared.checkout.workflows().await.map_err(|error| format!("cannot read the workflows: {error:#}"))?;
        let named: Vec<crate::workflow::Workflow> =
            workflows.into_iter().filter(|workflow| workflow.is_named(&trigger.workflow)).collect();
        let Some(first) = named.first() else {
            let broken = errors.iter().find(|error| error.file.ends_with(&format!("/{}.yml", trigger.workflow)));
            return Err(match broken {
                Some(error) => error.to_string(),
                None => {
                    format!("{} has no workflow {} on {branch}", repository.url, printable::name(&trigger.workflow))
                }
            });
        };
        let manual = self.manual_trigger(first, trigger)?;
        let target = CheckTarget {
            event: crate::workflow::Event::Manual,
            commit: prepared.commit.clone(),
            git_ref: format!("refs/heads/{branch}"),
            pull: None,
            head: None,
            base: None,
        };
        let mut runs = Vec::new();
        for mut workflow in named {
            // Inputs are variables of every step, over the workflow's env.
            workflow.env.extend(manual.inputs.clone());
            workflow.env.extend(trigger.inputs.clone());
            let place = (repository.url.as_str(), repository.key.as_str());
            let check = CheckRecord::queued(
                schedule::new_run_id(&workflow.name),
                place,
                &workflow.name,
                &target,
                true,
                &self.config.runner_id,
            );
            let mut check = check;
            check.variables = trigger.inputs.clone();
            tracing::info!(repository = %repository.url, run_id = %check.run_id, "manual run of {} on {branch} ({commit})", workflow.name);
            runs.push(check.run_id.clone());
            let job = schedule::Job {
                repository: repository.clone(),
                workflow,
                prepared: prepared.clone(),
                check,
                changed: None,
            };
            self.queue_manual(job);
        }
        Ok(runs)
    }

    /// The manual trigger of `workflow`, when it has one, takes the inputs given, and runs on
    /// this runner; else why not, in words for the one who asked.
    fn manual_trigger(
        &self,
        workflow: &crate::workflow::Workflow,
        trigger: &notify::Trigger,
    ) -> Result<crate::workflow::ManualTrigger, String> {
        use crate::printable;
        let Some(manual) = workflow.on.manual.clone() else {
            return Err(format!(
                "workflow {} has no manual trigger: add `manual` to its `on`",
                printable::name(&trigger.workflow)
            ));
        };
        if let Some(unknown) = trigger.inputs.keys().find(|name| !manual.inputs.contains_key(*name)) {
            let declared: Vec<&str> = manual.inputs.keys().map(String::as_str).collect();
            return Err(format!(
                "workflow {} has no input {} (its inputs: {})",
                trigger.workflow,
                printable::name(unknown),
                if declared.is_empty() { "none".to_string() } else { declared.join(", ") }
            ));
        }
        if !schedule::selected(workflow, &self.config.runner_id) {
            return Err(format!(
                "workflow {} runs on runners {}, not this one",
                trigger.workflow,
                workflow.runners.join(", ")
            ));
        }
        Ok(manual)
    }

    /// Queues a manual run: in flight in `state.json`, its check written queued, then run on a
    /// task of its own.
    fn queue_manual(self: &Arc<Self>, job: schedule::Job) {
        let run_id = job.check.run_id.clone();
        self.state.update(|state| {
            state
                .in_flight
                .insert(run_id, InFlight { repository_key: job.repository.key.clone(), status: InFlightStatus::Queued })
        });
        self.put_check(&job.check);
        let daemon = Arc::clone(self);
        self.tasks.spawn(async move {
            daemon.queue(job, Vec::new()).await;
        });
    }

    /// Fetches the repositories (only the one named, when it is watched) and queues the runs of
    /// their events.
    async fn look(self: &Arc<Self>, only: Option<&str>) {
        // A round over repositories that all certainly hold nothing new costs nothing.
        if only.is_none() && self.forge.all_quiet() {
            return;
        }
        let repositories = match self.forge.repositories().await {
            Ok(repositories) => repositories,
            Err(error) => {
                tracing::error!("cannot list the repositories: {error:#}");
                return;
            }
        };
        let same = |watched: &Vec<String>| {
            watched.len() == repositories.len()
                && watched.iter().zip(&repositories).all(|(key, repository)| *key == repository.key)
        };
        if !self.state.read(|state| state.watched.as_ref().is_some_and(same)) {
            let watched = repositories.iter().map(|repository| repository.key.clone()).collect();
            self.state.update(|state| state.watched = Some(watched));
        }
        let wanted: Vec<Repository> = match only {
            Some(name) => find_watched(&repositories, name).into_iter().cloned().collect(),
            // A round passes by what certainly holds nothing new: it costs nothing.
            None => repositories.into_iter().filter(|repository| !self.forge.quiet(repository)).collect(),
        };
        // Fetched `fetches` at a time; each snapshot is looked at as its fetch ends, under its
        // repository's lock, taken before the fetch.
        let mut refreshed = futures::stream::iter(wanted)
            .map(|repository| {
                let daemon = Arc::clone(self);
                async move {
                    let lock = daemon.look_lock(&repository.key);
                    let held = lock.lock_owned().await;
                    let refreshed = daemon.forge.refresh(&repository).await;
                    (repository, held, refreshed)
                }
            })
            .buffer_unordered(self.config.fetches.max(1));
        loop {
            // At the handover the fetches still running are dropped, and their git processes
            // killed: a round never holds up a stop.
            let next = tokio::select! {
                biased;
                () = self.handover.cancelled() => return,
                next = refreshed.next() => next,
            };
            let Some((repository, _held, refreshed)) = next else { return };
            let repository = &repository;
            let snapshot = match refreshed {
                Ok(snapshot) => snapshot,
                Err(error) => {
                    tracing::error!(repository = %repository.url, "{error:#}");
                    continue;
                }
            };
            self.looked(repository, &snapshot).await;
        }
    }

    /// Queues the runs of what a repository's snapshot shows new since its last look (every
    /// head, the first time), remembers it, and lets the merge queue consider it.
    async fn looked(self: &Arc<Self>, repository: &Repository, snapshot: &crate::forge::Snapshot) {
        // A repository as it was at its last look starts nothing: nothing is copied.
        let same = self.state.read(|state| {
            state
                .repositories
                .get(&repository.key)
                .is_some_and(|known| known.url == repository.url && known.seen.shows(snapshot))
        });
        if same {
            self.consider_queue(repository, snapshot).await;
            return;
        }
        let remembered = self.state.read(|state| state.repositories.get(&repository.key).cloned());
        let previous = remembered.as_ref().map(|known| known.seen.clone());
        if previous.is_none() {
            tracing::info!(repository = %repository.url, "watching {} (its current heads run once)", repository.url);
        }
        for (branch, commit) in &snapshot.branches {
            let moved = previous.as_ref().is_some_and(|seen| seen.branches.get(branch) != Some(commit));
            if moved && snapshot.landed.contains(commit) {
                tracing::info!(repository = %repository.url, "{commit} landed on {branch} through the merge queue: no push run, its batch's checks are its checks");
            }
        }
        // A repository this state does not remember may still have checks (state.json was
        // moved away): what they show ran is not run again.
        let known = match &previous {
            None => recovery::readable_records(&CheckStore::new(&self.config.state), &repository.key),
            Some(_) => Vec::new(),
        };
        for event in events(previous.as_ref(), snapshot, self.config.pulls) {
            let (mut jobs, mut ended) = schedule::plan(&*self.forge, repository, &event, &self.config.runner_id).await;
            let new = |check: &CheckRecord| !recovery::ran_before(&known, &check.workflow, &check.target);
            jobs.retain(|job| new(&job.check));
            ended.retain(|check| new(check));
            for check in ended {
                self.put_check(&check);
                self.config.metrics.run_ended(&check);
            }
            self.spawn_jobs(repository, jobs, |_, need| {
                Err(format!("it needs {need}, which does not run for this event on this runner"))
            });
        }
        let now = RepositoryState { url: repository.url.clone(), seen: Seen::of(snapshot) };
        // Written only when it changed: a round of idle repositories writes nothing.
        if remembered.as_ref() != Some(&now) {
            self.state.update(|state| state.repositories.insert(repository.key.clone(), now));
        }
        self.consider_queue(repository, snapshot).await;
    }

    /// The lock of one repository's look.
    fn look_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = knotless_protocol::sdk::lock(&self.looking);
        Arc::clone(locks.entry(key.to_string()).or_default())
    }

    /// Queues `jobs` (of one event, or runs queued again together), each waiting for the jobs
    /// of the list it needs; a need that names none of them is settled by `outside`: `Ok` when
    /// it is met, else the cause of the job's skip.
    fn spawn_jobs(
        self: &Arc<Self>,
        repository: &Repository,
        jobs: Vec<schedule::Job>,
        outside: impl Fn(&schedule::Job, &str) -> Result<(), String>,
    ) {
        // Each job's outcome, for the jobs that need it.
        let outcomes: BTreeMap<String, (Option<String>, watch::Sender<Option<RunStatus>>)> = jobs
            .iter()
            .map(|job| (job.workflow.name.clone(), (job.workflow.base.clone(), watch::channel(None).0)))
            .collect();
        for job in jobs {
            let mut needs = Vec::new();
            let mut unmet = None;
            for need in &job.workflow.needs {
                let named: Vec<_> = outcomes
                    .iter()
                    .filter(|(name, (base, _))| *name == need || base.as_deref() == Some(need.as_str()))
                    .map(|(name, (_, sender))| (need.clone(), name.clone(), sender.subscribe()))
                    .collect();
                if named.is_empty()
                    && unmet.is_none()
                    && let Err(cause) = outside(&job, need)
                {
                    unmet = Some(cause);
                }
                needs.extend(named);
            }
            let done = outcomes.get(&job.workflow.name).map(|(_, sender)| sender.clone());
            if let Some(cause) = unmet {
                let mut check = job.check;
                check.end(RunStatus::Skipped, cause.clone());
                self.finish(&check, &format!("==> skipped: {cause}\n"));
                if let Some(done) = done {
                    done.send_replace(Some(RunStatus::Skipped));
                }
                continue;
            }
            let run_id = job.check.run_id.clone();
            self.state.update(|state| {
                state.in_flight.insert(
                    run_id.clone(),
                    InFlight { repository_key: repository.key.clone(), status: InFlightStatus::Queued },
                )
            });
            self.put_check(&job.check);
            let daemon = Arc::clone(self);
            self.tasks.spawn(async move {
                let status = daemon.queue(job, needs).await;
                if let Some(done) = done {
                    done.send_replace(Some(status));
                }
            });
        }
    }

    /// Waits for the workflows it needs (each `(need, workflow, outcome)`), then for a slot,
    /// then runs; one whose need did not pass ends skipped, one still waiting at handover ends
    /// cancelled. Returns how it ended.
    async fn queue(
        self: Arc<Self>,
        job: schedule::Job,
        needs: Vec<(String, String, watch::Receiver<Option<RunStatus>>)>,
    ) -> RunStatus {
        for (need, name, mut outcome) in needs {
            let ended = tokio::select! {
                biased;
                () = self.handover.cancelled() => None,
                ended = outcome.wait_for(Option::is_some) => ended.ok().and_then(|status| *status),
            };
            match ended {
                Some(RunStatus::Success) => {}
                Some(status) => {
                    let mut check = job.check;
                    let cause = format!("it needs {need}, and {name} {}", status.outcome());
                    check.end(RunStatus::Skipped, cause.clone());
                    tracing::info!(run_id = %check.run_id, "run {} of {} skipped: {cause}", check.run_id, check.workflow);
                    self.finish(&check, &format!("==> skipped: {cause}\n"));
                    return RunStatus::Skipped;
                }
                None => {
                    self.drop_at_handover(job.check);
                    return RunStatus::Cancelled;
                }
            }
        }
        // A combination of a matrix with `max-parallel` takes its matrix's slot first, so that
        // one waiting for it holds none of the runner's.
        let matrix = self.matrix_slots(&job);
        let matrix_permit = match &matrix {
            Some((_, slots)) => tokio::select! {
                biased;
                () = self.handover.cancelled() => None,
                permit = Arc::clone(slots).acquire_owned() => permit.ok().map(Some),
            },
            None => Some(None),
        };
        let slots = Arc::clone(&self.slots);
        let permit = match matrix_permit {
            None => None,
            Some(_) => tokio::select! {
                biased;
                () = self.handover.cancelled() => None,
                permit = slots.acquire_owned() => permit.ok(),
            },
        };
        let ended = match permit {
            Some(_permit) => Arc::clone(&self).run_job(job).await,
            None => {
                self.drop_at_handover(job.check);
                RunStatus::Cancelled
            }
        };
        drop(matrix_permit);
        if let Some((key, slots)) = matrix {
            let mut all = knotless_protocol::sdk::lock(&self.matrix_slots);
            // The last combination of its matrix to end forgets the matrix's slots.
            if Arc::strong_count(&slots) == 2 {
                all.remove(&key);
            }
        }
        ended
    }

    /// The slots of `job`'s matrix when it has a `max-parallel`, with their key.
    fn matrix_slots(&self, job: &schedule::Job) -> Option<(String, Arc<Semaphore>)> {
        let limit = job.workflow.max_parallel?;
        let base = job.workflow.base.as_deref()?;
        let target = &job.check.target;
        let key = format!("{}\n{}\n{}\n{}\n{base}", job.repository.key, target.commit, target.event, target.git_ref);
        let slots = knotless_protocol::sdk::lock(&self.matrix_slots)
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(limit)))
            .clone();
        Some((key, slots))
    }
}

/// The repository of `repositories` that `name` spells: its URL or key, or the same path by
/// another route (relative, through a link, with a trailing `/`) or as a `file://` URL.
fn find_watched<'a>(repositories: &'a [Repository], name: &str) -> Option<&'a Repository> {
    let path = name.strip_prefix("file://").unwrap_or(name);
    let path = if path.len() > 1 { path.trim_end_matches('/') } else { path };
    let mut spellings = vec![name.to_string(), path.to_string()];
    if !path.contains("://") {
        let canonical = crate::forge::normalize_url(path);
        spellings.push(format!("file://{canonical}"));
        spellings.push(canonical);
    }
    let keys: Vec<String> = spellings.iter().map(|spelling| crate::forge::repository_key(spelling)).collect();
    repositories.iter().find(|repository| {
        spellings.iter().any(|spelling| repository.url == *spelling || repository.key == *spelling)
            || keys.contains(&repository.key)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watching(url: &str) -> Repository {
        Repository { key: crate::forge::repository_key(url), url: url.to_string() }
    }

    #[test]
    fn a_watched_repository_is_found_by_every_spelling_and_nothing_else_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = std::fs::canonicalize(dir.path()).expect("canonical").join("demo");
        std::fs::create_dir(&path).expect("mkdir");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).expect("symlink");
        let path = path.display().to_string();
        let other = "ssh://git.example/other.git";
        let repositories = [watching(other), watching(&path)];
        for spelling in [
            path.clone(),
            format!("{path}/"),
            format!("file://{path}"),
            format!("file://{path}/"),
            link.display().to_string(),
            repositories[1].key.clone(),
        ] {
            let found = find_watched(&repositories, &spelling).map(|repository| repository.url.as_str());
            assert_eq!(found, Some(path.as_str()), "{spelling}");
        }
        assert_eq!(find_watched(&repositories, other).map(|repository| repository.url.as_str()), Some(other));
        for stranger in
            ["demo", "/", "", "..", "file://", &format!("{path}2"), "ssh://git.example/other", "/nonexistent"]
        {
            assert_eq!(find_watched(&repositories, stranger), None, "{stranger:?}");
        }
        // Watched as a `file://` URL: its path is a spelling too.
        let by_url = [watching(&format!("file://{path}"))];
        assert!(find_watched(&by_url, &path).is_some());
    }
}
