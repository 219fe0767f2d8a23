//! Running one workflow in one session: start the environment, stream the checkout and the
//! shared steps in, run the steps in order with their variables and only their own secrets,
//! bring the outputs back, and end the session whatever happened.

mod cache;
mod capabilities;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use knotless_protocol::FailureClass;
use knotless_protocol::messages::*;
use tokio_util::sync::CancellationToken;

pub use cache::{CacheLease, SavedLayer, resolve as resolve_cache_path};

use crate::checkout::Checkout;
use crate::host::{ExecutorHost, HostError, Session, SessionEvent};
use crate::mask::Masker;
use crate::report::{LogSink, OutputFile, Progress, RunLog, RunReport, RunStatus, StepReport, StepStatus};
use crate::secrets;
use crate::workflow::{Event, Workflow};
use capabilities::{refusal, start_image, usable_caches};

/// Bounds and deadlines of a run's operations.
#[derive(Debug, Clone)]
pub struct Limits {
    /// How long `start` may take (image pulls, scheduling).
    pub start_timeout: Duration,
    /// How long `stop` may take.
    pub stop_timeout: Duration,
    /// How long one transfer may take.
    pub transfer_timeout: Duration,
    /// The largest checkout.
    pub checkout_max_bytes: u64,
    /// The largest outputs archive.
    pub outputs_max_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            start_timeout: Duration::from_secs(600),
            stop_timeout: Duration::from_secs(120),
            transfer_timeout: Duration::from_secs(600),
            checkout_max_bytes: 2 << 30,
            outputs_max_bytes: 256 << 20,
        }
    }
}

/// Everything a run needs.
pub struct RunPlan {
    /// The workflow.
    pub workflow: Workflow,
    /// The run's id; also its session id.
    pub run_id: String,
    /// The repository's name.
    pub repository: String,
    /// The commit.
    pub commit: String,
    /// The ref.
    pub git_ref: String,
    /// The branch the run is for (a push's, a pull's target, a manual trigger's); empty when
    /// there is none (a detached local checkout).
    pub branch: String,
    /// The paths the event changed, when known (`changed()` in an `if:`).
    pub changed: Option<Vec<String>>,
    /// What triggered it.
    pub event: Event,
    /// The check this run reports to.
    pub check_key: String,
    /// The files.
    pub checkout: Checkout,
    /// The secret values granted to this run, by name. A step gets those it asks for.
    pub secrets: BTreeMap<String, String>,
    /// Variables every step gets (`run --env`), under the workflow's and the step's own
    /// `env`; never a run variable (`CI`, `KNOTLESS_*`).
    pub extra_env: BTreeMap<String, String>,
    /// Where to unpack the outputs; `None` skips them.
    pub outputs_dir: Option<PathBuf>,
    /// Keep the environment after the run.
    pub keep: bool,
    /// Bounds and deadlines.
    pub limits: Limits,
    /// The caches: streamed in before the steps, brought back after passing ones.
    pub caches: Vec<CacheLease>,
}

/// How a run ended early.
struct Ended {
    status: RunStatus,
    cause: String,
}

impl Ended {
    fn from_host(what: &str, error: &HostError) -> Ended {
        let status = match error.class() {
            FailureClass::Cancelled => RunStatus::Cancelled,
            _ => RunStatus::Error,
        };
        Ended { status, cause: format!("{what}: {error}") }
    }
}

