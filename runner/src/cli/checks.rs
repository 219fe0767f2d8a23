//! `knotless-run checks REPO [REV]` lists a repository's checks (`--queue BRANCH`: its merge
//! queue and the batches' checks); `knotless-run logs RUN [--follow]` prints a run's log,
//! following it while the run goes.

use std::io::{Read as _, Seek as _, Write as _};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;

use super::daemon::StateArgs;
use crate::checks::{CheckRecord, CheckStore};
use crate::forge::{normalize_url, repository_key};
use crate::printable;
use crate::queue::{QueueState, QueueStore, render};

/// `checks` flags.
#[derive(Debug, Args)]
pub struct ChecksArgs {
    /// The repository: as the daemon watches it (path or URL), its key, or its name.
    #[arg(value_name = "REPO")]
    pub repository: String,
    /// Only the checks of this revision: a commit (or a prefix), a branch, or `pull/N`.
    #[arg(value_name = "REV")]
    pub rev: Option<String>,
    /// Show the merge queue of BRANCH instead: each queued pull's state and the batches' checks.
    #[arg(long, value_name = "BRANCH", conflicts_with = "rev")]
    pub queue: Option<String>,
    /// Print the records (or the queue) as JSON.
    #[arg(long)]
    pub json: bool,
    /// The state folder.
    #[command(flatten)]
    pub state: StateArgs,
}

/// `logs` flags.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The run's id.
    #[arg(value_name = "RUN")]
    pub run: String,
    /// Keep printing until the run ends.
    #[arg(long, short)]
    pub follow: bool,
    /// The state folder.
    #[command(flatten)]
    pub state: StateArgs,
}

/// Finds a repository's key among the stored ones.
fn resolve_key(store: &CheckStore, given: &str) -> anyhow::Result<String> {
    let keys = store.repository_keys();
    if keys.iter().any(|key| key == given) {
        return Ok(given.to_string());
    }
    let key = repository_key(&normalize_url(given));
    if keys.contains(&key) {
        return Ok(key);
    }
    let named: Vec<&String> =
        keys.iter().filter(|key| key.rsplit_once('-').is_some_and(|(name, _)| name == given)).collect();
    match named.as_slice() {
        [one] => Ok((*one).clone()),
        [] => bail!("no checks of repository {given} (known: {})", keys.join(", ")),
        _ => bail!(
            "repository {given} is ambiguous: {}",
            named.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The commit a revision names in the repository's mirror, when it names one.
fn resolve_rev(state: &Path, key: &str, rev: &str) -> Option<String> {
    let mirror = state.join("mirrors").join(format!("{key}.git"));
    let output = std::process::Command::new("git")
        .arg("-C")
        .arg(&mirror)
        .args(["rev-parse", "--verify", "--quiet", &format!("{rev}^{{commit}}")])
        .output()
        .ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn matches(record: &CheckRecord, rev: &str, commit: Option<&str>) -> bool {
    if let Some(number) = rev.strip_prefix("pull/") {
        return record.target.pull.is_some_and(|pull| pull.to_string() == number);
    }
    let commits = [Some(record.target.commit.as_str()), record.target.head.as_deref()];
    commits.into_iter().flatten().any(|candidate| Some(candidate) == commit || candidate.starts_with(rev))
}

/// Runs `checks`.
pub async fn checks(args: ChecksArgs) -> anyhow::Result<ExitCode> {
    let store = CheckStore::new(&args.state.state);
    if let Some(branch) = &args.queue {
        // A queue can be kept before any check of its repository (a pull ejected before its
        // pre-flights ran), and an empty one is shown under the repository's normalized name.
        let key =
            resolve_key(&store, &args.repository).unwrap_or_else(|_| repository_key(&normalize_url(&args.repository)));
        let records = store.list(&key).unwrap_or_default();
        let queue = QueueStore::new(&args.state.state).load(&key, branch)?.unwrap_or_else(|| QueueState {
            repository: normalize_url(&args.repository),
            branch: branch.clone(),
            ..QueueState::default()
        });
        let mut stdout = std::io::stdout().lock();
        if args.json {
            writeln!(stdout, "{}", serde_json::to_string_pretty(&queue)?)?;
        } else {
            write!(stdout, "{}", render(&queue, &records))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let key = resolve_key(&store, &args.repository)?;
    let mut records = store.list(&key)?;
    if let Some(rev) = &args.rev {
        let commit = resolve_rev(&args.state.state, &key, rev);
        records.retain(|record| matches(record, rev, commit.as_deref()));
    }
    let mut stdout = std::io::stdout().lock();
    if args.json {
        writeln!(stdout, "{}", serde_json::to_string_pretty(&records)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if records.is_empty() {
        writeln!(stdout, "no checks")?;
    }
    for record in &records {
        let target = match record.target.pull {
            Some(number) => format!("pull/{number}"),
            None => record.target.git_ref.trim_start_matches("refs/heads/").to_string(),
        };
        let short: String = record.target.commit.chars().take(10).collect();
        let time = record.duration_ms.map(|ms| format!(" in {ms} ms")).unwrap_or_default();
        writeln!(
            stdout,
            "{}  {}  {} {}  {}{time}",
            printable::name(&record.run_id),
            printable::name(&record.workflow),
            printable::name(&target),
            short,
            record.status.as_str()
        )?;
        for step in &record.steps {
            let exit = step.exit_code.map(|code| format!("exit {code}")).unwrap_or_else(|| "no exit code".into());
            writeln!(
                stdout,
                "    step {}: {}, {exit}, {} ms",
                printable::name(&step.name),
                step.status.as_str(),
                step.duration_ms
            )?;
        }
        for cache in &record.caches {
            let warm = if cache.warm { "warm" } else { "cold" };
            writeln!(
                stdout,
                "    cache {}: {warm}, {}",
                printable::name(&cache.path),
                printable::name(&cache.outcome)
            )?;
        }
        for output in &record.outputs {
            let image = if output.image { " (image)" } else { "" };
            writeln!(stdout, "    output {}: {} bytes{image}", printable::name(&output.path), output.bytes)?;
        }
        if let Some(cause) = &record.cause {
            writeln!(stdout, "    cause: {}", printable::name(cause))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `logs`.
pub async fn logs(args: LogsArgs) -> anyhow::Result<ExitCode> {
    let store = CheckStore::new(&args.state.state);
    let Some(record) = store.find(&args.run) else {
        bail!("no run {} under {}", args.run, args.state.state.display());
    };
    let path = store.log_path(&record.repository_key, &record.run_id);
    let mut offset = 0u64;
    let mut stdout = std::io::stdout();
    loop {
        // Read by path each time: the final log replaces the live file by a rename.
        let finished = store.get(&record.repository_key, &record.run_id).map(|r| r.status.is_final()).unwrap_or(true);
        if let Ok(mut file) = std::fs::File::open(&path) {
            file.seek(std::io::SeekFrom::Start(offset)).with_context(|| format!("cannot read {}", path.display()))?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).with_context(|| format!("cannot read {}", path.display()))?;
            // Only whole lines are shown, escaped; the rest waits for its newline.
            let whole =
                if finished { bytes.len() } else { bytes.iter().rposition(|&b| b == b'\n').map_or(0, |end| end + 1) };
            offset += whole as u64;
            stdout.write_all(printable::log(&bytes[..whole]).as_bytes())?;
            stdout.flush()?;
        }
        if !args.follow || finished {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
