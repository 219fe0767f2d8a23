//! `make bench`: each figure of the runner next to a reference measured in the same run, as a
//! Markdown table (the source of `docs/benchmarks.md`).
//!
//! Run from the workspace root after `cargo build --release --workspace --bins`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use knotless_protocol::messages::*;
use knotless_run::host::{ExecutorHost, HostConfig, ProcessSpec};
use knotless_run::mask::Masker;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

#[path = "bench/daemon.rs"]
mod daemon;
#[path = "bench/page.rs"]
mod page;
#[path = "bench/runs.rs"]
mod runs;

struct Row {
    what: String,
    ours: String,
    reference: String,
    ratio: f64,
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn micros(duration: Duration) -> String {
    format!("{:.1} µs", duration.as_secs_f64() * 1e6)
}

fn millis(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1e3)
}

fn release_bin(name: &str) -> anyhow::Result<PathBuf> {
    let path = PathBuf::from("target/release").join(name);
    if !path.exists() {
        bail!("{} is missing: run `cargo build --release --workspace --bins` from the workspace root", path.display());
    }
    Ok(std::fs::canonicalize(path)?)
}

/// `bench [GROUP...]`: every group (`protocol`, `masking`, `transfer`, `runs`, `memory`,
/// `kubernetes`, `page`, `daemon`), or those named.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let groups: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, depth] = groups.as_slice()
        && flag == RELAY
    {
        return relay(depth.parse()?);
    }
    let wanted = |group: &str| groups.is_empty() || groups.iter().any(|g| g == group);
    // On a tmpfs when there is one: the transfers then measure the code, not the disk's
    // writeback, which moved the same figure by 3x from run to run here.
    let work = match Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm")?,
        false => tempfile::tempdir()?,
    };
    let mut rows = Vec::new();
    if wanted("protocol") || wanted("transfer") {
        rows.extend(host_rows(&wanted, work.path()).await?);
    }
    if wanted("masking") {
        rows.extend(masking()?);
    }
    if wanted("runs") {
        rows.extend(runs::runs(work.path())?);
    }
    if wanted("memory") {
        rows.extend(runs::memory(work.path())?);
    }
    if wanted("kubernetes") {
        rows.extend(kubernetes(work.path()).await?);
    }
    if wanted("page") {
        rows.extend(page::page(work.path()).await?);
    }
    if wanted("daemon") {
        rows.extend(daemon::daemon(work.path())?);
    }
    println!("| figure | knotless-run | reference | ratio |");
    println!("|---|---|---|---|");
    for row in rows {
        println!("| {} | {} | {} | {:.2} |", row.what, row.ours, row.reference, row.ratio);
    }
    Ok(())
}

/// The rows through a shell executor's host: `protocol` and `transfer`.
async fn host_rows(wanted: &dyn Fn(&str) -> bool, work: &Path) -> anyhow::Result<Vec<Row>> {
    let shell = release_bin("knotless-executor-shell")?;
    let runner =
        RunnerInfo { name: "knotless-run".into(), version: env!("CARGO_PKG_VERSION").into(), id: "bench".into() };
    let options = BTreeMap::from([("work-dir".to_string(), work.display().to_string())]);
    let process = ProcessSpec { name: "shell".into(), path: shell, pass_env: Vec::new() };
    let host = ExecutorHost::start(HostConfig::new(process, runner, options)).await?;
    let mut rows = Vec::new();
    if wanted("protocol") {
        rows.push(round_trip(&host).await?);
        let session = open(&host).await?;
        rows.extend(trivial_steps(&session).await?);
        session.stop(false, Duration::from_secs(60)).await?;
    }
    if wanted("transfer") {
        let session = open(&host).await?;
        rows.extend(transfers(&session, work).await?);
        session.stop(false, Duration::from_secs(600)).await?;
    }
    host.shutdown().await;
    Ok(rows)
}

