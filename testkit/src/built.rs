//! The programs a workspace built, found beside the test binary that looks for them, for a test
//! that needs another package's binary (`env!("CARGO_BIN_EXE_...")` names only its own).

use std::path::PathBuf;

/// The folder of the built binaries: a test binary lives in `target/<profile>/deps/`, a binary
/// in `target/<profile>/`.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let folder = exe.parent().expect("the test binary's folder");
    let dir = if folder.ends_with("deps") { folder.parent().expect("target/<profile>") } else { folder };
    dir.to_path_buf()
}

/// A built binary by name, which must exist (`cargo build --workspace --bins` builds them all).
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(path.is_file(), "{} is not built: run `cargo build --workspace --bins` first", path.display());
    path
}
