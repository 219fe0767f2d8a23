//! Retention: what the daemon prunes from its state folder so that it can run for months. Check
//! records with their logs and outputs older than `--retention`, and then the oldest until the
//! checks and outputs fit `--retention-max-bytes`, always keeping a run not ended, the newest
//! check of each workflow on each branch and every check of an open pull; cache archives not
//! used within the retention; the mirrors of repositories not watched for that long; and output
//! folders no record names any more.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::checks::{CheckRecord, CheckStore};
use crate::workflow::Event;

/// What is kept, from the daemon's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// How long an ended check, an unused cache and an unwatched mirror are kept (`--retention`).
    pub max_age: Duration,
    /// The most bytes the checks and outputs may take (`--retention-max-bytes`).
    pub max_bytes: Option<u64>,
}

/// What the daemon knows that the files do not say.
#[derive(Debug, Clone, Default)]
pub struct Keep {
    /// The keys of the repositories watched now.
    pub watched: BTreeSet<String>,
    /// The open pulls of each repository, by key.
    pub open_pulls: BTreeMap<String, BTreeSet<u64>>,
}

/// What one pruning removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Check records removed, each with its log and outputs.
    pub checks: usize,
    /// Output folders no record named.
    pub stray_outputs: usize,
    /// Cache archives removed.
    pub caches: usize,
    /// The keys of the mirrors removed.
    pub mirrors: Vec<String>,
    /// The bytes freed.
    pub bytes: u64,
    /// What could not be removed, and why.
    pub failures: Vec<String>,
}

impl Pruned {
    /// One line for the log, or `None` when nothing was removed.
    pub fn summary(&self) -> Option<String> {
        if self.checks + self.stray_outputs + self.caches + self.mirrors.len() == 0 {
            return None;
        }
        Some(format!(
            "pruned {} check(s) with their logs and outputs, {} stray output folder(s), {} cache archive(s) and {} \
             mirror(s) of repositories no longer watched: {} bytes freed",
            self.checks,
            self.stray_outputs,
            self.caches,
            self.mirrors.len(),
            self.bytes
        ))
    }
}

/// One check and what it holds.
struct Held {
    record: CheckRecord,
    /// When it ended (Unix milliseconds).
    ended: u64,
    bytes: u64,
}

/// Prunes the state folder `state` as `retention` says, at `now`.
pub fn prune(state: &Path, retention: &Retention, keep: &Keep, now: SystemTime) -> Pruned {
    let mut pruned = Pruned::default();
    let now_ms = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64);
    let oldest_kept = now_ms.saturating_sub(retention.max_age.as_millis() as u64);
    let store = CheckStore::new(state);
    let outputs = state.join("outputs");
    let mut prunable: Vec<Held> = Vec::new();
    let mut kept_bytes = 0u64;
    for key in store.repository_keys() {
        let Ok((records, _)) = store.list_readable(&key) else { continue };
        let protected = protected(&records, keep.open_pulls.get(&key));
        let names: BTreeSet<String> = records.iter().map(|record| record.run_id.clone()).collect();
        // Sizes are read (every output folder walked) only for a byte bound, and for what goes.
        let bounded = retention.max_bytes.is_some();
        for record in records {
            if protected.contains(&record.run_id) {
                if bounded {
                    kept_bytes += check_bytes(&store, &outputs, &record);
                }
                continue;
            }
            let ended = record.finished_at.unwrap_or(record.queued_at);
            if ended < oldest_kept {
                let bytes = check_bytes(&store, &outputs, &record);
                remove_check(&store, &outputs, &record, bytes, &mut pruned);
            } else if bounded {
                let bytes = check_bytes(&store, &outputs, &record);
                prunable.push(Held { record, ended, bytes });
            }
        }
        stray_outputs(&outputs.join(&key), &names, oldest_kept, &mut pruned);
    }
    if let Some(max_bytes) = retention.max_bytes {
        prunable.sort_by_key(|held| held.ended);
        let mut total = kept_bytes + prunable.iter().map(|held| held.bytes).sum::<u64>();
        for held in prunable {
            if total <= max_bytes {
                break;
            }
            remove_check(&store, &outputs, &held.record, held.bytes, &mut pruned);
            total = total.saturating_sub(held.bytes);
        }
    }
    prune_caches(&state.join("caches"), now - retention.max_age, &mut pruned);
    prune_mirrors(&state.join("mirrors"), &keep.watched, now - retention.max_age, &mut pruned);
    pruned
}

