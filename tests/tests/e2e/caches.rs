//! Caches: parallel push runs from one base each see it in a layer of their own, only the
//! passing one promotes, and the next run starts warm from it; a save that fails never changes
//! the base.

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

/// How many failing saves the warm base must outlast.
const FAILING_SAVES: usize = 100;

/// Every save of this many rounds fails halfway through its download (the fake executor's
/// `break-download`: an error answer once half the stream is written, the rest sent at the
/// session's stop; the layer is 2 MB, so that half of it fills the socket and the runner is
/// unpacking before the answer comes: an older build's unpacking, left running, took the rest
/// and made the layer's folder again after the save had removed it). Each run passes, its layer is never promoted, the warm base stays byte for byte,
/// and nothing of the layer outlives its run. Through the real engine and cache store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_failing_cache_saves_never_change_the_warm_base() {
    use knotless_run::cache::CacheStore;
    use knotless_run::checkout::Checkout;
    use knotless_run::engine::{self, RunPlan};
    use knotless_run::host::{ExecutorHost, HostConfig, ProcessSpec};
    use knotless_run::report::{NoSink, RunStatus};

    let dir = tempfile::tempdir().expect("tempdir");
    let workflow = "cache: [c]\nsteps:\n  - name: fill\n    run: mkdir -p c && head -c 2000000 /dev/zero > c/layer && echo new > c/mark\n";
    let (repo, _) = repo_with(dir.path(), &[("saves", workflow)]);
    let (checkout, info) = Checkout::resolve(repo.path(), None).await.expect("the checkout");
    let (workflows, errors) = checkout.workflows().await.expect("the workflows");
    assert!(errors.is_empty(), "{errors:?}");
    let workflow = workflows.into_iter().next().expect("the workflow");
    let state = dir.path().join("state");
    let store = CacheStore::open(&state, 1 << 30).expect("the cache store");
    let base = store.base_path("repo", "saves", true, "c");
    let warm_folder = dir.path().join("warm");
    std::fs::create_dir_all(&warm_folder).expect("mkdir");
    std::fs::write(warm_folder.join("mark"), "warm\n").expect("write");
    let warm = knotless_protocol::tarball::pack_dir(&warm_folder, Vec::new()).expect("pack the warm base");
    std::fs::create_dir_all(base.parent().expect("the base's folder")).expect("mkdir");
    std::fs::write(&base, &warm).expect("write the warm base");

    let runner = knotless_protocol::messages::RunnerInfo {
        name: "knotless-run".into(),
        version: "test".into(),
        id: "e2e-failing-saves".into(),
    };
    let options = std::collections::BTreeMap::from([
        ("mode".to_string(), "break-download".to_string()),
        ("work-dir".to_string(), dir.path().join("work").display().to_string()),
        ("outputs".to_string(), "false".to_string()),
    ]);
    let process =
        ProcessSpec { name: "fake".into(), path: knotless_tests::bin("knotless-executor-fake"), pass_env: Vec::new() };
    let host = ExecutorHost::start(HostConfig::new(process, runner, options)).await.expect("the fake executor");
    let never = tokio_util::sync::CancellationToken::new();
    for round in 0..FAILING_SAVES {
        let run_id = format!("save-{round}");
        let leases = store.lease("repo", "saves", &workflow.cache, true, &run_id).expect("the leases");
        let plan = RunPlan {
            workflow: workflow.clone(),
            run_id: run_id.clone(),
            repository: info.repository.clone(),
            commit: info.commit.clone(),
            git_ref: info.git_ref.clone(),
            branch: "main".into(),
            changed: None,
            event: knotless_run::workflow::Event::Push,
            check_key: format!("repo/{}/saves", info.commit),
            checkout: checkout.clone(),
            secrets: Default::default(),
            extra_env: Default::default(),
            outputs_dir: None,
            keep: false,
            limits: engine::Limits::default(),
            caches: leases,
        };
        let report = engine::execute(&host, &plan, &mut NoSink, &never).await;
        let log = &report.log;
        assert_eq!(report.status, RunStatus::Success, "round {round}:\n{log}");
        assert!(log.contains("==> cache c: warm") && log.contains("==> cache c: not saved"), "round {round}:\n{log}");
        let notes = store.settle("repo", "saves", &run_id, &plan.caches, true).await;
        assert_eq!(notes[0].outcome, "not kept: the layer did not come back whole", "round {round}:\n{log}");
        assert!(std::fs::read(&base).expect("the base") == warm, "round {round} changed the warm base:\n{log}");
        let left: Vec<_> =
            std::fs::read_dir(store.root().join(".upper")).expect("the layers' folder").flatten().collect();
        assert!(left.is_empty(), "round {round} left {left:?}");
    }
    host.shutdown().await;
}
