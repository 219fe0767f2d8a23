//! The status page's bench rows: a repository page of 10,000 checks, served over HTTP, against
//! `knotless-run checks --json` reading the same records.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use knotless_run::checks::{CheckRecord, CheckStore, CheckTarget};
use knotless_run::report::{OutputFile, RunStatus, StepReport, StepStatus};
use knotless_run::web::{RunnerSummary, View, WebConfig};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::{Row, median, millis, release_bin};

const CHECKS: usize = 10_000;
const WORKFLOWS: usize = 4;
const KEY: &str = "bench-0badc0de";

/// `CHECKS` records in one repository: 2,500 commits of 4 workflows, 3 steps and an output each.
fn records(state: &Path) -> anyhow::Result<String> {
    let store = CheckStore::new(state);
    let mut last = String::new();
    for index in 0..CHECKS {
        let commit = format!("{:040x}", index / WORKFLOWS + 1);
        let target = CheckTarget {
            event: knotless_run::workflow::Event::Push,
            commit: commit.clone(),
            git_ref: "refs/heads/main".into(),
            pull: None,
            head: None,
            base: None,
        };
        let workflow = format!("workflow-{}", index % WORKFLOWS);
        let run_id = format!("{workflow}-{index:08x}");
        let mut record = CheckRecord::queued(run_id, ("/srv/bench", KEY), &workflow, &target, true, "bench");
        record.queued_at = 1_800_000_000_000 + index as u64 * 1000;
        record.status = if index % 7 == 0 { RunStatus::Failure } else { RunStatus::Success };
        record.steps = ["checkout", "build", "test"]
            .iter()
            .map(|name| StepReport {
                name: name.to_string(),
                status: StepStatus::Success,
                exit_code: Some(0),
                duration_ms: 1200,
                reason: None,
            })
            .collect();
        record.outputs = vec![OutputFile { path: "report/plot.png".into(), bytes: 20_480, image: true }];
        record.duration_ms = Some(3600);
        record.finished_at = Some(record.queued_at + 3600);
        store.put(&record)?;
        last = commit;
    }
    Ok(last)
}

/// A GET of `path`, read to its end; fails unless the answer is 200.
async fn get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<usize> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    if !answer.starts_with(b"HTTP/1.1 200") {
        bail!("GET {path}: {}", String::from_utf8_lossy(&answer[..answer.len().min(200)]));
    }
    Ok(answer.len())
}

fn summary() -> RunnerSummary {
    RunnerSummary {
        runner_id: "bench".into(),
        executor_name: "shell".into(),
        executor: None,
        protocol_version: None,
        capabilities: None,
        concurrency: 2,
        poll_seconds: 60,
        pulls: false,
        queue: false,
        started_at: 0,
    }
}

async fn serve(state: &Path) -> anyhow::Result<std::net::SocketAddr> {
    let config = WebConfig { addr: "127.0.0.1:0".parse()?, public: false, token: None, trusted_proxy: None };
    knotless_run::web::start(config, View::new(state, summary())).await
}

/// The repository page (its records parsed once, the folder unchanged; and with a record
/// rewritten before each request) and the first read of its records, against `checks --json`.
pub async fn page(scratch: &Path) -> anyhow::Result<Vec<Row>> {
    let state = scratch.join("page-state");
    let head = records(&state)?;
    let repositories = serde_json::json!({
        "repositories": { KEY: { "url": "/srv/bench", "seen": { "branches": { "main": head }, "pulls": {} } } }
    });
    std::fs::write(state.join("state.json"), serde_json::to_vec(&repositories)?)?;
    let path = format!("/repositories/{KEY}");
    let mut reference = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let output = std::process::Command::new(release_bin("knotless-run")?)
            .args(["checks", KEY, "--json", "--state"])
            .arg(&state)
            .output()
            .context("checks --json")?;
        if !output.status.success() {
            bail!("checks --json failed: {}", String::from_utf8_lossy(&output.stderr));
        }
        reference.push(started.elapsed());
    }
    let reference = median(&mut reference);
    let mut cold = Vec::new();
    for _ in 0..5 {
        let view = View::new(&state, summary());
        let started = Instant::now();
        let read = view.records(KEY).len();
        cold.push(started.elapsed());
        if read != CHECKS {
            bail!("read {read} records of {CHECKS}");
        }
    }
    // The folder's time is trusted once it is older than the file system's tick can blur.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let addr = serve(&state).await?;
    get(addr, &path).await?;
    let mut warm = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        get(addr, &path).await?;
        warm.push(started.elapsed());
    }
    // A busy runner: a record rewritten (a run's status changed) before each request.
    let store = CheckStore::new(&state);
    let mut changing = store.list(KEY)?.pop().context("a record")?;
    let mut changed = Vec::new();
    for index in 0..20 {
        changing.duration_ms = Some(index);
        store.put(&changing)?;
        let started = Instant::now();
        get(addr, &path).await?;
        changed.push(started.elapsed());
    }
    let (cold, warm, changed) = (median(&mut cold), median(&mut warm), median(&mut changed));
    let row = |what: &str, ours: Duration| Row {
        what: format!("{what} (reference: `checks --json` reading the same {CHECKS} records, median of 5)"),
        ours: millis(ours),
        reference: millis(reference),
        ratio: ours.as_secs_f64() / reference.as_secs_f64(),
    };
    Ok(vec![
        row(&format!("status page: a repository page of {CHECKS} checks, records parsed once, median of 50"), warm),
        row("status page: the same page, one record rewritten before each request, median of 20", changed),
        row("status page: the same page's first read (every record read and parsed; done at start), median of 5", cold),
    ])
}
