//! The cache store: one tar archive per repository, workflow, trust level and cache path under
//! `<state>/caches/`, the per-run upper layers beside them, promotion by atomic rename, and the
//! disk floor.
//!
//! Layout: `caches/<repository key>/<workflow>/<trusted|apart>/<path slug>.tar` holds a base;
//! `caches/.upper/<run id>/<n>/` holds run `<run id>`'s layer of its n-th cache path while it
//! settles, and `caches/.upper/<run id>/<n>.promoting.tar` the archive a promotion packs before
//! it renames it over the base; `caches/.upper/<run id>.owner`, written before any of them,
//! holds the owner token of the process running the run (a lock it holds in `caches/.owners/`,
//! see [`knotless_protocol::owner`]), so that a sweep removes a run's leftovers only once that
//! process is gone ([`leftovers`]). Trusted (push) runs read the `trusted` base; untrusted
//! (pull) runs read the `apart` base, which no run promotes to today, and bring nothing back.

pub mod leftovers;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use knotless_protocol::owner::Owner;

use crate::checks::CacheNote;
use crate::engine::CacheLease;
use crate::names::fnv;

/// The folder of the store's lock files, under `caches/`.
pub const OWNERS: &str = ".owners";

/// The folder of the runs' layers, under `caches/`.
pub const UPPER: &str = ".upper";

/// The cache store under a state folder.
#[derive(Debug, Clone)]
pub struct CacheStore {
    root: PathBuf,
    /// A layer larger than this is not promoted (`--cache-max`).
    pub max_bytes: u64,
    /// This process's lock in `caches/.owners/`: the runs it leases layers to are marked with
    /// its token, and stay its while it lives.
    owner: Arc<Owner>,
}

/// The trust level of a base.
fn trust_dir(trusted: bool) -> &'static str {
    if trusted { "trusted" } else { "apart" }
}

/// A file name for a cache path: its safe characters and a hash of the whole.
fn slug(path: &str) -> String {
    let safe: String =
        path.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).take(40).collect();
    format!("{safe}-{:016x}", fnv(path.as_bytes()))
}

impl CacheStore {
    /// The store under `<state>/caches`, with a lock this process holds in `caches/.owners/`
    /// for as long as the store lives.
    pub fn open(state: &Path, max_bytes: u64) -> anyhow::Result<CacheStore> {
        let root = state.join("caches");
        std::fs::create_dir_all(&root).with_context(|| format!("cannot create the cache store {}", root.display()))?;
        let owners = root.join(OWNERS);
        let owner = Owner::acquire_in(&owners).with_context(|| {
            format!("cannot take a lock in {}: it must be a folder of this user's, closed to others", owners.display())
        })?;
        Ok(CacheStore { root, max_bytes, owner: Arc::new(owner) })
    }

    /// The store's folder (`<state>/caches`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The base archive of one cache path.
    pub fn base_path(&self, repository_key: &str, workflow: &str, trusted: bool, path: &str) -> PathBuf {
        self.root.join(repository_key).join(workflow).join(trust_dir(trusted)).join(format!("{}.tar", slug(path)))
    }

    fn upper_root(&self, run_id: &str) -> PathBuf {
        self.root.join(UPPER).join(run_id)
    }

    /// The leases of a run: the base of each path when one is stored, and an upper layer of its
    /// own for a trusted run, whose owner file is written first. An error names the file that
    /// could not be written; the run then has no caches.
    pub fn lease(
        &self,
        repository_key: &str,
        workflow: &str,
        paths: &[String],
        trusted: bool,
        run_id: &str,
    ) -> anyhow::Result<Vec<CacheLease>> {
        if trusted && !paths.is_empty() {
            leftovers::mark(&self.upper_root(run_id), self.owner.token())?;
        }
        Ok(paths
            .iter()
            .enumerate()
            .map(|(index, path)| {
                let base = self.base_path(repository_key, workflow, trusted, path);
                // Its time is its last use: retention prunes the archives not used for long.
                let used = std::fs::File::open(&base).and_then(|file| file.set_modified(std::time::SystemTime::now()));
                if let Err(error) = used
                    && error.kind() != std::io::ErrorKind::NotFound
                {
                    tracing::debug!("cannot mark {} used: {error}", base.display());
                }
                CacheLease {
                    path: path.clone(),
                    base: base.is_file().then_some(base),
                    upper: trusted.then(|| self.upper_root(run_id).join(index.to_string())),
                    max_bytes: self.max_bytes.saturating_add(1 << 20),
                    saved: Default::default(),
                }
            })
            .collect())
    }

