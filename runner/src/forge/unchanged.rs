//! Cheap change detection before a fetch. A local repository (a path or a `file://` URL) is
//! unchanged while its refs' files are: their names, inodes, sizes and modification times,
//! read with `stat` alone (a ref is written to a new file renamed into place, so each update
//! changes its inode). With the mirror's own refs unchanged too, the last snapshot still
//! holds, and a round costs no process. Once both are watched with inotify ([`RefWatch`]),
//! a round passes by a repository that no event touched, reading nothing. A remote repository is
//! unchanged when `git ls-remote` (one round trip) lists the refs the mirror holds.

use std::collections::HashMap;
use std::hash::{Hash as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use knotless_protocol::sdk::lock;
use notify::Watcher as _;

/// How long a watched repository goes without its refs being read, events or not: a missed
/// event (a file system inotify does not see) costs at most this delay.
const READ_AT_LEAST_EVERY: Duration = Duration::from_secs(300);

/// The inotify watch of local repositories' and their mirrors' git folders (`HEAD`,
/// `packed-refs`) and refs (`refs/`, `reftable/`, recursively). An event marks its repository
/// to be read again; a lost event (a queue overflow) or a watcher error marks them all; a
/// watched folder removed or moved is watched again at the next round. Without inotify (no
/// instance left, `fs.inotify.max_user_watches` reached) a repository is read each round.
pub struct RefWatch {
    watcher: Option<Mutex<notify::RecommendedWatcher>>,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// By watched folder, the key of its repository.
    owners: Mutex<HashMap<PathBuf, String>>,
    /// By key, how the repository is watched.
    watched: Mutex<HashMap<String, Watched>>,
    /// Counts what may have made a quiet repository not quiet: events, lost events, reads.
    changes: std::sync::atomic::AtomicU64,
}

enum Watched {
    /// Watched since the refs were last read at that instant; `dirty` once an event came;
    /// `settled` once that read gave a snapshot with nothing for the merge queue.
    Yes { read_at: Instant, dirty: bool, settled: bool },
    /// Watching failed: read each round.
    No,
}

impl Default for RefWatch {
    fn default() -> RefWatch {
        let shared = Arc::new(Shared::default());
        let handler = Arc::clone(&shared);
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| handler.saw(event));
        let watcher = match watcher {
            Ok(watcher) => Some(Mutex::new(watcher)),
            Err(error) => {
                tracing::warn!(
                    "cannot watch local repositories with inotify ({error}): their refs are read each round"
                );
                None
            }
        };
        RefWatch { watcher, shared }
    }
}

impl Shared {
    fn saw(&self, event: notify::Result<notify::Event>) {
        if matches!(&event, Ok(event) if matches!(event.kind, notify::EventKind::Access(_))) {
            return;
        }
        self.changes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let owners = lock(&self.owners);
        let mut watched = lock(&self.watched);
        let event = match event {
            Ok(event) if !event.need_rescan() => event,
            // An error or lost events: every repository is read again.
            _ => {
                for state in watched.values_mut() {
                    if let Watched::Yes { dirty, .. } = state {
                        *dirty = true;
                    }
                }
                return;
            }
        };
        for path in &event.paths {
            let Some(key) = path.ancestors().find_map(|folder| owners.get(folder)) else { continue };
            if owners.contains_key(path.as_path()) {
                // A watched folder itself changed (removed, moved, replaced): watched again.
                watched.remove(key);
            } else if let Some(Watched::Yes { dirty, .. }) = watched.get_mut(key) {
                *dirty = true;
            }
        }
    }
}

impl RefWatch {
    /// Says the read of the repository `key` since [`RefWatch::settle`] gave a snapshot, and
    /// whether its merge queue is empty: only then can it be quiet.
    pub fn read(&self, key: &str, queue_empty: bool) {
        if let Some(Watched::Yes { settled, .. }) = lock(&self.shared.watched).get_mut(key) {
            *settled = queue_empty;
        }
    }

