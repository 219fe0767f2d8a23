//! Caches: parallel push runs from one base each see it in a layer of their own, only the
//! passing one promotes, and the next run starts warm from it.

use knotless_tests::{Runner, by_workflow};

use crate::{flags, repo_with};

/// Branch runs wait at a barrier until both are running, so they overlap for certain.
fn workflow(barrier: &str) -> String {
    format!(
        r#"cache: [c]
steps:
  - name: use
    run: |
      echo "saw=[$(ls c 2>/dev/null | tr '\n' ' ')]"
      mark=$(cat mark)
      mkdir -p c && touch "c/$mark"
      if [ "$KNOTLESS_REF" != refs/heads/main ]; then
        touch "{barrier}/$mark"
        i=0
        while [ "$(ls {barrier} | wc -l)" -lt 2 ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
      fi
      test ! -f fail
"#
    )
}

#[test]
fn parallel_runs_share_a_base_and_only_the_passing_one_promotes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let barrier = dir.path().join("barrier");
    std::fs::create_dir_all(&barrier).expect("barrier");
    let text = workflow(&barrier.to_string_lossy());
    let (repo, _) = repo_with(dir.path(), &[("cache", &text)]);
    repo.write("mark", "base");
    let first = repo.commit("base");
    let url = repo.url();
    let runner = Runner::start(
        &dir.path().join("state"),
        &[flags("e2e-caches", &["--concurrency", "2"]), vec![url.as_str()]].concat(),
    );
    let checks = runner.final_checks(&url, &first, 1);
    assert_eq!(checks[0]["caches"][0]["warm"], false);
    assert!(checks[0]["caches"][0]["outcome"].as_str().is_some_and(|o| o.starts_with("promoted")));

    repo.git(&["checkout", "-q", "-b", "good"]);
    repo.write("mark", "good");
    let good = repo.commit("good");
    repo.git(&["checkout", "-q", "-b", "bad", &first]);
    repo.write("mark", "bad").write("fail", "");
    let bad = repo.commit("bad");
    repo.git(&["checkout", "-q", "main"]);
    runner.notify(&url);
    let good_check = runner.final_checks(&url, &good, 1).remove(0);
    let bad_check = runner.final_checks(&url, &bad, 1).remove(0);
    assert_eq!(good_check["status"], "success");
    assert_eq!(bad_check["status"], "failure");
    for check in [&good_check, &bad_check] {
        assert_eq!(check["caches"][0]["warm"], true);
        let log = runner.run_log(check["run_id"].as_str().expect("id"));
        assert!(log.contains("saw=[base ]"), "{log}");
    }
    assert!(good_check["caches"][0]["outcome"].as_str().is_some_and(|o| o.starts_with("promoted")));
    assert!(bad_check["caches"][0]["outcome"].as_str().is_some_and(|o| o.starts_with("dropped")));

    repo.write("mark", "after");
    let after = repo.commit("after");
    runner.notify(&url);
    let checks = runner.final_checks(&url, &after, 1);
    let check = by_workflow(&checks, "cache");
    let log = runner.run_log(check["run_id"].as_str().expect("id"));
    assert!(log.contains("cache c: warm") && log.contains("saw=[base good ]"), "{log}");
}
