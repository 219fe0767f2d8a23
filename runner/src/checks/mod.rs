//! Checks: one JSON record per run (repository, commit or pull, workflow, run id) stored under
//! the state folder with atomic writes, and the run's live log beside it.
//!
//! Layout: `<state>/checks/<repository key>/<run id>.json` and `<run id>.log`. A record is
//! rewritten whole (temporary file, then rename) at each change of status; the log file grows
//! line by line while the run goes, capped at [`LOG_CAP`], and is replaced by the engine's final
//! masked log when the run ends.

mod log;
pub mod recovery;
pub mod stored_log;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

pub use log::LiveLog;

use crate::report::{LOG_CAP, OutputFile, RunReport, RunStatus, StepReport, StepStatus};
use crate::workflow::Event;

/// What a run was for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckTarget {
    /// What started it: a push, a pull, or a merge-queue batch (`queue`).
    pub event: Event,
    /// The commit the run executed (for a pull: the temporary merge, once made).
    pub commit: String,
    /// The ref: `refs/heads/<branch>`, or `refs/pulls/<n>/head`.
    pub git_ref: String,
    /// The pull's number, for a pull run.
    pub pull: Option<u64>,
    /// The pull's head commit.
    pub head: Option<String>,
    /// The pull's base branch.
    pub base: Option<String>,
}

impl CheckTarget {
    /// The commit it names for a person: a pull's head (whatever its merge was), else the
    /// commit run.
    pub fn named_commit(&self) -> &str {
        self.head.as_deref().unwrap_or(&self.commit)
    }

    /// Whether a run of `other` is a run of the same thing: the same event, ref and commit (a
    /// pull's head commit, whatever its merge was).
    pub fn same_as(&self, other: &CheckTarget) -> bool {
        self.event == other.event && self.git_ref == other.git_ref && self.named_commit() == other.named_commit()
    }

    /// The branch the run is for: a pull's base, else the branch of `git_ref`; empty for none.
    pub fn branch(&self) -> &str {
        match &self.base {
            Some(base) => base,
            None => self.git_ref.strip_prefix("refs/heads/").unwrap_or(""),
        }
    }
}

/// A cache path's fate in one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheNote {
    /// The path as the workflow names it.
    pub path: String,
    /// Whether the run started from a stored base.
    pub warm: bool,
    /// What happened to the run's layer: `promoted`, `dropped`, or why it was not kept.
    pub outcome: String,
}

/// One check: the record of one run of one workflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckRecord {
    /// The run's id (also its session id and log name).
    pub run_id: String,
    /// The repository as the runner watches it (a path or URL).
    pub repository: String,
    /// The repository's key under the state folder.
    pub repository_key: String,
    /// The workflow's name.
    pub workflow: String,
    /// What the run is for.
    #[serde(flatten)]
    pub target: CheckTarget,
    /// Whether the run was trusted (push) or not (pull).
    pub trusted: bool,
    /// The runner that ran it.
    pub runner_id: String,
    /// Where it is.
    pub status: RunStatus,
    /// Why it did not succeed.
    pub cause: Option<String>,
    /// Each step: while the run goes, those that ended or were skipped and the one running.
    #[serde(default)]
    pub steps: Vec<StepReport>,
    /// While the run goes: the step in `steps` running now (its status is not yet known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_step: Option<usize>,
    /// The outputs (images flagged).
    #[serde(default)]
    pub outputs: Vec<OutputFile>,
    /// Where the outputs were unpacked.
    pub outputs_dir: Option<PathBuf>,
    /// The caches.
    #[serde(default)]
    pub caches: Vec<CacheNote>,
    /// Whether the log was cut at its cap.
    #[serde(default)]
    pub log_truncated: bool,
    /// When it was queued, started and finished (Unix milliseconds).
    pub queued_at: u64,
    /// See `queued_at`.
    pub started_at: Option<u64>,
    /// See `queued_at`.
    pub finished_at: Option<u64>,
    /// How long the run took, in milliseconds.
    pub duration_ms: Option<u64>,
    /// Whether this runner published it to the forge for the lander (a pre-flight pinned to
    /// it); a published check that is taken away again asks for a new run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub published: bool,
    /// The run this one repeats (`knotless-run rerun`, or a run queued again after the runner
    /// stopped before it started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reruns: Option<String>,
    /// The runs that repeat this one, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub run_again_as: Vec<String>,
    /// The variables the one who asked for the run gave (a manual run's inputs, a rerun's
    /// `--env`): a rerun of this run gets them again. Never secrets.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub variables: std::collections::BTreeMap<String, String>,
}

