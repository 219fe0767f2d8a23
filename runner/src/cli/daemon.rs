//! `knotless-run [OPTIONS] REPO...`: the daemon over the embedded git forge.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;

use super::ExecutorArgs;
use crate::cache::CacheStore;
use crate::daemon::{Daemon, DaemonConfig};
use crate::forge::{GitForge, GitForgeConfig};
use crate::host::ExecutorHost;
use crate::metrics::Metrics;
use knotless_protocol::messages::Isolation;

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
    /// Allow an executor that isolates nothing (one that declares isolation `none` or one this
    /// runner does not know, as the shell executor does) to run pulls and queue batches.
    #[arg(long)]
    pub force_shell: bool,
    /// Seconds between fetches of each repository (`knotless-run notify` wakes it at once).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub poll: u64,
    /// How many runs at once.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub concurrency: usize,
    /// How many repositories are fetched at once in a round.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub fetches: usize,
    /// How long one fetch of a repository may take before it is stopped (and tried again at
    /// the next round).
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub fetch_timeout: u64,
    /// NAME=value lines (or a YAML mapping) of secrets granted to push runs; mode 0600; its
    /// values win over sealed ones.
    #[arg(long, value_name = "PATH")]
    pub secrets_file: Option<PathBuf>,
    /// A variable for every step of every run: `NAME=VALUE`, or `NAME` for its value in the
    /// daemon's environment (repeatable). Not a secret: use --secrets-file for those.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,
    /// Variables for every step from FILE: `NAME=VALUE` a line; blank lines and `#` lines are
    /// skipped. `--env` wins over it.
    #[arg(long = "env-file", value_name = "FILE")]
    pub env_file: Option<PathBuf>,
    /// The largest cache archive kept, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 30)]
    pub cache_max: u64,
    /// Fail a run when fewer bytes are free under the state folder.
    #[arg(long, value_name = "BYTES", default_value_t = 256 << 20)]
    pub disk_floor: u64,
    /// How long ended checks (with their logs and outputs), unused caches and the mirrors of
    /// repositories no longer watched are kept: `90d`, `36h`, ... Pruned at start and hourly;
    /// the newest check of each workflow on each branch and the checks of open pulls stay.
    #[arg(long, value_name = "DURATION", default_value = "90d", value_parser = parse_retention)]
    pub retention: Duration,
    /// The most bytes the checks, logs and outputs may take; past it the oldest checks are
    /// pruned first (the ones --retention keeps stay).
    #[arg(long, value_name = "BYTES")]
    pub retention_max_bytes: Option<u64>,
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

fn parse_retention(text: &str) -> Result<Duration, String> {
    match crate::workflow::parse_duration(text) {
        Some(duration) if duration >= Duration::from_secs(3600) => Ok(duration),
        Some(_) => Err(format!("{text} is shorter than an hour, the pruning's own period")),
        None => Err(format!("{text} is not a duration: expected e.g. 90d, 36h")),
    }
}

/// This host's name as a runner id: its safe characters, at most 63.
fn host_runner_id() -> String {
    let name = nix::unistd::gethostname().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let safe: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).take(63).collect();
    if safe.is_empty() { "knotless".to_string() } else { safe }
}

/// Refuses a REPO that is neither a URL (`scheme://`, or `host:path` as git takes it) nor a
/// path that exists: most often a mistyped subcommand, which must not start the daemon. The
/// error names the nearest subcommand, or lists them all.
fn check_repository(repository: &str) -> anyhow::Result<()> {
    let url = repository.contains("://") || repository.split_once(':').is_some_and(|(host, _)| !host.contains('/'));
    if url || std::path::Path::new(repository).exists() {
        return Ok(());
    }
    let command = <super::Cli as clap::CommandFactory>::command();
    let subcommands: Vec<&str> =
        command.get_subcommands().filter(|sub| !sub.is_hide_set()).map(|sub| sub.get_name()).collect();
    // A typo: at most two edits (a swap of neighbours is one), fewer than half the name's.
    let nearest = subcommands
        .iter()
        .map(|name| (strsim::damerau_levenshtein(repository, name), *name))
        .filter(|(edits, name)| *edits <= 2 && *edits * 2 < name.len())
        .min_by_key(|(edits, _)| *edits);
    let hint = match (repository, nearest) {
        ("version", _) => "for the version, knotless-run --version".to_string(),
        (_, Some((_, name))) => format!("did you mean knotless-run {name}?"),
        (_, None) => format!("the subcommands are {} (knotless-run --help)", subcommands.join(", ")),
    };
    bail!(
        "\"{}\" is not a repository (no such path, and not a URL) nor a subcommand: {hint}",
        crate::printable::name(repository)
    )
}