/// A no-op request (`ping`) through the protocol, against one line echoed by `cat` over pipes.
async fn round_trip(host: &std::sync::Arc<ExecutorHost>) -> anyhow::Result<Row> {
    const CALLS: usize = 5000;
    let never = CancellationToken::new();
    let mut ours = Vec::with_capacity(CALLS);
    for index in 0..CALLS + 200 {
        let started = Instant::now();
        host.call::<rpc::Ping>(&Empty {}, Duration::from_secs(10), &never).await?;
        if index >= 200 {
            ours.push(started.elapsed());
        }
    }
    let mut cat = tokio::process::Command::new("cat").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
    let mut input = cat.stdin.take().context("cat stdin")?;
    let mut output = BufReader::new(cat.stdout.take().context("cat stdout")?);
    let line = format!("{}\n", serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {}}));
    let mut reference = Vec::with_capacity(CALLS);
    let mut echoed = String::new();
    for index in 0..CALLS + 200 {
        let started = Instant::now();
        input.write_all(line.as_bytes()).await?;
        input.flush().await?;
        echoed.clear();
        output.read_line(&mut echoed).await?;
        if index >= 200 {
            reference.push(started.elapsed());
        }
    }
    drop(input);
    cat.wait().await?;
    let (ours, reference) = (median(&mut ours), median(&mut reference));
    Ok(Row {
        what: format!("no-op request round trip, median of {CALLS} (reference: a line echoed by `cat`)"),
        ours: micros(ours),
        reference: micros(reference),
        ratio: ours.as_secs_f64() / reference.as_secs_f64(),
    })
}

async fn open(host: &std::sync::Arc<ExecutorHost>) -> anyhow::Result<knotless_run::host::Session> {
    let params = StartParams {
        session: "bench".into(),
        run: RunInfo::default(),
        image: None,
        resources: Resources::default(),
        network: false,
        run_timeout_ms: None,
        timeout_ms: 60_000,
        keep: false,
        services: Vec::new(),
    };
    Ok(host.open(params, &CancellationToken::new()).await?)
}

/// One step `true` through the shell executor, against spawning `sh -c true`: on the host as
/// it is, then with 300 more sleeping processes on it (a step's cost must not grow with the
/// host's process count). With the first, the same step against its chain of processes doing
/// nothing else: a byte relayed from this process through two more ([`relay`]), in the
/// executor's and the reaper's places, the second running `sh -c true` for it with its output
/// piped: what a step costs by its structure alone.
async fn trivial_steps(session: &knotless_run::host::Session) -> anyhow::Result<Vec<Row>> {
    let (quiet, structure) = trivial_step(session, "").await?;
    let mut sleepers = Vec::with_capacity(300);
    for _ in 0..300 {
        sleepers.push(std::process::Command::new("sleep").arg("600").stdin(Stdio::null()).spawn()?);
    }
    let crowded = trivial_step(session, ", with 300 more sleeping processes on the host").await;
    for mut sleeper in sleepers {
        let _ = sleeper.kill();
        let _ = sleeper.wait();
    }
    Ok(vec![quiet, structure, crowded?.0])
}

/// The flag that makes this program a relay ([`relay`]).
const RELAY: &str = "--relay";