    /// Whether the repository `key` is watched, its last read gave a snapshot with an empty
    /// merge queue, and nothing touched its refs since, less than [`READ_AT_LEAST_EVERY`] ago;
    /// asking changes nothing.
    pub fn quiet(&self, key: &str) -> bool {
        self.quiet_until(key).is_some()
    }

    /// When the repository `key`, quiet now, is read again whatever happens; `None` when it is
    /// not quiet.
    pub fn quiet_until(&self, key: &str) -> Option<Instant> {
        match lock(&self.shared.watched).get(key) {
            Some(Watched::Yes { read_at, dirty: false, settled: true }) => {
                Some(*read_at + READ_AT_LEAST_EVERY).filter(|until| Instant::now() < *until)
            }
            _ => None,
        }
    }

    /// A count that moves whenever a quiet repository may have stopped being quiet.
    pub fn changes(&self) -> u64 {
        self.shared.changes.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Takes the repository `key`'s mark as its refs are read now; first watches the git
    /// folders `folders()` gives (the repository's and its mirror's; `None` while one does not
    /// exist yet) if they are not watched.
    pub fn settle(&self, key: &str, folders: impl FnOnce() -> Option<[PathBuf; 2]>) {
        self.shared.changes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        {
            let mut watched = lock(&self.shared.watched);
            match watched.get_mut(key) {
                Some(Watched::Yes { read_at, dirty, settled }) => {
                    *dirty = false;
                    *settled = false;
                    *read_at = Instant::now();
                    return;
                }
                Some(Watched::No) => return,
                None => {}
            }
        }
        let Some(watcher) = &self.watcher else { return };
        let Some(git_dirs) = folders() else { return };
        let mut roots = Vec::new();
        for git_dir in &git_dirs {
            roots.push((git_dir.clone(), notify::RecursiveMode::NonRecursive));
            for refs in ["refs", "reftable"] {
                let folder = git_dir.join(refs);
                if folder.is_dir() {
                    roots.push((folder, notify::RecursiveMode::Recursive));
                }
            }
        }
        let mut watcher = lock(watcher);
        // Registered before the watch, so that no event of these folders goes unowned.
        {
            let mut owners = lock(&self.shared.owners);
            for (folder, _) in &roots {
                owners.insert(folder.clone(), key.to_string());
            }
        }
        let failed =
            roots.iter().find_map(|(folder, mode)| watcher.watch(folder, *mode).err().map(|error| (folder, error)));
        let state = match failed {
            None => Watched::Yes { read_at: Instant::now(), dirty: false, settled: false },
            Some((folder, error)) => {
                tracing::warn!(
                    "cannot watch {} ({error}; see fs.inotify.max_user_watches): its refs are read each round",
                    folder.display()
                );
                // The watcher's thread takes the maps' locks: none is held while it is asked.
                for (folder, _) in &roots {
                    let _ = watcher.unwatch(folder);
                }
                let mut owners = lock(&self.shared.owners);
                for (folder, _) in &roots {
                    owners.remove(folder);
                }
                Watched::No
            }
        };
        lock(&self.shared.watched).insert(key.to_string(), state);
    }
}

/// The git folder of a local repository `url`: the folder itself when bare, else its `.git`
/// folder; `None` for a URL of another scheme or a layout this does not read (a `.git` file).
pub fn local_git_dir(url: &str) -> Option<PathBuf> {
    let path = match url.strip_prefix("file://") {
        Some(path) => path,
        None if url.contains("://") => return None,
        None => url,
    };
    let path = Path::new(path);
    if !path.is_absolute() {
        return None;
    }
    if path.join("HEAD").is_file() && path.join("refs").is_dir() {
        return Some(path.to_path_buf());
    }
    let dot_git = path.join(".git");
    dot_git.is_dir().then_some(dot_git)
}

/// A fingerprint of the refs of the git folder `git_dir`: `HEAD`, `packed-refs`, and every
/// entry under `refs/` and `reftable/`; `None` when it cannot be read.
pub fn refs_fingerprint(git_dir: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut stamp = |path: &Path, metadata: &std::fs::Metadata| {
        path.hash(&mut hasher);
        (metadata.ino(), metadata.len(), metadata.mtime(), metadata.mtime_nsec()).hash(&mut hasher);
    };
    for file in ["HEAD", "packed-refs"] {
        let path = git_dir.join(file);
        match std::fs::symlink_metadata(&path) {
            Ok(metadata) => stamp(&path, &metadata),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => return None,
        }
    }
    let mut folders = vec![git_dir.join("refs"), git_dir.join("reftable")];
    while let Some(folder) = folders.pop() {
        let metadata = match std::fs::symlink_metadata(&folder) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => return None,
        };
        stamp(&folder, &metadata);
        if !metadata.is_dir() {
            continue;
        }
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&folder).ok()?.flatten().map(|entry| entry.path()).collect();
        // In a stable order, whatever order the folder lists them in.
        entries.sort();
        folders.extend(entries.into_iter().rev());
    }
    Some(hasher.finish())
}

