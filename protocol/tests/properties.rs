//! Property tests: the frame decoder under any chunking, and tar vetting against archives
//! built from hostile parts. No panic, and the guarantees hold for every input tried.

use std::fs;
use std::path::{Component, Path, PathBuf};

use bytes::BytesMut;
use knotless_protocol::framing;
use knotless_protocol::tarball;
use proptest::prelude::*;
use tokio_util::codec::Decoder;

/// Bytes that make frames interesting: JSON punctuation, newlines, invalid UTF-8.
fn frame_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(vec![b'{', b'}', b'"', b'a', b'\n', b'\r', 0xff, 0x00, b' ']), 0..4096)
}

/// Where to cut a stream into chunks.
fn cuts() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..4096, 0..32)
}

/// Decodes `input` as it arrives in chunks cut at `cuts`, then at its end.
fn decode_in_chunks(input: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut codec = framing::codec();
    let mut buffer = BytesMut::new();
    let mut frames = Vec::new();
    let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut % (input.len() + 1)).collect();
    cuts.sort_unstable();
    cuts.push(input.len());
    let mut from = 0;
    for cut in cuts {
        buffer.extend_from_slice(&input[from..cut.max(from)]);
        from = cut.max(from);
        while let Some(frame) = codec.decode(&mut buffer).expect("frames under the bound") {
            frames.push(frame.to_vec());
        }
    }
    while let Some(frame) = codec.decode_eof(&mut buffer).expect("frames under the bound") {
        frames.push(frame.to_vec());
    }
    frames
}

proptest! {
    #[test]
    fn frames_do_not_depend_on_how_the_stream_is_cut(input in frame_bytes(), cuts in cuts()) {
        let whole = decode_in_chunks(&input, &[]);
        prop_assert_eq!(decode_in_chunks(&input, &cuts), whole.clone());
        // Every frame is a line of the input, in order.
        let mut expected: Vec<Vec<u8>> = input.split(|&byte| byte == b'\n').map(<[u8]>::to_vec).collect();
        if input.ends_with(b"\n") || input.is_empty() {
            expected.pop();
        }
        prop_assert_eq!(whole, expected);
    }
}

/// One entry of a hostile archive: its kind, its path and its link target, from parts that
/// make paths and links leave the tree.
#[derive(Debug, Clone)]
enum Kind {
    File,
    Folder,
    Symlink,
    Hardlink,
}

fn part() -> impl Strategy<Value = &'static str> {
    // Mostly names, so that many archives pass and their links are checked; sometimes a part
    // that climbs, an absolute path, or a name that a later link shadows.
    prop_oneof![
        12 => prop::sample::select(vec!["a", "b", "c"]),
        1 => Just(".."),
        1 => Just("."),
        1 => Just("/"),
        1 => Just("c/.."),
    ]
}

fn path() -> impl Strategy<Value = String> {
    prop::collection::vec(part(), 1..5).prop_map(|parts| parts.join("/"))
}

fn entry() -> impl Strategy<Value = (Kind, String, String)> {
    let kind = prop_oneof![4 => Just(Kind::Folder), 3 => Just(Kind::File), 2 => Just(Kind::Symlink), 1 => Just(Kind::Hardlink)];
    (kind, path(), path())
}

/// A tar archive holding exactly the entries given, paths and targets written as given.
fn archive(entries: &[(Kind, String, String)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (kind, path, target) in entries {
        let mut header = tar::Header::new_old();
        let name = &mut header.as_old_mut().name;
        let bytes = path.as_bytes();
        let length = bytes.len().min(name.len());
        name[..length].copy_from_slice(&bytes[..length]);
        let (entry_type, body): (tar::EntryType, &[u8]) = match kind {
            Kind::File => (tar::EntryType::Regular, b"data"),
            Kind::Folder => (tar::EntryType::Directory, b""),
            Kind::Symlink => (tar::EntryType::Symlink, b""),
            Kind::Hardlink => (tar::EntryType::Link, b""),
        };
        header.set_entry_type(entry_type);
        header.set_mode(0o755);
        header.set_size(body.len() as u64);
        if matches!(kind, Kind::Symlink | Kind::Hardlink) {
            let link = &mut header.as_old_mut().linkname;
            let bytes = target.as_bytes();
            let length = bytes.len().min(link.len());
            link[..length].copy_from_slice(&bytes[..length]);
        }
        header.set_cksum();
        builder.append(&header, body).expect("append");
    }
    builder.into_inner().expect("archive")
}

/// Every path under `root`, links not followed.
fn walk(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in fs::read_dir(&folder).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                folders.push(path.clone());
            }
            found.push(path);
        }
    }
    found
}

/// Where a symlink at `link` (under `root`) leads, lexically; `None` when above `root`.
fn lexical_target(root: &Path, link: &Path) -> Option<PathBuf> {
    let target = fs::read_link(link).ok()?;
    if target.is_absolute() {
        return None;
    }
    let mut at: Vec<_> = link.parent()?.strip_prefix(root).ok()?.components().collect();
    for component in target.components() {
        match component {
            Component::Normal(_) => at.push(component),
            Component::ParentDir => {
                at.pop()?;
            }
            _ => {}
        }
    }
    Some(at.iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn a_vetted_unpack_never_writes_outside_and_never_leaves_a_link_out(
        entries in prop::collection::vec(entry(), 1..6)
    ) {
        // Deep enough that a path climbing out of `dest` lands in the sandbox.
        let sandbox = tempfile::tempdir().expect("tempdir");
        let dest = sandbox.path().join("x/y/z/dest");
        fs::create_dir_all(&dest).expect("mkdir");
        let bytes = archive(&entries);
        let result = tarball::unpack_vetted(bytes.as_slice(), &dest, 1 << 20);
        // Nothing but the destination in the sandbox: no escape, no staging folder left.
        let mut around: Vec<PathBuf> = walk(sandbox.path())
            .into_iter()
            .filter(|path| !path.starts_with(&dest))
            .map(|path| path.strip_prefix(sandbox.path()).expect("inside").to_path_buf())
            .collect();
        around.sort();
        prop_assert_eq!(around, ["x", "x/y", "x/y/z"].map(PathBuf::from).to_vec());
        match result {
            Ok(_) => {
                for path in walk(&dest) {
                    if path.symlink_metadata().is_ok_and(|metadata| metadata.is_symlink()) {
                        prop_assert!(lexical_target(&dest, &path).is_some(), "{} leaves the tree", path.display());
                    }
                }
            }
            // All or nothing: a refusal leaves the destination empty, as it was.
            Err(error) => prop_assert_eq!(walk(&dest), Vec::<PathBuf>::new(), "{}", error),
        }
    }
}
