//! Which workflows a `run` runs, and why each other one does not: those `--workflow` names
//! with the workflows they need (unless `--no-needs`), of those the ones the event triggers,
//! and of those the ones whose needs run too. What `--list` and `--dry-run` print.

use std::collections::{BTreeMap, BTreeSet};

use crate::printable;
use crate::workflow::{BranchFilter, Triggers, Workflow};

/// The workflows of a run.
#[derive(Debug, Default)]
pub struct Selection {
    /// The workflows that run, in the order of the folder.
    pub runs: Vec<Workflow>,
    /// The workflows that do not run although chosen (named, needed, or all without
    /// `--workflow`), each with why.
    pub not_run: Vec<(String, String)>,
    /// The workflows a named one brought, each with the names of those that need it.
    pub brought: BTreeMap<String, Vec<String>>,
    /// The named workflows that run without the needs `--no-needs` dropped, with those needs.
    pub alone: Vec<(String, Vec<String>)>,
}

/// Chooses from `workflows` those `names` gives (a file's stem gives all its combinations; none
/// given: every workflow), with what they need unless `no_needs`; of those, the ones
/// `why_not` finds no reason against, and of those the ones whose every need runs.
pub fn choose(
    workflows: Vec<Workflow>,
    names: &[String],
    no_needs: bool,
    why_not: impl Fn(&Workflow) -> Option<String>,
) -> Selection {
    let mut selection = Selection::default();
    let named = |workflow: &Workflow| names.iter().any(|name| workflow.is_named(name));
    let mut chosen: Vec<bool> = workflows.iter().map(|workflow| names.is_empty() || named(workflow)).collect();
    if !names.is_empty() && !no_needs {
        // What the chosen need, and what that needs, until nothing more is brought.
        let mut changed = true;
        while changed {
            changed = false;
            for at in 0..workflows.len() {
                if !chosen[at] {
                    continue;
                }
                for need in &workflows[at].needs {
                    for (other, workflow) in workflows.iter().enumerate() {
                        if workflow.is_named(need) && !chosen[other] {
                            chosen[other] = true;
                            changed = true;
                        }
                        if workflow.is_named(need) && !named(workflow) {
                            let by = selection.brought.entry(workflow.name.clone()).or_default();
                            let stem = workflows[at].stem().to_string();
                            if !by.contains(&stem) {
                                by.push(stem);
                            }
                        }
                    }
                }
            }
        }
    }
    let mut candidates: Vec<Workflow> =
        workflows.into_iter().zip(chosen).filter(|(_, chosen)| *chosen).map(|(workflow, _)| workflow).collect();
    if no_needs && !names.is_empty() {
        // The needs no chosen workflow answers are dropped; those it does still order the run.
        let stems: BTreeSet<String> = candidates.iter().map(|workflow| workflow.stem().to_string()).collect();
        let full_names: BTreeSet<String> = candidates.iter().map(|workflow| workflow.name.clone()).collect();
        for workflow in &mut candidates {
            let (kept, dropped): (Vec<String>, Vec<String>) = std::mem::take(&mut workflow.needs)
                .into_iter()
                .partition(|need| stems.contains(need) || full_names.contains(need));
            workflow.needs = kept;
            if !dropped.is_empty() && !selection.alone.iter().any(|(name, _)| name == workflow.stem()) {
                selection.alone.push((workflow.stem().to_string(), dropped));
            }
        }
    }
    for workflow in candidates {
        match why_not(&workflow) {
            Some(why) => selection.not_run.push((workflow.name.clone(), why)),
            None => selection.runs.push(workflow),
        }
    }
    // A workflow whose need does not run does not run either; that may stop another.
    loop {
        let unmet = selection.runs.iter().enumerate().find_map(|(at, workflow)| {
            let need = workflow.needs.iter().find(|need| !selection.runs.iter().any(|other| other.is_named(need)))?;
            Some((at, format!("it needs {need}, which this run does not run")))
        });
        let Some((at, why)) = unmet else { break };
        let workflow = selection.runs.remove(at);
        selection.not_run.push((workflow.name, why));
    }
    // A workflow brought only for one that does not run has nothing to run for.
    loop {
        let idle = selection.runs.iter().enumerate().find_map(|(at, workflow)| {
            let by = selection.brought.get(&workflow.name)?;
            let needed = selection.runs.iter().any(|other| other.needs.iter().any(|need| workflow.is_named(need)));
            (!needed).then(|| (at, format!("only {} needs it, and that does not run", by.join(", "))))
        });
        let Some((at, why)) = idle else { break };
        let workflow = selection.runs.remove(at);
        selection.not_run.push((workflow.name, why));
    }
    selection
}

