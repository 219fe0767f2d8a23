//! Reading a stored log. The log writes a step's line `[STEP] text` (`[STEP!] text` from
//! stderr) and a note `==> text`, each one line: the step's name, and everything a note quotes,
//! with every control character escaped (logs written before that hold a name as its bytes, a
//! newline included). A name may hold `] `, so it is matched, not parsed: against the step of
//! the latest `step NAME (I/N)` note (put back together across lines in an older log), then the
//! record's steps (known once the run ended), longest first. A line that matches none is a
//! [`Line::Stray`]: never a line of a step it does not belong to.

/// The most lines of one `step NAME (I/N)` note (a name holding newlines) put back together.
const NOTE_LINES: usize = 64;

/// One line of a stored log, as stored (nothing escaped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line<'a> {
    /// A step's line: the step's name as the log labels it, whether it came from stderr, and
    /// its text.
    Step { step: &'a str, stderr: bool, text: &'a str },
    /// A note of the runner (`==> ` taken off).
    Note(&'a str),
    /// A line of no known step.
    Stray(&'a str),
}

/// A reader of a stored log, as it grows.
pub struct Reader {
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
    /// Text not read yet: an unfinished line, or the start of a step's name that may go on.
    pending: String,
}

/// How far a step's name and the `] ` after it match the start of a stored line.
enum Prefix {
    /// The bytes of the name as stored, whether it is a stderr line, and where the line's
    /// text starts.
    Whole { name_len: usize, stderr: bool, text_at: usize },
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
            return Prefix::Whole { name_len: at, stderr: end == "!] ", text_at: 1 + at + end.len() };
        }
        if end.starts_with(&after[at..]) {
            return Prefix::Unfinished;
        }
    }
    Prefix::Other
}

impl Reader {
    /// A reader of the log of a run whose steps (when known) are `steps`.
    pub fn new(steps: impl IntoIterator<Item = String>) -> Reader {
        let mut reader =
            Reader { steps: Vec::new(), noted: Vec::new(), notes: Vec::new(), named: false, pending: String::new() };
        reader.know_steps(steps);
        reader
    }

    /// Takes the record's step names, once the run ended: each as the log labels its lines
    /// (escaped) and as logs written before names were escaped hold it (its bytes).
    pub fn know_steps(&mut self, steps: impl IntoIterator<Item = String>) {
        self.steps = steps.into_iter().flat_map(|name| [crate::printable::name(&name).into_owned(), name]).collect();
        self.steps.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        self.steps.dedup();
    }

    /// Takes the next `text` of the log and gives `each` its whole lines (with whether the
    /// stored line had its newline) and, once the log is `finished`, the rest.
    pub fn push(&mut self, text: &str, finished: bool, mut each: impl FnMut(Line<'_>, bool)) {
        self.pending.push_str(text);
        let pending = std::mem::take(&mut self.pending);
        let mut rest = pending.as_str();
        while !rest.is_empty() {
            let Some(used) = self.one(rest, finished, &mut each) else { break };
            rest = &rest[used..];
        }
        self.pending = rest.to_string();
    }

    /// Reads the line at the start of `rest` and gives the bytes it took, or `None` to wait for
    /// more of the log.
    fn one(&mut self, rest: &str, finished: bool, each: &mut impl FnMut(Line<'_>, bool)) -> Option<usize> {
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
                    Prefix::Whole { name_len, stderr, text_at } => {
                        let (end, next) = line_end(text_at)?;
                        self.notes.clear();
                        self.named = false;
                        each(
                            Line::Step { step: &rest[1..1 + name_len], stderr, text: &rest[text_at..end] },
                            next > end,
                        );
                        return Some(next);
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
            Some(note) => {
                self.note_line(note);
                each(Line::Note(note), next > end);
            }
            // Not a line the runner wrote whole: the rest of a name it could not match.
            None => {
                self.notes.clear();
                self.named = false;
                each(Line::Stray(line), next > end);
            }
        }
        Some(next)
    }

    fn note_line(&mut self, note: &str) {
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

/// The step a `step NAME (I/N)` note starts, with its place `I` and the count `N`.
pub fn step_note(note: &str) -> Option<(&str, usize, usize)> {
    let (name, count) = note.strip_prefix("step ")?.rsplit_once(" (")?;
    let (index, total) = count.strip_suffix(')')?.split_once('/')?;
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    if !(digits(index) && digits(total)) {
        return None;
    }
    Some((name, index.parse().ok()?, total.parse().ok()?))
}

fn step_of(note: &str) -> Option<&str> {
    step_note(note).map(|(name, _, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `stored` read whole, as `(kind, step, text, newline)`.
    fn read(steps: &[&str], stored: &str) -> Vec<(char, String, String, bool)> {
        let mut lines = Vec::new();
        Reader::new(steps.iter().map(|step| step.to_string())).push(stored, true, |line, newline| {
            lines.push(match line {
                Line::Step { step, stderr, text } => {
                    (if stderr { '!' } else { 's' }, step.to_string(), text.to_string(), newline)
                }
                Line::Note(note) => ('n', String::new(), note.to_string(), newline),
                Line::Stray(text) => ('?', String::new(), text.to_string(), newline),
            })
        });
        lines
    }

    #[test]
    fn stdout_stderr_notes_and_strays_are_told_apart() {
        let lines = read(&[], "==> step a] b (1/1)\n[a] b] x] y\n[a] b!] err\n[c] no\n==> success");
        let expected = [
            ('n', "", "step a] b (1/1)", true),
            ('s', "a] b", "x] y", true),
            ('!', "a] b", "err", true),
            ('?', "", "[c] no", true),
            ('n', "", "success", false),
        ];
        let expected: Vec<_> = expected.iter().map(|(k, s, t, n)| (*k, s.to_string(), t.to_string(), *n)).collect();
        assert_eq!(lines, expected);
    }

    #[test]
    fn a_step_note_is_read_only_in_its_own_form() {
        assert_eq!(step_note("step build (2/3)"), Some(("build", 2, 3)));
        assert_eq!(step_note("step a (1/2) (1/2)"), Some(("a (1/2)", 1, 2)));
        assert_eq!(step_note("step build"), None);
        assert_eq!(step_note("step build (x/3)"), None);
        assert_eq!(step_note("secret X is not granted to this run; step build runs without it"), None);
    }
}
