//! knotless-host: the host of an executor. [`ExecutorHost`] starts an executor process,
//! handshakes, sends requests with their deadlines, escalates when an executor does not answer,
//! and replaces an executor that died with a fresh process that sweeps what the dead one left.
//!
//! It is a crate of its own, below both the runner (`knotless-run`, which re-exports it as
//! `knotless_run::host`) and the conformance suite (`knotless-conformance`, which drives an
//! executor through it), so that an executor's tests can host their executor as the runner does
//! without depending on the runner. It is not a module of `knotless-protocol` because it spawns
//! processes and the protocol crate never does.

// No function over 80 lines (the threshold is clippy.toml's): a longer one is split into
// steps with names.
#![warn(clippy::too_many_lines)]

mod connection;
mod locate;
mod options;
pub mod printable;
mod process;
mod session;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use knotless_protocol::messages::*;
use knotless_protocol::owner::{Liveness, liveness, owners_dir};
use knotless_protocol::{ErrorKind, ExecutorError, FailureClass, SUPPORTED_VERSIONS};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use connection::{Answer, Closed, Connection, Reply, SessionEvent, UNROUTED_LOGS, decode};
pub use locate::{PluginSearch, is_executable};
pub use options::executor_option_flag;
pub use process::{ExecutorProcess, INHERITED_VARIABLES, ProcessSpec, StderrTail, StderrWatch, describe_status};
pub use session::Session;

/// How the host runs its executor.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The program and its name.
    pub process: ProcessSpec,
    /// Who the runner is.
    pub runner: RunnerInfo,
    /// Executor options, sent in `initialize`.
    pub options: BTreeMap<String, String>,
    /// How the operator gave an option, by its key, when not by its own flag `--KEY`
    /// (`--executor-option KEY=...`): the executor's refusal names it so.
    pub option_flags: BTreeMap<String, String>,
    /// The protocol versions offered.
    pub offer_versions: Vec<u32>,
    /// How long `initialize` may take.
    pub handshake_timeout: Duration,
    /// How long an executor gets past a deadline before `cancel`, after `cancel` before
    /// SIGTERM, and after SIGTERM before SIGKILL.
    pub grace: Duration,
    /// Whether each session gets an executor process of its own (see [`ExecutorHost`]), so that
    /// an executor that hangs, crashes or breaks the protocol ends only the run it served.
    /// Otherwise one process serves every session, as `plugin check` judges an executor.
    pub process_per_session: bool,
}

impl HostConfig {
    /// A configuration with the default versions and timeouts.
    pub fn new(process: ProcessSpec, runner: RunnerInfo, options: BTreeMap<String, String>) -> HostConfig {
        HostConfig {
            process,
            runner,
            options,
            option_flags: BTreeMap::new(),
            offer_versions: SUPPORTED_VERSIONS.to_vec(),
            handshake_timeout: Duration::from_secs(30),
            grace: Duration::from_secs(10),
            process_per_session: false,
        }
    }
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HostError {
    /// The executor answered with an error.
    #[error("executor {executor}: {method}: {error}")]
    Answered {
        /// The executor's name.
        executor: String,
        /// The request.
        method: String,
        /// Its answer.
        error: ExecutorError,
    },
    /// The executor failed as a program (could not start, exited, hung, broke the protocol),
    /// a tar stream was lost or refused, or the runner's own side failed: what kind, and the
    /// whole message, with the executor's stderr tail where it has one.
    #[error("{message}")]
    Fault {
        /// What failed.
        kind: Fault,
        /// What to say.
        message: String,
    },
}

/// What failed, for a [`HostError::Fault`]: callers branch on it, never on the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The executor could not be started, or its handshake failed or has not completed.
    Start,
    /// It died, hung or broke the protocol, and is gone.
    Lost,
    /// A transfer's tar stream was lost or cut short.
    LostStream,
    /// A download held what the runner refuses (over its bound, a special file).
    Refused,
    /// The runner's own side: a folder, a lock or a side channel it could not make.
    Runner,
}

impl HostError {
    /// A fault of `kind`, saying `message`.
    pub fn fault(kind: Fault, message: impl Into<String>) -> HostError {
        HostError::Fault { kind, message: message.into() }
    }
}

