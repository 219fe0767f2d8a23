//! The status page's read-only view of the daemon: check records, logs and merge queues as the
//! daemon keeps them under the state folder, `state.json`, and what the runner said of itself at
//! start. Nothing here writes, and every name a request gives is looked up among what exists
//! (a known repository key, a record's own run id), never joined onto a folder unchecked.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use knotless_protocol::messages::{Capabilities, ExecutorInfo};
use serde::Serialize;

use crate::checks::{CheckRecord, CheckStore};
use crate::forge::Seen;
use crate::queue::{QueueState, QueueStore};
use crate::state::{InFlight, STATE_FILE, State, Sweep};
use knotless_protocol::sdk::lock;

/// What the runner said of itself at start, for the runner page.
#[derive(Debug, Clone, Serialize)]
pub struct RunnerSummary {
    /// The runner's id.
    pub runner_id: String,
    /// The executor as the runner calls it (`--executor`).
    pub executor_name: String,
    /// The executor's name and version from its handshake.
    pub executor: Option<ExecutorInfo>,
    /// The protocol version the executor picked.
    pub protocol_version: Option<u32>,
    /// What the executor can do, from its handshake.
    pub capabilities: Option<Capabilities>,
    /// How many runs at once.
    pub concurrency: usize,
    /// Seconds between fetches.
    pub poll_seconds: u64,
    /// Whether pulls run.
    pub pulls: bool,
    /// Whether this runner lands merge queues.
    pub queue: bool,
    /// When the runner started (Unix milliseconds).
    pub started_at: u64,
}

/// The runner now: its summary, the runs in flight and the last orphan sweep.
#[derive(Debug, Clone, Serialize)]
pub struct RunnerNow {
    /// What it said at start.
    #[serde(flatten)]
    pub summary: RunnerSummary,
    /// The runs queued or running, by run id.
    pub in_flight: BTreeMap<String, InFlight>,
    /// The orphan sweep of the last start.
    pub last_sweep: Option<Sweep>,
}

/// A repository the page knows: one the runner watches (in `state.json`) or has checks of.
#[derive(Debug, Clone, Serialize)]
pub struct RepositoryView {
    /// Its key (its folders' name).
    pub key: String,
    /// Where it is fetched from, when the runner watches it.
    pub url: Option<String>,
    /// Its branches and pulls as last seen.
    pub seen: Seen,
}

/// The parsed records of one repository's folder, reused while the folder does not change.
struct Folder {
    /// The folder's modification time when it was read.
    changed: SystemTime,
    /// Whether that time was old enough when read that a later change must move it.
    settled: bool,
    /// Each record file's stamp and record.
    files: HashMap<OsString, (Stamp, Arc<CheckRecord>)>,
    /// The records, oldest first.
    records: Arc<Vec<Arc<CheckRecord>>>,
    /// The record files that could not be read (damaged, or naming another repository or
    /// run), each with its stamp: logged once, and named on the repository's page.
    unreadable: HashMap<OsString, Stamp>,
}

/// What tells a record file's version: a rewrite is a rename, so a new inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    inode: u64,
    size: u64,
    modified: i64,
    modified_nanos: i64,
}

/// How long a folder must have been still before its modification time is trusted to move at
/// the next change (file systems stamp times at a coarse tick).
const SETTLE: Duration = Duration::from_secs(2);

/// A commit as people know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitInfo {
    /// The first line of its message.
    pub subject: String,
    /// Its author's name.
    pub author: String,
    /// When it was authored (Unix milliseconds).
    pub authored_ms: u64,
}

/// How many commits' subjects and authors the view keeps (a commit never changes).
const KEPT_COMMITS: usize = 10_000;

/// How long one lookup of commits in a mirror may take.
const COMMIT_LOOKUP: Duration = Duration::from_secs(5);

/// The read-only view.
pub struct View {
    state: PathBuf,
    checks: CheckStore,
    queues: QueueStore,
    runner: RunnerSummary,
    folders: Mutex<HashMap<String, Folder>>,
    /// Whether the page is public, so shows no path of the runner's host.
    hide_host_paths: bool,
    /// Commits looked up (`None`: not in the mirror), by hash.
    commits: Mutex<HashMap<String, Option<CommitInfo>>>,
}

