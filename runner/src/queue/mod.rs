//! The merge queue's record: for each repository and branch, the queued pulls in queue order
//! with their state (waiting for pre-flights, ready, in a batch, merged, ejected and why) and
//! the batches tried, kept as `<state>/queue/<key>/<branch>.json` (atomic writes) by the
//! lander and shown by `knotless-run checks REPO --queue BRANCH`.

mod show;

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

pub use show::render;

use crate::checks::{now_ms, write_atomic};

/// Where a queued pull is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EntryState {
    /// Queued; its pre-flights have not all passed yet.
    Waiting,
    /// Its pre-flights passed; it joins the next batch.
    Ready,
    /// In the batch being checked.
    InBatch,
    /// Landed: its batch moved the branch.
    Merged,
    /// Out of the queue, with a reason.
    Ejected,
    /// Its queue ref was deleted before it landed.
    Removed,
}

impl EntryState {
    /// Its name as shown.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryState::Waiting => "waiting for pre-flights",
            EntryState::Ready => "pre-flights passed",
            EntryState::InBatch => "in batch",
            EntryState::Merged => "merged",
            EntryState::Ejected => "ejected",
            EntryState::Removed => "removed",
        }
    }

    /// Whether the entry is done with the queue.
    pub fn is_final(self) -> bool {
        matches!(self, EntryState::Merged | EntryState::Ejected | EntryState::Removed)
    }
}

/// One queued pull.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The pull's number.
    pub number: u64,
    /// The head queued (the queue ref's commit).
    pub head: String,
    /// Where it is.
    pub state: EntryState,
    /// Why it was ejected (or what it waits for).
    pub reason: Option<String>,
    /// The run ids of its pre-flight checks.
    #[serde(default)]
    pub preflights: Vec<String>,
    /// The batch commit it is in or landed with.
    pub batch: Option<String>,
    /// When it was first seen queued (Unix milliseconds).
    pub queued_at: u64,
    /// Whether the lander took its queue ref out (an ejection); queueing the same head again
    /// after that is a retry.
    #[serde(default)]
    pub dequeued: bool,
    /// Whether it is a retry: its pre-flights run anew instead of reusing finished checks.
    #[serde(default)]
    pub retry: bool,
}

impl Entry {
    /// Whether this entry settles `number` at `head`: a queue ref of them is not queued again
    /// (an ejected entry whose ref was taken out does not: queueing it again retries it).
    pub fn settles(&self, number: u64, head: &str) -> bool {
        self.number == number && self.head == head && !(self.state == EntryState::Ejected && self.dequeued)
    }
}

/// One batch tried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRecord {
    /// The squashed commit.
    pub commit: String,
    /// The base it sits on.
    pub base: String,
    /// Its pulls, in queue order.
    pub pulls: Vec<u64>,
    /// Where it is.
    pub status: BatchStatus,
    /// The run ids of its checks.
    #[serde(default)]
    pub runs: Vec<String>,
    /// Why it failed or did not land.
    pub cause: Option<String>,
}

/// Where a batch is; in records, its lower-case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchStatus {
    /// Its checks run.
    Running,
    /// Its checks passed; it is about to land.
    Passed,
    /// A check did not pass.
    Failed,
    /// The runner stopped before it landed.
    Stopped,
    /// Its branch points at it.
    Landed,
    /// The branch moved under it.
    Stale,
}

impl BatchStatus {
    /// Its name in records and on screens.
    pub fn as_str(self) -> &'static str {
        match self {
            BatchStatus::Running => "running",
            BatchStatus::Passed => "passed",
            BatchStatus::Failed => "failed",
            BatchStatus::Stopped => "stopped",
            BatchStatus::Landed => "landed",
            BatchStatus::Stale => "stale",
        }
    }
}

impl std::fmt::Display for BatchStatus {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// The queue of one branch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    /// The repository as watched.
    pub repository: String,
    /// The branch the pulls land on.
    pub branch: String,
    /// Every pull queued, in queue order (first seen first, then by number).
    pub entries: Vec<Entry>,
    /// The batches, oldest first.
    #[serde(default)]
    pub batches: Vec<BatchRecord>,
}

impl QueueState {
    /// The entry of pull `number` still in the queue.
    pub fn active_mut(&mut self, number: u64) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|entry| entry.number == number && !entry.state.is_final())
    }

    /// Takes in the queue refs now there: a new (number, head) is a new waiting entry; a live
    /// entry whose ref is gone or moved is removed (a moved ref is queued anew). A head that
    /// already landed, or was ejected while its ref stayed, is not queued again; an ejected head
    /// whose ref the lander took out and that is queued again is a retry.
    pub fn sync(&mut self, queued: &std::collections::BTreeMap<u64, String>) {
        for entry in self.entries.iter_mut().filter(|entry| !entry.state.is_final()) {
            if queued.get(&entry.number) != Some(&entry.head) {
                entry.state = EntryState::Removed;
                entry.reason = Some("its queue ref was deleted or moved".into());
            }
        }
        for (number, head) in queued {
            if !self.entries.iter().any(|entry| entry.settles(*number, head)) {
                let retry = self.entries.iter().any(|entry| entry.number == *number && &entry.head == head);
                self.entries.push(Entry {
                    number: *number,
                    head: head.clone(),
                    state: EntryState::Waiting,
                    reason: None,
                    preflights: Vec::new(),
                    batch: None,
                    queued_at: now_ms(),
                    dequeued: false,
                    retry,
                });
            }
        }
    }

    /// Records that the checks of `batch` start and gives its place in [`QueueState::batches`]:
    /// a batch of the same commit tried before (the same pulls on the same base, as when the
    /// pulls of a failed batch are tried again one by one, or after a stop) is updated in
    /// place, never listed twice.
    pub fn start_batch(&mut self, batch: BatchRecord) -> usize {
        match self.batches.iter().position(|record| record.commit == batch.commit) {
            Some(index) => {
                self.batches[index] = batch;
                index
            }
            None => {
                self.batches.push(batch);
                self.batches.len() - 1
            }
        }
    }

    /// Whether a pull waits or is ready.
    pub fn is_busy(&self) -> bool {
        self.entries.iter().any(|entry| !entry.state.is_final())
    }
}