/// Relays each byte of stdin through `depth - 1` more relays, the last running `sh -c true`
/// for it (its output piped and read to its end), then answers with a byte; until stdin ends.
fn relay(depth: u32) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let mut next = match depth > 1 {
        true => Some(
            std::process::Command::new(std::env::current_exe()?)
                .args([RELAY, &(depth - 1).to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()?,
        ),
        false => None,
    };
    let (mut input, mut output, mut byte) = (std::io::stdin().lock(), std::io::stdout().lock(), [0u8]);
    while input.read(&mut byte)? == 1 {
        match &mut next {
            Some(child) => {
                child.stdin.as_mut().context("relay stdin")?.write_all(&byte)?;
                child.stdout.as_mut().context("relay stdout")?.read_exact(&mut byte)?;
            }
            // Its output piped and read to its end, as a step's is.
            None => {
                if !std::process::Command::new("sh").args(["-c", "true"]).output()?.status.success() {
                    bail!("sh -c true failed");
                }
            }
        }
        output.write_all(&byte)?;
        output.flush()?;
    }
    if let Some(mut child) = next {
        drop(child.stdin.take());
        child.wait()?;
    }
    Ok(())
}

/// The trivial step against `sh -c true`, and against its structure's chain of processes.
async fn trivial_step(session: &knotless_run::host::Session, host: &str) -> anyhow::Result<(Row, Row)> {
    const STEPS: usize = 300;
    let never = CancellationToken::new();
    let mut ours = Vec::with_capacity(STEPS);
    let mut reference = Vec::with_capacity(STEPS);
    let mut structure = Vec::with_capacity(STEPS);
    let mut chain = tokio::process::Command::new(std::env::current_exe()?)
        .args([RELAY, "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let (mut into, mut out) =
        (chain.stdin.take().context("relay stdin")?, chain.stdout.take().context("relay stdout")?);
    // Interleaved, so that all see the same load.
    for index in 0..STEPS {
        let params = CommandParams {
            session: session.id().to_string(),
            step: index as u32,
            name: "true".into(),
            script: "true".into(),
            env: BTreeMap::new(),
            secrets: BTreeMap::new(),
            workdir: None,
            timeout_ms: 60_000,
        };
        let started = Instant::now();
        let result = session.command(params, &never, |_| {}).await?;
        ours.push(started.elapsed());
        if result.exit_code != 0 {
            bail!("`true` exited with {}", result.exit_code);
        }
        let started = Instant::now();
        let status = tokio::process::Command::new("sh").args(["-c", "true"]).status().await?;
        reference.push(started.elapsed());
        if !status.success() {
            bail!("sh -c true failed");
        }
        let started = Instant::now();
        into.write_all(b"s").await?;
        let mut byte = [0u8];
        tokio::io::AsyncReadExt::read_exact(&mut out, &mut byte).await?;
        structure.push(started.elapsed());
    }
    drop(into);
    chain.wait().await?;
    let (ours, reference, structure) = (median(&mut ours), median(&mut reference), median(&mut structure));
    let row = |reference: Duration, what: &str| Row {
        what: format!("one trivial step through the shell executor{host}, median of {STEPS} (reference: {what})"),
        ours: millis(ours),
        reference: millis(reference),
        ratio: ours.as_secs_f64() / reference.as_secs_f64(),
    };
    Ok((
        row(reference, "`sh -c true`"),
        row(structure, "a byte relayed through two processes, the second running `sh -c true` with its output piped"),
    ))
}

/// A git repository at `root` with `megabytes` MiB of incompressible data in files of 1 MiB
/// across 10 folders, 1,000 small text files in 50 more, and a one-step workflow; committed.
fn make_repo(root: &Path, megabytes: usize) -> anyhow::Result<()> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ megabytes as u64;
    let mut block = vec![0u8; 1 << 20];
    for file in 0..megabytes {
        let folder = root.join(format!("dir{}", file % 10));
        std::fs::create_dir_all(&folder)?;
        for word in block.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        std::fs::write(folder.join(format!("file{file}.bin")), &block)?;
    }
    for file in 0..1000 {
        let folder = root.join(format!("src/module{}", file % 50));
        std::fs::create_dir_all(&folder)?;
        std::fs::write(folder.join(format!("part{file}.rs")), format!("// line of source {file}\n").repeat(40))?;
    }
    std::fs::create_dir_all(root.join(".knotless/workflows"))?;
    std::fs::write(root.join(".knotless/workflows/quiet.yml"), "steps:\n  - name: quiet\n    run: 'true'\n")?;
    let git = |args: &[&str]| -> anyhow::Result<()> {
        let status = std::process::Command::new("git")
            .arg("-C")
            .arg(root)
            .args(["-c", "user.name=bench", "-c", "user.email=bench@localhost", "-c", "core.compression=1"])
            .args(args)
            .stdout(Stdio::null())
            .status()?;
        if !status.success() {
            bail!("git {args:?} failed in {}", root.display());
        }
        Ok(())
    };
    git(&["init", "-q"])?;
    git(&["add", "-A"])?;
    git(&["commit", "-q", "-m", "bench"])?;
    Ok(())
}

/// The bench's repository of `megabytes` MiB under `scratch`, made the first time.
fn repo_of(scratch: &Path, megabytes: usize) -> anyhow::Result<PathBuf> {
    let repo = scratch.join(format!("checkout-{megabytes}"));
    if !repo.join(".git").exists() {
        make_repo(&repo, megabytes)?;
    }
    Ok(repo)
}

/// Writes every dirty page out, so that a measured transfer does not pay for the previous
/// one's writeback.
fn settle() -> anyhow::Result<()> {
    if !std::process::Command::new("sync").status()?.success() {
        bail!("sync failed");
    }
    Ok(())
}

/// The time a shell command takes, or an error if it fails.
fn timed_sh(script: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let status = std::process::Command::new("sh").args(["-c", script]).status()?;
    if !status.success() {
        bail!("`{script}` failed");
    }
    Ok(started.elapsed())
}

/// How many times each transfer and its reference are measured.
const TRANSFER_ROUNDS: usize = 3;

/// The checkout uploads and the download a run makes, through the functions the engine calls
/// (the checkout's tar stream made as it is sent; the vetted unpack on the way back), against
/// `git archive | tar x` of the same commit and `tar c | tar x` of the same tree.
async fn transfers(session: &knotless_run::host::Session, scratch: &Path) -> anyhow::Result<Vec<Row>> {
    use knotless_run::checkout::Checkout;
    let never = CancellationToken::new();
    let mut rows = Vec::new();
    for megabytes in [100, 1024] {
        let repo = repo_of(scratch, megabytes)?;
        let size = if megabytes >= 1024 { format!("{} GiB", megabytes / 1024) } else { format!("{megabytes} MiB") };
        for rev in [None, Some("HEAD")] {
            let target = format!("{}/checkout-{megabytes}-{}", session.paths().work, rev.is_some());
            // Median of three, alternating with the reference, so that both see the same load.
            let (mut ours, mut reference) = (Vec::new(), Vec::new());
            for _ in 0..TRANSFER_ROUNDS {
                settle()?;
                let started = Instant::now();
                let (checkout, _) = Checkout::resolve(&repo, rev).await?;
                let mut archive = checkout.archive(None).await?;
                session.upload(&target, &mut archive, 4 << 30, Duration::from_secs(600), &never).await?;
                ours.push(started.elapsed());
                std::fs::remove_dir_all(&target)?;
                let copy = scratch.join("reference-checkout");
                std::fs::create_dir_all(&copy)?;
                settle()?;
                reference.push(timed_sh(&format!(
                    "git -C '{}' archive --format=tar HEAD | tar -C '{}' -xf -",
                    repo.display(),
                    copy.display()
                ))?);
                std::fs::remove_dir_all(&copy)?;
            }
            let (ours, reference) = (median(&mut ours), median(&mut reference));
            let what = match rev {
                None => "the working tree (`run`)",
                Some(_) => "a commit (`run --rev HEAD`)",
            };
            rows.push(Row {
                what: format!(
                    "checkout upload of {size} from a git repository, {what}, into a shell session, median of {TRANSFER_ROUNDS} (reference: `git archive | tar x` of the same commit)"
                ),
                ours: millis(ours),
                reference: millis(reference),
                ratio: ours.as_secs_f64() / reference.as_secs_f64(),
            });
        }
        if megabytes == 100 {
            let target = format!("{}/outputs", session.paths().work);
            let (checkout, _) = Checkout::resolve(&repo, None).await?;
            session
                .upload(&target, &mut checkout.archive(None).await?, 1 << 30, Duration::from_secs(600), &never)
                .await?;
            let (back, copy) = (scratch.join("downloaded"), scratch.join("reference-download"));
            let (mut ours, mut reference) = (Vec::new(), Vec::new());
            for _ in 0..TRANSFER_ROUNDS {
                settle()?;
                let started = Instant::now();
                session.download(&target, &back, 1 << 30, Duration::from_secs(600), &never).await?;
                ours.push(started.elapsed());
                std::fs::create_dir_all(&copy)?;
                settle()?;
                reference.push(timed_sh(&format!("tar -C '{target}' -cf - . | tar -C '{}' -xf -", copy.display()))?);
                for folder in [&back, &copy] {
                    std::fs::remove_dir_all(folder)?;
                }
            }
            std::fs::remove_dir_all(&target)?;
            let (ours, reference) = (median(&mut ours), median(&mut reference));
            rows.push(Row {
                what: format!("download of 100 MiB of outputs from a shell session, vetted, median of {TRANSFER_ROUNDS} (reference: `tar c | tar x` of the same tree)"),
                ours: millis(ours),
                reference: millis(reference),
                ratio: ours.as_secs_f64() / reference.as_secs_f64(),
            });
        }
    }
    Ok(rows)
}

/// Masking 64 MiB of output in 64 KiB chunks with 100 secrets and with none, against copying
/// the same chunks.
fn masking() -> anyhow::Result<Vec<Row>> {
    let secrets: Vec<String> =
        (0..100).map(|index| format!("secret-value-{index:03}-{}", "x".repeat(index % 17))).collect();
    // Tokens as a forge or a cloud hands them out: 40 random letters and digits each.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let tokens: Vec<String> = (0..100)
        .map(|_| {
            (0..40)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    alphabet[(seed % alphabet.len() as u64) as usize] as char
                })
                .collect()
        })
        .collect();
    let text_with = |secrets: &[String]| {
        let mut text = Vec::with_capacity(64 << 20);
        let mut line = 0usize;
        while text.len() < 64 << 20 {
            line += 1;
            if line.is_multiple_of(50) {
                text.extend_from_slice(format!("token {} in line {line}\n", secrets[line % 100]).as_bytes());
            } else {
                text.extend_from_slice(
                    format!("compiling crate number {line} with some ordinary output text\n").as_bytes(),
                );
            }
        }
        text
    };
    let (named_text, token_text) = (text_with(&secrets), text_with(&tokens));
    let mut rows = Vec::new();
    for (values, text, what) in [
        (&secrets[..], &named_text, "100 secrets"),
        (&tokens[..], &token_text, "100 random 40-character tokens"),
        (&[][..], &named_text, "no secret"),
    ] {
        let megabytes = text.len() as f64 / (1 << 20) as f64;
        let masker = Masker::new(values)?;
        // Best of five each, interleaved.
        let (mut ours, mut reference) = (Duration::MAX, Duration::MAX);
        let (mut masked, mut copied) = (0, 0);
        for _ in 0..5 {
            let started = Instant::now();
            let mut stream = masker.stream();
            let mut out = Vec::with_capacity(128 << 10);
            masked = 0;
            for chunk in text.chunks(64 << 10) {
                out.clear();
                stream.push_into(chunk, &mut out);
                masked += std::hint::black_box(&out).len();
            }
            masked += stream.finish().len();
            ours = ours.min(started.elapsed());
            let started = Instant::now();
            let mut out = Vec::with_capacity(128 << 10);
            copied = 0;
            for chunk in text.chunks(64 << 10) {
                out.clear();
                out.extend_from_slice(chunk);
                copied += std::hint::black_box(&out).len();
            }
            reference = reference.min(started.elapsed());
        }
        let expected = if values.is_empty() { masked == text.len() } else { masked < text.len() };
        if !expected || copied != text.len() {
            bail!("masking with {what} changed the wrong bytes, or the copy lost bytes");
        }
        rows.push(Row {
            what: format!(
                "masking 64 MiB of step output with {what}, 64 KiB chunks, best of 5 (reference: copying the chunks)"
            ),
            ours: format!("{:.0} MiB/s", megabytes / ours.as_secs_f64()),
            reference: format!("{:.0} MiB/s", megabytes / reference.as_secs_f64()),
            ratio: ours.as_secs_f64() / reference.as_secs_f64(),
        });
    }
    Ok(rows)
}

