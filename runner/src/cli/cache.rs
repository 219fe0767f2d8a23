//! `knotless-run cache list` and `cache prune`: the caches `run` keeps under the user's cache
//! folder (`~/.cache/knotless/caches`), one archive per repository, workflow, executor and
//! image, trust level and cache path; what each holds and when it was last used, and removing
//! those no workflow uses any more or none used for long.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};

use crate::printable;

/// `cache` subcommands.
#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// List the caches of the repository at PATH (or of every repository with --all): its
    /// workflow, executor and image, trust, path, size and last use.
    List(ListArgs),
    /// Remove the caches of the repository at PATH whose workflow it no longer has, and with
    /// --unused-for those not used for that long; with --all, of every repository.
    Prune(PruneArgs),
}

/// `cache list` flags.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// A folder of the repository.
    #[arg(default_value = ".", conflicts_with = "all")]
    pub path: PathBuf,
    /// Every repository's caches.
    #[arg(long)]
    pub all: bool,
}

/// `cache prune` flags.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// A folder of the repository.
    #[arg(default_value = ".", conflicts_with = "all")]
    pub path: PathBuf,
    /// Every repository's caches: those not used for --unused-for, or without it all of them.
    #[arg(long)]
    pub all: bool,
    /// Also remove the caches not used for this long (`30d`, `12h`).
    #[arg(long, value_name = "DURATION", value_parser = parse_age)]
    pub unused_for: Option<Duration>,
    /// Say what would be removed, and remove nothing.
    #[arg(long, short = 'n')]
    pub dry_run: bool,
}

fn parse_age(text: &str) -> Result<Duration, String> {
    crate::workflow::parse_duration(text).ok_or_else(|| format!("{text} is not a duration: expected e.g. 30d, 12h"))
}

/// One kept archive.
#[derive(Debug)]
struct Entry {
    file: PathBuf,
    repository: String,
    workflow: String,
    executor: String,
    image: String,
    trust: String,
    path: String,
    bytes: u64,
    used: Option<SystemTime>,
}

/// Every archive under `store` (`caches/`), of `repository` alone when given. The store's own
/// folders (`.upper`, `.owners`: the layers of runs under way and their owners) are not caches.
fn entries(store: &Path, repository: Option<&str>) -> Vec<Entry> {
    let folders = |dir: &Path| -> Vec<(String, PathBuf)> {
        let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
            .filter_map(|entry| Some((entry.file_name().into_string().ok()?, entry.path())))
            .filter(|(name, _)| !name.starts_with('.'))
            .collect();
        found.sort();
        found
    };
    let mut all = Vec::new();
    for (repo, repo_dir) in folders(store) {
        if repository.is_some_and(|wanted| wanted != repo) {
            continue;
        }
        for (key, key_dir) in folders(&repo_dir) {
            // `NAME@EXECUTOR[@IMAGE]`; a bare name is a cache kept before caches were kept per
            // executor.
            let mut parts = key.splitn(3, '@');
            let workflow = parts.next().unwrap_or_default().to_string();
            let executor = parts.next().unwrap_or("-").to_string();
            let image = parts
                .next()
                .map_or("-".to_string(), |image| image.rsplit_once('-').map_or(image, |(name, _)| name).to_string());
            for (trust, trust_dir) in folders(&key_dir) {
                for file in std::fs::read_dir(&trust_dir).into_iter().flatten().flatten() {
                    let name = file.file_name().to_string_lossy().into_owned();
                    let Some(stem) = name.strip_suffix(".tar") else { continue };
                    let Ok(metadata) = file.metadata() else { continue };
                    if !metadata.is_file() {
                        continue;
                    }
                    all.push(Entry {
                        file: file.path(),
                        repository: repo.clone(),
                        workflow: workflow.clone(),
                        executor: executor.clone(),
                        image: image.clone(),
                        trust: trust.clone(),
                        path: stem.rsplit_once('-').map_or(stem, |(path, _)| path).to_string(),
                        bytes: metadata.len(),
                        used: metadata.modified().ok(),
                    });
                }
            }
        }
    }
    all
}

fn age(used: Option<SystemTime>) -> String {
    match used.and_then(|used| SystemTime::now().duration_since(used).ok()) {
        None => "-".to_string(),
        Some(age) if age < Duration::from_secs(120) => "just now".to_string(),
        Some(age) if age < Duration::from_secs(2 * 3600) => format!("{} min ago", age.as_secs() / 60),
        Some(age) if age < Duration::from_secs(2 * 86_400) => format!("{} h ago", age.as_secs() / 3600),
        Some(age) => format!("{} d ago", age.as_secs() / 86_400),
    }
}

/// The repository folder of the repository at `path`, as `run` names its caches.
async fn repository_of(path: &Path) -> anyhow::Result<(String, Option<Vec<String>>)> {
    let (checkout, info) = crate::checkout::Checkout::resolve(path, None).await?;
    let folder = super::run::repository_folder(checkout.root(), &info.repository);
    let (workflows, errors) = checkout.workflows().await?;
    // A workflow that does not load may still be the one a cache is for: nothing is known gone.
    let names = errors.is_empty().then(|| workflows.into_iter().map(|workflow| workflow.name).collect());
    Ok((folder, names))
}

/// Runs the subcommand.
pub async fn main(command: CacheCommand) -> anyhow::Result<ExitCode> {
    let store = super::run::cache_home().join("caches");
    match command {
        CacheCommand::List(args) => list(&store, &args).await,
        CacheCommand::Prune(args) => prune(&store, &args).await,
    }
}