impl HostError {
    /// The failure class, when this error ends a step.
    pub fn class(&self) -> FailureClass {
        match self {
            HostError::Answered { error, .. } => error.kind.step_class(),
            HostError::Fault { .. } => FailureClass::Infrastructure,
        }
    }

    /// The executor's error kind, when it answered.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            HostError::Answered { error, .. } => Some(error.kind),
            HostError::Fault { .. } => None,
        }
    }
}

/// One executor process and its connection.
pub(crate) struct Live {
    /// A number of its own within the host, to tell which sessions it served.
    number: u64,
    connection: Arc<Connection>,
    process: ExecutorProcess,
    info: std::sync::OnceLock<InitializeResult>,
    /// Whether it was lost (it died, hung or broke the protocol): counted once.
    lost: AtomicBool,
}

/// How many executor processes that served a session and ended it cleanly wait for the next
/// one; more are shut down.
const IDLE_PROCESSES: usize = 4;

/// The host of one executor. Share it with `Arc`.
///
/// With [`HostConfig::process_per_session`], every session has an executor process to itself
/// while it lives: a process that served a session which ended cleanly (its `stop` answered)
/// waits for the next one (up to [`IDLE_PROCESSES`] wait); one that died, hung or broke the
/// protocol is stopped, and ends only its session. Requests outside a session (`cleanup`,
/// `ping`) go to a waiting process. Otherwise one process serves everything, and its death
/// loses every session.
pub struct ExecutorHost {
    config: HostConfig,
    /// The one process, or (one process a session) the processes no session holds.
    current: tokio::sync::Mutex<Vec<Arc<Live>>>,
    needs_cleanup: AtomicBool,
    /// Whether a dead executor is replaced by a fresh one at the next request (it is, but
    /// while `plugin check` judges the one it started).
    replaces_dead: AtomicBool,
    /// The sessions started and not yet stopped, with the process serving each.
    in_flight: Mutex<BTreeMap<String, u64>>,
    processes: AtomicU64,
    /// Processes lost and not yet replaced by a fresh one.
    unreplaced: AtomicU64,
    counters: HostCounters,
    channels: tempfile::TempDir,
    transfers: AtomicU64,
    unrouted: mpsc::Sender<LogParams>,
}

impl ExecutorHost {
    /// Starts the executor and handshakes, so a bad configuration fails now, before any run.
    pub async fn start(config: HostConfig) -> Result<Arc<ExecutorHost>, HostError> {
        sweep_channel_folders(&std::env::temp_dir());
        let channels =
            tempfile::Builder::new().prefix(&format!("{CHANNELS_PREFIX}{}-", std::process::id())).tempdir().map_err(
                |error| HostError::fault(Fault::Runner, format!("cannot create a folder for side channels: {error}")),
            )?;
        // Its owner, so that a later sweep knows when this process is gone, whatever pid the
        // system gives another process by then.
        let owner = knotless_protocol::owner::this_process().map_err(|error| {
            HostError::fault(Fault::Runner, format!("cannot take a lock in {}: {error}", owners_dir().display()))
        })?;
        std::fs::write(channels.path().join(CHANNELS_OWNER), owner.token()).map_err(|error| {
            HostError::fault(Fault::Runner, format!("cannot write in {}: {error}", channels.path().display()))
        })?;
        let (unrouted, mut logs) = mpsc::channel::<LogParams>(connection::UNROUTED_LOGS);
        let name = config.process.name.clone();
        tokio::spawn(async move {
            while let Some(log) = logs.recv().await {
                match log.level {
                    LogLevel::Info => tracing::info!(executor = %name, "[{name}] {}", log.message),
                    LogLevel::Warn => tracing::warn!(executor = %name, "[{name}] {}", log.message),
                    LogLevel::Error => tracing::error!(executor = %name, "[{name}] {}", log.message),
                }
            }
        });
        let host = Arc::new(ExecutorHost {
            config,
            current: tokio::sync::Mutex::new(Vec::new()),
            needs_cleanup: AtomicBool::new(false),
            replaces_dead: AtomicBool::new(true),
            in_flight: Mutex::new(BTreeMap::new()),
            processes: AtomicU64::new(0),
            unreplaced: AtomicU64::new(0),
            counters: HostCounters::default(),
            channels,
            transfers: AtomicU64::new(0),
            unrouted,
        });
        host.live().await?;
        Ok(host)
    }