    /// Ends a run's leases: with `promote`, each layer the run recorded as saved whole, within
    /// `--cache-max`, replaces its base; any other is dropped. The run's folder and owner file
    /// go last. Returns a note per path.
    pub async fn settle(
        &self,
        repository_key: &str,
        workflow: &str,
        run_id: &str,
        leases: &[CacheLease],
        promote: bool,
    ) -> Vec<CacheNote> {
        let mut notes = Vec::new();
        for lease in leases {
            let warm = lease.base.is_some();
            let outcome = match (&lease.upper, promote, lease.saved.bytes()) {
                (None, _, _) => "dropped (untrusted run)".to_string(),
                (Some(_), false, _) => "dropped (the run did not pass)".to_string(),
                (Some(_), true, None) => "not kept: the layer did not come back whole".to_string(),
                (Some(upper), true, Some(_)) => {
                    let base = self.base_path(repository_key, workflow, true, &lease.path);
                    match self.promote(upper.clone(), base).await {
                        Ok(outcome) => outcome,
                        Err(error) => format!("not kept: {error:#}"),
                    }
                }
            };
            tracing::info!(cache = %lease.path, warm, "cache {}: {outcome}", lease.path);
            notes.push(CacheNote { path: lease.path.clone(), warm, outcome });
        }
        let upper = self.upper_root(run_id);
        let _ = tokio::task::spawn_blocking(move || leftovers::unmark(&upper)).await;
        notes
    }

    /// Packs `upper` into `<upper>.promoting.tar` beside it, in the run's own folder, and
    /// renames that over `base`.
    async fn promote(&self, upper: PathBuf, base: PathBuf) -> anyhow::Result<String> {
        let max = self.max_bytes;
        tokio::task::spawn_blocking(move || -> anyhow::Result<String> {
            let dir = base.parent().context("a cache base has no folder")?;
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            let mut name = upper.file_name().context("a layer has no name")?.to_os_string();
            name.push(".promoting.tar");
            let archive = upper.with_file_name(name);
            let packed = pack_layer(&upper, &archive).and_then(|bytes| {
                if bytes > max {
                    return Ok(format!("not kept: {bytes} bytes is over --cache-max {max}"));
                }
                std::fs::rename(&archive, &base).with_context(|| format!("cannot replace {}", base.display()))?;
                Ok(format!("promoted ({bytes} bytes)"))
            });
            let _ = std::fs::remove_file(&archive);
            packed
        })
        .await
        .context("the promotion task failed")?
    }
}

/// Packs the folder `upper` into the new file `archive`; the bytes written. (The layer came
/// back through a download bounded a little over `--cache-max`, so this is bounded too.)
fn pack_layer(upper: &Path, archive: &Path) -> anyhow::Result<u64> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(archive)
        .with_context(|| format!("cannot create {}", archive.display()))?;
    let writer = std::io::BufWriter::new(&file);
    let mut writer = knotless_protocol::tarball::pack_dir(upper, writer)
        .with_context(|| format!("cannot pack {}", upper.display()))?;
    std::io::Write::flush(&mut writer).with_context(|| format!("cannot write {}", archive.display()))?;
    drop(writer);
    Ok(file.metadata().with_context(|| format!("cannot read {}", archive.display()))?.len())
}