/// `hashes` looked up in the git folder `mirror`, by one `git log`; those it does not hold are
/// left out; `None` when the lookup failed (timed out, say).
fn look_up(mirror: &Path, hashes: &[&str]) -> Option<HashMap<String, CommitInfo>> {
    let mut args = vec!["log", "--no-walk=unsorted", "--ignore-missing", "--format=%H%x1f%an%x1f%at%x1f%s%x1e"];
    args.extend(hashes);
    args.push("--");
    let git = crate::git::Git::in_folder(mirror);
    let lookup = git.run_within(&args, COMMIT_LOOKUP);
    let output = tokio::runtime::Handle::try_current().ok()?.block_on(lookup).ok()?;
    let found = String::from_utf8_lossy(&output)
        .split('\x1e')
        .filter_map(|entry| {
            let mut fields = entry.trim_start_matches('\n').splitn(4, '\x1f');
            let (hash, author, at, subject) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
            let subject: String = subject.chars().take(200).collect();
            let info = CommitInfo {
                subject,
                author: author.chars().take(100).collect(),
                authored_ms: at.parse::<u64>().ok()? * 1000,
            };
            Some((hash.to_string(), info))
        })
        .collect();
    Some(found)
}

/// `text` with each word that is an absolute path (after an opening quote or bracket) as `PATH`.
pub fn hide_paths(text: &str) -> String {
    let words: Vec<String> = text
        .split(' ')
        .map(|word| {
            let lead = word.len() - word.trim_start_matches(['(', '[', '\'', '"', '`']).len();
            match word[lead..].starts_with('/') {
                true => {
                    let tail = word.trim_end_matches([')', ']', '\'', '"', '`', ',', ':', ';', '.']);
                    format!("{}PATH{}", &word[..lead], &word[tail.len().max(lead)..])
                }
                false => word.to_string(),
            }
        })
        .collect();
    words.join(" ")
}

/// Whether `name` can be a repository key or a run id: what the runner makes (letters, digits,
/// `-`, `_`, `.`), not starting with a dot; so never a separator, `..` or an absolute path.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-_.".contains(&byte))
}

impl View {
    /// A view of the state folder `state`.
    pub fn new(state: &Path, runner: RunnerSummary) -> View {
        View {
            state: state.to_path_buf(),
            checks: CheckStore::new(state),
            queues: QueueStore::new(state),
            runner,
            folders: Mutex::new(HashMap::new()),
            hide_host_paths: false,
            commits: Mutex::new(HashMap::new()),
        }
    }

    /// The subjects and authors of `hashes` (full hexadecimal object names) in the mirror of
    /// repository `key`: one `git log` for those not looked up before, none for the rest.
    /// Blocks: called off the async workers.
    pub fn commits(&self, key: &str, hashes: &[&str]) -> HashMap<String, CommitInfo> {
        let hex = |hash: &&str| matches!(hash.len(), 40 | 64) && hash.bytes().all(|byte| byte.is_ascii_hexdigit());
        let wanted: Vec<&str> = hashes.iter().copied().filter(hex).collect();
        let missing: Vec<&str> = {
            let commits = lock(&self.commits);
            wanted.iter().copied().filter(|hash| !commits.contains_key(*hash)).collect()
        };
        let mirror = self.state.join("mirrors").join(format!("{key}.git"));
        // A lookup that failed is tried again at the next page; a commit the mirror does not
        // hold is remembered as such.
        if !missing.is_empty()
            && is_plain_name(key)
            && mirror.is_dir()
            && let Some(found) = look_up(&mirror, &missing)
        {
            let mut commits = lock(&self.commits);
            if commits.len() + missing.len() > KEPT_COMMITS {
                commits.clear();
            }
            for hash in &missing {
                commits.insert(hash.to_string(), found.get(*hash).cloned());
            }
        }
        let commits = lock(&self.commits);
        wanted.iter().filter_map(|hash| Some((hash.to_string(), commits.get(*hash)?.clone()?))).collect()
    }

