//! Names are data, never paths: workflow files whose stems would name folders (`...yml` has the
//! stem `..`) are refused when read, before any step runs, and nothing beside the outputs folder
//! is touched.

use knotless_tests::{Repo, knotless_run, ran};

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
