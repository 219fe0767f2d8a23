//! Tar streams for the side channel: packing a folder without following links, and unpacking
//! or copying an archive from the other side only after vetting each entry.
//!
//! The vetting rules live here only: [`unpack_vetted`] and [`copy_vetted`] (for an executor
//! that hands the stream to a tool that would unpack it as given, like `docker cp`) share them.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use tar::{Archive, Builder, Entry, EntryType, Header};

/// Why an archive was refused or could not be unpacked.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// An entry that must not be unpacked: an absolute path, `..`, a link leaving the tree,
    /// a device node.
    #[error("refused tar entry {path:?}: {reason}")]
    Refused {
        /// The entry's path as the archive names it.
        path: String,
        /// Why.
        reason: &'static str,
    },
    /// The archive is larger than its bound.
    #[error("tar stream is over its bound of {max_bytes} bytes{}", at_entry(entry))]
    TooLarge {
        /// The bound.
        max_bytes: u64,
        /// The entry being read when the stream crossed it, as the archive names it.
        entry: Option<String>,
    },
    /// Reading the stream or writing the tree failed.
    #[error("tar stream: {0}")]
    Io(#[from] io::Error),
}

fn at_entry(entry: &Option<String>) -> String {
    entry.as_ref().map(|entry| format!(" at entry {entry:?}")).unwrap_or_default()
}

/// Packs the contents of `root` (not `root` itself) into a tar stream, preserving modes,
/// symlinks (as links, never followed) and empty folders. Returns the writer.
pub fn pack_dir<W: Write>(root: &Path, out: W) -> io::Result<W> {
    pack_dir_skipping(root, out).map(|(out, _)| out)
}

/// Why an entry of a folder was left out of its archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its path, relative to the folder.
    pub path: PathBuf,
    /// Why, in a few words.
    pub reason: &'static str,
}

/// Packs `root` like [`pack_dir`], leaving out what no archive of outputs may hold, each named
/// in the list returned: special files (FIFOs, sockets, device nodes) and symlinks whose target
/// leaves the folder. What a step wrote is then downloaded, and only those are lost.
pub fn pack_dir_skipping<W: Write>(root: &Path, out: W) -> io::Result<(W, Vec<Skipped>)> {
    let mut files = Vec::new();
    collect(root, Path::new(""), &mut files)?;
    let mut kept = Vec::with_capacity(files.len());
    let mut skipped = Vec::new();
    for path in files {
        match skip_reason(root, &path)? {
            Some(reason) => skipped.push(Skipped { path, reason }),
            None => kept.push(path),
        }
    }
    Ok((pack_paths(root, &kept, out)?, skipped))
}

/// Why `path` under `root` cannot go into an archive of outputs, if it cannot.
fn skip_reason(root: &Path, path: &Path) -> io::Result<Option<&'static str>> {
    use std::os::unix::fs::FileTypeExt as _;
    let metadata = fs::symlink_metadata(root.join(path))?;
    let kind = metadata.file_type();
    Ok(if kind.is_fifo() {
        Some("a FIFO")
    } else if kind.is_socket() {
        Some("a socket")
    } else if kind.is_block_device() || kind.is_char_device() {
        Some("a device node")
    } else if kind.is_symlink() {
        let target = fs::read_link(root.join(path))?;
        let depth = path.components().count();
        (!link_stays_inside(depth, &target)).then_some("a symlink whose target leaves the folder")
    } else {
        None
    })
}

/// Packs the given paths, relative to `root`, in the order given. Folders named are added as
/// folders (not their contents); parents are not added.
pub fn pack_paths<W: Write>(root: &Path, relative: &[PathBuf], out: W) -> io::Result<W> {
    // tar writes a header and then a file in 8 KiB pieces: each a syscall, or a wake-up of an
    // async bridge, without a buffer.
    let mut builder = Builder::new(io::BufWriter::with_capacity(STREAM_BUFFER, out));
    builder.follow_symlinks(false);
    for path in relative {
        let full = root.join(path);
        let metadata = fs::symlink_metadata(&full)?;
        if metadata.is_dir() {
            let mut header = tar::Header::new_gnu();
            header.set_metadata(&metadata);
            header.set_entry_type(EntryType::Directory);
            header.set_size(0);
            builder.append_data(&mut header, path, io::empty())?;
        } else {
            builder.append_path_with_name(&full, path)?;
        }
    }
    builder.into_inner()?.into_inner().map_err(io::IntoInnerError::into_error)
}

