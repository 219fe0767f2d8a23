//! Workflows: the YAML files in `.knotless/workflows/`, read into a checked model with errors that name file, line, column and field.
//!
//! Reading is pure: [`parse`] turns text into a [`Workflow`]; [`load_file`] and [`load_dir`] add
//! the file system (regular files only, symlinks are never followed).
//! Every error points at the offending field through serde-saphyr's spans
//! (`Spanned<T>` for values, its error locations for everything serde rejects),
//! and names the field by looking the position up in the file's node tree.

mod condition;
mod locate;
mod raw;
#[cfg(test)]
mod tests;

pub use condition::{Condition, ConditionError, Facts, Scope};

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

pub use knotless_protocol::duration::{format_duration, parse_duration};

/// Where workflows live, relative to a repository's root.
pub const WORKFLOWS_DIR: &str = ".knotless/workflows";
/// Where shared steps live, relative to a repository's root (`uses: NAME` is `STEPS_DIR/NAME/run`).
pub const STEPS_DIR: &str = ".knotless/steps";
/// A workflow file larger than this is refused unread.
pub const MAX_WORKFLOW_BYTES: u64 = 1024 * 1024;
/// The run timeout when a workflow sets none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// How long a service may take to become healthy, unless its `health-timeout` says.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(60);

/// One workflow: one file of `.knotless/workflows/`.
#[derive(Debug, Clone, PartialEq)]
pub struct Workflow {
    /// The file's stem (`build` for `build.yml`).
    pub name: String,
    /// The file's display path (`.knotless/workflows/build.yml`), used in messages.
    pub file: String,
    /// The events and branches that start a run (`on:`); default: a push to any branch.
    pub on: Triggers,
    /// The image an image-taking executor runs the steps in (`image:`).
    pub image: Option<String>,
    /// Resource requests (`resources:`), as Kubernetes quantity strings.
    pub resources: Resources,
    /// The whole run's timeout (`timeout:`), default [`DEFAULT_TIMEOUT`] (60m).
    pub timeout: Duration,
    /// Non-secret variables every step receives (`env:`).
    pub env: BTreeMap<String, String>,
    /// Paths streamed in before the steps and back after them (`cache:`), relative to the work folder or absolute.
    pub cache: Vec<String>,
    /// Runner ids this workflow is pinned to (`runners:`); empty means every named runner.
    pub runners: Vec<String>,
    /// Whether this workflow is a merge-queue pre-flight (`queue: first`).
    pub queue: Option<QueuePhase>,
    /// Whether the environment may use the network (`network:`), default false.
    pub network: bool,
    /// The steps, run in order; the first failing one ends the run.
    pub steps: Vec<Step>,
    /// The combinations of `matrix:`, each its variables and values in the order written;
    /// empty without a matrix. [`expand`] makes one workflow of each.
    pub matrix: Vec<Vec<(String, String)>>,
    /// How many combinations of its matrix run at once (`matrix.max-parallel`); `None`: as
    /// many as the runner's concurrency allows.
    pub max_parallel: Option<usize>,
    /// For one combination of a matrix: the file's stem (the workflow's name is
    /// `STEM (VALUE, VALUE)`).
    pub base: Option<String>,
    /// The workflows of the same repository this one waits for (`needs:`), by file stem: each
    /// must pass (every combination of a matrix) before it starts.
    pub needs: Vec<String>,
    /// When it runs at all (`if:`), checked before its run starts.
    pub condition: Option<Condition>,
    /// Containers run beside its environment, reachable by name from its steps (`services:`).
    pub services: Vec<knotless_protocol::messages::Service>,
}

impl Workflow {
    /// Whether `need` (a name in `needs:`) names this workflow: its name, or its file's stem
    /// for a combination of a matrix.
    pub fn is_named(&self, need: &str) -> bool {
        self.name == need || self.base.as_deref() == Some(need)
    }

    /// Its file's stem.
    pub fn stem(&self) -> &str {
        self.base.as_deref().unwrap_or(&self.name)
    }

    /// Whether its `if:` or a step's reads the paths the event changed (`changed()`).
    pub fn reads_changes(&self) -> bool {
        let reads = |condition: &Option<Condition>| condition.as_ref().is_some_and(Condition::reads_changes);
        reads(&self.condition) || self.steps.iter().any(|step| reads(&step.condition))
    }