/// An isolation as the protocol names it.
pub(super) fn isolation_name(isolation: Isolation) -> &'static str {
    match isolation {
        Isolation::None => "none",
        Isolation::Container => "container",
        Isolation::Vm => "vm",
        Isolation::Unknown => "unknown",
    }
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
    let step_env = super::run::step_variables(&args.env, args.env_file.as_deref(), &Default::default())?;
    let web = args.http.config()?;
    let state = &args.state.state;
    create_private_dir(state).with_context(|| format!("--state {}: cannot create it", state.display()))?;
    let state = std::fs::canonicalize(state).with_context(|| format!("--state {}", state.display()))?;
    // Before anything in the folder is touched: one daemon a state folder.
    let lock = crate::state::StateLock::take(&state)?;
    let name = args.executor.executor_name("kubernetes");
    if name == "shell" && !args.executor.executor_options.iter().any(|option| option.starts_with("work-dir=")) {
        args.executor.executor_options.push(format!("work-dir={}", state.join("work").display()));
        create_private_dir(&state.join("work")).with_context(|| format!("cannot create {}/work", state.display()))?;
    }
    let config = args.executor.host_config("kubernetes", &host_runner_id())?;
    let runner_id = config.runner.id.clone();
    let host = ExecutorHost::start(config).await?;
    trust_policy(&args, &name, &host).await?;
    let forge = GitForge::new(GitForgeConfig {
        state: state.clone(),
        repositories: args.repositories.clone(),
        discover: args.discover.clone(),
        runner_id: runner_id.clone(),
        default_runner: args.default_runner.clone(),
        fetch_timeout: Duration::from_secs(args.fetch_timeout.max(1)),
    });
    let metrics = Arc::new(Metrics::new());
    metrics.watch_host(&host);
    metrics.read_queues(&state);
    let daemon_config = DaemonConfig {
        state: state.clone(),
        runner_id,
        pulls: args.pulls,
        queue: args.queue,
        poll: Duration::from_secs(args.poll.max(1)),
        concurrency: args.concurrency.max(1),
        fetches: args.fetches.max(1),
        secrets_file: args.secrets_file.clone(),
        disk_floor: args.disk_floor,
        retention: crate::retention::Retention { max_age: args.retention, max_bytes: args.retention_max_bytes },
        keep: args.executor.keep,
        step_env,
        metrics: Arc::clone(&metrics),
    };
    if let Some(path) = &args.secrets_file {
        crate::secrets::read_operator_file(path)?;
    }
    let pages = crate::web::Stop::default();
    start_pages(&args, web, &state, &host, metrics, &pages).await?;
    let caches = CacheStore::open(&state, args.cache_max)?;
    let daemon = Daemon::new(daemon_config, forge, host, caches, lock)?;
    let served = daemon.serve().await;
    // The page stops last: the responses in flight are written, live logs end (a browser
    // reconnects to the next daemon and goes on where it was).
    if !pages.stop(PAGE_GRACE).await {
        tracing::warn!("the status page's connections did not end within {PAGE_GRACE:?}; leaving them");
    }
    served?;
    Ok(ExitCode::SUCCESS)
}

/// The trust policy, which follows what the executor declares whatever its name: an executor
/// that isolates nothing runs pulls and merge queues (untrusted code) only with
/// `--force-shell`, and is warned about.
async fn trust_policy(args: &DaemonArgs, name: &str, host: &Arc<ExecutorHost>) -> anyhow::Result<()> {
    let isolation = host.info().await?.capabilities.isolation;
    if matches!(isolation, Isolation::Container | Isolation::Vm) {
        return Ok(());
    }
    let untrusted = match (args.pulls, args.queue) {
        (true, _) => Some("pulls"),
        (false, true) => Some("merge queues"),
        (false, false) => None,
    };
    if let Some(what) = untrusted.filter(|_| !args.force_shell) {
        host.shutdown().await;
        bail!(
            "executor {name} declares isolation {}, which isolates nothing: it runs {what} (untrusted code) \
             only with --force-shell",
            isolation_name(isolation)
        );
    }
    tracing::warn!(
        "executor {name} declares isolation {}: it isolates nothing, steps run as this user on this host",
        isolation_name(isolation)
    );
    Ok(())
}

/// Starts the status page (`--http`) and the metrics' own listener (`--metrics`), each ended
/// by `pages`.
async fn start_pages(
    args: &DaemonArgs,
    web: Option<crate::web::WebConfig>,
    state: &std::path::Path,
    host: &Arc<ExecutorHost>,
    metrics: Arc<Metrics>,
    pages: &crate::web::Stop,
) -> anyhow::Result<()> {
    if let Some(web) = web {
        let view = crate::web::View::new(state, super::http_args::summary(args, host).await);
        let limits = crate::web::Limits::default();
        crate::web::start_with_metrics(web, view, limits, Some(Arc::clone(&metrics)), pages).await?;
    }
    if let Some(addr) = args.http.metrics {
        crate::web::start_metrics(addr, metrics, crate::web::Limits::default(), pages).await?;
    }
    Ok(())
}

/// How long the status page's open connections get to end when the daemon stops.
const PAGE_GRACE: Duration = Duration::from_secs(2);

/// Creates `dir` and the folders above it that are missing, each readable by this user alone
/// (mode 0700): the state folder holds logs, outputs and the runner's secret key. A folder that
/// exists is left as its owner made it.
fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_state_folder_the_daemon_makes_is_private_and_one_it_finds_is_left_as_it_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("a/b/state");
        super::create_private_dir(&state).expect("create");
        for made in [dir.path().join("a"), dir.path().join("a/b"), state.clone()] {
            let mode = std::fs::metadata(&made).expect("metadata").permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}: {mode:o}", made.display());
        }
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o750)).expect("chmod");
        super::create_private_dir(&state).expect("exists already");
        assert_eq!(std::fs::metadata(&state).expect("metadata").permissions().mode() & 0o777, 0o750);
    }
}
