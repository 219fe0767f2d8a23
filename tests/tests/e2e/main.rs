//! End-to-end tests: the real `knotless-run` binary, real executors, real processes and git
//! repositories; the fake executor for faults. No test sleeps to win a race: each polls with a
//! deadline.

mod caches;
mod capabilities;
mod checks_and_logs;
mod closed_pipes;
mod command_line;
mod deadlines;
mod deploy;
mod executor_faults;
mod hostile_names;
mod kubernetes_proof;
mod leftovers;
mod local_runs;
mod plugin_check;
mod pulls;
mod pushes;
mod python_executor;
mod queue;
mod queue_gates;
mod restarts;
mod run_command;
mod secrets;
mod status_page;
mod workflow_features;

use std::path::Path;

use knotless_tests::Repo;

/// The flags every test's runner gets: the shell executor, a poll long enough that only
/// `notify` (or the start) explains a run.
pub const SHELL: &[&str] = &["--executor", "shell", "--poll", "3600", "--disk-floor", "0"];

/// A repository at `<dir>/repo` with `workflows` (name, YAML) committed on main.
pub fn repo_with(dir: &Path, workflows: &[(&str, &str)]) -> (Repo, String) {
    let repo = Repo::init(&dir.join("repo"));
    for (name, text) in workflows {
        repo.write(&format!(".knotless/workflows/{name}.yml"), text);
    }
    let commit = repo.commit("workflows");
    (repo, commit)
}

/// The flags plus `extra`, for runner `id`: each test has its own runner id, since an
/// executor's sweep removes everything of its runner id (other tests' runs included).
pub fn flags<'a>(id: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    SHELL.iter().copied().chain(["--runner-id", id]).chain(extra.iter().copied()).collect()
}
