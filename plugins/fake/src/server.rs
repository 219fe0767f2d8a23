//! The fake's main loop, written without the SDK: lines in from stdin, `initialize`, `ping`,
//! `shutdown` and `cancel` handled in the loop, every other request in a task of its own.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use knotless_protocol::error::code;
use knotless_protocol::messages::*;
use knotless_protocol::version::{SUPPORTED_VERSIONS, negotiate};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::mode::Mode;
use crate::sessions::Sessions;
use crate::wire::{Fault, Out, params, result, rpc};
use crate::{step, transfer};

/// What `initialize` settled.
pub struct Setup {
    /// The mode after the handshake.
    pub mode: Mode,
    /// The sessions.
    pub sessions: Sessions,
    /// The rest of each session's broken download, sent at its stop (`break-download`).
    pub held_downloads: transfer::HeldDownloads,
}

/// State shared by the loop and the request tasks.
pub struct Shared {
    /// The one writer of stdout.
    pub out: Out,
    /// Set by `initialize`.
    pub setup: OnceLock<Setup>,
    /// Whether the `garbage` mode has written its line.
    pub garbage_written: AtomicBool,
    in_flight: Mutex<HashMap<String, CancellationToken>>,
    /// Lines to write right after the answer to a request, by its id (`late-output`).
    after_answer: Mutex<HashMap<String, Vec<Vec<u8>>>>,
    /// Held by the request that runs (`serial-requests`).
    serial: tokio::sync::Mutex<()>,
}

/// Whether requests run one at a time (`serial-requests`).
fn serial(shared: &Shared) -> bool {
    shared.setup.get().is_some_and(|setup| setup.mode == Mode::SerialRequests)
}

impl Shared {
    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.in_flight.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Keeps `lines` to write right after the answer to the request `request`.
    pub fn keep_until_answered(&self, request: &str, lines: Vec<Vec<u8>>) {
        self.after_answer.lock().unwrap_or_else(|poison| poison.into_inner()).insert(request.to_string(), lines);
    }

    fn after_answer(&self, request: &str) -> Vec<Vec<u8>> {
        self.after_answer.lock().unwrap_or_else(|poison| poison.into_inner()).remove(request).unwrap_or_default()
    }
}

