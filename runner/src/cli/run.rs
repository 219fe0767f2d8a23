//! `knotless-run run [PATH]`: a repository's workflows once, locally, with live output and a
//! summary table.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::Args;
use tokio_util::sync::CancellationToken;

mod defaults;
mod graph;
mod select;
mod terminal;
mod variables;

pub(crate) use select::table;

use super::ExecutorArgs;
use crate::cache::{CacheStore, check_disk_floor};
use crate::checkout::{Checkout, CheckoutInfo};
use crate::engine::{self, RunPlan};
use crate::host::ExecutorHost;
use crate::printable;
use crate::report::{LogSink, RunReport, RunStatus};
use crate::workflow::{Event, Workflow, WorkflowError};
use graph::{Ran, run_graph};
use knotless_protocol::messages::Isolation;
use terminal::{Paint, Terminal, note, print_failed_tails, print_summary};
use variables::secret_file;
pub(crate) use variables::step_variables;

/// `run` flags.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The repository's folder.
    #[arg(default_value = ".")]
    pub path: PathBuf,
    /// Run this commit (any git revision) instead of the working tree.
    #[arg(long, value_name = "REV")]
    pub rev: Option<String>,
    /// Run only this workflow (repeatable), with the workflows it needs (`needs:`), which run
    /// first. A matrix's file stem names all its combinations.
    #[arg(long = "workflow", value_name = "NAME")]
    pub workflows: Vec<String>,
    /// With `--workflow`: run the named workflows without the workflows they need.
    #[arg(long, requires = "workflows")]
    pub no_needs: bool,
    /// List the workflows, what triggers each, what it needs, its steps, and whether it runs
    /// for this event and branch (or why not); run nothing.
    #[arg(long, short = 'l', conflicts_with = "dry_run")]
    pub list: bool,
    /// Say what would run, in which order, and why each other workflow would not; run
    /// nothing.
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    /// Exit 0 when no workflow runs (by default that is exit 1, each workflow's reason said).
    #[arg(long)]
    pub allow_empty: bool,
    /// Remove the environments earlier runs kept (`--keep`) and whatever killed runs left,
    /// under this executor and runner id; run nothing.
    #[arg(long, conflicts_with_all = ["list", "dry_run", "keep"])]
    pub cleanup: bool,
    /// Give the steps that ask for it the secret NAME, its value read from the variable NAME
    /// of this environment (repeatable). Its value is masked in the output.
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Secrets from FILE: `NAME=VALUE` a line, the value taken as it is; blank lines and lines
    /// starting with `#` are skipped. `--secret` wins over it. Keep the file readable by you
    /// alone: `run` warns when it is not.
    #[arg(long = "secret-file", value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// A variable for every step: `NAME=VALUE`, or `NAME` for its value in this environment
    /// (repeatable). A workflow's or a step's own `env` wins over it.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,
    /// Variables for every step from FILE: `NAME=VALUE` a line, the value taken as it is;
    /// blank lines and lines starting with `#` are skipped. `--env` wins over it.
    #[arg(long = "env-file", value_name = "FILE")]
    pub env_file: Option<PathBuf>,
    /// Run as if on branch NAME: the workflows' branch filters see it, and the steps see
    /// `KNOTLESS_REF=refs/heads/NAME` (default: the checkout's own branch).
    #[arg(long, value_name = "NAME")]
    pub branch: Option<String>,
    /// The event to run for: workflows not triggered by it are skipped.
    #[arg(long, value_name = "EVENT", default_value = "push", value_enum)]
    pub event: Event,
    /// Colour the status words and the runner's notes: on a terminal without `NO_COLOR`
    /// (`auto`), `always`, or `never`.
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    /// Where each workflow's outputs go, in a folder named after it (default: a folder of this
    /// repository's own under ~/.cache/knotless/outputs).
    #[arg(long, value_name = "DIR")]
    pub outputs: Option<PathBuf>,
    /// Run up to N workflows at once, their lines prefixed with their names (default: `jobs`
    /// in run.toml, or 1).
    #[arg(long, short = 'j', value_name = "N", value_parser = jobs_value)]
    pub jobs: Option<u16>,
    /// Run without caches: no workflow's `cache:` is restored or kept.
    #[arg(long)]
    pub no_cache: bool,
    /// The executor (shell unless --executor or --executor-plugin says otherwise).
    #[command(flatten)]
    pub executor: ExecutorArgs,
}

