//! Pull runs: the head merged with its base, no secrets, the apart cache base, nothing kept,
//! and an error check when the merge conflicts.

use std::os::unix::fs::PermissionsExt as _;

use knotless_tests::{Runner, by_workflow};

use crate::{flags, repo_with};

const CI: &str = r#"on: [push, pull]
cache: [c]
steps:
  - name: look
    run: |
      echo "event=$KNOTLESS_EVENT"
      echo "cache=[$(ls c 2>/dev/null | tr '\n' ' ')]"
      if [ "$KNOTLESS_EVENT" = pull ]; then test -f head.txt && test -f later-base.txt && echo merged; fi
      mkdir -p c && touch "c/from-$KNOTLESS_EVENT"
      echo "token=[$TOKEN]"
    secrets: [TOKEN]
"#;

#[test]
fn a_pull_runs_merged_without_secrets_or_the_trusted_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, first) = repo_with(dir.path(), &[("ci", CI)]);
    let secrets = dir.path().join("operator-secrets");
    std::fs::write(&secrets, "TOKEN=operator-token-value\n").expect("write");
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let url = repo.url();
    let secrets_flag = secrets.to_string_lossy().into_owned();
    let runner = Runner::start(
        &dir.path().join("state"),
        &[flags("e2e-pull", &["--pulls", "--force-shell", "--secrets-file", &secrets_flag]), vec![url.as_str()]]
            .concat(),
    );
    let push = runner.final_checks(&url, &first, 1);
    assert_eq!(push[0]["status"], "success", "{push:#?}");
    assert!(runner.run_log(push[0]["run_id"].as_str().expect("id")).contains("token=[***]"));

    repo.git(&["checkout", "-q", "-b", "feature"]);
    repo.write("head.txt", "head");
    let head = repo.commit("head");
    repo.git(&["checkout", "-q", "main"]);
    repo.write("later-base.txt", "base");
    let base = repo.commit("later base");
    repo.git(&["update-ref", "refs/pulls/1/head", &head]);
    // The base move is a push run too: wait for it so the pull is the only run left.
    runner.notify(&url);
    runner.final_checks(&url, &base, 1);
    let pull = runner.final_checks(&url, "pull/1", 1);
    let check = &pull[0];
    assert_eq!(check["status"], "success", "{check:#}");
    assert_eq!(check["trusted"], false);
    assert_eq!(check["head"], head.as_str());
    assert_ne!(check["commit"], head.as_str(), "a pull runs a merge, not its head");
    let log = runner.run_log(check["run_id"].as_str().expect("id"));
    assert!(log.contains("/look | merged"), "{log}");
    assert!(log.contains("secret TOKEN is not granted"), "{log}");
    assert!(log.contains("token=[]") && !log.contains("operator-token-value"), "{log}");
    assert!(log.contains("cache c: cold") && log.contains("cache=[]"), "{log}");
    assert!(check["caches"][0]["outcome"].as_str().is_some_and(|o| o.contains("untrusted")), "{check:#}");

    // The trusted cache never saw the pull.
    let after = repo.commit("after the pull");
    runner.notify(&url);
    let push = runner.final_checks(&url, &after, 1);
    let log = runner.run_log(push[0]["run_id"].as_str().expect("id"));
    assert!(log.contains("cache=[from-push ]"), "{log}");

    // A pull that conflicts with its base gives an error check that says so.
    repo.git(&["checkout", "-q", "-b", "clash", &first]);
    repo.write("later-base.txt", "other");
    let clash = repo.commit("clash");
    repo.git(&["checkout", "-q", "main"]);
    repo.git(&["update-ref", "refs/pulls/2/head", &clash]);
    runner.notify(&url);
    let conflict = runner.final_checks(&url, "pull/2", 1);
    assert_eq!(conflict[0]["status"], "error");
    let cause = conflict[0]["cause"].as_str().expect("a cause");
    assert!(cause.contains("conflict") && cause.contains("later-base.txt"), "{cause}");
    let _ = by_workflow(&conflict, "ci");
}
