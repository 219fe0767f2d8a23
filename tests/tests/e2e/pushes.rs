//! Push runs: one check per workflow with statuses and exit codes, selection by `runners:`, a
//! wake-up by `notify`, fetches that never answer, and the disk floor.

use knotless_tests::{Runner, by_workflow, eventually, exit_codes, process_running};

use crate::{flags, repo_with};

const PASS: &str = "steps:\n  - name: one\n    run: echo one\n  - name: two\n    run: echo two\n";
const FAIL: &str = "steps:\n  - name: bad\n    run: echo bad; exit 3\n  - name: never\n    run: echo never\n";
const PINNED: &str = "runners: [someone-else]\nsteps:\n  - name: x\n    run: 'true'\n";

#[test]
fn a_push_gives_one_check_per_workflow_and_notify_starts_it_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, first) = repo_with(dir.path(), &[("pass", PASS), ("fail", FAIL), ("pinned", PINNED)]);
    let runner =
        Runner::start(&dir.path().join("state"), &[flags("e2e-push", &[]), vec![repo.url().as_str()]].concat());
    let checks = runner.final_checks(&repo.url(), &first, 2);
    let pass = by_workflow(&checks, "pass");
    assert_eq!(pass["status"], "success");
    assert_eq!(exit_codes(pass), [Some(0), Some(0)]);
    let fail = by_workflow(&checks, "fail");
    assert_eq!(fail["status"], "failure");
    assert_eq!(exit_codes(fail), [Some(3), None]);
    assert_eq!(fail["steps"][1]["status"], "skipped");
    assert!(fail["cause"].as_str().is_some_and(|cause| cause.contains("bad exited with 3")), "{fail:#}");
    assert!(runner.stderr().contains("runner e2e-push"), "the runner id is shown at start");

    // A notification of a repository the daemon does not watch is refused, naming what it
    // watches; the same repository spelled as a `file://` URL is taken.
    let stranger = dir.path().join("not-watched");
    for name in [stranger.display().to_string(), "demo".to_string()] {
        let refused = runner.command(&["notify", &name]);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{name}: {stderr}");
        assert!(stderr.contains("does not watch") && stderr.contains(&repo.url()), "{name}: {stderr}");
    }
    repo.write("more.txt", "more");
    let second = repo.commit("more");
    runner.notify(&format!("file://{}/", repo.url()));
    let checks = runner.final_checks(&repo.url(), &second, 2);
    assert_eq!(by_workflow(&checks, "pass")["status"], "success");
    let listing = String::from_utf8_lossy(&runner.command(&["checks", &repo.url(), &second]).stdout).into_owned();
    assert!(listing.contains("pass") && listing.contains("exit 3"), "{listing}");
    // Steps read as run's summary reads them, not as Rust names them.
    assert!(listing.contains("step bad: failure, exit 3") && listing.contains("step never: skipped"), "{listing}");
    let log = runner.run_log(pass_run(&checks));
    assert!(log.contains("pass/two | two"), "{log}");
}

/// A repository whose fetch never answers (its `ssh` hangs) holds up no other: repositories
/// are fetched side by side, and that fetch is stopped at `--fetch-timeout` with every process
/// git started for it.
#[test]
fn a_fetch_that_never_answers_is_stopped_and_holds_up_no_other_repository() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, first) = repo_with(dir.path(), &[("pass", PASS)]);
    let stuck = "ssh://stuck.invalid/never.git";
    let url = repo.url();
    let runner = Runner::start_with_env(
        &dir.path().join("state"),
        &[flags("e2e-fetch-timeout", &["--fetch-timeout", "20"]), vec![stuck, url.as_str()]].concat(),
        &[("GIT_SSH_COMMAND", "sleep 917353;:")],
    );
    let checks = runner.final_checks(&url, &first, 1);
    assert_eq!(checks[0]["status"], "success", "{:#}", checks[0]);
    let stopped = |stderr: &str| {
        stderr.contains("cannot mirror ssh://stuck.invalid/never.git") && stderr.contains("no answer within 20 s")
    };
    // The other repository ran while the stuck fetch still waited.
    assert!(!stopped(&runner.stderr()), "the run waited for the stuck fetch: {}", runner.stderr());
    assert!(process_running("sleep 917353"), "the stuck fetch is still waiting");
    eventually("the stuck fetch stopped at its timeout", || stopped(&runner.stderr()).then_some(()));
    eventually("no process of the stuck fetch left", || (!process_running("sleep 917353")).then_some(()));
}