/// `--jobs`'s value: a number from 1 to 64. A name is what act's `-j` takes: the error says
/// which flag runs one workflow.
fn jobs_value(text: &str) -> Result<u16, String> {
    match text.parse::<u16>() {
        Ok(jobs) if (1..=64).contains(&jobs) => Ok(jobs),
        Ok(_) => Err("how many workflows run at once is from 1 to 64".to_string()),
        Err(_) => Err(format!(
            "-j is --jobs, how many workflows run at once (as make's -j); to run the workflow {0}, use --workflow {0}",
            printable::name(text)
        )),
    }
}

/// The variables that tell tools to colour what they print although their output is a pipe
/// (`CLICOLOR_FORCE`: cargo's and many C and Go tools', `FORCE_COLOR`: Node's and Python's),
/// given to steps when `run` colours its own output.
const COLOUR_VARIABLES: [&str; 2] = ["CLICOLOR_FORCE", "FORCE_COLOR"];

/// `--event`'s values, listed by `--help`.
impl clap::ValueEnum for Event {
    fn value_variants<'a>() -> &'a [Self] {
        &Event::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.as_str()))
    }
}

/// When `run` colours its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// On a terminal, unless `NO_COLOR` is set.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

impl ColorChoice {
    fn enabled(self) -> bool {
        use std::io::IsTerminal as _;
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => std::io::stdout().is_terminal() && !super::no_color(),
        }
    }
}

/// Runs the subcommand.
pub async fn main(args: RunArgs) -> anyhow::Result<ExitCode> {
    if args.cleanup {
        return cleanup(&args).await;
    }
    let (checkout, info) = Checkout::resolve(&args.path, args.rev.as_deref()).await?;
    let defaults = defaults::load(defaults::user_file().as_deref(), checkout.root())?;
    let (workflows, errors) = checkout.workflows().await?;
    if workflows.is_empty() && errors.is_empty() {
        // Nothing ran is no pass: a script must not read it as one.
        bail!("no workflows in {}: add .knotless/workflows/NAME.yml", checkout.describe());
    }
    for error in &errors {
        crate::say_err!("error: {}", printable::name(&error.to_string()));
    }
    for note in &defaults.notes {
        crate::say_err!("note: {note}");
    }
    each_named_exists(&args.workflows, &workflows, &errors)?;
    let mut info = info;
    if let Some(branch) = &args.branch {
        if !git_check_ref_format(branch).await {
            bail!("--branch {}: not a valid branch name", printable::name(branch));
        }
        info.git_ref = format!("refs/heads/{branch}");
    }
    let branch = info.git_ref.strip_prefix("refs/heads/");
    let step_env = step_variables(&args.env, args.env_file.as_deref(), &defaults.env)?;
    let facts = crate::workflow::Facts {
        event: args.event.as_str(),
        branch: branch.unwrap_or(""),
        git_ref: &info.git_ref,
        changed: None,
        env: &BTreeMap::new(),
        failed: false,
    };
    let why_not = |workflow: &crate::workflow::Workflow| match workflow.on.refusal(args.event, branch) {
        Some(why) => Some(why),
        None => workflow.skip_reason(facts, &extra_env(&step_env, args.event, workflow)),
    };
    if args.list {
        for line in select::list(&workflows, why_not) {
            crate::say!("{line}");
        }
        return Ok(if errors.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE });
    }
    let selection = select::choose(workflows, &args.workflows, args.no_needs, why_not);
    announce(&selection, args.dry_run);
    let mut selected = selection.runs;
    default_image(&mut selected, &args.executor, &defaults);
    if selected.is_empty() && errors.is_empty() {
        return Ok(nothing_runs(&args, !selection.not_run.is_empty()));
    }
    if args.dry_run {
        return Ok(if errors.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE });
    }
    run_selected(&args, (checkout, info), &defaults, step_env, selected, &errors).await
}

