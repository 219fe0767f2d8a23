//! `knotless-run run` for someone who knows act: a list of the workflows (`-l`), a dry run
//! (`-n`), `-j` with a workflow's name, secrets from a file, and a run where nothing runs.

use std::os::unix::fs::PermissionsExt as _;

use knotless_tests::Repo;

fn run_with(repo: &Repo, extra: &[&str]) -> knotless_tests::Ran {
    crate::run_shell_with(repo, extra, &[])
}

/// Four workflows: `lint`, a matrix `test` that needs it, `deploy` on pushes to main after
/// `test`, and a manual `nightly`; each step touches `$MARK/NAME` when it runs.
fn example(mark: &std::path::Path) -> Repo {
    let repo = Repo::new();
    let step = |name: &str| format!("steps:\n  - name: go\n    run: touch \"{}/{name}\"\n", mark.display());
    repo.workflow("lint", &step("lint"));
    repo.workflow("test", &format!("needs: [lint]\nmatrix:\n  py: ['3.11', '3.12']\n{}", step("test-$py")));
    repo.workflow("deploy", &format!("on:\n  push:\n    branches: [main]\nneeds: [test]\n{}", step("deploy")));
    repo.workflow("nightly", &format!("on:\n  manual:\n    inputs:\n      level: '1'\n{}", step("nightly")));
    repo
}

fn marks(mark: &std::path::Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(mark)
        .expect("the mark folder")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    found
}

#[test]
fn a_list_and_a_dry_run_say_what_runs_and_why_the_rest_does_not_and_run_nothing() {
    let mark = tempfile::tempdir().expect("tempdir");
    let repo = example(mark.path());
    for flag in ["--list", "-l"] {
        let listed = run_with(&repo, &[flag, "--branch", "feature"]);
        assert_eq!(listed.code, Some(0), "{}", listed.both());
        let lines: Vec<&str> = listed.stdout.lines().collect();
        assert_eq!(lines.len(), 6, "a heading and five workflows:\n{}", listed.both());
        assert!(lines[0].starts_with("workflow") && lines[0].contains("needs"), "{}", listed.both());
        let line = |name: &str| lines.iter().find(|line| line.starts_with(name)).copied().unwrap_or_default();
        assert!(line("deploy").contains("push (main)"), "{}", listed.both());
        assert!(
            line("deploy").ends_with("not run: on.push.branches is [main], and this is branch feature"),
            "{}",
            listed.both()
        );
        assert!(line("test (3.12)").contains("lint") && line("test (3.12)").ends_with("runs"), "{}", listed.both());
        assert!(line("nightly").contains("manual (level)"), "{}", listed.both());
    }
    assert_eq!(marks(mark.path()), Vec::<String>::new(), "a list runs nothing");

    let dry = run_with(&repo, &["--dry-run", "--branch", "feature"]);
    assert_eq!(dry.code, Some(0), "{}", dry.both());
    let expected = "1. lint\n   steps: go\n2. test (3.11) (after lint)\n   steps: go\n2. test (3.12) (after lint)\n   steps: go\n\
                    not run: deploy: on.push.branches is [main], and this is branch feature\n\
                    not run: nightly: not triggered by push\n";
    assert!(dry.stdout.starts_with(expected), "{}", dry.both());
    // One workflow with what it needs, in order.
    let one = run_with(&repo, &["-n", "--workflow", "deploy", "--branch", "main"]);
    assert_eq!(one.code, Some(0), "{}", one.both());
    assert!(one.stdout.contains("1. lint, needed by test\n"), "{}", one.both());
    assert!(one.stdout.contains("2. test (3.11) (after lint), needed by deploy\n"), "{}", one.both());
    assert!(one.stdout.contains("3. deploy (after test)\n"), "{}", one.both());
    assert!(!one.stdout.contains("nightly"), "{}", one.both());
    assert_eq!(marks(mark.path()), Vec::<String>::new(), "a dry run runs nothing");

    // And the run itself does what the dry run said.
    let ran = run_with(&repo, &["--workflow", "deploy", "--branch", "main"]);
    assert_eq!(ran.code, Some(0), "{}", ran.both());
    assert_eq!(marks(mark.path()), ["deploy", "lint", "test-3.11", "test-3.12"], "{}", ran.both());
}

