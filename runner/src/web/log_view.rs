//! A check's log as a page shows it: a section per step (`<details>`, the failed step open and
//! the others closed, each with its status and duration), each line numbered with an anchor
//! (`#L42`: the number is a link, so a click puts it in the address bar), stderr lines marked,
//! colours drawn ([`super::terminal`]); and the failed step's last lines, shown first. The
//! live log ([`super::live`]) draws the lines of a running check with the same [`Drawer`], so
//! the lines it adds are numbered and coloured as the page's.

use maud::{Markup, html};

use super::pages::status;
use super::terminal::{self, Style};
use crate::checks::CheckRecord;
use crate::checks::stored_log::{Line, Reader, step_note};
use crate::printable;
use crate::report::{StepReport, StepStatus};

/// How many of the failed step's lines are shown first, as `run` shows them.
pub const TAIL_LINES: usize = 20;

/// What a line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Out,
    Err,
    Note,
    Stray,
}

impl Kind {
    /// The line's classes in the stylesheet.
    pub fn class(self) -> &'static str {
        match self {
            Kind::Out => "line",
            Kind::Err => "line err",
            Kind::Note => "line note",
            Kind::Stray => "line stray",
        }
    }
}

/// A line of the log as drawn: its number (from 1 in the whole log), what it is, its styled
/// runs, and for a `step NAME (I/N)` note the step it starts (the name as the log gives it,
/// and `I`).
pub struct Drawn {
    pub number: usize,
    pub kind: Kind,
    pub starts: Option<(String, usize)>,
    pub runs: Vec<(Style, String)>,
}

/// Draws a log line by line as it grows: the same numbers and colours whether the log is read
/// at once (a finished check) or piece by piece (the live log, and the page it continues).
pub struct Drawer {
    reader: Reader,
    number: usize,
    /// The style each stream of the current step left, carried from line to line as a
    /// terminal carries it; a step starts plain.
    out: Style,
    err: Style,
}

impl Drawer {
    /// A drawer of the log of a run whose steps (as far as known) are `steps`.
    pub fn new(steps: &[StepReport]) -> Drawer {
        let reader = Reader::new(steps.iter().map(|step| step.name.clone()));
        Drawer { reader, number: 0, out: Style::default(), err: Style::default() }
    }

    /// Takes the next `text` of the log and gives `each` its lines drawn; a line not yet
    /// whole waits for the rest unless the log is `finished`.
    pub fn push(&mut self, text: &str, finished: bool, mut each: impl FnMut(Drawn)) {
        let Drawer { reader, number, out, err } = self;
        reader.push(text, finished, |line, _| {
            *number += 1;
            let plain = |text: String| vec![(Style::default(), text)];
            let drawn = match line {
                Line::Note(note) => {
                    let starts = step_note(note).map(|(name, index, _)| (name.to_string(), index));
                    if starts.is_some() {
                        (*out, *err) = (Style::default(), Style::default());
                    }
                    let runs = plain(format!("==> {}", printable::name(note)));
                    Drawn { number: *number, kind: Kind::Note, starts, runs }
                }
                Line::Step { text, stderr, .. } => {
                    let style = if stderr { &mut *err } else { &mut *out };
                    let (runs, end) = terminal::spans(text, *style);
                    *style = end;
                    Drawn { number: *number, kind: if stderr { Kind::Err } else { Kind::Out }, starts: None, runs }
                }
                Line::Stray(text) => {
                    let runs = plain(printable::line(text).into_owned());
                    Drawn { number: *number, kind: Kind::Stray, starts: None, runs }
                }
            };
            each(drawn);
        });
    }
}

/// The place in `steps` of the step a `step NAME (I/N)` note starts: the `I`th when its name
/// is that, else the first of that name.
fn step_at(steps: &[StepReport], name: &str, index: usize) -> Option<usize> {
    let named = |step: &StepReport| printable::name(&step.name) == name;
    steps
        .get(index.wrapping_sub(1))
        .filter(|step| named(step))
        .map(|_| index - 1)
        .or_else(|| steps.iter().position(named))
}