/// The buffer between a tar stream and its reader or writer.
const STREAM_BUFFER: usize = 256 << 10;

fn collect(root: &Path, relative: &Path, into: &mut Vec<PathBuf>) -> io::Result<()> {
    let mut entries = fs::read_dir(root.join(relative))?.collect::<io::Result<Vec<_>>>()?;
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        let path = relative.join(entry.file_name());
        into.push(path.clone());
        if entry.file_type()?.is_dir() {
            collect(root, &path, into)?;
        }
    }
    Ok(())
}

/// What an unpack wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Unpacked {
    /// Bytes of tar stream read.
    pub bytes: u64,
    /// Entries written.
    pub entries: u64,
}

/// Unpacks a tar stream into `dest` (created if missing), vetting every entry first: absolute
/// paths, `..`, symlinks and hard links that leave the tree, and device nodes are refused, and
/// the stream may not pass `max_bytes`. Modes are kept, without setuid, setgid or sticky bits;
/// runs of zeros in files become holes, so a sparse file stays sparse.
///
/// All or nothing: the stream is unpacked into a fresh folder beside `dest` and only moved
/// into `dest` once whole and vetted (merged with what `dest` holds, an entry replacing a
/// file or link of the same path, never written through a link already there); a refused
/// or broken stream leaves `dest` as it was.
pub fn unpack_vetted<R: Read>(input: R, dest: &Path, max_bytes: u64) -> Result<Unpacked, UnpackError> {
    let Some(name) = dest.file_name() else {
        fs::create_dir_all(dest)?;
        return unpack_into(input, dest, max_bytes);
    };
    let parent = dest.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent)?;
    let staging = staging_folder(parent, name)?;
    let unpacked = unpack_into(input, &staging, max_bytes).and_then(|unpacked| {
        check_merge(&staging, dest)?;
        merge(&staging, dest)?;
        Ok(unpacked)
    });
    match fs::remove_dir_all(&staging) {
        Err(error) if error.kind() != io::ErrorKind::NotFound && unpacked.is_ok() => Err(error.into()),
        _ => unpacked,
    }
}

/// A fresh private folder `.<name>.unpacking-<pid>-<n>` in `parent`.
fn staging_folder(parent: &Path, name: &std::ffi::OsStr) -> io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    loop {
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut staging = std::ffi::OsString::from(".");
        staging.push(name);
        staging.push(format!(".unpacking-{}-{number}", std::process::id()));
        let path = parent.join(staging);
        match fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => return Ok(path),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
        }
    }
}

/// Refuses, before anything moves, a merge that would replace a folder with a file.
fn check_merge(from: &Path, to: &Path) -> io::Result<()> {
    let Ok(target) = fs::symlink_metadata(to) else {
        return Ok(());
    };
    let source = fs::symlink_metadata(from)?;
    if !target.is_dir() {
        return Ok(());
    }
    if !source.is_dir() {
        return Err(io::Error::other(format!("cannot replace the folder {} with a file", to.display())));
    }
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        check_merge(&entry.path(), &to.join(entry.file_name()))?;
    }
    Ok(())
}

/// Moves the tree `from` into `to`: renamed whole where `to` is missing, merged entry by
/// entry into a folder, replacing files and links (never following them).
fn merge(from: &Path, to: &Path) -> io::Result<()> {
    let target = match fs::symlink_metadata(to) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => return fs::rename(from, to),
        Err(error) => return Err(error),
        Ok(metadata) => metadata,
    };
    let source = fs::symlink_metadata(from)?;
    match (source.is_dir(), target.is_dir()) {
        (true, true) => {
            for entry in fs::read_dir(from)? {
                let entry = entry?;
                merge(&entry.path(), &to.join(entry.file_name()))?;
            }
            fs::set_permissions(to, source.permissions())
        }
        (false, true) => Err(io::Error::other(format!("cannot replace the folder {} with a file", to.display()))),
        // A file or link there is replaced; a link is never followed.
        (true, false) => {
            fs::remove_file(to)?;
            fs::rename(from, to)
        }
        (false, false) => fs::rename(from, to),
    }
}

