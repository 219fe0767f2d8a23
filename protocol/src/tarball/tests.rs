use super::*;
use std::os::unix::fs::{PermissionsExt, symlink};

fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    fs::create_dir_all(root.join("src/empty")).expect("mkdir");
    fs::write(root.join("src/run.sh"), "#!/bin/sh\necho hi\n").expect("write");
    fs::set_permissions(root.join("src/run.sh"), fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::write(root.join("readme"), "text").expect("write");
    fs::set_permissions(root.join("readme"), fs::Permissions::from_mode(0o640)).expect("chmod");
    symlink("src/run.sh", root.join("link")).expect("symlink");
    symlink("../missing", root.join("src/dangling-inside")).expect("symlink");
    dir
}

#[test]
fn a_tree_round_trips_with_modes_links_and_empty_folders() {
    let source = tree();
    let archive = pack_dir(source.path(), Vec::new()).expect("pack");
    let dest = tempfile::tempdir().expect("tempdir");
    let unpacked = unpack_vetted(archive.as_slice(), dest.path(), 1 << 20).expect("unpack");
    assert_eq!(unpacked.bytes, archive.len() as u64);
    let root = dest.path();
    let mode = |path: &str| fs::symlink_metadata(root.join(path)).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode("src/run.sh"), 0o755);
    assert_eq!(mode("readme"), 0o640);
    assert!(root.join("src/empty").is_dir());
    assert_eq!(fs::read_link(root.join("link")).expect("readlink"), PathBuf::from("src/run.sh"));
    assert_eq!(fs::read_to_string(root.join("link")).expect("read through link"), "#!/bin/sh\necho hi\n");
}

fn archive_with(entry_type: EntryType, path: &str, link: Option<&str>) -> Vec<u8> {
    archive_of(&[(entry_type, path, link)])
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
        let archive = archive_with(entry_type, path, link);
        let dest = tempfile::tempdir().expect("tempdir");
        let result = unpack_vetted(archive.as_slice(), dest.path(), 1 << 20);
        assert!(matches!(result, Err(UnpackError::Refused { .. })), "{path}: {result:?}");
        let copied = copy_vetted(archive.as_slice(), Vec::new());
        assert!(matches!(copied, Err(UnpackError::Refused { .. })), "copy of {path}: {copied:?}");
    }
}

#[test]
fn a_copy_passes_a_tree_through_with_modes_and_links() {
    let source = tempfile::tempdir().expect("tempdir");
    let root = source.path();
    fs::create_dir_all(root.join("a/empty")).expect("mkdir");
    fs::write(root.join("a/run.sh"), "echo\n").expect("write");
    fs::set_permissions(root.join("a/run.sh"), fs::Permissions::from_mode(0o4755)).expect("chmod");
    symlink("a/run.sh", root.join("link")).expect("symlink");
    let long = "x".repeat(150);
    fs::write(root.join(&long), "long").expect("write");
    let archive = pack_dir(root, Vec::new()).expect("pack");
    let mut vetted = Vec::new();
    assert_eq!(copy_vetted(archive.as_slice(), &mut vetted).expect("vetted"), 5);
    let modes = Archive::new(vetted.as_slice())
        .entries()
        .expect("entries")
        .map(|entry| entry.expect("entry").header().mode().expect("mode"))
        .collect::<Vec<_>>();
    assert!(modes.iter().all(|mode| mode & 0o7000 == 0), "{modes:?}");
    let dest = tempfile::tempdir().expect("tempdir");
    unpack_vetted(vetted.as_slice(), dest.path(), 1 << 20).expect("unpack");
    let mode = fs::metadata(dest.path().join("a/run.sh")).expect("stat").permissions().mode();
    assert_eq!(mode & 0o7777, 0o755, "no setuid bit");
    assert!(dest.path().join("a/empty").is_dir());
    assert_eq!(fs::read_link(dest.path().join("link")).expect("link"), Path::new("a/run.sh"));
    assert_eq!(fs::read_to_string(dest.path().join(&long)).expect("long name"), "long");
}

