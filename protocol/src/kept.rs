//! Kept sessions: a session started or stopped with `keep` is marked, so that a `cleanup` on
//! this machine leaves its environment until the operator removes it, or until a `cleanup`
//! with `remove_kept` does.
//!
//! A mark is an empty file, `kept/<runner id in hex>/<session id in hex>`, in the owners'
//! folder ([`crate::owner::owners_dir`], private to the user). A sweep on another machine
//! cannot see it, but it cannot check the resource's owner there either, and leaves the
//! resource all the same (see [`crate::owner`]).

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// The longest session id a mark can name (its hex is a file name of at most 250 bytes).
pub const MAX_SESSION: usize = 125;

/// The folder of the marks: `kept` in the owners' folder.
pub fn kept_dir() -> PathBuf {
    crate::owner::owners_dir().join("kept")
}

/// Marks `session` of runner `runner_id` kept, in [`kept_dir`].
pub fn mark(runner_id: &str, session: &str) -> std::io::Result<()> {
    mark_in(&kept_dir(), runner_id, session)
}

/// Removes the mark of `session`, if any.
pub fn unmark(runner_id: &str, session: &str) {
    unmark_in(&kept_dir(), runner_id, session)
}

/// The sessions of `runner_id` marked kept.
pub fn sessions(runner_id: &str) -> Vec<String> {
    sessions_in(&kept_dir(), runner_id)
}

/// [`mark`] in the folder `dir` (made, mode 0700, when missing).
pub fn mark_in(dir: &Path, runner_id: &str, session: &str) -> std::io::Result<()> {
    if session.len() > MAX_SESSION {
        return Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            format!("session id of {} bytes: a kept session's id is at most {MAX_SESSION} bytes", session.len()),
        ));
    }
    let runner = dir.join(hex(runner_id));
    std::fs::DirBuilder::new().mode(0o700).recursive(true).create(&runner)?;
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(runner.join(hex(session))) {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(error),
    }
}

/// [`unmark`] in the folder `dir`.
pub fn unmark_in(dir: &Path, runner_id: &str, session: &str) {
    let runner = dir.join(hex(runner_id));
    let _ = std::fs::remove_file(runner.join(hex(session)));
    // Only when empty.
    let _ = std::fs::remove_dir(runner);
}

/// [`sessions`] in the folder `dir`. Files that are not marks are passed over.
pub fn sessions_in(dir: &Path, runner_id: &str) -> Vec<String> {
    let mut sessions: Vec<String> = std::fs::read_dir(dir.join(hex(runner_id)))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| unhex(entry.file_name().to_str()?))
        .collect();
    sessions.sort();
    sessions
}

fn hex(text: &str) -> String {
    text.bytes().map(|byte| format!("{byte:02x}")).collect()
}

fn unhex(text: &str) -> Option<String> {
    if !text.len().is_multiple_of(2) || text.is_empty() {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..text.len()).step_by(2).map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok()).collect();
    String::from_utf8(bytes?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_names_its_session_until_it_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kept = dir.path().join("kept");
        let hostile = "../a\nb\u{1b}[31m";
        mark_in(&kept, "runner", "run-1").expect("mark");
        mark_in(&kept, "runner", hostile).expect("mark");
        mark_in(&kept, "runner", "run-1").expect("marking twice is no error");
        mark_in(&kept, "other", "run-2").expect("mark");
        assert_eq!(sessions_in(&kept, "runner"), [hostile, "run-1"]);
        assert_eq!(sessions_in(&kept, "other"), ["run-2"]);
        assert_eq!(sessions_in(&kept, ".."), Vec::<String>::new());
        unmark_in(&kept, "runner", "run-1");
        unmark_in(&kept, "runner", hostile);
        assert_eq!(sessions_in(&kept, "runner"), Vec::<String>::new());
        assert!(!kept.join(hex("runner")).exists(), "an empty runner folder is removed");
        // Every mark stays inside the folder, whatever the names.
        for entry in std::fs::read_dir(&kept).expect("list") {
            assert!(
                entry
                    .expect("entry")
                    .file_name()
                    .to_str()
                    .is_some_and(|name| name.bytes().all(|b| b.is_ascii_hexdigit()))
            );
        }
    }

    #[test]
    fn a_session_id_too_long_for_a_file_name_is_refused_naming_the_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let error = mark_in(dir.path(), "runner", &"x".repeat(MAX_SESSION + 1)).expect_err("too long");
        assert!(error.to_string().contains("at most 125 bytes"), "{error}");
        mark_in(dir.path(), "runner", &"x".repeat(MAX_SESSION)).expect("the longest allowed");
    }
}
