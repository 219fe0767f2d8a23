//! Checks a dead runner left and checks not yet written: the records still `queued` or
//! `running` in the store (found from the records themselves, whatever `state.json` says), the
//! runs a repository's records show already ran, and the records that could not be written
//! (a full disk) kept to be written once they can be.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{CheckRecord, CheckStore, CheckTarget};

/// The most records kept unwritten; past it a record is dropped (with an error in the log),
/// and the next start finds it from its file, still `queued` or `running`.
pub const UNWRITTEN_MAX: usize = 4096;

/// Every readable record of a repository, oldest first; a file that is not a record is
/// skipped with a warning, never an error that hides the others.
pub fn readable_records(store: &CheckStore, repository_key: &str) -> Vec<CheckRecord> {
    store.list(repository_key).unwrap_or_else(|error| {
        tracing::warn!("{error:#}");
        Vec::new()
    })
}

/// Every record of the store still `queued` or `running`. Read at a start by a daemon that
/// holds the state folder's lock, these are all left by a runner that is gone.
pub fn unfinished(store: &CheckStore) -> Vec<CheckRecord> {
    let mut left = Vec::new();
    for key in store.repository_keys() {
        left.extend(readable_records(store, &key).into_iter().filter(|record| !record.status.is_final()));
    }
    left
}

/// Whether `records` hold a run of `workflow` for the same event, ref and commit as `target`
/// (a pull's head commit, whatever its merge was): a run made before this runner's state was
/// lost, which is not run again.
pub fn ran_before(records: &[CheckRecord], workflow: &str, target: &CheckTarget) -> bool {
    records.iter().any(|record| record.workflow == workflow && record.target.same_as(target))
}

/// The records that could not be written, by run id, each the latest version of its check.
#[derive(Debug, Default)]
pub struct Unwritten {
    records: Mutex<BTreeMap<String, CheckRecord>>,
}

impl Unwritten {
    fn records(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, CheckRecord>> {
        self.records.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Writes `record` with `write`; one that cannot be written is kept (replacing an older
    /// version of its check) for [`Unwritten::retry`], and one written forgets any kept.
    pub fn put(&self, record: &CheckRecord, write: impl Fn(&CheckRecord) -> anyhow::Result<()>) {
        let mut records = self.records();
        match write(record) {
            Ok(()) => {
                records.remove(&record.run_id);
            }
            Err(error) => {
                if records.len() >= UNWRITTEN_MAX && !records.contains_key(&record.run_id) {
                    tracing::error!(
                        "cannot write the check of {}: {error:#}; {UNWRITTEN_MAX} checks already wait to be \
                         written, so this one is left to the next start",
                        record.run_id
                    );
                    return;
                }
                tracing::error!("cannot write the check of {}: {error:#}; it is written again later", record.run_id);
                records.insert(record.run_id.clone(), record.clone());
            }
        }
    }

    /// Writes again each record kept; those written are forgotten. Returns how many are left.
    pub fn retry(&self, write: impl Fn(&CheckRecord) -> anyhow::Result<()>) -> usize {
        let mut records = self.records();
        records.retain(|run_id, record| match write(record) {
            Ok(()) => {
                tracing::info!("wrote the check of {run_id}, which could not be written before");
                false
            }
            Err(_) => true,
        });
        records.len()
    }

    /// How many records wait to be written.
    pub fn len(&self) -> usize {
        self.records().len()
    }

    /// Whether no record waits to be written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::RunStatus;
    use crate::workflow::Event;

    fn record(run_id: &str, workflow: &str, commit: &str) -> CheckRecord {
        let target = CheckTarget {
            event: Event::Push,
            commit: commit.into(),
            git_ref: "refs/heads/main".into(),
            pull: None,
            head: None,
            base: None,
        };
        CheckRecord::queued(run_id.into(), ("/srv/demo", "demo-1"), workflow, &target, true, "r")
    }

    #[test]
    fn a_check_that_could_not_be_written_for_lack_of_space_is_written_once_it_can_be() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CheckStore::new(dir.path());
        let mut check = record("run-1", "build", "abc");
        check.status = RunStatus::Running;
        store.put(&check).expect("put");
        let unwritten = Unwritten::default();
        let disk_full = std::sync::atomic::AtomicBool::new(true);
        let write = |record: &CheckRecord| {
            if disk_full.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(anyhow::Error::from(std::io::Error::from_raw_os_error(nix::libc::ENOSPC)));
            }
            store.put(record)
        };
        check.end(RunStatus::Error, "the runner stopped during this run");
        unwritten.put(&check, write);
        assert_eq!(store.get("demo-1", "run-1").expect("record").status, RunStatus::Running);
        assert_eq!(unwritten.retry(write), 1, "still no space: still waiting");
        disk_full.store(false, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(unwritten.retry(write), 0);
        assert_eq!(store.get("demo-1", "run-1").expect("record").status, RunStatus::Error);
        assert!(unwritten.is_empty());
    }

    #[test]
    fn a_later_version_written_forgets_the_one_kept() {
        let unwritten = Unwritten::default();
        let check = record("run-1", "build", "abc");
        unwritten.put(&check, |_| anyhow::bail!("no space"));
        unwritten.put(&check, |_| Ok(()));
        assert!(unwritten.is_empty());
    }

    #[test]
    fn unfinished_records_are_found_whatever_else_the_folder_holds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CheckStore::new(dir.path());
        let mut running = record("run-1", "build", "abc");
        running.status = RunStatus::Running;
        store.put(&running).expect("put");
        store.put(&record("run-2", "test", "abc")).expect("put");
        let mut done = record("run-3", "lint", "abc");
        done.end(RunStatus::Success, "");
        store.put(&done).expect("put");
        std::fs::write(store.record_path("demo-1", "broken"), "{").expect("write");
        let left: Vec<String> = unfinished(&store).into_iter().map(|record| record.run_id).collect();
        assert_eq!(left, ["run-1", "run-2"]);
        let records = readable_records(&store, "demo-1");
        assert!(ran_before(&records, "build", &running.target));
        assert!(!ran_before(&records, "build", &record("x", "build", "def").target));
        assert!(!ran_before(&records, "deploy", &running.target));
    }
}
