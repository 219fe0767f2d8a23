//! Step features of the workflow format through `knotless-run run` and the shell executor:
//! `continue-on-error`, `working-directory` and `shell`.

use knotless_tests::Repo;

/// `run` of `repo` through the shell executor with `extra` flags; nothing may be left in its
/// work folder.
fn run_with(repo: &Repo, extra: &[&str]) -> knotless_tests::Ran {
    crate::run_shell_with(repo, extra, &[])
}

fn run(repo: &Repo) -> knotless_tests::Ran {
    run_with(repo, &[])
}

/// The summary row of a step of workflow `ci`.
fn row(stdout: &str, step: &str) -> Vec<String> {
    crate::summary_row(stdout, "ci", step)
}

#[test]
fn a_step_that_may_fail_is_reported_failed_and_the_run_goes_on() {
    let repo = Repo::new();
    repo.workflow(
        "ci",
        "steps:\n  - name: audit\n    continue-on-error: true\n    run: echo audit; exit 3\n  - name: slow\n    continue-on-error: true\n    timeout: 1s\n    run: sleep 30\n  - name: test\n    run: echo tested\n",
    );
    let passed = run(&repo);
    assert_eq!(passed.code, Some(0), "{}", passed.both());
    assert_eq!(row(&passed.stdout, "audit")[1..4], ["failure", "audit", "3"], "{}", passed.both());
    assert!(passed.stdout.lines().any(|line| line.starts_with("ci        timed out  slow")), "{}", passed.both());
    assert!(
        passed
            .stdout
            .contains("ci ==> step slow was killed at its timeout of 1 s; the run goes on (continue-on-error)"),
        "{}",
        passed.both()
    );
    assert_eq!(row(&passed.stdout, "test")[1], "success", "{}", passed.both());
    assert!(
        passed.stdout.contains("ci ==> step audit exited with 3; the run goes on (continue-on-error)"),
        "{}",
        passed.both()
    );
    assert!(
        passed.stdout.contains("ci/test | tested") && passed.stdout.contains("ci: success in"),
        "{}",
        passed.both()
    );

    // Without it, the first failure ends the run.
    repo.workflow("ci", "steps:\n  - name: audit\n    run: exit 3\n  - name: test\n    run: echo tested\n");
    let failed = run(&repo);
    assert_eq!(failed.code, Some(1), "{}", failed.both());
    assert!(!failed.stdout.contains("ci/test | tested"), "{}", failed.both());
    assert_eq!(row(&failed.stdout, "test")[1], "skipped", "{}", failed.both());
}

