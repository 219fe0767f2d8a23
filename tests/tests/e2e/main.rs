//! End-to-end tests: the real `knotless-run` binary, real executors, real processes and git
//! repositories; the fake executor for faults. No test sleeps to win a race: each polls with a
//! deadline.

mod act_habits;
mod caches;
mod capabilities;
mod checks_and_logs;
mod closed_pipes;
mod command_line;
mod compat;
mod deadlines;
mod deploy;
mod executor_faults;
mod hostile_names;
mod kubernetes_proof;
mod kubernetes_side_by_side;
mod leftovers;
mod local_runs;
mod metrics;
mod packages;
mod plugin_check;
mod pulls;
mod pushes;
mod python_executor;
mod queue;
mod queue_gates;
mod restarts;
mod retention;
mod run_command;
mod secrets;
mod side_by_side;
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

/// `knotless-run run` of `repo` through the shell executor in a work folder of its own, with
/// `shell_args`'s flags and `extra`.
pub fn shell_args(repo: &Repo, work: &Path) -> Vec<String> {
    vec![
        "run".into(),
        repo.path().display().to_string(),
        "--executor".into(),
        "shell".into(),
        "--executor-option".into(),
        format!("work-dir={}", work.display()),
    ]
}

/// `knotless-run run` of `repo` through the shell executor with `extra` flags and the variables
/// `env`, in a work folder of its own, which it must leave empty.
pub fn run_shell_with(repo: &Repo, extra: &[&str], env: &[(&str, &Path)]) -> knotless_tests::Ran {
    let work = tempfile::tempdir().expect("tempdir");
    let mut args = shell_args(repo, work.path());
    args.extend(extra.iter().map(|arg| arg.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut command = knotless_tests::knotless_run(&args);
    command.envs(env.iter().copied());
    let run = knotless_tests::ran(command);
    let left = sessions_in(work.path());
    assert!(left.is_empty(), "the shell executor left {left:?}\n{}", run.both());
    run
}

/// Every session folder under a shell work folder (`<work>/<runner>/<session>`).
pub fn sessions_in(work: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for runner in std::fs::read_dir(work).into_iter().flatten().flatten() {
        for session in std::fs::read_dir(runner.path()).into_iter().flatten().flatten() {
            // `.owners` names the owner of each session, not a session.
            if session.file_name() != ".owners" {
                found.push(session.path().display().to_string());
            }
        }
    }
    found
}

/// The summary row of a step: `workflow  status  step  exit  time`, split on whitespace.
pub fn summary_row(stdout: &str, workflow: &str, step: &str) -> Vec<String> {
    stdout
        .lines()
        .skip_while(|line| !line.starts_with("workflow  status"))
        .map(|line| line.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .find(|cells| cells.first().map(String::as_str) == Some(workflow) && cells.iter().any(|cell| cell == step))
        .unwrap_or_default()
}
