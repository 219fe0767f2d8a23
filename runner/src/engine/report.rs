//! What a run produced: its status, each step's outcome, the cause of an error, and its log
//! (masked, capped at 1 MB, split into lines as it streams).

use std::collections::HashMap;

use knotless_protocol::messages::Stream;
use serde::{Deserialize, Serialize};

use crate::mask::{MaskStream, Masker};

/// The most bytes of log a run keeps.
pub const LOG_CAP: usize = 1 << 20;

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
    /// Not run, because an earlier step ended the run.
    Skipped,
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// The step it came from; `None` for the runner's own notes.
    pub step: Option<String>,
    /// The stream, for step output.
    pub stream: Option<Stream>,
    /// The text, without its newline.
    pub text: String,
}

impl LogLine {
    /// The line as the log file holds it.
    pub fn render(&self) -> String {
        match (&self.step, self.stream) {
            (Some(step), Some(Stream::Stderr)) => format!("[{step}!] {}", self.text),
            (Some(step), _) => format!("[{step}] {}", self.text),
            (None, _) => format!("==> {}", self.text),
        }
    }
}

/// Where a run's log lines go as they happen (a terminal, a check's live log).
pub trait LogSink: Send {
    /// One masked line.
    fn line(&mut self, line: &LogLine);
}

/// A sink that drops lines (the report keeps them).
pub struct NoSink;

impl LogSink for NoSink {
    fn line(&mut self, _: &LogLine) {}
}

/// Masks, splits into lines, keeps the capped log, and feeds the sink.
pub(crate) struct RunLog<'a> {
    masker: Masker,
    streams: HashMap<Stream, (MaskStream, Vec<u8>)>,
    step: Option<String>,
    pub(crate) text: String,
    pub(crate) truncated: bool,
    sink: &'a mut dyn LogSink,
}

impl<'a> RunLog<'a> {
    pub(crate) fn new(masker: Masker, sink: &'a mut dyn LogSink) -> RunLog<'a> {
        RunLog { masker, streams: HashMap::new(), step: None, text: String::new(), truncated: false, sink }
    }

    /// A note of the runner's, masked too (it may quote an executor's message).
    pub(crate) fn note(&mut self, text: impl AsRef<str>) {
        let masked = String::from_utf8_lossy(&self.masker.mask(text.as_ref().as_bytes())).into_owned();
        for line in masked.lines() {
            self.emit(LogLine { step: None, stream: None, text: line.to_string() });
        }
    }

    /// Starts attributing output to `step`.
    pub(crate) fn begin_step(&mut self, step: &str) {
        self.step = Some(step.to_string());
        self.streams.clear();
    }

    /// Output bytes of the current step.
    pub(crate) fn output(&mut self, stream: Stream, bytes: &[u8]) {
        let masker = &self.masker;
        let (mask, pending) = self.streams.entry(stream).or_insert_with(|| (masker.stream(), Vec::new()));
        pending.extend_from_slice(&mask.push(bytes));
        let mut lines = Vec::new();
        while let Some(end) = pending.iter().position(|&byte| byte == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            lines.push(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
        }
        for text in lines {
            self.emit(LogLine { step: self.step.clone(), stream: Some(stream), text });
        }
    }

    /// Flushes what the current step left without a newline.
    pub(crate) fn end_step(&mut self) {
        let mut streams: Vec<_> = self.streams.drain().collect();
        streams.sort_by_key(|(stream, _)| *stream == Stream::Stderr);
        for (stream, (mask, mut pending)) in streams {
            pending.extend_from_slice(&mask.finish());
            if !pending.is_empty() {
                let text = String::from_utf8_lossy(&pending).into_owned();
                self.emit(LogLine { step: self.step.clone(), stream: Some(stream), text });
            }
        }
        self.step = None;
    }

    fn emit(&mut self, line: LogLine) {
        self.sink.line(&line);
        if self.truncated {
            return;
        }
        let rendered = line.render();
        if self.text.len() + rendered.len() + 1 > LOG_CAP {
            self.truncated = true;
            self.text.push_str("==> the log was cut here at its cap of 1 MB\n");
            return;
        }
        self.text.push_str(&rendered);
        self.text.push('\n');
    }
}