/// Starts an executor for the bench.
async fn executor(
    name: &str,
    program: &str,
    options: BTreeMap<String, String>,
) -> anyhow::Result<std::sync::Arc<ExecutorHost>> {
    let runner =
        RunnerInfo { name: "knotless-run".into(), version: env!("CARGO_PKG_VERSION").into(), id: "bench".into() };
    let process = ProcessSpec { name: name.into(), path: release_bin(program)?, pass_env: Vec::new() };
    Ok(ExecutorHost::start(HostConfig::new(process, runner, options)).await?)
}

/// A whole run of `steps` steps of `true`: start, the steps, stop.
async fn run_of(host: &std::sync::Arc<ExecutorHost>, session: &str, steps: usize) -> anyhow::Result<Duration> {
    let never = CancellationToken::new();
    let started = Instant::now();
    let params = StartParams {
        session: session.into(),
        run: RunInfo::default(),
        image: None,
        resources: Resources::default(),
        network: false,
        run_timeout_ms: Some(600_000),
        timeout_ms: 120_000,
        keep: false,
        services: Vec::new(),
    };
    let opened = host.open(params, &never).await?;
    for step in 0..steps {
        let params = CommandParams {
            session: session.into(),
            step: step as u32,
            name: format!("step-{step}"),
            script: "true".into(),
            env: BTreeMap::new(),
            secrets: BTreeMap::new(),
            workdir: None,
            timeout_ms: 60_000,
        };
        let result = opened.command(params, &never, |_| {}).await?;
        if result.exit_code != 0 {
            bail!("`true` exited with {}", result.exit_code);
        }
    }
    opened.stop(false, Duration::from_secs(120)).await?;
    Ok(started.elapsed())
}

