//! The merge queue on the git forge: `refs/queue/<branch>/<n>` queues a pull, the lander (a
//! `--queue` runner the repository record chooses) runs its `queue: first` pre-flights, checks
//! the batch, lands it by a fast-forward and marks the pull `refs/pulls/<n>/merged`; failing
//! pre-flights, conflicts and pulls that fail only together are ejected with their reasons; no
//! environment is left behind.

use std::path::Path;

use knotless_tests::{Repo, Runner, bin, eventually};
use serde_json::Value;

use crate::{flags, repo_with};

/// A pre-flight that fails when the pull adds `preflight-fails`; it runs in batches too.
pub(crate) const PRE: &str = "on: [queue]\nqueue: first\nsteps:\n  - name: pre\n    run: test ! -f preflight-fails\n";
/// A batch check that fails when both `a.txt` and `b.txt` are there.
const TOGETHER: &str =
    "on: [queue]\nsteps:\n  - name: together\n    run: if [ -f a.txt ] && [ -f b.txt ]; then echo both; exit 1; fi\n";

/// A repository with the two workflows, which accepts pushes to its checked-out branch.
pub(crate) fn queue_repo(dir: &Path, record: Option<&str>) -> (Repo, String) {
    let (repo, _) = repo_with(dir, &[("pre", PRE), ("together", TOGETHER)]);
    repo.git(&["config", "receive.denyCurrentBranch", "updateInstead"]);
    repo.write("base.txt", "base\n");
    if let Some(record) = record {
        repo.write(".knotless/repository.yml", record);
    }
    let base = repo.commit("base");
    (repo, base)
}

/// Queues pull 1, whose pre-flight fails, and pull 2, which conflicts with main once main
/// moves, then moves main and queues pull 3 off it, which lands; gives main's new head.
pub(crate) fn three_fates(repo: &Repo, base: &str) -> String {
    queue_pull(repo, 1, base, "preflight-fails", "x\n");
    queue_pull(repo, 2, base, "base.txt", "the pull's\n");
    repo.write("base.txt", "main's\n");
    let moved = repo.commit("main moves");
    queue_pull(repo, 3, &moved, "a.txt", "a\n");
    moved
}

/// A pull `number` off `from` adding `file`, queued for landing on main.
pub(crate) fn queue_pull(repo: &Repo, number: u64, from: &str, file: &str, text: &str) -> String {
    queue_pull_by(repo, number, from, (file, text), "test <test@example.com>", &format!("pull {number}"))
}

/// Like [`queue_pull`], its head commit authored by `author` (`Name <email>`) with `subject`.
pub(crate) fn queue_pull_by(
    repo: &Repo,
    number: u64,
    from: &str,
    (file, text): (&str, &str),
    author: &str,
    subject: &str,
) -> String {
    repo.git(&["checkout", "-q", "-b", &format!("pull-{number}"), from]);
    repo.write(file, text);
    repo.git(&["add", "-A"]);
    repo.git(&["commit", "-q", "--author", author, "-m", subject, "-m", "The pull's own description."]);
    let head = repo.git(&["rev-parse", "HEAD"]);
    repo.git(&["checkout", "-q", "main"]);
    repo.git(&["update-ref", &format!("refs/pulls/{number}/head"), &head]);
    repo.git(&["update-ref", &format!("refs/queue/main/{number}"), &head]);
    head
}

pub(crate) fn queue_of(runner: &Runner, url: &str) -> Value {
    let output = runner.command(&["checks", url, "--queue", "main", "--json"]);
    serde_json::from_slice(&output.stdout).unwrap_or(Value::Null)
}

/// Waits until every queued pull is merged or ejected and gives the queue.
pub(crate) fn settled(runner: &Runner, url: &str, count: usize) -> Value {
    eventually("the queue to settle", || {
        let queue = queue_of(runner, url);
        let entries = queue["entries"].as_array()?;
        let done = entries.len() == count
            && entries.iter().all(|entry| matches!(entry["state"].as_str(), Some("merged" | "ejected")));
        done.then_some(queue)
    })
}

pub(crate) fn entry(queue: &Value, number: u64) -> &Value {
    queue["entries"].as_array().and_then(|e| e.iter().find(|e| e["number"] == number)).expect("the entry")
}

fn is_empty_dir(path: &Path) -> bool {
    std::fs::read_dir(path).map(|mut entries| entries.next().is_none()).unwrap_or(true)
}

