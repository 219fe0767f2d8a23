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