    /// Why its run does not start, if its `if:` is false. `env` holds the variables under the
    /// workflow's own (`--env`, the daemon's step variables); `facts.env` is not read.
    pub fn skip_reason(&self, facts: Facts<'_>, env: &BTreeMap<String, String>) -> Option<String> {
        let condition = self.condition.as_ref()?;
        let mut variables = env.clone();
        variables.extend(self.env.clone());
        let facts = Facts { env: &variables, failed: false, ..facts };
        (!condition.holds(&facts)).then(|| format!("if: {} is false", condition.text))
    }
}

/// Takes out of `workflows` each that needs a workflow there is none of, or that is in a
/// cycle of needs, with an error naming its file: the graph that is left runs in order.
fn check_needs(workflows: &mut Vec<Workflow>, errors: &mut Vec<WorkflowError>) {
    loop {
        let stems: BTreeSet<&str> = workflows.iter().map(Workflow::stem).collect();
        let unknown = workflows.iter().find_map(|workflow| {
            let missing = workflow.needs.iter().find(|need| !stems.contains(need.as_str()))?;
            Some((workflow.stem().to_string(), workflow.file.clone(), missing.clone()))
        });
        let Some((stem, file, missing)) = unknown else { break };
        errors.push(WorkflowError::whole_file(
            &file,
            format!("needs: {missing:?} is not a workflow of this repository (or it did not load)"),
        ));
        workflows.retain(|workflow| workflow.stem() != stem);
    }
    // Kahn's algorithm on stems: what cannot be ordered is in a cycle or waits for one.
    let mut needs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for workflow in workflows.iter() {
        needs.entry(workflow.stem().to_string()).or_default().extend(workflow.needs.iter().cloned());
    }
    let mut ordered: BTreeSet<String> = BTreeSet::new();
    loop {
        let ready: Vec<String> = needs
            .iter()
            .filter(|(stem, wanted)| !ordered.contains(*stem) && wanted.iter().all(|need| ordered.contains(need)))
            .map(|(stem, _)| stem.clone())
            .collect();
        if ready.is_empty() {
            break;
        }
        ordered.extend(ready);
    }
    let stuck: Vec<String> = needs.keys().filter(|stem| !ordered.contains(*stem)).cloned().collect();
    if stuck.is_empty() {
        return;
    }
    let mut reported = BTreeSet::new();
    for workflow in workflows.iter() {
        if stuck.contains(&workflow.stem().to_string()) && reported.insert(workflow.file.clone()) {
            errors.push(WorkflowError::whole_file(
                &workflow.file,
                format!("needs: a cycle of needs, or waits for one, among {}", stuck.join(", ")),
            ));
        }
    }
    workflows.retain(|workflow| !stuck.contains(&workflow.stem().to_string()));
}

/// The name of the run of one combination of a matrix: `build (stable, debian)`.
pub fn matrix_name(base: &str, combination: &[(String, String)]) -> String {
    let values: Vec<&str> = combination.iter().map(|(_, value)| value.as_str()).collect();
    format!("{base} ({})", values.join(", "))
}

/// `workflow` as the workflows it runs as: itself, or one per combination of its matrix, each
/// named after its values, with its variables in its `env`.
pub fn expand(workflow: Workflow) -> Vec<Workflow> {
    if workflow.matrix.is_empty() {
        return vec![workflow];
    }
    let mut template = workflow;
    let combinations = std::mem::take(&mut template.matrix);
    combinations
        .into_iter()
        .map(|combination| {
            let mut cell = template.clone();
            cell.name = matrix_name(&template.name, &combination);
            cell.base = Some(template.name.clone());
            cell.env.extend(combination);
            cell
        })
        .collect()
}

impl Workflow {
    /// The timeout of step `index`: its own `timeout`, capped by the run's; the run's when it sets
    /// none (or when `index` is out of range). The run's timer still bounds all steps together.
    pub fn step_timeout(&self, index: usize) -> Duration {
        self.steps.get(index).and_then(|step| step.timeout).map_or(self.timeout, |timeout| timeout.min(self.timeout))
    }
}