    /// This view, showing no path of the runner's host when `hide` (a public page): no outputs
    /// folder in a record, and every path in a cause or in the last sweep's notes as `PATH`.
    pub fn hiding_host_paths(mut self, hide: bool) -> View {
        self.hide_host_paths = hide;
        self
    }

    /// `record` as this view shows it.
    fn shown(&self, mut record: CheckRecord) -> CheckRecord {
        if self.hide_host_paths {
            record.outputs_dir = None;
            record.cause = record.cause.as_deref().map(hide_paths);
        }
        record
    }

    /// The state folder.
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// `state.json` as the daemon last wrote it (empty when absent or unreadable).
    fn state_file(&self) -> State {
        std::fs::read(self.state.join(STATE_FILE))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    /// The runner now.
    pub fn runner(&self) -> RunnerNow {
        let state = self.state_file();
        let mut last_sweep = state.last_sweep;
        if let Some(sweep) = last_sweep.as_mut().filter(|_| self.hide_host_paths) {
            for note in sweep.removed.iter_mut().chain(sweep.failures.iter_mut()) {
                *note = hide_paths(note);
            }
        }
        RunnerNow { summary: self.runner.clone(), in_flight: state.in_flight, last_sweep }
    }

    /// The repositories watched now (every one known, in a state that does not say), by key.
    pub fn repositories(&self) -> Vec<RepositoryView> {
        let mut known = self.known();
        if let Some(watched) = self.state_file().watched {
            known.retain(|repository| watched.contains(&repository.key));
        }
        known
    }

    /// Every repository the state folder knows, watched now or before.
    fn known(&self) -> Vec<RepositoryView> {
        let state = self.state_file();
        let mut found: BTreeMap<String, RepositoryView> = state
            .repositories
            .into_iter()
            .map(|(key, known)| (key.clone(), RepositoryView { key, url: Some(known.url), seen: known.seen }))
            .collect();
        for key in self.checks.repository_keys() {
            if is_plain_name(&key) {
                found.entry(key.clone()).or_insert(RepositoryView { key, url: None, seen: Seen::default() });
            }
        }
        found.into_values().collect()
    }

    /// The repository of `key`, when it is one the page knows.
    pub fn repository(&self, key: &str) -> Option<RepositoryView> {
        if !is_plain_name(key) {
            return None;
        }
        self.known().into_iter().find(|repository| repository.key == key)
    }

    /// The record files of a known repository that could not be read, by name, sorted.
    pub fn unreadable(&self, key: &str) -> Vec<String> {
        self.records(key);
        let folders = self.folders.lock().unwrap_or_else(|poison| poison.into_inner());
        let mut names: Vec<String> = folders
            .get(key)
            .map(|folder| folder.unreadable.keys().map(|name| name.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The records of a known repository, oldest first (the order of `checks --json`).
    pub fn records(&self, key: &str) -> Arc<Vec<Arc<CheckRecord>>> {
        let empty = || Arc::new(Vec::new());
        if !is_plain_name(key) {
            return empty();
        }
        let dir = self.checks.repository_dir(key);
        let Ok(changed) = std::fs::metadata(&dir).and_then(|metadata| metadata.modified()) else {
            return empty();
        };
        let mut folders = self.folders.lock().unwrap_or_else(|poison| poison.into_inner());
        if let Some(folder) = folders.get(key)
            && folder.settled
            && folder.changed == changed
        {
            return Arc::clone(&folder.records);
        }
        let previous = folders.remove(key);
        let mut folder = read_folder(&dir, key, changed, previous);
        if self.hide_host_paths {
            let shown = folder.records.iter().map(|record| Arc::new(self.shown(CheckRecord::clone(record)))).collect();
            folder.records = Arc::new(shown);
        }
        let records = Arc::clone(&folder.records);
        folders.insert(key.to_string(), folder);
        records
    }

    /// One check of a known repository: its record file in that repository's folder, naming
    /// that repository and that run.
    pub fn check(&self, key: &str, run_id: &str) -> Option<CheckRecord> {
        if !is_plain_name(key) || !is_plain_name(run_id) || self.repository(key).is_none() {
            return None;
        }
        let record = self.checks.get(key, run_id).ok()?;
        (record.repository_key == key && record.run_id == run_id).then(|| self.shown(record))
    }

    /// The masked log file of a check found by [`View::check`].
    pub fn log_path(&self, record: &CheckRecord) -> PathBuf {
        self.checks.log_path(&record.repository_key, &record.run_id)
    }

    /// The outputs folder of a check found by [`View::check`]: where the daemon puts it, never
    /// what the record says.
    pub fn outputs_dir(&self, record: &CheckRecord) -> PathBuf {
        self.state.join("outputs").join(&record.repository_key).join(&record.run_id)
    }

    /// The branches of a known repository with a merge queue.
    pub fn queue_branches(&self, key: &str) -> Vec<String> {
        if self.repository(key).is_none() {
            return Vec::new();
        }
        self.queues.branches(key)
    }

    /// The merge queue of a branch of a known repository, when one is kept.
    pub fn queue(&self, key: &str, branch: &str) -> Option<QueueState> {
        if !self.queue_branches(key).iter().any(|known| known == branch) {
            return None;
        }
        self.queues.load(key, branch).ok().flatten()
    }
}

fn stamp(metadata: &std::fs::Metadata) -> Stamp {
    Stamp {
        inode: metadata.ino(),
        size: metadata.size(),
        modified: metadata.mtime(),
        modified_nanos: metadata.mtime_nsec(),
    }
}

/// Reads a repository's record files, parsing only those whose stamp changed since `previous`.
fn read_folder(dir: &Path, key: &str, changed: SystemTime, previous: Option<Folder>) -> Folder {
    let read_at = SystemTime::now();
    let (mut old, old_unreadable) = previous.map(|folder| (folder.files, folder.unreadable)).unwrap_or_default();
    let mut files = HashMap::new();
    let mut unreadable = HashMap::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(run_id) = name.to_str().and_then(|name| name.strip_suffix(".json")) else { continue };
        let Ok(metadata) = entry.metadata() else { continue };
        if !metadata.is_file() {
            continue;
        }
        let stamp = stamp(&metadata);
        if old_unreadable.get(&name) == Some(&stamp) {
            unreadable.insert(name, stamp);
            continue;
        }
        let record = match old.remove(&name) {
            Some((known, record)) if known == stamp => record,
            _ => {
                let parsed = std::fs::read(entry.path())
                    .map_err(|error| error.to_string())
                    .and_then(|bytes| serde_json::from_slice::<CheckRecord>(&bytes).map_err(|error| error.to_string()));
                match parsed {
                    // A record names its own repository and run: one copied in from elsewhere is
                    // not this repository's.
                    Ok(record) if record.repository_key == key && record.run_id == run_id => Arc::new(record),
                    Ok(record) => {
                        tracing::warn!(
                            "the check record {} names repository {} and run {}: not listed",
                            entry.path().display(),
                            record.repository_key,
                            record.run_id
                        );
                        unreadable.insert(name, stamp);
                        continue;
                    }
                    Err(error) => {
                        tracing::warn!(
                            "the check record {} cannot be read: {error}: not listed",
                            entry.path().display()
                        );
                        unreadable.insert(name, stamp);
                        continue;
                    }
                }
            }
        };
        files.insert(name, (stamp, record));
    }
    let mut records: Vec<Arc<CheckRecord>> = files.values().map(|(_, record)| Arc::clone(record)).collect();
    records.sort_by(|a, b| (a.queued_at, &a.run_id).cmp(&(b.queued_at, &b.run_id)));
    let settled = read_at.duration_since(changed).is_ok_and(|age| age >= SETTLE);
    Folder { changed, settled, files, records: Arc::new(records), unreadable }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_exclude_every_path() {
        for bad in ["", ".", "..", "../x", "/etc", "a/b", ".hidden", "a\\b", "a b", "a\nb", "%2e%2e"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
        for good in ["demo-1a2b3c4d", "build-1f2e3d00", "a.b_c"] {
            assert!(is_plain_name(good), "{good:?}");
        }
    }
}