/// `cache list`: a row a cache, and their count and size.
async fn list(store: &Path, args: &ListArgs) -> anyhow::Result<ExitCode> {
    let repository = if args.all { None } else { Some(repository_of(&args.path).await?.0) };
    let found = entries(store, repository.as_deref());
    if found.is_empty() {
        crate::say!("no cache in {}", printable::name(&store.display().to_string()));
        return Ok(ExitCode::SUCCESS);
    }
    let mut rows = vec![
        ["repository", "workflow", "executor", "image", "trust", "path", "size", "used"].map(String::from).to_vec(),
    ];
    let mut total = 0;
    for entry in &found {
        total += entry.bytes;
        rows.push(vec![
            printable::name(&entry.repository).into_owned(),
            printable::name(&entry.workflow).into_owned(),
            printable::name(&entry.executor).into_owned(),
            printable::name(&entry.image).into_owned(),
            printable::name(&entry.trust).into_owned(),
            printable::name(&entry.path).into_owned(),
            printable::size(entry.bytes),
            age(entry.used),
        ]);
    }
    for line in super::run::table(&rows) {
        crate::say!("{line}");
    }
    crate::say!(
        "{} cache(s), {} in {}",
        found.len(),
        printable::size(total),
        printable::name(&store.display().to_string())
    );
    Ok(ExitCode::SUCCESS)
}

/// `cache prune`: removes (or with `--dry-run` names) each cache the flags select, with why.
async fn prune(store: &Path, args: &PruneArgs) -> anyhow::Result<ExitCode> {
    let (repository, workflows) = if args.all {
        (None, None)
    } else {
        let (folder, workflows) = repository_of(&args.path).await?;
        (Some(folder), workflows)
    };
    let now = SystemTime::now();
    let mut removed = (0usize, 0u64);
    for entry in entries(store, repository.as_deref()) {
        let unused = args.unused_for.is_some_and(|limit| {
            entry.used.and_then(|used| now.duration_since(used).ok()).is_some_and(|age| age > limit)
        });
        let reason = if args.all && args.unused_for.is_none() {
            Some("--all".to_string())
        } else if workflows.as_ref().is_some_and(|names| !names.contains(&entry.workflow)) {
            Some(format!("no workflow {} any more", printable::name(&entry.workflow)))
        } else if unused {
            Some(format!("last used {}", age(entry.used)))
        } else {
            None
        };
        let Some(reason) = reason else { continue };
        let shown = format!(
            "{}/{} ({}, {}, {}): {reason}",
            printable::name(&entry.repository),
            printable::name(&entry.workflow),
            printable::name(&entry.path),
            printable::name(&entry.executor),
            printable::size(entry.bytes)
        );
        if args.dry_run {
            crate::say!("would remove {shown}");
        } else if !remove(store, &entry, &shown) {
            continue;
        }
        removed = (removed.0 + 1, removed.1 + entry.bytes);
    }
    let verb = if args.dry_run { "would free" } else { "freed" };
    crate::say!("{} cache(s), {verb} {}", removed.0, printable::size(removed.1));
    Ok(ExitCode::SUCCESS)
}

/// Removes a cache, saying so, and the folders it leaves empty (a folder another run fills
/// meanwhile stays); false when it was not removed here (pruned meanwhile by another, which
/// needs no word, or not removable, which is said).
fn remove(store: &Path, entry: &Entry, shown: &str) -> bool {
    match std::fs::remove_file(&entry.file) {
        Ok(()) => crate::say!("removed {shown}"),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return false,
        Err(error) => {
            crate::say_err!("knotless-run: cannot remove {}: {error}", entry.file.display());
            return false;
        }
    }
    let mut dir = entry.file.parent();
    while let Some(folder) = dir.filter(|folder| *folder != store && folder.starts_with(store)) {
        if std::fs::remove_dir(folder).is_err() {
            break;
        }
        dir = folder.parent();
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_archive_is_read_back_as_its_workflow_executor_image_trust_and_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = dir.path();
        let key = super::super::run::cache_key("test (3.11)", "docker", Some("python:3.11-slim"));
        for (repo, key, file) in [
            ("app-1a2b", key.as_str(), "deps-00000000000000ab.tar"),
            ("app-1a2b", "old", "target-00000000000000cd.tar"),
            ("other-3c4d", "ci@shell", "x-00000000000000ef.tar"),
        ] {
            let folder = store.join(repo).join(key).join("trusted");
            std::fs::create_dir_all(&folder).expect("mkdir");
            std::fs::write(folder.join(file), b"tar").expect("write");
        }
        // A run's layer under way is not a cache.
        std::fs::create_dir_all(store.join(".upper/run-1/0")).expect("mkdir");
        let found = entries(store, Some("app-1a2b"));
        assert_eq!(found.len(), 2, "{found:?}");
        let new = found.iter().find(|entry| entry.executor == "docker").expect("the docker cache");
        assert_eq!(
            (new.workflow.as_str(), new.image.as_str(), new.trust.as_str(), new.path.as_str(), new.bytes),
            ("test (3.11)", "python_3.11-slim", "trusted", "deps", 3)
        );
        let old = found.iter().find(|entry| entry.workflow == "old").expect("the old cache");
        assert_eq!((old.executor.as_str(), old.image.as_str()), ("-", "-"));
        assert_eq!(entries(store, None).len(), 3);
    }
}