/// While a round waits on a fetch that never answers (one fetch at a time), a `notify` of
/// another repository is served at once, and SIGTERM stops the runner at once, killing that
/// fetch with every process it started: a round holds up neither.
#[test]
fn a_round_stuck_on_a_fetch_holds_up_neither_a_notify_nor_a_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, first) = repo_with(dir.path(), &[("pass", PASS)]);
    // Its key sorts first: the round fetches it before the repository, and never gets there.
    let stuck = "ssh://stuck.invalid/aaa-never.git";
    let url = repo.url();
    let mut runner = Runner::start_with_env(
        &dir.path().join("state"),
        &[flags("e2e-stuck-round", &["--fetch-timeout", "600", "--fetches", "1"]), vec![url.as_str(), stuck]].concat(),
        &[("GIT_SSH_COMMAND", "sleep 917354;:")],
    );
    eventually("the round to wait on the stuck fetch", || process_running("sleep 917354").then_some(()));
    // Answered while the round still waits (a daemon that served it after the round would
    // leave it waiting for the 600 s fetch).
    let state = dir.path().join("state");
    let mut notify = std::process::Command::new(knotless_tests::bin("knotless-run"))
        .args(["notify", url.as_str(), "--state"])
        .arg(&state)
        .spawn()
        .expect("notify");
    let answered = eventually("the notify's answer", || notify.try_wait().expect("wait"));
    assert!(answered.success(), "{answered:?}");
    runner.final_checks(&url, &first, 1);
    repo.write("more.txt", "more");
    let second = repo.commit("more");
    runner.notify(&url);
    let checks = runner.final_checks(&url, &second, 1);
    assert_eq!(checks[0]["status"], "success", "{:#}", checks[0]);
    assert!(process_running("sleep 917354"), "the round still waits on the stuck fetch");
    runner.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(runner.wait().success());
    assert!(runner.stderr().contains("handed over"), "{}", runner.stderr());
    eventually("no process of the stuck fetch left", || (!process_running("sleep 917354")).then_some(()));
}

/// Without a notify, each poll sees what changed in a local repository (watched with inotify,
/// so an idle one costs a round nothing): a commit, a new branch, and a commit in a bare
/// repository pushed to, one after another.
#[test]
fn polls_see_each_change_of_a_local_repository_without_a_notify() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, first) = repo_with(dir.path(), &[("pass", PASS)]);
    let bare = dir.path().join("bare.git");
    repo.git(&["clone", "-q", "--bare", ".", &bare.display().to_string()]);
    let bare_url = bare.display().to_string();
    let runner = Runner::start(
        &dir.path().join("state"),
        &[
            vec!["--executor", "shell", "--runner-id", "e2e-poll", "--poll", "1", "--disk-floor", "0"],
            vec![repo.url().as_str(), bare_url.as_str()],
        ]
        .concat(),
    );
    runner.final_checks(&repo.url(), &first, 1);
    runner.final_checks(&bare_url, &first, 1);
    for round in 0..3 {
        repo.write("file", &round.to_string());
        let commit = repo.commit(&format!("round {round}"));
        let checks = runner.final_checks(&repo.url(), &commit, 1);
        assert_eq!(checks[0]["status"], "success", "{checks:#?}");
        repo.git(&["push", "-q", &bare_url, "HEAD:main"]);
        runner.final_checks(&bare_url, &commit, 1);
    }
    repo.git(&["checkout", "-q", "-b", "feature"]);
    repo.write("file", "feature");
    let feature = repo.commit("on a new branch");
    runner.final_checks(&repo.url(), &feature, 1);
}

fn pass_run(checks: &[serde_json::Value]) -> &str {
    by_workflow(checks, "pass")["run_id"].as_str().expect("a run id")
}