    /// The process id of the executor running now (one that serves no session, with a
    /// process a session), if one runs.
    pub async fn pid(&self) -> Option<u32> {
        self.current.lock().await.first().and_then(|live| live.process.pid())
    }

    /// The executor's name, as the runner calls it.
    pub fn name(&self) -> &str {
        &self.config.process.name
    }

    /// The configuration.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// Why the executor running now is gone, if its connection ended (it exited, broke the
    /// protocol, or was stopped as hung): the cause in a few words, and the whole of it with its
    /// exit status and stderr tail.
    pub async fn gone(&self) -> Option<(String, String)> {
        let live = self.current.lock().await.first().cloned()?;
        let cause = live.connection.cause()?;
        let status = match live.process.wait_exit(Duration::from_secs(1)).await {
            Some(status) => Some(status),
            None => live.process.terminate(self.config.grace).await,
        };
        let whole =
            format!("executor {} {cause} ({}); {}", self.name(), describe_status(status), live.process.tail().render());
        Some((cause.to_string(), whole))
    }

    /// What the current executor said in its handshake.
    pub async fn info(&self) -> Result<InitializeResult, HostError> {
        let live = self.live().await?;
        live.info
            .get()
            .cloned()
            .ok_or_else(|| HostError::fault(Fault::Start, "the executor has not completed its handshake"))
    }

    /// Whether a dead executor is replaced by a fresh one at the next request; when not, every
    /// request after it is gone fails, naming why it went.
    pub fn set_replaces_dead(&self, replaces: bool) {
        self.replaces_dead.store(replaces, Ordering::SeqCst);
    }

    /// The live executor (with a process a session, one no session holds), starting a fresh
    /// one (and sweeping what a dead one left) if needed.
    pub(crate) async fn live(&self) -> Result<Arc<Live>, HostError> {
        self.find_live(false).await
    }

    /// A process for a new session: with a process a session, one no session holds, taken from
    /// those waiting, or a fresh one; otherwise the one process.
    async fn take_for_session(&self) -> Result<Arc<Live>, HostError> {
        self.find_live(self.config.process_per_session).await
    }

    async fn find_live(&self, take: bool) -> Result<Arc<Live>, HostError> {
        let mut current = self.current.lock().await;
        let mut dead = Vec::new();
        current.retain(|live| {
            let open = !live.connection.is_closed();
            if !open {
                dead.push(live.clone());
            }
            open
        });
        let waiting = match current.is_empty() {
            true => None,
            false if take => Some(current.remove(0)),
            false => Some(current[0].clone()),
        };
        if waiting.is_none()
            && let Some(live) = dead.first()
            && !self.replaces_dead.load(Ordering::SeqCst)
        {
            let cause = live.connection.cause().map(|cause| cause.to_string()).unwrap_or_default();
            current.push(live.clone());
            return Err(HostError::fault(Fault::Lost, format!("executor {} is gone: it {cause}", self.name())));
        }
        // A process for a session is spawned without holding the others up: it is its alone.
        let mut current = (!take).then_some(current);
        for live in dead {
            self.bury(&live).await;
        }
        let live = match waiting {
            Some(live) => live,
            None => {
                let live = self.spawn().await?;
                if let Some(current) = current.as_mut() {
                    current.push(live.clone());
                }
                live
            }
        };
        if self.needs_cleanup.swap(false, Ordering::SeqCst) {
            self.sweep_after_crash(&live).await;
        }
        Ok(live)
    }

    /// Stops a process whose connection ended, logs why, and loses its sessions.
    async fn bury(&self, live: &Arc<Live>) {
        let status = live.process.terminate(self.config.grace).await;
        tracing::warn!(
            executor = %self.name(),
            "executor {} {} ({}); {}",
            self.name(),
            live.connection.cause().map(|cause| cause.to_string()).unwrap_or_default(),
            describe_status(status),
            live.process.tail().render()
        );
        self.lose_sessions(live);
    }

    /// Gives back the process of a session that ended: with a process a session, it waits for
    /// the next session when it is well and fewer than [`IDLE_PROCESSES`] wait; otherwise it
    /// is shut down.
    pub(crate) async fn give_back(&self, live: Arc<Live>) {
        if !self.config.process_per_session {
            return;
        }
        let mut current = self.current.lock().await;
        if !live.connection.is_closed() && current.len() < IDLE_PROCESSES {
            current.push(live);
            return;
        }
        drop(current);
        self.shut_down(live).await;
    }