#[test]
fn a_queued_pull_lands_only_through_the_queue() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, base) = queue_repo(dir.path(), None);
    let head = queue_pull_by(&repo, 1, &base, ("one.txt", "one\n"), "Ada Lovelace <ada@example.com>", "Add one");
    let url = repo.url();
    let plain = Runner::start(
        &dir.path().join("plain"),
        &[flags("e2e-q-plain", &["--pulls", "--force-shell"]), vec![&url]].concat(),
    );
    eventually("the plain runner to pass the queue by", || plain.stderr().contains("without --queue").then_some(()));
    assert_eq!(repo.git(&["rev-parse", "main"]), base, "a runner without --queue never moves the branch");
    drop(plain);

    let work = dir.path().join("work");
    let work_option = format!("work-dir={}", work.display());
    let extra = ["--queue", "--force-shell", "--executor-option", work_option.as_str()];
    let runner = Runner::start(&dir.path().join("state"), &[flags("e2e-q-land", &extra), vec![&url]].concat());
    let queue = settled(&runner, &url, 1);
    let landed = entry(&queue, 1);
    assert_eq!(landed["state"], "merged", "{queue:#}");
    let batch = landed["batch"].as_str().expect("the batch");
    assert_eq!(repo.git(&["rev-parse", "main"]), batch, "the branch moved to the batch");
    assert_eq!(repo.git(&["rev-parse", &format!("{batch}^")]), base, "the batch sits on the base: a fast-forward");
    assert_eq!(repo.git(&["rev-parse", "refs/pulls/1/merged"]), batch);
    assert!(repo.git(&["for-each-ref", "refs/queue"]).is_empty(), "the pull left the queue");
    assert_eq!(std::fs::read_to_string(repo.dir.join("one.txt")).expect("landed"), "one\n");
    // A batch of one pull is authored by the pull's author, dated as its head, titled as it.
    let landed_as = repo.git(&["log", "-1", "--format=%an <%ae>%n%B", "main"]);
    assert_eq!(landed_as, "Ada Lovelace <ada@example.com>\nAdd one\n\nPull: 1", "{landed_as}");
    let dates = |commit: &str| repo.git(&["log", "-1", "--format=%at", commit]);
    assert_eq!(dates("main"), dates(&head), "the pull's author date");

    let checks = runner.checks(&url, None);
    let preflight: Vec<_> = checks.iter().filter(|c| c["event"] == "pull").collect();
    assert_eq!(preflight.len(), 1, "{checks:#?}");
    assert_eq!(preflight[0]["workflow"], "pre");
    assert_eq!(preflight[0]["head"], head.as_str());
    assert_eq!(preflight[0]["status"], "success");
    let batch_checks: Vec<_> = checks.iter().filter(|c| c["event"] == "queue").collect();
    assert_eq!(batch_checks.len(), 2, "{checks:#?}");
    assert!(batch_checks.iter().all(|c| c["commit"] == batch && c["status"] == "success" && c["trusted"] == false));
    assert_eq!(checks.len(), 3, "no push run of the landed batch: {checks:#?}");

    let text = String::from_utf8_lossy(&runner.command(&["checks", &url, "--queue", "main"]).stdout).into_owned();
    assert!(text.contains("pull/1") && text.contains("merged"), "{text}");
    assert!(text.contains(&format!("batch {}", &batch[..10])) && text.contains("landed"), "{text}");
    assert!(text.contains("together  success") && text.contains("pre  success"), "{text}");
    eventually("the sessions to be gone", || is_empty_dir(&work.join("e2e-q-land")).then_some(()));
}