impl CheckRecord {
    /// A new check, queued now: nothing has run yet.
    pub fn queued(
        run_id: String,
        (repository, repository_key): (&str, &str),
        workflow: &str,
        target: &CheckTarget,
        trusted: bool,
        runner_id: &str,
    ) -> CheckRecord {
        CheckRecord {
            run_id,
            repository: repository.to_string(),
            repository_key: repository_key.to_string(),
            workflow: workflow.to_string(),
            target: target.clone(),
            trusted,
            runner_id: runner_id.to_string(),
            status: RunStatus::Queued,
            cause: None,
            steps: Vec::new(),
            running_step: None,
            outputs: Vec::new(),
            outputs_dir: None,
            caches: Vec::new(),
            log_truncated: false,
            published: false,
            reruns: None,
            run_again_as: Vec::new(),
            variables: std::collections::BTreeMap::new(),
            queued_at: now_ms(),
            started_at: None,
            finished_at: None,
            duration_ms: None,
        }
    }

    /// Takes in what the engine reported.
    pub fn finish(&mut self, report: &RunReport) {
        self.status = report.status;
        self.cause = report.cause.clone();
        self.steps = report.steps.clone();
        self.running_step = None;
        self.outputs = report.outputs.clone();
        self.log_truncated = report.log_truncated;
        self.duration_ms = Some(report.duration_ms);
        self.finished_at = Some(now_ms());
    }

    /// Ends a run that never produced a report.
    pub fn end(&mut self, status: RunStatus, cause: impl Into<String>) {
        self.status = status;
        self.cause = Some(cause.into());
        // A step running when the run ended without a report ended with it.
        if let Some(step) = self.running_step.take().and_then(|at| self.steps.get_mut(at)) {
            step.status = if status == RunStatus::Cancelled { StepStatus::Cancelled } else { StepStatus::Error };
        }
        self.finished_at = Some(now_ms());
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The store of checks under a state folder.
#[derive(Debug, Clone)]
pub struct CheckStore {
    root: PathBuf,
}

impl CheckStore {
    /// The store under `<state>/checks`.
    pub fn new(state: &Path) -> CheckStore {
        CheckStore { root: state.join("checks") }
    }

    /// The folder of one repository's checks.
    pub fn repository_dir(&self, repository_key: &str) -> PathBuf {
        self.root.join(repository_key)
    }

    /// The record file of a run.
    pub fn record_path(&self, repository_key: &str, run_id: &str) -> PathBuf {
        self.repository_dir(repository_key).join(format!("{run_id}.json"))
    }

    /// The log file of a run.
    pub fn log_path(&self, repository_key: &str, run_id: &str) -> PathBuf {
        self.repository_dir(repository_key).join(format!("{run_id}.log"))
    }

    /// Writes a record atomically.
    pub fn put(&self, record: &CheckRecord) -> anyhow::Result<()> {
        let path = self.record_path(&record.repository_key, &record.run_id);
        let text = serde_json::to_vec_pretty(record).context("cannot encode a check record")?;
        write_atomic(&path, &text)
    }

    /// Reads one record.
    pub fn get(&self, repository_key: &str, run_id: &str) -> anyhow::Result<CheckRecord> {
        read_record(&self.record_path(repository_key, run_id))
    }

    /// Replaces a run's log with its final text, atomically.
    pub fn put_log(&self, repository_key: &str, run_id: &str, text: &str) -> anyhow::Result<()> {
        write_atomic(&self.log_path(repository_key, run_id), text.as_bytes())
    }

    /// A live log file for a run (created empty).
    pub fn live_log(&self, repository_key: &str, run_id: &str) -> anyhow::Result<LiveLog> {
        LiveLog::create(&self.log_path(repository_key, run_id), LOG_CAP)
    }

    /// The repository keys that have checks.
    pub fn repository_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| entry.path().is_dir())
            .filter_map(|entry| entry.file_name().into_string().ok())
            .collect();
        keys.sort();
        keys
    }

    /// Every record of a repository, oldest first; a record that cannot be read is logged and
    /// passed over.
    pub fn list(&self, repository_key: &str) -> anyhow::Result<Vec<CheckRecord>> {
        let (records, unreadable) = self.list_readable(repository_key)?;
        for error in unreadable {
            tracing::warn!("{error:#}");
        }
        Ok(records)
    }

    /// Every record of a repository that can be read, oldest first, and why each other could
    /// not: one damaged record never hides the rest.
    pub fn list_readable(&self, repository_key: &str) -> anyhow::Result<(Vec<CheckRecord>, Vec<anyhow::Error>)> {
        let dir = self.repository_dir(repository_key);
        let (mut records, mut unreadable) = (Vec::new(), Vec::new());
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok((records, unreadable)),
            Err(error) => return Err(error).with_context(|| format!("cannot list {}", dir.display())),
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|extension| extension == "json") {
                match read_record(&path) {
                    Ok(record) => records.push(record),
                    Err(error) => unreadable.push(error),
                }
            }
        }
        records.sort_by(|a, b| (a.queued_at, &a.run_id).cmp(&(b.queued_at, &b.run_id)));
        Ok((records, unreadable))
    }

    /// Finds a run's record by its id alone.
    pub fn find(&self, run_id: &str) -> Option<CheckRecord> {
        self.repository_keys().into_iter().find_map(|key| self.get(&key, run_id).ok())
    }
}

