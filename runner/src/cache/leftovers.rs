//! What dead processes left in a cache store, found by owner and removed at a start: a run's
//! layer folder (`caches/.upper/<run>/`, the partial download and the promotion's archive in
//! it) with its owner file, once the process whose token the file holds is gone; and the
//! temporary archives that runners from before owner files left beside the bases.
//!
//! A process writes `<run>.owner` before it makes `<run>/`, and removes `<run>/` before
//! `<run>.owner`, so a live run's folder always has its owner file beside it. A sweep removes a
//! folder only when [`owner::liveness`] of that file's token is [`Liveness::Dead`] (or when there
//! is no owner file: only a runner from before owner files made such a folder); a token it
//! cannot judge ([`Liveness::Unknown`]) keeps everything. Several runners may share one store
//! (the daemon and `run`s, or `run`s with the same cache folder): none takes another's live run.

use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use knotless_protocol::owner::{self, Liveness};

use super::UPPER;

/// The extension of an owner file.
const OWNER_EXTENSION: &str = ".owner";

/// The most bytes of an owner file read: a token is a realm and a path.
const OWNER_FILE_MAX: u64 = 4096;

/// How old an owner file holding no token must be to be taken for one whose writer was killed
/// between making it and writing it (a write of a few bytes right after the file is made).
const UNWRITTEN_OWNER_GRACE: Duration = Duration::from_secs(60);

/// The owner file of a run's folder: `<folder>.owner` beside it.
fn owner_file(run_folder: &Path) -> PathBuf {
    let mut name = run_folder.file_name().map(OsString::from).unwrap_or_default();
    name.push(OWNER_EXTENSION);
    run_folder.with_file_name(name)
}

/// Writes the owner file of `run_folder`, holding `token`, before anything of the run is made.
pub(super) fn mark(run_folder: &Path, token: &str) -> anyhow::Result<()> {
    let file = owner_file(run_folder);
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&file)
        .with_context(|| format!("cannot create the owner file {}", file.display()))?;
    written.write_all(token.as_bytes()).with_context(|| format!("cannot write the owner file {}", file.display()))
}

/// Removes a run's folder and then its owner file. When the folder cannot be removed whole, the
/// owner file stays, so that a sweep takes both once this process is gone.
pub(super) fn unmark(run_folder: &Path) {
    match std::fs::remove_dir_all(run_folder) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!("cannot remove {}: {error}; a later start removes it", run_folder.display());
            return;
        }
    }
    let _ = std::fs::remove_file(owner_file(run_folder));
}

/// What a sweep removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    /// Each path removed.
    pub removed: Vec<PathBuf>,
    /// The bytes of the files they held.
    pub bytes: u64,
    /// What could not be removed, and why.
    pub failures: Vec<String>,
}

impl Swept {
    /// One line saying what was removed, `None` when nothing was.
    pub fn summary(&self) -> Option<String> {
        if self.removed.is_empty() {
            return None;
        }
        let names: Vec<String> = self.removed.iter().map(|path| path.display().to_string()).collect();
        Some(format!("{} ({})", names.join(", "), knotless_host::printable::size(self.bytes)))
    }
}

/// Removes what dead processes left in the cache store under `state` (`<state>/caches`): the
/// folders and owner files of runs whose owner is dead, and older runners' temporary archives
/// beside the bases. Never blocks on a live process; never follows a link.
pub fn sweep(state: &Path) -> Swept {
    let root = state.join("caches");
    let mut swept = Swept::default();
    sweep_layers(&root.join(UPPER), &mut swept);
    sweep_old_temporary_archives(&root, &mut swept);
    swept
}

/// The run folders and owner files in `upper` whose owner is dead.
fn sweep_layers(upper: &Path, swept: &mut Swept) {
    let Ok(entries) = std::fs::read_dir(upper) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            let owner = owner_file(&path);
            let dead = match read_owner_file(&owner) {
                Ok(token) => owner_is_dead(&token, &owner),
                // A live process writes the owner file first: only a runner from before owner
                // files made a folder without one.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => true,
                Err(_) => false,
            };
            if dead && remove(&path, swept) {
                remove(&owner, swept);
            }
        } else if kind.is_file() && entry.file_name().to_string_lossy().ends_with(OWNER_EXTENSION) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let folder = upper.join(name.trim_end_matches(OWNER_EXTENSION));
            // With its folder, it is judged with the folder.
            if std::fs::symlink_metadata(&folder).is_ok() {
                continue;
            }
            if read_owner_file(&path).is_ok_and(|token| owner_is_dead(&token, &path)) {
                remove(&path, swept);
            }
        }
    }
}