#[test]
fn failing_pre_flights_conflicts_and_pulls_that_fail_together_are_ejected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, base) = queue_repo(dir.path(), None);
    let moved = three_fates(&repo, &base);
    queue_pull(&repo, 4, &moved, "b.txt", "b\n");
    let url = repo.url();
    let work = dir.path().join("work");
    let work_option = format!("work-dir={}", work.display());
    let extra = ["--queue", "--force-shell", "--executor-option", work_option.as_str()];
    let runner = Runner::start(&dir.path().join("state"), &[flags("e2e-q-eject", &extra), vec![&url]].concat());
    let queue = settled(&runner, &url, 4);
    let reason = |number| entry(&queue, number)["reason"].as_str().unwrap_or_default().to_string();
    assert_eq!(entry(&queue, 1)["state"], "ejected");
    assert_eq!(reason(1), "pre-flight pre failed");
    assert_eq!(entry(&queue, 2)["state"], "ejected");
    assert!(reason(2).starts_with("conflicts with main at base.txt"), "{queue:#}");
    assert_eq!(entry(&queue, 3)["state"], "merged", "{queue:#}");
    assert_eq!(entry(&queue, 4)["state"], "ejected");
    assert!(reason(4).starts_with("fails together with the batch"), "{queue:#}");
    assert!(repo.dir.join("a.txt").is_file() && !repo.dir.join("b.txt").exists());
    assert!(repo.git(&["for-each-ref", "refs/queue"]).is_empty(), "ejected pulls left the queue");
    // Pulls 3 and 4 failed together; 3 alone passed; 3 then 4 is the first batch again: each
    // batch is listed once, updated in place.
    let batches = queue["batches"].as_array().expect("the batches");
    let commits: Vec<&str> = batches.iter().filter_map(|batch| batch["commit"].as_str()).collect();
    let distinct: std::collections::BTreeSet<&str> = commits.iter().copied().collect();
    assert_eq!(distinct.len(), commits.len(), "{queue:#}");
    let failed: Vec<_> = batches.iter().filter(|batch| batch["status"] == "failed").collect();
    assert_eq!(failed.len(), 1, "{queue:#}");
    assert_eq!(failed[0]["pulls"], serde_json::json!([3, 4]), "{queue:#}");
    let text = String::from_utf8_lossy(&runner.command(&["checks", &url, "--queue", "main"]).stdout).into_owned();
    assert!(text.contains("ejected: pre-flight pre failed") && text.contains("fails together"), "{text}");
    let failed_batch = format!("batch {}", &commits[0][..10]);
    assert_eq!(text.lines().filter(|line| line.starts_with(&failed_batch)).count(), 1, "{text}");
    eventually("the sessions to be gone", || is_empty_dir(&work.join("e2e-q-eject")).then_some(()));
}

#[test]
fn a_batch_of_several_pulls_lists_their_titles_and_credits_their_authors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, base) = queue_repo(dir.path(), None);
    queue_pull_by(&repo, 1, &base, ("one.txt", "1\n"), "Ada Lovelace <ada@example.com>", "Add one");
    queue_pull_by(&repo, 2, &base, ("two.txt", "2\n"), "Grace Hopper <grace@example.com>", "Add two");
    queue_pull_by(&repo, 3, &base, ("three.txt", "3\n"), "Ada Lovelace <ada@example.com>", "Add three");
    let url = repo.url();
    let runner = Runner::start(
        &dir.path().join("state"),
        &[flags("e2e-q-authors", &["--queue", "--force-shell"]), vec![&url]].concat(),
    );
    let queue = settled(&runner, &url, 3);
    let batch = entry(&queue, 1)["batch"].as_str().expect("a batch").to_string();
    assert!([2, 3].iter().all(|n| entry(&queue, *n)["batch"] == batch.as_str()), "one batch: {queue:#}");
    assert_eq!(repo.git(&["rev-parse", "main"]), batch);
    let landed_as = repo.git(&["log", "-1", "--format=%an <%ae>%n%B", "main"]);
    let expected = "knotless-run <knotless-run@localhost>\nMerge queue batch of #1, #2, #3 into main\n\n\
                    - #1: Add one\n- #2: Add two\n- #3: Add three\n\n\
                    Co-authored-by: Ada Lovelace <ada@example.com>\n\
                    Co-authored-by: Grace Hopper <grace@example.com>";
    assert_eq!(landed_as, expected, "{landed_as}");
}