fn read_record(path: &Path) -> anyhow::Result<CheckRecord> {
    let text = std::fs::read(path).with_context(|| format!("cannot read the check {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("the check {} is not a check record", path.display()))
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename, so a
/// reader sees the old content or the new, never a part. It waits for the disk (`fsync`), off
/// the async workers ([`off_the_workers`]), and returns once the file is there.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    off_the_workers(|| {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut file = tempfile::NamedTempFile::new_in(dir)
            .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
        file.write_all(bytes).with_context(|| format!("cannot write {}", path.display()))?;
        file.as_file().sync_all().with_context(|| format!("cannot sync {}", path.display()))?;
        file.persist(path)
            .map_err(|error| error.error)
            .with_context(|| format!("cannot replace {}", path.display()))?;
        Ok(())
    })
}

/// Runs `work`, which blocks on the disk, where it is called without stalling the tasks of the
/// worker it runs on: on a multi-thread runtime (the daemon's) the worker first hands its other
/// tasks to another (`block_in_place`); on a blocking thread, outside a runtime or on a
/// current-thread one (a test's), it just runs. The callers that need a record on disk before
/// they go on (a check before its run starts, `state.json` before a handover) keep that order.
pub fn off_the_workers<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(run_id: &str, queued_at: u64) -> CheckRecord {
        let target = CheckTarget {
            event: Event::Push,
            commit: "abc".into(),
            git_ref: "refs/heads/main".into(),
            pull: None,
            head: None,
            base: None,
        };
        let mut record = CheckRecord::queued(run_id.into(), ("/srv/demo", "demo-1"), "build", &target, true, "r");
        record.queued_at = queued_at;
        record
    }

    /// A write from a multi-thread runtime's worker leaves the worker's other tasks running
    /// while it waits for the disk: a task spawned just before it runs while it is held.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_write_waits_for_the_disk_off_the_async_worker() {
        // On the only worker (the test's own body runs on the main thread, which runs no task).
        let seen = tokio::spawn(async {
            let (ticked, mut tick) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                let _ = ticked.send(());
            });
            off_the_workers(|| {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while std::time::Instant::now() < deadline {
                    if tick.try_recv().is_ok() {
                        return true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                false
            })
        });
        assert!(seen.await.expect("the task"), "the worker's other task did not run while the write held it");
        let folder = tempfile::tempdir().expect("tempdir");
        let path = folder.path().join("record.json");
        write_atomic(&path, b"{}").expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"{}");
    }

    #[test]
    fn a_run_ended_without_a_report_ends_its_running_step_and_a_finished_one_runs_none() {
        let step = |name: &str, status| StepReport {
            name: name.into(),
            status,
            exit_code: None,
            duration_ms: 0,
            reason: None,
        };
        let mut stopped = record("a", 1);
        stopped.status = RunStatus::Running;
        stopped.steps = vec![step("build", StepStatus::Success), step("test", StepStatus::Skipped)];
        stopped.running_step = Some(1);
        stopped.end(RunStatus::Error, "the runner stopped during this run");
        assert_eq!(stopped.running_step, None);
        assert_eq!(stopped.steps[0].status, StepStatus::Success);
        assert_eq!(stopped.steps[1].status, StepStatus::Error, "it was running, not skipped");
        let text = serde_json::to_string(&stopped).expect("encode");
        assert!(!text.contains("running_step"), "{text}");
        let mut finished = record("b", 1);
        finished.running_step = Some(0);
        let report = RunReport {
            run_id: "b".into(),
            workflow: "build".into(),
            status: RunStatus::Success,
            cause: None,
            steps: vec![step("build", StepStatus::Success)],
            outputs: Vec::new(),
            duration_ms: 5,
            log_truncated: false,
            log: String::new(),
        };
        finished.finish(&report);
        assert_eq!(finished.running_step, None);
    }

    #[test]
    fn a_damaged_record_is_named_and_never_hides_the_others() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CheckStore::new(dir.path());
        store.put(&record("a", 1)).expect("put");
        store.put(&record("c", 3)).expect("put");
        let damaged = store.record_path("demo-1", "b");
        std::fs::write(&damaged, b"{\"run_id\": \"b\", ").expect("write");
        let (records, unreadable) = store.list_readable("demo-1").expect("list");
        assert_eq!(records.iter().map(|record| record.run_id.as_str()).collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(unreadable.len(), 1);
        let why = format!("{:#}", unreadable[0]);
        assert!(why.contains(&damaged.display().to_string()) && why.contains("not a check record"), "{why}");
        assert_eq!(store.list("demo-1").expect("list").len(), 2);
    }

    #[test]
    fn records_round_trip_and_list_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CheckStore::new(dir.path());
        store.put(&record("b", 2)).expect("put");
        store.put(&record("a", 1)).expect("put");
        let listed: Vec<_> = store.list("demo-1").expect("list").into_iter().map(|r| r.run_id).collect();
        assert_eq!(listed, ["a", "b"]);
        assert_eq!(store.find("b").expect("found").queued_at, 2);
        assert!(store.find("c").is_none());
    }
}
