//! The executor SDK: implement [`Executor`], and `main` is [`main`] (logging to stderr, then
//! [`serve`] until the runner ends it).
//!
//! ```no_run
//! use knotless_protocol::sdk::{self, Executor};
//! # struct MyExecutor;
//! # impl Executor for MyExecutor {
//! #   fn info(&self) -> knotless_protocol::ExecutorInfo { unimplemented!() }
//! #   async fn initialize(&self, _: &knotless_protocol::InitializeParams) -> Result<knotless_protocol::Capabilities, knotless_protocol::ExecutorError> { unimplemented!() }
//! #   async fn start(&self, _: knotless_protocol::StartParams, _: sdk::Context) -> Result<knotless_protocol::StartResult, knotless_protocol::ExecutorError> { unimplemented!() }
//! #   async fn command(&self, _: knotless_protocol::CommandParams, _: sdk::Context) -> Result<knotless_protocol::CommandResult, knotless_protocol::ExecutorError> { unimplemented!() }
//! #   async fn stop(&self, _: knotless_protocol::StopParams, _: sdk::Context) -> Result<knotless_protocol::StopResult, knotless_protocol::ExecutorError> { unimplemented!() }
//! #   async fn cleanup(&self, _: knotless_protocol::CleanupParams, _: sdk::Context) -> Result<knotless_protocol::CleanupResult, knotless_protocol::ExecutorError> { unimplemented!() }
//! #   async fn upload(&self, _: &knotless_protocol::TransferParams, _: sdk::UploadStream, _: sdk::Context) -> Result<(), knotless_protocol::ExecutorError> { unimplemented!() }
//! #   async fn download(&self, _: &knotless_protocol::TransferParams, _: sdk::DownloadStream, _: sdk::Context) -> Result<(), knotless_protocol::ExecutorError> { unimplemented!() }
//! # }
//! fn main() -> anyhow::Result<std::process::ExitCode> {
//!     sdk::main(MyExecutor)
//! }
//! ```

pub mod output;
pub mod payload;
pub mod quantity;
pub mod remote;
mod serve;
pub mod state;
pub mod stdin_frames;
mod transfer;

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::envelope::Notification;
use crate::error::ExecutorError;
use crate::framing;
use crate::messages::*;
use crate::version::MAX_OUTPUT_CHUNK;

pub use serve::{serve, serve_io};

/// An executor's logging: `tracing` to stderr (stdout carries the protocol's frames and
/// nothing else), filtered by `KNOTLESS_LOG` (default `info`), as plain text without colours or
/// times (the runner forwards each line, prefixed with the executor's name, into its own log),
/// and a closed stderr (the runner is gone) dropping lines rather than panicking the executor.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KNOTLESS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .with_env_filter(filter)
        .init();
}

/// An executor's whole `main`: its logging ([`init_logging`]), then [`serve`] on stdin and
/// stdout, on a runtime of one thread with the protocol's loop a task of it (a wake-up of the
/// runtime's own future would cost a write to its eventfd and one more `epoll_wait` a step),
/// until the runner shuts it down or closes stdin. Work that blocks goes to
/// `tokio::task::spawn_blocking`.
pub fn main<E: Executor>(executor: E) -> anyhow::Result<std::process::ExitCode> {
    if let Some(code) = command_line(&executor) {
        return Ok(code);
    }
    init_logging();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async { tokio::spawn(serve(executor)).await })??;
    Ok(std::process::ExitCode::SUCCESS)
}
pub use state::{Initialized, Sessions, lock};
pub use transfer::{DownloadStream, UploadStream};

/// What an executor's program does with its command line before it serves: `--version`
/// prints its name, version and protocol versions, `--help` what it is; any other argument is
/// refused, since the runner starts it with none. `None`: there were none, serve.
pub fn command_line<E: Executor>(executor: &E) -> Option<std::process::ExitCode> {
    use std::io::Write as _;
    let argument = std::env::args_os().nth(1)?;
    let info = executor.info();
    let program = format!("knotless-executor-{}", info.name);
    match argument.to_str() {
        Some("--version" | "-V") => {
            let _ =
                writeln!(std::io::stdout(), "{program} {} (protocol {})", info.version, crate::protocol_versions!());
            Some(std::process::ExitCode::SUCCESS)
        }
        Some("--help" | "-h") => {
            let _ = writeln!(
                std::io::stdout(),
                "{program}: an executor of knotless-run; it speaks the executor protocol on stdin and stdout.\n\
                 knotless-run starts it: `knotless-run run --executor {}`, or the daemon's --executor.\n\
                 Options: --version, --help.",
                info.name
            );
            Some(std::process::ExitCode::SUCCESS)
        }
        _ => {
            let _ = writeln!(
                std::io::stderr(),
                "{program}: unexpected argument {:?}: it takes none but --version and --help \
                 (knotless-run starts it and speaks to it on stdin and stdout)",
                argument
            );
            Some(std::process::ExitCode::from(2))
        }
    }
}