/// The order `runs` start in: each workflow's wave, 1 for one that needs none of them, else one
/// more than the latest wave of what it needs. A workflow in a cycle gets none.
pub fn waves(runs: &[Workflow]) -> Vec<Option<usize>> {
    let mut wave: Vec<Option<usize>> = vec![None; runs.len()];
    let mut changed = true;
    while changed {
        changed = false;
        for at in 0..runs.len() {
            if wave[at].is_some() {
                continue;
            }
            let mut latest = Some(0);
            for need in &runs[at].needs {
                for (other, workflow) in runs.iter().enumerate() {
                    if workflow.is_named(need) {
                        latest = match (latest, wave[other]) {
                            (Some(latest), Some(theirs)) => Some(latest.max(theirs)),
                            _ => None,
                        };
                    }
                }
            }
            if let Some(latest) = latest {
                wave[at] = Some(latest + 1);
                changed = true;
            }
        }
    }
    wave
}

/// A branch filter as people read it: `any branch`, or its patterns, and its paths.
fn filter_text(filter: &BranchFilter) -> String {
    let mut text = match &filter.branches {
        None => String::new(),
        Some(branches) => branches.join(", "),
    };
    if let Some(paths) = &filter.paths {
        if !text.is_empty() {
            text.push_str("; ");
        }
        text.push_str("paths ");
        text.push_str(&paths.join(", "));
    }
    text
}

/// A workflow's triggers as people read them: `push (main), pull, manual`.
pub fn triggers_text(on: &Triggers) -> String {
    let mut parts = Vec::new();
    for (word, filter) in [("push", &on.push), ("pull", &on.pull)] {
        if let Some(filter) = filter {
            let detail = filter_text(filter);
            parts.push(if detail.is_empty() { word.to_string() } else { format!("{word} ({detail})") });
        }
    }
    if on.queue {
        parts.push("queue".to_string());
    }
    if let Some(manual) = &on.manual {
        let inputs: Vec<&str> = manual.inputs.keys().map(String::as_str).collect();
        parts.push(if inputs.is_empty() { "manual".to_string() } else { format!("manual ({})", inputs.join(", ")) });
    }
    if parts.is_empty() { "nothing".to_string() } else { parts.join(", ") }
}

/// Rows as a table whose columns are as wide as their widest cell.
pub fn table(rows: &[Vec<String>]) -> Vec<String> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|column| rows.iter().filter_map(|row| row.get(column)).map(|cell| cell.chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
            cells.join("  ").trim_end().to_string()
        })
        .collect()
}

/// `--list`: every workflow (each combination of a matrix), what triggers it, what it needs,
/// and whether it runs for this event and branch, or why not.
pub fn list(workflows: &[Workflow], why_not: impl Fn(&Workflow) -> Option<String>) -> Vec<String> {
    let mut rows = vec![vec!["workflow".to_string(), "on".into(), "needs".into(), "steps".into(), "here".into()]];
    for workflow in workflows {
        let needs = if workflow.needs.is_empty() { "-".to_string() } else { workflow.needs.join(", ") };
        let here = match why_not(workflow) {
            None => "runs".to_string(),
            Some(why) => format!("not run: {why}"),
        };
        rows.push(
            [workflow.name.as_str(), &triggers_text(&workflow.on), &needs, &workflow.steps.len().to_string(), &here]
                .iter()
                .map(|cell| printable::name(cell).into_owned())
                .collect(),
        );
    }
    table(&rows)
}