#[test]
fn a_link_inside_the_tree_is_kept() {
    let archive = archive_with(EntryType::Symlink, "a/b/link", Some("../c"));
    let dest = tempfile::tempdir().expect("tempdir");
    unpack_vetted(archive.as_slice(), dest.path(), 1 << 20).expect("unpack");
    assert_eq!(fs::read_link(dest.path().join("a/b/link")).expect("readlink"), PathBuf::from("../c"));
}

#[test]
fn an_archive_over_its_bound_is_refused_naming_the_bound_and_the_entry() {
    let source = tempfile::tempdir().expect("tempdir");
    fs::write(source.path().join("big"), vec![7u8; 64 * 1024]).expect("write");
    let archive = pack_dir(source.path(), Vec::new()).expect("pack");
    let dest = tempfile::tempdir().expect("tempdir");
    let result = unpack_vetted(archive.as_slice(), dest.path(), 16 * 1024);
    let error = result.expect_err("over its bound");
    assert_eq!(error.to_string(), "tar stream is over its bound of 16384 bytes at entry \"big\"");
}

/// A folder's entries, sorted, each with its kind and contents.
fn listing(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut paths = Vec::new();
    collect(root, Path::new(""), &mut paths).expect("walk");
    for path in paths {
        let full = root.join(&path);
        let metadata = fs::symlink_metadata(&full).expect("stat");
        let what = if metadata.is_symlink() {
            format!("-> {}", fs::read_link(&full).expect("link").display())
        } else if metadata.is_dir() {
            "/".to_string()
        } else {
            String::from_utf8_lossy(&fs::read(&full).expect("read")).into_owned()
        };
        found.push(format!("{} {what}", path.display()));
    }
    found
}

#[test]
fn a_refused_or_broken_stream_leaves_the_folder_as_it_was() {
    let dest = tempfile::tempdir().expect("tempdir");
    fs::write(dest.path().join("kept"), "before").expect("write");
    let before = listing(dest.path());
    // Good entries, then a refused one.
    let mut builder = Builder::new(Vec::new());
    for (name, body) in [("new", "x"), ("kept", "overwritten")] {
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, name, body.as_bytes()).expect("append");
    }
    let mut bad = tar::Header::new_gnu();
    bad.set_entry_type(EntryType::Fifo);
    bad.set_size(0);
    builder.append_data(&mut bad, "fifo", io::empty()).expect("append");
    let archive = builder.into_inner().expect("archive");
    assert!(matches!(unpack_vetted(archive.as_slice(), dest.path(), 1 << 20), Err(UnpackError::Refused { .. })));
    assert_eq!(listing(dest.path()), before);
    // Cut short in the middle of an entry.
    let cut = &archive[..archive.len() / 2];
    assert!(unpack_vetted(cut, dest.path(), 1 << 20).is_err());
    assert_eq!(listing(dest.path()), before);
    let parent = dest.path().parent().expect("parent");
    let stray: Vec<_> = fs::read_dir(parent)
        .expect("list")
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().contains(".unpacking-"))
        .filter(|entry| {
            entry.file_name().to_string_lossy().contains(&*dest.path().file_name().expect("name").to_string_lossy())
        })
        .collect();
    assert!(stray.is_empty(), "a staging folder was left: {stray:?}");
}

#[test]
fn an_unpack_merges_into_a_folder_and_never_writes_through_a_link_there() {
    let outside = tempfile::tempdir().expect("tempdir");
    let dest = tempfile::tempdir().expect("tempdir");
    fs::create_dir(dest.path().join("sub")).expect("mkdir");
    fs::write(dest.path().join("sub/old"), "old").expect("write");
    symlink(outside.path(), dest.path().join("escape")).expect("symlink");
    let source = tempfile::tempdir().expect("tempdir");
    fs::create_dir_all(source.path().join("sub")).expect("mkdir");
    fs::create_dir_all(source.path().join("escape")).expect("mkdir");
    fs::write(source.path().join("sub/new"), "new").expect("write");
    fs::write(source.path().join("escape/planted"), "planted").expect("write");
    let archive = pack_dir(source.path(), Vec::new()).expect("pack");
    unpack_vetted(archive.as_slice(), dest.path(), 1 << 20).expect("unpack");
    assert_eq!(listing(dest.path()), ["escape /", "escape/planted planted", "sub /", "sub/new new", "sub/old old"]);
    assert_eq!(fs::read_dir(outside.path()).expect("list").count(), 0, "written through the link");
}