/// The operations of an [`Executor`] whose work lives in modules of its own, each a function
/// that takes the executor first and then the method's arguments: written inside the `impl
/// Executor` block, beside `info` and `initialize`, it writes the methods that only forward.
/// With no functions named, they are the layout the executors of this repository share:
/// `session::start`, `command::run`, `session::stop`, `cleanup::cleanup`, `transfer::upload`,
/// `transfer::download` and `session::shutdown`, each module at the crate's root.
///
/// ```ignore
/// impl Executor for MyExecutor {
///     fn info(&self) -> ExecutorInfo { ... }
///     async fn initialize(&self, params: &InitializeParams) -> Result<Capabilities, ExecutorError> { ... }
///     knotless_protocol::sdk::operations! {
///         start: session::start,
///         command: command::run,
///         stop: session::stop,
///         cleanup: cleanup::cleanup,
///         upload: transfer::upload,
///         download: transfer::download,
///         shutdown: session::shutdown,
///     }
/// }
/// ```
#[macro_export]
macro_rules! operations {
    () => {
        $crate::operations! {
            start: session::start,
            command: command::run,
            stop: session::stop,
            cleanup: cleanup::cleanup,
            upload: transfer::upload,
            download: transfer::download,
            shutdown: session::shutdown,
        }
    };
    (
        start: $start:path,
        command: $command:path,
        stop: $stop:path,
        cleanup: $cleanup:path,
        upload: $upload:path,
        download: $download:path,
        shutdown: $shutdown:path $(,)?
    ) => {
        async fn start(
            &self,
            params: $crate::messages::StartParams,
            context: $crate::sdk::Context,
        ) -> Result<$crate::messages::StartResult, $crate::error::ExecutorError> {
            $start(self, params, context).await
        }

        async fn command(
            &self,
            params: $crate::messages::CommandParams,
            context: $crate::sdk::Context,
        ) -> Result<$crate::messages::CommandResult, $crate::error::ExecutorError> {
            $command(self, params, context).await
        }

        async fn stop(
            &self,
            params: $crate::messages::StopParams,
            context: $crate::sdk::Context,
        ) -> Result<$crate::messages::StopResult, $crate::error::ExecutorError> {
            $stop(self, params, context).await
        }

        async fn cleanup(
            &self,
            params: $crate::messages::CleanupParams,
            context: $crate::sdk::Context,
        ) -> Result<$crate::messages::CleanupResult, $crate::error::ExecutorError> {
            $cleanup(self, params, context).await
        }

        async fn upload(
            &self,
            params: &$crate::messages::TransferParams,
            data: $crate::sdk::UploadStream,
            context: $crate::sdk::Context,
        ) -> Result<(), $crate::error::ExecutorError> {
            $upload(self, params, data, context).await
        }

        async fn download(
            &self,
            params: &$crate::messages::TransferParams,
            data: $crate::sdk::DownloadStream,
            context: $crate::sdk::Context,
        ) -> Result<(), $crate::error::ExecutorError> {
            $download(self, params, data, context).await
        }

        async fn shutdown(&self) {
            $shutdown(self).await
        }
    };
}

pub use operations;

/// A timeout in milliseconds as people write it in a workflow: `2 s` for 2000, `1.5 s`,
/// `250 ms`, so that an executor's message reads as the `timeout:` it enforces.
pub fn timeout_text(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms} ms"),
        _ if ms.is_multiple_of(1000) => format!("{} s", ms / 1000),
        _ => format!("{:.1} s", ms as f64 / 1000.0),
    }
}