/// Serves the protocol on stdin and stdout until `shutdown` or the end of stdin.
pub async fn run(cli_mode: Option<Mode>) -> anyhow::Result<()> {
    let shared = Arc::new(Shared {
        out: Out::stdout(),
        setup: OnceLock::new(),
        garbage_written: AtomicBool::new(false),
        in_flight: Mutex::new(HashMap::new()),
        after_answer: Mutex::new(HashMap::new()),
        serial: tokio::sync::Mutex::new(()),
    });
    if cli_mode == Some(Mode::GarbageAtStart) {
        shared.out.line(b"HELLO I AM NOT JSON").await?;
    }
    let mut input = BufReader::new(tokio::io::stdin());
    let mut tasks = JoinSet::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line).await? == 0 {
            break;
        }
        while tasks.try_join_next().is_some() {}
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let message: Value = match serde_json::from_slice(&line) {
            Ok(message) => message,
            Err(error) => {
                let fault = Fault::new(rpc::PARSE_ERROR, format!("not json: {error}"));
                shared.out.reply(Value::Null, Err(fault)).await;
                continue;
            }
        };
        let Some(name) = message.get("method").and_then(Value::as_str).map(str::to_string) else {
            // A response to nothing we asked: the fake sends no requests.
            if let Some(id) =
                message.get("id").filter(|_| message.get("result").is_none() && message.get("error").is_none())
            {
                let fault = Fault::new(rpc::INVALID_REQUEST, "a message without a method");
                shared.out.reply(id.clone(), Err(fault)).await;
            }
            continue;
        };
        let Some(id) = message.get("id").cloned() else {
            if name == method::CANCEL {
                cancel(&shared, message.get("params"));
            }
            continue;
        };
        let params = message.get("params");
        match name.as_str() {
            method::INITIALIZE => {
                let outcome = initialize(&shared, cli_mode, params);
                shared.out.reply(id, outcome).await;
            }
            method::PING if serial(&shared) => {
                // Answered only once no other request runs.
                let shared = shared.clone();
                tasks.spawn(async move {
                    let _turn = shared.serial.lock().await;
                    shared.out.reply(id, Ok(json!({}))).await;
                });
            }
            method::PING => {
                let outcome = match cli_mode {
                    Some(Mode::PingBeforeInitialize) => Ok(json!({})),
                    _ => setup(&shared).map(|_| json!({})),
                };
                shared.out.reply(id, outcome).await;
            }
            method::SHUTDOWN => {
                if shared.setup.get().is_some_and(|setup| setup.mode == Mode::ShutdownDropsRequests) {
                    eprintln!("fake: answering shutdown, leaving what is in flight (simulated)");
                    shared.out.reply(id, Ok(json!({}))).await;
                    std::process::exit(0);
                }
                wind_down(&shared, &mut tasks, true).await;
                shared.out.reply(id, Ok(json!({}))).await;
                return Ok(());
            }
            method::START | method::COMMAND | method::STOP | method::CLEANUP | method::UPLOAD | method::DOWNLOAD => {
                if let Err(fault) = setup(&shared) {
                    shared.out.reply(id, Err(fault)).await;
                } else if name == method::COMMAND
                    && shared.setup.get().is_some_and(|setup| setup.mode == Mode::HangInStep)
                {
                    eprintln!("fake: hanging in the step (simulated)");
                } else {
                    spawn(&shared, &mut tasks, id, name, params.cloned());
                }
            }
            other => {
                let answers = shared.setup.get().is_some_and(|setup| setup.mode == Mode::AnswerUnknownMethods);
                let outcome = if answers {
                    eprintln!("fake: answering the unknown method {other} with a result (simulated)");
                    Ok(json!({}))
                } else {
                    Err(Fault::new(rpc::METHOD_NOT_FOUND, format!("unknown method {other}")))
                };
                shared.out.reply(id, outcome).await;
            }
        }
    }
    // The runner closed stdin: it is gone, so nothing it started may outlive it.
    let leave = shared.setup.get().is_some_and(|setup| setup.mode == Mode::LeaveSessionsAtEof);
    if leave {
        eprintln!("fake: leaving the sessions at the end of stdin (simulated)");
    }
    wind_down(&shared, &mut tasks, !leave).await;
    Ok(())
}

