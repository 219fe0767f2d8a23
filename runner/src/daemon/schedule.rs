//! From events to queued checks: the checkout of each event, the workflows it holds that the
//! event triggers and that may run on this runner (selection), and one queued check each.

use std::path::PathBuf;

use crate::checks::{CheckRecord, CheckTarget};
use crate::forge::{Forge, ForgeEvent, Prepared, RECORD_FILE, Repository, RepositoryRecord};
use crate::report::RunStatus;
use crate::workflow::{Event, Workflow};

/// One run to do.
pub struct Job {
    /// The repository.
    pub repository: Repository,
    /// The workflow.
    pub workflow: Workflow,
    /// The checkout.
    pub prepared: Prepared,
    /// Its check (queued).
    pub check: CheckRecord,
    /// The paths its event changed, when they were read (`changed()` in an `if:`).
    pub changed: Option<Vec<String>>,
}

/// Whether `workflow` may run on runner `runner_id` at all: it pins no runner, or pins this one
/// (the lander's test for gating workflows; pushes and pulls use [`runs_here`]).
pub fn selected(workflow: &Workflow, runner_id: &str) -> bool {
    workflow.runners.is_empty() || workflow.runners.iter().any(|runner| runner == runner_id)
}

/// Whether `workflow` runs on runner `runner_id` for pushes and pulls, so that each commit
/// and pull has exactly one check a workflow however many runners are named: a workflow
/// pinned by `runners:` runs on the first runner it pins; any other on the first runner the
/// repository record names (`named`), whether or not that runner is running; with no runner
/// named, on every runner watching the repository.
pub fn runs_here(workflow: &Workflow, runner_id: &str, named: &[String]) -> bool {
    match workflow.runners.first().or_else(|| named.first()) {
        Some(owner) => owner == runner_id,
        None => true,
    }
}

/// A run id: the workflow's safe characters and a unique suffix (a session id too), starting
/// with a letter or a digit whatever the workflow's name.
pub fn new_run_id(workflow: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let safe: String =
        workflow.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).take(40).collect();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    // A session id starts with a letter or a digit, as container and Job names must.
    let safe = match safe.trim_start_matches('-') {
        "" => "run",
        safe => safe,
    };
    format!("{safe}-{:x}{:02x}", nanos & 0xffff_ffff_ffff, count & 0xff)
}

/// The kind of run an event starts, the branch its workflows' filters see, and its checks'
/// target.
fn target_of(event: &ForgeEvent) -> (Event, String, CheckTarget) {
    match event {
        ForgeEvent::Push { branch, commit, .. } => (
            Event::Push,
            branch.clone(),
            CheckTarget {
                event: Event::Push,
                commit: commit.clone(),
                git_ref: format!("refs/heads/{branch}"),
                pull: None,
                head: None,
                base: None,
            },
        ),
        ForgeEvent::Pull { number, pull } => (
            Event::Pull,
            pull.base.clone(),
            CheckTarget {
                event: Event::Pull,
                commit: pull.head.clone(),
                git_ref: format!("refs/pulls/{number}/head"),
                pull: Some(*number),
                head: Some(pull.head.clone()),
                base: Some(pull.base.clone()),
            },
        ),
    }
}

/// The event's checkout, and for a pull that does not merge, its head's with the merge's error
/// (each of its workflows then ends with that error). When there is no checkout at all: the
/// name of the one check that says so, and its cause.
async fn prepare<F: Forge>(
    forge: &F,
    repository: &Repository,
    event: &ForgeEvent,
) -> Result<(Prepared, Option<String>), (&'static str, String)> {
    let error = match forge.prepare(repository, event).await {
        Ok(prepared) => return Ok((prepared, None)),
        Err(error) => error,
    };
    match event {
        ForgeEvent::Pull { number, pull } => {
            let head = ForgeEvent::Push { branch: format!("pulls/{number}"), commit: pull.head.clone(), before: None };
            match forge.prepare(repository, &head).await {
                Ok(prepared) => Ok((prepared, Some(format!("{error:#}")))),
                Err(_) => Err(("merge", format!("{error:#}"))),
            }
        }
        ForgeEvent::Push { commit, .. } => Err(("checkout", format!("cannot check out {commit}: {error:#}"))),
    }
}