/// Runs the selected workflows through the executor the flags and defaults name, then prints
/// the summary and each failed step's last lines.
async fn run_selected(
    args: &RunArgs,
    (checkout, info): (Checkout, CheckoutInfo),
    defaults: &defaults::Defaults,
    step_env: BTreeMap<String, String>,
    selected: Vec<Workflow>,
    errors: &[WorkflowError],
) -> anyhow::Result<ExitCode> {
    let secrets = given_secrets(args)?;
    let jobs = args.jobs.map(usize::from).or(defaults.jobs).unwrap_or(1);
    let executor = executor_flags(&args.executor, defaults);
    let paint = Paint(args.color.enabled());
    let mut step_env = step_env;
    if paint.0 {
        // Tools colour what they print when told to, as they would on the terminal they lack.
        for name in COLOUR_VARIABLES {
            step_env.entry(name.to_string()).or_insert_with(|| "1".to_string());
        }
    }
    let (host, name, images) = start_executor(&executor, defaults).await?;
    let cancel = cancelled_on_ctrl_c();
    let repository_folder = repository_folder(checkout.root(), &info.repository);
    let outputs_root = match args.outputs.as_ref().or(defaults.outputs.as_ref()) {
        Some(dir) => dir.clone(),
        None => default_outputs_root().join(&repository_folder),
    };
    let context = Context {
        host: Arc::clone(&host),
        checkout,
        info,
        event: args.event,
        secrets,
        step_env,
        keep: executor.keep,
        outputs_root,
        caches: if args.no_cache { None } else { open_cache_store() },
        repository_folder,
        executor: name.clone(),
        images,
        image: executor.image.clone(),
        paint,
        live_progress: jobs == 1 && std::io::stdout().is_terminal(),
        cancel,
    };
    let context_keep = context.keep;
    let ran = run_graph(&context, selected, jobs).await;
    host.shutdown().await;
    let (reports, tails): (Vec<_>, Vec<_>) =
        ran.into_iter().map(|(report, outputs, tail)| ((report, outputs), tail)).unzip();
    print_summary(&reports, errors, paint);
    print_failed_tails(&reports, &tails);
    if context_keep {
        crate::say!(
            "the environments stay (--keep); `knotless-run run --cleanup` removes them (with the same executor flags)"
        );
    }
    Ok(exit_code(&reports, errors))
}

/// The end of a run where no workflow runs: nothing ran is no pass, for a script must not read
/// it as one, unless `--allow-empty` says it may.
fn nothing_runs(args: &RunArgs, reasons_given: bool) -> ExitCode {
    let path = printable::name(&args.path.display().to_string()).into_owned();
    if args.allow_empty {
        crate::say!("no workflow to run in {path}");
        return ExitCode::SUCCESS;
    }
    let why = if reasons_given { " (each one's reason is above)" } else { "" };
    crate::say_err!("knotless-run: no workflow runs in {path}{why}; --allow-empty exits 0 when none does");
    ExitCode::FAILURE
}

/// Fails naming the first `--workflow` that names no workflow (a matrix's file stem names all
/// its combinations; a combination's name, that one) and no file that failed to parse.
fn each_named_exists(names: &[String], workflows: &[Workflow], errors: &[WorkflowError]) -> anyhow::Result<()> {
    for name in names {
        if !workflows.iter().any(|workflow| workflow.is_named(name))
            && !errors.iter().any(|error| error.file.contains(name.as_str()))
        {
            let known: Vec<_> = workflows.iter().map(|workflow| workflow.name.as_str()).collect();
            bail!(
                "--workflow {}: no such workflow in .knotless/workflows (there are: {})",
                printable::name(name),
                printable::name(&known.join(", "))
            );
        }
    }
    Ok(())
}

/// Says what the selection did: the plan of a dry run, or each workflow brought for a need, run
/// without its needs, or skipped, with the reason.
fn announce(selection: &select::Selection, dry_run: bool) {
    if dry_run {
        for line in select::dry_run(selection) {
            crate::say!("{line}");
        }
        return;
    }
    let runs = |name: &String| selection.runs.iter().any(|workflow| &workflow.name == name);
    for (name, by) in selection.brought.iter().filter(|(name, _)| runs(name)) {
        let name = printable::name(name);
        crate::say!("{name} ==> runs first: {} needs it", printable::name(&by.join(", ")));
    }
    for (name, dropped) in &selection.alone {
        let dropped = dropped.join(", ");
        crate::say!("{} ==> runs without {} (--no-needs)", printable::name(name), printable::name(&dropped));
    }
    for (name, why) in &selection.not_run {
        crate::say!("{} ==> skipped: {}", printable::name(name), printable::name(why));
    }
}

