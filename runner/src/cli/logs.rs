//! `knotless-run logs RUN [--follow]` prints a run's log as `run` prints it (`WORKFLOW/STEP |
//! text`, `WORKFLOW ==> note`), following it while the run goes. The stored log is read by
//! [`crate::checks::stored_log`]; a line of no known step is shown as `WORKFLOW/? | line`.

use std::io::{Read as _, Seek as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;

use super::daemon::StateArgs;
use crate::checks::CheckStore;
use crate::checks::stored_log::{Line, Reader};
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

/// A stored log turned into `run`'s lines, escaped, as it is read.
pub struct Relabel {
    /// The workflow, escaped.
    workflow: String,
    reader: Reader,
}

impl Relabel {
    /// A reader of the log of a run of `workflow` whose steps (when known) are `steps`.
    pub fn new(workflow: &str, steps: impl IntoIterator<Item = String>) -> Relabel {
        Relabel { workflow: printable::name(workflow).into_owned(), reader: Reader::new(steps) }
    }

    /// Takes the record's step names, once the run ended.
    pub fn know_steps(&mut self, steps: impl IntoIterator<Item = String>) {
        self.reader.know_steps(steps);
    }

    /// Takes the next `text` of the log and gives what can be shown of it: whole lines, and,
    /// once the log is `finished`, the rest.
    pub fn push(&mut self, text: &str, finished: bool) -> String {
        let mut shown = String::with_capacity(text.len() + text.len() / 4);
        let workflow = &self.workflow;
        self.reader.push(text, finished, |line, newline| {
            match line {
                Line::Step { step, text, .. } => step_line(workflow, step, text, &mut shown),
                Line::Stray(text) => step_line(workflow, "?", text, &mut shown),
                Line::Note(note) => {
                    shown.push_str(workflow);
                    shown.push_str(" ==> ");
                    shown.push_str(&printable::name(note));
                }
            }
            if newline {
                shown.push('\n');
            }
        });
        shown
    }
}

fn step_line(workflow: &str, step: &str, text: &str, shown: &mut String) {
    shown.push_str(workflow);
    shown.push('/');
    shown.push_str(&printable::name(step));
    shown.push_str(" | ");
    shown.push_str(&printable::line(text));
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
}