/// An executor: what the runner's six operations do in one kind of environment.
///
/// The SDK handles framing, version negotiation, `ping`, `shutdown`, cancellation
/// bookkeeping and the side channel. Requests run concurrently, one task each, so one process
/// serves many sessions.
///
/// `start`, `stop`, `cleanup`, `upload` and `download` are raced by the SDK against their
/// `timeout_ms` and against cancellation (their future is dropped then, so resources they
/// hold must be released on drop, for example with `kill_on_drop`). `command` is not: the
/// executor itself must kill the step's processes at its timeout (answering
/// [`ExecutorError::timeout`]) and on cancellation (answering [`ExecutorError::cancelled`]),
/// watching [`Context::cancelled`].
pub trait Executor: Send + Sync + 'static {
    /// The executor's name and version.
    fn info(&self) -> ExecutorInfo;

    /// Validates the configuration and says what this executor can do. A bad configuration
    /// is a [`ExecutorError::configuration`] naming the option to fix.
    fn initialize(&self, params: &InitializeParams)
    -> impl Future<Output = Result<Capabilities, ExecutorError>> + Send;

    /// Creates a session.
    fn start(
        &self,
        params: StartParams,
        context: Context,
    ) -> impl Future<Output = Result<StartResult, ExecutorError>> + Send;

    /// Runs one step, streaming its output with [`Context::output`].
    fn command(
        &self,
        params: CommandParams,
        context: Context,
    ) -> impl Future<Output = Result<CommandResult, ExecutorError>> + Send;

    /// Ends a session and deletes its resources unless `keep`.
    fn stop(
        &self,
        params: StopParams,
        context: Context,
    ) -> impl Future<Output = Result<StopResult, ExecutorError>> + Send;

    /// Deletes every resource of this runner that belongs to no session in `keep`.
    fn cleanup(
        &self,
        params: CleanupParams,
        context: Context,
    ) -> impl Future<Output = Result<CleanupResult, ExecutorError>> + Send;

    /// Reads a tar stream to its end and unpacks it at `params.path` in the session.
    fn upload(
        &self,
        params: &TransferParams,
        data: UploadStream,
        context: Context,
    ) -> impl Future<Output = Result<(), ExecutorError>> + Send;

    /// Writes a tar stream of the contents of `params.path` in the session. A missing path is
    /// [`crate::ErrorKind::NotFound`].
    fn download(
        &self,
        params: &TransferParams,
        data: DownloadStream,
        context: Context,
    ) -> impl Future<Output = Result<(), ExecutorError>> + Send;

    /// Called once when the runner asks to shut down or closes stdin: stop every session that
    /// is not kept, so that a runner that dies leaves nothing behind.
    fn shutdown(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// What a request's handler gets besides its parameters.
#[derive(Clone)]
pub struct Context {
    cancel: CancellationToken,
    notifier: Notifier,
    received: Instant,
    /// What a `download` left out of its stream, for its result.
    left_out: LeftOutList,
}

/// The entries a download left out, shared by the request's context and the SDK.
pub(crate) type LeftOutList = std::sync::Arc<std::sync::Mutex<Vec<crate::messages::LeftOut>>>;

impl Context {
    /// Resolves when the runner cancels this request (or the runner went away).
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// Whether the runner cancelled this request.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The instant `timeout_ms` after the request arrived.
    pub fn deadline(&self, timeout_ms: u64) -> Instant {
        self.received + Duration::from_millis(timeout_ms)
    }

    /// Sends step output to the runner, in chunks of at most [`MAX_OUTPUT_CHUNK`] bytes. It
    /// waits while the runner is behind, so output is never dropped.
    pub async fn output(&self, session: &str, step: u32, stream: Stream, bytes: &[u8]) {
        self.notifier.output(session, step, stream, bytes).await
    }

    /// Sends a line for the session's run log.
    pub async fn log(&self, session: &str, level: LogLevel, message: impl Into<String>) {
        self.notifier.log(Some(session), level, message).await
    }

    /// A handle that can send notifications after this request has ended.
    pub fn notifier(&self) -> Notifier {
        self.notifier.clone()
    }

    /// Says that a `download` of `folder` left `path` out of its stream, and why (`a FIFO`, `a
    /// symlink whose target leaves the folder`): a warning `log` for the run's log, and an
    /// entry of the result's `left_out` (the first [`crate::messages::MAX_LEFT_OUT`]), by which
    /// the runner keeps no cache that would not work.
    pub async fn left_out(&self, session: &str, folder: &str, path: &str, reason: &str) {
        let listed = {
            let mut list = self.left_out.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let room = list.len() < crate::messages::MAX_LEFT_OUT;
            if room {
                list.push(crate::messages::LeftOut { path: path.to_string(), reason: reason.to_string() });
            }
            room
        };
        if listed {
            self.log(session, LogLevel::Warn, format!("left {path} out of the download of {folder}: {reason}")).await;
        }
    }

    /// Takes the entries [`Context::left_out`] recorded.
    pub(crate) fn take_left_out(&self) -> Vec<crate::messages::LeftOut> {
        std::mem::take(&mut *self.left_out.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// An `output` notification as a frame, written directly: the data is base64, which JSON
/// never escapes, so it is encoded into the frame with no copy and no escaping pass.
fn output_frame(session: &str, step: u32, stream: Stream, chunk: &[u8]) -> Vec<u8> {
    let mut frame = String::with_capacity(chunk.len().div_ceil(3) * 4 + session.len() + 128);
    frame.push_str(r#"{"jsonrpc":"2.0","method":""#);
    frame.push_str(method::OUTPUT);
    frame.push_str(r#"","params":{"session":"#);
    frame.push_str(&serde_json::to_string(session).unwrap_or_default());
    frame.push_str(r#","step":"#);
    frame.push_str(&step.to_string());
    frame.push_str(r#","stream":"#);
    frame.push_str(&serde_json::to_string(&stream).unwrap_or_default());
    frame.push_str(r#","data":""#);
    base64_simd::STANDARD.encode_append(chunk, &mut frame);
    frame.push_str("\"}}\n");
    frame.into_bytes()
}

/// Sends notifications to the runner.
#[derive(Clone)]
pub struct Notifier {
    frames: mpsc::Sender<Vec<u8>>,
}

impl Notifier {
    async fn notify<N: Notify>(&self, params: &N::Params) {
        let frame = framing::encode(&Notification::of::<N>(params));
        // A closed channel means the runner is gone; there is no one left to tell.
        let _ = self.frames.send(frame).await;
    }

    /// See [`Context::output`].
    pub async fn output(&self, session: &str, step: u32, stream: Stream, bytes: &[u8]) {
        for chunk in bytes.chunks(MAX_OUTPUT_CHUNK) {
            let _ = self.frames.send(output_frame(session, step, stream, chunk)).await;
        }
    }

    /// Sends a `log` notification; `session` `None` goes to the runner's own log.
    pub async fn log(&self, session: Option<&str>, level: LogLevel, message: impl Into<String>) {
        let params = LogParams { session: session.map(str::to_string), level, message: message.into() };
        self.notify::<rpc::Log>(&params).await;
    }
}

/// The last few hundred characters of an output (a client's stderr, a service's log), on one
/// line: empty lines dropped, the others joined with ` / `, control characters (a terminal
/// escape) shown as `?`.
pub fn tail(bytes: &[u8]) -> String {
    const KEEP: usize = 600;
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|line| !line.is_empty()).collect();
    let joined: String = lines.join(" / ").chars().map(|char| if char.is_control() { '?' } else { char }).collect();
    if joined.len() <= KEEP {
        return joined;
    }
    let mut start = joined.len() - KEEP;
    while !joined.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &joined[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_reads_as_a_workflow_writes_it() {
        assert_eq!(timeout_text(2000), "2 s");
        assert_eq!(timeout_text(1500), "1.5 s");
        assert_eq!(timeout_text(500), "500 ms");
        assert_eq!(timeout_text(3_600_000), "3600 s");
    }

    #[test]
    fn a_tail_is_one_printable_line_and_bounded() {
        assert_eq!(
            tail(b"Error response from daemon: x\n\nRun 'docker --help'\n"),
            "Error response from daemon: x / Run 'docker --help'"
        );
        assert_eq!(tail(b"red \x1b[31mtext\tend\r\n"), "red ?[31mtext?end");
        let long = "\u{e9}".repeat(1000);
        assert!(tail(long.as_bytes()).len() < 700);
    }

    #[test]
    fn an_output_frame_is_the_notification_serde_would_write() {
        let session = "s\"1\n\u{1b}";
        let chunk = b"bytes\x00\xff\n";
        let frame = output_frame(session, 7, Stream::Stderr, chunk);
        assert_eq!(frame.iter().filter(|&&byte| byte == b'\n').count(), 1);
        let written: serde_json::Value = serde_json::from_slice(&frame).expect("JSON");
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD.encode(chunk);
        let params = OutputParams { session: session.into(), step: 7, stream: Stream::Stderr, data };
        let expected = serde_json::json!({"jsonrpc": "2.0", "method": method::OUTPUT, "params": params});
        assert_eq!(written, expected);
        // The data is encoded with a SIMD encoder: the same text as the standard engine's, at
        // every length (its wide blocks and its tail).
        for length in 0..300 {
            let chunk: Vec<u8> = (0..length).map(|at: usize| (at.wrapping_mul(151) ^ (at >> 3)) as u8).collect();
            let frame = output_frame("s", 1, Stream::Stdout, &chunk);
            let written: OutputParams = serde_json::from_value(
                serde_json::from_slice::<serde_json::Value>(&frame).expect("JSON")["params"].take(),
            )
            .expect("params");
            assert_eq!(written.data, base64::engine::general_purpose::STANDARD.encode(&chunk), "{length} bytes");
        }
    }
}
