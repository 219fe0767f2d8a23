//! Uploads into the environment and downloads out of it, through tools run there (`tar`,
//! `docker cp`): the shell scripts that unpack an upload and merge it into its destination, and
//! the copies that vet an upload or a download on its way.

use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::ExecutorError;
use crate::sdk::payload;

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