/// API requests (counted by the fake API server, a watch once), processes the executor
/// started, and wall time of runs of 1 and 10 steps on the fake API server, against the same
/// runs through the shell executor.
async fn kubernetes(scratch: &Path) -> anyhow::Result<Vec<Row>> {
    let cluster = knotless_tests::cluster::FakeCluster::start(&["--grace", "1s"]);
    let options = BTreeMap::from([
        ("kubeconfig".to_string(), cluster.kubeconfig.display().to_string()),
        ("namespace".to_string(), "knotless-runs".to_string()),
        ("image".to_string(), "busybox".to_string()),
    ]);
    let kube = executor("kubernetes", "knotless-executor-kubernetes", options).await?;
    let shell_work = scratch.join("shell-work");
    let shell = executor(
        "shell",
        "knotless-executor-shell",
        BTreeMap::from([("work-dir".to_string(), shell_work.display().to_string())]),
    )
    .await?;
    let count = || cluster.requests()["requests"].as_u64().unwrap_or(0);
    let mut rows = Vec::new();
    for steps in [1, 10] {
        let before = count();
        let children = ChildWatch::start(kube.pid().await);
        let ours = run_of(&kube, &format!("bench-k8s-{steps}"), steps).await?;
        let spawned = children.stop();
        let used = count() - before;
        let reference = run_of(&shell, &format!("bench-shell-{steps}"), steps).await?;
        rows.push(Row {
            what: format!(
                "a run of {steps} step(s) on the fake API server: {used} API requests (bound: {}), \
                 {spawned} processes started by the executor (reference: the same run through the shell executor)",
                steps + 6
            ),
            ours: millis(ours),
            reference: millis(reference),
            ratio: ours.as_secs_f64() / reference.as_secs_f64(),
        });
    }
    kube.shutdown().await;
    shell.shutdown().await;
    Ok(rows)
}