/// One step of a workflow: a script (`run`) or a shared step (`uses`), exactly one of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The step's name, unique in its workflow.
    pub name: String,
    /// A POSIX sh script, run as with `sh -e` in the work folder.
    pub run: Option<String>,
    /// A shared step: the folder `.knotless/steps/<uses>/` of the repository, holding an executable `run`.
    pub uses: Option<String>,
    /// The step's own timeout; `None` means the rest of the run's timeout.
    pub timeout: Option<Duration>,
    /// Names of the secrets this step asks for (it receives only those granted).
    pub secrets: Vec<String>,
    /// Non-secret variables for this step, over the workflow's `env`.
    pub env: BTreeMap<String, String>,
    /// Whether the run goes on when this step fails or times out (`continue-on-error`); the
    /// step is still reported as failed.
    pub continue_on_error: bool,
    /// The folder of the checkout the step runs in (`working-directory`, the step's or else
    /// the workflow's), relative to the work folder; `None` is the work folder.
    pub working_directory: Option<String>,
    /// The shell that runs `run` (`shell`).
    pub shell: Shell,
    /// When it runs (`if:`); without one, while no earlier step failed.
    pub condition: Option<Condition>,
}

/// The shell of a `run` script.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Shell {
    /// POSIX `sh -e`, the default.
    #[default]
    Sh,
    /// `bash --noprofile --norc -eo pipefail`, as GitHub Actions runs `shell: bash`.
    Bash,
}

/// Resource requests for executors that schedule (Kubernetes quantity strings).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// CPU request, e.g. `"2"` or `"500m"`.
    pub cpu: Option<String>,
    /// Memory request, e.g. `"4Gi"`.
    pub memory: Option<String>,
}

/// The phase a queue-only workflow runs in (`queue:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueuePhase {
    /// A pre-flight: must pass on a queued pull before the pull may join a batch.
    First,
}

/// What starts a run of a workflow (`on:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Triggers {
    /// Pushes to branches matching the filter; `None` means pushes start no run.
    pub push: Option<BranchFilter>,
    /// Pull requests whose base branch matches the filter; `None` means pulls start no run.
    pub pull: Option<BranchFilter>,
    /// Whether merge-queue batches start a run.
    pub queue: bool,
    /// Whether `knotless-run trigger` starts a run, and its inputs.
    pub manual: Option<ManualTrigger>,
}

/// A manual trigger (`on.manual`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManualTrigger {
    /// The inputs a trigger may give, each with its default: variables of every step.
    pub inputs: BTreeMap<String, String>,
}

impl Default for Triggers {
    /// A push to any branch.
    fn default() -> Self {
        Triggers { push: Some(BranchFilter::default()), pull: None, queue: false, manual: None }
    }
}

impl Triggers {
    /// Whether `event` on `branch` (the pushed branch, or a pull's base branch) starts a run.
    /// A filter with patterns never matches an event without a branch.
    pub fn matches(&self, event: Event, branch: Option<&str>) -> bool {
        match event {
            Event::Push => self.push.as_ref().is_some_and(|f| f.matches(branch)),
            Event::Pull => self.pull.as_ref().is_some_and(|f| f.matches(branch)),
            Event::Queue => self.queue,
            Event::Manual => self.manual.is_some(),
        }
    }

    /// The path patterns of `event`'s trigger, if it has any.
    pub fn paths(&self, event: Event) -> Option<&[String]> {
        let filter = match event {
            Event::Push => self.push.as_ref(),
            Event::Pull => self.pull.as_ref(),
            Event::Queue | Event::Manual => None,
        };
        filter.and_then(|filter| filter.paths.as_deref())
    }

    /// Why `event` starts no run when `changed` are the paths it changed (its trigger's
    /// `paths:` match none of them), or `None` when it starts one.
    pub fn paths_refusal(&self, event: Event, changed: &[String]) -> Option<String> {
        let patterns = self.paths(event)?;
        if paths_match(patterns, changed) {
            return None;
        }
        Some(format!(
            "on.{event}.paths is [{}], and none of the {} changed path(s) matches",
            patterns.join(", "),
            changed.len()
        ))
    }