#[test]
fn a_disk_floor_breach_fails_the_run_and_the_runner_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, first) = repo_with(dir.path(), &[("pass", PASS)]);
    let mut runner = Runner::start(
        &dir.path().join("state"),
        &[
            vec!["--executor", "shell", "--runner-id", "e2e-disk", "--poll", "3600"],
            vec!["--disk-floor", "18446744073709551615", repo.url().as_str()],
        ]
        .concat(),
    );
    let checks = runner.final_checks(&repo.url(), &first, 1);
    assert_eq!(checks[0]["status"], "error");
    let cause = checks[0]["cause"].as_str().expect("a cause");
    assert!(cause.starts_with("disk floor") && cause.contains("--disk-floor"), "{cause}");
    assert!(runner.is_running());
    let second = repo.commit("again");
    runner.notify(&repo.url());
    let checks = runner.final_checks(&repo.url(), &second, 1);
    assert_eq!(checks[0]["status"], "error");
    assert!(runner.is_running(), "the runner keeps serving after a disk floor breach");
}

#[test]
fn the_shell_executor_refuses_pulls_unless_forced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, _) = repo_with(dir.path(), &[("pass", PASS)]);
    let mut runner = Runner::start(
        &dir.path().join("state"),
        &[flags("e2e-refuse", &["--pulls"]), vec![repo.url().as_str()]].concat(),
    );
    let status = runner.wait();
    assert!(!status.success());
    let stderr = eventually("the refusal", || Some(runner.stderr()));
    assert!(stderr.contains("--force-shell"), "{stderr}");
}

#[test]
fn discover_watches_the_repositories_whose_record_names_this_runner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let forge = dir.path().join("forge");
    let named = knotless_tests::Repo::init(&forge.join("team/named"));
    named
        .write(".knotless/repository.yml", "runners: [e2e-discover, someone]\n")
        .write(".knotless/workflows/pass.yml", PASS);
    let named_commit = named.commit("named");
    let other = knotless_tests::Repo::init(&forge.join("other"));
    other.write(".knotless/repository.yml", "runners: [someone]\n").write(".knotless/workflows/pass.yml", PASS);
    other.commit("not named");
    let discover = forge.to_string_lossy().into_owned();
    let runner = Runner::start(&dir.path().join("state"), &flags("e2e-discover", &["--discover", &discover]));
    let checks = runner.final_checks(&named.url(), &named_commit, 1);
    assert_eq!(checks[0]["status"], "success");
    let state = std::fs::read_to_string(dir.path().join("state/state.json")).expect("state.json");
    assert!(!state.contains(&other.url()), "a repository that does not name the runner is not watched: {state}");
}

#[test]
fn the_default_runner_takes_discovered_repositories_that_name_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let forge = dir.path().join("forge");
    let unnamed = knotless_tests::Repo::init(&forge.join("unnamed"));
    unnamed.write(".knotless/workflows/pass.yml", PASS);
    let unnamed_commit = unnamed.commit("no record");
    let other = knotless_tests::Repo::init(&forge.join("other"));
    other.write(".knotless/repository.yml", "runners: [someone]\n").write(".knotless/workflows/pass.yml", PASS);
    other.commit("names another runner");
    let discover = forge.to_string_lossy().into_owned();
    let extra = ["--discover", discover.as_str(), "--default-runner", "e2e-default"];
    let runner = Runner::start(&dir.path().join("state"), &flags("e2e-default", &extra));
    let checks = runner.final_checks(&unnamed.url(), &unnamed_commit, 1);
    assert_eq!(checks[0]["status"], "success");
    let state = std::fs::read_to_string(dir.path().join("state/state.json")).expect("state.json");
    assert!(!state.contains(&other.url()), "a repository naming another runner stays theirs: {state}");
}