/// Counts the distinct child processes a process had while it ran, by sampling
/// `/proc/PID/task/*/children` every millisecond on a thread of its own.
struct ChildWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl ChildWatch {
    fn start(pid: Option<u32>) -> ChildWatch {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            let Some(pid) = pid else { return 0 };
            while !flag.load(Ordering::Relaxed) {
                for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
                    let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
                    seen.extend(children.split_whitespace().map(str::to_string));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            seen.len()
        });
        ChildWatch { stop, thread }
    }

    fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or(usize::MAX)
    }
}

/// The most memory `knotless-run run` may hold, whatever a step or an executor sends.
const MEMORY_BOUND_MIB: f64 = 64.0;

/// How long one 100 MB line of step output may take through the runner.
const LONG_LINE_BOUND: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    /// `docs/benchmarks.md` is its tables and, for each figure that needs one, a short reason: no
    /// paragraph or list item outside a table reaches 1,500 characters.
    #[test]
    fn the_figures_notes_are_short() {
        let text = include_str!("../../../docs/benchmarks.md");
        let mut blocks: Vec<String> = Vec::new();
        let mut block = String::new();
        for line in text.lines() {
            if line.trim().is_empty() || line.starts_with('|') || line.starts_with("- ") || line.starts_with('#') {
                blocks.push(std::mem::take(&mut block));
            }
            if !line.starts_with('|') {
                block.push_str(line);
                block.push('\n');
            }
        }
        blocks.push(block);
        let long: Vec<String> = blocks
            .iter()
            .filter(|block| block.chars().count() >= 1500)
            .map(|block| {
                format!("{} characters: {}…", block.chars().count(), block.chars().take(80).collect::<String>())
            })
            .collect();
        assert!(blocks.len() > 10, "read {} blocks", blocks.len());
        assert!(long.is_empty(), "docs/benchmarks.md has long notes:\n{}", long.join("\n"));
    }
}