    /// Asks a process to shut down and stops it. Returns whether it exited by itself.
    pub(crate) async fn shut_down(&self, live: Arc<Live>) -> bool {
        let never = CancellationToken::new();
        if !live.connection.is_closed() {
            let _ = self.call_on::<rpc::Shutdown>(&live, &Empty {}, Duration::from_secs(60), &never).await;
        }
        live.connection.close(Closed::ByRunner("shut down".into()));
        if live.process.wait_exit(self.config.grace).await.is_none() {
            live.process.terminate(self.config.grace).await;
            return false;
        }
        true
    }

    async fn spawn(&self) -> Result<Arc<Live>, HostError> {
        let (process, stdin, stdout) = ExecutorProcess::spawn(&self.config.process)
            .map_err(|error| HostError::fault(Fault::Start, format!("{error:#}")))?;
        let connection = Connection::new(stdout, stdin, self.unrouted.clone());
        let number = self.processes.fetch_add(1, Ordering::SeqCst);
        let live = Arc::new(Live { number, connection, process, info: std::sync::OnceLock::new(), lost: false.into() });
        if self.unreplaced.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |lost| lost.checked_sub(1)).is_ok() {
            self.counters.restarts.fetch_add(1, Ordering::Relaxed);
        }
        let params = InitializeParams {
            protocol_versions: self.config.offer_versions.clone(),
            runner: self.config.runner.clone(),
            config: self.config.options.clone(),
        };
        let never = CancellationToken::new();
        let answer = self.call_on::<rpc::Initialize>(&live, &params, self.config.handshake_timeout, &never).await;
        let name = self.name();
        let refused = |message: String| async {
            live.connection.close(Closed::ByRunner("handshake failed".into()));
            live.process.terminate(self.config.grace).await;
            HostError::fault(Fault::Start, message)
        };
        let info = match answer {
            Ok(info) => info,
            Err(HostError::Answered { error, .. }) if error.kind == ErrorKind::UnsupportedVersion => {
                let supported = error.data.as_ref().and_then(|data| data.get("supported")).map(|v| v.to_string());
                let message = format!(
                    "executor {name} speaks protocol versions {} and this runner speaks {:?}: install matching versions ({})",
                    supported.unwrap_or_else(|| "(not said)".into()),
                    self.config.offer_versions,
                    error.message
                );
                return Err(refused(message).await);
            }
            Err(HostError::Answered { error, .. }) if error.kind == ErrorKind::Configuration => {
                let message = options::as_given(&error.message, &self.config.option_flags);
                let message = crate::printable::name(&message);
                return Err(refused(format!("executor {name} refused its configuration: {message}")).await);
            }
            Err(HostError::Answered { error, .. }) => {
                return Err(refused(format!("executor {name} failed its handshake: {}", error.message)).await);
            }
            // Lost during its handshake: it never started.
            Err(HostError::Fault { message, .. }) => return Err(HostError::fault(Fault::Start, message)),
        };
        if !self.config.offer_versions.contains(&info.protocol_version) {
            let message = format!(
                "executor {name} picked protocol version {}, which this runner did not offer (it speaks {:?})",
                info.protocol_version, self.config.offer_versions
            );
            return Err(refused(message).await);
        }
        tracing::info!(
            executor = %name,
            "executor {name} is {} {} on protocol {}, isolation {:?}",
            info.executor.name,
            info.executor.version,
            info.protocol_version,
            info.capabilities.isolation
        );
        let _ = live.info.set(info);
        Ok(live)
    }

    async fn sweep_after_crash(&self, live: &Arc<Live>) {
        let params = CleanupParams { keep: Vec::new(), remove_kept: false, timeout_ms: 120_000 };
        let never = CancellationToken::new();
        let swept = self.call_on::<rpc::Cleanup>(live, &params, Duration::from_secs(120), &never).await;
        self.counters.count_cleanup(&swept);
        match swept {
            Ok(result) => log_cleanup(self.name(), "after a crash", &result),
            Err(error) => tracing::error!(executor = %self.name(), "cleanup after a crash failed: {error}"),
        }
    }

    /// The sessions `live` served are lost with it; the next process sweeps what they left.
    fn lose_sessions(&self, live: &Live) {
        if !live.lost.swap(true, Ordering::SeqCst) {
            self.unreplaced.fetch_add(1, Ordering::SeqCst);
        }
        self.in_flight.lock().unwrap_or_else(|poison| poison.into_inner()).retain(|_, number| *number != live.number);
        self.needs_cleanup.store(true, Ordering::SeqCst);
    }

    /// Sends a request to `live` and waits for its answer: up to `timeout` plus a grace
    /// period, then `cancel`, then another grace period, then the executor is killed.
    pub(crate) async fn call_on<M: Method>(
        &self,
        live: &Arc<Live>,
        params: &M::Params,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<M::Result, HostError> {
        let method = M::NAME;
        let grace = self.config.grace;
        let (id, mut answer) = live.connection.send(method, params).await;
        let mut answered = tokio::select! {
            answer = &mut answer => Some(answer),
            () = tokio::time::sleep(timeout + grace) => None,
            () = cancel.cancelled() => None,
        };
        if answered.is_none() {
            live.connection.notify::<rpc::Cancel>(&CancelParams { id: id.into() }).await;
            answered = tokio::select! {
                answer = &mut answer => Some(answer),
                () = tokio::time::sleep(grace) => None,
            };
        }
        let name = self.name();
        match answered {
            Some(Ok(Ok(value))) => match connection::decode::<M::Result>(method, &value) {
                Ok(result) => Ok(result),
                Err(detail) => Err(self.kill(live, format!("executor {name} {detail}")).await),
            },
            Some(Ok(Err(Reply::Error(error)))) => {
                Err(HostError::Answered { executor: name.to_string(), method: method.to_string(), error })
            }
            Some(Ok(Err(Reply::Lost(cause)))) => Err(self.lost(live, method, cause).await),
            Some(Err(_)) => Err(self.lost(live, method, cause_of(&live.connection)).await),
            None => {
                let waited = if cancel.is_cancelled() {
                    "after it was cancelled".to_string()
                } else {
                    format!("within {}", crate::printable::duration(timeout + grace))
                };
                let message = format!(
                    "executor {name} did not answer {method} {waited}, nor {} after a cancel",
                    crate::printable::duration(grace)
                );
                Err(self.kill(live, message).await)
            }
        }
    }

    /// The connection ended while a request waited: word it with the exit status and stderr.
    async fn lost(&self, live: &Arc<Live>, method: &str, cause: Closed) -> HostError {
        let status = match live.process.wait_exit(Duration::from_secs(2)).await {
            Some(status) => Some(status),
            None => live.process.terminate(self.config.grace).await,
        };
        self.mark_dead(live);
        // A cause the runner wrote when it stopped the executor names the executor already.
        let name = format!("executor {} ", self.name());
        let cause = cause.to_string();
        let cause = cause.strip_prefix(&name).unwrap_or(&cause);
        HostError::fault(
            Fault::Lost,
            format!("{name}{cause} during {method} ({}); {}", describe_status(status), live.process.tail().render()),
        )
    }

    /// Stops a misbehaving executor: SIGTERM to its group, grace, SIGKILL.
    async fn kill(&self, live: &Arc<Live>, message: String) -> HostError {
        tracing::error!(executor = %self.name(), "{message}");
        live.connection.close(Closed::ByRunner(message.clone()));
        let status = live.process.terminate(self.config.grace).await;
        self.mark_dead(live);
        HostError::fault(
            Fault::Lost,
            format!("{message}; stopped it ({}); {}", describe_status(status), live.process.tail().render()),
        )
    }

    fn mark_dead(&self, live: &Arc<Live>) {
        live.connection.close(Closed::ByRunner("the executor was stopped".into()));
        self.lose_sessions(live);
    }

    /// Sends a request of method `M` to the live executor.
    pub async fn call<M: Method>(
        &self,
        params: &M::Params,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<M::Result, HostError> {
        let live = self.live().await?;
        self.call_on::<M>(&live, params, timeout, cancel).await
    }

    /// Creates a session.
    pub async fn open(self: &Arc<Self>, params: StartParams, cancel: &CancellationToken) -> Result<Session, HostError> {
        let live = self.take_for_session().await?;
        let events = live.connection.subscribe(&params.session);
        let timeout = Duration::from_millis(params.timeout_ms);
        let session_id = params.session.clone();
        self.in_flight.lock().unwrap_or_else(|poison| poison.into_inner()).insert(session_id.clone(), live.number);
        match self.call_on::<rpc::Start>(&live, &params, timeout, cancel).await {
            Ok(result) => Ok(Session::new(self.clone(), live, session_id, result, events)),
            Err(error) => {
                live.connection.unsubscribe(&session_id);
                // A start that failed may still have created something: the session is ended
                // on the executor too, so nothing is left behind.
                if !live.connection.is_closed() {
                    let stop = StopParams { session: session_id.clone(), keep: false, timeout_ms: 60_000 };
                    let never = CancellationToken::new();
                    let _ = self.call_on::<rpc::Stop>(&live, &stop, Duration::from_secs(60), &never).await;
                }
                self.session_ended(&session_id);
                self.give_back(live).await;
                Err(error)
            }
        }
    }

    pub(crate) fn session_ended(&self, session: &str) {
        self.in_flight.lock().unwrap_or_else(|poison| poison.into_inner()).remove(session);
    }

    /// The sessions started and not yet stopped.
    pub fn sessions_in_flight(&self) -> Vec<String> {
        self.in_flight.lock().unwrap_or_else(|poison| poison.into_inner()).keys().cloned().collect()
    }

    /// Sweeps everything this runner left, but the sessions in flight, and logs it.
    pub async fn cleanup(&self, timeout: Duration) -> Result<CleanupResult, HostError> {
        self.sweep(false, timeout).await
    }

    /// Sweeps as [`ExecutorHost::cleanup`] does, and also removes the environments of sessions
    /// kept with `keep` whose owner is gone (`remove_kept`): what `run --cleanup` asks for.
    pub async fn cleanup_kept(&self, timeout: Duration) -> Result<CleanupResult, HostError> {
        self.sweep(true, timeout).await
    }

    async fn sweep(&self, remove_kept: bool, timeout: Duration) -> Result<CleanupResult, HostError> {
        let params =
            CleanupParams { keep: self.sessions_in_flight(), remove_kept, timeout_ms: timeout.as_millis() as u64 };
        let swept = self.call::<rpc::Cleanup>(&params, timeout, &CancellationToken::new()).await;
        self.counters.count_cleanup(&swept);
        let result: CleanupResult = swept?;
        log_cleanup(self.name(), if remove_kept { "sweep of kept sessions" } else { "sweep" }, &result);
        Ok(result)
    }

    /// What this host has counted since it started: executor processes started again in place
    /// of lost ones, and what its sweeps removed and failed to.
    pub fn counters(&self) -> &HostCounters {
        &self.counters
    }

    /// Ends the executor: sweeps after a crash if one is pending, asks each process no session
    /// holds to shut down, and stops it. Returns whether they all exited by themselves after
    /// answering (false when none ran).
    pub async fn shutdown(&self) -> bool {
        if self.needs_cleanup.load(Ordering::SeqCst) {
            // `live` starts a fresh executor that sweeps what the dead one left.
            if let Err(error) = self.live().await {
                tracing::error!(executor = %self.name(), "cannot start executor {} to sweep after a crash: {error}", self.name());
            }
        }
        let waiting = std::mem::take(&mut *self.current.lock().await);
        let mut all_exited = !waiting.is_empty();
        for live in waiting {
            all_exited &= self.shut_down(live).await;
        }
        all_exited
    }

    fn next_channel(&self) -> std::path::PathBuf {
        let number = self.transfers.fetch_add(1, Ordering::SeqCst);
        self.channels.path().join(format!("transfer-{number}.sock"))
    }
}

/// Counts of what an [`ExecutorHost`] did since it started, for monitoring.
#[derive(Debug, Default)]
pub struct HostCounters {
    restarts: AtomicU64,
    cleanup_removed: AtomicU64,
    cleanup_failures: AtomicU64,
}

impl HostCounters {
    /// Executor processes started in place of one that was lost: it exited, was stopped as hung,
    /// or broke the protocol. With a process a session, a process started for a new session
    /// while none waits is no restart unless one was lost.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// The resources the executor's sweeps (`cleanup`) removed.
    pub fn cleanup_removed(&self) -> u64 {
        self.cleanup_removed.load(Ordering::Relaxed)
    }

    /// The failures the executor's sweeps named, plus one for each sweep that failed whole.
    pub fn cleanup_failures(&self) -> u64 {
        self.cleanup_failures.load(Ordering::Relaxed)
    }

    fn count_cleanup<E>(&self, swept: &Result<CleanupResult, E>) {
        let (removed, failures) = match swept {
            Ok(result) => (result.removed.len(), result.failures.len()),
            Err(_) => (0, 1),
        };
        self.cleanup_removed.fetch_add(removed as u64, Ordering::Relaxed);
        self.cleanup_failures.fetch_add(failures as u64, Ordering::Relaxed);
    }
}

/// The side-channel folders' prefix in the temporary folder: `knotless-run-<pid>-<random>`.
const CHANNELS_PREFIX: &str = "knotless-run-";

/// The file in a side-channel folder that names its runner process's owner token.
const CHANNELS_OWNER: &str = "owner";

/// Removes the side-channel folders that runners which died without cleaning up (`kill -9`)
/// left in `tmp`: those whose owner ([`knotless_protocol::owner`]) is gone, or, for a folder
/// without an owner file (made by an older runner), whose process is gone. Only folders of
/// exactly that shape, owned by this user and not links, are touched; a folder of a live
/// runner stays.
pub fn sweep_channel_folders(tmp: &std::path::Path) -> usize {
    use std::os::unix::fs::MetadataExt as _;
    // `/proc/self` belongs to this process's user.
    let Ok(uid) = std::fs::metadata("/proc/self").map(|metadata| metadata.uid()) else { return 0 };
    let mut removed = 0;
    for entry in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((pid, random)) = name.strip_prefix(CHANNELS_PREFIX).and_then(|rest| rest.split_once('-')) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if random.is_empty() || !random.chars().all(|c| c.is_ascii_alphanumeric()) {
            continue;
        }
        let Ok(metadata) = std::fs::symlink_metadata(entry.path()) else { continue };
        if !metadata.is_dir() || metadata.uid() != uid {
            continue;
        }
        let gone = match std::fs::read_to_string(entry.path().join(CHANNELS_OWNER)) {
            Ok(token) => liveness(&token) == Liveness::Dead,
            // A folder being made has no owner file for a moment: its process lives.
            Err(_) => !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        };
        if !gone {
            continue;
        }
        if std::fs::remove_dir_all(entry.path()).is_ok() {
            tracing::debug!(
                "removed {}, the side channels of runner process {pid}, which is gone",
                entry.path().display()
            );
            removed += 1;
        }
    }
    removed
}