/// An owner file's text, at most [`OWNER_FILE_MAX`] bytes.
fn read_owner_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut token = Vec::new();
    std::fs::File::open(path)?.take(OWNER_FILE_MAX).read_to_end(&mut token)?;
    Ok(token)
}

/// Whether the owner named in the owner file at `path` is gone: its token says so, or the file
/// holds no token and is older than [`UNWRITTEN_OWNER_GRACE`].
fn owner_is_dead(token: &[u8], path: &Path) -> bool {
    match std::str::from_utf8(token).map(str::trim) {
        Ok(token) if !token.is_empty() => owner::liveness(token) == Liveness::Dead,
        Ok(_) => std::fs::symlink_metadata(path)
            .and_then(|metadata| metadata.modified())
            .is_ok_and(|modified| modified.elapsed().is_ok_and(|age| age > UNWRITTEN_OWNER_GRACE)),
        Err(_) => false,
    }
}

/// The `.tmpXXXXXX` files beside the bases (`<repository>/<workflow>/<trust>/`): the archives
/// a promotion of a runner from before owner files was writing when it was killed. A
/// promotion now packs its archive in its run's own folder.
fn sweep_old_temporary_archives(root: &Path, swept: &mut Swept) {
    let folders = |dir: &Path| -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
        entries
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
            .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
            .map(|entry| entry.path())
            .collect()
    };
    for repository in folders(root) {
        for workflow in folders(&repository) {
            for trust in ["trusted", "apart"].map(|trust| workflow.join(trust)) {
                let Ok(entries) = std::fs::read_dir(&trust) else { continue };
                for entry in entries.flatten() {
                    let temporary = is_old_temporary_name(&entry.file_name().to_string_lossy());
                    if temporary && entry.file_type().is_ok_and(|kind| kind.is_file()) {
                        remove(&entry.path(), swept);
                    }
                }
            }
        }
    }
}

/// Whether `name` is one `tempfile` gives by default: `.tmp` and six letters or digits.
pub(crate) fn is_old_temporary_name(name: &str) -> bool {
    name.strip_prefix(".tmp").is_some_and(|rest| rest.len() == 6 && rest.chars().all(|c| c.is_ascii_alphanumeric()))
}

/// Removes `path` (a folder with what it holds), counting its bytes; whether it is gone.
pub(crate) fn remove(path: &Path, swept: &mut Swept) -> bool {
    let bytes = bytes_under(path);
    let removed = match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(error) => Err(error),
    };
    match removed {
        Ok(()) => {
            swept.removed.push(path.to_path_buf());
            swept.bytes += bytes;
            true
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => true,
        Err(error) => {
            swept.failures.push(format!("cannot remove {}: {error}", path.display()));
            false
        }
    }
}

