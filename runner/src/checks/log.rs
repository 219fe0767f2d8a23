//! A run's live log file: masked lines appended and written out after each chunk of output and
//! each note, so `logs --follow` sees them, cut at the cap with a note.

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::Path;

use anyhow::Context as _;

use crate::report::{LogLine, LogSink};

/// A log file written line by line, and out to the file at each flush of the sink.
pub struct LiveLog {
    file: Option<BufWriter<File>>,
    written: usize,
    cap: usize,
    /// The line being rendered, reused from line to line.
    rendered: String,
}

impl LiveLog {
    /// Creates (or empties) the file at `path`.
    pub fn create(path: &Path, cap: usize) -> anyhow::Result<LiveLog> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        // Readable by this user alone, from its creation: a log may quote what a step printed.
        let file = std::os::unix::fs::OpenOptionsExt::mode(
            std::fs::OpenOptions::new().write(true).create(true).truncate(true),
            0o600,
        )
        .open(path)
        .with_context(|| format!("cannot create the log {}", path.display()))?;
        Ok(LiveLog { file: Some(BufWriter::with_capacity(64 << 10, file)), written: 0, cap, rendered: String::new() })
    }

    /// Appends one line (already masked).
    pub fn append(&mut self, text: &str) {
        let Some(file) = self.file.as_mut() else { return };
        if self.written + text.len() + 1 > self.cap {
            let _ = file.write_all(b"==> the log was cut here at its cap of 1 MB\n").and_then(|()| file.flush());
            self.file = None;
            return;
        }
        self.written += text.len() + 1;
        if file.write_all(text.as_bytes()).and_then(|()| file.write_all(b"\n")).is_err() {
            self.file = None;
        }
    }
}

impl LogSink for LiveLog {
    fn line(&mut self, line: &LogLine<'_>) {
        let mut rendered = std::mem::take(&mut self.rendered);
        rendered.clear();
        line.render_into(&mut rendered);
        self.append(&rendered);
        self.rendered = rendered;
    }

    fn flush(&mut self) {
        if let Some(file) = self.file.as_mut()
            && file.flush().is_err()
        {
            self.file = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_is_readable_by_its_user_alone_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("run.log");
        LiveLog::create(&path, 10).expect("create");
        let mode = std::fs::metadata(&path).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:o}");
    }

    #[test]
    fn the_log_stops_at_its_cap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("run.log");
        let mut log = LiveLog::create(&path, 10).expect("create");
        log.append("12345");
        log.append("123456789");
        log.append("more");
        log.flush();
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text, "12345\n==> the log was cut here at its cap of 1 MB\n");
    }
}