/// A line, numbered from 1 in the whole log, drawn.
struct Shown {
    number: usize,
    kind: Kind,
    html: Markup,
}

/// The lines before the first step, one section a step, and the notes after the last.
struct Sections {
    before: Vec<Shown>,
    steps: Vec<(String, Option<usize>, Vec<Shown>)>,
    after: Vec<Shown>,
}

/// Reads `log` into sections; each step's section with the index of its step in `steps`. A
/// log that is not `finished` keeps its run's last notes in the last step's section, and a
/// line that may not be whole yet out (the live log sends it).
fn sections(log: &[u8], steps: &[StepReport], finished: bool) -> Sections {
    let text = String::from_utf8_lossy(log);
    let mut drawer = Drawer::new(steps);
    let mut sections = Sections { before: Vec::new(), steps: Vec::new(), after: Vec::new() };
    drawer.push(&text, finished, |drawn| {
        if let Some((name, index)) = &drawn.starts {
            sections.steps.push((name.clone(), step_at(steps, name, *index), Vec::new()));
        }
        let shown = Shown { number: drawn.number, kind: drawn.kind, html: terminal::markup(&drawn.runs) };
        match sections.steps.last_mut() {
            Some((_, _, lines)) => lines.push(shown),
            None => sections.before.push(shown),
        }
    });
    // The notes after the last step's lines are the run's end, not the step's.
    if finished && let Some((_, _, lines)) = sections.steps.last_mut() {
        let notes = lines.iter().rev().take_while(|line| line.kind == Kind::Note).count();
        let keep = lines.len() - notes;
        // The step's own note stays with it.
        let keep = keep.max(1);
        sections.after = lines.split_off(keep.min(lines.len()));
    }
    sections
}

/// Whether a step ended the run badly.
fn failed(step: &StepReport) -> bool {
    matches!(step.status, StepStatus::Failure | StepStatus::TimedOut | StepStatus::Error)
}

fn line(shown: &Shown, anchor: bool) -> Markup {
    let id = format!("L{}", shown.number);
    html! {
        div class=(shown.kind.class()) id=[anchor.then_some(id.as_str())] {
            a.ln href={ "#" (id) } { (shown.number) }
            @if shown.kind == Kind::Err { span.mark title="stderr" { "!" } }
            span.tx { (shown.html) }
        }
    }
}

