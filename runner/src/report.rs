//! What a run produced: its status, each step's outcome, the cause of an error, and its log
//! (masked, capped at 1 MB, split into lines as it streams).

use std::collections::HashMap;

use knotless_protocol::messages::Stream;
use serde::{Deserialize, Serialize};

use crate::mask::{MaskStream, Masker};

/// The most bytes of log a run keeps: its head and its tail (a marker between).
pub const LOG_CAP: usize = 1 << 20;

/// The bytes of a capped log's head: the rest of [`LOG_CAP`] is its tail, so the last step's
/// lines and the run's outcome are always kept.
pub const LOG_HEAD: usize = 768 << 10;

/// The longest line of step output: a longer one is split into lines of this many bytes, so
/// a step that never writes a newline cannot make the runner hold its whole output.
pub const MAX_LINE: usize = 64 << 10;

/// A run's status, as a check shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Waiting for a slot.
    Queued,
    /// Started.
    Running,
    /// Every step passed.
    Success,
    /// A step failed or timed out.
    Failure,
    /// Infrastructure, configuration or executor fault; the cause says which.
    Error,
    /// Someone cancelled it.
    Cancelled,
    /// Not run: a workflow it needs did not pass (the cause says which).
    Skipped,
}

impl RunStatus {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Success => "success",
            RunStatus::Failure => "failure",
            RunStatus::Error => "error",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Skipped => "skipped",
        }
    }

    /// How the run went, as a sentence says it after the run's name: `build failed`,
    /// `docs was skipped`.
    pub fn outcome(self) -> &'static str {
        match self {
            RunStatus::Queued => "is queued",
            RunStatus::Running => "is running",
            RunStatus::Success => "passed",
            RunStatus::Failure => "failed",
            RunStatus::Error => "ended in error",
            RunStatus::Cancelled => "was cancelled",
            RunStatus::Skipped => "was skipped",
        }
    }

    /// Whether the run is over.
    pub fn is_final(self) -> bool {
        !matches!(self, RunStatus::Queued | RunStatus::Running)
    }
}

/// How one step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepStatus {
    /// Exit code 0.
    Success,
    /// A non-zero exit code.
    Failure,
    /// Killed at its timeout; no exit code.
    TimedOut,
    /// The environment or the executor failed during the step.
    Error,
    /// Cancelled while running.
    Cancelled,
    /// Not run: an earlier step ended the run, or its `if:` was false (the reason says).
    Skipped,
}

impl StepStatus {
    /// The status as people read it, the same in `run`'s summary and in `checks`.
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Success => "success",
            StepStatus::Failure => "failure",
            StepStatus::TimedOut => "timed out",
            StepStatus::Error => "error",
            StepStatus::Cancelled => "cancelled",
            StepStatus::Skipped => "skipped",
        }
    }
}

/// One step of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepReport {
    /// The step's name.
    pub name: String,
    /// How it ended.
    pub status: StepStatus,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// How long it ran, in milliseconds.
    pub duration_ms: u64,
    /// Why it was skipped, when its `if:` was false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl StepReport {
    /// A step that has not run (and is skipped unless it runs).
    pub fn skipped(name: &str) -> StepReport {
        StepReport {
            name: name.to_string(),
            status: StepStatus::Skipped,
            exit_code: None,
            duration_ms: 0,
            reason: None,
        }
    }
}

/// A file the run left in its outputs folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputFile {
    /// Its path relative to the outputs folder.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Whether it is an image (shown as one in the check).
    pub image: bool,
}

/// What a run produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunReport {
    /// The run's id.
    pub run_id: String,
    /// The workflow.
    pub workflow: String,
    /// How it ended.
    pub status: RunStatus,
    /// Why it did not succeed, in one line.
    pub cause: Option<String>,
    /// Each step, in order.
    pub steps: Vec<StepReport>,
    /// The outputs, when they were downloaded.
    pub outputs: Vec<OutputFile>,
    /// How long the run took, in milliseconds.
    pub duration_ms: u64,
    /// The masked log, at most [`LOG_CAP`] bytes.
    pub log: String,
    /// Whether the log was cut at its cap.
    pub log_truncated: bool,
}

/// One line of a run's log, already masked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLine<'a> {
    /// The step it came from; `None` for the runner's own notes.
    pub step: Option<&'a str>,
    /// The stream, for step output.
    pub stream: Option<Stream>,
    /// The text, without its newline.
    pub text: &'a str,
}