/// `--dry-run`: what would run, wave by wave, each workflow with its steps and why it is there
/// when a need brought it; then what would not, and why.
pub fn dry_run(selection: &Selection) -> Vec<String> {
    let mut lines = Vec::new();
    let waves = waves(&selection.runs);
    let last = waves.iter().flatten().max().copied().unwrap_or(0);
    for wave in 1..=last {
        for (workflow, _) in selection.runs.iter().zip(&waves).filter(|(_, at)| **at == Some(wave)) {
            let mut head = format!("{wave}. {}", printable::name(&workflow.name));
            if !workflow.needs.is_empty() {
                head.push_str(&format!(" (after {})", printable::name(&workflow.needs.join(", "))));
            }
            if let Some(by) = selection.brought.get(&workflow.name) {
                head.push_str(&format!(", needed by {}", printable::name(&by.join(", "))));
            }
            lines.push(head);
            let steps: Vec<String> =
                workflow.steps.iter().map(|step| printable::name(&step.name).into_owned()).collect();
            lines.push(format!("   steps: {}", if steps.is_empty() { "none".to_string() } else { steps.join(", ") }));
        }
    }
    for (name, dropped) in &selection.alone {
        lines.push(format!(
            "{} runs without {} (--no-needs)",
            printable::name(name),
            printable::name(&dropped.join(", "))
        ));
    }
    for (name, why) in &selection.not_run {
        lines.push(format!("not run: {}: {}", printable::name(name), printable::name(why)));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workflows(yaml: &[(&str, &str)]) -> Vec<Workflow> {
        let mut all = Vec::new();
        for (name, text) in yaml {
            let workflow = crate::workflow::parse(name, &format!(".knotless/workflows/{name}.yml"), text)
                .unwrap_or_else(|error| panic!("{name}: {error}"));
            all.extend(crate::workflow::expand(workflow));
        }
        all
    }

    fn names(runs: &[Workflow]) -> Vec<&str> {
        runs.iter().map(|workflow| workflow.name.as_str()).collect()
    }

    const STEP: &str = "steps:\n  - name: go\n    run: 'true'\n";

    fn example() -> Vec<Workflow> {
        workflows(&[
            ("lint", STEP),
            ("test", &format!("needs: [lint]\nmatrix:\n  py: ['3.11', '3.12']\n{STEP}")),
            ("deploy", &format!("on:\n  push:\n    branches: [main]\nneeds: [test]\n{STEP}")),
            ("docs", STEP),
        ])
    }

    #[test]
    fn a_named_workflow_brings_what_it_needs_and_what_that_needs() {
        let selection = choose(example(), &["deploy".into()], false, |_| None);
        assert_eq!(names(&selection.runs), ["lint", "test (3.11)", "test (3.12)", "deploy"]);
        assert_eq!(selection.brought["lint"], ["test"]);
        assert_eq!(selection.brought["test (3.11)"], ["deploy"]);
        assert!(!selection.brought.contains_key("deploy"), "named, not brought");
        let waves = waves(&selection.runs);
        assert_eq!(waves, [Some(1), Some(2), Some(2), Some(3)]);
        let shown = dry_run(&selection).join("\n");
        assert!(shown.starts_with("1. lint, needed by test\n   steps: "), "{shown}");
        assert!(shown.contains("2. test (3.12) (after lint), needed by deploy"), "{shown}");
        assert!(shown.contains("3. deploy (after test)\n"), "{shown}");
    }

    #[test]
    fn no_needs_runs_a_named_workflow_alone_but_keeps_the_order_of_those_named_together() {
        let selection = choose(example(), &["test".into()], true, |_| None);
        assert_eq!(names(&selection.runs), ["test (3.11)", "test (3.12)"]);
        assert_eq!(selection.alone, [("test".to_string(), vec!["lint".to_string()])]);
        assert!(selection.runs.iter().all(|workflow| workflow.needs.is_empty()));
        let both = choose(example(), &["test".into(), "lint".into()], true, |_| None);
        assert_eq!(names(&both.runs), ["lint", "test (3.11)", "test (3.12)"]);
        assert!(both.alone.is_empty());
        assert_eq!(waves(&both.runs), [Some(1), Some(2), Some(2)]);
    }

    #[test]
    fn a_workflow_whose_need_does_not_run_does_not_run_and_says_why() {
        let why_not = |workflow: &Workflow| (workflow.name == "lint").then(|| "not triggered by pull".to_string());
        let selection = choose(example(), &[], false, why_not);
        assert_eq!(names(&selection.runs), ["docs"]);
        let reasons: BTreeMap<&str, &str> =
            selection.not_run.iter().map(|(name, why)| (name.as_str(), why.as_str())).collect();
        assert_eq!(reasons["lint"], "not triggered by pull");
        assert_eq!(reasons["test (3.11)"], "it needs lint, which this run does not run");
        assert_eq!(reasons["deploy"], "it needs test, which this run does not run");
    }

    #[test]
    fn what_a_named_workflow_needs_does_not_run_when_the_named_one_does_not() {
        let why_not = |workflow: &Workflow| (workflow.name == "deploy").then(|| "not on main".to_string());
        let selection = choose(example(), &["deploy".into()], false, why_not);
        assert_eq!(names(&selection.runs), Vec::<&str>::new());
        let reasons: BTreeMap<&str, &str> =
            selection.not_run.iter().map(|(name, why)| (name.as_str(), why.as_str())).collect();
        assert_eq!(reasons["deploy"], "not on main");
        assert_eq!(reasons["test (3.12)"], "only deploy needs it, and that does not run");
        assert_eq!(reasons["lint"], "only test needs it, and that does not run");
        // Named itself, a need runs whatever its dependent does.
        let both = choose(example(), &["deploy".into(), "lint".into()], false, why_not);
        assert_eq!(names(&both.runs), ["lint"]);
    }

    #[test]
    fn the_list_names_each_workflow_its_triggers_needs_and_whether_it_runs_here() {
        let why_not = |workflow: &Workflow| workflow.on.refusal(crate::workflow::Event::Push, Some("feature"));
        let listed = list(&example(), why_not);
        assert_eq!(listed[0].split_whitespace().collect::<Vec<_>>(), ["workflow", "on", "needs", "steps", "here"]);
        let deploy = listed.iter().find(|line| line.starts_with("deploy")).expect("deploy listed");
        assert!(deploy.contains("push (main)") && deploy.contains("test"), "{deploy}");
        assert!(deploy.ends_with("not run: on.push.branches is [main], and this is branch feature"), "{deploy}");
        assert!(listed.iter().any(|line| line.starts_with("test (3.12)") && line.ends_with("runs")), "{listed:?}");
        let manual = Triggers {
            push: None,
            pull: Some(BranchFilter { branches: Some(vec!["main".into()]), paths: Some(vec!["src/**".into()]) }),
            queue: true,
            manual: Some(crate::workflow::ManualTrigger {
                inputs: [("level".to_string(), "1".to_string())].into_iter().collect(),
            }),
        };
        assert_eq!(triggers_text(&manual), "pull (main; paths src/**), queue, manual (level)");
    }
}
