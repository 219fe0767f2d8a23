//! The daemon's metrics: a daemon started with `--metrics 127.0.0.1:0` (and the status page
//! beside it) runs a workflow that passes and one that fails, and `/metrics` then counts one run
//! of each, the round that found them, nothing left in flight, and the shell executor never
//! restarted; both listeners answer the same Prometheus text.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use knotless_tests::{Runner, by_workflow, eventually};
use prometheus_parse::{Scrape, Value};

use crate::{flags, repo_with};

const PASS: &str = "steps:\n  - name: one\n    run: echo one\n";
const FAIL: &str = "steps:\n  - name: bad\n    run: echo bad; exit 3\n";

/// The most bytes read of an answer.
const MAX_ANSWER: u64 = 1 << 20;

/// The address after `prefix` in the runner's log, up to `suffix`.
fn logged_address(runner: &Runner, prefix: &str, suffix: &str) -> String {
    eventually(&format!("{prefix:?} in the runner's log"), || {
        let stderr = runner.stderr();
        let at = stderr.find(prefix)? + prefix.len();
        let address: String = stderr[at..].chars().take_while(|c| !c.is_whitespace() && *c != '"').collect();
        address.strip_suffix(suffix).map(str::to_string)
    })
}

/// `GET /metrics` at `address`: its body, once its status and content type are checked.
fn scrape(address: &str) -> String {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("a read timeout");
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("send");
    let mut answer = String::new();
    stream.take(MAX_ANSWER).read_to_string(&mut answer).expect("read the answer");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    assert!(head.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4; charset=utf-8"), "{head}");
    body.to_string()
}

/// The value of the sample `name` with exactly `labels`.
fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|sample| {
            sample.metric == name
                && sample.labels.len() == labels.len()
                && labels.iter().all(|(key, value)| sample.labels.get(key) == Some(*value))
        })
        .and_then(|sample| match sample.value {
            Value::Counter(value) | Value::Gauge(value) | Value::Untyped(value) => Some(value),
            Value::Histogram(_) | Value::Summary(_) => None,
        })
}

#[test]
fn the_metrics_count_the_runs_that_ended_and_the_rounds_that_found_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, commit) = repo_with(dir.path(), &[("pass", PASS), ("fail", FAIL)]);
    let extra = ["--metrics", "127.0.0.1:0", "--http", "127.0.0.1:0"];
    let runner =
        Runner::start(&dir.path().join("state"), &[flags("e2e-metrics", &extra), vec![repo.url().as_str()]].concat());
    let checks = runner.final_checks(&repo.url(), &commit, 2);
    assert_eq!(by_workflow(&checks, "pass")["status"], "success", "{checks:#?}");
    assert_eq!(by_workflow(&checks, "fail")["status"], "failure", "{checks:#?}");

    let metrics = logged_address(&runner, "metrics at http://", "/metrics");
    let page = logged_address(&runner, "status page at http://", "/");
    assert_ne!(metrics, page, "two listeners");
    // A check's record is final a moment before its run leaves the runs in flight.
    let (text, scraped) = eventually("both runs counted and none in flight", || {
        let text = scrape(&metrics);
        let scraped = Scrape::parse(text.lines().map(|line| Ok(line.to_string()))).expect("the text format");
        let settled = value(&scraped, "knotless_runs_in_flight", &[]) == Some(0.0)
            && value(&scraped, "knotless_runs_queued", &[]) == Some(0.0)
            && value(&scraped, "knotless_run_duration_seconds_count", &[]) == Some(2.0);
        settled.then_some((text, scraped))
    });
    let runs = |status| value(&scraped, "knotless_runs_total", &[("status", status), ("workflow_trust", "trusted")]);
    assert_eq!(runs("success"), Some(1.0), "{text}");
    assert_eq!(runs("failure"), Some(1.0), "{text}");
    assert_eq!(runs("error"), None, "{text}");
    let rounds = value(&scraped, "knotless_poll_duration_seconds_count", &[]).expect("the rounds' count");
    assert!(rounds >= 1.0, "{text}");
    assert_eq!(value(&scraped, "knotless_executor_restarts_total", &[("executor", "shell")]), Some(0.0), "{text}");
    assert_eq!(value(&scraped, "knotless_cleanup_failures_total", &[]), Some(0.0), "{text}");
    assert!(value(&scraped, "knotless_cleanup_swept_total", &[]).is_some(), "{text}");
    assert_eq!(value(&scraped, "knotless_queue_pulls", &[("state", "waiting")]), Some(0.0), "{text}");

    // The page serves the same metrics.
    let text = scrape(&page);
    let scraped = Scrape::parse(text.lines().map(|line| Ok(line.to_string()))).expect("the text format");
    let runs = value(&scraped, "knotless_runs_total", &[("status", "success"), ("workflow_trust", "trusted")]);
    assert_eq!(runs, Some(1.0), "{text}");
}

/// An executor that crashes during a run is counted once as restarted when a fresh one replaces
/// it, and the sweep of what it left is counted with the startup sweep.
#[test]
fn an_executor_that_crashed_and_was_replaced_is_counted_as_restarted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, commit) = repo_with(
        dir.path(),
        &[
            ("a", "steps:\n  - name: first\n    run: echo a-ran\n"),
            ("b", "steps:\n  - name: second\n    run: echo b\n"),
        ],
    );
    let wrapper = knotless_tests::fake_executor_once(dir.path(), "crash-mid-step");
    let ledger = format!("ledger={}", dir.path().join("ledger.json").display());
    let work = format!("work-dir={}", dir.path().join("work").display());
    let wrapper = wrapper.display().to_string();
    let url = repo.url();
    // One run at a time: the run after the crash is the one that needs a fresh executor.
    let extra = [
        "--metrics",
        "127.0.0.1:0",
        "--concurrency",
        "1",
        "--executor-plugin",
        wrapper.as_str(),
        "--executor-grace",
        "1",
        "--executor-option",
        ledger.as_str(),
        "--executor-option",
        work.as_str(),
    ];
    let args: Vec<&str> = ["--poll", "3600", "--disk-floor", "0", "--runner-id", "e2e-metrics-restart"]
        .into_iter()
        .chain(extra)
        .chain([url.as_str()])
        .collect();
    let runner = Runner::start(&dir.path().join("state"), &args);
    let checks = runner.final_checks(&repo.url(), &commit, 2);
    let statuses: Vec<&str> = checks.iter().filter_map(|check| check["status"].as_str()).collect();
    assert!(statuses.contains(&"error") && statuses.contains(&"success"), "{checks:#?}");

    let metrics = logged_address(&runner, "metrics at http://", "/metrics");
    let executor = wrapper.rsplit('/').next().expect("the wrapper's name").to_string();
    let (text, scraped) = eventually("the restart counted", || {
        let text = scrape(&metrics);
        let scraped = Scrape::parse(text.lines().map(|line| Ok(line.to_string()))).expect("the text format");
        let restarted = value(&scraped, "knotless_executor_restarts_total", &[("executor", &executor)]) == Some(1.0);
        let counted = value(&scraped, "knotless_run_duration_seconds_count", &[]) == Some(2.0);
        (restarted && counted).then_some((text, scraped))
    });
    let runs = |status| value(&scraped, "knotless_runs_total", &[("status", status), ("workflow_trust", "trusted")]);
    assert_eq!((runs("error"), runs("success")), (Some(1.0), Some(1.0)), "{text}");
    assert_eq!(value(&scraped, "knotless_cleanup_failures_total", &[]), Some(0.0), "{text}");
}
