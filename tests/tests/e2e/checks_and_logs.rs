//! What `checks` and `logs` print of the daemon's runs: logs read as `run` prints them, even
//! with hostile step names; the outputs folder; a bare repository found by its name with or
//! without `.git`.

use knotless_tests::{Repo, Runner, by_workflow};

use crate::{flags, repo_with};

/// `knotless-run ARGS --state STATE` of `runner`: its exit code and stdout, stderr.
fn command(runner: &Runner, args: &[&str]) -> (Option<i32>, String, String) {
    let output = runner.command(args);
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

#[test]
fn logs_prints_lines_as_run_does_and_a_hostile_step_name_forges_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workflow = "steps:\n  - name: build\n    run: echo out; echo err >&2; printf 'tab\\there\\033[2J\\n'\n  - name: \"evil\\nwf/deploy | all good] x\\e[31m\"\n    run: echo hidden\n";
    let (repo, commit) = repo_with(dir.path(), &[("wf", workflow)]);
    let runner =
        Runner::start(&dir.path().join("state"), &[flags("e2e-logs-form", &[]), vec![repo.url().as_str()]].concat());
    let checks = runner.final_checks(&repo.url(), &commit, 1);
    assert_eq!(checks[0]["status"], "success", "{:#}", checks[0]);
    let run_id = checks[0]["run_id"].as_str().expect("a run id");
    let (code, log, stderr) = command(&runner, &["logs", run_id]);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = log.lines().collect();
    for line in [
        "wf ==> step build (1/2)",
        "wf/build | out",
        "wf/build | err",
        "wf/build | tab\there\\x1b[2J",
        "wf/evil\\nwf/deploy | all good] x\\x1b[31m | hidden",
        "wf ==> success",
    ] {
        assert!(lines.contains(&line), "no line {line:?} in\n{log}");
    }
    assert!(!lines.iter().any(|line| line.starts_with("wf/deploy") || line.starts_with('[')), "{log}");
    assert!(!log.contains('\u{1b}'), "a raw escape reached the terminal\n{log}");
    // The stored log keeps its own form and the bytes.
    let stored = std::fs::read_to_string(
        runner
            .state
            .join("checks")
            .join(checks[0]["repository_key"].as_str().expect("a key"))
            .join(format!("{run_id}.log")),
    )
    .expect("the stored log");
    // (stdout and stderr are two streams: their lines may come in either order)
    assert!(stored.contains("\n[build] out\n") && stored.contains("\n[build!] err\n"), "{stored}");
    let (code, _, stderr) = command(&runner, &["logs", "no-such\nrun"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("no run no-such\\nrun under "), "{stderr}");
}

#[test]
fn checks_prints_the_outputs_folder_of_a_run_that_has_outputs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outputs = "steps:\n  - name: write\n    run: echo kept > \"$KNOTLESS_RUN_OUTPUTS/report.txt\"\n";
    let none = "steps:\n  - name: quiet\n    run: 'true'\n";
    let (repo, commit) = repo_with(dir.path(), &[("outs", outputs), ("none", none)]);
    let runner =
        Runner::start(&dir.path().join("state"), &[flags("e2e-outputs-dir", &[]), vec![repo.url().as_str()]].concat());
    let checks = runner.final_checks(&repo.url(), &commit, 2);
    let with = by_workflow(&checks, "outs");
    assert_eq!(with["status"], "success", "{with:#}");
    let folder = with["outputs_dir"].as_str().expect("an outputs folder");
    assert_eq!(std::fs::read_to_string(format!("{folder}/report.txt")).ok().as_deref(), Some("kept\n"));
    let (code, listing, stderr) = command(&runner, &["checks", &repo.url(), &commit]);
    assert_eq!(code, Some(0), "{stderr}");
    let expected = format!("    outputs: {folder}\n    output report.txt: 5 bytes\n");
    assert!(listing.contains(&expected), "no {expected:?} in\n{listing}");
    assert_eq!(listing.matches("    outputs: ").count(), 1, "a run with no outputs shows no folder\n{listing}");
}

#[test]
fn a_bare_repository_is_found_by_its_name_or_path_with_or_without_dot_git() {
    let dir = tempfile::tempdir().expect("tempdir");
    let work = Repo::init(&dir.path().join("work"));
    work.workflow("ci", "steps:\n  - name: s\n    run: 'true'\n");
    let commit = work.commit("workflows");
    let bare = dir.path().join("origin.git");
    let cloned = std::process::Command::new("git")
        .args(["clone", "-q", "--bare"])
        .arg(work.path())
        .arg(&bare)
        .status()
        .expect("git clone --bare");
    assert!(cloned.success());
    let bare = bare.display().to_string();
    let runner = Runner::start(&dir.path().join("state"), &[flags("e2e-bare-name", &[]), vec![bare.as_str()]].concat());
    let checks = runner.final_checks(&bare, &commit, 1);
    assert_eq!(checks[0]["status"], "success", "{:#}", checks[0]);
    let (code, expected, stderr) = command(&runner, &["checks", &bare]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(expected.contains("  ci  main "), "{expected}");
    let without = bare.strip_suffix(".git").expect("a .git path").to_string();
    let key = checks[0]["repository_key"].as_str().expect("a key").to_string();
    for given in ["origin", "origin.git", &without, &format!("{bare}/"), &format!("file://{without}"), &key] {
        let (code, listing, stderr) = command(&runner, &["checks", given]);
        assert_eq!((code, listing.as_str()), (Some(0), expected.as_str()), "checks {given}\n{stderr}");
    }
    let (code, _, stderr) = command(&runner, &["checks", "origin\n\u{1b}[2J"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no checks of repository origin\\n\\x1b[2J (known: origin-"), "{stderr}");
}