/// The secrets of `--secret-file` and `--secret NAME` (from the environment, which wins),
/// warning by name of each too short to mask safely.
fn given_secrets(args: &RunArgs) -> anyhow::Result<BTreeMap<String, String>> {
    let mut secrets = match &args.secret_file {
        Some(file) => secret_file(file)?,
        None => BTreeMap::new(),
    };
    for name in &args.secrets {
        let value = std::env::var(name).with_context(|| format!("--secret {name}: the variable {name} is not set"))?;
        secrets.insert(name.clone(), value);
    }
    for name in crate::secrets::values::too_short(&secrets) {
        crate::say_err!("{}", crate::secrets::values::too_short_warning(&printable::name(name)));
    }
    Ok(secrets)
}

/// Starts the executor under this run's own runner id, warns when it isolates nothing (unless
/// the user's defaults say they know), and sweeps what earlier runs left: an executor and the
/// cache store take only what a process that is gone owned (a killed run's container or folder,
/// its cache layer), never a live run's, whatever that run's cache folder. Gives the host, the
/// executor's name and whether it takes images.
async fn start_executor(
    executor: &ExecutorArgs,
    defaults: &defaults::Defaults,
) -> anyhow::Result<(Arc<ExecutorHost>, String, bool)> {
    let runner_id = local_runner_id();
    let config = executor.host_config("shell", &runner_id)?;
    let name = config.process.name.clone();
    let host = ExecutorHost::start(config).await?;
    let capabilities = host.info().await?.capabilities;
    let (isolation, images) = (capabilities.isolation, capabilities.images);
    if !matches!(isolation, Isolation::Container | Isolation::Vm) && defaults.isolation_warning != Some(false) {
        crate::say_err!(
            "warning: executor {} declares isolation {}: it isolates nothing, steps run as this user on this host \
             (isolation-warning = false in ~/.config/knotless/run.toml once you know)",
            printable::name(&name),
            super::daemon::isolation_name(isolation)
        );
    }
    sweep(&host).await;
    sweep_cache_leftovers();
    Ok((host, name, images))
}

/// A token Ctrl-C cancels, saying so; a second Ctrl-C exits at once with 130.
fn cancelled_on_ctrl_c() -> CancellationToken {
    let cancel = CancellationToken::new();
    let interrupt = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            crate::say_err!("knotless-run: cancelling (Ctrl-C again to stop waiting)");
            interrupt.cancel();
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    });
    cancel
}

