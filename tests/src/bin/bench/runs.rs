//! Whole `knotless-run run` processes: their time from start to exit against the steps' own,
//! and their peak memory while a step floods its output.

use super::*;

/// What one `knotless-run run` took: its wall time and its peak resident memory.
pub(super) struct Measured {
    elapsed: Duration,
    peak_mib: f64,
}

/// Where a measured command's stdout goes.
#[derive(Clone, Copy)]
pub(super) enum Sink<'a> {
    /// Discarded.
    Null,
    /// A file.
    File(&'a Path),
    /// A pipe that a thread of the bench reads and drops, as a terminal would take it.
    Pipe,
}

impl Sink<'_> {
    fn stdio(self) -> anyhow::Result<Stdio> {
        Ok(match self {
            Sink::Null => Stdio::null(),
            Sink::File(path) => Stdio::from(std::fs::File::create(path)?),
            Sink::Pipe => Stdio::piped(),
        })
    }
}

/// Runs `command` to its end with its stdout going to `sink`, timed to its exit, while a
/// thread samples its peak resident memory (`VmHWM`, which only grows) every 10 ms.
pub(super) fn measure(mut command: std::process::Command, sink: Sink<'_>) -> anyhow::Result<Measured> {
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    use std::sync::atomic::{AtomicBool, Ordering};
    let started = Instant::now();
    let mut child = command.stdin(Stdio::null()).stdout(sink.stdio()?).stderr(Stdio::null()).spawn()?;
    let drain = child
        .stdout
        .take()
        .map(|mut stdout| std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()).unwrap_or(0)));
    let exited = std::sync::Arc::new(AtomicBool::new(false));
    let sampler = {
        let status = format!("/proc/{}/status", child.id());
        let exited = exited.clone();
        std::thread::spawn(move || {
            let mut peak_kib = 0u64;
            while !exited.load(Ordering::Acquire) {
                if let Ok(text) = std::fs::read_to_string(&status) {
                    let hwm = text
                        .lines()
                        .find_map(|line| line.strip_prefix("VmHWM:"))
                        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
                    peak_kib = peak_kib.max(hwm.unwrap_or(0));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            peak_kib
        })
    };
    // Waited for without being collected: its pid, which the sampler reads, stays its own
    // until the sampler has stopped.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id())?);
    let waited = waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT);
    if let Some(drain) = drain {
        let _ = drain.join();
    }
    let elapsed = started.elapsed();
    exited.store(true, Ordering::Release);
    let peak_kib = sampler.join().map_err(|_| anyhow::anyhow!("the memory sampler panicked"))?;
    let code = child.wait()?.code();
    waited?;
    if code != Some(0) {
        bail!("{command:?} exited with {code:?}");
    }
    Ok(Measured { elapsed, peak_mib: peak_kib as f64 / 1024.0 })
}

/// `knotless-run run` on `repo`'s workflow `workflow` with the executor `executor`
/// (`--executor-plugin`), its stdout to `sink`.
pub(super) fn measure_run_to(
    repo: &Path,
    workflow: &str,
    executor: &Path,
    work: &Path,
    sink: Sink<'_>,
) -> anyhow::Result<Measured> {
    let mut command = std::process::Command::new(release_bin("knotless-run")?);
    command
        .arg("run")
        .arg(repo)
        .args(["--workflow", workflow, "--executor-plugin"])
        .arg(executor)
        .arg("--executor-option")
        .arg(format!("work-dir={}", work.display()));
    measure(command, sink)
}

pub(super) fn measure_run(repo: &Path, workflow: &str, executor: &Path, work: &Path) -> anyhow::Result<Measured> {
    measure_run_to(repo, workflow, executor, work, Sink::Null)
}

/// A git repository at `repo` with one workflow per `(name, script)`, each one step.
pub(super) fn workflows_repo(repo: &Path, workflows: &[(&str, String)]) -> anyhow::Result<()> {
    let folder = repo.join(".knotless/workflows");
    std::fs::create_dir_all(&folder)?;
    let git = std::process::Command::new("git").args(["init", "-q"]).arg(repo).status()?;
    if !git.success() {
        bail!("git init failed");
    }
    for (name, yaml) in workflows {
        std::fs::write(folder.join(format!("{name}.yml")), yaml)?;
    }
    Ok(())
}