    /// Why `event` on `branch` starts no run (the filter that refused it), or `None` when it
    /// starts one.
    pub fn refusal(&self, event: Event, branch: Option<&str>) -> Option<String> {
        if self.matches(event, branch) {
            return None;
        }
        let filter = match event {
            Event::Push => self.push.as_ref(),
            Event::Pull => self.pull.as_ref(),
            Event::Queue | Event::Manual => None,
        };
        let key = event.as_str();
        Some(match (filter.and_then(|filter| filter.branches.as_ref()), branch) {
            (Some(patterns), Some(branch)) => {
                format!("on.{key}.branches is [{}], and this is branch {branch}", patterns.join(", "))
            }
            (Some(patterns), None) => {
                format!(
                    "on.{key}.branches is [{}], and this is no branch (name one with --branch)",
                    patterns.join(", ")
                )
            }
            (None, _) => format!("not triggered by {key}"),
        })
    }
}

/// Branch and path patterns of a trigger (`branches:`, `paths:`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BranchFilter {
    /// Glob patterns where `*` matches any run of characters (`/` included); `None` matches every branch.
    pub branches: Option<Vec<String>>,
    /// Path patterns ([`paths_match`]); `None` runs whatever changed.
    pub paths: Option<Vec<String>>,
}

impl BranchFilter {
    /// Whether `branch` matches one of the patterns (always, when there are none).
    pub fn matches(&self, branch: Option<&str>) -> bool {
        match (&self.branches, branch) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(patterns), Some(branch)) => patterns.iter().any(|p| glob_matches(p, branch)),
        }
    }
}

/// Whether a change of `changed` (paths from the repository's root) concerns a trigger with
/// path `patterns`: some path matches the patterns, read in order, where a pattern starting
/// with `!` takes back the paths it matches from those matched before it. In a pattern, `*`
/// matches any run of characters but `/`, and `**` any run with `/` (`docs/**`, `**.md`).
pub fn paths_match(patterns: &[String], changed: &[String]) -> bool {
    changed.iter().any(|path| {
        let mut matched = false;
        for pattern in patterns {
            match pattern.strip_prefix('!') {
                Some(negated) if path_glob(negated.as_bytes(), path.as_bytes()) => matched = false,
                Some(_) => {}
                None if path_glob(pattern.as_bytes(), path.as_bytes()) => matched = true,
                None => {}
            }
        }
        matched
    })
}

/// A path pattern's parts.
#[derive(Clone, Copy)]
enum PathPart {
    Byte(u8),
    /// `*`: any run of bytes but `/`.
    Star,
    /// `**`: any run of bytes.
    Stars,
    /// `**/`: nothing, or any run of bytes ending with `/`.
    Folders,
}

/// `*` within a path segment, `**` across segments. Matched from the end of both, one row
/// of the pattern at a time, so the time is the pattern's length times the path's whatever
/// the stars: a workflow (a pull's, too) cannot make the daemon backtrack for ever.
fn path_glob(pattern: &[u8], text: &[u8]) -> bool {
    let mut parts = Vec::with_capacity(pattern.len());
    let mut at = 0;
    while at < pattern.len() {
        let (part, width) = match &pattern[at..] {
            [b'*', b'*', b'/', ..] => (PathPart::Folders, 3),
            [b'*', b'*', ..] => (PathPart::Stars, 2),
            [b'*', ..] => (PathPart::Star, 1),
            [byte, ..] => (PathPart::Byte(*byte), 1),
            [] => break,
        };
        parts.push(part);
        at += width;
    }
    // `after[j]`: the parts after this one match `text[j..]`; at the end, only an empty rest.
    let mut after: Vec<bool> = (0..=text.len()).map(|j| j == text.len()).collect();
    let mut row = vec![false; text.len() + 1];
    for part in parts.iter().rev() {
        // For `**/`: some `/` at or after `j` is followed by what the later parts match.
        let mut folder_ahead = false;
        for j in (0..=text.len()).rev() {
            row[j] = match *part {
                PathPart::Byte(byte) => j < text.len() && text[j] == byte && after[j + 1],
                PathPart::Star => after[j] || (j < text.len() && text[j] != b'/' && row[j + 1]),
                PathPart::Stars => after[j] || (j < text.len() && row[j + 1]),
                PathPart::Folders => {
                    folder_ahead |= j < text.len() && text[j] == b'/' && after[j + 1];
                    after[j] || folder_ahead
                }
            };
        }
        std::mem::swap(&mut after, &mut row);
    }
    after[0]
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters (even empty).
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let (pattern, text) = (pattern.as_bytes(), text.as_bytes());
    let (mut p, mut t) = (0, 0);
    // The last star seen, and the text position it currently swallows up to.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// A kind of event that starts runs; in records, `push`, `pull` or `queue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Event {
    /// New commits on a branch.
    Push,
    /// A pull request (its head merged with its base).
    Pull,
    /// A merge-queue batch.
    Queue,
    /// `knotless-run trigger`.
    Manual,
}