/// The run ids that are never pruned: runs not ended, the newest ended check of each workflow
/// on each branch (of a push or a manual run), and every check of an open pull.
fn protected(records: &[CheckRecord], open_pulls: Option<&BTreeSet<u64>>) -> BTreeSet<String> {
    let mut kept = BTreeSet::new();
    let mut newest: BTreeMap<(&str, &str), &CheckRecord> = BTreeMap::new();
    for record in records {
        if !record.status.is_final() {
            kept.insert(record.run_id.clone());
            continue;
        }
        let open = record.target.event == Event::Pull
            && record.target.pull.is_some_and(|pull| open_pulls.is_some_and(|open| open.contains(&pull)));
        if open {
            kept.insert(record.run_id.clone());
        }
        // A branch's (a push's or a manual run's): oldest first, each later one replaces the
        // one before.
        if matches!(record.target.event, Event::Push | Event::Manual) {
            newest.insert((record.workflow.as_str(), record.target.git_ref.as_str()), record);
        }
    }
    kept.extend(newest.into_values().map(|record| record.run_id.clone()));
    kept
}

/// The bytes of a check: its record, its log and its outputs.
fn check_bytes(store: &CheckStore, outputs: &Path, record: &CheckRecord) -> u64 {
    let file = |path: PathBuf| std::fs::symlink_metadata(path).map_or(0, |metadata| metadata.len());
    file(store.record_path(&record.repository_key, &record.run_id))
        + file(store.log_path(&record.repository_key, &record.run_id))
        + tree_bytes(&outputs.join(&record.repository_key).join(&record.run_id))
}

/// Removes a check's outputs, its log, then its record (so a check half removed still shows).
fn remove_check(store: &CheckStore, outputs: &Path, record: &CheckRecord, bytes: u64, pruned: &mut Pruned) {
    let key = &record.repository_key;
    let results = [
        remove_tree(&outputs.join(key).join(&record.run_id)),
        remove_file(&store.log_path(key, &record.run_id)),
        remove_file(&store.record_path(key, &record.run_id)),
    ];
    let failures: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    if failures.is_empty() {
        pruned.checks += 1;
        pruned.bytes += bytes;
    }
    pruned.failures.extend(failures);
}

/// Removes the output folders under `dir` (a repository's) that no record in `names` names,
/// once older than `oldest_kept` (a run's folder can be made just before its record names it).
fn stray_outputs(dir: &Path, names: &BTreeSet<String>, oldest_kept: u64, pruned: &mut Pruned) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if names.contains(&name) || !modified_before(&entry.path(), oldest_kept) {
            continue;
        }
        let bytes = tree_bytes(&entry.path());
        match remove_tree(&entry.path()) {
            Ok(()) => {
                pruned.stray_outputs += 1;
                pruned.bytes += bytes;
            }
            Err(failure) => pruned.failures.push(failure),
        }
    }
}

/// Removes the cache archives under `caches` last used before `before` (a run that reads an
/// archive marks it used), and the folders that leaves empty; the runs' own layers (`.upper`,
/// `.owners`) are the leftover sweep's.
fn prune_caches(caches: &Path, before: SystemTime, pruned: &mut Pruned) {
    let Ok(repositories) = std::fs::read_dir(caches) else { return };
    for repository in repositories.flatten() {
        if repository.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let mut folders = vec![repository.path()];
        let mut seen = Vec::new();
        while let Some(folder) = folders.pop() {
            let Ok(entries) = std::fs::read_dir(&folder) else { continue };
            seen.push(folder);
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(metadata) = std::fs::symlink_metadata(&path) else { continue };
                if metadata.is_dir() {
                    folders.push(path);
                } else if metadata.modified().is_ok_and(|modified| modified < before) {
                    match remove_file(&path) {
                        Ok(()) => {
                            pruned.caches += 1;
                            pruned.bytes += metadata.len();
                        }
                        Err(failure) => pruned.failures.push(failure),
                    }
                }
            }
        }
        // Deepest first; a folder that is not empty stays.
        for folder in seen.iter().rev() {
            let _ = std::fs::remove_dir(folder);
        }
    }
}

/// Removes the mirrors (`mirrors/KEY.git`) of repositories not in `watched` last fetched before
/// `before`.
fn prune_mirrors(mirrors: &Path, watched: &BTreeSet<String>, before: SystemTime, pruned: &mut Pruned) {
    let Ok(entries) = std::fs::read_dir(mirrors) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(key) = name.strip_suffix(".git") else { continue };
        if watched.contains(key) {
            continue;
        }
        // A fetch rewrites FETCH_HEAD; a mirror cloned and never fetched since goes by its
        // folder's time (the clone's).
        let path = entry.path();
        let modified = |path: &Path| std::fs::metadata(path).and_then(|metadata| metadata.modified()).ok();
        let fetched = [modified(&path.join("FETCH_HEAD")), modified(&path)].into_iter().flatten().max();
        if fetched.is_none_or(|fetched| fetched >= before) {
            continue;
        }
        let bytes = tree_bytes(&path);
        match remove_tree(&path) {
            Ok(()) => {
                pruned.mirrors.push(key.to_string());
                pruned.bytes += bytes;
            }
            Err(failure) => pruned.failures.push(failure),
        }
    }
}