/// Cancels every request in flight, waits for their answers, and stops every session (unless
/// `stop_sessions` is false).
async fn wind_down(shared: &Shared, tasks: &mut JoinSet<()>, stop_sessions: bool) {
    for token in shared.in_flight().values() {
        token.cancel();
    }
    let drained =
        tokio::time::timeout(Duration::from_secs(10), async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        eprintln!("fake: requests still running at shutdown were aborted");
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    if let Some(setup) = shared.setup.get()
        && stop_sessions
    {
        setup.sessions.stop_all();
    }
}

fn setup(shared: &Shared) -> Result<&Setup, Fault> {
    shared.setup.get().ok_or_else(|| Fault::new(code::NOT_INITIALIZED, "initialize first"))
}

fn cancel(shared: &Shared, params: Option<&Value>) {
    let Ok(CancelParams { id }) = crate::wire::params::<CancelParams>(params) else {
        eprintln!("fake: a cancel without an id");
        return;
    };
    if shared.setup.get().is_some_and(|setup| setup.mode.ignores_cancel()) {
        eprintln!("fake: ignoring the cancel of request {id} (simulated)");
        return;
    }
    if let Some(token) = shared.in_flight().get(&id.to_string()) {
        token.cancel();
    }
}

/// Runs one request in a task, registered for cancellation until it answers.
fn spawn(shared: &Arc<Shared>, tasks: &mut JoinSet<()>, id: Value, name: String, params: Option<Value>) {
    let token = CancellationToken::new();
    shared.in_flight().insert(id.to_string(), token.clone());
    let shared = shared.clone();
    tasks.spawn(async move {
        let request = id.to_string();
        let _turn = match serial(&shared) {
            true => Some(shared.serial.lock().await),
            false => None,
        };
        let outcome = match setup(&shared) {
            Ok(setup) => handle(&shared, setup, &name, params.as_ref(), token, &request).await,
            Err(fault) => Err(fault),
        };
        shared.in_flight().remove(&request);
        let after = shared.after_answer(&request);
        shared.out.reply_then(id, outcome, after).await;
    });
}

async fn handle(
    shared: &Shared,
    setup: &Setup,
    name: &str,
    raw: Option<&Value>,
    token: CancellationToken,
    request: &str,
) -> Result<Value, Fault> {
    let sessions = &setup.sessions;
    match name {
        method::START => {
            let params: StartParams = params(raw)?;
            let again = setup.mode == Mode::DuplicateStart;
            guarded(&token, session_deadline(setup, params.timeout_ms), "start", async {
                result(&sessions.start(&params, again)?)
            })
            .await
        }
        method::STOP => {
            let params: StopParams = params(raw)?;
            if setup.mode == Mode::StopUnknownOk && sessions.dir(&params.session).is_err() {
                eprintln!("fake: stopping session {}, which was never started (simulated)", params.session);
                return result(&StopResult::default());
            }
            guarded(&token, session_deadline(setup, params.timeout_ms), "stop", async {
                setup.held_downloads.send_rest(&params.session, Duration::from_millis(params.timeout_ms)).await;
                result(&sessions.stop(&params, setup.mode == Mode::IgnoreKeep)?)
            })
            .await
        }
        method::CLEANUP => {
            let params: CleanupParams = params(raw)?;
            guarded(&token, session_deadline(setup, params.timeout_ms), "cleanup", async {
                result(&sessions.cleanup(&params, setup.mode == Mode::SweepKept)?)
            })
            .await
        }
        method::COMMAND => result(&step::command(shared, setup, params(raw)?, token, request).await?),
        method::UPLOAD => {
            let params: TransferParams = params(raw)?;
            let timeout_ms = transfer_deadline(setup, &params);
            guarded(&token, timeout_ms, "upload", transfer::upload(setup, &params)).await
        }
        method::DOWNLOAD => {
            let params: TransferParams = params(raw)?;
            let timeout_ms = transfer_deadline(setup, &params);
            guarded(&token, timeout_ms, "download", transfer::download(setup, &params)).await
        }
        other => Err(Fault::new(rpc::METHOD_NOT_FOUND, format!("unknown method {other}"))),
    }
}

/// A transfer's deadline: its `timeout_ms`, or a day (`no-transfer-deadline`).
fn transfer_deadline(setup: &Setup, params: &TransferParams) -> u64 {
    if setup.mode == Mode::NoTransferDeadline {
        eprintln!("fake: ignoring the transfer's timeout of {} ms (simulated)", params.timeout_ms);
        return 86_400_000;
    }
    params.timeout_ms
}

/// The deadline of `start`, `stop` or `cleanup`: its `timeout_ms`, or a day
/// (`no-session-deadline`).
fn session_deadline(setup: &Setup, timeout_ms: u64) -> u64 {
    if setup.mode == Mode::NoSessionDeadline {
        eprintln!("fake: ignoring a timeout of {timeout_ms} ms (simulated)");
        return 86_400_000;
    }
    timeout_ms
}

/// Races an operation against its deadline and its cancellation. A `timeout_ms` of 0 is a
/// deadline already passed: the operation is not begun.
async fn guarded<T>(
    token: &CancellationToken,
    timeout_ms: u64,
    what: &str,
    operation: impl Future<Output = Result<T, Fault>>,
) -> Result<T, Fault> {
    if timeout_ms == 0 {
        return Err(Fault::new(code::TIMEOUT, format!("{what} was given a timeout_ms of 0: its deadline has passed")));
    }
    tokio::select! {
        outcome = tokio::time::timeout(Duration::from_millis(timeout_ms), operation) => outcome.unwrap_or_else(|_| {
            Err(Fault::new(code::TIMEOUT, format!("{what} took longer than {timeout_ms} ms")))
        }),
        () = token.cancelled() => Err(Fault::cancelled()),
    }
}

/// Negotiates the version, reads the configuration and settles the mode.
fn initialize(shared: &Shared, cli_mode: Option<Mode>, raw: Option<&Value>) -> Result<Value, Fault> {
    if shared.setup.get().is_some() {
        return Err(Fault::new(rpc::INVALID_REQUEST, "initialize was already answered"));
    }
    let params: InitializeParams = params(raw)?;
    let config = &params.config;
    const KEYS: [&str; 8] = ["work-dir", "ledger", "mode", "isolation", "secrets", "outputs", "caches", "images"];
    if cli_mode == Some(Mode::AcceptUnknownOptions) {
        eprintln!("fake: accepting every option (simulated)");
    } else if let Some(key) = config.keys().find(|key| !KEYS.contains(&key.as_str())) {
        return Err(Fault::configuration(format!("unknown option --{key}; the fake takes {}", KEYS.join(", "))));
    }
    let declared_or = |key: &str, default: bool| -> Result<bool, Fault> {
        match config.get(key).map(String::as_str) {
            None => Ok(default),
            Some("true") => Ok(true),
            Some("false") => Ok(false),
            Some(other) => Err(Fault::configuration(format!("--{key} {other:?}: true or false"))),
        }
    };
    let isolation = match config.get("isolation").map(String::as_str) {
        None | Some("none") => Isolation::None,
        Some("container") => Isolation::Container,
        Some("vm") => Isolation::Vm,
        Some(other) => return Err(Fault::configuration(format!("--isolation {other:?}: none, container or vm"))),
    };
    let declared = |key: &str| declared_or(key, true);
    let (secrets, outputs, caches) = (declared("secrets")?, declared("outputs")?, declared("caches")?);
    let images = declared_or("images", false)?;
    let mode = match (cli_mode, config.get("mode")) {
        (Some(mode), _) => mode,
        (None, None) => Mode::Ok,
        (None, Some(name)) => {
            let mode: Mode =
                name.parse().map_err(|error: anyhow::Error| Fault::configuration(format!("mode: {error}")))?;
            if mode.before_handshake() {
                return Err(Fault::configuration(format!("mode {mode} acts before the handshake; pass it as --mode")));
            }
            mode
        }
    };
    let supported: &[u32] = if mode == Mode::RefuseVersion { &[2] } else { SUPPORTED_VERSIONS };
    let version = match negotiate(&params.protocol_versions, supported) {
        Some(_) if mode == Mode::RefuseVersion => None,
        negotiated => negotiated,
    };
    let Some(version) = version else {
        let message = format!(
            "the runner offers protocol versions {:?}; executor fake {} speaks {supported:?}",
            params.protocol_versions,
            env!("CARGO_PKG_VERSION")
        );
        let data = json!({"offered": params.protocol_versions, "supported": supported});
        return Err(Fault::new(code::UNSUPPORTED_VERSION, message).with_data(data));
    };
    let sessions = Sessions::new(&work_dir(config), &params.runner.id, config.get("ledger").map(PathBuf::from))?;
    if shared.setup.set(Setup { mode, sessions, held_downloads: Default::default() }).is_err() {
        return Err(Fault::new(rpc::INVALID_REQUEST, "initialize was already answered"));
    }
    if mode != Mode::Ok {
        eprintln!("fake: running in mode {mode}");
    }
    // What it declares is what the options say (default: no isolation, secrets, outputs and
    // caches, no images); it behaves the same whatever it declares, so that tests see what the
    // runner does with it.
    let capabilities = Capabilities { isolation, outputs, caches, secrets, images, ..Capabilities::default() };
    result(&InitializeResult {
        protocol_version: if mode == Mode::WrongVersion { 99 } else { version },
        executor: ExecutorInfo { name: "fake".to_string(), version: env!("CARGO_PKG_VERSION").to_string() },
        capabilities,
    })
}

fn work_dir(config: &BTreeMap<String, String>) -> PathBuf {
    match config.get("work-dir") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::temp_dir().join("knotless-fake"),
    }
}
