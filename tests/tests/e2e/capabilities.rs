//! What an executor declares in its handshake decides what the runner asks of it: no secret
//! through one that declares `secrets: false`, no outputs download from one that declares
//! `outputs: false`, no image to one that declares `images: false`, no cache transfer with one
//! that declares `caches: false`, and pulls and merge queues only through one that isolates.

use knotless_tests::{Repo, Runner, eventually, knotless_run, ran};

use crate::repo_with;

/// `run` of `repo` through the fake executor declaring `declared` (`KEY=VALUE` options).
fn run_fake(repo: &Repo, work: &std::path::Path, declared: &[&str]) -> knotless_tests::Ran {
    ran(fake_run_command(repo, work, declared))
}

/// The command of [`run_fake`].
fn fake_run_command(repo: &Repo, work: &std::path::Path, declared: &[&str]) -> std::process::Command {
    let fake = knotless_tests::bin("knotless-executor-fake").display().to_string();
    let path = repo.path().display().to_string();
    let work_dir = format!("work-dir={}", work.display());
    let mut args = vec!["run", path.as_str(), "--executor-plugin", fake.as_str(), "--executor-option", &work_dir];
    for option in declared {
        args.extend(["--executor-option", option]);
    }
    knotless_run(&args)
}

#[test]
fn an_executor_that_declares_no_secrets_is_given_none_and_the_run_names_the_capability() {
    let repo = Repo::new();
    repo.workflow(
        "deploy",
        "steps:\n  - name: build\n    run: echo built\n  - name: push\n    secrets: [TOKEN]\n    run: echo pushed\n",
    );
    let work = tempfile::tempdir().expect("tempdir");
    let refused = run_fake(&repo, work.path(), &["secrets=false"]);
    assert_eq!(refused.code, Some(1), "{}", refused.both());
    assert!(
        refused.stdout.contains(
            "step push asks for secrets (TOKEN), but executor fake declares secrets: false, so no secret goes through it"
        ),
        "{}",
        refused.both()
    );
    assert!(!refused.stdout.contains("deploy/build | built"), "no step ran:\n{}", refused.both());
    assert!(!refused.stdout.contains("environment removed"), "no environment was started:\n{}", refused.both());

    // The same workflow through the same executor declaring secrets runs.
    let allowed = run_fake(&repo, work.path(), &["secrets=true"]);
    assert_eq!(allowed.code, Some(0), "{}", allowed.both());
    assert!(allowed.stdout.contains("deploy/push | pushed"), "{}", allowed.both());
}

#[test]
fn an_executor_that_declares_no_outputs_is_never_asked_for_them() {
    let repo = Repo::new();
    repo.workflow("report", "steps:\n  - name: write\n    run: echo data > \"$KNOTLESS_RUN_OUTPUTS/report.txt\"\n");
    let (work, outputs) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let fake = knotless_tests::bin("knotless-executor-fake").display().to_string();
    let (path, work_dir) = (repo.path().display().to_string(), format!("work-dir={}", work.path().display()));
    let outputs_dir = outputs.path().display().to_string();
    let run = |declared: &str| {
        ran(knotless_run(&[
            "run",
            &path,
            "--executor-plugin",
            &fake,
            "--executor-option",
            &work_dir,
            "--executor-option",
            declared,
            "--outputs",
            &outputs_dir,
        ]))
    };
    let without = run("outputs=false");
    assert_eq!(without.code, Some(0), "{}", without.both());
    assert!(
        without.stdout.contains("executor fake declares outputs: false: no outputs are brought back"),
        "{}",
        without.both()
    );
    assert!(!outputs.path().join("report").exists(), "{}", without.both());
    let with = run("outputs=true");
    assert_eq!(with.code, Some(0), "{}", with.both());
    assert!(outputs.path().join("report/report.txt").is_file(), "{}", with.both());
}