/// The bytes of the regular files at or under `path`, links not followed.
fn bytes_under(path: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![path.to_path_buf()];
    while let Some(next) = pending.pop() {
        let Ok(metadata) = std::fs::symlink_metadata(&next) else { continue };
        if metadata.is_dir() {
            pending.extend(std::fs::read_dir(&next).into_iter().flatten().flatten().map(|entry| entry.path()));
        } else if metadata.is_file() {
            total += metadata.len();
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{CacheStore, OWNERS};
    use knotless_protocol::owner::Owner;

    /// A run folder with a file in it, owned by `token`.
    fn layer(upper: &Path, run: &str, token: &str) -> PathBuf {
        let folder = upper.join(run);
        mark(&folder, token).expect("mark");
        std::fs::create_dir_all(folder.join("0")).expect("mkdir");
        std::fs::write(folder.join("0/file"), vec![7u8; 1000]).expect("write");
        std::fs::write(folder.join("0.promoting.tar"), vec![0u8; 24]).expect("write");
        folder
    }

    #[test]
    fn a_dead_owners_layer_is_swept_and_a_live_or_unknown_ones_kept() {
        let state = tempfile::tempdir().expect("tempdir");
        let upper = state.path().join("caches").join(UPPER);
        let owners = state.path().join("caches").join(OWNERS);
        std::fs::create_dir_all(state.path().join("caches")).expect("mkdir");
        let live = Owner::acquire_in(&owners).expect("live owner");
        let dead = Owner::acquire_in(&owners).expect("dead owner");
        let dead_token = dead.token().to_string();
        drop(dead);
        let killed = layer(&upper, "killed-run", &dead_token);
        let running = layer(&upper, "live-run", live.token());
        let elsewhere = layer(&upper, "other-machine", "0123456789abcdef:/tmp/knotless-owners/0011223344556677.lock");
        // A run killed after it marked its layer and before it made the folder.
        mark(&upper.join("killed-before-save"), &dead_token).expect("mark");
        // A run of a runner from before owner files.
        std::fs::create_dir_all(upper.join("old-run/0")).expect("mkdir");
        // A run whose writer is between making its owner file and writing it.
        std::fs::write(upper.join("being-marked.owner"), "").expect("write");

        let swept = sweep(state.path());
        assert!(swept.failures.is_empty(), "{swept:?}");
        assert!(!killed.exists() && !owner_file(&killed).exists(), "{swept:?}");
        assert!(!upper.join("killed-before-save.owner").exists() && !upper.join("old-run").exists(), "{swept:?}");
        assert_eq!(swept.bytes, 1024 + 2 * dead_token.len() as u64, "{swept:?}");
        for kept in [&running, &elsewhere] {
            assert!(kept.join("0/file").is_file() && owner_file(kept).is_file(), "{kept:?}: {swept:?}");
        }
        assert!(upper.join("being-marked.owner").exists(), "a young owner file without a token stays");
        assert!(swept.summary().is_some_and(|summary| summary.contains("killed-run")));
        assert_eq!(sweep(state.path()), Swept::default(), "a second sweep finds nothing more");
    }

    #[test]
    fn a_store_marks_its_runs_and_settling_removes_them() {
        let state = tempfile::tempdir().expect("tempdir");
        let store = CacheStore::open(state.path(), 1 << 20).expect("store");
        let leases = store.lease("repo", "build", &["c".to_string()], true, "run-1").expect("lease");
        let owner = state.path().join("caches/.upper/run-1.owner");
        let token = std::fs::read_to_string(&owner).expect("the owner file is written at the lease");
        assert_eq!(owner::liveness(&token), Liveness::Alive);
        // Beside a live store, a sweep by another process keeps the run.
        assert_eq!(sweep(state.path()), Swept::default());
        let upper = leases[0].upper.clone().expect("upper");
        std::fs::create_dir_all(&upper).expect("mkdir");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(store.settle("repo", "build", "run-1", &leases, true));
        assert!(!owner.exists() && !state.path().join("caches/.upper/run-1").exists());
        // Untrusted runs bring nothing back and write no owner file.
        store.lease("repo", "build", &["c".to_string()], false, "run-2").expect("lease");
        assert!(!state.path().join("caches/.upper/run-2.owner").exists());
    }

    #[test]
    fn older_runners_temporary_archives_beside_the_bases_are_swept() {
        let state = tempfile::tempdir().expect("tempdir");
        let trusted = state.path().join("caches/repo/build/trusted");
        std::fs::create_dir_all(&trusted).expect("mkdir");
        std::fs::write(trusted.join(".tmpAb12Cd"), "partial").expect("write");
        std::fs::write(trusted.join("c-0123.tar"), "base").expect("write");
        std::fs::write(trusted.join(".tmp-not-ours"), "kept").expect("write");
        let swept = sweep(state.path());
        assert_eq!(swept.removed, [trusted.join(".tmpAb12Cd")]);
        assert!(trusted.join("c-0123.tar").exists() && trusted.join(".tmp-not-ours").exists());
    }
}