#[test]
fn a_sparse_file_stays_sparse() {
    use std::os::unix::fs::MetadataExt as _;
    let source = tempfile::tempdir().expect("tempdir");
    let file = fs::File::create(source.path().join("sparse")).expect("create");
    file.set_len(64 << 20).expect("grow");
    drop(file);
    fs::OpenOptions::new()
        .append(true)
        .open(source.path().join("sparse"))
        .and_then(|mut file| file.write_all(b"end"))
        .expect("write");
    let archive = pack_dir(source.path(), Vec::new()).expect("pack");
    let dest = tempfile::tempdir().expect("tempdir");
    unpack_vetted(archive.as_slice(), dest.path(), 1 << 30).expect("unpack");
    let metadata = fs::metadata(dest.path().join("sparse")).expect("stat");
    assert_eq!(metadata.len(), (64 << 20) + 3);
    assert!(metadata.blocks() * 512 < 1 << 20, "{} blocks for a file of 64 MiB of zeros", metadata.blocks());
    let bytes = fs::read(dest.path().join("sparse")).expect("read");
    assert!(bytes.ends_with(b"end") && bytes[..64 << 20].iter().all(|&byte| byte == 0));
}

#[test]
fn setuid_bits_are_dropped() {
    let source = tempfile::tempdir().expect("tempdir");
    let file = source.path().join("tool");
    fs::write(&file, "x").expect("write");
    fs::set_permissions(&file, fs::Permissions::from_mode(0o4755)).expect("chmod");
    let archive = pack_dir(source.path(), Vec::new()).expect("pack");
    let dest = tempfile::tempdir().expect("tempdir");
    unpack_vetted(archive.as_slice(), dest.path(), 1 << 20).expect("unpack");
    let mode = fs::metadata(dest.path().join("tool")).expect("stat").permissions().mode();
    assert_eq!(mode & 0o7777, 0o755);
}

/// An archive of the given entries, names written raw as a hostile archive would.
fn archive_of(entries: &[(EntryType, &str, Option<&str>)]) -> Vec<u8> {
    let mut builder = Builder::new(Vec::new());
    for (entry_type, path, link) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(*entry_type);
        header.set_size(0);
        header.set_mode(if *entry_type == EntryType::Directory { 0o755 } else { 0o644 });
        if let Some(link) = link {
            header.set_link_name(link).expect("link name");
        }
        // `set_path` refuses `..`, so write the name bytes the way a hostile archive would.
        let name = &mut header.as_old_mut().name;
        name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_cksum();
        builder.append(&header, io::empty()).expect("append");
    }
    builder.into_inner().expect("finish")
}

#[test]
fn a_chain_of_links_that_leaves_the_tree_is_refused() {
    // Each link looks inside on its own; through `l1`, `l2` leads above the root.
    let chain = archive_of(&[
        (EntryType::Directory, "p", None),
        (EntryType::Directory, "p/q", None),
        (EntryType::Symlink, "p/q/l1", Some("../..")),
        (EntryType::Symlink, "l2", Some("p/q/l1/..")),
    ]);
    let dest = tempfile::tempdir().expect("tempdir");
    let unpacked = unpack_vetted(chain.as_slice(), dest.path(), 1 << 20);
    assert!(matches!(unpacked, Err(UnpackError::Refused { reason: "link leaves the tree", .. })), "{unpacked:?}");
    let copied = copy_vetted(chain.as_slice(), Vec::new());
    assert!(matches!(copied, Err(UnpackError::Refused { reason: "link leaves the tree", .. })), "{copied:?}");
    // Writing through a link is refused too.
    let through = archive_of(&[(EntryType::Symlink, "dir", Some(".")), (EntryType::Regular, "dir/x", None)]);
    let dest = tempfile::tempdir().expect("tempdir");
    let unpacked = unpack_vetted(through.as_slice(), dest.path(), 1 << 20);
    assert!(matches!(unpacked, Err(UnpackError::Refused { reason: "path through a link", .. })), "{unpacked:?}");
}