/// Bytes free to an unprivileged user on the file system holding `path`.
pub fn free_bytes(path: &Path) -> anyhow::Result<u64> {
    let stat = nix::sys::statvfs::statvfs(path)
        .with_context(|| format!("cannot stat the file system of {}", path.display()))?;
    Ok((stat.blocks_available() as u64).saturating_mul(stat.fragment_size() as u64))
}

/// `Err` with the cause when the free space under `path` is below `floor`.
pub fn check_disk_floor(path: &Path, floor: u64) -> Result<(), String> {
    if floor == 0 {
        return Ok(());
    }
    match free_bytes(path) {
        Ok(free) if free < floor => {
            Err(format!("disk floor: {free} bytes free under {} is below --disk-floor {floor}", path.display()))
        }
        Ok(_) => Ok(()),
        Err(error) => Err(format!("disk floor: {error:#}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_passing_layer_is_promoted_and_a_failing_one_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CacheStore::open(dir.path(), 1 << 20).expect("store");
        let paths = vec!["target".to_string()];
        let first = store.lease("repo", "build", &paths, true, "run-1").expect("lease");
        assert!(first[0].base.is_none());
        let upper = first[0].upper.clone().expect("trusted runs have an upper layer");
        std::fs::create_dir_all(&upper).expect("mkdir");
        std::fs::write(upper.join("warm"), "1").expect("write");
        first[0].saved.record(1024);
        let notes = store.settle("repo", "build", "run-1", &first, true).await;
        assert!(notes[0].outcome.starts_with("promoted"), "{notes:?}");
        let second = store.lease("repo", "build", &paths, true, "run-2").expect("lease");
        assert!(second[0].base.is_some());
        let dropped = store.settle("repo", "build", "run-2", &second, false).await;
        assert!(dropped[0].warm && dropped[0].outcome.starts_with("dropped"));
        let apart = store.lease("repo", "build", &paths, false, "run-3").expect("lease");
        assert!(apart[0].base.is_none() && apart[0].upper.is_none());
    }

    #[tokio::test]
    async fn a_layer_not_recorded_as_saved_whole_is_never_promoted_whatever_its_folder_holds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CacheStore::open(dir.path(), 1 << 20).expect("store");
        let base = store.base_path("repo", "build", true, "c");
        std::fs::create_dir_all(base.parent().expect("folder")).expect("mkdir");
        std::fs::write(&base, "the warm base").expect("write");
        let leases = store.lease("repo", "build", &["c".to_string()], true, "run").expect("lease");
        // A folder a failed download's task made after the save gave up on it.
        let upper = leases[0].upper.clone().expect("upper");
        std::fs::create_dir_all(&upper).expect("mkdir");
        let notes = store.settle("repo", "build", "run", &leases, true).await;
        assert_eq!(notes[0].outcome, "not kept: the layer did not come back whole");
        assert_eq!(std::fs::read(&base).expect("base"), b"the warm base");
        assert!(!upper.exists(), "the run's folder is removed");
    }

    #[tokio::test]
    async fn a_layer_over_the_bound_is_not_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CacheStore::open(dir.path(), 100).expect("store");
        let leases = store.lease("repo", "build", &["c".to_string()], true, "run").expect("lease");
        let upper = leases[0].upper.clone().expect("upper");
        std::fs::create_dir_all(&upper).expect("mkdir");
        std::fs::write(upper.join("big"), vec![0u8; 4096]).expect("write");
        leases[0].saved.record(5120);
        let notes = store.settle("repo", "build", "run", &leases, true).await;
        assert!(notes[0].outcome.contains("--cache-max"), "{notes:?}");
        assert!(!store.base_path("repo", "build", true, "c").exists());
        assert!(!dir.path().join("caches/.upper/run").exists(), "the promotion's archive went with the run's folder");
    }

    #[test]
    fn the_disk_floor_names_the_flag() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(check_disk_floor(dir.path(), 1).is_ok());
        let cause = check_disk_floor(dir.path(), u64::MAX).expect_err("breached");
        assert!(cause.starts_with("disk floor") && cause.contains("--disk-floor"), "{cause}");
    }
}
