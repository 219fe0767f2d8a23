//! What a dead daemon left in its state folder besides its checks and its cache store, removed
//! at the next start: the temporary files of its atomic writes (`state.json`, check records and
//! logs, merge queue records) and the staging folders of the outputs it was unpacking. The
//! sweep runs under the state folder's lock ([`crate::state::StateLock`]): no other daemon uses
//! the folder, and no other command writes these, so each of them is a dead daemon's.

use std::path::Path;

use crate::cache::leftovers::{Swept, is_old_temporary_name, remove};

/// How deep a merge queue's records lie under `queue/` (a branch's name may hold `/`).
const QUEUE_DEPTH: usize = 16;

/// Removes the temporary files and staging folders a dead daemon left under `state`.
pub fn sweep(state: &Path) -> Swept {
    let mut swept = Swept::default();
    temporary_files(state, 0, &mut swept);
    for repository in folders(&state.join("checks")) {
        temporary_files(&repository, 0, &mut swept);
    }
    temporary_files(&state.join("queue"), QUEUE_DEPTH, &mut swept);
    for repository in folders(&state.join("outputs")) {
        for entry in std::fs::read_dir(&repository).into_iter().flatten().flatten() {
            let staging = is_staging_name(&entry.file_name().to_string_lossy());
            if staging && entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                remove(&entry.path(), &mut swept);
            }
        }
    }
    swept
}

/// The folders in `dir`, links left out.
fn folders(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .map(|entry| entry.path())
        .collect()
}

/// Removes the temporary files of atomic writes in `dir`, and in its folders `depth` deep.
fn temporary_files(dir: &Path, depth: usize, swept: &mut Swept) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_file() && is_old_temporary_name(&entry.file_name().to_string_lossy()) {
            remove(&entry.path(), swept);
        } else if kind.is_dir() && depth > 0 {
            temporary_files(&entry.path(), depth - 1, swept);
        }
    }
}

/// Whether `name` is a download's staging folder: `.<name>.unpacking-<pid>-<n>`.
fn is_staging_name(name: &str) -> bool {
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    name.starts_with('.')
        && name
            .rsplit_once(".unpacking-")
            .is_some_and(|(_, rest)| rest.split_once('-').is_some_and(|(pid, number)| digits(pid) && digits(number)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_daemons_temporary_files_and_staging_folders_are_swept_and_nothing_else() {
        let state = tempfile::tempdir().expect("tempdir");
        let state = state.path();
        let checks = state.join("checks/repo-1");
        let queue = state.join("queue/repo-1/release");
        let outputs = state.join("outputs/repo-1");
        for dir in [&checks, &queue, &outputs.join("run-1"), &outputs.join(".run-2.unpacking-123-0/sub")] {
            std::fs::create_dir_all(dir).expect("mkdir");
        }
        let left = [state.join(".tmpAb12Cd"), checks.join(".tmpZz99Yy"), queue.join(".tmp000aaa")];
        let kept = [state.join("state.json"), checks.join("run-1.json"), checks.join("run-1.log"), queue.join("v2")];
        for file in left.iter().chain(&kept) {
            std::fs::write(file, "x").expect("write");
        }
        std::fs::write(outputs.join("run-1/report.txt"), "kept").expect("write");
        let swept = sweep(state);
        assert!(swept.failures.is_empty(), "{swept:?}");
        assert_eq!(swept.removed.len(), 4, "{swept:?}");
        assert!(left.iter().all(|file| !file.exists()) && !outputs.join(".run-2.unpacking-123-0").exists());
        assert!(kept.iter().all(|file| file.exists()) && outputs.join("run-1/report.txt").exists());
        for name in [".run.unpacking-1-2", ".a.b.unpacking-33-0"] {
            assert!(is_staging_name(name), "{name}");
        }
        for name in ["run.unpacking-1-2", ".run.unpacking-x-2", ".run.unpacking-1", ".run"] {
            assert!(!is_staging_name(name), "{name}");
        }
    }
}
