//! The cases of tar streams: a tree up and back, the uploads an executor must refuse (and write
//! nothing of outside their destination), the special files a step leaves in a folder that is
//! downloaded, and a missing path.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::time::Duration;

use knotless_protocol::messages::LogLevel;
use knotless_protocol::{ErrorKind, tarball};
use tar::EntryType;
use tokio_util::sync::CancellationToken;

use super::Outcome;
use super::suite::{Suite, exited, quoted};
use knotless_host::{HostError, Session, SessionEvent};

/// An upload the executor must refuse with TOO_LARGE.
struct Refusal {
    /// What is wrong with it.
    what: &'static str,
    /// Its destination, under the work folder's `refusals`.
    dest: &'static str,
    archive: Vec<u8>,
    max_bytes: u64,
    /// Where it would write if unpacked as given.
    escapes_to: Option<String>,
}

/// One entry of a hand-made archive.
struct Entry<'a> {
    path: &'a str,
    kind: EntryType,
    link: Option<&'a str>,
    data: &'a [u8],
}

impl<'a> Entry<'a> {
    fn new(kind: EntryType, path: &'a str) -> Entry<'a> {
        Entry { path, kind, link: None, data: b"" }
    }

    fn link(path: &'a str, target: &'a str) -> Entry<'a> {
        Entry { link: Some(target), ..Entry::new(EntryType::Symlink, path) }
    }

    fn file(path: &'a str, data: &'a [u8]) -> Entry<'a> {
        Entry { data, ..Entry::new(EntryType::Regular, path) }
    }
}

/// A tar archive of `entries`, their names written as given, as a hostile archive would.
fn archive(entries: &[Entry<'_>]) -> Result<Vec<u8>, String> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(entry.kind);
        header.set_size(entry.data.len() as u64);
        header.set_mode(if entry.kind == EntryType::Directory { 0o755 } else { 0o644 });
        header.set_mtime(0);
        if entry.kind == EntryType::Char {
            header.set_device_major(1).map_err(|error| error.to_string())?;
            header.set_device_minor(3).map_err(|error| error.to_string())?;
        }
        if let Some(link) = entry.link {
            header.set_link_name(link).map_err(|error| format!("link {link}: {error}"))?;
        }
        let name = &mut header.as_old_mut().name;
        if entry.path.len() > name.len() {
            return Err(format!("the entry name {} is too long for a tar header", entry.path));
        }
        name[..entry.path.len()].copy_from_slice(entry.path.as_bytes());
        header.set_cksum();
        builder.append(&header, entry.data).map_err(|error| error.to_string())?;
    }
    builder.into_inner().map_err(|error| error.to_string())
}

/// The uploads of `upload refusals`, for a work folder `work`.
fn refusals(nonce: &str, work: &str) -> Result<Vec<Refusal>, String> {
    let base = format!("{work}/refusals");
    let absolute = format!("/tmp/knotless-check-{nonce}-absolute");
    let large = vec![b'x'; 256 << 10];
    Ok(vec![
        Refusal {
            what: "an absolute path",
            dest: "absolute",
            archive: archive(&[Entry::file(&absolute, b"escaped\n")])?,
            max_bytes: 1 << 20,
            escapes_to: Some(absolute.clone()),
        },
        Refusal {
            what: "a `..` component",
            dest: "dotdot",
            archive: archive(&[Entry::file("../escaped-dotdot", b"escaped\n")])?,
            max_bytes: 1 << 20,
            escapes_to: Some(format!("{base}/escaped-dotdot")),
        },
        Refusal {
            what: "a chain of links that leaves the tree, the leaving link last",
            dest: "chain",
            archive: archive(&[
                Entry::new(EntryType::Directory, "p"),
                Entry::new(EntryType::Directory, "p/q"),
                Entry::link("p/q/l1", "../.."),
                Entry::link("l2", "p/q/l1/.."),
                Entry::file("l2/escaped-chain", b"escaped\n"),
            ])?,
            max_bytes: 1 << 20,
            escapes_to: Some(format!("{base}/escaped-chain")),
        },
        Refusal {
            what: "a chain of links that leaves the tree, the leaving link first",
            dest: "chain-reversed",
            archive: archive(&[
                Entry::new(EntryType::Directory, "p"),
                Entry::new(EntryType::Directory, "p/q"),
                Entry::link("l2", "p/q/l1/.."),
                Entry::link("p/q/l1", "../.."),
            ])?,
            max_bytes: 1 << 20,
            escapes_to: None,
        },
        Refusal {
            what: "a FIFO",
            dest: "fifo",
            archive: archive(&[Entry::new(EntryType::Fifo, "fifo")])?,
            max_bytes: 1 << 20,
            escapes_to: None,
        },
        Refusal {
            what: "a device node",
            dest: "device",
            archive: archive(&[Entry::new(EntryType::Char, "null")])?,
            max_bytes: 1 << 20,
            escapes_to: None,
        },
        Refusal {
            what: "a stream over max_bytes",
            dest: "large",
            archive: archive(&[Entry::file("large", &large)])?,
            max_bytes: 64 << 10,
            escapes_to: None,
        },
    ])
}