/// Runs `plan` on `host`. Never fails: every way a run can end is in the report.
pub async fn execute(
    host: &Arc<ExecutorHost>,
    plan: &RunPlan,
    sink: &mut dyn LogSink,
    cancel: &CancellationToken,
) -> RunReport {
    let started = Instant::now();
    let masker = match Masker::new(secrets::values::masked(plan.secrets.values())) {
        Ok(masker) => masker,
        Err(error) => return unmasked(plan, &error.to_string()),
    };
    let mut log = RunLog::new(masker, sink);
    for name in secrets::values::too_short(&plan.secrets) {
        log.note(secrets::values::too_short_warning(name));
    }
    let workflow = &plan.workflow;
    let mut steps: Vec<StepReport> = workflow.steps.iter().map(|step| StepReport::skipped(&step.name)).collect();
    log.note(format!(
        "run {} of workflow {} on {} at {} ({}), executor {}",
        plan.run_id,
        workflow.name,
        plan.repository,
        plan.commit,
        plan.event.as_str(),
        host.name()
    ));
    // What the executor declared in its handshake decides what the run may ask of it.
    let capabilities = host.info().await.ok().map(|info| info.capabilities);
    let start = start_params(plan, capabilities.as_ref(), host.name(), &mut log);
    let mut outputs = Vec::new();
    let caches = usable_caches(&plan.caches, capabilities.as_ref(), host.name(), &mut log);
    let refused = environment_refusal(plan)
        .or_else(|| capabilities.as_ref().and_then(|capabilities| refusal(plan, capabilities, host.name())));
    let ended = match refused {
        Some(refused) => Some(refused),
        None => match host.open(start, cancel).await {
            Err(error) => Some(Ended::from_host("cannot start the environment", &error)),
            Ok(session) => {
                let run = SessionRun {
                    plan,
                    capabilities: capabilities.as_ref(),
                    executor: host.name(),
                    caches,
                    cancel,
                    started,
                };
                in_environment(session, &run, &mut log, &mut steps, &mut outputs).await
            }
        },
    };
    report(plan, log, ended, steps, outputs, started)
}

/// The report of a run whose secrets could not be made into a masker: it never started.
fn unmasked(plan: &RunPlan, error: &str) -> RunReport {
    let cause = format!("cannot build the masker of the run's secrets: {error}");
    RunReport {
        run_id: plan.run_id.clone(),
        workflow: plan.workflow.name.clone(),
        status: RunStatus::Error,
        log: format!("==> error: {cause}\n"),
        cause: Some(cause),
        steps: Vec::new(),
        outputs: Vec::new(),
        duration_ms: 0,
        log_truncated: false,
    }
}

/// The run's report, its end the log's last line; every string the check stores is masked, as
/// the log is.
fn report(
    plan: &RunPlan,
    mut log: RunLog<'_>,
    ended: Option<Ended>,
    mut steps: Vec<StepReport>,
    mut outputs: Vec<OutputFile>,
    started: Instant,
) -> RunReport {
    let (status, cause) = match ended {
        None => (RunStatus::Success, None),
        Some(ended) => (ended.status, Some(ended.cause)),
    };
    match &cause {
        Some(cause) => log.note(format!("{}: {cause}", status.as_str())),
        None => log.note(status.as_str()),
    }
    // Every string the check stores is masked, as the log is: a cause may quote an executor,
    // a step or an output file may be named with a secret.
    let cause = cause.map(|cause| log.mask_text(&cause));
    for step in &mut steps {
        step.name = log.mask_text(&step.name);
    }
    for output in &mut outputs {
        output.path = log.mask_text(&output.path);
    }
    RunReport {
        run_id: plan.run_id.clone(),
        workflow: plan.workflow.name.clone(),
        status,
        cause,
        steps,
        outputs,
        duration_ms: started.elapsed().as_millis() as u64,
        log_truncated: log.truncated(),
        log: log.take_text(),
    }
}

/// What `start` asks of the executor: the run, its image (as the executor's images allow), its
/// resources, network, deadlines, `keep` and services.
fn start_params(
    plan: &RunPlan,
    capabilities: Option<&Capabilities>,
    executor: &str,
    log: &mut RunLog<'_>,
) -> StartParams {
    let workflow = &plan.workflow;
    StartParams {
        session: plan.run_id.clone(),
        run: RunInfo {
            id: plan.run_id.clone(),
            repository: plan.repository.clone(),
            commit: plan.commit.clone(),
            workflow: workflow.name.clone(),
            check_key: plan.check_key.clone(),
        },
        image: start_image(workflow, capabilities, executor, log),
        resources: Resources { cpu: workflow.resources.cpu.clone(), memory: workflow.resources.memory.clone() },
        network: workflow.network,
        run_timeout_ms: Some(workflow.timeout.as_millis() as u64),
        timeout_ms: plan.limits.start_timeout.as_millis() as u64,
        keep: plan.keep,
        services: workflow.services.clone(),
    }
}

/// What a started session's part of a run needs besides its log.
struct SessionRun<'a> {
    plan: &'a RunPlan,
    capabilities: Option<&'a Capabilities>,
    executor: &'a str,
    caches: &'a [CacheLease],
    cancel: &'a CancellationToken,
    started: Instant,
}