#[test]
fn logs_follow_prints_a_running_log_as_it_grows_and_stops_when_the_run_ends() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let proceed = dir.path().join("proceed");
    let workflow = format!(
        "steps:\n  - name: slow\n    run: |\n      echo first-line\n      while [ ! -e '{}' ]; do sleep 0.05; done\n      echo second-line\n",
        proceed.display()
    );
    let (repo, commit) = repo_with(dir.path(), &[("slow", workflow.as_str())]);
    let runner =
        Runner::start(&dir.path().join("state"), &[flags("e2e-follow", &[]), vec![repo.url().as_str()]].concat());
    let run_id = eventually("a running check", || {
        let checks = runner.checks(&repo.url(), Some(&commit));
        checks
            .iter()
            .find(|check| check["status"] == "running")
            .and_then(|check| check["run_id"].as_str().map(str::to_string))
    });
    let mut follow = std::process::Command::new(knotless_tests::bin("knotless-run"))
        .args(["logs", &run_id, "--follow", "--state"])
        .arg(&runner.state)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn logs --follow");
    let mut lines = BufReader::new(follow.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("a line");
        let first = line.contains("first-line");
        seen.push(line);
        if first {
            break;
        }
    }
    assert!(seen.iter().any(|line| line.contains("first-line")), "the live log showed the first line: {seen:?}");
    assert!(!seen.iter().any(|line| line.contains("second-line")), "the step has not printed its second line yet");
    std::fs::write(&proceed, "").expect("let the step go on");
    // Bounded: a `--follow` that never ends fails the test instead of hanging it.
    let status = eventually("logs --follow to end with the run", || follow.try_wait().expect("wait"));
    seen.extend(lines.map_while(Result::ok));
    assert!(status.success(), "{seen:?}");
    assert!(seen.iter().any(|line| line.contains("second-line")), "the rest came as it was written: {seen:?}");
    let checks = runner.final_checks(&repo.url(), &commit, 1);
    assert_eq!(checks[0]["status"], "success");
}

#[test]
fn two_named_runners_give_one_check_a_workflow_on_its_owner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let step = "on: [push]\nsteps:\n  - name: s\n    run: 'true'\n";
    let pinned = "on: [push]\nrunners: [e2e-dup-two, e2e-dup-one]\nsteps:\n  - name: s\n    run: 'true'\n";
    let (repo, _) = repo_with(dir.path(), &[("plain", step), ("pinned", pinned)]);
    repo.write(".knotless/repository.yml", "runners: [e2e-dup-one, e2e-dup-two]\n");
    let commit = repo.commit("name two runners");
    let url = repo.url();
    let one = Runner::start(&dir.path().join("one"), &[flags("e2e-dup-one", &[]), vec![url.as_str()]].concat());
    let two = Runner::start(&dir.path().join("two"), &[flags("e2e-dup-two", &[]), vec![url.as_str()]].concat());
    // Each runner plans every workflow of a push at once: once its own check is final, it has
    // planned all it ever will for this commit.
    let on_one = one.final_checks(&url, &commit, 1);
    let on_two = two.final_checks(&url, &commit, 1);
    assert_eq!(by_workflow(&on_one, "plain")["status"], "success", "{on_one:#?}");
    assert_eq!(by_workflow(&on_two, "pinned")["status"], "success", "{on_two:#?}");
}

#[test]
fn the_daemons_env_file_and_env_reach_every_steps_under_the_workflows_own_env() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workflow =
        "env: { OWN: workflow }\nsteps:\n  - name: show\n    run: echo \"file=$FROM_FILE flag=$FROM_FLAG own=$OWN\"\n";
    let (repo, first) = repo_with(dir.path(), &[("show", workflow)]);
    let env_file = dir.path().join("steps.env");
    std::fs::write(&env_file, "# for every step\nFROM_FILE=file value\nFROM_FLAG=file\nOWN=file\n").expect("write");
    let env_file = env_file.display().to_string();
    let runner = Runner::start(
        &dir.path().join("state"),
        &[flags("e2e-env", &["--env-file", &env_file, "--env", "FROM_FLAG=flag"]), vec![repo.url().as_str()]].concat(),
    );
    let checks = runner.final_checks(&repo.url(), &first, 1);
    assert_eq!(checks[0]["status"], "success", "{:#}", checks[0]);
    let log = runner.run_log(checks[0]["run_id"].as_str().expect("a run id"));
    assert!(log.contains("show/show | file=file value flag=flag own=workflow"), "{log}");

    // A bad line is refused at start, naming the file and the line.
    std::fs::write(dir.path().join("bad.env"), "GOOD=1\nKNOTLESS_REF=x\n").expect("write");
    let bad = dir.path().join("bad.env").display().to_string();
    let mut refused = Runner::start(
        &dir.path().join("state2"),
        &[flags("e2e-env-bad", &["--env-file", &bad]), vec![repo.url().as_str()]].concat(),
    );
    assert!(!refused.wait().success());
    let stderr = eventually("the refusal", || Some(refused.stderr()).filter(|text| text.contains("line 2")));
    assert!(stderr.contains(&format!("--env-file {bad}, line 2: KNOTLESS_REF is set by the run")), "{stderr}");
}