impl Suite {
    pub async fn round_trip(&self, session: &Session) -> Outcome {
        let source = tempfile::tempdir().map_err(|error| error.to_string())?;
        make_tree(source.path()).map_err(|error| format!("cannot make the test tree: {error}"))?;
        let archive = tarball::pack_dir(source.path(), Vec::new()).map_err(|error| error.to_string())?;
        let path = format!("{}/check-transfer", session.paths().work);
        let never = CancellationToken::new();
        let sent = session
            .upload(&path, archive.as_slice(), 1 << 20, Duration::from_secs(60), &never)
            .await
            .map_err(|error| format!("upload: {error}"))?;
        let back = tempfile::tempdir().map_err(|error| error.to_string())?;
        let dest = back.path().join("tree");
        session
            .download(&path, &dest, 1 << 20, Duration::from_secs(60), &never)
            .await
            .map_err(|error| format!("download: {error}"))?;
        compare_trees(source.path(), &dest)?;
        Ok(format!("{sent} bytes up and back, modes, symlinks and empty folders kept"))
    }

    /// Each hostile upload is answered TOO_LARGE, and nothing is written where it would have
    /// escaped to; a plain one to the same place is taken, so the refusals are the archives'.
    pub async fn upload_refusals(&self, session: &Session) -> Outcome {
        let work = session.paths().work.clone();
        let never = CancellationToken::new();
        let plain = archive(&[Entry::file("plain", b"plain\n")])?;
        session
            .upload(&format!("{work}/refusals/plain"), plain.as_slice(), 1 << 20, Duration::from_secs(60), &never)
            .await
            .map_err(|error| format!("a plain upload beside the refused ones: {error}"))?;
        let refusals = refusals(&self.nonce, &work)?;
        let mut faults = Vec::new();
        for refusal in &refusals {
            let dest = format!("{work}/refusals/{}", refusal.dest);
            let answer = session
                .upload(&dest, refusal.archive.as_slice(), refusal.max_bytes, Duration::from_secs(60), &never)
                .await;
            match answer {
                Err(HostError::Answered { error, .. }) if error.kind == ErrorKind::TooLarge => {}
                Err(HostError::Answered { error, .. }) => faults.push(format!(
                    "{} answered {} ({}), expected -32008 (TOO_LARGE)",
                    refusal.what,
                    error.kind.code(),
                    error.message
                )),
                Err(error) => faults.push(format!("{}: {error}", refusal.what)),
                Ok(_) => faults.push(format!("{} was accepted", refusal.what)),
            }
        }
        let escapes: Vec<&str> = refusals.iter().filter_map(|refusal| refusal.escapes_to.as_deref()).collect();
        let script = format!(
            "for path in {}; do if [ -e \"$path\" ] || [ -L \"$path\" ]; then echo \"$path\"; rm -rf \"$path\"; fi; done",
            escapes.iter().map(|path| quoted(path)).collect::<Vec<_>>().join(" ")
        );
        let ran = self.step(session, &script).await;
        exited(&ran, 0).map_err(|why| format!("looking outside the destinations: {why}"))?;
        let written = String::from_utf8_lossy(&ran.stdout).trim().replace('\n', ", ");
        if !written.is_empty() {
            faults.push(format!("written outside the destination: {written}"));
        }
        if !faults.is_empty() {
            return Err(faults.join("; "));
        }
        let whats: Vec<&str> = refusals.iter().map(|refusal| refusal.what).collect();
        Ok(format!("refused with TOO_LARGE, nothing written outside: {}", whats.join(", ")))
    }

