//! `knotless-run checks REPO [REV]` lists a repository's checks (`--queue BRANCH`: its merge
//! queue and the batches' checks).

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;

use super::daemon::StateArgs;
use crate::checks::{CheckRecord, CheckStore};
use crate::forge::{normalize_url, repository_key, repository_name};
use crate::git::Git;
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

/// Finds a repository's key among the stored ones: `given` as a key; as the daemon watches it
/// (a path or URL), with or without `.git` (a bare repository goes by either); else by its
/// name (`origin` and `origin.git` both name the repository of key `origin-1a2b3c4d`).
fn resolve_key(store: &CheckStore, given: &str) -> anyhow::Result<String> {
    let keys = store.repository_keys();
    if keys.iter().any(|key| key == given) {
        return Ok(given.to_string());
    }
    let stem = given.trim_end_matches('/');
    let other = match stem.strip_suffix(".git") {
        Some(bare) => bare.to_string(),
        None => format!("{stem}.git"),
    };
    for watched in [given, other.as_str()] {
        let key = repository_key(&normalize_url(watched));
        if keys.contains(&key) {
            return Ok(key);
        }
    }
    let name = repository_name(given);
    let named: Vec<&String> =
        keys.iter().filter(|key| key.rsplit_once('-').is_some_and(|(key_name, _)| key_name == name)).collect();
    match named.as_slice() {
        [one] => Ok((*one).clone()),
        [] if keys.is_empty() => bail!("no checks of repository {}: no repository has any", printable::name(given)),
        [] => {
            bail!("no checks of repository {} (known: {})", printable::name(given), printable::name(&keys.join(", ")))
        }
        _ => bail!(
            "repository {} is ambiguous: {}; give one of these keys",
            printable::name(given),
            named.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The commit a revision names in the repository's mirror, when it names one.
async fn resolve_rev(state: &Path, key: &str, rev: &str) -> Option<String> {
    let mirror = state.join("mirrors").join(format!("{key}.git"));
    Git::in_folder(&mirror).line(&["rev-parse", "--verify", "--quiet", &format!("{rev}^{{commit}}")]).await.ok()
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
        return queue(&args, &store, branch);
    }
    let key = resolve_key(&store, &args.repository)?;
    let (mut records, unreadable) = store.list_readable(&key)?;
    for error in &unreadable {
        eprintln!("warning: skipped a check: {}", crate::printable::name(&format!("{error:#}")));
    }
    if let Some(rev) = &args.rev {
        let commit = resolve_rev(&args.state.state, &key, rev).await;
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
        write_record(&mut stdout, record)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `checks --queue BRANCH`: the merge queue of the branch, with its entries' checks.
fn queue(args: &ChecksArgs, store: &CheckStore, branch: &str) -> anyhow::Result<ExitCode> {
    // A queue can be kept before any check of its repository (a pull ejected before its
    // pre-flights ran), and an empty one is shown under the repository's normalized name.
    let key = resolve_key(store, &args.repository).unwrap_or_else(|_| repository_key(&normalize_url(&args.repository)));
    let records = store.list(&key).unwrap_or_default();
    let queue = QueueStore::new(&args.state.state).load(&key, branch)?.unwrap_or_else(|| QueueState {
        repository: normalize_url(&args.repository),
        branch: branch.to_string(),
        ..QueueState::default()
    });
    let mut stdout = std::io::stdout().lock();
    if args.json {
        writeln!(stdout, "{}", serde_json::to_string_pretty(&queue)?)?;
    } else {
        write!(stdout, "{}", render(&queue, &records))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One check as `checks` lists it: a line, then a line for each of its steps, caches, outputs
/// and its cause.
fn write_record(stdout: &mut impl std::io::Write, record: &CheckRecord) -> std::io::Result<()> {
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
        let reason = step.reason.as_ref().map(|reason| format!(" ({})", printable::name(reason))).unwrap_or_default();
        writeln!(
            stdout,
            "    step {}: {}{reason}, {exit}, {} ms",
            printable::name(&step.name),
            step.status.as_str(),
            step.duration_ms
        )?;
    }
    if let Some(repeated) = &record.reruns {
        writeln!(stdout, "    repeats run {}", printable::name(repeated))?;
    }
    for again in &record.run_again_as {
        writeln!(stdout, "    run again as run {}", printable::name(again))?;
    }
    for cache in &record.caches {
        let warm = if cache.warm { "warm" } else { "cold" };
        writeln!(stdout, "    cache {}: {warm}, {}", printable::name(&cache.path), printable::name(&cache.outcome))?;
    }
    if let Some(dir) = record.outputs_dir.as_ref().filter(|_| !record.outputs.is_empty()) {
        writeln!(stdout, "    outputs: {}", printable::name(&dir.display().to_string()))?;
    }
    for output in &record.outputs {
        let image = if output.image { " (image)" } else { "" };
        writeln!(stdout, "    output {}: {} bytes{image}", printable::name(&output.path), output.bytes)?;
    }
    if let Some(cause) = &record.cause {
        writeln!(stdout, "    cause: {}", printable::name(cause))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store with checks of the repositories watched as `watched`.
    fn store_of(state: &Path, watched: &[&str]) -> CheckStore {
        for url in watched {
            std::fs::create_dir_all(state.join("checks").join(repository_key(&normalize_url(url)))).expect("mkdir");
        }
        CheckStore::new(state)
    }

    #[test]
    fn a_bare_repository_is_found_with_or_without_dot_git() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bare = dir.path().join("origin.git");
        std::fs::create_dir(&bare).expect("mkdir");
        let bare = bare.display().to_string();
        let store = store_of(&dir.path().join("state"), &[&bare]);
        let key = repository_key(&normalize_url(&bare));
        let without = bare.strip_suffix(".git").expect("a .git path").to_string();
        for given in [bare.as_str(), &format!("{bare}/"), &without, "origin", "origin.git", &key, "file:///x/origin"] {
            assert_eq!(resolve_key(&store, given).expect(given), key, "{given}");
        }
        // Watched without `.git` (a file:// URL git completes), found by the path with it.
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store_of(&dir.path().join("state"), &["file:///srv/git/origin"]);
        assert!(resolve_key(&store, "/srv/git/origin.git").is_ok_and(|found| found.starts_with("origin-")));
    }

    #[test]
    fn an_unknown_or_ambiguous_name_is_refused_escaped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = CheckStore::new(&dir.path().join("nothing"));
        let error = resolve_key(&empty, "a\nb\x1b").expect_err("none").to_string();
        assert_eq!(error, "no checks of repository a\\nb\\x1b: no repository has any");
        let error = resolve_key(&empty, "evil\n\u{1b}[2J").expect_err("none").to_string();
        assert!(!error.contains('\n') && !error.contains('\u{1b}'), "{error}");
        let store = store_of(&dir.path().join("state"), &["/one/demo", "/two/demo.git"]);
        let error = resolve_key(&store, "demo").expect_err("two").to_string();
        assert!(error.starts_with("repository demo is ambiguous: demo-"), "{error}");
        let error = resolve_key(&store, "other").expect_err("none").to_string();
        assert!(error.starts_with("no checks of repository other (known: demo-"), "{error}");
        // Exactly as watched, each of the two is found.
        assert_ne!(resolve_key(&store, "/one/demo").expect("one"), resolve_key(&store, "/two/demo.git").expect("two"));
    }
}
