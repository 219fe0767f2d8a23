//! `knotless-run logs RUN [--follow]` prints a run's log as `run` prints it (`WORKFLOW/STEP |
//! text`, `WORKFLOW ==> note`), following it while the run goes.
//!
//! The stored log writes a step's line `[STEP] text` (`[STEP!] text` from stderr) and a note
//! `==> text`, each one line: the step's name, and everything a note quotes, with every control
//! character escaped (logs written before that hold a name as its bytes, a newline included). A
//! name may hold `] `, so it is matched, not parsed: against the step of the latest
//! `step NAME (I/N)` note (put back together across lines in an older log), then the record's
//! steps (known once the run ended), longest first. A line that matches none is shown as
//! `WORKFLOW/? | line`: never as a line of a step it does not belong to.

use std::io::{Read as _, Seek as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;

use super::daemon::StateArgs;
use crate::checks::CheckStore;
use crate::printable;

/// `logs` flags.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The run's id.
    #[arg(value_name = "RUN")]
    pub run: String,
    /// Keep printing until the run ends.
    #[arg(long, short)]
    pub follow: bool,
    /// The state folder.
    #[command(flatten)]
    pub state: StateArgs,
}

/// The most lines of one `step NAME (I/N)` note (a name holding newlines) put back together.
const NOTE_LINES: usize = 64;

/// A stored log turned into `run`'s lines, escaped, as it is read.
pub struct Relabel {
    /// The workflow, escaped.
    workflow: String,
    /// The record's step names, longest first.
    steps: Vec<String>,
    /// The names the latest `step NAME (I/N)` note may have given, longest first: a name with
    /// newlines is noted in several lines, and where it ends is known only by matching it.
    noted: Vec<String>,
    /// Notes starting with `step ` put back together with the notes after them, and how many
    /// lines each holds so far.
    notes: Vec<(String, usize)>,
    /// Whether the notes since the last step line have given a name yet.
    named: bool,
    /// Text not shown yet: an unfinished line, or the start of a step's name that may go on.
    pending: String,
}

/// How far a step's name and the `] ` after it match the start of a stored line.
enum Prefix {
    /// The bytes of the name as stored, and where the line's text starts.
    Whole { name_len: usize, text_at: usize },
    /// The line ends before it is known (the rest of the log may tell).
    Unfinished,
    /// It is another name.
    Other,
}

/// Matches `[NAME] ` or `[NAME!] ` at the start of `line`, where `NAME` is `name` with a `\r`
/// allowed before each newline (a note's lines lose it).
fn prefix(line: &str, name: &str) -> Prefix {
    let Some(after) = line.strip_prefix('[') else { return Prefix::Other };
    let mut at = 0;
    for c in name.chars() {
        if c == '\n' && after[at..].starts_with("\r\n") {
            at += 2;
        } else if after[at..].starts_with(c) {
            at += c.len_utf8();
        } else if after.len() == at {
            return Prefix::Unfinished;
        } else {
            return Prefix::Other;
        }
    }
    for end in ["] ", "!] "] {
        if after[at..].starts_with(end) {
            return Prefix::Whole { name_len: at, text_at: 1 + at + end.len() };
        }
        if end.starts_with(&after[at..]) {
            return Prefix::Unfinished;
        }
    }
    Prefix::Other
}

impl Relabel {
    /// A reader of the log of a run of `workflow` whose steps (when known) are `steps`.
    pub fn new(workflow: &str, steps: impl IntoIterator<Item = String>) -> Relabel {
        let mut relabel = Relabel {
            workflow: printable::name(workflow).into_owned(),
            steps: Vec::new(),
            noted: Vec::new(),
            notes: Vec::new(),
            named: false,
            pending: String::new(),
        };
        relabel.know_steps(steps);
        relabel
    }

