//! Workflows side by side: each runs once every workflow it needs has passed, up to `--jobs` at
//! once and each matrix's `max-parallel`; one whose need did not pass is skipped with why.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::Context;
use super::terminal::{StepTail, Terminal, note};
use crate::report::{LogSink as _, RunReport, RunStatus};

/// What one workflow of a run gave: its report, its outputs folder, its failed steps' tails.
pub(super) type Ran = (RunReport, Option<PathBuf>, Vec<StepTail>);

/// Runs `selected`, up to `jobs` at once, each once every workflow it needs has passed; one
/// whose need did not pass, or does not run here, is skipped with the reason. The results are
/// in the order of `selected`.
pub(super) async fn run_graph(context: &Context, selected: Vec<crate::workflow::Workflow>, jobs: usize) -> Vec<Ran> {
    let names: Vec<(String, Option<String>)> =
        selected.iter().map(|workflow| (workflow.name.clone(), workflow.base.clone())).collect();
    let mut results: Vec<Option<Ran>> = (0..selected.len()).map(|_| None).collect();
    let mut ended: BTreeMap<String, RunStatus> = BTreeMap::new();
    let mut waiting: Vec<(usize, crate::workflow::Workflow)> = selected.into_iter().enumerate().collect();
    let mut running: Vec<Running<'_>> = Vec::new();
    // How many combinations of each matrix run, by file stem.
    let mut active: BTreeMap<String, usize> = BTreeMap::new();
    loop {
        // A skip can decide what waited for it: scan again until nothing changes.
        let mut index = 0;
        while index < waiting.len() && !context.cancel.is_cancelled() {
            match readiness(&waiting[index].1, &names, &ended) {
                Readiness::Wait => index += 1,
                Readiness::Skip(cause) => {
                    let (at, workflow) = waiting.remove(index);
                    index = 0;
                    let mut terminal = Terminal::new(workflow.name.clone(), context.paint, false);
                    note(&mut terminal, &format!("skipped: {cause}"));
                    terminal.flush();
                    ended.insert(workflow.name.clone(), RunStatus::Skipped);
                    results[at] = Some((skipped(&workflow, cause), None, terminal.tails));
                }
                Readiness::Ready if running.len() < jobs && !at_max_parallel(&waiting[index].1, &active) => {
                    let (at, workflow) = waiting.remove(index);
                    if let Some(base) = &workflow.base {
                        *active.entry(base.clone()).or_default() += 1;
                    }
                    running.push(Box::pin(async move { (at, context.run(workflow).await) }));
                }
                Readiness::Ready => index += 1,
            }
        }
        let next = first_ended(&mut running).await;
        if let Some((at, _)) = &next
            && let Some(base) = &names[*at].1
            && let Some(count) = active.get_mut(base)
        {
            *count = count.saturating_sub(1);
        }
        match next {
            Some((at, Some(ran))) => {
                ended.insert(ran.0.workflow.clone(), ran.0.status);
                results[at] = Some(ran);
            }
            Some((_, None)) => {}
            // Nothing runs and nothing can start: cancelled, or all done.
            None => break,
        }
    }
    results.into_iter().flatten().collect()
}

/// A workflow running in a run, which gives its index in the run and what it gave.
pub(super) type Running<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = (usize, Option<Ran>)> + Send + 'a>>;

/// What the first of `running` to end gave, taken out of it; `None` when nothing runs.
///
/// Every running workflow is polled on each wake-up (there are at most `--jobs`), rather than
/// through `FuturesUnordered`, which wakes its own task again whenever it has polled all it
/// holds: on the multi-threaded runtime, that woke the other worker at every step.
pub(super) async fn first_ended(running: &mut Vec<Running<'_>>) -> Option<(usize, Option<Ran>)> {
    if running.is_empty() {
        return None;
    }
    let ended = std::future::poll_fn(|cx| {
        for (index, workflow) in running.iter_mut().enumerate() {
            if let std::task::Poll::Ready(ended) = workflow.as_mut().poll(cx) {
                return std::task::Poll::Ready((index, ended));
            }
        }
        std::task::Poll::Pending
    })
    .await;
    drop(running.swap_remove(ended.0));
    Some(ended.1)
}

/// Whether `workflow` is a combination of a matrix that already runs its `max-parallel`.
pub(super) fn at_max_parallel(workflow: &crate::workflow::Workflow, active: &BTreeMap<String, usize>) -> bool {
    match (&workflow.base, workflow.max_parallel) {
        (Some(base), Some(limit)) => active.get(base).is_some_and(|running| *running >= limit),
        _ => false,
    }
}

/// Whether a workflow can start now.
pub(super) enum Readiness {
    Ready,
    Wait,
    Skip(String),
}

/// Whether `workflow` can start, given the names of the run's workflows (each with its matrix
/// stem) and how those that ended ended.
pub(super) fn readiness(
    workflow: &crate::workflow::Workflow,
    names: &[(String, Option<String>)],
    ended: &BTreeMap<String, RunStatus>,
) -> Readiness {
    let mut wait = false;
    for need in &workflow.needs {
        let named: Vec<&String> = names
            .iter()
            .filter(|(name, base)| name == need || base.as_deref() == Some(need.as_str()))
            .map(|(name, _)| name)
            .collect();
        if named.is_empty() {
            return Readiness::Skip(format!(
                "it needs {need}, which this run does not run (not selected or not triggered)"
            ));
        }
        for name in named {
            match ended.get(name) {
                None => wait = true,
                Some(RunStatus::Success) => {}
                Some(status) => {
                    return Readiness::Skip(format!("it needs {need}, and {name} {}", status.outcome()));
                }
            }
        }
    }
    if wait { Readiness::Wait } else { Readiness::Ready }
}

/// The report of a workflow that did not run.
pub(super) fn skipped(workflow: &crate::workflow::Workflow, cause: String) -> RunReport {
    RunReport {
        run_id: String::new(),
        workflow: workflow.name.clone(),
        status: RunStatus::Skipped,
        log: format!("==> skipped: {cause}\n"),
        cause: Some(cause),
        steps: Vec::new(),
        outputs: Vec::new(),
        duration_ms: 0,
        log_truncated: false,
    }
}