impl Event {
    /// Every event, in the order the docs list them.
    pub const ALL: [Event; 4] = [Event::Push, Event::Pull, Event::Queue, Event::Manual];

    /// The event's name in workflows and in `KNOTLESS_EVENT`: `push`, `pull`, `queue` or
    /// `manual`.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Push => "push",
            Event::Pull => "pull",
            Event::Queue => "queue",
            Event::Manual => "manual",
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// An event name that is not `push`, `pull`, `queue` or `manual`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown event {0:?}, expected push, pull, queue or manual")]
pub struct UnknownEvent(pub String);

impl FromStr for Event {
    type Err = UnknownEvent;

    fn from_str(text: &str) -> Result<Event, UnknownEvent> {
        Event::ALL.into_iter().find(|event| event.as_str() == text).ok_or_else(|| UnknownEvent(text.to_string()))
    }
}

/// Why a workflow file could not be used: `file:line:column: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowError {
    /// The file's display path (`.knotless/workflows/build.yml`).
    pub file: String,
    /// The line, from 1; `None` when the error has no place in the file (it could not be read).
    pub line: Option<u64>,
    /// The column, from 1 (in characters); `None` with `line`.
    pub column: Option<u64>,
    /// What is wrong, starting with the field's path when there is one (`steps[1].timeout: ...`).
    pub message: String,
}

impl WorkflowError {
    /// An error about the file as a whole, with no position.
    pub fn whole_file(file: &str, message: impl Into<String>) -> WorkflowError {
        WorkflowError { file: file.to_string(), line: None, column: None, message: message.into() }
    }
}

impl fmt::Display for WorkflowError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(formatter, ":{line}")?;
            if let Some(column) = self.column {
                write!(formatter, ":{column}")?;
            }
        }
        write!(formatter, ": {}", self.message)
    }
}

impl std::error::Error for WorkflowError {}

/// Reads a workflow from `text`; `name` is the workflow's name and `display_path` names the file in errors.
pub fn parse(name: &str, display_path: &str, text: &str) -> Result<Workflow, WorkflowError> {
    if text.len() as u64 > MAX_WORKFLOW_BYTES {
        return Err(WorkflowError::whole_file(display_path, format!("file is larger than {MAX_WORKFLOW_BYTES} bytes")));
    }
    check_name(name).map_err(|rule| WorkflowError::whole_file(display_path, rule))?;
    raw::parse(name, display_path, text)
}

/// The longest workflow name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// Whether a workflow name (its file's stem) may be one: a name becomes a folder of outputs and
/// caches, a label and a line on a terminal, so it is never empty, `.` or `..`, and holds no
/// path separator and no control character. The error says the rule broken.
pub fn check_name(name: &str) -> Result<(), String> {
    let rule = if name.is_empty() {
        "its name (the file's stem) is empty"
    } else if name == "." || name == ".." {
        "its name (the file's stem) is `.` or `..`, which name folders"
    } else if name.contains(['/', '\\']) {
        "its name (the file's stem) holds a path separator"
    } else if name.chars().any(char::is_control) {
        "its name (the file's stem) holds a control character"
    } else if name.len() > MAX_NAME_BYTES {
        "its name (the file's stem) is longer than 128 bytes"
    } else {
        return Ok(());
    };
    Err(format!("{rule}: rename the file"))
}

