//! Vets an upload's tar stream entry by entry on its way to `docker cp`, which would otherwise
//! unpack absolute paths, `..`, links leaving the folder and device nodes as given.
//!
//! Each accepted entry is written again, with its header (mode, times, link target) kept.

use std::io::{self, Read, Write};
use std::path::{Component, Path};

use tar::{Archive, Builder, EntryType};

/// Why an entry was refused.
#[derive(Debug)]
pub enum Refusal {
    /// An entry that must not be unpacked.
    Entry { path: String, reason: &'static str },
    /// Reading or writing failed.
    Io(io::Error),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Entry { path, reason } => write!(formatter, "refused tar entry {path:?}: {reason}"),
            Refusal::Io(error) => write!(formatter, "tar stream: {error}"),
        }
    }
}

impl From<io::Error> for Refusal {
    fn from(error: io::Error) -> Self {
        Refusal::Io(error)
    }
}

/// Copies a tar stream from `input` to `output`, refusing unsafe entries; returns the count
/// of entries written.
pub fn copy_vetted<R: Read, W: Write>(input: R, output: W) -> Result<u64, Refusal> {
    let mut archive = Archive::new(input);
    let mut builder = Builder::new(output);
    builder.follow_symlinks(false);
    let mut written = 0;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let shown = path.display().to_string();
        let refuse = |reason| Refusal::Entry { path: shown.clone(), reason };
        let Some(depth) = depth(&path) else {
            return Err(refuse("absolute path or `..`"));
        };
        let entry_type = entry.header().entry_type();
        let mut header = entry.header().clone();
        match entry_type {
            EntryType::XGlobalHeader | EntryType::XHeader | EntryType::GNULongName | EntryType::GNULongLink => continue,
            _ if depth == 0 => continue,
            EntryType::Regular | EntryType::Continuous | EntryType::Directory => {
                header.set_mode(header.mode()? & 0o777);
                builder.append_data(&mut header, &path, &mut entry)?;
            }
            EntryType::Symlink | EntryType::Link => {
                let target = entry.link_name()?.ok_or_else(|| refuse("link without a target"))?.into_owned();
                let inside = if entry_type == EntryType::Link {
                    self::depth(&target).is_some()
                } else {
                    stays_inside(depth, &target)
                };
                if !inside {
                    return Err(refuse("link leaves the folder"));
                }
                builder.append_link(&mut header, &path, &target)?;
            }
            _ => return Err(refuse("device node, fifo, sparse file or unknown entry type")),
        }
        written += 1;
    }
    builder.into_inner()?.flush()?;
    // Read the end-of-archive blocks and any record padding, so the whole stream is counted.
    io::copy(&mut archive.into_inner(), &mut io::sink())?;
    Ok(written)
}

/// The number of normal components of a safe relative path, or `None` for an unsafe one.
fn depth(path: &Path) -> Option<usize> {
    let mut depth = 0;
    for component in path.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(depth)
}

/// Whether a symlink target, read from a link `depth` components deep, stays inside.
fn stays_inside(depth: usize, target: &Path) -> bool {
    let mut level = depth as isize - 1;
    for component in target.components() {
        match component {
            Component::Normal(_) => level += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                level -= 1;
                if level < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive_with(entry_type: EntryType, path: &str, link: Option<&str>) -> Vec<u8> {
        let mut builder = Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(entry_type);
        header.set_size(0);
        header.set_mode(0o644);
        if let Some(link) = link {
            header.set_link_name(link).expect("link name");
        }
        // `set_path` refuses `..`, so write the name bytes the way a hostile archive would.
        let name = &mut header.as_old_mut().name;
        name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_cksum();
        builder.append(&header, io::empty()).expect("append");
        builder.into_inner().expect("finish")
    }

    #[test]
    fn hostile_entries_are_refused() {
        let cases = [
            (EntryType::Regular, "../escape", None),
            (EntryType::Regular, "/etc/evil", None),
            (EntryType::Symlink, "link", Some("/etc/passwd")),
            (EntryType::Symlink, "a/link", Some("../../outside")),
            (EntryType::Link, "hard", Some("../outside")),
            (EntryType::Char, "tty", None),
            (EntryType::Block, "disk", None),
            (EntryType::Fifo, "fifo", None),
        ];
        for (entry_type, path, link) in cases {
            let result = copy_vetted(archive_with(entry_type, path, link).as_slice(), Vec::new());
            assert!(matches!(result, Err(Refusal::Entry { .. })), "{path}: {result:?}");
        }
    }

    #[test]
    fn a_tree_passes_through_with_modes_and_links() {
        use std::os::unix::fs::PermissionsExt;
        let source = tempfile::tempdir().expect("tempdir");
        let root = source.path();
        std::fs::create_dir_all(root.join("a/empty")).expect("mkdir");
        std::fs::write(root.join("a/run.sh"), "echo\n").expect("write");
        std::fs::set_permissions(root.join("a/run.sh"), std::fs::Permissions::from_mode(0o4755)).expect("chmod");
        std::os::unix::fs::symlink("a/run.sh", root.join("link")).expect("symlink");
        let long = "x".repeat(150);
        std::fs::write(root.join(&long), "long").expect("write");
        let archive = knotless_protocol::tarball::pack_dir(root, Vec::new()).expect("pack");
        let mut vetted = Vec::new();
        assert_eq!(copy_vetted(archive.as_slice(), &mut vetted).expect("vetted"), 5);
        let dest = tempfile::tempdir().expect("tempdir");
        knotless_protocol::tarball::unpack_vetted(vetted.as_slice(), dest.path(), 1 << 20).expect("unpack");
        let mode = std::fs::metadata(dest.path().join("a/run.sh")).expect("stat").permissions().mode();
        assert_eq!(mode & 0o7777, 0o755, "no setuid bit");
        assert!(dest.path().join("a/empty").is_dir());
        assert_eq!(std::fs::read_link(dest.path().join("link")).expect("link"), Path::new("a/run.sh"));
        assert_eq!(std::fs::read_to_string(dest.path().join(&long)).expect("long name"), "long");
    }
}