impl LogLine<'_> {
    /// The line as the log file holds it.
    pub fn render(&self) -> String {
        let mut rendered = String::with_capacity(self.text.len() + 16);
        self.render_into(&mut rendered);
        rendered
    }

    /// Appends the line as the log file holds it, without its newline, to `out`.
    pub fn render_into(&self, out: &mut String) {
        match (self.step, self.stream) {
            (Some(step), stream) => {
                out.push('[');
                out.push_str(step);
                out.push_str(if stream == Some(Stream::Stderr) { "!] " } else { "] " });
            }
            (None, _) => out.push_str("==> "),
        }
        out.push_str(self.text);
    }
}

/// Where a run's log lines go as they happen (a terminal, a check's live log).
pub trait LogSink: Send {
    /// One masked line.
    fn line(&mut self, line: &LogLine<'_>);

    /// Called after each batch of lines (a chunk of output, a note, a step's end): a sink that
    /// buffers writes them out here, so that what is shown is never behind by more than a chunk.
    fn flush(&mut self) {}

    /// How far a transfer that has taken more than a second has got; `None` once it ended.
    /// Not part of the log.
    fn progress(&mut self, _progress: Option<&Progress<'_>>) {}

    /// The steps as far as the run has got, masked: each one that ended or was skipped, in
    /// order, and last the one that is `running` (its status not yet known), if one is. Told
    /// as each step starts and ends; not part of the log.
    fn steps(&mut self, _steps: &[StepReport], _running: Option<usize>) {}
}

/// A transfer under way.
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    /// What is moving: `checkout`, `outputs`, `cache PATH`.
    pub what: &'a str,
    /// The bytes of tar stream moved so far.
    pub bytes: u64,
    /// Since the transfer started.
    pub elapsed: std::time::Duration,
}

/// A sink that drops lines (the report keeps them).
pub struct NoSink;

impl LogSink for NoSink {
    fn line(&mut self, _: &LogLine<'_>) {}
}

/// A line as text, with U+FFFD for bytes that are not UTF-8 (checked with the standard
/// library's fast path first: almost every line is valid).
fn text_of(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// Masks, splits into lines, keeps the capped log, and feeds the sink.
pub(crate) struct RunLog<'a> {
    masker: Masker,
    streams: HashMap<Stream, (MaskStream, Vec<u8>)>,
    step: Option<String>,
    kept: Kept,
    sink: &'a mut dyn LogSink,
}

/// The capped log as it grows.
#[derive(Default)]
struct Kept {
    /// The log's head, up to [`LOG_HEAD`] bytes (the whole log while it is short).
    text: String,
    /// Once the head is full: the latest lines from `tail_start` on, at most
    /// `LOG_CAP - LOG_HEAD` bytes in all. What is before `tail_start` was cut; it is dropped
    /// from the buffer once it is as long as what is kept, so each byte moves once on average.
    tail: String,
    tail_start: usize,
    /// Bytes of lines dropped between the head and the tail.
    cut_bytes: usize,
    truncated: bool,
    /// The line being rendered, reused from line to line.
    rendered: String,
}

impl Kept {
    /// Keeps `line` and feeds it to `sink`.
    fn emit(&mut self, sink: &mut dyn LogSink, line: &LogLine<'_>) {
        sink.line(line);
        self.rendered.clear();
        line.render_into(&mut self.rendered);
        self.rendered.push('\n');
        if !self.truncated && self.text.len() + self.rendered.len() <= LOG_HEAD {
            self.text.push_str(&self.rendered);
            return;
        }
        self.truncated = true;
        self.tail.push_str(&self.rendered);
        let excess = (self.tail.len() - self.tail_start).saturating_sub(LOG_CAP - LOG_HEAD);
        if excess > 0 {
            // Whole lines go: the cut moves to the end of the line that holds the excess.
            let from = self.tail_start + excess - 1;
            let cut_to = match self.tail.as_bytes()[from..].iter().position(|&byte| byte == b'\n') {
                Some(offset) => from + offset + 1,
                None => self.tail.len(),
            };
            self.cut_bytes += cut_to - self.tail_start;
            self.tail_start = cut_to;
            if self.tail_start >= self.tail.len() - self.tail_start {
                self.tail.drain(..self.tail_start);
                self.tail_start = 0;
            }
        }
    }
}

impl<'a> RunLog<'a> {
    pub(crate) fn new(masker: Masker, sink: &'a mut dyn LogSink) -> RunLog<'a> {
        RunLog { masker, streams: HashMap::new(), step: None, kept: Kept::default(), sink }
    }

    /// `text` with every secret masked: for every string a check stores or prints.
    pub(crate) fn mask_text(&self, text: &str) -> String {
        String::from_utf8_lossy(&self.masker.mask(text.as_bytes())).into_owned()
    }

    /// A note of the runner's: one line of the log, masked (it may quote an executor's
    /// message), every control character in it escaped (`\n`, `\x1b`), so that no name or
    /// message it quotes starts a line of its own or reaches a terminal raw.
    pub(crate) fn note(&mut self, text: impl AsRef<str>) {
        let masked = self.masker.mask(text.as_ref().as_bytes());
        let masked = String::from_utf8_lossy(&masked);
        let line = crate::printable::name(masked.trim_end_matches(['\n', '\r']));
        self.kept.emit(self.sink, &LogLine { step: None, stream: None, text: &line });
        self.sink.flush();
    }

    /// How far a transfer has got (`None`: it ended), for the sink alone; masked as a note is.
    pub(crate) fn progress(&mut self, progress: Option<Progress<'_>>) {
        match progress {
            Some(progress) => {
                let what = self.mask_text(progress.what);
                self.sink.progress(Some(&Progress { what: &what, ..progress }));
            }
            None => self.sink.progress(None),
        }
    }

    /// Tells the sink how far the run's steps have got (see [`LogSink::steps`]), their names
    /// and reasons masked as the report's are.
    pub(crate) fn steps(&mut self, steps: &[StepReport], running: Option<usize>) {
        let masked: Vec<StepReport> = steps
            .iter()
            .map(|step| StepReport {
                name: self.mask_text(&step.name),
                reason: step.reason.as_deref().map(|reason| self.mask_text(reason)),
                ..step.clone()
            })
            .collect();
        self.sink.steps(&masked, running);
    }

    /// Starts attributing output to `step`. Its lines are labelled with its name masked and
    /// with every control character escaped, as a note writes it: a line of the log is one
    /// line, whatever the step is named.
    pub(crate) fn begin_step(&mut self, step: &str) {
        let masked = self.mask_text(step);
        self.step = Some(crate::printable::name(&masked).into_owned());
        self.streams.clear();
    }

    /// Output bytes of the current step.
    pub(crate) fn output(&mut self, stream: Stream, bytes: &[u8]) {
        let masker = &self.masker;
        let (mask, pending) = self.streams.entry(stream).or_insert_with(|| (masker.stream(), Vec::new()));
        // What is pending holds no newline and is shorter than a line: only the new bytes are
        // searched, once, and the lines are drained at the end, so the work is linear.
        let mut searched = pending.len();
        mask.push_into(bytes, pending);
        let step = self.step.as_deref();
        let mut start = 0;
        while start < pending.len() {
            let limit = pending.len().min(start + MAX_LINE);
            let (end, next) = match pending[searched.max(start)..limit].iter().position(|&byte| byte == b'\n') {
                Some(offset) => (searched.max(start) + offset, searched.max(start) + offset + 1),
                None if limit - start == MAX_LINE => (limit, limit),
                None => break,
            };
            let text = text_of(&pending[start..end]);
            self.kept.emit(self.sink, &LogLine { step, stream: Some(stream), text: &text });
            start = next;
            searched = start;
        }
        pending.drain(..start);
        self.sink.flush();
    }

    /// Flushes what the current step left without a newline.
    pub(crate) fn end_step(&mut self) {
        let mut streams: Vec<_> = self.streams.drain().collect();
        streams.sort_by_key(|(stream, _)| *stream == Stream::Stderr);
        for (stream, (mask, mut pending)) in streams {
            pending.extend_from_slice(&mask.finish());
            if !pending.is_empty() {
                let text = String::from_utf8_lossy(&pending);
                self.kept.emit(self.sink, &LogLine { step: self.step.as_deref(), stream: Some(stream), text: &text });
            }
        }
        self.sink.flush();
        self.step = None;
    }

    /// Whether the log was cut at its cap.
    pub(crate) fn truncated(&self) -> bool {
        self.kept.truncated && self.kept.cut_bytes > 0
    }

    /// The log as kept: the whole of it, or its head, a marker saying how much was cut, and
    /// its tail.
    pub(crate) fn take_text(&mut self) -> String {
        let kept = std::mem::take(&mut self.kept);
        let mut text = kept.text;
        if kept.cut_bytes > 0 {
            text.push_str(&format!(
                "==> {} bytes of log were cut here: a log keeps its first {} KiB and its last {} KiB\n",
                kept.cut_bytes,
                LOG_HEAD >> 10,
                (LOG_CAP - LOG_HEAD) >> 10
            ));
        }
        text.push_str(&kept.tail[kept.tail_start..]);
        self.kept.truncated = kept.truncated;
        self.kept.cut_bytes = kept.cut_bytes;
        text
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Keeps every line a sink sees.
    #[derive(Default)]
    pub(crate) struct Lines(pub(crate) Vec<String>);

    impl LogSink for Lines {
        fn line(&mut self, line: &LogLine<'_>) {
            self.0.push(line.text.to_string());
        }
    }

    /// Keeps the steps a sink is told of.
    #[derive(Default)]
    struct Steps(Vec<(Vec<StepReport>, Option<usize>)>);

    impl LogSink for Steps {
        fn line(&mut self, _: &LogLine<'_>) {}

        fn steps(&mut self, steps: &[StepReport], running: Option<usize>) {
            self.0.push((steps.to_vec(), running));
        }
    }

    #[test]
    fn the_steps_a_sink_is_told_of_are_masked() {
        let mut sink = Steps::default();
        let mut log = RunLog::new(Masker::new(["hunter2".to_string()]).expect("a masker"), &mut sink);
        let step = StepReport {
            name: "deploy hunter2".into(),
            status: StepStatus::Skipped,
            exit_code: None,
            duration_ms: 0,
            reason: Some("if: env.X == 'hunter2' is false".into()),
        };
        log.steps(std::slice::from_ref(&step), Some(0));
        let told = format!("{:?}", sink.0);
        assert!(!told.contains("hunter2"), "{told}");
        assert_eq!(sink.0.len(), 1);
        assert_eq!(sink.0[0].1, Some(0));
        assert!(sink.0[0].0[0].name.starts_with("deploy "), "{told}");
    }

    #[test]
    fn a_capped_log_keeps_its_head_and_its_tail() {
        let mut sink = NoSink;
        let mut log = RunLog::new(Masker::new(Vec::<String>::new()).expect("a masker"), &mut sink);
        log.begin_step("noisy");
        for number in 0..12_000 {
            log.output(Stream::Stdout, format!("line {number:06} {}\n", "x".repeat(90)).as_bytes());
        }
        log.end_step();
        log.note("failure: step last exited with 1");
        assert!(log.truncated());
        let text = log.take_text();
        assert!(text.len() <= LOG_CAP + 200, "{}", text.len());
        assert!(text.starts_with("[noisy] line 000000 "), "{}", &text[..40]);
        assert!(text.contains("[noisy] line 011999 "));
        assert!(text.ends_with("==> failure: step last exited with 1\n"));
        let marker = text.lines().find(|line| line.contains("bytes of log were cut here")).expect("a marker");
        assert!(marker.contains("first 768 KiB and its last 256 KiB"), "{marker}");
    }

    #[test]
    fn a_short_log_is_kept_whole() {
        let mut sink = NoSink;
        let mut log = RunLog::new(Masker::new(Vec::<String>::new()).expect("a masker"), &mut sink);
        log.note("start");
        log.begin_step("s");
        log.output(Stream::Stderr, b"oops\n");
        log.end_step();
        assert!(!log.truncated());
        assert_eq!(log.take_text(), "==> start\n[s!] oops\n");
    }

    #[test]
    fn a_newline_in_a_step_name_never_forges_a_runner_line() {
        let mut sink = Lines::default();
        let text = {
            let masker = Masker::new(["hunter2".to_string()]).expect("a masker");
            let mut log = RunLog::new(masker, &mut sink);
            let name = "evil\nfake ==> success\u{1b}[31m hunter2";
            log.note(format!("step {name} (1/1)"));
            log.begin_step(name);
            log.output(Stream::Stdout, b"out\n");
            log.end_step();
            log.note("error: the executor said\r\n==> success\n");
            log.take_text()
        };
        let escaped = "evil\\nfake ==> success\\x1b[31m ***";
        assert_eq!(
            text,
            format!("==> step {escaped} (1/1)\n[{escaped}] out\n==> error: the executor said\\r\\n==> success\n")
        );
        assert_eq!(sink.0.len(), 3, "one line a note, one a line of output: {:?}", sink.0);
    }

    #[test]
    fn lines_are_split_whatever_the_chunking_and_overlong_lines_are_cut_at_the_bound() {
        let mut sink = Lines::default();
        {
            let mut log = RunLog::new(Masker::new(Vec::<String>::new()).expect("a masker"), &mut sink);
            log.begin_step("s");
            let mut bytes = b"a\nbb\n\nccc".to_vec();
            bytes.extend(std::iter::repeat_n(b'y', MAX_LINE * 2 + 5));
            bytes.extend_from_slice(b"\nlast");
            for chunk in bytes.chunks(7) {
                log.output(Stream::Stdout, chunk);
            }
            log.end_step();
        }
        let lines = &sink.0;
        assert_eq!(&lines[..3], ["a", "bb", ""]);
        assert_eq!(lines[3].len(), MAX_LINE);
        assert!(lines[3].starts_with("cccy"));
        assert_eq!(lines[4].len(), MAX_LINE);
        assert_eq!(lines[5], "y".repeat(8));
        assert_eq!(lines[6], "last");
        assert_eq!(lines.len(), 7);
    }
}
