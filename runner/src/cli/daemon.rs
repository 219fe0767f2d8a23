//! `knotless-run [OPTIONS] REPO...`: the daemon over the embedded git forge.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;

use super::ExecutorArgs;
use crate::cache::CacheStore;
use crate::daemon::{Daemon, DaemonConfig};
use crate::forge::{GitForge, GitForgeConfig};
use crate::host::ExecutorHost;

/// The state folder's default.
pub const DEFAULT_STATE: &str = "/var/lib/knotless";

/// The state folder flag, shared by the daemon and the commands that read its state.
#[derive(Debug, Clone, Args)]
pub struct StateArgs {
    /// The state folder: state.json, secrets-key.json, checks, caches, mirrors, work folders.
    #[arg(long, value_name = "DIR", env = "KNOTLESS_STATE", default_value = DEFAULT_STATE)]
    pub state: PathBuf,
}

/// The daemon's flags.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// Repositories to watch: paths, file:// or ssh:// URLs (anything git can fetch).
    #[arg(value_name = "REPO")]
    pub repositories: Vec<String>,
    /// Also watch every repository under DIR whose .knotless/repository.yml (on its default
    /// branch) names this runner in `runners:`.
    #[arg(long, value_name = "DIR")]
    pub discover: Option<PathBuf>,
    /// With --discover: the runner of repositories whose record names none (or that have no
    /// record); this runner watches them when ID is its own id.
    #[arg(long, value_name = "ID")]
    pub default_runner: Option<String>,
    /// Run pull requests (refs/pulls/<n>/head), merged with their base.
    #[arg(long)]
    pub pulls: bool,
    /// Land merge queues (refs/queue/<branch>/<n>) of the repositories this runner is the
    /// lander of: pre-flights, batches, landing.
    #[arg(long)]
    pub queue: bool,
    /// Allow the shell executor, which isolates nothing, to run pulls and queue batches.
    #[arg(long)]
    pub force_shell: bool,
    /// Seconds between fetches of each repository (`knotless-run notify` wakes it at once).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub poll: u64,
    /// How many runs at once.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub concurrency: usize,
    /// NAME=value lines (or a YAML mapping) of secrets granted to push runs; mode 0600; its
    /// values win over sealed ones.
    #[arg(long, value_name = "PATH")]
    pub secrets_file: Option<PathBuf>,
    /// The largest cache archive kept, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 30)]
    pub cache_max: u64,
    /// Fail a run when fewer bytes are free under the state folder.
    #[arg(long, value_name = "BYTES", default_value_t = 256 << 20)]
    pub disk_floor: u64,
    /// The state folder.
    #[command(flatten)]
    pub state: StateArgs,
    /// The executor (kubernetes unless --executor or --executor-plugin says otherwise).
    #[command(flatten)]
    pub executor: ExecutorArgs,
    /// The status page.
    #[command(flatten)]
    pub http: super::http_args::HttpArgs,
}

/// This host's name as a runner id: its safe characters, at most 63.
fn host_runner_id() -> String {
    let name = nix::unistd::gethostname().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let safe: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).take(63).collect();
    if safe.is_empty() { "knotless".to_string() } else { safe }
}

/// The subcommands, named when a REPO looks like a mistyped one.
const SUBCOMMANDS: &str = "run, plugin, checks, logs, notify, secrets, kubeconfig";

/// Refuses a REPO that is neither a URL (`scheme://`, or `host:path` as git takes it) nor a
/// path that exists: most often a mistyped subcommand, which must not start the daemon.
fn check_repository(repository: &str) -> anyhow::Result<()> {
    let url = repository.contains("://") || repository.split_once(':').is_some_and(|(host, _)| !host.contains('/'));
    if url || std::path::Path::new(repository).exists() {
        return Ok(());
    }
    bail!(
        "{repository:?} is not a repository (no such path, and not a URL) nor a subcommand: \
         the subcommands are {SUBCOMMANDS} (knotless-run --help)"
    )
}

/// Runs the daemon.
pub async fn main(mut args: DaemonArgs) -> anyhow::Result<ExitCode> {
    if args.repositories.is_empty() && args.discover.is_none() {
        bail!("give repositories to watch (REPO...) or --discover DIR; see --help");
    }
    if let Some(dir) = &args.discover
        && !dir.is_dir()
    {
        bail!("--discover {}: not a folder", dir.display());
    }
    // Before anything is made: a mistyped subcommand is not a repository to watch.
    for repository in &args.repositories {
        check_repository(repository)?;
    }
    let web = args.http.config()?;
    let state = &args.state.state;
    std::fs::create_dir_all(state).with_context(|| format!("--state {}: cannot create it", state.display()))?;
    let state = std::fs::canonicalize(state).with_context(|| format!("--state {}", state.display()))?;
    let name = args.executor.executor_name("kubernetes");
    if name == "shell" && args.pulls && !args.force_shell {
        bail!("--executor shell isolates nothing: it runs pulls (untrusted code) only with --force-shell");
    }
    if name == "shell" && args.queue && !args.force_shell {
        bail!("--executor shell isolates nothing: it runs merge queues (untrusted code) only with --force-shell");
    }
    if name == "shell" && !args.executor.executor_options.iter().any(|option| option.starts_with("work-dir=")) {
        args.executor.executor_options.push(format!("work-dir={}", state.join("work").display()));
        std::fs::create_dir_all(state.join("work"))
            .with_context(|| format!("cannot create {}/work", state.display()))?;
    }
    let config = args.executor.host_config("kubernetes", &host_runner_id())?;
    let runner_id = config.runner.id.clone();
    if name == "shell" {
        tracing::warn!("the shell executor isolates nothing: steps run as this user on this host");
    }
    let host = ExecutorHost::start(config).await?;
    let forge = GitForge::new(GitForgeConfig {
        state: state.clone(),
        repositories: args.repositories.clone(),
        discover: args.discover.clone(),
        runner_id: runner_id.clone(),
        default_runner: args.default_runner.clone(),
    });
    let daemon_config = DaemonConfig {
        state: state.clone(),
        runner_id,
        pulls: args.pulls,
        queue: args.queue,
        poll: Duration::from_secs(args.poll.max(1)),
        concurrency: args.concurrency.max(1),
        secrets_file: args.secrets_file.clone(),
        disk_floor: args.disk_floor,
        keep: args.executor.keep,
    };
    if let Some(path) = &args.secrets_file {
        crate::secrets::read_operator_file(path)?;
    }
    if let Some(web) = web {
        crate::web::start(web, crate::web::View::new(&state, super::http_args::summary(&args, &host).await)).await?;
    }
    let daemon = Daemon::new(daemon_config, forge, host, CacheStore::new(&state, args.cache_max))?;
    daemon.serve().await?;
    Ok(ExitCode::SUCCESS)
}
