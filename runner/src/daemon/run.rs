//! One run in the daemon: its check set running, the disk floor, its secrets (trusted runs
//! only), its cache leases, the engine, then the cache settled and the check finished.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::Daemon;
use super::schedule::Job;
use crate::cache::check_disk_floor;
use crate::checks::{CacheNote, CheckRecord, now_ms};
use crate::engine::{self, RunPlan};
use crate::forge::Forge;
use crate::report::{LogLine, LogSink, RunStatus, StepReport};
use crate::secrets::{SEALED_FILE, open_sealed_file, read_operator_file};
use crate::state::InFlightStatus;

/// Saves a running check's record with its steps as far as they have got.
type StepsSaver = Box<dyn FnMut(&[StepReport], Option<usize>) + Send>;

/// A sink that feeds the check's live log, keeps the daemon's own notes for the final log, and
/// saves the check's steps as they start and end (the status page shows them).
struct Tee {
    live: Option<Box<dyn LogSink>>,
    steps: Option<StepsSaver>,
}

impl Tee {
    fn note(&mut self, kept: &mut String, text: &str) {
        let line = LogLine { step: None, stream: None, text };
        if let Some(live) = self.live.as_mut() {
            live.line(&line);
            live.flush();
        }
        kept.push_str(&line.render());
        kept.push('\n');
    }
}

impl LogSink for Tee {
    fn line(&mut self, line: &LogLine<'_>) {
        if let Some(live) = self.live.as_mut() {
            live.line(line);
        }
    }

    fn flush(&mut self) {
        if let Some(live) = self.live.as_mut() {
            live.flush();
        }
    }

    fn steps(&mut self, steps: &[StepReport], running: Option<usize>) {
        if let Some(save) = self.steps.as_mut() {
            save(steps, running);
        }
    }
}

impl<F: Forge> Daemon<F> {
    /// Runs one job to its end; its check is final when this returns.
    pub(super) async fn run_job(self: Arc<Self>, job: Job) -> RunStatus {
        let Job { repository, workflow, prepared, mut check, changed } = job;
        if self.skipped(&repository, &workflow, &mut check, changed.as_deref()) {
            return RunStatus::Skipped;
        }
        let span = tracing::info_span!(
            "run",
            repository = %repository.url,
            commit = %check.target.commit,
            workflow = %workflow.name,
            run_id = %check.run_id
        );
        async {
            let live = self.started(&mut check, &workflow.name);
            let (saver, writer) = self.steps_writer(&check);
            let mut tee = Tee { live, steps: Some(saver) };
            let mut prelude = String::new();
            if let Err(cause) = check_disk_floor(&self.config.state, self.config.disk_floor) {
                tee.note(&mut prelude, &format!("error: {cause}"));
                check.end(RunStatus::Error, cause);
                self.finish(&check, &prelude);
                return check.status;
            }
            let trusted = check.trusted;
            let secrets = if trusted {
                self.secrets_for(&repository, &mut tee, &mut prelude).await
            } else {
                tee.note(&mut prelude, "an untrusted run: no secrets, an apart cache base, no cache kept");
                BTreeMap::new()
            };
            let leases =
                match self.caches.lease(&repository.key, &workflow.name, &workflow.cache, trusted, &check.run_id) {
                    Ok(leases) => leases,
                    Err(error) => {
                        tee.note(&mut prelude, &format!("caches off for this run: {error:#}"));
                        Vec::new()
                    }
                };
            let outputs_dir = self.config.state.join("outputs").join(&repository.key).join(&check.run_id);
            check.outputs_dir = Some(outputs_dir.clone());
            let plan = RunPlan {
                check_key: format!("{}/{}/{}", repository.key, check.target.commit, workflow.name),
                workflow: workflow.clone(),
                run_id: check.run_id.clone(),
                repository: repository.url.clone(),
                commit: prepared.commit.clone(),
                git_ref: prepared.git_ref.clone(),
                branch: check.target.branch().to_string(),
                changed: changed.clone(),
                event: check.target.event,
                checkout: prepared.checkout.clone(),
                secrets,
                extra_env: self.step_env_of(&check),
                outputs_dir: Some(outputs_dir),
                keep: self.config.keep,
                limits: engine::Limits::default(),
                caches: leases,
            };
            let never = CancellationToken::new();
            let report = engine::execute(&self.host, &plan, &mut tee, &never).await;
            // The last step's record is written before the final one, never after it.
            tee.steps = None;
            let _ = writer.await;
            let mut epilogue = String::new();
            let promote = trusted && report.status == RunStatus::Success;
            let notes =
                self.settle_caches(&repository.key, &check.run_id, &plan, promote, &mut tee, &mut epilogue).await;
            check.finish(&report);
            check.caches = notes;
            self.ended(&check, &format!("{prelude}{}{epilogue}", report.log));
            check.status
        }
        .instrument(span)
        .await
    }

    /// Ends `check` skipped, with the reason in its log, when the workflow's `if` is false for it.
    fn skipped(
        &self,
        repository: &crate::forge::Repository,
        workflow: &crate::workflow::Workflow,
        check: &mut CheckRecord,
        changed: Option<&[String]>,
    ) -> bool {
        let facts = crate::workflow::Facts {
            event: check.target.event.as_str(),
            branch: check.target.branch(),
            git_ref: &check.target.git_ref,
            changed,
            env: &BTreeMap::new(),
            failed: false,
        };
        let Some(reason) = workflow.skip_reason(facts, &self.config.step_env) else { return false };
        tracing::info!(repository = %repository.url, workflow = %workflow.name, run_id = %check.run_id, "not run: {reason}");
        check.end(RunStatus::Skipped, reason.clone());
        self.finish(check, &format!("==> skipped: {reason}\n"));
        true
    }