/// Whether `path` was last changed before `oldest_kept` (Unix milliseconds).
fn modified_before(path: &Path, oldest_kept: u64) -> bool {
    let modified = std::fs::symlink_metadata(path).and_then(|metadata| metadata.modified());
    modified
        .ok()
        .and_then(|modified| modified.duration_since(SystemTime::UNIX_EPOCH).ok())
        .is_some_and(|since| (since.as_millis() as u64) < oldest_kept)
}

/// The bytes of the files under `path`, links not followed.
fn tree_bytes(path: &Path) -> u64 {
    let mut total = 0;
    let mut folders = vec![path.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let Ok(metadata) = std::fs::symlink_metadata(&folder) else { continue };
        if !metadata.is_dir() {
            total += metadata.len();
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&folder) else { continue };
        folders.extend(entries.flatten().map(|entry| entry.path()));
    }
    total
}

fn remove_file(path: &Path) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(format!("cannot remove {}: {error}", path.display())),
    }
}

fn remove_tree(path: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(format!("cannot remove {}: {error}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::CheckTarget;
    use crate::report::RunStatus;

    const DAY: u64 = 86_400_000;

    fn target(event: Event, git_ref: &str, pull: Option<u64>) -> CheckTarget {
        CheckTarget {
            event,
            commit: "c".into(),
            git_ref: git_ref.into(),
            pull,
            head: pull.map(|_| "h".into()),
            base: pull.map(|_| "main".into()),
        }
    }

    /// Puts a check of `workflow` on `target` that ended `days_ago`, with a log and an output.
    fn put(state: &Path, run_id: &str, workflow: &str, target: &CheckTarget, days_ago: u64, now: u64) -> CheckRecord {
        let store = CheckStore::new(state);
        let mut record = CheckRecord::queued(run_id.into(), ("/srv/r", "repo"), workflow, target, true, "me");
        record.status = RunStatus::Success;
        record.queued_at = now - days_ago * DAY - 1000;
        record.finished_at = Some(now - days_ago * DAY);
        store.put(&record).expect("put");
        store.put_log("repo", run_id, "[s] a line of log\n").expect("log");
        let outputs = state.join("outputs/repo").join(run_id);
        std::fs::create_dir_all(&outputs).expect("mkdir");
        std::fs::write(outputs.join("report.txt"), vec![b'x'; 1000]).expect("write");
        record
    }

    fn exists(state: &Path, run_id: &str) -> bool {
        let store = CheckStore::new(state);
        let record = store.record_path("repo", run_id).exists();
        let log = store.log_path("repo", run_id).exists();
        let outputs = state.join("outputs/repo").join(run_id).exists();
        assert!(record == log && log == outputs, "{run_id}: all of a check or nothing");
        record
    }

    fn days(n: u64) -> Duration {
        Duration::from_millis(n * DAY)
    }

    #[test]
    fn old_checks_go_but_the_newest_of_each_workflow_and_branch_and_open_pulls_stay() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path();
        let now = SystemTime::now();
        let now_ms = now.duration_since(SystemTime::UNIX_EPOCH).expect("now").as_millis() as u64;
        let main = target(Event::Push, "refs/heads/main", None);
        let other = target(Event::Push, "refs/heads/other", None);
        put(state, "old-main", "ci", &main, 200, now_ms);
        put(state, "newest-main", "ci", &main, 150, now_ms);
        put(state, "recent-main", "lint", &main, 10, now_ms);
        put(state, "newest-other", "ci", &other, 300, now_ms);
        put(state, "open-pull-old", "ci", &target(Event::Pull, "refs/pulls/7/head", Some(7)), 400, now_ms);
        put(state, "open-pull", "ci", &target(Event::Pull, "refs/pulls/7/head", Some(7)), 350, now_ms);
        put(state, "closed-pull-old", "ci", &target(Event::Pull, "refs/pulls/8/head", Some(8)), 400, now_ms);
        put(state, "closed-pull", "ci", &target(Event::Pull, "refs/pulls/8/head", Some(8)), 390, now_ms);
        let mut running = put(state, "running", "ci", &main, 500, now_ms);
        running.status = RunStatus::Running;
        running.finished_at = None;
        CheckStore::new(state).put(&running).expect("put");
        let stray = state.join("outputs/repo/gone-record");
        std::fs::create_dir_all(&stray).expect("mkdir");
        let keep = Keep { watched: ["repo".to_string()].into(), open_pulls: [("repo".to_string(), [7].into())].into() };
        let retention = Retention { max_age: days(90), max_bytes: None };
        // The stray folder is new: a run's folder can be made just before its record.
        let pruned = prune(state, &retention, &keep, now);
        assert_eq!(pruned.checks, 3, "{pruned:?}");
        for gone in ["old-main", "closed-pull-old", "closed-pull"] {
            assert!(!exists(state, gone), "{gone}");
        }
        for stays in ["newest-main", "recent-main", "newest-other", "open-pull-old", "open-pull", "running"] {
            assert!(exists(state, stays), "{stays}");
        }
        assert!(stray.exists(), "a new stray folder stays");
        assert!(pruned.bytes > 3000, "{pruned:?}");
        // 100 days later: the stray folder is old too; the protected checks still stay.
        let pruned = prune(state, &retention, &keep, now + days(100));
        assert_eq!((pruned.checks, pruned.stray_outputs), (0, 1), "{pruned:?}");
        assert!(!stray.exists());
        // Once pull 7 is closed, its checks go by their age.
        let closed = Keep { open_pulls: BTreeMap::new(), ..keep };
        assert_eq!(prune(state, &retention, &closed, now).checks, 2);
        assert!(!exists(state, "open-pull-old") && !exists(state, "open-pull"));
        assert!(prune(state, &retention, &closed, now).summary().is_none(), "a second pruning finds nothing");
    }

    #[test]
    fn past_the_byte_bound_the_oldest_checks_go_first_and_protected_ones_never() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path();
        let now = SystemTime::now();
        let now_ms = now.duration_since(SystemTime::UNIX_EPOCH).expect("now").as_millis() as u64;
        let main = target(Event::Push, "refs/heads/main", None);
        for (n, days_ago) in [5, 4, 3, 2, 1].into_iter().enumerate() {
            put(state, &format!("run-{n}"), "ci", &main, days_ago, now_ms);
        }
        let store = CheckStore::new(state);
        let one = check_bytes(&store, &state.join("outputs"), &store.get("repo", "run-0").expect("run-0"));
        // Room for three checks: the two oldest go.
        let retention = Retention { max_age: days(90), max_bytes: Some(3 * one + one / 2) };
        let pruned = prune(state, &retention, &Keep::default(), now);
        assert_eq!(pruned.checks, 2, "{pruned:?}");
        assert_eq!(
            (0..5).map(|n| exists(state, &format!("run-{n}"))).collect::<Vec<_>>(),
            [false, false, true, true, true]
        );
        // A bound below one check keeps the newest all the same.
        let retention = Retention { max_age: days(90), max_bytes: Some(1) };
        prune(state, &retention, &Keep::default(), now);
        assert_eq!(
            (0..5).map(|n| exists(state, &format!("run-{n}"))).collect::<Vec<_>>(),
            [false, false, false, false, true]
        );
    }

    #[test]
    fn unused_caches_and_mirrors_of_repositories_no_longer_watched_go_after_the_retention() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path();
        let now = SystemTime::now();
        let base = state.join("caches/repo/ci/trusted/target-1.tar");
        std::fs::create_dir_all(base.parent().expect("folder")).expect("mkdir");
        std::fs::write(&base, "archive").expect("write");
        let upper = state.join("caches/.upper/run-1/0");
        std::fs::create_dir_all(&upper).expect("mkdir");
        for key in ["watched", "unwatched"] {
            let mirror = state.join("mirrors").join(format!("{key}.git"));
            std::fs::create_dir_all(&mirror).expect("mkdir");
            std::fs::write(mirror.join("FETCH_HEAD"), "").expect("write");
        }
        let keep = Keep { watched: ["watched".to_string()].into(), ..Keep::default() };
        let retention = Retention { max_age: days(90), max_bytes: None };
        assert_eq!(prune(state, &retention, &keep, now), Pruned::default(), "nothing is old yet");
        let pruned = prune(state, &retention, &keep, now + days(91));
        assert_eq!((pruned.caches, pruned.mirrors.clone()), (1, vec!["unwatched".to_string()]), "{pruned:?}");
        assert!(!base.exists() && !state.join("caches/repo").exists(), "the archive and its empty folders are gone");
        assert!(upper.exists(), "a run's layer is the leftover sweep's");
        assert!(state.join("mirrors/watched.git").exists() && !state.join("mirrors/unwatched.git").exists());
    }
}