/// Unpacks into an existing folder (see [`unpack_vetted`]).
fn unpack_into<R: Read>(input: R, dest: &Path, max_bytes: u64) -> Result<Unpacked, UnpackError> {
    // tar reads 512-byte headers: each a syscall, or a wake-up of an async bridge, without a
    // buffer. The count is of what tar took, then of the rest as it is drained.
    let counter =
        CountingReader { inner: io::BufReader::with_capacity(STREAM_BUFFER, input), count: 0, max: max_bytes };
    let mut archive = Archive::new(counter);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(false);
    archive.set_mask(0o7000);
    let mut entries = 0;
    let mut vetter = Vetter::default();
    let mut current: Option<String> = None;
    for entry in archive.entries()? {
        let mut entry = entry.map_err(|error| over_or_io(error, max_bytes, &current))?;
        current = Some(String::from_utf8_lossy(&entry.path_bytes()).into_owned());
        if vetter.vet(&mut entry)? == Vetted::Skip {
            continue;
        }
        let size = entry.header().size()?;
        if entry.raw_header_position().saturating_add(size) > max_bytes {
            return Err(UnpackError::TooLarge { max_bytes, entry: current });
        }
        let written = match entry.header().entry_type() {
            EntryType::Regular | EntryType::Continuous => write_sparse(&mut entry, dest),
            _ => entry.unpack_in(dest).map(|_| ()),
        };
        written.map_err(|error| over_or_io(error, max_bytes, &current))?;
        entries += 1;
    }
    // Read the end-of-archive blocks and any record padding, so the whole stream is consumed.
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(|error| over_or_io(error, max_bytes, &current))?;
    Ok(Unpacked { bytes: rest.count, entries })
}

/// Writes a vetted regular file entry under `dest`, seeking over every 64 KiB block of zeros
/// (a hole), then sets its length, mode (`0o777` bits) and modification time.
fn write_sparse<R: Read>(entry: &mut Entry<'_, R>, dest: &Path) -> io::Result<()> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let relative: PathBuf =
        entry.path()?.components().filter(|component| matches!(component, Component::Normal(_))).collect();
    let path = dest.join(relative);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    match fs::symlink_metadata(&path) {
        Ok(metadata) if metadata.is_dir() => {
            return Err(io::Error::other(format!("cannot replace the folder {} with a file", path.display())));
        }
        Ok(_) => fs::remove_file(&path)?,
        Err(_) => {}
    }
    let mode = entry.header().mode()? & 0o777;
    let mtime = entry.header().mtime()?;
    let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    let mut block = vec![0u8; 64 << 10];
    let mut length = 0u64;
    loop {
        let mut filled = 0;
        while filled < block.len() {
            match entry.read(&mut block[filled..]) {
                Ok(0) => break,
                Ok(read) => filled += read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        if filled == 0 {
            break;
        }
        if block[..filled].iter().all(|&byte| byte == 0) {
            file.seek(SeekFrom::Current(filled as i64))?;
        } else {
            file.write_all(&block[..filled])?;
        }
        length += filled as u64;
    }
    file.set_len(length)?;
    file.set_permissions(fs::Permissions::from_mode(mode))?;
    file.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime))?;
    Ok(())
}

/// Copies a tar stream from `input` to `output`, vetting every entry as [`unpack_vetted`]
/// does (sparse files are refused too: they cannot be written again as they came). Each
/// accepted entry is written again with its header (times, link target), its mode masked to
/// `0o777`; the root entry (`.`) and extension headers are left out. Returns the number of
/// entries written. The stream is read to its end; bound it before, if it needs a bound.
pub fn copy_vetted<R: Read, W: Write>(input: R, output: W) -> Result<u64, UnpackError> {
    copy_entries(input, output, false, None).map(|(written, _)| written)
}

/// Copies a tar stream as [`copy_vetted`] does, then, only once the whole stream has been read
/// and every entry passed, appends one more: an empty file named `seal`. A tool that unpacks the
/// copy in the environment knows from the seal that it got the upload whole and vetted: a refused
/// or broken stream ends before it. Returns the number of entries copied, the seal left out.
pub fn copy_vetted_sealed<R: Read, W: Write>(input: R, output: W, seal: &str) -> Result<u64, UnpackError> {
    copy_entries(input, output, false, Some(seal)).map(|(written, _)| written)
}

/// Copies a tar stream as [`copy_vetted`] does, but leaves out, each named in the list returned,
/// what no archive of outputs may hold and a folder may: special files (FIFOs, sockets, device
/// nodes) and symlinks whose target leaves the tree, as [`pack_dir_skipping`] does when it packs
/// a folder itself. For an executor whose download is packed by a tool that keeps them
/// (`docker cp`, `tar c`). Anything else refused stays refused.
pub fn copy_skipping<R: Read, W: Write>(input: R, output: W) -> Result<(u64, Vec<Skipped>), UnpackError> {
    copy_entries(input, output, true, None)
}