/// The queue files under a state folder.
#[derive(Debug, Clone)]
pub struct QueueStore {
    root: PathBuf,
}

impl QueueStore {
    /// The store under `<state>/queue`.
    pub fn new(state: &Path) -> QueueStore {
        QueueStore { root: state.join("queue") }
    }

    fn path(&self, repository_key: &str, branch: &str) -> PathBuf {
        self.root.join(repository_key).join(format!("{}.json", branch.replace('%', "%25").replace('/', "%2F")))
    }

    /// The queue of a branch (empty when none was kept).
    pub fn load(&self, repository_key: &str, branch: &str) -> anyhow::Result<Option<QueueState>> {
        let path = self.path(repository_key, branch);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(
                serde_json::from_slice(&bytes).with_context(|| format!("{} is not a queue record", path.display()))?,
            )),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// The branches of a repository with a kept queue, sorted.
    pub fn branches(&self, repository_key: &str) -> Vec<String> {
        let mut branches: Vec<String> = std::fs::read_dir(self.root.join(repository_key))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter_map(|name| name.strip_suffix(".json").map(|stem| stem.replace("%2F", "/").replace("%25", "%")))
            .collect();
        branches.sort();
        branches
    }

    /// Writes a branch's queue atomically.
    pub fn save(&self, repository_key: &str, queue: &QueueState) -> anyhow::Result<()> {
        let text = serde_json::to_vec_pretty(queue).context("cannot encode a queue record")?;
        write_atomic(&self.path(repository_key, &queue.branch), &text)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn refs_become_entries_in_order_and_a_moved_ref_is_queued_anew() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = QueueStore::new(dir.path());
        let mut queue = QueueState { repository: "r".into(), branch: "release/1".into(), ..QueueState::default() };
        queue.sync(&BTreeMap::from([(2, "b".to_string()), (1, "a".to_string())]));
        queue.entries[0].state = EntryState::Merged;
        queue.sync(&BTreeMap::from([(1, "a".to_string()), (2, "c".to_string())]));
        let shown: Vec<_> = queue.entries.iter().map(|e| (e.number, e.head.as_str(), e.state)).collect();
        assert_eq!(shown, [(1, "a", EntryState::Merged), (2, "b", EntryState::Removed), (2, "c", EntryState::Waiting)]);
        assert!(queue.is_busy());
        store.save("k", &queue).expect("save");
        assert_eq!(store.load("k", "release/1").expect("load"), Some(queue));
        assert_eq!(store.load("k", "main").expect("load"), None);
        assert_eq!(store.branches("k"), ["release/1"]);
    }

    fn batch(commit: &str, pulls: &[u64]) -> BatchRecord {
        BatchRecord {
            commit: commit.into(),
            base: "base".into(),
            pulls: pulls.to_vec(),
            status: BatchStatus::Running,
            runs: Vec::new(),
            cause: None,
        }
    }

    #[test]
    fn a_batch_tried_again_is_listed_once_and_updated_in_place() {
        let mut queue = QueueState { repository: "r".into(), branch: "main".into(), ..QueueState::default() };
        let first = queue.start_batch(batch("c34", &[3, 4]));
        queue.batches[first].status = BatchStatus::Failed;
        queue.batches[first].cause = Some("batch together failed".into());
        let alone = queue.start_batch(batch("c3", &[3]));
        queue.batches[alone].status = BatchStatus::Passed;
        // 3 passed alone; 3 then 4 makes the first batch's commit again.
        let again = queue.start_batch(batch("c34", &[3, 4]));
        assert_eq!(again, first);
        queue.batches[again].status = BatchStatus::Failed;
        let shown: Vec<_> = queue.batches.iter().map(|b| (b.commit.as_str(), b.status)).collect();
        assert_eq!(shown, [("c34", BatchStatus::Failed), ("c3", BatchStatus::Passed)]);
    }

    #[test]
    fn an_ejected_head_queued_again_after_its_ref_was_taken_out_is_a_retry() {
        let mut queue = QueueState { repository: "r".into(), branch: "main".into(), ..QueueState::default() };
        let refs = BTreeMap::from([(1, "a".to_string())]);
        queue.sync(&refs);
        queue.entries[0].state = EntryState::Ejected;
        queue.sync(&refs);
        assert_eq!(queue.entries.len(), 1, "a ref left in place after an ejection is not a retry");
        queue.entries[0].dequeued = true;
        queue.sync(&BTreeMap::new());
        assert_eq!(queue.entries.len(), 1);
        queue.sync(&refs);
        let shown: Vec<_> = queue.entries.iter().map(|e| (e.state, e.retry)).collect();
        assert_eq!(shown, [(EntryState::Ejected, false), (EntryState::Waiting, true)]);
        queue.sync(&refs);
        assert_eq!(queue.entries.len(), 2, "the retry is queued once");
    }
}
