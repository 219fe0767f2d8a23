//! One run in the daemon: its check set running, the disk floor, its secrets (trusted runs
//! only), its cache leases, the engine, then the cache settled and the check finished.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::Daemon;
use super::schedule::Job;
use crate::cache::check_disk_floor;
use crate::checks::now_ms;
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
        let facts = crate::workflow::Facts {
            event: check.target.event.as_str(),
            branch: check.target.branch(),
            git_ref: &check.target.git_ref,
            changed: changed.as_deref(),
            env: &BTreeMap::new(),
            failed: false,
        };
        if let Some(reason) = workflow.skip_reason(facts, &self.config.step_env) {
            tracing::info!(repository = %repository.url, workflow = %workflow.name, run_id = %check.run_id, "not run: {reason}");
            check.end(RunStatus::Skipped, reason.clone());
            self.finish(&check, &format!("==> skipped: {reason}\n"));
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
            check.status = RunStatus::Running;
            check.started_at = Some(now_ms());
            self.put_check(&check);
            self.state.update(|state| {
                if let Some(entry) = state.in_flight.get_mut(&check.run_id) {
                    entry.status = InFlightStatus::Running;
                }
            });
            tracing::info!("run {} of {} started", check.run_id, workflow.name);
            let live = match self.forge.run_output(&check) {
                Ok(live) => Some(live),
                Err(error) => {
                    tracing::error!("cannot open the live log: {error:#}");
                    None
                }
            };
            // The record with its steps as far as they got, written off the run's thread by a
            // writer of its own: the latest state wins, in order, and the run never waits for a
            // disk. It is done before the final record is written.
            let (latest, mut pending) = tokio::sync::watch::channel(None::<crate::checks::CheckRecord>);
            let writer = {
                let daemon = Arc::clone(&self);
                tokio::spawn(async move {
                    while pending.changed().await.is_ok() {
                        let Some(record) = pending.borrow_and_update().clone() else { continue };
                        let daemon = Arc::clone(&daemon);
                        let _ = tokio::task::spawn_blocking(move || daemon.put_check(&record)).await;
                    }
                })
            };
            let saver = {
                let mut check = check.clone();
                Box::new(move |steps: &[StepReport], running: Option<usize>| {
                    check.steps = steps.to_vec();
                    check.running_step = running;
                    latest.send_replace(Some(check.clone()));
                }) as StepsSaver
            };
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
            let event = check.target.event;
            let plan = RunPlan {
                check_key: format!("{}/{}/{}", repository.key, check.target.commit, workflow.name),
                workflow: workflow.clone(),
                run_id: check.run_id.clone(),
                repository: repository.url.clone(),
                commit: prepared.commit.clone(),
                git_ref: prepared.git_ref.clone(),
                branch: check.target.branch().to_string(),
                changed: changed.clone(),
                event,
                checkout: prepared.checkout.clone(),
                secrets,
                extra_env: {
                    let mut env = self.config.step_env.clone();
                    if let Some(repeated) = &check.reruns {
                        env.insert(super::RERUN_OF.to_string(), repeated.clone());
                    }
                    env
                },
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
            let mut promote = trusted && report.status == RunStatus::Success;
            let mut epilogue = String::new();
            if promote
                && !plan.caches.is_empty()
                && let Err(cause) = check_disk_floor(&self.config.state, self.config.disk_floor)
            {
                tee.note(&mut epilogue, &format!("caches not kept: {cause}"));
                promote = false;
            }
            // The plan's leases: the engine recorded on them which layers came back whole.
            let notes = self.caches.settle(&repository.key, &workflow.name, &check.run_id, &plan.caches, promote).await;
            for note in &notes {
                let warm = if note.warm { "warm" } else { "cold" };
                tee.note(&mut epilogue, &format!("cache {} (started {warm}): {}", note.path, note.outcome));
            }
            check.finish(&report);
            check.caches = notes;
            let log = format!("{prelude}{}{epilogue}", report.log);
            if let Err(error) = self.forge.put_log(&check, &log) {
                tracing::error!("cannot store the log: {error:#}");
            }
            tracing::info!(
                status = check.status.as_str(),
                "run {} of {} ended {}",
                check.run_id,
                workflow.name,
                check.status.as_str()
            );
            self.finish(&check, "");
            check.status
        }
        .instrument(span)
        .await
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