#[test]
fn a_matrix_gives_one_check_per_combination_named_by_its_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let matrix = "matrix:\n  n: [1, 2]\nsteps:\n  - name: show\n    run: echo \"n=$n\"; [ \"$n\" = 1 ]\n";
    let (repo, first) = repo_with(dir.path(), &[("m", matrix)]);
    let runner =
        Runner::start(&dir.path().join("state"), &[flags("e2e-matrix", &[]), vec![repo.url().as_str()]].concat());
    let checks = runner.final_checks(&repo.url(), &first, 2);
    assert_eq!(by_workflow(&checks, "m (1)")["status"], "success");
    assert_eq!(by_workflow(&checks, "m (2)")["status"], "failure");
    let log = runner.run_log(by_workflow(&checks, "m (2)")["run_id"].as_str().expect("a run id"));
    assert!(log.contains("m (2)/show | n=2"), "{log}");
}

#[test]
fn a_workflow_waits_for_what_it_needs_and_is_skipped_when_that_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, first) = repo_with(
        dir.path(),
        &[
            ("build", "steps:\n  - name: go\n    run: exit 3\n"),
            ("test", "needs: [build]\nsteps:\n  - name: go\n    run: echo never\n"),
            ("lint", "steps:\n  - name: go\n    run: echo linted\n"),
        ],
    );
    let runner = Runner::start(
        &dir.path().join("state"),
        &[flags("e2e-needs", &["--concurrency", "3"]), vec![repo.url().as_str()]].concat(),
    );
    let checks = runner.final_checks(&repo.url(), &first, 3);
    assert_eq!(by_workflow(&checks, "build")["status"], "failure");
    assert_eq!(by_workflow(&checks, "lint")["status"], "success");
    let test = by_workflow(&checks, "test");
    assert_eq!(test["status"], "skipped", "{test:#}");
    assert_eq!(test["cause"], "it needs build, and build failed", "{test:#}");

    // Fixed: the dependent runs after its need passed.
    repo.write(".knotless/workflows/build.yml", "steps:\n  - name: go\n    run: echo built\n");
    let second = repo.commit("fix the build");
    runner.notify(&repo.url());
    let checks = runner.final_checks(&repo.url(), &second, 3);
    let (build, test) = (by_workflow(&checks, "build"), by_workflow(&checks, "test"));
    assert_eq!((build["status"].as_str(), test["status"].as_str()), (Some("success"), Some("success")));
    assert!(
        test["started_at"].as_u64() >= build["finished_at"].as_u64(),
        "test started before build finished: {test:#} {build:#}"
    );
}

#[test]
fn a_workflow_that_needs_one_this_event_does_not_run_is_skipped_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, first) = repo_with(
        dir.path(),
        &[
            ("review", "on: pull\nsteps:\n  - name: go\n    run: echo reviewed\n"),
            ("ship", "needs: [review]\nsteps:\n  - name: go\n    run: echo never\n"),
        ],
    );
    let runner =
        Runner::start(&dir.path().join("state"), &[flags("e2e-needs-absent", &[]), vec![repo.url().as_str()]].concat());
    let checks = runner.final_checks(&repo.url(), &first, 1);
    let ship = by_workflow(&checks, "ship");
    assert_eq!(ship["status"], "skipped", "{ship:#}");
    assert_eq!(ship["cause"], "it needs review, which does not run for this event on this runner", "{ship:#}");
    let log = runner.run_log(ship["run_id"].as_str().expect("a run id"));
    assert!(log.contains("skipped: it needs review"), "{log}");
}