#[test]
fn pre_flights_of_queued_pulls_run_side_by_side_within_the_concurrency() {
    let dir = tempfile::tempdir().expect("tempdir");
    let meet = dir.path().join("meet");
    std::fs::create_dir_all(&meet).expect("the meet folder");
    // Each pre-flight marks itself running, waits (up to 5 s) for another, and records how
    // many run then and a moment later; `on: [pull]` keeps it out of push runs and batches,
    // and the runner runs no pull runs.
    let workflow = format!(
        "on: [pull]\nqueue: first\nsteps:\n  - name: meet\n    run: |\n      me=$(mktemp '{m}/run-XXXXXX')\n      \
         running() {{ ls -d '{m}'/run-* | wc -l; }}\n      i=0\n      \
         while [ \"$(running)\" -lt 2 ] && [ $i -lt 50 ]; do i=$((i+1)); sleep 0.1; done\n      \
         running >> '{m}/counts'\n      sleep 0.5\n      running >> '{m}/counts'\n      rm \"$me\"\n",
        m = meet.display()
    );
    let (repo, base) = crate::repo_with(dir.path(), &[("meet", &workflow)]);
    repo.git(&["config", "receive.denyCurrentBranch", "updateInstead"]);
    for number in 1..=3 {
        queue_pull(&repo, number, &base, &format!("{number}.txt"), "x\n");
    }
    let url = repo.url();
    let extra = ["--queue", "--force-shell", "--concurrency", "2"];
    let runner = Runner::start(&dir.path().join("state"), &[flags("e2e-q-side", &extra), vec![&url]].concat());
    let queue = settled(&runner, &url, 3);
    assert!((1..=3).all(|n| entry(&queue, n)["state"] == "merged"), "{queue:#}");
    let counts = std::fs::read_to_string(meet.join("counts")).expect("the counts");
    assert_eq!(counts.lines().count(), 6, "{counts}");
    let most = counts.lines().filter_map(|line| line.trim().parse::<usize>().ok()).max();
    assert_eq!(most, Some(2), "two at once, never more than --concurrency: {counts}");
}

#[test]
fn two_named_runners_give_one_check_per_workflow_and_only_the_lander_lands() {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = "runners: [e2e-q-one, e2e-q-two]\npushers: [e2e-q-two]\n";
    let (repo, base) = queue_repo(dir.path(), Some(record));
    queue_pull(&repo, 1, &base, "one.txt", "one\n");
    let url = repo.url();
    let extra = ["--queue", "--force-shell"];
    let one = Runner::start(&dir.path().join("one"), &[flags("e2e-q-one", &extra), vec![&url]].concat());
    let two = Runner::start(&dir.path().join("two"), &[flags("e2e-q-two", &extra), vec![&url]].concat());
    eventually("runner one to defer", || one.stderr().contains("runner e2e-q-two lands").then_some(()));
    let queue = settled(&two, &url, 1);
    let batch = entry(&queue, 1)["batch"].as_str().expect("a batch").to_string();
    assert_eq!(repo.git(&["rev-parse", "main"]), batch);
    one.notify(&url);
    eventually("runner one to see the landing", || one.stderr().contains("through the merge queue").then_some(()));
    let two_checks = two.checks(&url, None);
    assert_eq!(two_checks.len(), 3, "one pre-flight, two batch checks: {two_checks:#?}");
    assert!(one.checks(&url, None).is_empty(), "the other runner ran nothing");
    let empty = queue_of(&one, &url);
    assert!(empty["entries"].as_array().is_none_or(|e| e.is_empty()), "{empty:#}");
}

#[test]
fn the_fake_executor_ledger_is_empty_once_the_queue_is_idle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, base) = queue_repo(dir.path(), None);
    queue_pull(&repo, 1, &base, "a.txt", "a\n");
    queue_pull(&repo, 2, &base, "b.txt", "b\n");
    let url = repo.url();
    let ledger = dir.path().join("ledger");
    let fake = bin("knotless-executor-fake").to_string_lossy().into_owned();
    let ledger_option = format!("ledger={}", ledger.display());
    let work_option = format!("work-dir={}", dir.path().join("fake-work").display());
    let args = [
        vec!["--executor-plugin", fake.as_str(), "--executor-option", ledger_option.as_str()],
        vec!["--executor-option", work_option.as_str(), "--runner-id", "e2e-q-fake", "--queue", "--force-shell"],
        vec!["--poll", "3600", "--disk-floor", "0", url.as_str()],
    ]
    .concat();
    let runner = Runner::start(&dir.path().join("state"), &args);
    let queue = settled(&runner, &url, 2);
    let states: Vec<_> = [1, 2].iter().map(|n| entry(&queue, *n)["state"].as_str().unwrap_or("").to_string()).collect();
    assert_eq!(states, ["merged", "ejected"], "{queue:#}");
    let sessions = std::fs::read_to_string(&ledger).expect("the ledger");
    assert_eq!(sessions.trim(), "[]", "no session is left behind");
}

#[test]
fn the_shell_executor_refuses_the_queue_unless_forced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, _) = queue_repo(dir.path(), None);
    let mut runner = Runner::start(
        &dir.path().join("state"),
        &[flags("e2e-q-refuse", &["--queue"]), vec![repo.url().as_str()]].concat(),
    );
    assert!(!runner.wait().success());
    let stderr = runner.stderr();
    assert!(stderr.contains("merge queues") && stderr.contains("--force-shell"), "{stderr}");
}