    /// A step leaves a file, a link inside, a FIFO and a link leaving the folder; the download
    /// of the folder either leaves the last two out (naming them in warnings, as it should) or
    /// is refused with TOO_LARGE, but never sends them, and never hangs on the FIFO.
    pub async fn special_download(&self, session: &Session) -> Outcome {
        let path = format!("{}/special", session.paths().work);
        let script = format!(
            "mkdir {folder} && cd {folder} && echo kept > kept && ln -s kept inside && mkfifo fifo \
             && ln -s ../.. escaping",
            folder = quoted(&path)
        );
        let ran = self.step(session, &script).await;
        exited(&ran, 0).map_err(|why| format!("making the special files: {why}"))?;
        session.drain_events().await;
        let back = tempfile::tempdir().map_err(|error| error.to_string())?;
        let dest = back.path().join("special");
        let never = CancellationToken::new();
        let answer = session.download(&path, &dest, 1 << 20, Duration::from_secs(30), &never).await;
        let warnings = session
            .drain_events()
            .await
            .into_iter()
            .filter(|event| {
                matches!(event, SessionEvent::Log { level: LogLevel::Warn, message }
                    if message.contains("fifo") || message.contains("escaping"))
            })
            .count();
        match answer {
            Ok(_) => {
                if std::fs::read(dest.join("kept")).ok().as_deref() != Some(b"kept\n".as_slice()) {
                    return Err("the regular file did not come back".into());
                }
                if std::fs::read_link(dest.join("inside")).ok().as_deref() != Some(Path::new("kept")) {
                    return Err("the link inside the folder did not come back".into());
                }
                Ok(format!("left out the FIFO and the link leaving the folder, named in {warnings} warning(s)"))
            }
            Err(HostError::Answered { error, .. }) if error.kind == ErrorKind::TooLarge => {
                Ok(format!("refused the download with TOO_LARGE: {}", error.message))
            }
            Err(HostError::Answered { error, .. }) => Err(format!(
                "the download answered {} ({}), expected a result without the FIFO and the link leaving the \
                 folder, or -32008 (TOO_LARGE)",
                error.kind.code(),
                error.message
            )),
            Err(error) => Err(error.to_string()),
        }
    }

    pub async fn missing(&self, session: &Session) -> Outcome {
        let back = tempfile::tempdir().map_err(|error| error.to_string())?;
        let path = format!("{}/no-such-path-{}", session.paths().work, self.nonce);
        let never = CancellationToken::new();
        match session.download(&path, &back.path().join("x"), 1 << 20, Duration::from_secs(60), &never).await {
            Err(HostError::Answered { error, .. }) if error.kind == ErrorKind::NotFound => {
                Ok("answered NOT_FOUND".into())
            }
            Err(error) => Err(format!("expected NOT_FOUND, got: {error}")),
            Ok(_) => Err("a missing path downloaded as if it existed".into()),
        }
    }
}

fn make_tree(root: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(root.join("empty"))?;
    std::fs::create_dir_all(root.join("a/b"))?;
    std::fs::write(root.join("run.sh"), "#!/bin/sh\necho ran\n")?;
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755))?;
    std::fs::write(root.join("data"), "data\n")?;
    std::fs::set_permissions(root.join("data"), std::fs::Permissions::from_mode(0o640))?;
    std::fs::write(root.join("a/b/deep.txt"), "deep\n")?;
    symlink("data", root.join("link"))?;
    symlink("../../run.sh", root.join("a/b/up"))?;
    Ok(())
}

fn compare_trees(expected: &Path, got: &Path) -> Result<(), String> {
    for relative in ["empty", "a", "a/b", "run.sh", "data", "a/b/deep.txt", "link", "a/b/up"] {
        let want = std::fs::symlink_metadata(expected.join(relative)).map_err(|error| error.to_string())?;
        let have =
            std::fs::symlink_metadata(got.join(relative)).map_err(|_| format!("{relative} did not come back"))?;
        if want.file_type().is_symlink() {
            let target =
                std::fs::read_link(got.join(relative)).map_err(|_| format!("{relative} came back as no symlink"))?;
            let wanted = std::fs::read_link(expected.join(relative)).map_err(|error| error.to_string())?;
            if target != wanted {
                return Err(format!("{relative} points to {}, expected {}", target.display(), wanted.display()));
            }
            continue;
        }
        if want.is_dir() != have.is_dir() {
            return Err(format!("{relative} changed between folder and file"));
        }
        if !want.is_dir() {
            let mode = have.permissions().mode() & 0o777;
            if mode != want.permissions().mode() & 0o777 {
                return Err(format!(
                    "{relative} came back with mode {mode:o}, expected {:o}",
                    want.permissions().mode() & 0o777
                ));
            }
            if std::fs::read(got.join(relative)).ok() != std::fs::read(expected.join(relative)).ok() {
                return Err(format!("{relative} came back with other content"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hostile_archive_is_refused_by_the_protocols_own_vetting() {
        let suite_nonce = "n0nce";
        let work = "/w/work";
        let refusals = refusals(suite_nonce, work).expect("archives");
        assert_eq!(refusals.len(), 7);
        for refusal in refusals {
            let dest = tempfile::tempdir().expect("tempdir");
            let unpacked = tarball::unpack_vetted(refusal.archive.as_slice(), dest.path(), refusal.max_bytes);
            assert!(
                matches!(unpacked, Err(tarball::UnpackError::Refused { .. } | tarball::UnpackError::TooLarge { .. })),
                "{}: {unpacked:?}",
                refusal.what
            );
        }
        let plain = archive(&[Entry::file("plain", b"plain\n")]).expect("archive");
        let dest = tempfile::tempdir().expect("tempdir");
        tarball::unpack_vetted(plain.as_slice(), dest.path(), 1 << 20).expect("a plain archive is taken");
    }
}
