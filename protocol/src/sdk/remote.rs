//! The step loop of executors that run steps through a remote shell (`docker exec`, an exec
//! into a pod, ssh, ...): one [`run_step`] for all of them, so a step's payload, its
//! sentinel, the sweep of its processes, and the errors of a timeout, a cancellation or a
//! lost stream are the same whatever the transport.
//!
//! An executor implements [`Shell`] (start a command in the environment; say why a stream
//! was lost; end the environment when a step's processes cannot be killed) and calls
//! [`run_step`] from its `command`. The loop:
//!
//! 1. runs `sh -s` with the payload ([`payload::build`]) on its stdin: a snapshot of the
//!    environment's processes, then the step;
//! 2. streams stdout and stderr, the payload's messages taken out of stderr
//!    ([`SentinelFilter`]); the step has ended when the sentinel says so, never because the
//!    stream ended: a stream that ends without it is a lost stream (an infrastructure error
//!    naming what [`Shell::lost`] says), never a result;
//! 3. at the step's timeout, on cancellation, after a lost stream, and after a
//!    secret-bearing step, runs [`payload::SWEEP`]: every process of the environment that was
//!    not there before the step (and is not init, nor a worker of what was there) is killed,
//!    however it hid. When that cannot be done, the environment is ended
//!    ([`Shell::end_environment`]): no process of the step outlives it unknown;
//! 4. ends the step at once, as an infrastructure error, when the executor learns the
//!    environment is lost while the step runs ([`Shell::failed`]: a pod deleted or its node
//!    gone), however its stream behaves (it may hang), and ends the environment;
//! 5. names the step's own faults as the step's, never the environment's: a step whose
//!    processes exhausted a limit of the environment (its pids: a fork bomb) has the
//!    environment ended at once, without a sweep that could not run there
//!    ([`Shell::usage`]), and one the kernel killed for memory is "out of memory
//!    (OOMKilled)" (the payload reads the environment's count of OOM kills before and after).
//!
//! Every sweep is bounded ([`SWEEP_WITHIN`]), and so is the end of an environment, so that a
//! step's answer comes within a runner's grace after its deadline, whatever the step did.
//!
//! Killing the local end of an exec kills nothing in the environment: only the sweep does.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{ErrorKind, ExecutorError};
use crate::messages::{CommandParams, CommandResult, LogLevel, Stream};
use crate::sdk::Context;
use crate::sdk::output::OutputPipes;
use crate::sdk::payload::{self, SentinelFilter, Snapshot};

/// How long output is read after the sentinel while the stream stays open (a process the
/// step left running holds it).
pub const SETTLE: Duration = Duration::from_millis(200);

/// How long the sweep of a step's processes may take: past it, the environment is ended. Well
/// within the runner's default grace (10 s), so that with the end of the environment a step's
/// answer still comes in time.
pub const SWEEP_WITHIN: Duration = Duration::from_secs(5);

/// How much of a limit of an environment its processes use ([`Shell::usage`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The limit, as a sentence names it: `pids`.
    pub limit_name: &'static str,
    /// How much is in use: 1003 tasks.
    pub used: u64,
    /// The limit: 1024.
    pub limit: u64,
    /// How many times the limit refused a new process since the step started, when the
    /// environment can tell (a cgroup's `pids.events`): then this alone says whether the
    /// step's processes exhausted it, and `used` only how far. `None` when it cannot tell:
    /// then how close `used` is to `limit` decides.
    pub refused: Option<u64>,
}

impl Usage {
    /// At its limit: it refused a process during the step; without that count, within 5%, or
    /// 2, of it (processes that exhaust a limit keep close to it as some fail and end, and a
    /// busy host slows their refill).
    pub fn at_the_limit(&self) -> bool {
        match self.refused {
            Some(refused) => refused > 0,
            None => self.used.saturating_add((self.limit / 20).max(2)) >= self.limit,
        }
    }

    /// Near its limit: it refused a process during the step; without that count, three
    /// quarters of it or more. With a sweep that could not run, the processes' own doing.
    pub fn near_the_limit(&self) -> bool {
        match self.refused {
            Some(refused) => refused > 0,
            None => self.used.saturating_mul(4) >= self.limit.saturating_mul(3),
        }
    }

    /// The end of a sentence whose subject is a step or its processes.
    pub fn exhausted(&self) -> String {
        format!("exhausted its {} limit of {} ({} in use)", self.limit_name, self.limit, self.used)
    }
}

/// How much of a step's last stderr is kept for the error of a lost stream.
const TAIL: usize = 4096;