/// Whole runs through `knotless-run run` and the shell executor: 100 trivial steps against
/// one step's run plus 99 `sh -c true`; 200 MB of 60-byte lines of step output to a file and
/// to a pipe, against the step's script writing to the same.
pub(super) fn runs(scratch: &Path) -> anyhow::Result<Vec<Row>> {
    const LINES: &str = "yes \"$(printf '%059d' 0)\" | head -c 200000000";
    const OUTPUT_MB: f64 = 200.0;
    let repo = scratch.join("runs-repo");
    let hundred: String = (0..100).map(|step| format!("  - name: s{step}\n    run: 'true'\n")).collect();
    workflows_repo(
        &repo,
        &[
            ("one", "steps:\n  - name: s0\n    run: 'true'\n".to_string()),
            ("hundred", format!("steps:\n{hundred}")),
            ("lines", format!("steps:\n  - name: lines\n    run: {LINES}\n")),
        ],
    )?;
    let shell = release_bin("knotless-executor-shell")?;
    let work = scratch.join("runs-work");
    let mut rows = Vec::new();
    // Medians of five, interleaved.
    let (mut ours, mut reference) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        ours.push(measure_run(&repo, "hundred", &shell, &work)?.elapsed);
        let fixed = measure_run(&repo, "one", &shell, &work)?.elapsed;
        let started = Instant::now();
        for _ in 0..99 {
            let status = std::process::Command::new("sh").args(["-c", "true"]).status()?;
            if !status.success() {
                bail!("sh -c true failed");
            }
        }
        reference.push(fixed + started.elapsed());
    }
    let (ours, reference) = (median(&mut ours), median(&mut reference));
    rows.push(Row {
        what: "a run of 100 trivial steps through `knotless-run run` and the shell executor, median of 5 (reference: a run of one such step plus 99 `sh -c true`)".into(),
        ours: millis(ours),
        reference: millis(reference),
        ratio: ours.as_secs_f64() / reference.as_secs_f64(),
    });
    let file = scratch.join("runs-output.txt");
    for (sink, what) in [(Sink::File(&file), "a file"), (Sink::Pipe, "a pipe")] {
        let (mut ours, mut reference) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            ours.push(measure_run_to(&repo, "lines", &shell, &work, sink)?.elapsed);
            let mut script = std::process::Command::new("sh");
            script.args(["-c", LINES]);
            reference.push(measure(script, sink)?.elapsed);
        }
        let (ours, reference) = (median(&mut ours), median(&mut reference));
        rows.push(Row {
            what: format!(
                "200 MB of step output in 60-byte lines through `knotless-run run` to {what}, whole run, median of 3 (reference: the step's script to {what})"
            ),
            ours: format!("{:.0} MB/s", OUTPUT_MB / ours.as_secs_f64()),
            reference: format!("{:.0} MB/s", OUTPUT_MB / reference.as_secs_f64()),
            ratio: ours.as_secs_f64() / reference.as_secs_f64(),
        });
    }
    let _ = std::fs::remove_file(&file);
    Ok(rows)
}

/// The runner's peak memory for a flood of short lines, one huge line, and a huge line of
/// executor stderr, each against the bound; and the huge line's time against its script's
/// own time to `/dev/null`.
pub(super) fn memory(scratch: &Path) -> anyhow::Result<Vec<Row>> {
    const LINES: &str = "yes \"$(printf '%059d' 0)\" | head -c 1000000000";
    const LONG_LINE: &str = "head -c 100000000 /dev/zero | tr '\\0' a";
    let repo = scratch.join("memory-repo");
    let workflows = repo.join(".knotless/workflows");
    std::fs::create_dir_all(&workflows)?;
    let git = std::process::Command::new("git").args(["init", "-q"]).arg(&repo).status()?;
    if !git.success() {
        bail!("git init failed");
    }
    for (name, script) in [("lines", LINES), ("long-line", LONG_LINE), ("quiet", "true")] {
        std::fs::write(
            workflows.join(format!("{name}.yml")),
            format!("steps:\n  - name: {name}\n    run: {script}\n"),
        )?;
    }
    let shell = release_bin("knotless-executor-shell")?;
    // An executor that writes 300 MB on stderr in one line before it serves.
    let noisy = scratch.join("noisy-executor");
    std::fs::write(
        &noisy,
        format!("#!/bin/sh\nhead -c 300000000 /dev/zero | tr '\\0' e >&2\nexec '{}' \"$@\"\n", shell.display()),
    )?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&noisy, std::fs::Permissions::from_mode(0o755))?;
    }
    let work = scratch.join("memory-work");
    let lines = measure_run(&repo, "lines", &shell, &work)?;
    let long_line = measure_run(&repo, "long-line", &shell, &work)?;
    let stderr = measure_run(&repo, "quiet", &noisy, &work)?;
    let checkout = measure_run(&repo_of(scratch, 1024)?, "quiet", &shell, &work)?;
    let started = Instant::now();
    let status = std::process::Command::new("sh").args(["-c", LONG_LINE]).stdout(Stdio::null()).status()?;
    if !status.success() {
        bail!("the long line's script failed");
    }
    let script_alone = started.elapsed();
    let bound = format!("bound {MEMORY_BOUND_MIB:.0} MiB");
    let row = |what: &str, measured: &Measured| Row {
        what: format!("peak memory of `knotless-run run`, {what}"),
        ours: format!("{:.1} MiB in {:.1} s", measured.peak_mib, measured.elapsed.as_secs_f64()),
        reference: bound.clone(),
        ratio: measured.peak_mib / MEMORY_BOUND_MIB,
    };
    let mut rows = vec![
        row("1 GB of step output in 60-byte lines", &lines),
        row("one 100 MB line of step output", &long_line),
        row("an executor writing 300 MB on stderr in one line", &stderr),
        row("a checkout of 1 GiB from a git repository's working tree", &checkout),
    ];
    rows.push(Row {
        what: format!(
            "one 100 MB line of step output through `knotless-run run`, whole run (reference: the step's script to /dev/null; bound {} s)",
            LONG_LINE_BOUND.as_secs()
        ),
        ours: millis(long_line.elapsed),
        reference: millis(script_alone),
        ratio: long_line.elapsed.as_secs_f64() / script_alone.as_secs_f64(),
    });
    Ok(rows)
}
