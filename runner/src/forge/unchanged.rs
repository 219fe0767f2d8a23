//! Cheap change detection before a fetch. A local repository (a path or a `file://` URL) is
//! unchanged while its refs' files are: their names, inodes, sizes and modification times,
//! read with `stat` alone (a ref is written to a new file renamed into place, so each update
//! changes its inode). With the mirror's own refs unchanged too, the last snapshot still
//! holds, and a round costs no process. A remote repository is unchanged when `git ls-remote`
//! (one round trip) lists the refs the mirror holds.

use std::hash::{Hash as _, Hasher as _};
use std::path::{Path, PathBuf};

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
        crate::forge::Git::in_folder(dir).run(&args).await.expect("git");
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