/// The jobs of one event, and the checks that ended before running (workflows that do not
/// load, a pull that does not merge).
pub async fn plan<F: Forge>(
    forge: &F,
    repository: &Repository,
    event: &ForgeEvent,
    runner_id: &str,
) -> (Vec<Job>, Vec<CheckRecord>) {
    let (kind, branch, target) = target_of(event);
    let trusted = kind == Event::Push;
    let record = |workflow: &str, target: &CheckTarget| {
        let repository = (repository.url.as_str(), repository.key.as_str());
        CheckRecord::queued(new_run_id(workflow), repository, workflow, target, trusted, runner_id)
    };
    let mut ended = Vec::new();
    let (prepared, merge_error) = match prepare(forge, repository, event).await {
        Ok(prepared) => prepared,
        Err((name, cause)) => {
            let mut check = record(name, &target);
            check.end(RunStatus::Error, cause);
            return (Vec::new(), vec![check]);
        }
    };
    let mut target = target;
    if merge_error.is_none() {
        target.commit = prepared.commit.clone();
    }
    let (workflows, errors) = match prepared.checkout.workflows().await {
        Ok(found) => found,
        Err(error) => {
            let mut check = record("workflows", &target);
            check.end(RunStatus::Error, format!("cannot read the workflows: {error:#}"));
            return (Vec::new(), vec![check]);
        }
    };
    for error in errors {
        let name = PathBuf::from(&error.file).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let mut check = record(&name, &target);
        check.end(RunStatus::Error, error.to_string());
        ended.push(check);
    }
    let named = match forge.read_default(repository, RECORD_FILE).await {
        Ok(Some(text)) => RepositoryRecord::parse(&text).map(|record| record.runners).unwrap_or_default(),
        _ => Vec::new(),
    };
    let mut jobs = Vec::new();
    // What the event changed, read once and only when a workflow filters on it.
    let mut changed: Option<Option<Vec<String>>> = None;
    for workflow in workflows {
        if !workflow.on.matches(kind, Some(&branch)) || !runs_here(&workflow, runner_id, &named) {
            continue;
        }
        if workflow.on.paths(kind).is_some() || workflow.reads_changes() {
            if changed.is_none() {
                changed = Some(match forge.changed_paths(repository, event).await {
                    Ok(paths) => paths,
                    Err(error) => {
                        tracing::warn!(repository = %repository.url, "cannot list the paths {} changed, so paths filters pass: {error:#}", target.commit);
                        None
                    }
                });
            }
            if let Some(Some(paths)) = &changed
                && let Some(why) = workflow.on.paths_refusal(kind, paths)
            {
                tracing::info!(repository = %repository.url, workflow = %workflow.name, commit = %target.commit, "not run: {why}");
                continue;
            }
        }
        let check = record(&workflow.name, &target);
        if let Some(cause) = &merge_error {
            let mut check = check;
            check.end(RunStatus::Error, cause.clone());
            ended.push(check);
            continue;
        }
        let changed = changed.clone().flatten().filter(|_| workflow.reads_changes());
        jobs.push(Job { repository: repository.clone(), workflow, prepared: prepared.clone(), check, changed });
    }
    (jobs, ended)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_id_starts_with_a_letter_or_a_digit_whatever_the_workflow_is_named() {
        for name in ["-dash", "ünïcode", "ü", "..x", "build"] {
            let id = new_run_id(name);
            assert!(id.starts_with(|c: char| c.is_ascii_alphanumeric()), "{name}: {id}");
            assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'), "{name}: {id}");
        }
        assert!(new_run_id("ü").starts_with("run-"));
    }

    #[test]
    fn run_ids_are_safe_and_unique() {
        let one = new_run_id("build & test");
        let two = new_run_id("build & test");
        assert_ne!(one, two);
        assert!(one.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'), "{one}");
    }
}
