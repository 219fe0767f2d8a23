//! Names are data, never paths: workflow files whose stems would name folders (`...yml` has the
//! stem `..`) are refused when read, before any step runs, and nothing beside the outputs folder
//! is touched; and never lines: a name's control characters are escaped wherever a person reads
//! it (`run`'s notes and summary, `logs`, `checks`).

use knotless_tests::{Repo, Runner, knotless_run, ran};

#[test]
fn a_workflow_named_dot_dot_is_refused_and_deletes_nothing() {
    for file in ["...yml", "..yml"] {
        let repo = Repo::new();
        repo.write(&format!(".knotless/workflows/{file}"), "steps:\n  - name: touch\n    run: touch ran-a-step\n");
        let place = tempfile::tempdir().expect("tempdir");
        let keep = place.path().join("precious.txt");
        std::fs::write(&keep, "user data").expect("write");
        let outputs = place.path().join("outs");
        let work = tempfile::tempdir().expect("tempdir");
        let run = ran(knotless_run(&[
            "run",
            &repo.path().display().to_string(),
            "--executor",
            "shell",
            "--executor-option",
            &format!("work-dir={}", work.path().display()),
            "--outputs",
            &outputs.display().to_string(),
        ]));
        assert_ne!(run.code, Some(0), "{file}: {}", run.both());
        assert!(run.both().contains(&format!(".knotless/workflows/{file}")), "{file}: {}", run.both());
        assert!(run.both().contains("`.` or `..`"), "{file}: {}", run.both());
        assert_eq!(std::fs::read_to_string(&keep).ok().as_deref(), Some("user data"), "{file}: {}", run.both());
        assert!(!repo.path().join("ran-a-step").exists(), "{file}: a step ran\n{}", run.both());
    }
}

#[test]
fn names_and_output_with_newlines_and_escapes_are_printed_escaped() {
    let repo = Repo::new();
    repo.workflow(
        "ci",
        "steps:\n  - name: \"evil\\nfake ==> success\\e[31m\"\n    run: printf 'out\\033[2Jput\\tx\\n'; exit 2\n",
    );
    let work = tempfile::tempdir().expect("tempdir");
    let run = ran(knotless_run(&[
        "run",
        &repo.path().display().to_string(),
        "--executor",
        "shell",
        "--executor-option",
        &format!("work-dir={}", work.path().display()),
    ]));
    let both = run.both();
    assert_eq!(run.code, Some(1), "{both}");
    assert!(!run.stdout.contains('\u{1b}'), "a raw escape reached the terminal:\n{both}");
    assert!(!run.stdout.lines().any(|line| line.starts_with("fake ==>")), "a forged runner line:\n{both}");
    assert!(run.stdout.contains("ci/evil\\nfake ==> success\\x1b[31m | out\\x1b[2Jput\tx"), "{both}");
    let row = run.stdout.lines().skip_while(|line| !line.starts_with("workflow  status")).nth(1).unwrap_or_default();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells.first(), Some(&"ci"), "{both}");
    assert_eq!(cells.get(1), Some(&"failure"), "{both}");
    assert!(row.contains("evil\\nfake ==> success\\x1b[31m") && row.ends_with('s'), "the summary row broke:\n{both}");
}

#[test]
fn special_files_and_escaping_links_in_outputs_are_left_out_with_a_note() {
    let repo = Repo::new();
    repo.workflow(
        "outs",
        "steps:\n  - name: write\n    run: |\n      cd \"$KNOTLESS_RUN_OUTPUTS\"\n      echo kept > report.txt\n      mkfifo pipe\n      ln -s /etc/passwd escape\n      ln -s report.txt inside\n",
    );
    let work = tempfile::tempdir().expect("tempdir");
    let place = tempfile::tempdir().expect("tempdir");
    let outputs = place.path().join("outs");
    let run = ran(knotless_run(&[
        "run",
        &repo.path().display().to_string(),
        "--executor",
        "shell",
        "--executor-option",
        &format!("work-dir={}", work.path().display()),
        "--outputs",
        &outputs.display().to_string(),
    ]));
    let both = run.both();
    assert_eq!(run.code, Some(0), "{both}");
    assert!(both.contains("==> left pipe out of the download of ") && both.contains("/outputs: a FIFO"), "{both}");
    assert!(both.contains("left escape out of the download") && both.contains("leaves the folder"), "{both}");
    let folder = outputs.join("outs");
    assert_eq!(std::fs::read_to_string(folder.join("report.txt")).ok().as_deref(), Some("kept\n"), "{both}");
    assert!(folder.join("inside").symlink_metadata().is_ok(), "a link inside the folder is kept\n{both}");
    assert!(folder.join("pipe").symlink_metadata().is_err() && folder.join("escape").symlink_metadata().is_err());
}

#[test]
fn every_name_the_runner_accepts_runs_under_docker_too() {
    let repo = Repo::new();
    for name in ["-dash", "ünïcode", "ü"] {
        repo.workflow(name, "steps:\n  - name: hello\n    run: echo hi\n");
    }
    let run = ran(knotless_run(&[
        "run",
        &repo.path().display().to_string(),
        "--executor",
        "docker",
        "--image",
        "knotless-test/busybox:1",
    ]));
    let both = run.both();
    assert_eq!(run.code, Some(0), "{both}");
    for name in ["-dash", "ünïcode", "ü"] {
        assert!(run.stdout.contains(&format!("{name}: success")), "{name}\n{both}");
    }
}