/// Why a refused entry can be left out of a download instead, if it can.
fn skippable<R: Read>(entry: &Entry<'_, R>, reason: &'static str) -> Option<&'static str> {
    match entry.header().entry_type() {
        EntryType::Fifo => Some("a FIFO"),
        EntryType::Char | EntryType::Block => Some("a device node"),
        EntryType::Symlink if reason == "link leaves the tree" => Some("a symlink whose target leaves the folder"),
        EntryType::Regular
        | EntryType::Continuous
        | EntryType::Directory
        | EntryType::GNUSparse
        | EntryType::Link
        | EntryType::Symlink => None,
        _ => Some("an entry of an unknown type"),
    }
}

fn copy_entries<R: Read, W: Write>(
    input: R,
    output: W,
    skip: bool,
    seal: Option<&str>,
) -> Result<(u64, Vec<Skipped>), UnpackError> {
    let mut skipped = Vec::new();
    let mut archive = Archive::new(input);
    // Buffered: tar writes headers and 8 KiB pieces, each a write of a pipe otherwise.
    let mut builder = Builder::new(io::BufWriter::with_capacity(STREAM_BUFFER, output));
    builder.follow_symlinks(false);
    let mut written = 0;
    let mut vetter = Vetter::default();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let vetted = match vetter.vet(&mut entry) {
            Err(UnpackError::Refused { path, reason }) if skip => match skippable(&entry, reason) {
                Some(why) => {
                    skipped.push(Skipped { path: PathBuf::from(path), reason: why });
                    continue;
                }
                None => return Err(UnpackError::Refused { path, reason }),
            },
            vetted => vetted?,
        };
        if vetted == Vetted::Skip {
            continue;
        }
        let path = entry.path()?.into_owned();
        let mut header = entry.header().clone();
        match vetted {
            Vetted::Link(target) => builder.append_link(&mut header, &path, &target)?,
            _ if header.entry_type() == EntryType::GNUSparse => return Err(refused(&entry, "sparse file")),
            _ => {
                header.set_mode(header.mode()? & 0o777);
                builder.append_data(&mut header, &path, &mut entry)?;
            }
        }
        written += 1;
    }
    // Read the end-of-archive blocks and any record padding, so the whole stream is consumed
    // (and a stream that breaks there gets no seal).
    io::copy(&mut archive.into_inner(), &mut io::sink())?;
    if let Some(seal) = seal {
        let mut header = Header::new_gnu();
        header.set_entry_type(EntryType::Regular);
        header.set_size(0);
        header.set_mode(0o600);
        builder.append_data(&mut header, seal, io::empty())?;
    }
    builder.into_inner()?.flush()?;
    Ok((written, skipped))
}

/// What vetting made of an entry.
#[derive(Debug, PartialEq, Eq)]
enum Vetted {
    /// An extension header or the root folder itself: nothing to write.
    Skip,
    /// A file or a folder inside the tree.
    Content,
    /// A symlink or hard link whose target stays inside the tree.
    Link(PathBuf),
}

/// The rules every entry passes: a relative path without `..`, links that stay inside, no
/// device node, fifo or unknown entry type. A link's target is resolved through the links seen
/// before it (`a/l1 -> ..` then `l2 -> a/l1/..` would leave the tree, though each looks inside on
/// its own), and a link made where an earlier link's target went through is a reason to resolve
/// every link again (`l2 -> a/l1/..` then `a/l1 -> ..` leaves it too); a loop of links is refused
/// with them. No entry may be written through a link.
#[derive(Default)]
struct Vetter {
    /// The symlinks seen so far, by their path as normal components from the root: each
    /// with the folder it is read from and its target, as the archive gave it.
    links: HashMap<PathBuf, (PathBuf, PathBuf)>,
    /// Every path the resolution of a link's target went through.
    visited: HashSet<PathBuf>,
}

/// The most links one resolution follows, as the kernel's `ELOOP` bound.
const MAX_LINK_HOPS: usize = 40;

