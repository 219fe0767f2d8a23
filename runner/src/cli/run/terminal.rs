//! What `run` prints as it goes: each workflow's lines (masked by the engine, coloured on a
//! colour terminal), a transfer's progress, each failed step's last lines, and the summary.

use std::io::Write as _;
use std::path::PathBuf;

use crate::printable;
use crate::report::{LogLine, LogSink, Progress, RunReport, StepReport, StepStatus};

/// Colours for what `run` prints, or none.
#[derive(Debug, Clone, Copy)]
pub(super) struct Paint(pub(super) bool);

impl Paint {
    /// `text` in the colour of a status word: green for a success, red for a failure or an
    /// error, yellow for the rest (skipped, cancelled).
    fn status(self, text: &str) -> String {
        let code = match text.trim_end() {
            "success" => "32",
            "failure" | "error" | "timed out" => "31",
            _ => "33",
        };
        self.wrap(code, text)
    }

    /// A runner's note, set apart from step output (cyan).
    fn note(self, text: &str) -> String {
        self.wrap("36", text)
    }

    fn wrap(self, code: &str, text: &str) -> String {
        if self.0 { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_string() }
    }
}

/// Prints a run's lines as they come: `workflow/step | text`, written out a chunk of output
/// at a time, whole lines only, so that workflows running side by side never split each
/// other's lines.
pub(super) struct Terminal {
    workflow: String,
    /// The last lines of each step that wrote any and did not pass (the running one's too),
    /// repeated under the summary for each that failed.
    pub(super) tails: Vec<StepTail>,
    out: Vec<u8>,
    /// The latest step's name and the prefix its lines are shown with.
    prefix: Option<(String, String)>,
    paint: Paint,
    /// Whether a transfer's progress is shown, on a line of its own that the next line
    /// overwrites: only on a terminal, one workflow at a time.
    live_progress: bool,
    /// The characters of the progress line shown now, if any.
    progress_shown: usize,
}

/// What a terminal buffers before it writes.
pub(super) const TERMINAL_BUFFER: usize = 64 << 10;

impl Terminal {
    pub(super) fn new(workflow: String, paint: Paint, live_progress: bool) -> Terminal {
        Terminal {
            workflow,
            tails: Vec::new(),
            out: Vec::with_capacity(TERMINAL_BUFFER),
            prefix: None,
            paint,
            live_progress,
            progress_shown: 0,
        }
    }

    /// Blanks the progress line, so that what follows starts on a clean line.
    fn clear_progress(&mut self) {
        if self.progress_shown > 0 {
            self.out.push(b'\r');
            self.out.resize(self.out.len() + self.progress_shown, b' ');
            self.out.push(b'\r');
            self.progress_shown = 0;
        }
    }
}

/// How many lines of a failed step's output are repeated under the summary.
pub(super) const FAILED_TAIL: usize = 20;

/// The last [`FAILED_TAIL`] lines of one step's output (stdout and stderr).
#[derive(Default)]
pub(super) struct StepTail {
    step: Option<String>,
    lines: std::collections::VecDeque<String>,
}

impl StepTail {
    fn push(&mut self, step: &str, text: &str) {
        if self.step.as_deref() != Some(step) {
            self.step = Some(step.to_string());
            self.lines.clear();
        }
        // A full tail reuses the line it drops.
        let mut line = if self.lines.len() == FAILED_TAIL { self.lines.pop_front() } else { None }.unwrap_or_default();
        line.clear();
        line.push_str(text);
        self.lines.push_back(line);
    }
}