/// Reads the workflow file at `path` (a regular file, never through a symlink); its stem is the
/// workflow's name and `display_path` names it in errors.
pub fn load_file(path: &Path, display_path: &str) -> Result<Workflow, WorkflowError> {
    let fail = |message: String| WorkflowError::whole_file(display_path, message);
    let name = path
        .file_stem()
        .and_then(|stem| stem.to_str())
        .ok_or_else(|| fail("file name is not valid UTF-8".to_string()))?;
    let metadata = std::fs::symlink_metadata(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    if !metadata.file_type().is_file() {
        return Err(fail("not a regular file (symlinks are not followed)".to_string()));
    }
    if metadata.len() > MAX_WORKFLOW_BYTES {
        return Err(fail(format!("file is larger than {MAX_WORKFLOW_BYTES} bytes")));
    }
    let bytes = std::fs::read(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|_| fail("file is not valid UTF-8".to_string()))?;
    parse(name, display_path, &text)
}

/// Reads every workflow (`*.yml`, `*.yaml`) in `repo_root/.knotless/workflows/`, sorted by name.
/// A bad file gives an error and does not stop the others; a missing folder gives no workflows.
/// Two files with the same stem: the first in file-name order wins, the other is an error.
pub fn load_dir(repo_root: &Path) -> (Vec<Workflow>, Vec<WorkflowError>) {
    let mut workflows = Vec::new();
    let mut errors = Vec::new();
    // Refuse symlinked folders too: a pull could otherwise point us at files outside the repository.
    for folder in [".knotless", WORKFLOWS_DIR] {
        match std::fs::symlink_metadata(repo_root.join(folder)) {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => {
                errors.push(WorkflowError::whole_file(folder, "not a folder (symlinks are not followed)"));
                return (workflows, errors);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (workflows, errors),
            Err(e) => {
                errors.push(WorkflowError::whole_file(folder, format!("cannot read: {e}")));
                return (workflows, errors);
            }
        }
    }
    let entries = match std::fs::read_dir(repo_root.join(WORKFLOWS_DIR)) {
        Ok(entries) => entries,
        Err(e) => {
            errors.push(WorkflowError::whole_file(WORKFLOWS_DIR, format!("cannot read: {e}")));
            return (workflows, errors);
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => files.push(entry.path()),
            Err(e) => errors.push(WorkflowError::whole_file(WORKFLOWS_DIR, format!("cannot read: {e}"))),
        }
    }
    files.retain(|path| path.extension().is_some_and(|extension| extension == "yml" || extension == "yaml"));
    files.sort();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for path in files {
        let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let display_path = format!("{WORKFLOWS_DIR}/{file_name}");
        match load_file(&path, &display_path) {
            Ok(workflow) => {
                let cells = expand(workflow);
                if let Some((cell, first)) =
                    cells.iter().find_map(|cell| seen.get(&cell.name).map(|first| (&cell.name, first)))
                {
                    errors.push(WorkflowError::whole_file(
                        &display_path,
                        format!("workflow {cell:?} is already defined by {first}"),
                    ));
                } else {
                    for cell in cells {
                        seen.insert(cell.name.clone(), display_path.clone());
                        workflows.push(cell);
                    }
                }
            }
            Err(error) => errors.push(error),
        }
    }
    workflows.sort_by(|a, b| a.name.cmp(&b.name));
    check_needs(&mut workflows, &mut errors);
    (workflows, errors)
}

/// Whether `name` is a valid shell variable name: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_variable_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|first| first.is_ascii_alphabetic() || first == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Whether `name` can be a host name's label, as a service's name must (steps reach it by
/// it): lowercase letters, digits and `-`, starting with a letter, not ending with `-`, at
/// most 63 characters.
pub fn is_host_label(name: &str) -> bool {
    name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The prefix of the run variables; env and secret names may not start with it.
pub const RESERVED_PREFIX: &str = "KNOTLESS_";

/// Whether `name` may be given to steps: letters, digits and `_`, not starting with a digit,
/// and not one of the run's own (`CI`, `KNOTLESS_*`).
pub fn check_variable_name(name: &str) -> Result<(), String> {
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!("{:?} is not a variable name (letters, digits and _)", crate::printable::name(name)));
    }
    if name == "CI" || name.starts_with(RESERVED_PREFIX) {
        return Err(format!("{name} is set by the run itself and cannot be given"));
    }
    Ok(())
}

/// The index of the first name in `names` already seen before it.
fn first_duplicate<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<usize> {
    let mut seen = BTreeSet::new();
    names.into_iter().position(|name| !seen.insert(name))
}