/// Whether `git ls-remote` output (`OBJECT\tREF` lines) names the same refs at the same objects
/// as the mirror's `for-each-ref` listing (`OBJECT REF` lines), `HEAD` and peeled tags apart.
pub fn same_refs(remote: &str, mirror: &str) -> bool {
    let refs = |text: &str, separator: char| {
        let mut refs: Vec<(String, String)> = text
            .lines()
            .filter_map(|line| line.split_once(separator))
            .map(|(object, name)| (name.trim().to_string(), object.trim().to_string()))
            .filter(|(name, _)| name != "HEAD" && !name.ends_with("^{}"))
            .collect();
        refs.sort();
        refs
    };
    refs(remote, '\t') == refs(mirror, ' ')
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn git(dir: &Path, args: &[&str]) {
        let args = [&["-c", "user.name=t", "-c", "user.email=t@t"][..], args].concat();
        crate::git::Git::in_folder(dir).run(&args).await.expect("git");
    }

    #[tokio::test]
    async fn a_ref_written_moved_or_packed_changes_the_fingerprint_and_nothing_else_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).expect("mkdir");
        git(&repo, &["init", "-q", "-b", "main"]).await;
        git(&repo, &["commit", "-q", "--allow-empty", "-m", "one"]).await;
        let git_dir = local_git_dir(&repo.display().to_string()).expect("a local repository");
        assert_eq!(local_git_dir(&format!("file://{}", repo.display())), Some(git_dir.clone()));
        assert_eq!(local_git_dir("ssh://host/repo.git"), None);
        assert_eq!(local_git_dir("relative/repo"), None);
        let first = refs_fingerprint(&git_dir).expect("a fingerprint");
        assert_eq!(refs_fingerprint(&git_dir), Some(first), "stable while nothing changes");
        // Objects and the work tree are not refs.
        std::fs::write(repo.join("file"), "x").expect("write");
        git(&repo, &["hash-object", "-w", "file"]).await;
        assert_eq!(refs_fingerprint(&git_dir), Some(first));
        let mut seen = vec![first];
        for change in [
            &["commit", "-q", "--allow-empty", "-m", "two"][..],
            &["branch", "feature/deep"],
            &["update-ref", "refs/pulls/7/head", "HEAD~1"],
            &["pack-refs", "--all"],
            &["update-ref", "refs/heads/main", "HEAD~1"],
            &["symbolic-ref", "HEAD", "refs/heads/feature/deep"],
        ] {
            git(&repo, change).await;
            let now = refs_fingerprint(&git_dir).expect("a fingerprint");
            assert!(!seen.contains(&now), "{change:?} changed nothing");
            seen.push(now);
        }
    }

    /// Asks `watch` until it says `key` changed (the events come on the watcher's thread),
    /// then reads it.
    fn until_changed(watch: &RefWatch, key: &str, folders: &[PathBuf; 2], what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while watch.quiet(key) {
            assert!(Instant::now() < deadline, "{what} was not seen");
            std::thread::sleep(Duration::from_millis(10));
        }
        watch.settle(key, || Some(folders.clone()));
        watch.read(key, true);
    }

    #[tokio::test]
    async fn a_watched_repository_is_quiet_until_its_refs_or_its_mirrors_change() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).expect("mkdir");
        git(&repo, &["init", "-q", "-b", "main"]).await;
        git(&repo, &["commit", "-q", "--allow-empty", "-m", "one"]).await;
        let mirror = dir.path().join("mirror.git");
        git(dir.path(), &["clone", "-q", "--mirror", "repo", "mirror.git"]).await;
        let folders = [repo.join(".git"), mirror.clone()];
        let watch = RefWatch::default();
        assert!(!watch.quiet("k"), "a repository not watched is read");
        watch.settle("k", || None);
        assert!(!watch.quiet("k"), "nor while its folders are not there");
        watch.settle("k", || Some(folders.clone()));
        assert!(!watch.quiet("k"), "not before its read gave a snapshot (a failed fetch is tried again)");
        watch.read("k", false);
        assert!(!watch.quiet("k"), "nor while its merge queue holds pulls");
        watch.read("k", true);
        assert!(watch.quiet("k"), "watched from its first read");
        watch.settle("k", || panic!("a watched repository's folders are not looked up again"));
        watch.read("k", true);
        for (what, change) in [
            ("a commit", &["commit", "-q", "--allow-empty", "-m", "two"][..]),
            ("a branch in a new folder", &["branch", "feature/deep"]),
            ("a ref outside heads", &["update-ref", "refs/pulls/7/head", "HEAD~1"]),
            ("packed refs", &["pack-refs", "--all"]),
            ("HEAD moved", &["symbolic-ref", "HEAD", "refs/heads/feature/deep"]),
        ] {
            git(&repo, change).await;
            until_changed(&watch, "k", &folders, what);
        }
        git(&mirror, &["fetch", "-q", "origin"]).await;
        until_changed(&watch, "k", &folders, "a fetch into the mirror");
        // The repository removed and made again at its path is watched again.
        std::fs::remove_dir_all(&repo).expect("remove the repository");
        std::fs::create_dir(&repo).expect("mkdir");
        git(&repo, &["init", "-q", "-b", "main"]).await;
        until_changed(&watch, "k", &folders, "the repository removed");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !watch.quiet("k") {
            assert!(Instant::now() < deadline, "the repository made again is not watched");
            watch.settle("k", || Some(folders.clone()));
            watch.read("k", true);
            std::thread::sleep(Duration::from_millis(10));
        }
        git(&repo, &["commit", "-q", "--allow-empty", "-m", "again"]).await;
        until_changed(&watch, "k", &folders, "a commit in the repository made again");
    }

    #[test]
    fn ls_remote_and_for_each_ref_compare_as_sets_of_refs() {
        let remote =
            "aaa\tHEAD\naaa\trefs/heads/main\nbbb\trefs/pulls/1/head\nccc\trefs/tags/v1\nddd\trefs/tags/v1^{}\n";
        let mirror = "bbb refs/pulls/1/head\naaa refs/heads/main\nccc refs/tags/v1\n";
        assert!(same_refs(remote, mirror));
        assert!(!same_refs(remote, "aaa refs/heads/main\nccc refs/tags/v1\n"), "a ref the mirror lacks");
        assert!(!same_refs(
            remote,
            "aaa refs/heads/main\nbbb refs/pulls/1/head\nccc refs/tags/v1\nzzz refs/heads/gone\n"
        ));
        assert!(!same_refs(remote, "aaa refs/heads/main\nbbx refs/pulls/1/head\nccc refs/tags/v1\n"), "a ref moved");
    }
}