/// A started session's whole part of a run: its steps, the caches saved after a run whose steps
/// all ended, the outputs brought back unless it was cancelled, and the session's stop. Gives
/// how the run ended early, if it did.
async fn in_environment(
    session: Session,
    run: &SessionRun<'_>,
    log: &mut RunLog<'_>,
    steps: &mut [StepReport],
    outputs: &mut Vec<OutputFile>,
) -> Option<Ended> {
    let (plan, caches) = (run.plan, run.caches);
    if let Some(description) = session.description() {
        log.note(format!("environment: {description}"));
    }
    notes(log, session.drain_events().await);
    let mut ended = in_session(&session, plan, caches, log, steps, run.cancel, run.started).await.err();
    if ended.is_none() && session.is_alive() && !caches.is_empty() {
        cache::save(&session, plan, caches, log).await;
    }
    let no_outputs = run.capabilities.is_some_and(|capabilities| !capabilities.outputs);
    if no_outputs && plan.outputs_dir.is_some() {
        log.note(format!("executor {} declares outputs: false: no outputs are brought back", run.executor));
    }
    if session.is_alive() && !no_outputs && ended.as_ref().is_none_or(|ended| ended.status != RunStatus::Cancelled) {
        match fetch_outputs(&session, plan, log).await {
            Ok(files) => *outputs = files,
            Err(failed) if ended.is_none() => ended = Some(failed),
            Err(failed) => log.note(failed.cause),
        }
    }
    if !session.is_alive() {
        log.note("the executor is gone: a fresh executor process sweeps what it left");
    }
    match session.stop(plan.keep, plan.limits.stop_timeout).await {
        Ok(stopped) if plan.keep => log.note("kept the environment (--keep)".to_string() + &removed(&stopped)),
        Ok(stopped) => log.note(format!("environment removed{}", removed(&stopped))),
        Err(error) => {
            log.note(format!("could not remove the environment: {error}; the next cleanup sweeps it"));
            if ended.is_none() {
                ended = Some(Ended::from_host("cannot remove the environment", &error));
            }
        }
    }
    ended
}

/// Why a step could not start with the secrets it asks for in its environment, if one could
/// not: found before any environment starts. The run's variables are counted with empty
/// session paths, which only the session's start gives.
fn environment_refusal(plan: &RunPlan) -> Option<Ended> {
    let unstarted = SessionPaths { work: String::new(), steps: String::new(), outputs: String::new() };
    let base = run_env(plan, &unstarted);
    plan.workflow.steps.iter().find_map(|step| {
        let secrets = step
            .secrets
            .iter()
            .filter_map(|name| Some((name.clone(), plan.secrets.get(name)?.clone())))
            .collect::<BTreeMap<_, _>>();
        let mut env = base.clone();
        env.extend(step.env.clone());
        let cause = secrets::values::environment_refusal(&step.name, &env, &secrets)?;
        Some(Ended { status: RunStatus::Error, cause })
    })
}

fn removed(result: &StopResult) -> String {
    if result.removed.is_empty() {
        return String::new();
    }
    let names: Vec<_> = result.removed.iter().map(|resource| format!("{} {}", resource.kind, resource.name)).collect();
    format!(": {}", names.join(", "))
}

fn notes(log: &mut RunLog<'_>, events: Vec<SessionEvent>) {
    for event in events {
        match event {
            SessionEvent::Log { message, .. } => log.note(message),
            SessionEvent::Output { stream, bytes, .. } => log.output(stream, &bytes),
        }
    }
}