/// Runs the workflow `outs` of `repo` with `executor` (`shell`, or `docker` on the test
/// image), its outputs kept under `outputs`.
fn run_outputs(repo: &Repo, executor: &str, outputs: &std::path::Path) -> knotless_tests::Ran {
    let work = tempfile::tempdir().expect("tempdir");
    let repo = repo.path().display().to_string();
    let outputs = outputs.display().to_string();
    let work_dir = format!("work-dir={}", work.path().display());
    let mut args = vec!["run", &repo, "--executor", executor, "--outputs", &outputs];
    if executor == "docker" {
        args.extend(["--image", "knotless-test/busybox:1"]);
    } else {
        args.extend(["--executor-option", &work_dir]);
    }
    ran(knotless_run(&args))
}

/// Outputs past the runner's bound of 256 MiB fail the run naming the bound and the entry, and
/// leave no half-unpacked folder; a sparse output under the bound arrives sparse.
fn outputs_over_the_bound_and_sparse(executor: &str) {
    use std::os::unix::fs::MetadataExt as _;
    let repo = Repo::new();
    let place = tempfile::tempdir().expect("tempdir");
    let outputs = place.path().join("outs");
    repo.workflow(
        "outs",
        "steps:\n  - name: write\n    run: |\n      cd \"$KNOTLESS_RUN_OUTPUTS\"\n      echo small > a.txt\n      truncate -s 300M huge\n",
    );
    let run = run_outputs(&repo, executor, &outputs);
    let both = run.both();
    assert_ne!(run.code, Some(0), "{both}");
    assert!(both.contains("over its bound of 268435456 bytes at entry") && both.contains("huge"), "{both}");
    assert!(!outputs.join("outs").exists(), "a half-unpacked outputs folder is left\n{both}");
    let leftovers: Vec<_> =
        std::fs::read_dir(&outputs).into_iter().flatten().flatten().map(|entry| entry.path()).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}\n{both}");

    repo.workflow(
        "outs",
        "steps:\n  - name: write\n    run: |\n      cd \"$KNOTLESS_RUN_OUTPUTS\"\n      truncate -s 64M sparse\n      echo end >> sparse\n",
    );
    let run = run_outputs(&repo, executor, &outputs);
    let both = run.both();
    assert_eq!(run.code, Some(0), "{both}");
    let metadata = std::fs::metadata(outputs.join("outs/sparse")).expect("the sparse output");
    assert_eq!(metadata.len(), (64 << 20) + 4, "{both}");
    assert!(metadata.blocks() * 512 < 1 << 20, "{} blocks for 64 MiB of zeros\n{both}", metadata.blocks());
}

#[test]
fn shell_outputs_over_the_bound_name_it_and_sparse_ones_stay_sparse() {
    outputs_over_the_bound_and_sparse("shell");
}

#[test]
fn docker_outputs_over_the_bound_name_it_and_sparse_ones_stay_sparse() {
    outputs_over_the_bound_and_sparse("docker");
}

#[test]
fn a_newline_in_a_step_name_forges_no_runner_line_in_run_logs_or_checks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workflow = "steps:\n  - name: \"evil\\nfake ==> success\\e[31m\"\n    run: echo out\n";
    let (repo, commit) = crate::repo_with(dir.path(), &[("inject", workflow)]);
    let forged = |text: &str| {
        text.lines().any(|line| line.starts_with("fake ==>") || line.starts_with("inject ==> fake"))
            || text.contains('\u{1b}')
    };
    let escaped = "evil\\nfake ==> success\\x1b[31m";
    let work = tempfile::tempdir().expect("tempdir");
    let run = ran(knotless_run(&[
        "run",
        &repo.path().display().to_string(),
        "--executor",
        "shell",
        "--executor-option",
        &format!("work-dir={}", work.path().display()),
    ]));
    let both = run.both();
    assert_eq!(run.code, Some(0), "{both}");
    assert!(!forged(&run.stdout), "a forged runner line:\n{both}");
    assert!(run.stdout.contains(&format!("inject ==> step {escaped} (1/1)\n")), "{both}");
    assert!(run.stdout.contains(&format!("inject/{escaped} | out\n")), "{both}");
    let summary = run.stdout.lines().skip_while(|line| !line.starts_with("workflow  status"));
    let row = summary.skip(1).find(|line| line.starts_with("inject ")).unwrap_or_default();
    assert!(row.contains(" success ") && row.contains(escaped), "the summary row: {row:?}\n{both}");

    let url = repo.url();
    let runner =
        Runner::start(&dir.path().join("state"), &[crate::flags("e2e-inject", &[]), vec![url.as_str()]].concat());
    let checks = runner.final_checks(&url, &commit, 1);
    assert_eq!(checks[0]["status"], "success");
    assert_eq!(checks[0]["steps"][0]["name"], "evil\nfake ==> success\u{1b}[31m", "the record keeps the name");
    let run_id = checks[0]["run_id"].as_str().expect("a run id");
    let logs = runner.run_log(run_id);
    assert!(!forged(&logs), "a forged runner line in logs:\n{logs}");
    assert!(logs.contains(&format!("inject ==> step {escaped} (1/1)\n")), "{logs}");
    assert!(logs.contains(&format!("inject/{escaped} | out\n")), "{logs}");
    let shown = runner.command(&["checks", &url]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(!shown.lines().any(|line| line.starts_with("fake")) && !shown.contains('\u{1b}'), "{shown}");
    assert!(shown.contains(escaped), "{shown}");
}