/// 130 when a run was cancelled, 0 when every workflow parsed and every run passed, else 1.
fn exit_code(reports: &[(RunReport, Option<PathBuf>)], errors: &[WorkflowError]) -> ExitCode {
    let cancelled = reports.iter().any(|(report, _)| report.status == RunStatus::Cancelled);
    let all_passed = errors.is_empty() && reports.iter().all(|(report, _)| report.status == RunStatus::Success);
    if cancelled {
        ExitCode::from(130)
    } else if all_passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The largest cache archive `run` keeps, as the daemon's default `--cache-max`.
const CACHE_MAX: u64 = 1 << 30;

/// Below this many free bytes in the cache folder, no cache is kept (the daemon's default
/// `--disk-floor`).
const CACHE_DISK_FLOOR: u64 = 256 << 20;

/// What every workflow of one `run` shares.
struct Context {
    host: Arc<ExecutorHost>,
    checkout: Checkout,
    info: CheckoutInfo,
    event: Event,
    secrets: BTreeMap<String, String>,
    step_env: BTreeMap<String, String>,
    keep: bool,
    outputs_root: PathBuf,
    /// `None` under `--no-cache`.
    caches: Option<CacheStore>,
    /// The repository's folder name under the cache and outputs folders.
    repository_folder: String,
    /// The executor's name, and whether it takes images and `--image`: a cache is kept per
    /// executor and image.
    executor: String,
    images: bool,
    image: Option<String>,
    paint: Paint,
    live_progress: bool,
    cancel: CancellationToken,
}

/// The variables under `workflow`'s own for every step: `step_env` (`--env` and the defaults
/// files'), and for a manual event each input it does not give, at its default.
fn extra_env(
    step_env: &BTreeMap<String, String>,
    event: Event,
    workflow: &crate::workflow::Workflow,
) -> BTreeMap<String, String> {
    let mut env = step_env.clone();
    if let (Event::Manual, Some(manual)) = (event, &workflow.on.manual) {
        for (name, default) in &manual.inputs {
            env.entry(name.clone()).or_insert_with(|| default.clone());
        }
    }
    env
}

impl Context {
    /// The variables under the workflow's own for every step: `--env` and the defaults
    /// files', and for `--event manual` each input `--env` does not give, at its default.
    fn extra_env_of(&self, workflow: &crate::workflow::Workflow) -> BTreeMap<String, String> {
        extra_env(&self.step_env, self.event, workflow)
    }

    /// Runs one workflow, unless the run was cancelled before it started: its report, its
    /// outputs folder when it has outputs, and its failed step's last lines.
    async fn run(&self, workflow: crate::workflow::Workflow) -> Option<Ran> {
        if self.cancel.is_cancelled() {
            return None;
        }
        let run_id = crate::daemon::new_run_id(&workflow.name);
        let name = workflow.name.clone();
        let mut terminal = Terminal::new(name.clone(), self.paint, self.live_progress);
        // A push keeps its caches when it passes, as the daemon does; a pull or a queue batch
        // reads the apart base and keeps nothing.
        let trusted = self.event == Event::Push;
        // A cache is kept per executor and image: what one environment built may not run in
        // another (a host's binaries in a container, glibc's in musl's).
        let image = if self.images { workflow.image.as_deref().or(self.image.as_deref()) } else { None };
        let cache_key = cache_key(&name, &self.executor, image);
        let leases = match &self.caches {
            Some(store) => match store.lease(&self.repository_folder, &cache_key, &workflow.cache, trusted, &run_id) {
                Ok(leases) => leases,
                Err(error) => {
                    note(&mut terminal, &format!("caches off for this run: {error:#}"));
                    Vec::new()
                }
            },
            None => {
                if !workflow.cache.is_empty() {
                    note(&mut terminal, "caches off (--no-cache): none restored, none kept");
                }
                Vec::new()
            }
        };
        let extra_env = self.extra_env_of(&workflow);
        let plan = RunPlan {
            outputs_dir: Some(self.outputs_root.join(&name)),
            check_key: format!("{}/{}/{}", self.info.repository, self.info.commit, name),
            workflow,
            run_id: run_id.clone(),
            repository: self.info.repository.clone(),
            commit: self.info.commit.clone(),
            git_ref: self.info.git_ref.clone(),
            branch: self.info.git_ref.strip_prefix("refs/heads/").unwrap_or("").to_string(),
            changed: None,
            event: self.event,
            checkout: self.checkout.clone(),
            secrets: self.secrets.clone(),
            extra_env,
            keep: self.keep,
            limits: engine::Limits::default(),
            caches: leases,
        };
        let report = engine::execute(&self.host, &plan, &mut terminal, &self.cancel).await;
        if let Some(store) = &self.caches
            && !plan.caches.is_empty()
        {
            let mut promote = trusted && report.status == RunStatus::Success;
            if promote && let Err(cause) = check_disk_floor(&cache_home(), CACHE_DISK_FLOOR) {
                note(&mut terminal, &format!("caches not kept: {cause}"));
                promote = false;
            }
            let notes = store.settle(&self.repository_folder, &cache_key, &run_id, &plan.caches, promote).await;
            for cache in notes {
                let warm = if cache.warm { "warm" } else { "cold" };
                note(&mut terminal, &format!("cache {} (started {warm}): {}", cache.path, cache.outcome));
            }
        }
        terminal.flush();
        let mut outputs = plan.outputs_dir;
        if report.outputs.is_empty()
            && let Some(dir) = outputs.take()
        {
            // No folder for a run without outputs (the last run's were cleared for this one).
            let _ = std::fs::remove_dir_all(&dir);
        }
        Some((report, outputs, terminal.tails))
    }
}

/// `run --cleanup`: the executor's sweep with the kept sessions too, what it removed said.
async fn cleanup(args: &RunArgs) -> anyhow::Result<ExitCode> {
    let defaults = defaults::load_user(defaults::user_file().as_deref())?;
    let executor = executor_flags(&args.executor, &defaults);
    let config = executor.host_config("shell", &local_runner_id())?;
    let host = ExecutorHost::start(config).await?;
    let swept = host.cleanup_kept(std::time::Duration::from_secs(300)).await;
    host.shutdown().await;
    let result = swept?;
    for resource in &result.removed {
        crate::say!("removed {} {}", printable::name(&resource.kind), printable::name(&resource.name));
    }
    for failure in &result.failures {
        crate::say_err!("knotless-run: could not remove: {}", printable::name(failure));
    }
    crate::say!("{} removed, {} could not be", result.removed.len(), result.failures.len());
    Ok(if result.failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The name a workflow's caches are kept under: `NAME@EXECUTOR`, and `@IMAGE` (its characters
/// other than letters, digits, `.`, `_` and `-` made `_`, and a hash of it) when the executor
/// runs it in an image.
pub(crate) fn cache_key(workflow: &str, executor: &str, image: Option<&str>) -> String {
    let safe = |text: &str| -> String {
        text.chars()
            .take(48)
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
            .collect()
    };
    let mut key = format!("{workflow}@{}", safe(executor));
    if let Some(image) = image {
        key.push_str(&format!("@{}-{:08x}", safe(image), crate::names::fnv(image.as_bytes()) as u32));
    }
    key
}

/// The runner id of `run` for this user on this machine, the same from run to run, so that a
/// run can sweep what a killed one left: `local-UID-HASH`, HASH a hash of the machine's id (or
/// its host name), so that two machines sharing a cluster or an engine keep apart.
fn local_runner_id() -> String {
    use sha2::Digest as _;
    let machine = std::fs::read_to_string("/etc/machine-id")
        .ok()
        .map(|id| id.trim().to_string())
        .filter(|id| !id.is_empty())
        .or_else(|| nix::unistd::gethostname().ok().map(|name| name.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let hash = sha2::Sha256::digest(machine.as_bytes());
    let short: String = hash.iter().take(4).map(|byte| format!("{byte:02x}")).collect();
    format!("local-{}-{short}", nix::unistd::getuid())
}

/// The cache store under `run`'s own folder, shared by every `run` with the same folder; `None`,
/// with a warning, when it cannot be opened.
fn open_cache_store() -> Option<CacheStore> {
    match CacheStore::open(&cache_home(), CACHE_MAX) {
        Ok(store) => Some(store),
        Err(error) => {
            crate::say_err!("knotless-run: warning: caches off: {}", printable::name(&format!("{error:#}")));
            None
        }
    }
}

/// Removes what dead runs left in the cache store (their owner gone), whatever runs live beside
/// this one, and says what.
fn sweep_cache_leftovers() {
    let swept = crate::cache::leftovers::sweep(&cache_home());
    if let Some(summary) = swept.summary() {
        crate::say_err!("knotless-run: removed what dead runs left in the cache store: {}", printable::name(&summary));
    }
    for failure in &swept.failures {
        crate::say_err!("knotless-run: warning: {}", printable::name(failure));
    }
}

/// Sends `cleanup` and says what it removed, if anything.
async fn sweep(host: &ExecutorHost) {
    match host.cleanup(std::time::Duration::from_secs(120)).await {
        Ok(result) if result.removed.is_empty() && result.failures.is_empty() => {}
        Ok(result) => {
            let removed: Vec<String> =
                result.removed.iter().map(|resource| format!("{} {}", resource.kind, resource.name)).collect();
            if !removed.is_empty() {
                crate::say_err!(
                    "knotless-run: swept what an earlier run left: {}",
                    printable::name(&removed.join(", "))
                );
            }
            for failure in &result.failures {
                crate::say_err!("knotless-run: warning: could not sweep: {}", printable::name(failure));
            }
        }
        Err(error) => crate::say_err!("knotless-run: warning: the sweep of earlier runs failed: {error}"),
    }
}

/// Whether git takes `branch` as a branch name (`git check-ref-format --branch`).
async fn git_check_ref_format(branch: &str) -> bool {
    crate::git::Git::outside().succeeds(&["check-ref-format", "--branch", branch]).await
}

pub(crate) use crate::workflow::check_variable_name;

/// `run`'s own folder: `$XDG_CACHE_HOME/knotless`, or `~/.cache/knotless`. Its caches are
/// under `caches/`, its outputs under `outputs/`, its lock files at its top.
pub(crate) fn cache_home() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").filter(|home| !home.is_empty()).map(|home| PathBuf::from(home).join(".cache"))
        })
        .unwrap_or_else(std::env::temp_dir);
    cache.join("knotless")
}

fn default_outputs_root() -> PathBuf {
    cache_home().join("outputs")
}

/// The folder of one repository's outputs under the default root: its folder's name (letters,
/// digits, `.`, `_` and `-` kept) and a hash of its path, so that two repositories' workflows
/// of the same name keep their outputs apart.
pub(crate) fn repository_folder(root: &std::path::Path, name: &str) -> String {
    use sha2::Digest as _;
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let digest = sha2::Sha256::digest(root.as_os_str().as_encoded_bytes());
    let hash: String = digest.iter().take(6).map(|byte| format!("{byte:02x}")).collect();
    let name: String = name
        .chars()
        .take(64)
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .collect();
    let name = name.trim_start_matches('.');
    if name.is_empty() { hash } else { format!("{name}-{hash}") }
}

/// The executor flags a run goes by: its own, and a defaults file's `executor` and
/// `plugin-dir` where it gives none. Only these become executor options: nothing the operator
/// did not give. (A defaults file's `image` is the image of the workflows that name none, not
/// an option: see [`default_image`].)
fn executor_flags(given: &ExecutorArgs, defaults: &defaults::Defaults) -> ExecutorArgs {
    let mut executor = given.clone();
    if executor.executor.is_none() && executor.executor_plugin.is_none() {
        executor.executor = defaults.executor.clone();
    }
    if executor.plugin_dir.is_none() {
        executor.plugin_dir = defaults.plugin_dir.clone();
    }
    executor
}

/// A defaults file's `image` as the image of each workflow that names none, unless `--image`
/// gives the executor's: an executor that takes images runs them in it, one that takes none
/// says it ignores it, as it does a workflow's own `image:`.
fn default_image(workflows: &mut [crate::workflow::Workflow], given: &ExecutorArgs, defaults: &defaults::Defaults) {
    if let (None, Some(image)) = (&given.image, &defaults.image) {
        for workflow in workflows.iter_mut().filter(|workflow| workflow.image.is_none()) {
            workflow.image = Some(image.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::{executor_flags, repository_folder};
    use crate::cli::{Cli, Command};

    /// The executor options of `knotless-run run ARGS...` with `defaults`.
    fn options(args: &[&str], defaults: &super::defaults::Defaults) -> Vec<(String, String)> {
        let cli = Cli::try_parse_from(["knotless-run", "run"].iter().chain(args)).expect("the flags parse");
        let Some(Command::Run(run)) = cli.command else { panic!("not a run") };
        executor_flags(&run.executor, defaults).options().expect("the options").into_iter().collect()
    }

    #[test]
    fn a_run_with_no_executor_flags_passes_no_executor_option() {
        let none = super::defaults::Defaults::default();
        assert_eq!(options(&[], &none), []);
        // Flags that are not executor options pass none either.
        assert_eq!(options(&["--keep", "--runner-id", "r", "--executor-grace", "3", "--jobs", "2"], &none), []);
        // A defaults file's image is no option (an executor without images would refuse it):
        // it is the image of the workflows that name none.
        let image = super::defaults::Defaults { image: Some("rust:1.95".into()), ..Default::default() };
        assert_eq!(options(&[], &image), []);
        assert_eq!(options(&["--image", "alpine"], &image), [("image".to_string(), "alpine".to_string())]);
    }

    #[test]
    fn each_repository_has_an_outputs_folder_of_its_own_and_a_safe_name() {
        let (one, two) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
        let first = repository_folder(one.path(), "app");
        assert_ne!(first, repository_folder(two.path(), "app"), "two repositories named alike");
        assert_eq!(first, repository_folder(one.path(), "app"), "the same repository, the same folder");
        assert!(first.starts_with("app-") && first.len() == "app-".len() + 12, "{first}");
        for hostile in ["..", "a/b", "x\ny", "\u{1b}[31m", "."] {
            let folder = repository_folder(one.path(), hostile);
            assert!(
                !folder.starts_with('.') && folder.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)),
                "{hostile:?} gave {folder:?}"
            );
        }
    }
}