#[test]
fn a_run_where_nothing_runs_fails_and_says_why_unless_empty_is_allowed() {
    let mark = tempfile::tempdir().expect("tempdir");
    let repo = example(mark.path());
    let none = run_with(&repo, &["--event", "queue"]);
    assert_eq!(none.code, Some(1), "{}", none.both());
    for name in ["lint", "deploy", "nightly"] {
        assert!(none.stdout.contains(&format!("{name} ==> skipped: not triggered by queue")), "{}", none.both());
    }
    assert!(none.stderr.contains("no workflow runs in ") && none.stderr.contains("--allow-empty"), "{}", none.both());
    let allowed = run_with(&repo, &["--event", "queue", "--allow-empty"]);
    assert_eq!(allowed.code, Some(0), "{}", allowed.both());
    let elsewhere = run_with(&repo, &["--workflow", "deploy", "--branch", "feature", "--no-needs"]);
    assert_eq!(elsewhere.code, Some(1), "{}", elsewhere.both());
    assert!(elsewhere.stdout.contains("deploy ==> skipped: on.push.branches is [main]"), "{}", elsewhere.both());
    // What it needs has nothing to run for either.
    let needs = run_with(&repo, &["--workflow", "deploy", "--branch", "feature"]);
    assert_eq!(needs.code, Some(1), "{}", needs.both());
    assert!(needs.stdout.contains("lint ==> skipped: only test needs it, and that does not run"), "{}", needs.both());
    assert!(!needs.stdout.contains("runs first"), "{}", needs.both());
    assert_eq!(marks(mark.path()), Vec::<String>::new());
}

#[test]
fn j_with_a_name_says_it_is_jobs_and_names_the_flag_that_runs_one_workflow() {
    let repo = Repo::new();
    repo.workflow("test", "steps:\n  - name: go\n    run: 'true'\n");
    let wrong = run_with(&repo, &["-j", "test"]);
    assert_eq!(wrong.code, Some(2), "{}", wrong.both());
    assert!(
        wrong.stderr.contains("-j is --jobs, how many workflows run at once")
            && wrong.stderr.contains("use --workflow test"),
        "{}",
        wrong.both()
    );
    let zero = run_with(&repo, &["-j", "0"]);
    assert_eq!(zero.code, Some(2), "{}", zero.both());
    assert!(zero.stderr.contains("from 1 to 64"), "{}", zero.both());
}

#[test]
fn secrets_come_from_a_file_masked_and_a_file_others_may_read_is_warned_about() {
    let repo = Repo::new();
    repo.workflow(
        "use",
        "steps:\n  - name: show\n    secrets: [TOKEN, OTHER]\n    run: |\n      echo \"token=$TOKEN other=$OTHER\"\n      \
         test \"$TOKEN\" = 's3cret-from-file' && test \"$OTHER\" = 'from-the-flag'\n",
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("secrets");
    std::fs::write(&file, "# the team's\n\nTOKEN=s3cret-from-file\nOTHER=overridden-by-the-flag\n").expect("write");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let file_arg = file.display().to_string();
    let command_env = [("OTHER", std::path::Path::new("from-the-flag"))];
    let ran = crate::run_shell_with(&repo, &["--secret-file", &file_arg, "--secret", "OTHER"], &command_env);
    assert_eq!(ran.code, Some(0), "{}", ran.both());
    assert!(ran.stdout.contains("use/show | token=*** other=***"), "{}", ran.both());
    assert!(!ran.stdout.contains("s3cret") && !ran.stderr.contains("s3cret"), "{}", ran.both());
    assert!(!ran.stderr.contains("--secret-file"), "a file readable by its owner alone: {}", ran.both());

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let open = crate::run_shell_with(&repo, &["--secret-file", &file_arg, "--secret", "OTHER"], &command_env);
    assert!(
        open.stderr.contains(&format!("warning: --secret-file {file_arg} may be read by others (mode 644)")),
        "{}",
        open.both()
    );

    // A line that is not NAME=VALUE is named by its number, never quoted.
    std::fs::write(&file, "TOKEN=fine\njust-a-s3cret-value\n").expect("write");
    let bad = run_with(&repo, &["--secret-file", &file_arg]);
    assert_eq!(bad.code, Some(2), "{}", bad.both());
    assert!(bad.stderr.contains(&format!("--secret-file {file_arg}, line 2: expected NAME=VALUE")), "{}", bad.both());
    assert!(!bad.stderr.contains("s3cret"), "{}", bad.both());
}