#[test]
fn an_executor_that_takes_no_images_is_sent_none_and_the_run_says_the_image_is_ignored() {
    let repo = Repo::new();
    repo.workflow("built", "image: rust:1.95\nsteps:\n  - name: build\n    run: echo built\n");
    let work = tempfile::tempdir().expect("tempdir");
    // The fake names in its environment's description the image `start` gave it.
    let ignored = run_fake(&repo, work.path(), &["images=false"]);
    assert_eq!(ignored.code, Some(0), "{}", ignored.both());
    assert!(
        ignored.stdout.contains("built ==> image rust:1.95 ignored: executor fake does not take images"),
        "{}",
        ignored.both()
    );
    assert!(!ignored.stdout.contains(", image rust:1.95"), "start named the image:\n{}", ignored.both());
    assert!(ignored.stdout.contains("built/build | built"), "{}", ignored.both());

    let taken = run_fake(&repo, work.path(), &["images=true"]);
    assert_eq!(taken.code, Some(0), "{}", taken.both());
    assert!(taken.stdout.contains(", image rust:1.95"), "start did not name the image:\n{}", taken.both());
    assert!(!taken.stdout.contains("ignored"), "{}", taken.both());
}

#[test]
fn an_executor_that_declares_no_caches_is_never_sent_a_cache_and_the_run_says_so_once() {
    let repo = Repo::new();
    repo.workflow(
        "cached",
        "cache: [c]\nsteps:\n  - name: fill\n    run: echo \"saw=[$(ls c 2>/dev/null)]\"; mkdir -p c && touch c/mark\n",
    );
    let (work, cache_home) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let run = |declared: &str| {
        let mut command = fake_run_command(&repo, work.path(), &[declared]);
        command.env("XDG_CACHE_HOME", cache_home.path());
        ran(command)
    };
    for round in 0..2 {
        let without = run("caches=false");
        assert_eq!(without.code, Some(0), "round {round}: {}", without.both());
        let said = without.stdout.matches("caches: not supported by executor fake").count();
        assert_eq!(said, 1, "round {round}: {}", without.both());
        assert!(!without.stdout.contains("==> cache c: "), "round {round}: a cache was streamed:\n{}", without.both());
        assert!(without.stdout.contains("saw=[]"), "round {round}: {}", without.both());
    }
    // The same workflow through the same executor declaring caches keeps its cache.
    for (round, seen) in [(0, "saw=[]"), (1, "saw=[mark]")] {
        let with = run("caches=true");
        assert_eq!(with.code, Some(0), "round {round}: {}", with.both());
        assert!(with.stdout.contains("==> cache c: saved"), "round {round}: {}", with.both());
        assert!(with.stdout.contains(seen), "round {round}: {}", with.both());
        assert!(!with.stdout.contains("not supported"), "round {round}: {}", with.both());
    }
}

#[test]
fn pulls_run_only_through_an_executor_that_declares_isolation_whatever_its_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, first) = repo_with(dir.path(), &[("pass", "steps:\n  - name: one\n    run: echo one\n")]);
    let fake = knotless_tests::bin("knotless-executor-fake").display().to_string();
    let work_dir = format!("work-dir={}", dir.path().join("work").display());
    let url = repo.url();
    let args = |id: &'static str, isolation: &'static str, extra: &[&'static str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "--executor-plugin",
            &fake,
            "--executor-option",
            &work_dir,
            "--executor-option",
            isolation,
            "--poll",
            "3600",
            "--disk-floor",
            "0",
            "--runner-id",
            id,
        ]
        .iter()
        .map(|arg| arg.to_string())
        .collect();
        args.extend(extra.iter().map(|arg| arg.to_string()));
        args.push(url.clone());
        args
    };
    for (id, flag) in [("e2e-caps-pulls", "--pulls"), ("e2e-caps-queue", "--queue")] {
        let given = args(id, "isolation=none", &[flag]);
        let given: Vec<&str> = given.iter().map(String::as_str).collect();
        let mut refused = Runner::start(&dir.path().join(id), &given);
        assert!(!refused.wait().success(), "{flag} through an executor that isolates nothing");
        let stderr = eventually("the refusal", || Some(refused.stderr()).filter(|text| text.contains("--force-shell")));
        assert!(stderr.contains("executor fake declares isolation none, which isolates nothing"), "{stderr}");
    }
    let given = args("e2e-caps-container", "isolation=container", &["--pulls"]);
    let given: Vec<&str> = given.iter().map(String::as_str).collect();
    let runner = Runner::start(&dir.path().join("container"), &given);
    let checks = runner.final_checks(&url, &first, 1);
    assert_eq!(checks[0]["status"], "success", "{:#}", checks[0]);
    assert!(!runner.stderr().contains("isolates nothing"), "{}", runner.stderr());
}
