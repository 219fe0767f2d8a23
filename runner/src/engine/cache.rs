//! Caches in a run: each `cache:` path's base streamed in before the steps (after the
//! checkout), and the path streamed back into the run's upper layer after passing steps,
//! before the environment is stopped; a layer that came back whole is recorded on its lease.
//! What becomes of the layer is the caller's business.

use std::path::PathBuf;

use knotless_protocol::ErrorKind;
use knotless_protocol::messages::SessionPaths;
use tokio_util::sync::CancellationToken;

use super::{Ended, RunPlan};
use crate::host::{HostError, Session};
use crate::report::RunLog;

/// One cache path of a run, as the cache store leased it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheLease {
    /// The path as the workflow names it: relative to the work folder, or absolute.
    pub path: String,
    /// The tar archive to stream in before the steps; `None` starts cold.
    pub base: Option<PathBuf>,
    /// The folder to bring the path back into after passing steps; `None` brings nothing back
    /// (an untrusted run, whose layer would be dropped).
    pub upper: Option<PathBuf>,
    /// The most bytes brought back.
    pub max_bytes: u64,
    /// Set once the layer came back whole; the cache store promotes nothing else.
    pub saved: SavedLayer,
}

/// Whether a lease's layer came back whole: recorded by the engine only when the download
/// completed and its stream was vetted to its end (or the steps left no such path: an empty
/// layer), and read by the cache store, which promotes no other layer. Never inferred from a
/// folder existing. A copy of a lease made before the save does not see the record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedLayer(std::sync::OnceLock<u64>);

impl SavedLayer {
    /// Records a layer that came back whole, with its bytes of tar stream.
    pub fn record(&self, tar_bytes: u64) {
        let _ = self.0.set(tar_bytes);
    }

    /// The bytes of tar stream of a layer that came back whole; `None` for any other.
    pub fn bytes(&self) -> Option<u64> {
        self.0.get().copied()
    }
}

/// Where `path` is in the session: absolute as given, relative under the work folder.
pub fn resolve(paths: &SessionPaths, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{}", paths.work.trim_end_matches('/'), path.trim_start_matches("./"))
    }
}

/// Streams each of `caches`' bases in. A base that cannot be read or streamed is logged and the path
/// starts cold: a broken cache never fails a run.
pub(super) async fn restore(
    session: &Session,
    plan: &RunPlan,
    caches: &[CacheLease],
    log: &mut RunLog<'_>,
    cancel: &CancellationToken,
) -> Result<(), Ended> {
    for lease in caches {
        let target = resolve(session.paths(), &lease.path);
        let Some(base) = &lease.base else {
            log.note(format!("cache {}: cold", lease.path));
            continue;
        };
        let file = match tokio::fs::File::open(base).await {
            Ok(file) => file,
            Err(error) => {
                log.note(format!("cache {}: cold (cannot read {}: {error})", lease.path, base.display()));
                continue;
            }
        };
        let limits = &plan.limits;
        let upload = session.upload(&target, file, limits.checkout_max_bytes, limits.transfer_timeout, cancel);
        match super::watched(log, session, &format!("cache {}", lease.path), upload).await {
            Ok(bytes) => log.note(format!("cache {}: warm ({bytes} bytes into {target})", lease.path)),
            Err(error) if cancel.is_cancelled() => return Err(Ended::from_host("cannot restore a cache", &error)),
            Err(error) => log.note(format!("cache {}: cold (the upload failed: {error})", lease.path)),
        }
    }
    Ok(())
}

/// Brings each lease's path back into its upper folder, and records on the lease each layer
/// that came back whole. A path the steps did not leave is an empty layer; a failed transfer
/// is not recorded and its folder is removed (the download has ended whatever it wrote: no
/// task of it writes on), so nothing of it is promoted.
pub(super) async fn save(session: &Session, plan: &RunPlan, caches: &[CacheLease], log: &mut RunLog<'_>) {
    let never = CancellationToken::new();
    for lease in caches {
        let Some(upper) = &lease.upper else { continue };
        let source = resolve(session.paths(), &lease.path);
        let fresh = upper.clone();
        let made = super::blocking(move || {
            let _ = std::fs::remove_dir_all(&fresh);
            std::fs::create_dir_all(&fresh)
        })
        .await;
        if let Err(error) = made {
            log.note(format!("cache {}: cannot create {}: {error}", lease.path, upper.display()));
            continue;
        }
        let download = session.download(&source, upper, lease.max_bytes, plan.limits.transfer_timeout, &never);
        let result = super::watched(log, session, &format!("cache {}", lease.path), download).await;
        match result {
            // A cache without what the executor left out would not work as the steps left it
            // (a virtualenv whose `bin/python3` links to the system's): none is kept.
            Ok(downloaded) if !downloaded.left_out.is_empty() => {
                log.note(format!("cache {}: not saved: {}", lease.path, left_out_cause(&downloaded.left_out)));
                let gone = upper.clone();
                let _ = super::blocking(move || std::fs::remove_dir_all(gone)).await;
            }
            Ok(downloaded) => {
                lease.saved.record(downloaded.bytes);
                log.note(format!("cache {}: saved {} bytes of tar", lease.path, downloaded.bytes));
            }
            Err(HostError::Answered { error, .. }) if error.kind == ErrorKind::NotFound => {
                lease.saved.record(0);
                log.note(format!("cache {}: the steps left no {source}; an empty layer", lease.path));
            }
            Err(error) => {
                log.note(format!("cache {}: not saved: {error}", lease.path));
                let gone = upper.clone();
                let _ = super::blocking(move || std::fs::remove_dir_all(gone)).await;
            }
        }
    }
}

/// Why a cache the download left entries out of is not kept: the first entries by name.
fn left_out_cause(left_out: &[knotless_protocol::messages::LeftOut]) -> String {
    let named: Vec<String> =
        left_out.iter().take(3).map(|entry| format!("{} ({})", entry.path, entry.reason)).collect();
    let more = match left_out.len().saturating_sub(3) {
        0 => String::new(),
        more => format!(" and {more} more"),
    };
    format!(
        "the executor left {}{more} out of it; a cache holds only what is inside its folder, and without \
         them it would not work (a link to outside the folder: make it a copy, or cache what it points into)",
        named.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_left_incomplete_names_what_is_missing() {
        let entry = |path: &str| knotless_protocol::messages::LeftOut {
            path: path.into(),
            reason: "a symlink whose target leaves the folder".into(),
        };
        let cause = left_out_cause(&[entry("bin/python3")]);
        assert!(
            cause.starts_with("the executor left bin/python3 (a symlink whose target leaves the folder) out of it;"),
            "{cause}"
        );
        let cause = left_out_cause(&(0..5).map(|n| entry(&format!("l{n}"))).collect::<Vec<_>>());
        assert!(
            cause.contains("l0 (a symlink whose target leaves the folder), l1 (")
                && cause.contains(" and 2 more out of it"),
            "{cause}"
        );
    }

    #[test]
    fn relative_paths_resolve_under_the_work_folder() {
        let paths = SessionPaths { work: "/s/work/".into(), steps: "/s/steps".into(), outputs: "/s/outputs".into() };
        assert_eq!(resolve(&paths, "target"), "/s/work/target");
        assert_eq!(resolve(&paths, "./a/b"), "/s/work/a/b");
        assert_eq!(resolve(&paths, "/cache"), "/cache");
    }
}