    /// Stores an ended run's whole log and makes its check final.
    fn ended(&self, check: &CheckRecord, log: &str) {
        if let Err(error) = self.forge.put_log(check, log) {
            tracing::error!("cannot store the log: {error:#}");
        }
        let status = check.status.as_str();
        tracing::info!(status, "run {} of {} ended {status}", check.run_id, check.workflow);
        self.finish(check, "");
    }

    /// Marks the run running, in its record and in `state.json`, and opens its live log (a run
    /// goes on without one the forge cannot open).
    fn started(&self, check: &mut CheckRecord, workflow: &str) -> Option<Box<dyn LogSink>> {
        check.status = RunStatus::Running;
        check.started_at = Some(now_ms());
        self.put_check(check);
        self.state.update(|state| {
            if let Some(entry) = state.in_flight.get_mut(&check.run_id) {
                entry.status = InFlightStatus::Running;
            }
        });
        tracing::info!("run {} of {workflow} started", check.run_id);
        match self.forge.run_output(check) {
            Ok(live) => Some(live),
            Err(error) => {
                tracing::error!("cannot open the live log: {error:#}");
                None
            }
        }
    }

    /// A writer of the run's record with its steps as far as they got, off the run's thread: the
    /// latest state wins, in order, and the run never waits for a disk. The caller drops the
    /// saver and awaits the writer before it writes the final record.
    fn steps_writer(self: &Arc<Self>, check: &CheckRecord) -> (StepsSaver, tokio::task::JoinHandle<()>) {
        let (latest, mut pending) = tokio::sync::watch::channel(None::<CheckRecord>);
        let daemon = Arc::clone(self);
        let writer = tokio::spawn(async move {
            while pending.changed().await.is_ok() {
                let Some(record) = pending.borrow_and_update().clone() else { continue };
                let daemon = Arc::clone(&daemon);
                let _ = tokio::task::spawn_blocking(move || daemon.put_check(&record)).await;
            }
        });
        let mut check = check.clone();
        let saver = Box::new(move |steps: &[StepReport], running: Option<usize>| {
            check.steps = steps.to_vec();
            check.running_step = running;
            latest.send_replace(Some(check.clone()));
        }) as StepsSaver;
        (saver, writer)
    }

    /// The variables every step of a run gets from the daemon: `--env`'s, and the run it repeats
    /// for a run again.
    fn step_env_of(&self, check: &CheckRecord) -> BTreeMap<String, String> {
        let mut env = self.config.step_env.clone();
        if let Some(repeated) = &check.reruns {
            env.insert(super::RERUN_OF.to_string(), repeated.clone());
        }
        env
    }

    /// Settles the run's cache leases, on which the engine recorded which layers came back
    /// whole: promoted when `promote` and the disk floor allows, else dropped; each outcome is a
    /// line of the log's epilogue.
    async fn settle_caches(
        &self,
        repository: &str,
        run_id: &str,
        plan: &RunPlan,
        mut promote: bool,
        tee: &mut Tee,
        epilogue: &mut String,
    ) -> Vec<CacheNote> {
        if promote
            && !plan.caches.is_empty()
            && let Err(cause) = check_disk_floor(&self.config.state, self.config.disk_floor)
        {
            tee.note(epilogue, &format!("caches not kept: {cause}"));
            promote = false;
        }
        let notes = self.caches.settle(repository, &plan.workflow.name, run_id, &plan.caches, promote).await;
        for note in &notes {
            let warm = if note.warm { "warm" } else { "cold" };
            tee.note(epilogue, &format!("cache {} (started {warm}): {}", note.path, note.outcome));
        }
        notes
    }

    /// The secrets a trusted run is granted: the repository's sealed values (its default
    /// branch), under the operator's values.
    async fn secrets_for(
        &self,
        repository: &crate::forge::Repository,
        tee: &mut Tee,
        prelude: &mut String,
    ) -> BTreeMap<String, String> {
        let mut granted = BTreeMap::new();
        match self.forge.read_default(repository, SEALED_FILE).await {
            Ok(Some(text)) => {
                let (opened, problems) = open_sealed_file(&self.key, &text);
                granted.extend(opened);
                for problem in problems {
                    tee.note(prelude, &format!("warning: {problem}"));
                }
            }
            Ok(None) => {}
            Err(error) => tee.note(prelude, &format!("warning: cannot read {SEALED_FILE}: {error:#}")),
        }
        if let Some(path) = &self.config.secrets_file {
            match read_operator_file(path) {
                Ok(values) => granted.extend(values),
                Err(error) => tee.note(prelude, &format!("warning: {error:#}")),
            }
        }
        granted
    }

    /// Stores a final check (and, when given, its whole log) and forgets the run.
    pub(super) fn finish(&self, check: &crate::checks::CheckRecord, log: &str) {
        if !log.is_empty()
            && let Err(error) = self.forge.put_log(check, log)
        {
            tracing::error!("cannot store the log of {}: {error:#}", check.run_id);
        }
        self.put_check(check);
        self.config.metrics.run_ended(check);
        self.state.update(|state| state.in_flight.remove(&check.run_id));
    }

    /// Writes a check; one that cannot be written now (a full disk) is written again at each
    /// look until it is.
    pub(super) fn put_check(&self, check: &crate::checks::CheckRecord) {
        self.unwritten.put(check, |check| self.forge.put_check(check));
    }
}