#[test]
fn paths_filters_run_a_workflow_only_for_the_changes_they_match() {
    let dir = tempfile::tempdir().expect("tempdir");
    let docs = "on:\n  push:\n    paths: [\"docs/**\", \"*.md\", \"!docs/draft/**\"]\nsteps:\n  - name: go\n    run: echo docs\n";
    let (repo, first) = repo_with(dir.path(), &[("docs", docs), ("always", PASS)]);
    let runner =
        Runner::start(&dir.path().join("state"), &[flags("e2e-paths", &[]), vec![repo.url().as_str()]].concat());
    // The first sight of the branch: no head before it to compare with, so it runs.
    let checks = runner.final_checks(&repo.url(), &first, 2);
    assert_eq!(by_workflow(&checks, "docs")["status"], "success");

    let changes: [(&str, bool); 4] =
        [("src/lib.rs", false), ("docs/draft/idea.md", false), ("docs/guide/intro.txt", true), ("README.md", true)];
    for (path, runs) in changes {
        repo.write(path, "changed");
        let commit = repo.commit(&format!("change {path}"));
        runner.notify(&repo.url());
        let checks = runner.final_checks(&repo.url(), &commit, if runs { 2 } else { 1 });
        let names: Vec<&str> = checks.iter().filter_map(|check| check["workflow"].as_str()).collect();
        let expected: &[&str] = if runs { &["always", "docs"] } else { &["always"] };
        let mut names = names;
        names.sort();
        assert_eq!(names, expected, "a change of {path}");
    }
    // The two changes it did not run for, each said once.
    let said = runner.stderr();
    let refusal =
        "not run: on.push.paths is [docs/**, *.md, !docs/draft/**], and none of the 1 changed path(s) matches";
    assert_eq!(said.matches(refusal).count(), 2, "{said}");
}

#[test]
fn max_parallel_holds_a_matrix_to_so_many_runs_at_once_in_the_daemon() {
    let dir = tempfile::tempdir().expect("tempdir");
    let meet = tempfile::tempdir().expect("tempdir");
    let (repo, first) = repo_with(dir.path(), &[("m", crate::workflow_features::TWO_AT_A_TIME)]);
    let meet_env = format!("MEET={}", meet.path().display());
    let runner = Runner::start(
        &dir.path().join("state"),
        &[flags("e2e-max-parallel", &["--concurrency", "4", "--env", &meet_env]), vec![repo.url().as_str()]].concat(),
    );
    let checks = runner.final_checks(&repo.url(), &first, 4);
    for n in 1..=4 {
        assert_eq!(by_workflow(&checks, &format!("m ({n})"))["status"], "success", "{checks:#?}");
    }
    assert_eq!(crate::workflow_features::most_at_once(meet.path()), 2);
}