/// The log of a check, and, when a step failed, its last lines to show first. The log of a
/// running check is drawn as far as its lines are whole, its running step open, with the
/// address of its `live` stream.
pub fn render(record: &CheckRecord, log: &[u8], live: Option<&str>) -> (Markup, Option<Markup>) {
    let sections = sections(log, &record.steps, live.is_none());
    let failed_step = record.steps.iter().position(failed);
    let running = record.running_step.filter(|_| live.is_some());
    let last = sections.steps.len().saturating_sub(1);
    let mut tail = None;
    let body = html! {
        div.log #log data-live=[live] {
            @if !sections.before.is_empty() {
                details.section {
                    summary { "Set up" }
                    @for shown in &sections.before { (line(shown, true)) }
                }
            }
            @for (n, (name, at, lines)) in sections.steps.iter().enumerate() {
                @let step = at.and_then(|at| record.steps.get(at));
                @let is_running = at.is_some() && *at == running;
                @let open = is_running || (live.is_some() && n == last) || step.is_none_or(failed);
                details.section.step open[open] data-step=[*at] {
                    summary {
                        span.step { (name) }
                        @if is_running {
                            " " (status("running"))
                        } @else if let Some(step) = step {
                            " " (status(step.status.as_str()))
                            " " span.meta { (super::format::duration(step.duration_ms)) }
                        }
                    }
                    @for shown in lines { (line(shown, true)) }
                }
            }
            @for shown in &sections.after { (line(shown, true)) }
        }
    };
    if let Some(index) = failed_step
        && live.is_none()
        && let Some((name, _, lines)) = sections.steps.iter().find(|(_, at, _)| *at == Some(index))
    {
        let output: Vec<&Shown> = lines.iter().filter(|line| matches!(line.kind, Kind::Out | Kind::Err)).collect();
        let last = &output[output.len().saturating_sub(TAIL_LINES)..];
        tail = Some(html! {
            div.failure {
                p.meta {
                    "The last " (last.len()) " line(s) of step " span.step { (name) } ":"
                }
                div.log.tail { @for shown in last { (line(shown, false)) } }
            }
        });
    }
    (body, tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(steps: Vec<StepReport>) -> CheckRecord {
        let target = crate::checks::CheckTarget {
            event: crate::workflow::Event::Push,
            commit: "0123456789abcdef0123456789abcdef01234567".into(),
            git_ref: "refs/heads/main".into(),
            pull: None,
            head: None,
            base: None,
        };
        let mut record = CheckRecord::queued("r".into(), ("/srv/repo", "repo-1"), "ci", &target, true, "me");
        record.steps = steps;
        record
    }

    fn step(name: &str, status: StepStatus) -> StepReport {
        StepReport { name: name.into(), status, exit_code: None, duration_ms: 1500, reason: None }
    }

    #[test]
    fn each_step_is_a_section_the_failed_one_open_and_its_tail_first() {
        let steps = [step("build", StepStatus::Success), step("test", StepStatus::Failure)];
        let mut log = String::from("==> run r\n==> step build (1/2)\n[build] \x1b[32mok\x1b[0m\n==> step test (2/2)\n");
        for n in 1..=30 {
            log.push_str(&format!("[test] line {n}\n"));
        }
        log.push_str("[test!] \x1b[1;31merror\x1b[0m: boom\n==> environment removed\n==> failure\n");
        let sections = sections(log.as_bytes(), &steps, true);
        assert_eq!(sections.before.len(), 1);
        assert_eq!(sections.steps.len(), 2);
        assert_eq!(sections.steps[1].2.len(), 32, "the note, 30 lines and the error");
        assert_eq!(sections.after.len(), 2, "the run's end is its own");
        let record = example(steps.to_vec());
        let (body, tail) = render(&record, log.as_bytes(), None);
        let body = body.into_string();
        assert!(
            body.contains("<details class=\"section step\" data-step=\"0\"><summary><span class=\"step\">build</span>"),
            "{body}"
        );
        assert!(
            body.contains(
                "<details class=\"section step\" open data-step=\"1\"><summary><span class=\"step\">test</span>"
            ),
            "{body}"
        );
        assert!(body.contains("<span class=\"f2\">ok</span>"), "{body}");
        assert!(body.contains("id=\"L37\""), "{body}");
        assert!(!body.contains('\x1b'));
        let tail = tail.expect("a failed step's tail").into_string();
        assert_eq!(tail.matches("class=\"line").count(), TAIL_LINES, "{tail}");
        assert!(
            tail.contains("<a class=\"ln\" href=\"#L35\">35</a><span class=\"mark\" title=\"stderr\">!</span>"),
            "{tail}"
        );
        assert!(!tail.contains("id=\"L"), "the tail's lines link to the log's, and hold no anchor of their own");
        assert!(!tail.contains("line 11<"), "{tail}");
        assert!(tail.contains("line 12<"), "{tail}");
    }

    #[test]
    fn a_passing_run_shows_no_tail_and_a_log_without_steps_is_shown_whole() {
        let record = example(vec![step("a", StepStatus::Success)]);
        let (body, tail) = render(&record, b"==> step a (1/1)\n[a] hi\n==> success\n", None);
        assert!(tail.is_none());
        assert!(body.into_string().contains("<details class=\"section step\" data-step=\"0\"><summary>"));
        let (body, tail) = render(&example(Vec::new()), b"==> error: no executor\n", None);
        assert!(tail.is_none());
        assert!(body.into_string().contains("==&gt; error: no executor"));
    }
}