/// Moves an unpacked upload from its staging folder `$1` (made inside the destination `$2`)
/// into `$2`: merged into folders, an entry replacing a file or a link of the same path (a
/// link is never followed), the entries of a folder that `$2` does not hold moved by one `mv`
/// (a checkout into a fresh folder is one `mv`, not one a file), then removes the staging
/// folder. So an upload is
/// unpacked whole, and vetted, before anything of it reaches the destination; a refused one
/// only needs its staging folder removed ([`discard_argv`]). A file that would replace a
/// folder is refused before anything moves, the staging folder removed. POSIX `sh`, `mv`
/// and `rm`.
pub const MERGE: &str =
    concat!(merge_functions!(), r#"check "$1" "$2" && merge "$1" "$2" || { rm -rf -- "$1"; exit 1; }"#);

/// The shell functions of [`MERGE`]: `check` refuses a file over a folder, `merge` moves.
macro_rules! merge_functions {
    () => {
        r#"check() {
  if [ -d "$2" ] && [ ! -L "$2" ]; then
    if [ -d "$1" ] && [ ! -L "$1" ]; then
      for e in "$1"/* "$1"/.[!.]* "$1"/..?*; do
        [ -e "$e" ] || [ -L "$e" ] || continue
        check "$e" "$2/${e##*/}" || return 1
      done
    else
      echo "cannot replace the folder $2 with a file" >&2; return 1
    fi
  fi
}
merge() {
  if [ -d "$1" ] && [ ! -L "$1" ] && [ -d "$2" ] && [ ! -L "$2" ]; then
    for e in "$1"/* "$1"/.[!.]* "$1"/..?*; do
      [ -e "$e" ] || [ -L "$e" ] || continue
      t="$2/${e##*/}"
      if [ -e "$t" ] || [ -L "$t" ]; then merge "$e" "$t" || return 1; fi
    done
    t=$2; case $t in /*) ;; *) t=$PWD/$t ;; esac
    (
      cd -- "$1" || exit 1
      set --
      for e in * .[!.]* ..?*; do [ -e "$e" ] || [ -L "$e" ] || continue; set -- "$@" "$e"; done
      [ $# -eq 0 ] || mv -- "$@" "$t"/
    ) || return 1
    rmdir -- "$1"
  elif [ -d "$2" ] && [ ! -L "$2" ]; then
    echo "cannot replace the folder $2 with a file" >&2; return 1
  else
    rm -f -- "$2" && mv -- "$1" "$2"
  fi
}
"#
    };
}
use merge_functions;

/// Unpacks stdin into the staging folder `$1` (made inside the destination `$2`) with `tar x`,
/// then merges it in as [`MERGE`] does, in one command: for an environment where a round trip
/// costs (a `docker exec`). The stream must end with the seal `$3`
/// ([`crate::tarball::copy_vetted_sealed`]), an empty file that only a stream read whole and
/// vetted ends with: without it (a refused entry, a broken or cut stream, a runner gone) the
/// staging folder is removed and nothing reaches the destination. Exits 3 when the upload did not
/// unpack whole, 4 when it cannot be merged (the reason on stderr). POSIX `sh`, `mkdir`, `mv`,
/// `rm`, and a `tar` with `-p` and `-o` (GNU, BusyBox and toybox have them).
pub const UNPACK_SEALED: &str = concat!(
    merge_functions!(),
    r#"mkdir -p -- "$1" || exit 3
if tar -x -p -o -f - -C "$1" && [ -f "$1/$3" ] && [ ! -L "$1/$3" ]; then
  rm -f -- "$1/$3" && check "$1" "$2" && merge "$1" "$2" || { rm -rf -- "$1"; exit 4; }
else
  echo "the upload into $2 did not arrive whole" >&2; rm -rf -- "$1"; exit 3
fi"#
);

/// [`UNPACK_SEALED`] for a transport whose stdin is never closed (a Kubernetes exec before 1.30,
/// whose only end of stdin ends the exec's exit code too): the upload comes framed
/// ([`crate::sdk::stdin_frames`], [`feed_vetted_sealed_framed`]), and `tar x` reads the frames'
/// bytes to the stream's end, never the stdin's. Its exit codes are [`UNPACK_SEALED`]'s. POSIX
/// `sh`, `mkdir`, `mv`, `rm`, a `tar` with `-p` and `-o`, and a `dd` with `iflag=count_bytes`
/// (GNU, BusyBox and toybox have them).
pub const UNPACK_SEALED_FRAMED: &str = concat!(
    merge_functions!(),
    unframe_function!(),
    r#"mkdir -p -- "$1" || exit 3
if knotless_unframe | tar -x -p -o -f - -C "$1" && [ -f "$1/$3" ] && [ ! -L "$1/$3" ]; then
  rm -f -- "$1/$3" && check "$1" "$2" && merge "$1" "$2" || { rm -rf -- "$1"; exit 4; }
else
  echo "the upload into $2 did not arrive whole" >&2; rm -rf -- "$1"; exit 3
fi"#
);

/// [`crate::sdk::stdin_frames::UNFRAME`], for `concat!`.
macro_rules! unframe_function {
    () => {
        r#"knotless_dd=count_bytes,fullblock
dd if=/dev/null of=/dev/null count=0 iflag=$knotless_dd 2>/dev/null || knotless_dd=count_bytes
knotless_unframe() {
  while IFS= read -r knotless_n; do
    case $knotless_n in
      0) return 0 ;;
      ''|*[!0-9]*) echo "the stream was cut ($knotless_n)" >&2; return 1 ;;
    esac
    dd bs=65536 count="$knotless_n" iflag="$knotless_dd" 2>/dev/null || return 1
  done
  echo "the stream ended before its end" >&2
  return 1
}
"#
    };
}
pub(crate) use unframe_function;

/// The exit code of [`UNPACK_SEALED`] when the upload did not unpack whole.
pub const UNPACK_CUT: i32 = 3;

/// The exit code of [`UNPACK_SEALED`] when the unpacked upload cannot be merged in.
pub const UNPACK_UNMERGED: i32 = 4;

/// The name of a fresh seal for [`UNPACK_SEALED`]: random, so no upload can carry it.
pub fn seal_name() -> Result<String, ExecutorError> {
    Ok(format!(".knotless-sealed-{}", payload::random_hex(8)?))
}

/// The argv of [`UNPACK_SEALED`].
pub fn unpack_sealed_argv(staging: &str, dest: &str, seal: &str) -> Vec<String> {
    ["sh", "-c", UNPACK_SEALED, "sh", staging, dest, seal].into_iter().map(str::to_string).collect()
}

/// Where an upload into `dest` is unpacked first: a fresh folder inside it, so that it is on
/// the same filesystem and writable where the destination is.
pub fn staging_path(dest: &str) -> Result<String, ExecutorError> {
    Ok(format!("{}/.knotless-upload-{}", dest.trim_end_matches('/'), payload::random_hex(8)?))
}

/// The argv that merges a staged upload into its destination (see [`MERGE`]).
pub fn merge_argv(staging: &str, dest: &str) -> Vec<String> {
    ["sh", "-c", MERGE, "sh", staging, dest].into_iter().map(str::to_string).collect()
}

/// Copies an upload to the stdin of a tool that unpacks it in the environment (`docker cp`,
/// `tar x`), vetting every entry on its way ([`crate::tarball::copy_vetted`]), then closes
/// that stdin. A refused entry is `TOO_LARGE` naming it; a broken stream (over the bound, or
/// the runner's side closed) an infrastructure error. `path` names the destination.
pub async fn feed_vetted<W>(data: crate::sdk::UploadStream, stdin: W, path: &str) -> Result<(), ExecutorError>
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    feed(data, Closing::Async(tokio_util::io::SyncIoBridge::new(stdin)), path, None).await
}

/// Feeds an upload as [`feed_vetted`] does, ending it with the empty file `seal` once the whole
/// stream was read and vetted ([`crate::tarball::copy_vetted_sealed`]), for [`UNPACK_SEALED`].
pub async fn feed_vetted_sealed<W>(
    data: crate::sdk::UploadStream,
    stdin: W,
    path: &str,
    seal: &str,
) -> Result<(), ExecutorError>
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    feed(data, Closing::Async(tokio_util::io::SyncIoBridge::new(stdin)), path, Some(seal.to_string())).await
}

/// Feeds an upload as [`feed_vetted_sealed`] does, framed for [`UNPACK_SEALED_FRAMED`]
/// ([`crate::sdk::stdin_frames::FrameWriter`]): the stream ends inside itself, whole after the
/// seal or cut after a refusal or a break, and `stdin` is left open (its transport ends it with
/// the command).
pub async fn feed_vetted_sealed_framed<W>(
    data: crate::sdk::UploadStream,
    stdin: W,
    path: &str,
    seal: &str,
) -> Result<(), ExecutorError>
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let framed = crate::sdk::stdin_frames::FrameWriter::new(tokio_util::io::SyncIoBridge::new(stdin));
    feed(data, Closing::Framed(framed), path, Some(seal.to_string())).await
}

/// [`feed_vetted`] into the stdin of a local process (`docker cp -`, `docker exec -i`), written
/// as a plain blocking pipe of [`PIPE_SIZE`] from the copying thread, without a round through
/// the runtime each time the pipe fills.
pub async fn feed_vetted_pipe(
    data: crate::sdk::UploadStream,
    stdin: tokio::process::ChildStdin,
    path: &str,
) -> Result<(), ExecutorError> {
    feed(data, Closing::<tokio::process::ChildStdin>::Pipe(blocking_pipe(stdin, path)?), path, None).await
}

/// [`feed_vetted_sealed`] into the stdin of a local process, as [`feed_vetted_pipe`] writes.
pub async fn feed_vetted_sealed_pipe(
    data: crate::sdk::UploadStream,
    stdin: tokio::process::ChildStdin,
    path: &str,
    seal: &str,
) -> Result<(), ExecutorError> {
    feed(data, Closing::<tokio::process::ChildStdin>::Pipe(blocking_pipe(stdin, path)?), path, Some(seal.to_string()))
        .await
}

/// The size a local process's stdin pipe is widened to for an upload (from Linux's 64 KiB),
/// so that the copy and the process wake each other less often.
pub const PIPE_SIZE: usize = 1 << 20;

/// A child's stdin as a blocking pipe (as tokio hands it back) of [`PIPE_SIZE`], or as wide
/// as the system allows.
fn blocking_pipe(stdin: tokio::process::ChildStdin, path: &str) -> Result<std::fs::File, ExecutorError> {
    let fd = stdin
        .into_owned_fd()
        .map_err(|error| ExecutorError::infrastructure(format!("cannot feed the upload into {path}: {error}")))?;
    // Past `/proc/sys/fs/pipe-max-size` for an unprivileged user it stays as it was.
    let _ = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE as nix::libc::c_int));
    Ok(std::fs::File::from(fd))
}

/// Where [`feed`] writes, and how it is closed once the copy ends.
enum Closing<W: AsyncWrite + Unpin> {
    /// An asynchronous stream, written from the copying thread through the runtime; shut down.
    Async(tokio_util::io::SyncIoBridge<W>),
    /// A blocking pipe; closed.
    Pipe(std::fs::File),
    /// An asynchronous stream that is never closed: framed, and ended inside the stream.
    Framed(crate::sdk::stdin_frames::FrameWriter<tokio_util::io::SyncIoBridge<W>>),
}

impl<W: AsyncWrite + Unpin> std::io::Write for Closing<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match self {
            Closing::Async(bridge) => bridge.write(bytes),
            Closing::Pipe(pipe) => pipe.write(bytes),
            Closing::Framed(framed) => framed.write(bytes),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Closing::Async(bridge) => bridge.flush(),
            Closing::Pipe(pipe) => pipe.flush(),
            Closing::Framed(framed) => framed.flush(),
        }
    }
}

impl<W: AsyncWrite + Unpin> Closing<W> {
    /// Ends the stream: `whole` when everything was copied. A framed stream is ended inside
    /// itself, whole or cut, and an error doing so is the copy's.
    fn close(self, whole: bool) -> std::io::Result<()> {
        match self {
            Closing::Async(mut bridge) => {
                let _ = bridge.shutdown();
                Ok(())
            }
            Closing::Pipe(_) => Ok(()),
            Closing::Framed(mut framed) if whole => framed.finish(),
            Closing::Framed(mut framed) => {
                let _ = framed.cut();
                Ok(())
            }
        }
    }
}

async fn feed<W>(
    data: crate::sdk::UploadStream,
    mut output: Closing<W>,
    path: &str,
    seal: Option<String>,
) -> Result<(), ExecutorError>
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    use crate::error::ErrorKind;
    use crate::tarball::UnpackError;
    use tokio_util::io::SyncIoBridge;
    let fed = tokio::task::spawn_blocking(move || {
        let mut input = std::io::BufReader::with_capacity(256 * 1024, SyncIoBridge::new(data));
        let copied = match &seal {
            Some(seal) => crate::tarball::copy_vetted_sealed(&mut input, &mut output, seal),
            None => crate::tarball::copy_vetted(&mut input, &mut output),
        };
        let whole = copied.is_ok();
        let closed = output.close(whole);
        match (copied, closed) {
            (Ok(_), Err(error)) => Err(UnpackError::Io(error)),
            (copied, _) => copied,
        }
    })
    .await;
    match fed {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(refusal @ UnpackError::Refused { .. })) => {
            Err(ExecutorError::new(ErrorKind::TooLarge, format!("cannot upload into {path}: {refusal}")))
        }
        Ok(Err(error)) => Err(ExecutorError::infrastructure(format!("the upload into {path} broke off: {error}"))),
        Err(error) => Err(ExecutorError::infrastructure(format!("the upload into {path} failed: {error}"))),
    }
}

/// Passes a download that a tool in the environment packs (`docker cp`, `tar c`) to the
/// runner, leaving out what no archive the runner accepts may hold
/// ([`crate::tarball::copy_skipping`]: special files and symlinks that leave the folder), then
/// closes the stream. Returns the reader, to drain what is left of it after an error, and what
/// was left out, each to name in a warning; or why the copy failed (a bound passed keeps its
/// `FileTooLarge` kind).
pub async fn pass_download<R>(
    from: R,
    data: crate::sdk::DownloadStream,
) -> (Option<R>, std::io::Result<Vec<crate::tarball::Skipped>>)
where
    R: AsyncRead + Unpin + Send + 'static,
{
    use crate::tarball::UnpackError;
    use std::io::Write as _;
    use tokio_util::io::SyncIoBridge;
    let passed = tokio::task::spawn_blocking(move || {
        let mut input = std::io::BufReader::with_capacity(256 * 1024, SyncIoBridge::new(from));
        let mut output = SyncIoBridge::new(data);
        let copied = crate::tarball::copy_skipping(&mut input, &mut output).map_err(|error| match error {
            UnpackError::Io(error) => error,
            refusal => std::io::Error::other(refusal),
        });
        let ended = copied.and_then(|(_, skipped)| {
            output.flush()?;
            output.shutdown()?;
            Ok(skipped)
        });
        (input.into_inner().into_inner(), ended)
    })
    .await;
    match passed {
        Ok((from, ended)) => (Some(from), ended),
        Err(error) => (None, Err(std::io::Error::other(format!("the copy failed: {error}")))),
    }
}

/// The argv that removes a refused upload's staging folder.
pub fn discard_argv(staging: &str) -> Vec<String> {
    ["rm", "-rf", "--", staging].into_iter().map(str::to_string).collect()
}

/// A stream from the environment.
pub type Reader = Box<dyn AsyncRead + Unpin + Send>;

/// A stream into the environment.
pub type Writer = Box<dyn AsyncWrite + Unpin + Send>;

/// One command running in the environment. Dropping it ends its local end (a client
/// process, a websocket) and nothing in the environment.
pub struct Exec {
    /// Its stdin.
    pub stdin: Writer,
    /// Its stdout.
    pub stdout: Reader,
    /// Its stderr.
    pub stderr: Reader,
    /// Ends when the exec has ended, with its exit code when known.
    pub ended: Pin<Box<dyn Future<Output = Option<i32>> + Send>>,
}

impl Exec {
    /// The exec of a local client process (`docker exec -i`, `ssh`) spawned with
    /// its three streams piped and `kill_on_drop`: dropping the exec ends the client. `what`
    /// names the client in the error when a pipe is missing.
    pub fn from_child(mut child: tokio::process::Child, what: &str) -> Result<Exec, ExecutorError> {
        let missing = || ExecutorError::infrastructure(format!("{what} was started without its pipes"));
        let stdin = child.stdin.take().ok_or_else(missing)?;
        let stdout = child.stdout.take().ok_or_else(missing)?;
        let stderr = child.stderr.take().ok_or_else(missing)?;
        Ok(Exec {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            ended: Box::pin(async move { child.wait().await.ok().and_then(|status| status.code()) }),
        })
    }
}

/// How an executor reaches its environment.
pub trait Shell: Send + Sync {
    /// Starts `argv` in the environment, its stdin, stdout and stderr piped.
    fn exec(&self, argv: Vec<String>) -> impl Future<Output = Result<Exec, ExecutorError>> + Send;

    /// The error of a step whose exec ended (with `exited`, if known) before the sentinel:
    /// what the environment says (gone, failed, its node lost), or a lost stream. `said` is
    /// the last of what came on the exec's stderr.
    fn lost(&self, step: &str, exited: Option<i32>, said: &[u8]) -> impl Future<Output = ExecutorError> + Send;

    /// Ends the whole environment: a step's processes could not be killed one by one. Bounded:
    /// it returns within a few seconds, ended or not.
    fn end_environment(&self, why: &str) -> impl Future<Output = ()> + Send;

    /// How much of a limit of the environment its processes use (its pids, which a fork bomb
    /// exhausts: no process can then be started there, a sweep included), read without
    /// starting anything there. Asked beside the sweep after a timeout, a cancellation or a lost
    /// stream, and after a failed sweep otherwise; it should answer within a few seconds of
    /// [`SWEEP_WITHIN`]. An answer with [`Usage::refused`] is taken as one read at once (a
    /// file), and asked again after a failed sweep.
    /// `None` by default, and when it cannot be read.
    fn usage(&self) -> impl Future<Output = Option<Usage>> + Send {
        std::future::ready(None)
    }

    /// Ends, with the error, when the environment is known to be lost while a step runs
    /// (a pod deleted, its node lost): the step ends at once, whatever its stream does (it
    /// may hang), and the environment is ended. Never ends by default.
    fn failed(&self) -> impl Future<Output = ExecutorError> + Send {
        std::future::pending()
    }

    /// The environment, for messages: `container X`, `pod Y`.
    fn describe(&self) -> String;
}

/// How the step's first phase ended.
enum Ending {
    Reported(i32),
    Lost(Option<i32>),
    TimedOut,
    Cancelled,
    Failed(ExecutorError),
}

/// Runs one step (see the module's documentation) in `workdir` of the environment.
pub async fn run_step<S: Shell>(
    shell: &S,
    params: &CommandParams,
    workdir: &str,
    context: &Context,
) -> Result<CommandResult, ExecutorError> {
    let name = if params.name.is_empty() { params.step.to_string() } else { params.name.clone() };
    let nonce = payload::nonce()?;
    let script = payload::build(&payload::Step {
        env: &params.env,
        secrets: &params.secrets,
        workdir,
        script: &params.script,
        nonce: &nonce,
    })?;
    let deadline = tokio::time::Instant::from_std(context.deadline(params.timeout_ms));
    let started = Instant::now();
    let Exec { mut stdin, stdout, stderr, ended } = shell.exec(vec!["sh".to_string(), "-s".to_string()]).await?;
    let mut step = StepStreams {
        pipes: OutputPipes::new(Some(stdout), Some(stderr)),
        filter: SentinelFilter::new(&nonce),
        out_filter: SentinelFilter::for_stdout(&nonce),
        tail: Vec::new(),
        stderr_done: false,
        stdout_done: false,
    };
    // The payload holds the secrets: it goes into the exec's stdin and nowhere else.
    let write = async move {
        let _ = stdin.write_all(script.as_bytes()).await;
        let _ = stdin.shutdown().await;
    };
    tokio::pin!(write);
    let mut written = false;
    let mut ended = ended;
    let mut exited: Option<Option<i32>> = None;
    let failed = shell.failed();
    tokio::pin!(failed);
    let ending = loop {
        // The exit code comes on stderr: it is the step's once its stdout is whole too (the
        // mark the payload prints there after the step came), whatever the two streams' delays.
        if let Some(code) = step.filter.code() {
            if step.out_filter.output_ended() {
                break Ending::Reported(code);
            }
            if !step.pipes.stdout_open() {
                break Ending::Lost(exited.flatten());
            }
        }
        if let Some(code) = exited.filter(|_| !step.pipes.is_open()) {
            break Ending::Lost(code);
        }
        tokio::select! {
            chunk = step.pipes.read(), if step.pipes.is_open() => step.send(chunk, context, &params.session, params.step).await,
            code = &mut ended, if exited.is_none() => exited = Some(code),
            () = &mut write, if !written => written = true,
            () = tokio::time::sleep_until(deadline) => break Ending::TimedOut,
            () = context.cancelled() => break Ending::Cancelled,
            error = &mut failed => break Ending::Failed(error),
        }
    };
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);

    let describe = shell.describe();
    match ending {
        Ending::Reported(exit_code) => {
            let mut killed_processes = 0;
            if !params.secrets.is_empty() {
                killed_processes = match sweep_or_end(shell, step.filter.snapshot(), &name, false).await {
                    Ok(killed) => killed,
                    Err(Unswept::Exhausted(limit)) => {
                        let message = format!("step {name} {limit}: {describe} was killed");
                        context.log(&params.session, LogLevel::Error, message.clone()).await;
                        return Err(ExecutorError::new(ErrorKind::StepFailed, message));
                    }
                    Err(Unswept::Failed(error)) => return Err(error),
                };
                if killed_processes > 0 {
                    let message = format!(
                        "step {name} was given secrets and left {killed_processes} processes running: killed them"
                    );
                    tracing::info!(session = %params.session, step = params.step, "{message}");
                    context.log(&params.session, LogLevel::Warn, message).await;
                }
            }
            step.settle(SETTLE, context, &params.session, params.step).await;
            tracing::info!(session = %params.session, step = params.step, exit_code, duration_ms, killed_processes, "step ended");
            if let Some(kills) = step.filter.oom_kills().filter(|kills| *kills > 0) {
                let message =
                    format!("step {name} ran out of memory (OOMKilled): the kernel killed {kills} of its processes");
                context.log(&params.session, LogLevel::Error, message.clone()).await;
                if exit_code != 0 {
                    return Err(ExecutorError::new(
                        ErrorKind::StepFailed,
                        format!("step {name} ran out of memory (OOMKilled), exit code {exit_code}"),
                    ));
                }
            }
            Ok(CommandResult { exit_code, duration_ms, killed_processes })
        }
        Ending::TimedOut | Ending::Cancelled => {
            // The snapshot may still be on its way.
            if step.filter.snapshot().is_none() {
                step.settle(SETTLE, context, &params.session, params.step).await;
            }
            let killed = sweep_or_end(shell, step.filter.snapshot(), &name, true).await;
            step.settle(SETTLE, context, &params.session, params.step).await;
            tracing::info!(session = %params.session, step = params.step, killed = ?killed.as_ref().ok(), "step killed");
            let exhausted = match killed {
                Ok(_) => None,
                Err(Unswept::Exhausted(limit)) => Some(limit),
                Err(Unswept::Failed(error)) => return Err(error),
            };
            Err(match (ending, exhausted) {
                // The step's own fault, which its timeout only revealed.
                (Ending::TimedOut, Some(limit)) => {
                    let message = format!(
                        "step {name} {limit}: {describe} was killed at the step's timeout of {} ms",
                        params.timeout_ms
                    );
                    context.log(&params.session, LogLevel::Error, message.clone()).await;
                    ExecutorError::new(ErrorKind::StepFailed, message)
                }
                (Ending::TimedOut, None) => {
                    let message =
                        format!("step {name} passed its timeout of {}", super::timeout_text(params.timeout_ms));
                    context.log(&params.session, LogLevel::Error, message.clone()).await;
                    ExecutorError::timeout(message)
                }
                _ => ExecutorError::cancelled(),
            })
        }
        Ending::Failed(error) => {
            // Its processes die with the environment; a sweep would hang on it.
            shell.end_environment(&error.message).await;
            tracing::error!(session = %params.session, step = params.step, "{}", error.message);
            context.log(&params.session, LogLevel::Error, error.message.clone()).await;
            Err(error)
        }
        Ending::Lost(code) => {
            // The step may still run in the environment: end it.
            let error = match sweep_or_end(shell, step.filter.snapshot(), &name, true).await {
                Err(Unswept::Exhausted(limit)) => ExecutorError::new(
                    ErrorKind::StepFailed,
                    format!("the processes of step {name} {limit}: {describe} was killed"),
                ),
                other => {
                    if let Err(Unswept::Failed(failure)) = other {
                        tracing::warn!(session = %params.session, step = params.step, "{}", failure.message);
                    }
                    shell.lost(&name, code, &step.tail).await
                }
            };
            tracing::error!(session = %params.session, step = params.step, "{}", error.message);
            context.log(&params.session, LogLevel::Error, error.message.clone()).await;
            Err(error)
        }
    }
}

/// Why a step's processes were not swept; the environment was ended either way.
#[derive(Debug)]
enum Unswept {
    /// The environment's processes exhausted a limit of it (see [`Shell::usage`]).
    Exhausted(String),
    /// The sweep failed, or could not know what to sweep: an infrastructure error.
    Failed(ExecutorError),
}

/// Kills the step's processes; when that cannot be done, ends the environment and says why.
/// The environment is asked how much of its limits its processes use (see [`Shell::usage`]; a
/// sweep cannot run where one is exhausted) when the sweep fails, and with `check_first`
/// beside it, its answer awaited whatever the sweep did: near a limit, the step's processes
/// exhausted it, and the environment is ended.
async fn sweep_or_end<S: Shell>(
    shell: &S,
    snapshot: Option<&Snapshot>,
    name: &str,
    check_first: bool,
) -> Result<u32, Unswept> {
    let exhausted = |limit: String| async move {
        shell.end_environment(&format!("the processes of step {name} {limit}")).await;
        Unswept::Exhausted(limit)
    };
    // With `check_first`, the environment's usage is asked beside the sweep, not before it:
    // a limit at its end ends the sweep (which cannot start there), and a failed sweep has the
    // answer at hand, within the sweep's own bound. A failed sweep with a limit near its end
    // is the processes' doing too.
    let probe = async { if check_first { shell.usage().await } else { None } };
    let sweeping = async {
        match snapshot {
            Some(snapshot) => sweep(shell, snapshot).await,
            None => Err(ExecutorError::infrastructure(format!(
                "step {name} in {} never said which processes were there before it",
                shell.describe()
            ))),
        }
    };
    tokio::pin!(probe, sweeping);
    let mut probed = None;
    let swept = loop {
        tokio::select! {
            usage = &mut probe, if probed.is_none() => match usage {
                Some(usage) if usage.at_the_limit() => return Err(exhausted(usage.exhausted()).await),
                usage => probed = Some(usage),
            },
            swept = &mut sweeping => break swept,
        }
    };
    let usage = match (&swept, probed) {
        // A count of refusals is read at once: after a failed sweep it is read again, as the
        // limit may have been reached while the sweep ran (and refused it).
        (Err(_), Some(Some(usage))) if usage.refused.is_some() => shell.usage().await.or(Some(usage)),
        (_, Some(usage)) => usage,
        (_, None) if check_first => probe.await,
        (Ok(_), None) => None,
        (Err(_), None) => shell.usage().await,
    };
    // A sweep that could still start may come just before the limit's end: the usage says
    // whether the step's processes had all but exhausted it.
    if swept.is_ok()
        && let Some(usage) = usage.as_ref().filter(|usage| usage.near_the_limit())
    {
        return Err(exhausted(usage.exhausted()).await);
    }
    let error = match swept {
        Ok(killed) => return Ok(killed),
        Err(error) => error,
    };
    let in_use = match &usage {
        Some(usage) if usage.near_the_limit() => return Err(exhausted(usage.exhausted()).await),
        Some(usage) => format!(" ({} of its {} limit of {} in use)", usage.used, usage.limit_name, usage.limit),
        None => String::new(),
    };
    let why = format!("cannot kill the processes of step {name}: {}{in_use}", error.message);
    shell.end_environment(&why).await;
    Err(Unswept::Failed(ExecutorError::infrastructure(format!("{why}; ended {}", shell.describe()))))
}

/// Runs [`payload::SWEEP`] in the environment; returns how many processes it killed.
pub async fn sweep<S: Shell>(shell: &S, snapshot: &Snapshot) -> Result<u32, ExecutorError> {
    let run = async {
        let Exec { mut stdin, mut stdout, mut stderr, ended } = shell.exec(payload::sweep_argv(snapshot)).await?;
        let line = snapshot.line();
        let feed = async move {
            let _ = stdin.write_all(line.as_bytes()).await;
            let _ = stdin.shutdown().await;
        };
        let mut said = Vec::new();
        let mut errors = Vec::new();
        let (mut out, mut err) = ((&mut stdout).take(4096), (&mut stderr).take(4096));
        let read_out = out.read_to_end(&mut said);
        let read_err = err.read_to_end(&mut errors);
        let ((), _, _, code) = tokio::join!(feed, read_out, read_err, ended);
        let text = String::from_utf8_lossy(&said);
        text.trim().parse::<u32>().map_err(|_| {
            ExecutorError::infrastructure(format!(
                "the process sweep in {} ended with {} and answered {:?}: {}",
                shell.describe(),
                code.map_or("no exit code".to_string(), |code| format!("exit code {code}")),
                text.trim(),
                String::from_utf8_lossy(&errors).trim()
            ))
        })
    };
    match tokio::time::timeout(SWEEP_WITHIN, run).await {
        Ok(result) => result,
        Err(_) => Err(ExecutorError::infrastructure(format!(
            "the process sweep in {} did not end within {} s",
            shell.describe(),
            SWEEP_WITHIN.as_secs()
        ))),
    }
}

/// A step's output streams, the filter taking the payload's messages out of stderr, and the
/// tail of what came on stderr.
struct StepStreams {
    pipes: OutputPipes<Reader, Reader>,
    filter: SentinelFilter,
    /// The filter taking the payload's mark of the end of the step's output out of stdout.
    out_filter: SentinelFilter,
    tail: Vec<u8>,
    stderr_done: bool,
    stdout_done: bool,
}

impl StepStreams {
    /// Sends a chunk on, stderr through the filter; at the end of stderr, what it held.
    async fn send(&mut self, chunk: Option<(Stream, Vec<u8>)>, context: &Context, session: &str, step: u32) {
        let (stream, bytes) = match chunk {
            Some((Stream::Stderr, bytes)) => (Stream::Stderr, self.filter.push(&bytes)),
            Some((Stream::Stdout, bytes)) => (Stream::Stdout, self.out_filter.push(&bytes)),
            None if !self.pipes.stderr_open() && !self.stderr_done => {
                self.stderr_done = true;
                (Stream::Stderr, self.filter.finish())
            }
            None if !self.pipes.stdout_open() && !self.stdout_done => {
                self.stdout_done = true;
                (Stream::Stdout, self.out_filter.finish())
            }
            None => return,
        };
        if stream == Stream::Stderr {
            self.tail.extend_from_slice(&bytes);
            let excess = self.tail.len().saturating_sub(TAIL);
            self.tail.drain(..excess);
        }
        if !bytes.is_empty() {
            context.output(session, step, stream, &bytes).await;
        }
    }

    /// Sends what comes until both streams close or `within` passes, then stops reading.
    async fn settle(&mut self, within: Duration, context: &Context, session: &str, step: u32) {
        let settle = tokio::time::sleep(within);
        tokio::pin!(settle);
        while self.pipes.is_open() {
            tokio::select! {
                chunk = self.pipes.read() => self.send(chunk, context, session, step).await,
                () = &mut settle => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::fs;
    use std::os::unix::fs::symlink;

    /// This host as a step's environment, whose exec delivers stdout `delay` late, as a busy
    /// API server or engine may deliver one stream after the other.
    struct SlowStdout {
        delay: &'static str,
    }

    impl Shell for SlowStdout {
        async fn exec(&self, argv: Vec<String>) -> Result<Exec, ExecutorError> {
            let argv: Vec<String> = argv.iter().map(|arg| payload::quote(arg)).collect();
            let command = format!("{} | {{ sleep {}; cat; }}", argv.join(" "), self.delay);
            let child = tokio::process::Command::new("sh")
                .args(["-c", &command])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|error| ExecutorError::infrastructure(error.to_string()))?;
            Exec::from_child(child, "sh")
        }

        async fn lost(&self, step: &str, _: Option<i32>, _: &[u8]) -> ExecutorError {
            ExecutorError::infrastructure(format!("lost the stream of step {step}"))
        }

        async fn end_environment(&self, _: &str) {}

        fn describe(&self) -> String {
            "this host".to_string()
        }
    }

    #[tokio::test]
    async fn output_that_comes_after_the_exit_code_is_the_steps_all_the_same() {
        let (frames, mut sent) = tokio::sync::mpsc::channel(64);
        let context = Context {
            cancel: tokio_util::sync::CancellationToken::new(),
            notifier: crate::sdk::Notifier { frames },
            received: Instant::now(),
            left_out: Default::default(),
        };
        let params = CommandParams {
            session: "s".into(),
            step: 0,
            name: "late".into(),
            script: "echo first; echo last".into(),
            env: BTreeMap::new(),
            secrets: BTreeMap::new(),
            workdir: None,
            timeout_ms: 30_000,
        };
        let workdir = std::env::temp_dir();
        let shell = SlowStdout { delay: "1" };
        let result = run_step(&shell, &params, &workdir.to_string_lossy(), &context).await.expect("a result");
        assert_eq!(result.exit_code, 0);
        drop(context);
        let mut stdout = Vec::new();
        while let Some(frame) = sent.recv().await {
            let frame: serde_json::Value = serde_json::from_slice(&frame).expect("a frame");
            if frame["params"]["stream"] == "stdout" {
                let data = frame["params"]["data"].as_str().unwrap_or_default();
                stdout.extend(base64_simd::STANDARD.decode_to_vec(data).expect("base64"));
            }
        }
        assert_eq!(String::from_utf8_lossy(&stdout), "first\nlast\n", "every line the step wrote");
    }

    #[test]
    fn a_limit_is_at_its_end_within_five_percent_and_near_it_from_three_quarters() {
        let usage = |used| Usage { limit_name: "pids", used, limit: 1024, refused: None };
        assert!(usage(1024).at_the_limit() && usage(973).at_the_limit());
        assert!(!usage(972).at_the_limit() && !usage(3).at_the_limit());
        assert!(usage(768).near_the_limit() && !usage(767).near_the_limit());
        let small = |used| Usage { limit_name: "pids", used, limit: 16, refused: None };
        assert!(small(14).at_the_limit() && !small(13).at_the_limit());
        assert_eq!(usage(1000).exhausted(), "exhausted its pids limit of 1024 (1000 in use)");
    }

    #[test]
    fn a_limit_that_refused_a_process_is_exhausted_however_many_are_left() {
        let usage = |used, refused| Usage { limit_name: "pids", used, limit: 1024, refused: Some(refused) };
        // Processes that exhaust a limit die as their forks fail: a count of what is in use
        // may come at any point between a few and the limit.
        assert!(usage(300, 1).at_the_limit() && usage(300, 1).near_the_limit());
        assert!(usage(1, 40).at_the_limit());
        // Never refused, a count at the limit is only many processes.
        assert!(!usage(1024, 0).at_the_limit() && !usage(1000, 0).near_the_limit());
    }

    #[test]
    fn a_staged_upload_merges_in_and_never_through_a_link() {
        let outside = tempfile::tempdir().expect("tempdir");
        let dest = tempfile::tempdir().expect("tempdir");
        let root = dest.path();
        fs::create_dir(root.join("sub")).expect("mkdir");
        fs::write(root.join("sub/old"), "old").expect("write");
        fs::write(root.join("file"), "before").expect("write");
        symlink(outside.path(), root.join("escape")).expect("symlink");
        let staging = staging_path(&root.to_string_lossy()).expect("staging");
        let staged = std::path::Path::new(&staging);
        fs::create_dir_all(staged.join("sub")).expect("mkdir");
        fs::create_dir_all(staged.join("escape")).expect("mkdir");
        fs::write(staged.join("sub/new"), "new").expect("write");
        fs::write(staged.join("escape/planted"), "planted").expect("write");
        fs::write(staged.join("file"), "after").expect("write");
        fs::write(staged.join(".hidden"), "hidden").expect("write");
        // Names a shell or mv could take for something else, moved together into a new folder.
        let odd = ["-rf", "a b", "new\nline", "..dots", "*", "$(x)"];
        fs::create_dir(staged.join("fresh")).expect("mkdir");
        for name in odd {
            fs::write(staged.join("fresh").join(name), name).expect("write");
        }
        fs::create_dir(root.join("fresh")).expect("mkdir");
        let argv = merge_argv(&staging, &root.to_string_lossy());
        let output = std::process::Command::new(&argv[0]).args(&argv[1..]).output().expect("sh");
        assert!(output.status.success(), "{output:?}");
        assert!(!staged.exists(), "the staging folder is gone");
        assert_eq!(fs::read_to_string(root.join("sub/old")).expect("old"), "old");
        assert_eq!(fs::read_to_string(root.join("sub/new")).expect("new"), "new");
        assert_eq!(fs::read_to_string(root.join("file")).expect("file"), "after");
        assert_eq!(fs::read_to_string(root.join(".hidden")).expect("hidden"), "hidden");
        for name in odd {
            assert_eq!(fs::read_to_string(root.join("fresh").join(name)).expect(name), name);
        }
        assert_eq!(fs::read_dir(root.join("fresh")).expect("list").count(), odd.len());
        assert!(!root.join("escape").is_symlink(), "the link was replaced, not followed");
        assert_eq!(fs::read_dir(outside.path()).expect("list").count(), 0);
        // A file over a folder is refused.
        let staging = staging_path(&root.to_string_lossy()).expect("staging");
        fs::create_dir_all(&staging).expect("mkdir");
        fs::write(std::path::Path::new(&staging).join("sub"), "a file").expect("write");
        let argv = merge_argv(&staging, &root.to_string_lossy());
        let output = std::process::Command::new(&argv[0]).args(&argv[1..]).output().expect("sh");
        assert!(!output.status.success());
        assert!(String::from_utf8_lossy(&output.stderr).contains("cannot replace the folder"), "{output:?}");
        assert!(!std::path::Path::new(&staging).exists(), "a refused merge removes its staging folder");
        assert_eq!(fs::read_to_string(root.join("sub/old")).expect("old"), "old");
    }

    /// Runs [`UNPACK_SEALED`] with the host's `sh` and `tar` on `stream`.
    fn unpack_sealed(stream: &[u8], dest: &std::path::Path, seal: &str) -> (Option<i32>, String) {
        use std::io::Write as _;
        let staging = staging_path(&dest.to_string_lossy()).expect("staging");
        let argv = unpack_sealed_argv(&staging, &dest.to_string_lossy(), seal);
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let _ = child.stdin.take().expect("stdin").write_all(stream);
        let output = child.wait_with_output().expect("wait");
        assert!(!std::path::Path::new(&staging).exists(), "the staging folder is gone");
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    }

    #[test]
    fn a_sealed_upload_unpacks_and_merges_in_one_command_and_nothing_else_does() {
        let source = tempfile::tempdir().expect("tempdir");
        fs::create_dir(source.path().join("sub")).expect("mkdir");
        fs::write(source.path().join("sub/new"), "new").expect("write");
        // An upload cannot forge the seal: a file named like one is content.
        fs::write(source.path().join(".knotless-sealed-0000000000000000"), "content").expect("write");
        let archive = crate::tarball::pack_dir(source.path(), Vec::new()).expect("pack");
        let seal = seal_name().expect("seal");
        let mut sealed = Vec::new();
        crate::tarball::copy_vetted_sealed(archive.as_slice(), &mut sealed, &seal).expect("sealed");
        let mut unsealed = Vec::new();
        crate::tarball::copy_vetted(archive.as_slice(), &mut unsealed).expect("vetted");

        let dest = tempfile::tempdir().expect("tempdir");
        let root = dest.path();
        fs::create_dir(root.join("sub")).expect("mkdir");
        fs::write(root.join("sub/old"), "old").expect("write");
        let listing = |root: &std::path::Path| {
            let mut names: Vec<_> = walk(root);
            names.sort();
            names
        };
        let before = listing(root);
        // Whole but without its seal, cut just before the seal (at an entry's edge, which tar
        // takes for an end), cut in the middle: nothing reaches the destination.
        for cut in [unsealed.as_slice(), &sealed[..sealed.len() - 1024 - 512], &sealed[..sealed.len() / 2]] {
            let (code, stderr) = unpack_sealed(cut, root, &seal);
            assert_eq!(code, Some(UNPACK_CUT), "{stderr}");
            assert_eq!(listing(root), before, "nothing of a cut upload is left");
        }
        let (code, stderr) = unpack_sealed(&sealed, root, &seal);
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(fs::read_to_string(root.join("sub/old")).expect("old"), "old");
        assert_eq!(fs::read_to_string(root.join("sub/new")).expect("new"), "new");
        assert_eq!(fs::read_to_string(root.join(".knotless-sealed-0000000000000000")).expect("content"), "content");
        assert!(!root.join(&seal).exists(), "the seal is removed");
        // A file over a folder: unpacked whole, refused at the merge, the destination as it was.
        let file_over_folder = tempfile::tempdir().expect("tempdir");
        fs::write(file_over_folder.path().join("sub"), "a file").expect("write");
        let archive = crate::tarball::pack_dir(file_over_folder.path(), Vec::new()).expect("pack");
        let mut sealed = Vec::new();
        crate::tarball::copy_vetted_sealed(archive.as_slice(), &mut sealed, &seal).expect("sealed");
        let before = listing(root);
        let (code, stderr) = unpack_sealed(&sealed, root, &seal);
        assert_eq!(code, Some(UNPACK_UNMERGED), "{stderr}");
        assert!(stderr.contains("cannot replace the folder"), "{stderr}");
        assert_eq!(listing(root), before);
    }

    /// Every path below `root`, relative to it.
    fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut found = Vec::new();
        let mut folders = vec![root.to_path_buf()];
        while let Some(folder) = folders.pop() {
            for entry in fs::read_dir(&folder).expect("list") {
                let path = entry.expect("entry").path();
                if path.is_dir() && !path.is_symlink() {
                    folders.push(path.clone());
                }
                found.push(path.strip_prefix(root).expect("below").to_path_buf());
            }
        }
        found
    }

    /// An upload of `archive` as the executor reads it from the side channel.
    async fn upload_of(archive: Vec<u8>, dir: &std::path::Path) -> crate::sdk::UploadStream {
        use tokio::io::AsyncWriteExt;
        let listener = crate::channel::ChannelListener::bind(&dir.join("side")).expect("bind");
        let path = listener.path().to_string_lossy().into_owned();
        let (ours, theirs) = tokio::join!(crate::channel::connect(&path), listener.accept());
        let mut theirs = theirs.expect("accept");
        tokio::spawn(async move {
            let _ = theirs.write_all(&archive).await;
        });
        crate::sdk::UploadStream::new(ours.expect("connect"), u64::MAX).0
    }

    #[tokio::test]
    async fn an_upload_fed_through_a_childs_pipe_arrives_whole_and_sealed_or_fails_without_waiting() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = dir.path().join("tree");
        fs::create_dir(&tree).expect("mkdir");
        // 8 MiB, more than the widened pipe holds, in files of 1 MiB.
        for index in 0..8u8 {
            fs::write(tree.join(format!("file-{index}")), vec![index; 1 << 20]).expect("write");
        }
        let archive = crate::tarball::pack_dir(&tree, Vec::new()).expect("pack");
        let spawn = |script: &str| {
            tokio::process::Command::new("sh")
                .args(["-c", script])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .expect("sh")
        };

        // Whole: every entry, then the seal, then the end of the stream.
        let copy = dir.path().join("copy.tar");
        let mut child = spawn(&format!("cat > '{}'", copy.display()));
        let stdin = child.stdin.take().expect("stdin");
        let upload = upload_of(archive.clone(), dir.path()).await;
        feed_vetted_sealed_pipe(upload, stdin, "/dest", ".seal-1").await.expect("fed");
        assert!(child.wait().await.expect("cat").success());
        let copied = fs::read(&copy).expect("copy");
        let mut names = Vec::new();
        for entry in tar::Archive::new(copied.as_slice()).entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let name = entry.path().expect("path").to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes).expect("read");
            if let Some(index) = name.strip_prefix("file-") {
                let index: u8 = index.parse().expect("index");
                assert!(bytes.len() == 1 << 20 && bytes.iter().all(|&byte| byte == index), "{name}");
            }
            names.push(name);
        }
        assert_eq!(names.iter().filter(|name| name.starts_with("file-")).count(), 8, "{names:?}");
        assert_eq!(names.last().map(String::as_str), Some(".seal-1"), "{names:?}");

        // A reader that stops early: the feed fails (the pipe broke), and returns.
        let mut child = spawn("head -c 1000 > /dev/null");
        let stdin = child.stdin.take().expect("stdin");
        let upload = upload_of(archive.clone(), dir.path()).await;
        let fed = tokio::time::timeout(Duration::from_secs(20), feed_vetted_sealed_pipe(upload, stdin, "/dest", ".s"))
            .await
            .expect("the feed returns");
        let error = fed.expect_err("a broken pipe");
        assert!(error.message.contains("/dest"), "{error:?}");
        assert!(child.wait().await.expect("head").success());

        // A refused entry: nothing after it, and no seal.
        let mut evil = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        evil.append_link(&mut header, "out", "../../etc").expect("link");
        let mut header = tar::Header::new_gnu();
        header.set_size(4);
        evil.append_data(&mut header, "after", &b"data"[..]).expect("data");
        let evil = evil.into_inner().expect("tar");
        let copy = dir.path().join("refused.tar");
        let mut child = spawn(&format!("cat > '{}'", copy.display()));
        let stdin = child.stdin.take().expect("stdin");
        let upload = upload_of(evil, dir.path()).await;
        let error = feed_vetted_sealed_pipe(upload, stdin, "/dest", ".seal-2").await.expect_err("refused");
        assert_eq!(error.kind, crate::error::ErrorKind::TooLarge, "{error:?}");
        assert!(child.wait().await.expect("cat").success());
        let copied = fs::read(&copy).expect("copy");
        assert!(!copied.windows(7).any(|window| window == b".seal-2" || window == b"after\0\0"), "{copied:?}");
    }
}