    /// Takes the record's step names, once the run ended: each as the log labels its lines
    /// (escaped) and as logs written before names were escaped hold it (its bytes).
    pub fn know_steps(&mut self, steps: impl IntoIterator<Item = String>) {
        self.steps = steps.into_iter().flat_map(|name| [printable::name(&name).into_owned(), name]).collect();
        self.steps.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        self.steps.dedup();
    }

    /// Takes the next `text` of the log and gives what can be shown of it: whole lines, and,
    /// once the log is `finished`, the rest.
    pub fn push(&mut self, text: &str, finished: bool) -> String {
        self.pending.push_str(text);
        let pending = std::mem::take(&mut self.pending);
        let mut shown = String::with_capacity(pending.len() + pending.len() / 4);
        let mut rest = pending.as_str();
        while !rest.is_empty() {
            let Some(used) = self.one(rest, finished, &mut shown) else { break };
            rest = &rest[used..];
        }
        self.pending = rest.to_string();
        shown
    }

    /// Shows the line at the start of `rest` and gives the bytes it took, or `None` to wait for
    /// more of the log.
    fn one(&mut self, rest: &str, finished: bool, shown: &mut String) -> Option<usize> {
        // The end of the line whose text starts at `from`, and where the next line starts.
        let line_end = |from: usize| match rest[from..].find('\n') {
            Some(offset) => Some((from + offset, from + offset + 1)),
            None if finished => Some((rest.len(), rest.len())),
            None => None,
        };
        let mut unfinished = false;
        if rest.starts_with('[') {
            for name in self.noted.iter().chain(self.steps.iter()) {
                match prefix(rest, name) {
                    Prefix::Whole { name_len, text_at } => {
                        let (end, next) = line_end(text_at)?;
                        self.step_line(&rest[1..1 + name_len], &rest[text_at..end], shown);
                        return Some(self.ended_line(next, end, shown));
                    }
                    Prefix::Unfinished => unfinished = true,
                    Prefix::Other => {}
                }
            }
        }
        if unfinished && !finished {
            return None;
        }
        let (end, next) = line_end(0)?;
        let line = &rest[..end];
        match line.strip_prefix("==> ") {
            Some(note) => self.note_line(note, shown),
            None => {
                // Not a line the runner wrote whole: the rest of a name it could not match.
                self.step_line("?", line, shown);
            }
        }
        Some(self.ended_line(next, end, shown))
    }

    /// Ends a shown line when the stored one had its newline, and gives where the next starts.
    fn ended_line(&self, next: usize, end: usize, shown: &mut String) -> usize {
        if next > end {
            shown.push('\n');
        }
        next
    }

    fn step_line(&mut self, step: &str, text: &str, shown: &mut String) {
        self.notes.clear();
        self.named = false;
        shown.push_str(&self.workflow);
        shown.push('/');
        shown.push_str(&printable::name(step));
        shown.push_str(" | ");
        shown.push_str(&printable::line(text));
    }

    fn note_line(&mut self, note: &str, shown: &mut String) {
        shown.push_str(&self.workflow);
        shown.push_str(" ==> ");
        shown.push_str(&printable::name(note));
        // A note's lines are stored one by one: a step's name with newlines spans several, and
        // any of them may start with `step ` or end with ` (I/N)`.
        for (so_far, lines) in &mut self.notes {
            so_far.push('\n');
            so_far.push_str(note);
            *lines += 1;
        }
        self.notes.retain(|(_, lines)| *lines <= NOTE_LINES);
        if note.starts_with("step ") {
            self.notes.push((note.to_string(), 1));
        }
        let found: Vec<String> =
            self.notes.iter().filter_map(|(so_far, _)| step_of(so_far)).map(str::to_string).collect();
        if found.is_empty() {
            return;
        }
        // The first name since a step's lines, or a note that is a whole step note by itself,
        // starts the next step: the names noted before are no longer candidates.
        if !self.named || step_of(note).is_some() {
            self.noted.clear();
        }
        self.named = true;
        self.noted.extend(found);
        self.noted.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        self.noted.dedup();
    }
}