async fn in_session(
    session: &Session,
    plan: &RunPlan,
    caches: &[CacheLease],
    log: &mut RunLog<'_>,
    steps: &mut [StepReport],
    cancel: &CancellationToken,
    started: Instant,
) -> Result<(), Ended> {
    upload_checkout(session, plan, log, cancel).await?;
    cache::restore(session, plan, caches, log, cancel).await?;
    let scripts = step_scripts(session, plan, cancel).await?;
    let workflow = &plan.workflow;
    let base = run_env(plan, session.paths());
    let deadline = started + workflow.timeout;
    // The first step failure: the run ends with it, once the steps that run after a failure
    // (`if: failure()`, `if: always()`) have run.
    let mut failed: Option<Ended> = None;
    for (index, step) in workflow.steps.iter().enumerate() {
        let mut env = base.clone();
        env.extend(step.env.clone());
        if let Some(reason) = skip_reason(plan, step, &env, failed.is_some()) {
            log.note(format!("step {} skipped: {reason}", step.name));
            steps[index].reason = Some(reason);
            log.steps(&steps[..=index], None);
            continue;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        let timeout = workflow.step_timeout(index).min(remaining);
        if timeout.is_zero() {
            steps[index].status = StepStatus::TimedOut;
            return Err(Ended {
                status: RunStatus::Failure,
                cause: format!(
                    "the run passed its timeout of {} before step {}",
                    crate::printable::duration(workflow.timeout),
                    step.name
                ),
            });
        }
        let secrets = step_secrets(plan, step, log);
        log.note(format!("step {} ({}/{})", step.name, index + 1, workflow.steps.len()));
        log.steps(&steps[..=index], Some(index));
        log.begin_step(&step.name);
        let params = CommandParams {
            session: session.id().to_string(),
            step: index as u32,
            name: step.name.clone(),
            script: scripts[index].clone(),
            env,
            secrets,
            workdir: None,
            timeout_ms: timeout.as_millis() as u64,
        };
        let step_started = Instant::now();
        let result = session
            .command(params, cancel, |event| match event {
                SessionEvent::Output { stream, bytes, .. } => log.output(stream, &bytes),
                SessionEvent::Log { message, .. } => log.note(message),
            })
            .await;
        // The runner's deadline and the user's cancel decide, whatever the executor answered.
        let result = session.judge(index as u32, result, step_started.elapsed(), timeout, cancel.is_cancelled());
        log.end_step();
        let report = &mut steps[index];
        report.duration_ms = step_started.elapsed().as_millis() as u64;
        let ended = step_ended(step, result, timeout, report, log);
        log.steps(&steps[..=index], None);
        match ended {
            Ok(()) => {}
            // A step that failed or timed out: later steps may still run after it.
            Err(ended) if ended.status == RunStatus::Failure => {
                failed.get_or_insert(ended);
            }
            Err(ended) => return Err(ended),
        }
    }
    match failed {
        Some(ended) => Err(ended),
        None => Ok(()),
    }
}

/// Why `step` does not run, if it does not: its `if:` is false, or (without one) an earlier
/// step failed.
fn skip_reason(
    plan: &RunPlan,
    step: &crate::workflow::Step,
    env: &BTreeMap<String, String>,
    failed: bool,
) -> Option<String> {
    let Some(condition) = &step.condition else {
        return failed.then(|| "an earlier step failed".to_string());
    };
    let facts = crate::workflow::Facts {
        event: plan.event.as_str(),
        branch: &plan.branch,
        git_ref: &plan.git_ref,
        changed: plan.changed.as_deref(),
        env,
        failed,
    };
    (!condition.holds(&facts)).then(|| format!("if: {} is false", condition.text))
}

/// Packs the checkout and uploads it into the session's work folder.
async fn upload_checkout(
    session: &Session,
    plan: &RunPlan,
    log: &mut RunLog<'_>,
    cancel: &CancellationToken,
) -> Result<(), Ended> {
    let limits = &plan.limits;
    let work = &session.paths().work;
    let mut checkout = plan
        .checkout
        .archive(None)
        .await
        .map_err(|error| Ended { status: RunStatus::Error, cause: format!("cannot pack the checkout: {error:#}") })?;
    let upload = session.upload(work, &mut checkout, limits.checkout_max_bytes, limits.transfer_timeout, cancel);
    let uploaded = watched(log, session, "checkout", upload).await;
    let bytes = uploaded.map_err(|error| match checkout.failure() {
        Some(failure) => Ended { status: RunStatus::Error, cause: format!("cannot pack the checkout: {failure}") },
        None => Ended::from_host("cannot upload the checkout", &error),
    })?;
    log.note(format!("checked out {bytes} bytes of tar into {work}"));
    Ok(())
}

/// What the executor runs for each step: its script, or the `run` of the shared step it
/// uses, uploaded into the session's steps folder first.
async fn step_scripts(session: &Session, plan: &RunPlan, cancel: &CancellationToken) -> Result<Vec<String>, Ended> {
    let limits = &plan.limits;
    let steps = &plan.workflow.steps;
    let mut scripts = Vec::with_capacity(steps.len());
    for (index, step) in steps.iter().enumerate() {
        let shared = match (&step.run, &step.uses) {
            (Some(script), _) => {
                scripts.push(step_script(step, script));
                continue;
            }
            (None, Some(shared)) => shared,
            (None, None) => {
                return Err(Ended {
                    status: RunStatus::Error,
                    cause: format!("step {} has nothing to run", step.name),
                });
            }
        };
        let folder = format!(".knotless/steps/{shared}");
        if !plan.checkout.has_folder(&folder).await {
            return Err(Ended {
                status: RunStatus::Error,
                cause: format!("step {} uses shared step {shared}, but {folder}/ does not exist", step.name),
            });
        }
        let packed = |failure: &str| Ended {
            status: RunStatus::Error,
            cause: format!("cannot pack shared step {shared}: {failure}"),
        };
        let mut archive = plan.checkout.archive(Some(&folder)).await.map_err(|error| packed(&format!("{error:#}")))?;
        let target = format!("{}/{index}", session.paths().steps);
        let uploaded =
            session.upload(&target, &mut archive, limits.checkout_max_bytes, limits.transfer_timeout, cancel).await;
        uploaded.map_err(|error| match archive.failure() {
            Some(failure) => packed(failure),
            None => Ended::from_host(&format!("cannot upload shared step {shared}"), &error),
        })?;
        scripts.push(step_script(step, &format!("exec '{target}/run'")));
    }
    Ok(scripts)
}

/// The variables every step of the run gets: the run's own (`CI`, `KNOTLESS_*`), then the
/// workflow's.
fn run_env(plan: &RunPlan, paths: &SessionPaths) -> BTreeMap<String, String> {
    let mut base = plan.extra_env.clone();
    base.insert("CI".to_string(), "true".to_string());
    base.insert("KNOTLESS_RUN_OUTPUTS".to_string(), paths.outputs.clone());
    base.insert("KNOTLESS_REPOSITORY".to_string(), plan.repository.clone());
    base.insert("KNOTLESS_COMMIT".to_string(), plan.commit.clone());
    base.insert("KNOTLESS_REF".to_string(), plan.git_ref.clone());
    base.insert("KNOTLESS_EVENT".to_string(), plan.event.as_str().to_string());
    base.insert("KNOTLESS_RUN_ID".to_string(), plan.run_id.clone());
    base.insert("KNOTLESS_WORKFLOW".to_string(), plan.workflow.name.clone());
    base.extend(plan.workflow.env.clone());
    base
}

/// The secrets `step` names that the run was granted; a note for each it was not.
fn step_secrets(plan: &RunPlan, step: &crate::workflow::Step, log: &mut RunLog<'_>) -> BTreeMap<String, String> {
    let mut secrets = BTreeMap::new();
    for name in &step.secrets {
        match plan.secrets.get(name) {
            Some(value) => {
                secrets.insert(name.clone(), value.clone());
            }
            None => log.note(format!("secret {name} is not granted to this run; step {} runs without it", step.name)),
        }
    }
    secrets
}

/// Records how `step` ended in `report`; an error when the run ends with it.
fn step_ended(
    step: &crate::workflow::Step,
    result: Result<CommandResult, HostError>,
    timeout: Duration,
    report: &mut StepReport,
    log: &mut RunLog<'_>,
) -> Result<(), Ended> {
    match result {
        Ok(result) => {
            report.exit_code = Some(result.exit_code);
            if result.killed_processes > 0 {
                log.note(format!(
                    "killed {} process(es) step {} left running after using secrets",
                    result.killed_processes, step.name
                ));
            }
            if result.exit_code == 0 {
                report.status = StepStatus::Success;
                return Ok(());
            }
            report.status = StepStatus::Failure;
            if step.continue_on_error {
                log.note(format!(
                    "step {} exited with {}; the run goes on (continue-on-error)",
                    step.name, result.exit_code
                ));
                return Ok(());
            }
            Err(Ended {
                status: RunStatus::Failure,
                cause: format!("step {} exited with {}", step.name, result.exit_code),
            })
        }
        Err(error) => {
            let (step_status, run_status) = match error.class() {
                FailureClass::Step if error.kind() == Some(knotless_protocol::ErrorKind::Timeout) => {
                    (StepStatus::TimedOut, RunStatus::Failure)
                }
                FailureClass::Step => (StepStatus::Failure, RunStatus::Failure),
                FailureClass::Cancelled => (StepStatus::Cancelled, RunStatus::Cancelled),
                FailureClass::Infrastructure | FailureClass::Configuration => (StepStatus::Error, RunStatus::Error),
            };
            report.status = step_status;
            let cause = match step_status {
                StepStatus::TimedOut => {
                    format!("step {} was killed at its timeout of {}", step.name, crate::printable::duration(timeout))
                }
                StepStatus::Cancelled => format!("cancelled during step {}", step.name),
                // A step's own failure, in the executor's words (they name the step).
                StepStatus::Failure => match &error {
                    HostError::Answered { error, .. } => error.message.clone(),
                    HostError::Fault { .. } => format!("step {}: {error}", step.name),
                },
                _ => format!("step {}: {error}", step.name),
            };
            if step.continue_on_error && run_status == RunStatus::Failure {
                // A step that failed or passed its own timeout; the run's own deadline is
                // checked before the next step.
                log.note(format!("{cause}; the run goes on (continue-on-error)"));
                return Ok(());
            }
            Err(Ended { status: run_status, cause })
        }
    }
}

/// What the executor runs for `step`, whose own command is `command` (a `run` script, or the
/// `exec` of a shared step): in its working directory, under its shell.
fn step_script(step: &crate::workflow::Step, command: &str) -> String {
    use knotless_protocol::sdk::payload::quote;
    let mut script = String::new();
    if let Some(dir) = &step.working_directory {
        script.push_str(&format!("cd -- {} || exit 1\n", quote(dir)));
    }
    match step.shell {
        crate::workflow::Shell::Sh => script.push_str(command),
        crate::workflow::Shell::Bash => {
            script.push_str(&format!("exec bash --noprofile --norc -eo pipefail -c {} bash\n", quote(command)));
        }
    }
    script
}

async fn fetch_outputs(session: &Session, plan: &RunPlan, log: &mut RunLog<'_>) -> Result<Vec<OutputFile>, Ended> {
    let Some(dir) = &plan.outputs_dir else {
        return Ok(Vec::new());
    };
    let cleared = dir.clone();
    blocking(move || if cleared.exists() { std::fs::remove_dir_all(&cleared) } else { Ok(()) }).await.map_err(
        |error| Ended {
            status: RunStatus::Error,
            cause: format!("cannot clear the outputs folder {}: {error}", dir.display()),
        },
    )?;
    let paths = session.paths();
    let never = CancellationToken::new();
    let download =
        session.download(&paths.outputs, dir, plan.limits.outputs_max_bytes, plan.limits.transfer_timeout, &never);
    watched(log, session, "outputs", download)
        .await
        .map_err(|error| Ended::from_host("cannot download the outputs", &error))?;
    // What the executor said of the download (entries it left out) came before its answer.
    notes(log, session.drain_events().await);
    let listed = dir.clone();
    let files = blocking(move || list_outputs(&listed)).await;
    if !files.is_empty() {
        log.note(format!("{} output file(s) in {}", files.len(), dir.display()));
    }
    Ok(files)
}

/// Runs filesystem work (removing a folder, walking one) on the blocking pool, off the
/// threads that drive runs.
pub(crate) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

/// Awaits `transfer` on `session`, telling the sink how far it has got every half second once
/// it has taken a second.
pub(crate) async fn watched<T>(
    log: &mut RunLog<'_>,
    session: &Session,
    what: &str,
    transfer: impl std::future::Future<Output = T>,
) -> T {
    const FIRST: Duration = Duration::from_secs(1);
    const EVERY: Duration = Duration::from_millis(500);
    tokio::pin!(transfer);
    let started = tokio::time::Instant::now();
    let mut ticks = tokio::time::interval_at(started + FIRST, EVERY);
    let mut shown = false;
    loop {
        tokio::select! {
            ended = &mut transfer => {
                if shown {
                    log.progress(None);
                }
                return ended;
            }
            _ = ticks.tick() => {
                shown = true;
                log.progress(Some(Progress { what, bytes: session.transferred(), elapsed: started.elapsed() }));
            }
        }
    }
}

/// The regular files under `dir`, images flagged by their extension.
pub fn list_outputs(dir: &std::path::Path) -> Vec<OutputFile> {
    let mut files = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else { continue };
        for entry in entries.flatten() {
            let Ok(metadata) = entry.path().symlink_metadata() else { continue };
            if metadata.is_dir() {
                folders.push(entry.path());
            } else if metadata.is_file() {
                let path = entry.path().strip_prefix(dir).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
                let extension = path.rsplit('.').next().unwrap_or("").to_ascii_lowercase();
                let image = matches!(extension.as_str(), "png" | "jpg" | "jpeg" | "gif" | "svg" | "webp");
                files.push(OutputFile { path, bytes: metadata.len(), image });
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}
