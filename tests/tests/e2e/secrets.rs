//! Secrets: values sealed to the runner's key on the default branch, masked in the log, and the
//! operator file's value winning over a sealed one.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::process::{Command, Stdio};

use knotless_tests::{Repo, Runner, bin};

use crate::flags;

fn seal(state: &std::path::Path, name: &str, value: &str) -> String {
    let mut child = Command::new(bin("knotless-run"))
        .args(["secrets", "seal", name, "--state"])
        .arg(state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn seal");
    child.stdin.take().expect("stdin").write_all(value.as_bytes()).expect("write the value");
    let output = child.wait_with_output().expect("seal");
    assert!(output.status.success());
    String::from_utf8(output.stdout).expect("text")
}

#[test]
fn a_sealed_secret_is_seen_and_masked_and_the_operator_value_wins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let public = Command::new(bin("knotless-run")).args(["secrets", "public-key", "--state"]).arg(&state).output();
    let public = String::from_utf8_lossy(&public.expect("public-key").stdout).into_owned();
    assert!(public.starts_with("age1"), "{public}");
    let sealed =
        format!("{}{}", seal(&state, "ALPHA", "sealed-alpha-value"), seal(&state, "BETA", "sealed-beta-value"));
    let repo = Repo::init(&dir.path().join("repo"));
    repo.write(".knotless/secrets.yml", &sealed);
    repo.write(
        ".knotless/workflows/use.yml",
        "steps:\n  - name: use\n    run: |\n      echo \"alpha=$ALPHA beta=$BETA\"\n      test \"$ALPHA\" = sealed-alpha-value\n      test \"$BETA\" = operator-beta-value\n    secrets: [ALPHA, BETA]\n",
    );
    let commit = repo.commit("sealed");
    let operator = dir.path().join("operator");
    std::fs::write(&operator, "BETA=operator-beta-value\n").expect("write");
    std::fs::set_permissions(&operator, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let operator = operator.to_string_lossy().into_owned();
    let url = repo.url();
    let runner =
        Runner::start(&state, &[flags("e2e-secrets", &["--secrets-file", &operator]), vec![url.as_str()]].concat());
    let checks = runner.final_checks(&url, &commit, 1);
    assert_eq!(checks[0]["status"], "success", "{:#}", checks[0]);
    let log = runner.run_log(checks[0]["run_id"].as_str().expect("id"));
    assert!(log.contains("alpha=*** beta=***"), "{log}");
    let record = serde_json::to_string(&checks[0]).expect("json");
    for value in ["sealed-alpha-value", "sealed-beta-value", "operator-beta-value"] {
        assert!(!log.contains(value) && !record.contains(value), "{value} leaked");
    }
}

#[test]
fn a_secret_in_an_output_file_name_or_a_step_name_is_masked_in_the_record_and_in_checks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let value = "canary-name-8d1f";
    let workflow = format!(
        "steps:\n  - name: use {value}\n    secrets: [TOKEN]\n    run: |\n      touch \"$KNOTLESS_RUN_OUTPUTS/report-$TOKEN.txt\"\n      exit 3\n"
    );
    let (repo, commit) = crate::repo_with(dir.path(), &[("leaky", workflow.as_str())]);
    let operator = dir.path().join("operator");
    std::fs::write(&operator, format!("TOKEN={value}\n")).expect("write");
    std::fs::set_permissions(&operator, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let operator = operator.to_string_lossy().into_owned();
    let url = repo.url();
    let state = dir.path().join("state");
    let runner = Runner::start(
        &state,
        &[flags("e2e-secret-names", &["--secrets-file", &operator]), vec![url.as_str()]].concat(),
    );
    let checks = runner.final_checks(&url, &commit, 1);
    assert_eq!(checks[0]["status"], "failure", "{:#}", checks[0]);
    assert_eq!(checks[0]["outputs"][0]["path"], "report-***.txt", "{:#}", checks[0]);
    let printed = String::from_utf8_lossy(&runner.command(&["checks", &url]).stdout).into_owned();
    assert!(printed.contains("output report-***.txt") && printed.contains("step use ***"), "{printed}");
    let mut records = String::new();
    for entry in std::fs::read_dir(state.join("checks")).expect("checks").flatten() {
        for file in std::fs::read_dir(entry.path()).expect("a repository's checks").flatten() {
            if file.path().extension().is_some_and(|extension| extension == "json") {
                records.push_str(&std::fs::read_to_string(file.path()).expect("a record"));
            }
        }
    }
    assert!(records.contains("report-***.txt"), "{records}");
    for (what, text) in [("checks", printed.as_str()), ("the record", records.as_str())] {
        assert!(!text.contains(value), "{what} holds the secret:\n{text}");
    }
}

/// `run` of `repo` through the fake executor, with `secrets` given by `--secret` from its
/// environment.
fn run_with_secrets(repo: &Repo, work: &std::path::Path, secrets: &[(&str, &str)]) -> knotless_tests::Ran {
    let fake = bin("knotless-executor-fake").display().to_string();
    let (path, work_dir) = (repo.path().display().to_string(), format!("work-dir={}", work.display()));
    let mut args = vec!["run", path.as_str(), "--executor-plugin", fake.as_str(), "--executor-option", &work_dir];
    for (name, _) in secrets {
        args.extend(["--secret", name]);
    }
    let mut command = knotless_tests::knotless_run(&args);
    command.envs(secrets.iter().copied());
    knotless_tests::ran(command)
}

#[test]
fn each_line_of_a_multi_line_secret_is_masked_where_a_step_prints_it_alone() {
    let repo = Repo::new();
    repo.workflow(
        "key",
        "steps:\n  - name: print\n    secrets: [KEY]\n    run: |\n      printf '%s\\n' \"$KEY\" | sed -n 2p\n      printf 'short: %s\\n' \"$(printf '%s\\n' \"$KEY\" | sed -n 3p)\"\n",
    );
    let work = tempfile::tempdir().expect("tempdir");
    let run = run_with_secrets(&repo, work.path(), &[("KEY", "first-line-4f1a\r\nsecond-line-9c2e\r\nab")]);
    assert_eq!(run.code, Some(0), "{}", run.both());
    assert!(run.stdout.contains("key/print | ***"), "{}", run.both());
    assert!(!run.stdout.contains("second-line-9c2e"), "a line of the secret leaked:\n{}", run.both());
    // A line shorter than four characters is not masked on its own.
    assert!(run.stdout.contains("key/print | short: ab"), "{}", run.both());
}

#[test]
fn a_secret_too_short_to_mask_is_warned_about_by_name_on_stderr_and_in_the_log() {
    let repo = Repo::new();
    repo.workflow("pin", "steps:\n  - name: use\n    secrets: [PIN]\n    run: test \"$PIN\" = q7\n");
    let work = tempfile::tempdir().expect("tempdir");
    let run = run_with_secrets(&repo, work.path(), &[("PIN", "q7"), ("TOKEN", "long-enough-8e0b")]);
    assert_eq!(run.code, Some(0), "{}", run.both());
    let warning = "warning: secret PIN is shorter than 4 characters: masking it masks every occurrence of those \
                   characters in the log";
    assert_eq!(run.stderr.matches(warning).count(), 1, "{}", run.both());
    assert!(run.stdout.contains(&format!("pin ==> {warning}")), "{}", run.both());
    assert!(!run.both().contains("secret TOKEN is shorter"), "{}", run.both());
}

#[test]
fn a_secret_too_large_for_a_step_environment_fails_the_run_before_its_environment_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workflow = "steps:\n  - name: deploy\n    secrets: [BIG]\n    run: echo deployed\n";
    let (repo, commit) = crate::repo_with(dir.path(), &[("big", workflow)]);
    let operator = dir.path().join("operator");
    // `BIG=` and the value, 131072 bytes: one more than an environment string may take. The
    // value is a token's letters, not one byte repeated.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let value: String = (0..131_068)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            char::from(b'a' + (state >> 59) as u8 % 26)
        })
        .collect();
    std::fs::write(&operator, format!("BIG={value}\n")).expect("write");
    std::fs::set_permissions(&operator, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let (operator, url) = (operator.to_string_lossy().into_owned(), repo.url());
    let fake = bin("knotless-executor-fake").display().to_string();
    let work_dir = format!("work-dir={}", dir.path().join("work").display());
    let runner = Runner::start(
        &dir.path().join("state"),
        &[
            "--executor-plugin",
            &fake,
            "--executor-option",
            &work_dir,
            "--poll",
            "3600",
            "--disk-floor",
            "0",
            "--runner-id",
            "e2e-big-secret",
            "--secrets-file",
            &operator,
            &url,
        ],
    );
    let checks = runner.final_checks(&url, &commit, 1);
    assert_eq!(checks[0]["status"], "error", "{:#}", checks[0]);
    let cause = checks[0]["cause"].as_str().expect("a cause");
    assert!(cause.starts_with("secret BIG is 131068 bytes: step deploy could not start"), "{cause}");
    assert!(cause.contains("at most 131071 bytes"), "{cause}");
    let log = runner.run_log(checks[0]["run_id"].as_str().expect("id"));
    assert!(!log.contains("environment: ") && !log.contains("deployed"), "an environment started:\n{log}");
}