impl LogSink for Terminal {
    fn line(&mut self, line: &LogLine<'_>) {
        self.clear_progress();
        if let Some(step) = line.step {
            if self.tails.last().is_none_or(|tail| tail.step.as_deref() != Some(step)) {
                self.tails.push(StepTail::default());
            }
            if let Some(tail) = self.tails.last_mut() {
                tail.push(step, line.text);
            }
        }
        match line.step {
            Some(step) => {
                let workflow = &self.workflow;
                let (name, prefix) = match self.prefix.take() {
                    Some((name, prefix)) if name == step => (name, prefix),
                    _ => (step.to_string(), format!("{}/{} | ", printable::name(workflow), printable::name(step))),
                };
                self.out.extend_from_slice(prefix.as_bytes());
                // A colour terminal gets the step's colours; nothing else of its controls.
                let text = if self.paint.0 { printable::coloured_line(line.text) } else { printable::line(line.text) };
                self.out.extend_from_slice(text.as_bytes());
                self.out.push(b'\n');
                self.prefix = Some((name, prefix));
            }
            None => {
                let note = format!("{} ==> {}", printable::name(&self.workflow), printable::name(line.text));
                self.out.extend_from_slice(self.paint.note(&note).as_bytes());
                self.out.push(b'\n');
            }
        }
        if self.out.len() >= TERMINAL_BUFFER {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.out.is_empty() {
            // One locked write of whole lines: no other workflow's line lands inside one.
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(&self.out).and_then(|()| stdout.flush());
            self.out.clear();
        }
    }

    fn progress(&mut self, progress: Option<&Progress<'_>>) {
        if !self.live_progress {
            return;
        }
        self.clear_progress();
        if let Some(progress) = progress {
            // From the line's start, whatever the terminal's cursor was left at.
            self.out.push(b'\r');
            let seconds = progress.elapsed.as_secs_f64().max(0.001);
            let text = format!(
                "{} ==> {}: {} ({}/s)",
                printable::name(&self.workflow),
                printable::name(progress.what),
                printable::size(progress.bytes),
                printable::size((progress.bytes as f64 / seconds) as u64)
            );
            self.out.extend_from_slice(text.as_bytes());
            self.progress_shown = text.chars().count();
        }
        self.flush();
    }

    fn steps(&mut self, steps: &[StepReport], running: Option<usize>) {
        // A step that ended well: its lines need not be repeated.
        let Some(ended) = steps.last().filter(|_| running.is_none()) else { return };
        let failed = matches!(ended.status, StepStatus::Failure | StepStatus::TimedOut | StepStatus::Error);
        if !failed
            && let Some(tail) = self.tails.last()
            && tail.step.as_deref() == Some(&*printable::name(&ended.name))
        {
            self.tails.pop();
        }
    }
}

/// Shows a note of `run`'s own as the engine's notes are shown.
pub(super) fn note(terminal: &mut Terminal, text: &str) {
    terminal.line(&LogLine { step: None, stream: None, text });
}

pub(super) fn print_summary(
    reports: &[(RunReport, Option<PathBuf>)],
    errors: &[crate::workflow::WorkflowError],
    paint: Paint,
) {
    let mut rows = vec![["workflow".to_string(), "status".into(), "step".into(), "exit".into(), "time".into()]];
    for error in errors {
        rows.push([printable::name(&error.file).into_owned(), "error".into(), "-".into(), "-".into(), "-".into()]);
    }
    for (report, _) in reports {
        if report.steps.is_empty() {
            rows.push([
                printable::name(&report.workflow).into_owned(),
                report.status.as_str().into(),
                "-".into(),
                "-".into(),
                millis(report.duration_ms),
            ]);
        }
        for step in &report.steps {
            let status = step.status.as_str();
            let exit = step.exit_code.map(|code| code.to_string()).unwrap_or_else(|| "-".into());
            let time = if step.status == StepStatus::Skipped { "-".into() } else { millis(step.duration_ms) };
            rows.push([
                printable::name(&report.workflow).into_owned(),
                status.into(),
                printable::name(&step.name).into_owned(),
                exit,
                time,
            ]);
        }
    }
    let widths: Vec<usize> =
        (0..5).map(|column| rows.iter().map(|row| row[column].chars().count()).max().unwrap_or(0)).collect();
    crate::say!();
    for (index, row) in rows.iter().enumerate() {
        let mut cells: Vec<String> = row.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        if index > 0 {
            cells[1] = paint.status(&cells[1]);
        }
        crate::say!("{}", cells.join("  ").trim_end());
    }
    for (report, outputs) in reports {
        let status = paint.status(report.status.as_str());
        let workflow = printable::name(&report.workflow);
        match &report.cause {
            Some(cause) => crate::say!("{workflow}: {status}: {}", printable::name(cause)),
            None => crate::say!("{workflow}: {status} in {}", millis(report.duration_ms)),
        }
        if let (false, Some(dir)) = (report.outputs.is_empty(), outputs) {
            let dir = dir.display().to_string();
            crate::say!("{workflow}: {} output file(s) in {}", report.outputs.len(), printable::name(&dir));
        }
    }
}

/// The last lines of each failed step, so that they need not be found by scrolling.
pub(super) fn print_failed_tails(reports: &[(RunReport, Option<PathBuf>)], tails: &[Vec<StepTail>]) {
    for ((report, _), tails) in reports.iter().zip(tails) {
        for tail in tails {
            let Some(step) = &tail.step else { continue };
            // The tail's step is named as its lines are labelled: escaped.
            let failed = report.steps.iter().any(|ran| {
                printable::name(&ran.name) == step.as_str()
                    && matches!(ran.status, StepStatus::Failure | StepStatus::TimedOut | StepStatus::Error)
            });
            if !failed {
                continue;
            }
            let (workflow, step) = (printable::name(&report.workflow), printable::name(step));
            crate::say!();
            crate::say!("{workflow}: the last {} line(s) of step {step}:", tail.lines.len());
            for line in &tail.lines {
                crate::say!("{workflow}/{step} | {}", printable::line(line));
            }
        }
    }
}

pub(super) fn millis(ms: u64) -> String {
    if ms < 1000 { format!("{ms} ms") } else { format!("{:.1} s", ms as f64 / 1000.0) }
}