#[test]
fn steps_run_in_their_working_directory_and_a_missing_one_fails_its_step() {
    let repo = Repo::new();
    repo.write("app/marker", "app\n");
    repo.write("docs/a dir/marker", "docs\n");
    repo.write(".knotless/steps/where/run", "#!/bin/sh\npwd\n");
    std::fs::set_permissions(
        repo.path().join(".knotless/steps/where/run"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    repo.workflow(
        "ci",
        "working-directory: app\nsteps:\n  - name: app\n    run: cat marker\n  - name: docs\n    working-directory: \"docs/a dir\"\n    run: cat marker\n  - name: shared\n    uses: where\n",
    );
    let passed = run(&repo);
    assert_eq!(passed.code, Some(0), "{}", passed.both());
    assert!(passed.stdout.contains("ci/app | app\n"), "{}", passed.both());
    assert!(passed.stdout.contains("ci/docs | docs\n"), "{}", passed.both());
    assert!(
        passed.stdout.lines().any(|line| line.starts_with("ci/shared | ") && line.ends_with("/work/app")),
        "{}",
        passed.both()
    );

    repo.workflow("ci", "steps:\n  - name: nowhere\n    working-directory: missing\n    run: echo never\n");
    let failed = run(&repo);
    assert_eq!(failed.code, Some(1), "{}", failed.both());
    assert!(!failed.stdout.contains("never"), "{}", failed.both());
    assert!(failed.stdout.contains("ci/nowhere | ") && failed.stdout.contains("missing"), "{}", failed.both());
    assert_eq!(row(&failed.stdout, "nowhere")[1], "failure", "{}", failed.both());
}

#[test]
fn a_bash_step_fails_on_a_broken_pipe_where_sh_does_not() {
    let repo = Repo::new();
    repo.workflow(
        "ci",
        "steps:\n  - name: sh\n    run: false | cat; echo sh-goes-on\n  - name: bash-ok\n    shell: bash\n    run: '[[ -n \"$BASH_VERSION\" ]] && echo \"bash $BASH_VERSION\"'\n  - name: bash\n    shell: bash\n    run: false | cat; echo bash-goes-on\n",
    );
    let ran = run(&repo);
    assert_eq!(ran.code, Some(1), "{}", ran.both());
    assert!(ran.stdout.contains("ci/sh | sh-goes-on"), "{}", ran.both());
    assert!(ran.stdout.contains("ci/bash-ok | bash "), "{}", ran.both());
    assert!(!ran.stdout.contains("bash-goes-on"), "pipefail fails the step at the pipe:\n{}", ran.both());
    assert_eq!(row(&ran.stdout, "bash")[1..4], ["failure", "bash", "1"], "{}", ran.both());
}

#[test]
fn a_matrix_runs_each_combination_as_a_workflow_of_its_own() {
    let repo = Repo::new();
    repo.workflow(
        "test",
        "matrix:\n  n: [1, 2]\n  os: [debian, alpine]\n  exclude:\n    - { n: 2, os: alpine }\nsteps:\n  - name: show\n    run: echo \"n=$n os=$os\"; [ \"$n\" != 2 ]\n",
    );
    let ran = run(&repo);
    assert_eq!(ran.code, Some(1), "{}", ran.both());
    for (name, line) in [
        ("test (1, debian)", "n=1 os=debian"),
        ("test (1, alpine)", "n=1 os=alpine"),
        ("test (2, debian)", "n=2 os=debian"),
    ] {
        assert!(ran.stdout.contains(&format!("{name}/show | {line}")), "{name}\n{}", ran.both());
    }
    assert!(!ran.stdout.contains("test (2, alpine)"), "{}", ran.both());
    assert!(ran.stdout.contains("test (1, debian): success in"), "{}", ran.both());
    assert!(ran.stdout.contains("test (2, debian): failure: step show exited with 1"), "{}", ran.both());

    // --workflow names the file's stem (every combination) or one combination.
    let one = run_with(&repo, &["--workflow", "test (1, alpine)"]);
    assert_eq!(one.code, Some(0), "{}", one.both());
    assert!(
        one.stdout.contains("test (1, alpine)/show | n=1 os=alpine") && !one.stdout.contains("n=1 os=debian"),
        "{}",
        one.both()
    );
}

#[test]
fn needs_run_workflows_in_order_and_skip_what_a_failure_leaves_behind() {
    let repo = Repo::new();
    let step = |text: &str| format!("steps:\n  - name: go\n    run: {text}\n");
    repo.workflow("build", &step("echo built > \"$MARK/build\"; exit $BUILD_EXIT"));
    repo.workflow("test", &format!("needs: [build]\n{}", step("test -e \"$MARK/build\" && echo tested")));
    repo.workflow("deploy", &format!("needs: [test]\n{}", step("echo deployed")));
    repo.workflow("lint", &step("echo linted"));
    let mark = tempfile::tempdir().expect("tempdir");
    let mark_env = format!("MARK={}", mark.path().display());
    let go = |exit: &str| run_with(&repo, &["--jobs", "4", "--env", &mark_env, "--env", &format!("BUILD_EXIT={exit}")]);
    let passed = go("0");
    assert_eq!(passed.code, Some(0), "{}", passed.both());
    let at = |text: &str| passed.stdout.find(text).unwrap_or_else(|| panic!("{text:?} missing:\n{}", passed.both()));
    assert!(at("build ==> success") < at("test/go | tested"), "test ran before build ended:\n{}", passed.both());
    assert!(at("test ==> success") < at("deploy/go | deployed"), "{}", passed.both());

    let failed = go("3");
    assert_eq!(failed.code, Some(1), "{}", failed.both());
    assert!(failed.stdout.contains("lint/go | linted"), "{}", failed.both());
    assert!(failed.stdout.contains("test ==> skipped: it needs build, and build failed"), "{}", failed.both());
    assert!(failed.stdout.contains("deploy ==> skipped: it needs test, and test was skipped"), "{}", failed.both());
    assert!(!failed.stdout.contains("tested") && !failed.stdout.contains("deployed"), "{}", failed.both());
    assert!(failed.stdout.lines().any(|line| line.starts_with("deploy    skipped")), "{}", failed.both());

    // A workflow named alone brings what it needs (and what that needs), run first.
    std::fs::remove_file(mark.path().join("build")).expect("the mark of the last build");
    let env = ["--env", &mark_env, "--env", "BUILD_EXIT=0"];
    let brought = run_with(&repo, &[&["--workflow", "deploy"][..], &env].concat());
    assert_eq!(brought.code, Some(0), "{}", brought.both());
    let at = |text: &str| brought.stdout.find(text).unwrap_or_else(|| panic!("{text:?} missing:\n{}", brought.both()));
    assert!(at("build ==> runs first: test needs it") < at("build ==> success"), "{}", brought.both());
    assert!(at("test ==> runs first: deploy needs it") < at("test/go | tested"), "{}", brought.both());
    assert!(at("build ==> success") < at("test/go | tested"), "{}", brought.both());
    assert!(at("test ==> success") < at("deploy/go | deployed"), "{}", brought.both());
    assert!(!brought.stdout.contains("linted"), "lint is needed by none: {}", brought.both());
    // --no-needs runs it alone.
    std::fs::remove_file(mark.path().join("build")).expect("the mark of the last build");
    let alone = run_with(&repo, &[&["--workflow", "test", "--no-needs"][..], &env].concat());
    assert_eq!(alone.code, Some(1), "test fails without build's mark: {}", alone.both());
    assert!(alone.stdout.contains("test ==> runs without build (--no-needs)"), "{}", alone.both());
    assert!(!alone.stdout.contains("built") && !alone.stdout.contains("deployed"), "{}", alone.both());
    // A need the event does not trigger: the dependent says so.
    repo.workflow("build", &format!("on: [pull]\n{}", step("true")));
    let untriggered = run_with(&repo, &["--workflow", "deploy"]);
    assert_eq!(untriggered.code, Some(1), "{}", untriggered.both());
    assert!(untriggered.stdout.contains("build ==> skipped: not triggered by push"), "{}", untriggered.both());
    assert!(
        untriggered.stdout.contains("test ==> skipped: it needs build, which this run does not run"),
        "{}",
        untriggered.both()
    );
    assert!(
        untriggered.stdout.contains("deploy ==> skipped: it needs test, which this run does not run"),
        "{}",
        untriggered.both()
    );
    assert!(untriggered.stderr.contains("knotless-run: no workflow runs in "), "{}", untriggered.both());
}

/// A matrix of four combinations, two at a time (`max-parallel: 2`), whose steps each mark
/// themselves running in `$MEET`, wait (up to 5 s) for a second to run, and record how many
/// run then and half a second later, in `$MEET/counts`.
pub(crate) const TWO_AT_A_TIME: &str = "matrix:\n  n: [1, 2, 3, 4]\n  max-parallel: 2\nsteps:\n  - name: count\n    run: |\n      touch \"$MEET/run-$n\"\n      running() { ls -d \"$MEET\"/run-* | wc -l; }\n      i=0\n      while [ \"$(running)\" -lt 2 ] && [ $i -lt 50 ]; do i=$((i+1)); sleep 0.1; done\n      running >> \"$MEET/counts\"\n      sleep 0.5\n      running >> \"$MEET/counts\"\n      rm \"$MEET/run-$n\"\n";

/// The most combinations `$MEET/counts` saw running at once.
pub(crate) fn most_at_once(meet: &std::path::Path) -> usize {
    let counts = std::fs::read_to_string(meet.join("counts")).expect("the counts");
    assert_eq!(counts.lines().count(), 8, "{counts}");
    counts.lines().filter_map(|line| line.trim().parse().ok()).max().expect("a count")
}

#[test]
fn max_parallel_runs_a_matrix_so_many_at_a_time_however_many_jobs() {
    let repo = Repo::new();
    repo.workflow("m", TWO_AT_A_TIME);
    let meet = tempfile::tempdir().expect("tempdir");
    let meet_env = format!("MEET={}", meet.path().display());
    let ran = run_with(&repo, &["--jobs", "4", "--env", &meet_env]);
    assert_eq!(ran.code, Some(0), "{}", ran.both());
    for n in 1..=4 {
        assert!(ran.stdout.contains(&format!("m ({n}): success in")), "{}", ran.both());
    }
    assert_eq!(
        most_at_once(meet.path()),
        2,
        "{}",
        std::fs::read_to_string(meet.path().join("counts")).unwrap_or_default()
    );
}

#[test]
fn steps_run_by_their_conditions_and_a_failure_under_continue_on_error_is_no_failure() {
    let repo = Repo::new();
    repo.workflow(
        "ci",
        "env: {MODE: fast}\nsteps:\n  - name: soft\n    continue-on-error: true\n    run: exit 4\n  - name: not-after-soft\n    if: failure()\n    run: echo wrong\n  - name: breaks\n    run: echo broke; exit 3\n  - name: plain\n    run: echo wrong\n  - name: mopup\n    if: failure() && env.MODE == 'fast'\n    run: echo mopped \"$MODE\"\n  - name: report\n    if: ${{ always() }}\n    run: echo reported\n  - name: fine\n    if: success()\n    run: echo wrong\n  - name: on-main\n    if: branch == 'main'\n    run: echo wrong\n",
    );
    let ran = run_with(&repo, &["--branch", "main"]);
    assert_eq!(ran.code, Some(1), "{}", ran.both());
    for (step, status) in [
        ("soft", "failure"),
        ("not-after-soft", "skipped"),
        ("breaks", "failure"),
        ("plain", "skipped"),
        ("mopup", "success"),
        ("report", "success"),
        ("fine", "skipped"),
        ("on-main", "skipped"),
    ] {
        assert_eq!(row(&ran.stdout, step)[1], status, "{step}: {}", ran.both());
    }
    assert!(
        ran.stdout.contains("ci/mopup | mopped fast") && ran.stdout.contains("ci/report | reported"),
        "{}",
        ran.both()
    );
    assert!(!ran.stdout.contains("| wrong"), "{}", ran.both());
    for said in [
        "ci ==> step not-after-soft skipped: if: failure() is false",
        "ci ==> step plain skipped: an earlier step failed",
        "ci ==> step fine skipped: if: success() is false",
        "ci ==> step on-main skipped: if: branch == 'main' is false",
        "ci: failure",
    ] {
        assert!(ran.stdout.contains(said), "{said}: {}", ran.both());
    }
    // The run failed with its first failing step, whatever ran after it.
    assert!(ran.stdout.contains("step breaks exited with 3"), "{}", ran.both());
}

#[test]
fn a_workflow_whose_condition_is_false_does_not_run_and_says_why() {
    let repo = Repo::new();
    repo.workflow(
        "release",
        "if: branch == 'main' && env.CHANNEL != 'none'\nsteps:\n  - name: go\n    run: echo released\n",
    );
    repo.workflow("ci", "steps:\n  - name: go\n    run: echo tested\n");
    let ran = run_with(&repo, &["--branch", "feature"]);
    assert_eq!(ran.code, Some(0), "{}", ran.both());
    assert!(
        ran.stdout.contains("release ==> skipped: if: branch == 'main' && env.CHANNEL != 'none' is false"),
        "{}",
        ran.both()
    );
    assert!(ran.stdout.contains("ci/go | tested") && !ran.stdout.contains("released"), "{}", ran.both());
    // `--env` is read by the condition as it is by the steps.
    let skipped = run_with(&repo, &["--branch", "main", "--env", "CHANNEL=none"]);
    assert!(!skipped.stdout.contains("released"), "{}", skipped.both());
    let released = run_with(&repo, &["--branch", "main", "--env", "CHANNEL=stable"]);
    assert!(released.stdout.contains("release/go | released"), "{}", released.both());
}

/// A workflow with a busybox web server beside its steps, reached by name.
const WITH_SERVICE: &str = "services:\n  web:\n    image: knotless-test/busybox:1\n    command: [sh, -c, \"mkdir -p /www && echo hello from $WHO > /www/index.html && exec httpd -f -p 8080 -h /www\"]\n    env: { WHO: web }\n    health: wget -q -O /dev/null http://127.0.0.1:8080/\n    health-timeout: 30s\nsteps:\n  - name: fetch\n    run: wget -q -O - http://web:8080/\n";

#[test]
fn services_run_beside_a_docker_run_and_reach_its_steps_by_name_and_the_shell_executor_refuses_them() {
    let repo = Repo::new();
    repo.workflow("ci", WITH_SERVICE);
    let docker = knotless_tests::ran(knotless_tests::knotless_run(&[
        "run",
        &repo.path().display().to_string(),
        "--executor",
        "docker",
        "--image",
        "knotless-test/busybox:1",
    ]));
    assert_eq!(docker.code, Some(0), "{}", docker.both());
    assert!(docker.stdout.contains("ci/fetch | hello from web"), "{}", docker.both());
    assert!(docker.stdout.contains("with services on network"), "{}", docker.both());
    // Removed with the run: no container and no network of the run is left.
    for what in [&["ps", "--all", "--format", "{{.Names}}"][..], &["network", "ls", "--format", "{{.Name}}"]] {
        let listed = std::process::Command::new("docker").args(what).output().expect("docker");
        let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
        assert!(!listed.lines().any(|name| name.contains("-ci-") && name.contains(".service.web")), "{listed}");
    }

    let shell = run(&repo);
    assert_eq!(shell.code, Some(1), "{}", shell.both());
    assert!(
        shell.stdout.contains("workflow ci has services (web first), but executor shell declares services: false"),
        "{}",
        shell.both()
    );
}
