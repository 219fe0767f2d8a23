//! A check's output files: found by looking the requested name up in the check's record (never
//! by joining a request's path onto a folder), opened without following a link, and served only
//! when what was opened is a regular file inside the check's outputs folder. Images are shown
//! inline, SVG sandboxed; every other file is a download.

use std::fs::File;
use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use crate::checks::CheckRecord;
use crate::report::OutputFile;

/// The Content-Security-Policy of a served output: nothing it holds may run or load anything
/// (an SVG's scripts, a download opened in place).
pub const OUTPUT_CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; sandbox";

/// How an output is shown on the check's page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An image the browser decodes: PNG, JPEG, GIF, WebP, SVG.
    Image(&'static str),
    /// Text: previewed on the page, and downloadable.
    Text,
    /// Anything else: downloadable.
    Other,
}

/// An image's media type, by its extension.
pub fn image_type(path: &str) -> Option<&'static str> {
    let extension = path.rsplit_once('.').map(|(_, extension)| extension.to_ascii_lowercase())?;
    match extension.as_str() {
        "png" => Some("image/png"),
        "jpg" | "jpeg" => Some("image/jpeg"),
        "gif" => Some("image/gif"),
        "webp" => Some("image/webp"),
        "svg" => Some("image/svg+xml"),
        _ => None,
    }
}

/// The output of `record` named `name`, when the record lists it and its name is a relative
/// path of plain components.
pub fn find<'a>(record: &'a CheckRecord, name: &str) -> Option<&'a OutputFile> {
    let output = record.outputs.iter().find(|output| output.path == name)?;
    let plain = output.path.split('/').all(|part| !part.is_empty() && part != "." && part != "..");
    plain.then_some(output)
}

/// Opens an output under `dir`: no link followed at its last component, and the opened file
/// must be a regular file whose real path is inside `dir`'s real path (so no link in between
/// leads out either).
pub fn open(dir: &Path, output: &OutputFile) -> Option<(File, u64)> {
    let root = std::fs::canonicalize(dir).ok()?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(root.join(&output.path))
        .ok()?;
    let metadata = file.metadata().ok()?;
    if !metadata.is_file() {
        return None;
    }
    let opened = opened_path(&file)?;
    if !opened.starts_with(&root) || opened == root {
        return None;
    }
    Some((file, metadata.len()))
}

/// The real path of an open file, as the kernel names it.
fn opened_path(file: &File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd as _;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

/// The most bytes of a text output previewed on the page.
pub const PREVIEW: usize = 16 << 10;
/// The most outputs (other than images) looked into for a preview on one page.
pub const MAX_PREVIEWS: usize = 20;

/// How an output is shown, and, for text, its first [`PREVIEW`] bytes as text.
pub fn classify(dir: &Path, output: &OutputFile) -> (Kind, Option<String>) {
    if let Some(media) = image_type(&output.path) {
        return (Kind::Image(media), None);
    }
    let Some((file, _)) = open(dir, output) else { return (Kind::Other, None) };
    let mut head = Vec::with_capacity(PREVIEW.min(output.bytes as usize));
    if file.take(PREVIEW as u64).read_to_end(&mut head).is_err() || head.contains(&0) {
        return (Kind::Other, None);
    }
    match std::str::from_utf8(&head) {
        Ok(text) => (Kind::Text, Some(text.to_string())),
        // A preview cut inside a character is still text.
        Err(error) if error.error_len().is_none() => {
            (Kind::Text, Some(String::from_utf8_lossy(&head[..error.valid_up_to()]).into_owned()))
        }
        Err(_) => (Kind::Other, None),
    }
}

/// A `Content-Disposition` value: inline or attachment, with the file's base name encoded as
/// RFC 5987 says (so no quote or control character reaches the header).
pub fn disposition(inline: bool, path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let mut encoded = String::with_capacity(base.len());
    for byte in base.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    let kind = if inline { "inline" } else { "attachment" };
    format!("{kind}; filename*=UTF-8''{encoded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(path: &str) -> OutputFile {
        OutputFile { path: path.into(), bytes: 1, image: false }
    }

    #[test]
    fn only_a_regular_file_inside_the_folder_opens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outputs = dir.path().join("outputs");
        std::fs::create_dir_all(outputs.join("sub")).expect("mkdir");
        std::fs::write(outputs.join("sub/ok.txt"), "ok").expect("write");
        std::fs::write(dir.path().join("secret"), "secret").expect("write");
        std::os::unix::fs::symlink(dir.path().join("secret"), outputs.join("link")).expect("symlink");
        std::os::unix::fs::symlink(dir.path(), outputs.join("up")).expect("symlink");
        nix::unistd::mkfifo(&outputs.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
        assert!(open(&outputs, &output("sub/ok.txt")).is_some());
        for refused in ["link", "up/secret", "fifo", "sub", "missing", "../secret"] {
            assert!(open(&outputs, &output(refused)).is_none(), "{refused}");
        }
    }

    #[test]
    fn names_are_looked_up_in_the_record_and_must_be_plain() {
        let mut record: CheckRecord = serde_json::from_value(serde_json::json!({
            "run_id": "r", "repository": "x", "repository_key": "k", "workflow": "w", "event": "push",
            "commit": "c", "git_ref": "refs/heads/main", "pull": null, "head": null, "base": null,
            "trusted": true, "runner_id": "me", "status": "success", "cause": null, "outputs_dir": null,
            "queued_at": 0, "started_at": null, "finished_at": null, "duration_ms": null
        }))
        .expect("a record");
        record.outputs = vec![output("a.png"), output("../x"), output("/etc/passwd"), output("d/./e")];
        assert!(find(&record, "a.png").is_some());
        for refused in ["b.png", "../x", "/etc/passwd", "d/./e", ""] {
            assert!(find(&record, refused).is_none(), "{refused}");
        }
    }

    #[test]
    fn dispositions_encode_the_name() {
        assert_eq!(disposition(false, "d/a \"b\".txt"), "attachment; filename*=UTF-8''a%20%22b%22.txt");
        assert_eq!(disposition(true, "plot.png"), "inline; filename*=UTF-8''plot.png");
    }
}