impl Vetter {
    fn vet<R: Read>(&mut self, entry: &mut Entry<'_, R>) -> Result<Vetted, UnpackError> {
        let path = entry.path()?.into_owned();
        let Some(depth) = vetted_depth(&path) else {
            return Err(refused(entry, "absolute path or `..`"));
        };
        let normal: PathBuf = path.components().filter(|component| matches!(component, Component::Normal(_))).collect();
        if normal.ancestors().skip(1).any(|ancestor| self.links.contains_key(ancestor)) {
            return Err(refused(entry, "path through a link"));
        }
        let entry_type = entry.header().entry_type();
        let vetted = match entry_type {
            EntryType::Regular | EntryType::Continuous | EntryType::Directory | EntryType::GNUSparse => Vetted::Content,
            EntryType::Symlink | EntryType::Link => {
                let Some(target) = entry.link_name()?.map(|target| target.into_owned()) else {
                    return Err(refused(entry, "link without a target"));
                };
                let from = if entry_type == EntryType::Link {
                    Path::new("")
                } else {
                    normal.parent().unwrap_or(Path::new(""))
                };
                let lexically_inside = if entry_type == EntryType::Link {
                    vetted_depth(&target).is_some()
                } else {
                    !target.is_absolute() && link_stays_inside(depth, &target)
                };
                let mut visited = HashSet::new();
                let leads_inside = self.resolve(from, &target, &mut 0, &mut visited).is_some();
                if !(lexically_inside && leads_inside) {
                    return Err(refused(entry, "link leaves the tree"));
                }
                self.visited.extend(visited);
                if entry_type == EntryType::Symlink {
                    let changes_others = self.visited.contains(&normal);
                    let from = from.to_path_buf();
                    self.links.insert(normal.clone(), (from, target.clone()));
                    if changes_others && !self.every_link_inside() {
                        // Refused, it is not in the tree: the links before it lead where they did.
                        self.links.remove(&normal);
                        return Err(refused(entry, "link leaves the tree"));
                    }
                }
                Vetted::Link(target)
            }
            EntryType::XGlobalHeader | EntryType::XHeader | EntryType::GNULongName | EntryType::GNULongLink => {
                return Ok(Vetted::Skip);
            }
            _ => return Err(refused(entry, "device node, fifo or unknown entry type")),
        };
        Ok(if depth == 0 { Vetted::Skip } else { vetted })
    }

    /// Where `target`, read from the folder `from`, leads, following the links seen so far
    /// (`hops` counts them); `None` when it leaves the tree or follows too many links. Every
    /// path it goes through is added to `visited`.
    fn resolve(&self, from: &Path, target: &Path, hops: &mut usize, visited: &mut HashSet<PathBuf>) -> Option<PathBuf> {
        let mut at = from.to_path_buf();
        for component in target.components() {
            match component {
                Component::Normal(name) => {
                    at.push(name);
                    visited.insert(at.clone());
                    if let Some((link_from, link_target)) = self.links.get(&at) {
                        *hops += 1;
                        if *hops > MAX_LINK_HOPS {
                            return None;
                        }
                        at = self.resolve(link_from, link_target, hops, visited)?;
                    }
                }
                Component::ParentDir => {
                    if !at.pop() {
                        return None;
                    }
                }
                Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => return None,
            }
        }
        Some(at)
    }

    /// Whether every link seen so far still leads inside the tree.
    fn every_link_inside(&mut self) -> bool {
        let mut visited = HashSet::new();
        let inside =
            self.links.values().all(|(from, target)| self.resolve(from, target, &mut 0, &mut visited).is_some());
        self.visited.extend(visited);
        inside
    }
}

/// The refusal of an entry, naming it as the archive does.
fn refused<R: Read>(entry: &Entry<'_, R>, reason: &'static str) -> UnpackError {
    UnpackError::Refused { path: String::from_utf8_lossy(&entry.path_bytes()).into_owned(), reason }
}

/// The number of normal components of a safe relative path, or `None` for an unsafe one.
fn vetted_depth(path: &Path) -> Option<usize> {
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

/// Whether a relative symlink target, read from a link `depth` components deep, stays inside.
fn link_stays_inside(depth: usize, target: &Path) -> bool {
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

fn over_or_io(error: io::Error, max_bytes: u64, entry: &Option<String>) -> UnpackError {
    if error.kind() == io::ErrorKind::FileTooLarge {
        UnpackError::TooLarge { max_bytes, entry: entry.clone() }
    } else {
        UnpackError::Io(error)
    }
}

struct CountingReader<R> {
    inner: R,
    count: u64,
    max: u64,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.count += read as u64;
        if self.count > self.max {
            return Err(io::Error::new(io::ErrorKind::FileTooLarge, "tar stream over its bound"));
        }
        Ok(read)
    }
}

#[cfg(test)]
mod tests;