/// The step a `step NAME (I/N)` note starts.
fn step_of(note: &str) -> Option<&str> {
    let (name, count) = note.strip_prefix("step ")?.rsplit_once(" (")?;
    let (index, total) = count.strip_suffix(')')?.split_once('/')?;
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    (digits(index) && digits(total)).then_some(name)
}

/// Runs `logs`.
pub async fn main(args: LogsArgs) -> anyhow::Result<ExitCode> {
    let store = CheckStore::new(&args.state.state);
    // A run id names a file of the store: one that would name another file is no run.
    let safe = !args.run.is_empty() && !args.run.starts_with('.') && !args.run.contains(['/', '\\']);
    let Some(record) = safe.then(|| store.find(&args.run)).flatten() else {
        bail!(
            "no run {} under {}",
            printable::name(&args.run),
            printable::name(&args.state.state.display().to_string())
        );
    };
    let path = store.log_path(&record.repository_key, &record.run_id);
    let mut offset = 0u64;
    let mut relabel = Relabel::new(&record.workflow, record.steps.iter().map(|step| step.name.clone()));
    let mut stdout = std::io::stdout();
    loop {
        // Read by path each time: the final log replaces the live file by a rename.
        let now = store.get(&record.repository_key, &record.run_id);
        let finished = now.as_ref().map(|r| r.status.is_final()).unwrap_or(true);
        // The steps are in the record once the run ended: a name is matched whole then.
        if let Ok(now) = &now
            && finished
        {
            relabel.know_steps(now.steps.iter().map(|step| step.name.clone()));
        }
        if let Ok(mut file) = std::fs::File::open(&path) {
            file.seek(std::io::SeekFrom::Start(offset)).with_context(|| format!("cannot read {}", path.display()))?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).with_context(|| format!("cannot read {}", path.display()))?;
            // Only whole lines are read while the run goes; the rest waits for its newline.
            let whole =
                if finished { bytes.len() } else { bytes.iter().rposition(|&b| b == b'\n').map_or(0, |end| end + 1) };
            offset += whole as u64;
            let text = String::from_utf8_lossy(&bytes[..whole]);
            stdout.write_all(relabel.push(&text, finished).as_bytes())?;
            stdout.flush()?;
        }
        if !args.follow || finished {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `stored` read whole by a reader of workflow `ci` with the record's `steps`.
    fn check(steps: &[&str], stored: &str, expected: &str) {
        let mut relabel = Relabel::new("ci", steps.iter().map(|step| step.to_string()));
        assert_eq!(relabel.push(stored, true), expected, "{stored:?}");
    }

    #[test]
    fn lines_read_as_run_prints_them() {
        let stored = "==> step build (1/2)\n[build] hi\n[build!] oops\n[build] \n==> success\n";
        check(&[], stored, "ci ==> step build (1/2)\nci/build | hi\nci/build | oops\nci/build | \nci ==> success\n");
        check(&[], "==> step b (1/1)\n[b] tab\there\x1b[2J\r\n", "ci ==> step b (1/1)\nci/b | tab\there\\x1b[2J\\r\n");
        // A note holding a tab is escaped as run escapes it.
        check(&[], "==> cut\there\n", "ci ==> cut\\there\n");
        // Steps whose notes are gone (the head of the log cut): from the record.
        check(&["two", "one"], "[one] 1\n[two!] 2\n", "ci/one | 1\nci/two | 2\n");
        // A last line without its newline stays without one.
        check(&["a"], "[a] b", "ci/a | b");
    }

    #[test]
    fn a_line_of_no_known_step_is_never_shown_as_one() {
        check(&[], "[build] hi\n", "ci/? | [build] hi\n");
        check(&["a"], "plain \x07line\n[a\n", "ci/? | plain \\x07line\nci/? | [a\n");
    }

    #[test]
    fn a_name_holding_brackets_or_newlines_is_matched_whole() {
        check(&[], "==> step a] b (1/1)\n[a] b] x] y\n", "ci ==> step a] b (1/1)\nci/a] b | x] y\n");
        check(&[], "==> step x! (1/1)\n[x!] out\n[x!!] err\n", "ci ==> step x! (1/1)\nci/x! | out\nci/x! | err\n");
        // A name with newlines: its note comes in lines, its prefix spans them.
        let stored = "==> step evil\n==> ci/deploy | all good (1/1)\n[evil\nci/deploy | all good] out\n";
        let expected = "ci ==> step evil\nci ==> ci/deploy | all good (1/1)\nci/evil\\nci/deploy | all good | out\n";
        check(&[], stored, expected);
        // A line of the name that reads as a step note by itself, and a CR the note lost.
        let stored = "==> step a\n==> step b (1/1)\n==> ci/x | ok (1/1)\n[a\r\nstep b (1/1)\nci/x | ok] out\n";
        let shown = Relabel::new("ci", []).push(stored, true);
        assert!(shown.ends_with("\nci/a\\r\\nstep b (1/1)\\nci/x | ok | out\n"), "{shown}");
        // The next step's note ends the last one's names.
        let stored = "==> step a (1/2)\n==> step b (2/2)\n[b] x\n==> step c (1/1)\n[a] y\n";
        let shown = Relabel::new("ci", []).push(stored, true);
        assert!(shown.ends_with("ci/b | x\nci ==> step c (1/1)\nci/? | [a] y\n"), "{shown}");
        // From the record, once the run ended.
        check(
            &["evil\nci/deploy", "evil"],
            "[evil\nci/deploy] x\n[evil] y\n",
            "ci/evil\\nci/deploy | x\nci/evil | y\n",
        );
        // The workflow's name is escaped too.
        let mut relabel = Relabel::new("w\x1b", ["s\x1b".to_string()]);
        assert_eq!(relabel.push("[s\x1b] t\n==> n\x1b\n", true), "w\\x1b/s\\x1b | t\nw\\x1b ==> n\\x1b\n");
    }

    #[test]
    fn a_log_with_escaped_names_reads_line_by_line() {
        // As the engine writes it now: a name's control characters escaped in its note and its
        // lines; the record keeps the name's bytes.
        let stored = "==> step evil\\nfake ==> success (1/1)\n[evil\\nfake ==> success] out\n==> success\n";
        let expected = "ci ==> step evil\\nfake ==> success (1/1)\nci/evil\\nfake ==> success | out\nci ==> success\n";
        check(&[], stored, expected);
        check(&["evil\nfake ==> success"], "[evil\\nfake ==> success!] err\n", "ci/evil\\nfake ==> success | err\n");
    }

    #[test]
    fn a_live_log_is_shown_a_whole_line_at_a_time() {
        let mut relabel = Relabel::new("ci", []);
        assert_eq!(relabel.push("==> step evil\n==> x (1/1)\n", false), "ci ==> step evil\nci ==> x (1/1)\n");
        // The name's first line: it may go on, so it waits.
        assert_eq!(relabel.push("[evil\n", false), "");
        assert_eq!(relabel.push("x] out\n[evil\nx] more", false), "ci/evil\\nx | out\n");
        assert_eq!(relabel.push("\n", false), "ci/evil\\nx | more\n");
        assert_eq!(relabel.push("[ev", false), "");
        assert_eq!(relabel.push("il\nx!] e\n[other] y\n", false), "ci/evil\\nx | e\nci/? | [other] y\n");
        assert_eq!(relabel.push("[ev", true), "ci/? | [ev");
    }

    #[test]
    fn a_step_note_is_read_only_in_its_own_form() {
        assert_eq!(step_of("step build (2/3)"), Some("build"));
        assert_eq!(step_of("step a (1/2) (1/2)"), Some("a (1/2)"));
        assert_eq!(step_of("step build"), None);
        assert_eq!(step_of("step build (x/3)"), None);
        assert_eq!(step_of("secret X is not granted to this run; step build runs without it"), None);
    }
}