#[test]
fn trigger_runs_a_manual_workflow_with_its_inputs_and_refuses_what_cannot_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let release = "on:\n  manual:\n    inputs: { VERSION: \"0.0\", CHANNEL: beta }\nsteps:\n  - name: show\n    run: echo \"version=$VERSION channel=$CHANNEL event=$KNOTLESS_EVENT\"\n";
    let (repo, first) = repo_with(dir.path(), &[("release", release), ("ci", PASS)]);
    let runner =
        Runner::start(&dir.path().join("state"), &[flags("e2e-trigger", &[]), vec![repo.url().as_str()]].concat());
    // A push runs ci alone: release has only a manual trigger.
    let checks = runner.final_checks(&repo.url(), &first, 1);
    assert_eq!(by_workflow(&checks, "ci")["status"], "success");

    let url = repo.url();
    let triggered = runner.command(&["trigger", &url, "release", "--input", "VERSION=1.2"]);
    let said = String::from_utf8_lossy(&triggered.stdout).into_owned();
    assert!(triggered.status.success(), "{said}{}", String::from_utf8_lossy(&triggered.stderr));
    let run_id = said.trim().strip_prefix("queued release as run ").expect("a run id").to_string();
    let checks = runner.final_checks(&url, &first, 2);
    let release = by_workflow(&checks, "release");
    assert_eq!((release["status"].as_str(), release["run_id"].as_str()), (Some("success"), Some(run_id.as_str())));
    assert_eq!(release["event"], "manual", "{release:#}");
    let log = runner.run_log(&run_id);
    assert!(log.contains("release/show | version=1.2 channel=beta event=manual"), "{log}");

    for (args, why) in [
        (vec!["nope"], "has no workflow nope on main"),
        (vec!["ci"], "workflow ci has no manual trigger: add `manual` to its `on`"),
        (vec!["release", "--input", "COLOR=red"], "workflow release has no input COLOR (its inputs: CHANNEL, VERSION)"),
        (vec!["release", "--ref", "gone"], "has no branch gone"),
    ] {
        let refused = runner.command(&[&["trigger", url.as_str()][..], &args].concat());
        let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
        assert_eq!(refused.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
    assert_eq!(runner.checks(&url, Some(&first)).len(), 2, "a refused trigger queued nothing");
}

/// `rerun` runs a check's workflow again on its commit, with a new check that names the one it
/// repeats (and the old one names the new), `KNOTLESS_RERUN_OF` and the `--env` it was given;
/// a run whose need did not pass is refused until the need passes; what names no run, a run
/// of another repository, or a repository not watched is refused with exit 1.
#[test]
fn rerun_runs_a_check_again_on_its_commit_and_refuses_what_cannot_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = dir.path().join("fixed");
    let flaky = format!(
        "steps:\n  - name: try\n    run: echo \"rerun_of=${{KNOTLESS_RERUN_OF:-none}} debug=${{DEBUG:-off}}\"; test -f '{}'\n",
        gate.display()
    );
    let after = "needs: [flaky]\nsteps:\n  - name: go\n    run: echo after\n";
    let (repo, first) = repo_with(dir.path(), &[("flaky", &flaky), ("after", after)]);
    let url = repo.url();
    let runner = Runner::start(&dir.path().join("state"), &[flags("e2e-rerun", &[]), vec![url.as_str()]].concat());
    let checks = runner.final_checks(&url, &first, 2);
    let (failed, skipped) = (by_workflow(&checks, "flaky"), by_workflow(&checks, "after"));
    assert_eq!((failed["status"].as_str(), skipped["status"].as_str()), (Some("failure"), Some("skipped")));
    let failed_run = failed["run_id"].as_str().expect("a run id").to_string();
    let skipped_run = skipped["run_id"].as_str().expect("a run id").to_string();

    let refused = |args: &[&str], why: &str| {
        let output = runner.command(&[&["rerun"][..], args].concat());
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    };
    refused(&[&url, &skipped_run], &format!("after needs flaky, and run {failed_run} of flaky failed"));
    refused(&[&url, "nope-123"], "has no run nope-123");
    refused(&[&url, "../../state"], "is not a run id");
    refused(&[&dir.path().join("elsewhere").display().to_string(), &failed_run], "does not watch");
    let reserved = runner.command(&["rerun", &url, &failed_run, "--env", "KNOTLESS_X=1"]);
    assert_eq!(reserved.status.code(), Some(2), "a reserved name is refused by the command line");
    assert_eq!(runner.checks(&url, Some(&first)).len(), 2, "a refused rerun queued nothing");

    std::fs::write(&gate, "").expect("fix the flaky test");
    let again = runner.command(&["rerun", &url, &failed_run, "--env", "DEBUG=1"]);
    let said = String::from_utf8_lossy(&again.stdout).into_owned();
    assert!(again.status.success(), "{said}{}", String::from_utf8_lossy(&again.stderr));
    let new_run =
        said.trim().strip_prefix(&format!("run {failed_run} runs again as run ")).expect("the new run id").to_string();
    let checks = runner.final_checks(&url, &first, 3);
    let new = checks.iter().find(|check| check["run_id"] == new_run.as_str()).expect("the new check");
    assert_eq!(
        (new["status"].as_str(), new["reruns"].as_str()),
        (Some("success"), Some(failed_run.as_str())),
        "{new:#}"
    );
    assert_eq!((new["event"].as_str(), new["trusted"].as_bool()), (Some("push"), Some(true)));
    assert_eq!(new["commit"], first.as_str());
    let old = checks.iter().find(|check| check["run_id"] == failed_run.as_str()).expect("the old check");
    assert_eq!(old["run_again_as"], serde_json::json!([new_run]), "{old:#}");
    assert_eq!(old["status"], "failure", "the repeated check keeps its outcome");
    let log = runner.run_log(&new_run);
    assert!(log.contains(&format!("flaky/try | rerun_of={failed_run} debug=1")), "{log}");
    let listing = String::from_utf8_lossy(&runner.command(&["checks", &url, &first]).stdout).into_owned();
    assert!(listing.contains(&format!("    repeats run {failed_run}")), "{listing}");
    assert!(listing.contains(&format!("    run again as run {new_run}")), "{listing}");

    // Its need passed now: the skipped run runs.
    let after_again = runner.command(&["rerun", &url, &skipped_run]);
    assert!(after_again.status.success(), "{}", String::from_utf8_lossy(&after_again.stderr));
    let checks = runner.final_checks(&url, &first, 4);
    let reran = checks.iter().find(|check| check["reruns"] == skipped_run.as_str()).expect("the rerun of after");
    assert_eq!(reran["status"], "success", "{reran:#}");
}