#[test]
fn a_chain_of_links_that_leaves_the_tree_is_refused_in_either_order() {
    // `l2` comes first and looks inside; `p/q/l1`, which comes after it, makes it leave.
    let chain = archive_of(&[
        (EntryType::Directory, "p", None),
        (EntryType::Directory, "p/q", None),
        (EntryType::Symlink, "l2", Some("p/q/l1/..")),
        (EntryType::Symlink, "p/q/l1", Some("../..")),
    ]);
    let dest = tempfile::tempdir().expect("tempdir");
    let unpacked = unpack_vetted(chain.as_slice(), dest.path(), 1 << 20);
    assert!(matches!(unpacked, Err(UnpackError::Refused { reason: "link leaves the tree", .. })), "{unpacked:?}");
    let copied = copy_vetted(chain.as_slice(), Vec::new());
    assert!(matches!(copied, Err(UnpackError::Refused { reason: "link leaves the tree", .. })), "{copied:?}");
    // A loop of links leads nowhere: refused too.
    let looped = archive_of(&[(EntryType::Symlink, "a", Some("b")), (EntryType::Symlink, "b", Some("a"))]);
    let dest = tempfile::tempdir().expect("tempdir");
    let unpacked = unpack_vetted(looped.as_slice(), dest.path(), 1 << 20);
    assert!(matches!(unpacked, Err(UnpackError::Refused { reason: "link leaves the tree", .. })), "{unpacked:?}");
    // A link to a link that comes after it, inside, is kept.
    let later = archive_of(&[
        (EntryType::Directory, "lib", None),
        (EntryType::Symlink, "lib/libfoo.so", Some("libfoo.so.1")),
        (EntryType::Symlink, "lib/libfoo.so.1", Some("../lib/libfoo.so.1.2")),
        (EntryType::Regular, "lib/libfoo.so.1.2", None),
    ]);
    let dest = tempfile::tempdir().expect("tempdir");
    unpack_vetted(later.as_slice(), dest.path(), 1 << 20).expect("links to later links inside");
}

#[test]
fn a_copy_for_a_download_leaves_out_special_files_and_links_that_leave() {
    let folder = archive_of(&[
        (EntryType::Regular, "./kept", None),
        (EntryType::Symlink, "./inside", Some("kept")),
        (EntryType::Symlink, "./escaping", Some("../..")),
        (EntryType::Fifo, "./fifo", None),
        (EntryType::Char, "./null", None),
        (EntryType::Symlink, "l2", Some("p/l1/..")),
        (EntryType::Directory, "p", None),
        (EntryType::Symlink, "p/l1", Some("..")),
    ]);
    let (copied, skipped) = copy_skipping(folder.as_slice(), Vec::new()).expect("copied");
    assert_eq!(copied, 4);
    let left_out: Vec<(&str, &str)> =
        skipped.iter().map(|entry| (entry.path.to_str().expect("utf-8"), entry.reason)).collect();
    assert_eq!(
        left_out,
        [
            ("./escaping", "a symlink whose target leaves the folder"),
            ("./fifo", "a FIFO"),
            ("./null", "a device node"),
            ("p/l1", "a symlink whose target leaves the folder"),
        ]
    );
    // What is refused for a reason of its own stays refused.
    let hostile = archive_of(&[(EntryType::Regular, "../x", None)]);
    assert!(matches!(copy_skipping(hostile.as_slice(), Vec::new()), Err(UnpackError::Refused { .. })));
}

#[test]
fn links_to_links_inside_the_tree_are_kept() {
    let libraries = archive_of(&[
        (EntryType::Directory, "lib", None),
        (EntryType::Regular, "lib/libfoo.so.1.2", None),
        (EntryType::Symlink, "lib/libfoo.so.1", Some("libfoo.so.1.2")),
        (EntryType::Symlink, "lib/libfoo.so", Some("libfoo.so.1")),
        (EntryType::Symlink, "current", Some("lib/libfoo.so")),
        (EntryType::Symlink, "lib/up", Some("../lib")),
    ]);
    let dest = tempfile::tempdir().expect("tempdir");
    unpack_vetted(libraries.as_slice(), dest.path(), 1 << 20).expect("a tree of links inside");
    assert_eq!(fs::read_link(dest.path().join("current")).expect("readlink"), PathBuf::from("lib/libfoo.so"));
    copy_vetted(libraries.as_slice(), Vec::new()).expect("copied");
}