fn cause_of(connection: &Connection) -> Closed {
    connection.cause().unwrap_or(Closed::EndOfStream)
}

fn log_cleanup(executor: &str, when: &str, result: &CleanupResult) {
    let removed: Vec<String> =
        result.removed.iter().map(|resource| format!("{} {}", resource.kind, resource.name)).collect();
    tracing::info!(
        executor = %executor,
        removed = result.removed.len(),
        failures = result.failures.len(),
        "cleanup ({when}) removed {}: {}",
        result.removed.len(),
        if removed.is_empty() { "nothing".to_string() } else { removed.join(", ") }
    );
    for failure in &result.failures {
        tracing::error!(executor = %executor, "cleanup ({when}) failed: {failure}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(path: &str) -> HostConfig {
        let runner = RunnerInfo { name: "knotless-run".into(), version: "0".into(), id: "host-test".into() };
        let spec = ProcessSpec { name: "test".into(), path: path.into(), pass_env: Vec::new() };
        let mut config = HostConfig::new(spec, runner, BTreeMap::new());
        config.handshake_timeout = Duration::from_secs(10);
        config
    }

    /// An executor that cannot be started, or that ends before its handshake, is a start fault,
    /// whatever the message says.
    #[tokio::test]
    async fn a_program_that_never_handshakes_is_a_start_fault() {
        for path in ["/nonexistent/knotless-executor-none", "/bin/true"] {
            match ExecutorHost::start(config(path)).await {
                Err(HostError::Fault { kind, message }) => assert_eq!(kind, Fault::Start, "{path}: {message}"),
                Err(other) => panic!("{path}: {other}"),
                Ok(_) => panic!("{path} handshook"),
            }
        }
    }
}