#[test]
fn conditions_on_changed_paths_skip_a_workflow_its_dependents_and_steps_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let docs = "if: changed('docs/**')\nsteps:\n  - name: go\n    run: echo docs\n";
    let after = "needs: [docs]\nsteps:\n  - name: go\n    run: echo after\n";
    let ci = "steps:\n  - name: src\n    if: changed('src/**') && event == 'push' && branch == 'main'\n    run: echo src\n  - name: always\n    run: echo always\n";
    let (repo, first) = repo_with(dir.path(), &[("docs", docs), ("after", after), ("ci", ci)]);
    let runner =
        Runner::start(&dir.path().join("state"), &[flags("e2e-conditions", &[]), vec![repo.url().as_str()]].concat());
    // The first sight of the branch: what it changed is unknown, so changed() is true.
    let checks = runner.final_checks(&repo.url(), &first, 3);
    for name in ["docs", "after", "ci"] {
        assert_eq!(by_workflow(&checks, name)["status"], "success", "{name}: {checks:#?}");
    }

    repo.write("src/lib.rs", "changed");
    let commit = repo.commit("change src");
    runner.notify(&repo.url());
    let checks = runner.final_checks(&repo.url(), &commit, 3);
    let docs = by_workflow(&checks, "docs");
    assert_eq!(docs["status"], "skipped", "{checks:#?}");
    assert_eq!(docs["cause"], "if: changed('docs/**') is false", "{checks:#?}");
    let after = by_workflow(&checks, "after");
    assert_eq!(after["status"], "skipped", "{checks:#?}");
    assert_eq!(after["cause"], "it needs docs, and docs was skipped", "{checks:#?}");
    let ci = by_workflow(&checks, "ci");
    assert_eq!(ci["status"], "success", "{checks:#?}");
    assert_eq!(ci["steps"][0]["status"], "success", "{checks:#?}");

    repo.write("docs/guide.md", "changed");
    let commit = repo.commit("change docs");
    runner.notify(&repo.url());
    let checks = runner.final_checks(&repo.url(), &commit, 3);
    assert_eq!(by_workflow(&checks, "docs")["status"], "success", "{checks:#?}");
    assert_eq!(by_workflow(&checks, "after")["status"], "success", "{checks:#?}");
    let ci = by_workflow(&checks, "ci");
    assert_eq!(ci["status"], "success", "{checks:#?}");
    assert_eq!(
        (ci["steps"][0]["status"].as_str(), ci["steps"][0]["reason"].as_str()),
        (Some("skipped"), Some("if: changed('src/**') && event == 'push' && branch == 'main' is false")),
        "{checks:#?}"
    );
    assert_eq!(ci["steps"][1]["status"], "success", "{checks:#?}");
    let shown = runner.command(&["checks", &repo.url()]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(
        shown.contains("step src: skipped (if: changed('src/**') && event == 'push' && branch == 'main' is false)"),
        "{shown}"
    );
}
